"""Every architecture works at every supported input size and keeps forward == classify(features)."""

import pytest
import torch
from torch import nn

from dpdistill.errors import ConfigError
from dpdistill.models import CLASSIFIERS, build_classifier, build_generator, count_parameters
from dpdistill.models.base import use_channels_last
from dpdistill.models.per_example import per_example
from dpdistill.models.transform import InputTransform, TransformedClassifier
from helpers import input_orders

SMALL_OPTIONS = {"resnet18": {"width": 8}, "resnet34": {"width": 8}}


@pytest.mark.parametrize("arch", sorted(CLASSIFIERS))
@pytest.mark.parametrize("shape", [(1, 28, 28), (1, 8, 8), (3, 32, 32)])
def test_classifiers_give_logits_and_features(arch, shape):
    model = build_classifier(arch, shape, 7, **SMALL_OPTIONS.get(arch, {})).eval()
    x = torch.randn(3, *shape)
    features = model.features(x)
    assert features.dim() == 2 and features.shape[0] == 3
    logits = model(x)
    assert logits.shape == (3, 7)
    assert torch.equal(logits, model.classify(features))


def test_classifiers_train_backward_on_tiny_batches():
    """Gradients reach the first layer of every architecture (no detached features)."""
    for arch in CLASSIFIERS:
        model = build_classifier(arch, (1, 8, 8), 3, **SMALL_OPTIONS.get(arch, {})).train()
        model(torch.randn(4, 1, 8, 8)).sum().backward()
        first = next(p for p in model.parameters())
        assert first.grad is not None and first.grad.abs().sum() > 0, arch


@pytest.mark.parametrize("arch", ["cnn", "datalens", "resnet18"])
def test_convolutional_classifiers_run_channels_last_and_compute_what_the_standard_order_computes(arch):
    torch.manual_seed(0)
    model = build_classifier(arch, (3, 32, 32), 7, **SMALL_OPTIONS.get(arch, {})).eval()
    convolutions = [layer.weight for layer in model.modules() if isinstance(layer, nn.Conv2d)]
    assert all(weight.is_contiguous(memory_format=torch.channels_last) for weight in convolutions)
    assert not convolutions[0].is_contiguous()
    x = torch.randn(5, 3, 32, 32)
    fast = model(x)
    standard = use_channels_last(model, False)
    assert all(weight.is_contiguous() for weight in convolutions)
    assert torch.allclose(standard(x), fast, atol=1e-5)
    private, _ = per_example(use_channels_last(model).train())  # Opacus' per-example gradients
    assert not private.channels_last and all(weight.is_contiguous() for weight in private.parameters())


def test_a_wrapped_classifier_follows_its_wrapper_into_the_standard_order():
    """An imported model's input transform wraps the classifier: switching the wrapper switches the maps the
    classifier inside computes on, not only the weights."""
    inner = build_classifier("cnn", (1, 8, 8), 3)
    wrapped = use_channels_last(TransformedClassifier(inner, InputTransform({"range": [0.0, 1.0]}, 1)), False)
    orders = input_orders(wrapped, nn.BatchNorm2d)
    wrapped.eval()(torch.randn(2, 1, 8, 8))
    assert not inner.channels_last and orders == [True] * 3


def test_the_generator_runs_channels_last_and_computes_what_the_standard_order_computes():
    torch.manual_seed(0)
    generator = build_generator(16, (1, 28, 28), (16, 8, 4)).eval()
    convolutions = [layer.weight for layer in generator.modules() if isinstance(layer, nn.Conv2d)]
    assert all(weight.is_contiguous(memory_format=torch.channels_last) for weight in convolutions)
    latents = torch.randn(5, 16)
    fast = generator(latents)
    assert torch.allclose(use_channels_last(generator, False)(latents), fast, atol=1e-5)
    assert all(weight.is_contiguous() for weight in convolutions)


def test_registered_option_that_does_not_exist_is_a_config_error():
    with pytest.raises(ConfigError, match="does not accept options"):
        build_classifier("datalens", (1, 8, 8), 10, width=8)


def test_unknown_arch_names_every_choice():
    with pytest.raises(ConfigError) as error:
        build_classifier("vgg99", (1, 8, 8), 10)
    assert all(name in str(error.value) for name in CLASSIFIERS)
    assert "module.path:callable" in str(error.value)


def test_input_shape_must_have_three_dimensions():
    with pytest.raises(ConfigError, match="channels, height, width"):
        build_classifier("cnn", (28, 28), 10)


def test_count_parameters_counts_trainable_weights_only():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    assert count_parameters(model) == 3 * 4 + 4 + 4 * 2 + 2
    model[0].requires_grad_(False)
    assert count_parameters(model) == 4 * 2 + 2
    assert count_parameters(build_classifier("resnet18", (3, 32, 32), 10, width=8)) > \
        count_parameters(build_classifier("datalens", (1, 8, 8), 10))


@pytest.mark.parametrize("shape", [(1, 28, 28), (1, 8, 8), (3, 32, 32)])
def test_generator_shape_and_range(shape):
    images = build_generator(16, shape, (16, 8, 4)).train()(torch.randn(5, 16) * 10)
    assert images.shape == (5, *shape)
    assert images.min() >= -1 and images.max() <= 1


def test_generator_rejects_sizes_it_cannot_upsample_to():
    with pytest.raises(ConfigError, match="multiples of 4"):
        build_generator(16, (1, 30, 30), (16, 8, 4))
    with pytest.raises(ConfigError, match="3 channel counts"):
        build_generator(16, (1, 28, 28), (16, 8))
