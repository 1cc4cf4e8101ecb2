"""The scattering transform's known properties (shape, zero mean of the wavelets, non-negativity, stability to
small translations, no parameters) and the scattering students built on it."""

import pytest
import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from opacus.validators import ModuleValidator

from dpdistill.errors import ConfigError
from dpdistill.models import build_classifier
from dpdistill.models.registry import has_fixed_backbone
from dpdistill.models.scattering import Scattering2D, ScatterCNN, ScatterLinear, scattering_features


def _object_images(count: int, size: int = 28, channels: int = 1) -> torch.Tensor:
    """Non-negative images of an object with 2-pixel detail on a blank 4-pixel border, like Fashion-MNIST's
    clothes: a shift moves the object, not pixels across the wrap-around."""
    generator = torch.Generator().manual_seed(0)
    blocks = torch.rand(count, channels, (size - 8) // 2, (size - 8) // 2, generator=generator)
    return F.pad(F.interpolate(blocks, scale_factor=2.0), (4, 4, 4, 4))


@pytest.fixture(scope="module")
def scattering() -> Scattering2D:
    return Scattering2D((28, 28))


@pytest.mark.parametrize("in_shape, out_shape", [((1, 28, 28), (81, 7, 7)), ((3, 32, 32), (243, 8, 8)),
                                                 ((1, 8, 8), (81, 2, 2))])
def test_scattering_gives_81_channels_per_input_channel_on_a_grid_4_times_coarser(in_shape, out_shape):
    transform = Scattering2D(in_shape[1:])
    assert transform.channels == 81
    assert transform(torch.rand(2, *in_shape)).shape == (2, *out_shape)


def test_scattering_channel_count_for_other_scales_and_angles():
    assert Scattering2D((32, 32), J=3, L=4)(torch.rand(1, 1, 32, 32)).shape == (1, 1 + 12 + 16 * 3, 4, 4)


@pytest.mark.parametrize("shape, J", [((8, 8), 3), ((28, 28), 5)])
def test_scattering_refuses_images_too_small_for_its_scale(shape, J):
    with pytest.raises(ConfigError, match=f"J={J} needs images of at least"):
        Scattering2D(shape, J=J)


def test_scattering_of_a_zero_image_is_zero_and_of_a_constant_is_its_average(scattering):
    assert torch.equal(scattering(torch.zeros(1, 1, 28, 28)), torch.zeros(1, 81, 7, 7))
    constant = scattering(torch.full((1, 1, 28, 28), 0.5))
    assert torch.allclose(constant[:, 0], torch.full((1, 7, 7), 0.5), atol=1e-4)  # the low-pass sums to one
    assert constant[:, 1:].abs().max() < 1e-4  # wavelets have zero mean: no edge, no response


def test_scattering_coefficients_are_non_negative_and_positively_homogeneous(scattering):
    images = _object_images(4)
    coefficients = scattering(images)
    assert coefficients.min() >= 0  # modulus then a positive low-pass (order 0: of non-negative images)
    assert coefficients[:, 1:].amax(dim=(0, 2, 3)).min() > 0  # every wavelet responds to something
    assert torch.allclose(scattering(3 * images), 3 * coefficients, rtol=1e-4, atol=1e-6)


def test_scattering_is_stable_to_a_one_pixel_translation(scattering):
    images = _object_images(16)
    for dims in (-1, -2):
        shifted = torch.roll(images, 1, dims=dims)
        image_change = (shifted - images).norm() / images.norm()
        coefficient_change = (scattering(shifted) - scattering(images)).norm() / scattering(images).norm()
        assert coefficient_change < image_change / 2  # measured: 0.18 against 0.57


def test_scattering_is_deterministic_with_buffers_only(scattering):
    images = _object_images(3)
    assert list(scattering.parameters()) == [] and scattering.state_dict() == {}  # rebuilt, never saved
    assert torch.equal(Scattering2D((28, 28))(images), scattering(images))
    assert torch.allclose(scattering(images[:1]), scattering(images)[:1], atol=1e-6)  # examples are independent


def test_scattering_features_are_normalised_per_example_in_groups():
    transform, channels = scattering_features((1, 28, 28))
    images = _object_images(5)
    normalised = transform(images)
    assert channels == 81 and list(transform.parameters()) == []
    groups, raw = normalised.reshape(5, 27, -1), transform[0](images).reshape(5, 27, -1)  # 27 groups of 3 channels
    assert torch.allclose(groups.mean(-1), torch.zeros(5, 27), atol=1e-4)
    raw_variance = raw.var(-1, unbiased=False)  # GroupNorm's eps (1e-5) damps the faint second-order groups
    assert torch.allclose(groups.var(-1, unbiased=False), raw_variance / (raw_variance + 1e-5), atol=1e-3)
    assert torch.allclose(transform(images[2:3]), normalised[2:3], atol=1e-5)  # no statistic across examples


def test_scatter_students_are_registered_and_only_the_cnn_has_a_learnable_backbone():
    linear = build_classifier("scatter-linear", (1, 28, 28), 10)
    cnn = build_classifier("scatter-cnn", (1, 28, 28), 10)
    assert isinstance(linear, ScatterLinear) and isinstance(cnn, ScatterCNN)
    assert list(linear.backbone.parameters()) == [] and linear.head.in_features == 81 * 7 * 7
    assert has_fixed_backbone("scatter-linear") and not has_fixed_backbone("scatter-cnn")
    assert not has_fixed_backbone("cnn") and not has_fixed_backbone("my_models:net")
    x = _object_images(2)
    for model in (linear, cnn):
        assert model(x).shape == (2, 10) and torch.equal(model.classify(model.features(x)), model(x))


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # the images need no gradient
@pytest.mark.parametrize("in_shape", [(1, 28, 28), (1, 8, 8)])
def test_scatter_cnn_is_valid_for_opacus_per_example_gradients(in_shape):
    model = ScatterCNN(in_shape, 10)
    assert ModuleValidator.validate(model, strict=True) == []  # GroupNorm, no BatchNorm
    private = GradSampleModule(model)
    images, labels = torch.rand(4, *in_shape), torch.tensor([0, 1, 2, 3])
    F.cross_entropy(private(images), labels).backward()
    for weight in model.parameters():
        assert weight.grad_sample.shape == (4, *weight.shape)


def test_models_of_one_size_share_the_filters_values_not_their_buffers():
    first, second = Scattering2D((28, 28)), Scattering2D((28, 28))
    images = _object_images(4)
    expected = second(images)
    for buffer in first.buffers():  # a model moved, cast or changed in place leaves the others as they were
        buffer.mul_(2.0)
    assert torch.equal(second(images), expected) and torch.equal(Scattering2D((28, 28))(images), expected)
