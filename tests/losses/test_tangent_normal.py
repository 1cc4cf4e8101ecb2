"""DGD's manifold pieces: the VAE learns its images, its decoder Jacobian is exact, the normal step leaves the
tangent space, and the regulariser pulls neighbours towards a fixed centre."""

import pytest
import torch
from torch.func import jacfwd, vmap

from dpdistill.data import load_dataset
from dpdistill.errors import ConfigError
from dpdistill.losses.tangent_normal import decoder_jacobians, tangent_normal_loss, tangent_normal_views
from dpdistill.models.registry import build_classifier
from dpdistill.models.vae import VAE
from dpdistill.training.semi_supervised import ConsistencyConfig
from dpdistill.training.vae import VaeConfig, fit_vae


def test_a_fitted_vae_explains_its_images_far_better_than_an_untrained_one():
    images = load_dataset("digits").x_train
    torch.manual_seed(0)
    untrained = VAE((1, 8, 8)).loss(images).item()
    vae, report = fit_vae(images, VaeConfig(steps=600))
    assert report["negative_elbo"] < 0.6 * untrained  # measured: 26 against 50 nats per image


def test_a_vae_fits_images_beyond_minus_one_to_one_in_their_own_range():
    """A generator ending in DAFL's BatchNorm gives images of unit variance. A Bernoulli likelihood on them as if
    in [-1, 1] has no lower bound: its negative ELBO ran to -3e8 nats and its decoder saturated."""
    images = 3 * load_dataset("digits").x_train
    vae, report = fit_vae(images, VaeConfig(steps=600))
    assert report["negative_elbo"] > 0 and report["value_range"] == [-3.0, 3.0]
    with torch.no_grad():
        mean, _ = vae.encode(images[:256])
        reconstructed = vae.decode(mean)
    assert reconstructed.min() < -2 and reconstructed.max() > 2  # the images' range (measured -3.0, 2.6)
    assert (reconstructed - images[:256]).pow(2).mean() < 0.5 * images[:256].var()  # measured 1.9 against 5.1


def test_a_vae_refuses_images_of_one_value():
    with pytest.raises(ConfigError, match="not all one value"):
        fit_vae(torch.zeros(4, 1, 8, 8), VaeConfig(steps=1))


def test_the_decoder_jacobian_is_each_codes_own():
    torch.manual_seed(0)
    vae, codes = VAE((1, 8, 8), latent_dim=6), torch.randn(4, 6)
    exact = vmap(jacfwd(lambda code: vae.decode(code[None]).flatten()))(codes)
    assert torch.allclose(decoder_jacobians(vae, codes), exact, atol=1e-6)


def test_the_normal_step_is_orthogonal_to_the_manifold_and_of_the_asked_size():
    torch.manual_seed(0)
    vae = VAE((1, 8, 8), latent_dim=6)
    images = torch.rand(16, 1, 8, 8) * 2 - 1
    torch.manual_seed(1)
    reconstructed, tangent, normal = tangent_normal_views(vae, images, tangent_radius=0.5, normal_radius=0.1)
    step = (normal - reconstructed).flatten(1)
    assert step.pow(2).mean(1).sqrt() == pytest.approx(torch.full((16,), 0.1), rel=1e-4)
    torch.manual_seed(1)  # the same codes: the step lies outside the span of each code's Jacobian
    mean, log_variance = vae.encode(images)
    codes = mean + torch.randn_like(mean) * (0.5 * log_variance).exp()
    along = decoder_jacobians(vae, codes).transpose(1, 2) @ step.unsqueeze(2)
    assert along.abs().max() < 1e-4 * step.norm(dim=1).max()
    assert not torch.allclose(tangent, reconstructed)


def test_a_decoder_that_ignores_a_coordinate_still_gets_a_normal_step():
    """A singular Jacobian (here a coordinate the decoder never reads) once stopped a DGD run with a solver error."""
    torch.manual_seed(0)
    vae = VAE((1, 8, 8), latent_dim=6)
    with torch.no_grad():
        vae.decoder[0].weight[:, 0] = 0
    images = torch.rand(16, 1, 8, 8) * 2 - 1
    torch.manual_seed(1)
    reconstructed, _, normal = tangent_normal_views(vae, images, tangent_radius=0.5, normal_radius=0.1)
    step = (normal - reconstructed).flatten(1)
    assert torch.isfinite(step).all()
    assert step.pow(2).mean(1).sqrt() == pytest.approx(torch.full((16,), 0.1), rel=1e-4)
    torch.manual_seed(1)
    mean, log_variance = vae.encode(images)
    codes = mean + torch.randn_like(mean) * (0.5 * log_variance).exp()
    along = decoder_jacobians(vae, codes).transpose(1, 2) @ step.unsqueeze(2)
    assert along.abs().max() < 1e-4 * step.norm(dim=1).max()


def test_the_regulariser_pulls_the_neighbours_towards_a_fixed_centre():
    torch.manual_seed(0)
    student = build_classifier("cnn", (1, 8, 8), 10).eval()  # eval: BatchNorm does not tie the images together
    images = torch.rand(8, 1, 8, 8) * 2 - 1
    same = student.features(torch.cat([images] * 3))
    logits = student.classify(same[:8])
    assert tangent_normal_loss(same, logits, entropy_weight=0.0).item() == pytest.approx(0.0, abs=1e-6)
    assert tangent_normal_loss(same, logits, entropy_weight=1.0).item() > 0
    centre, neighbours = images.clone().requires_grad_(True), torch.cat([images + 0.3, images - 0.3]).requires_grad_()
    moved = student.features(torch.cat([centre, neighbours]))
    loss = tangent_normal_loss(moved, student.classify(moved[:8]).detach(), entropy_weight=0.0)
    loss.backward()
    assert loss.item() > 0 and neighbours.grad.abs().max() > 0 and not centre.grad.any()  # the centre: a target


def test_an_unknown_regulariser_is_refused():
    with pytest.raises(ConfigError, match="regularizer"):
        ConsistencyConfig(regularizer="vat")


def test_eq_6_as_written_compares_the_raw_features_and_moves_the_centre_too():
    torch.manual_seed(0)
    features = torch.randn(24, 16, requires_grad=True)
    logits = torch.zeros(8, 10)
    loss = tangent_normal_loss(features, logits, entropy_weight=0.0, raw=True)
    centre, along, across = features.detach().chunk(3)
    assert loss.item() == pytest.approx(((centre - along).pow(2).sum(1) + (centre - across).pow(2).sum(1)).mean().item())
    loss.backward()
    assert features.grad[:8].abs().max() > 0  # the centre learns as well
    assert tangent_normal_loss(features * 10, logits, 0.0, raw=True) > 10 * tangent_normal_loss(features, logits, 0.0,
                                                                                                 raw=True)
