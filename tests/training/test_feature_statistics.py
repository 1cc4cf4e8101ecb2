"""The released feature statistics: per-example moments clipped, each example's class part bounded, the release's
noise as planned, its accounting, the file round trip, and the generator's terms against them."""

from pathlib import Path

import pytest
import torch
from torch import nn

from dpdistill.errors import CheckpointError, ConfigError
from dpdistill.losses.generator import FeatureStatistics, image_cells
from dpdistill.privacy.accounting import ADD_REMOVE, REPLACE_ONE, GaussianQuery, composed_epsilon
from dpdistill.privacy.randomness import noise_source
from dpdistill.training.feature_statistics import (NORM_EDGES, NORM_SHARE, StatisticsPlan, class_part,
                                                   class_targets, layer_moments, load_statistics, noisy_norm_median,
                                                   per_example_moments, plan_statistics, release_statistics,
                                                   save_statistics, statistics_targets)


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(),
                         nn.Conv2d(4, 3, 3, padding=1), nn.GroupNorm(1, 3)).eval()


def exact_statistics(model: nn.Module, images: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each normalisation layer's input mean and variance over all examples and positions, read directly."""
    seen: dict[str, torch.Tensor] = {}
    hooks = [layer.register_forward_hook(lambda _m, inputs, _o, name=name: seen.__setitem__(name, inputs[0]))
             for name, layer in model.named_modules() if isinstance(layer, nn.GroupNorm)]
    with torch.no_grad():
        model(images)
    for hook in hooks:
        hook.remove()
    return {name: (x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)) for name, x in seen.items()}


def release(model: nn.Module, images: torch.Tensor, multiplier: float, clip: float = 20.0,
            labels: torch.Tensor | None = None, resolution: int = 0, image_clip: float | None = None, seed=0):
    """One release over all `images` (the public size is their count), from the seed's noise (None: secret)."""
    labels = torch.zeros(len(images), dtype=torch.long) if labels is None else labels
    plan = StatisticsPlan(multiplier, 1e-6, clip, resolution, image_clip)
    return release_statistics(model, images, labels, len(images), plan, 3, noise_source(seed is not None, seed or 0))


def test_each_examples_moments_are_clipped_to_the_bound_and_small_ones_kept():
    model, images = small_model(), torch.randn(50, 1, 6, 6)
    free = per_example_moments(model, images, 1e9)
    assert free.shape == (50, 2 * (4 + 3))
    clip = free.norm(dim=1).median().item()
    clipped = per_example_moments(model, images, clip)
    assert clipped.norm(dim=1).max().item() <= clip * (1 + 1e-5)
    small = free.norm(dim=1) <= clip
    assert torch.allclose(clipped[small], free[small]) and small.any() and not small.all()


def test_without_noise_the_release_is_each_layers_input_mean_and_variance():
    model, images = small_model(), torch.randn(300, 1, 6, 6)
    released = release(model, images, 0.0, clip=1e9)
    assert released.classes is None
    for name, (mean, var) in exact_statistics(model, images).items():
        assert torch.allclose(released.layers[name][0], mean, atol=1e-5)
        assert torch.allclose(released.layers[name][1], var, atol=1e-4)


def test_without_noise_the_class_part_is_each_classes_cell_mean_and_variance():
    images, labels = torch.rand(300, 1, 8, 8) * 2 - 1, torch.arange(300) % 3
    mean, var = release(small_model(), images, 0.0, labels=labels, resolution=4, image_clip=1e9).classes
    cells = image_cells(images, 4)
    assert mean.shape == var.shape == (3, 16)
    for label in range(3):
        assert torch.allclose(mean[label], cells[labels == label].mean(0), atol=1e-5)
        assert torch.allclose(var[label], cells[labels == label].var(0, unbiased=False), atol=1e-4)


def test_each_examples_class_part_lies_in_its_class_slot_within_the_bound_the_sensitivity_counts():
    plan = StatisticsPlan(1.0, 1e-6, clip=5.0, resolution=4, image_clip=0.5)  # most examples clipped
    images, labels = torch.rand(40, 1, 8, 8) * 2 - 1, torch.arange(40) % 3
    part = class_part(images, labels, plan, 3).view(40, 3, -1)
    assert torch.all(part.norm(dim=2).amax(1) <= plan.clip * (1 + 1e-5))
    assert torch.all(part.norm(dim=2).gt(0).sum(1) == 1) and torch.equal(part.norm(dim=2).argmax(1), labels)
    assert plan.sensitivity == pytest.approx(5.0 * 2 ** 0.5)
    assert StatisticsPlan(1.0, 1e-6, clip=5.0).sensitivity == 5.0  # without the class part: the layers' bound


def test_the_noise_on_each_released_mean_has_the_planned_spread():
    model, images = small_model(), torch.randn(200, 1, 6, 6)
    for resolution, sensitivity in ((0, 2.0), (2, 2.0 * 2 ** 0.5)):  # with the class part, sqrt(2) times the noise
        exact = release(model, images, 0.0, clip=2.0, resolution=resolution).layers
        deviations = torch.cat([release(model, images, 3.0, clip=2.0, resolution=resolution, seed=None
                                        ).layers[name][0] - exact[name][0] for _ in range(60) for name in exact])
        # noise of std 3 x the sensitivity on each sum, over 200 examples; the sample std of 420 draws has a
        # relative spread of 1 / sqrt(840), 3.5%: 15% is over four of those (a false failure about once in 100,000)
        assert deviations.std().item() == pytest.approx(3.0 * sensitivity / 200, rel=0.15)


def test_the_plan_spends_its_share_under_either_relation_and_doubles_the_noise_for_replacement():
    add_remove, replace_one = plan_statistics(0.1, 1e-6, ADD_REMOVE), plan_statistics(0.1, 1e-6, REPLACE_ONE)
    assert replace_one.multiplier == pytest.approx(2 * add_remove.multiplier)
    for plan, relation in ((add_remove, ADD_REMOVE), (replace_one, REPLACE_ONE)):
        assert 0.099 < plan.epsilon(relation) <= 0.1
    assert add_remove.epsilon(REPLACE_ONE) > 0.19  # the same noise against twice the sensitivity
    assert add_remove.release(REPLACE_ONE).epsilon == composed_epsilon(GaussianQuery(add_remove.multiplier / 2), 1,
                                                                       1e-6)


def test_a_larger_bound_keeps_the_epsilon_and_grows_the_noise_with_it():
    """A teacher whose moments outgrow the default bound (a longer-trained one) gets them unshrunk for more noise:
    the release's epsilon is fixed, its noise std on the sum is the multiplier times the bound."""
    default, larger = plan_statistics(1.0, 1e-6, ADD_REMOVE, 14), plan_statistics(1.0, 1e-6, ADD_REMOVE, 14, clip=40.0)
    assert (default.clip, larger.clip) == (20.0, 40.0) and larger.multiplier == default.multiplier
    assert larger.sensitivity == pytest.approx(2 * default.sensitivity)
    assert larger.epsilon(ADD_REMOVE) == default.epsilon(ADD_REMOVE) and larger.figures()["clip"] == 40.0
    assert StatisticsPlan.of_figures(larger.figures()) == larger  # what a transcription checks the ledger against


def test_a_chosen_bound_spends_a_share_of_the_same_epsilon_two_gaussians_composed_exactly():
    """--statistics-clip auto: the norms' histogram and the moments are two Gaussian mechanisms whose composition,
    by dp-accounting's PLD accountant, is the one release the ledger records."""
    import dp_accounting

    fixed, chosen = plan_statistics(0.1, 1e-6, ADD_REMOVE, 14), plan_statistics(0.1, 1e-6, ADD_REMOVE, 14, clip=None)
    assert chosen.clip is None and chosen.norm_share == NORM_SHARE and chosen.multiplier == fixed.multiplier
    assert chosen.moments_multiplier == pytest.approx(fixed.multiplier / (1 - NORM_SHARE) ** 0.5)
    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(chosen.norm_multiplier),
                                                      dp_accounting.GaussianDpEvent(chosen.moments_multiplier)]))
    assert accountant.get_epsilon(1e-6) == pytest.approx(fixed.epsilon(ADD_REMOVE), rel=2e-3)
    drawn = chosen.with_clip(32.0)
    assert (drawn.clip, drawn.norm_median) == (40.0, 32.0) and drawn.release(REPLACE_ONE) == fixed.release(REPLACE_ONE)
    assert StatisticsPlan.of_figures(drawn.figures()) == drawn and "two Gaussian" in drawn.figures()["accountant"]
    assert StatisticsPlan.of_figures(fixed.figures()).norm_share == 0.0


def test_the_noisy_median_is_the_upper_edge_of_the_cell_holding_the_norms_median():
    model, images = small_model(), torch.randn(2000, 1, 6, 6) * 3
    norms = layer_moments(model, images).norm(dim=1)
    cell = int(torch.bucketize(norms.median(), NORM_EDGES))
    exact = StatisticsPlan(1e-4, 1e-6, None, norm_share=0.5)  # counts' noise 1.4e-4: the exact histogram
    assert noisy_norm_median(model, images, exact, noise_source(True, 0)) == pytest.approx(NORM_EDGES[cell].item())
    # counts' noise of std 4 over 2,000 examples: the half-total moves by about 4 x sqrt(cells below), some 40
    # examples; 20 secret draws all land within one cell of the exact one
    noisy = StatisticsPlan(4 * 0.5 ** 0.5, 1e-6, None, norm_share=0.5)
    edges = {noisy_norm_median(model, images, noisy, noise_source(False, 0)) for _ in range(20)}
    assert edges <= {NORM_EDGES[cell + offset].item() for offset in (-1, 0, 1)}


def test_the_moments_noise_grows_by_what_the_norms_took():
    model, images = small_model(), torch.randn(200, 1, 6, 6)
    exact = release(model, images, 0.0, clip=2.0).layers
    plan = StatisticsPlan(3.0, 1e-6, 2.0, norm_share=0.5)
    deviations = torch.cat([release_statistics(model, images, torch.zeros(200, dtype=torch.long), 200, plan, 3,
                                               noise_source(False, 0)).layers[name][0] - exact[name][0]
                            for _ in range(60) for name in exact])
    # std 3 / sqrt(1 - 0.5) x the bound 2 on each sum over 200 examples; 15% as in the test above
    assert deviations.std().item() == pytest.approx(3.0 * 2 ** 0.5 * 2.0 / 200, rel=0.15)


def test_the_file_keeps_the_statistics_and_their_release_and_is_refused_for_another_model(tmp_path: Path):
    model, images = small_model(), torch.randn(40, 1, 6, 6)
    released = release(model, images, 1.0, resolution=3, seed=None)
    plan = StatisticsPlan(1.0, 1e-6, resolution=3)
    save_statistics(tmp_path / "s.safetensors", released, plan.figures())
    loaded, figures = load_statistics(tmp_path / "s.safetensors")
    assert figures == plan.figures() and StatisticsPlan.of_figures(figures) == plan
    assert plan.image_clip == pytest.approx(0.6 * 3)
    assert all(torch.equal(loaded.layers[name][0], released.layers[name][0]) for name in released.layers)
    assert all(torch.equal(saved, kept) for saved, kept in zip(loaded.classes, released.classes))
    targets = statistics_targets(model, loaded, torch.device("cpu"))
    assert len(targets) == 2
    assert class_targets(loaded, (1, 6, 6), 3, torch.device("cpu")).resolution == 3
    for in_shape, classes in (((3, 6, 6), 3), ((1, 6, 6), 10)):
        with pytest.raises(ConfigError, match="class statistics"):
            class_targets(loaded, in_shape, classes, torch.device("cpu"))
    other = nn.Sequential(nn.Conv2d(1, 5, 3), nn.GroupNorm(1, 5))
    with pytest.raises(ConfigError, match="another model"):
        statistics_targets(other, loaded, torch.device("cpu"))
    (tmp_path / "bad.safetensors").write_bytes(b"not a file")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_statistics(tmp_path / "bad.safetensors")


def test_the_term_is_near_zero_on_the_data_it_was_released_from_and_large_elsewhere():
    model, images = small_model(), torch.randn(2000, 1, 6, 6)
    targets = statistics_targets(model, release(model, images, 0.0, clip=1e9), torch.device("cpu"))
    with FeatureStatistics(targets) as matched:
        model(images)
    with FeatureStatistics(targets) as shifted:
        model(images * 3 + 1)
    assert matched.loss().item() < 1e-3 < 1.0 < shifted.loss().item()


def test_the_class_term_is_near_zero_for_each_classes_own_images_and_large_for_anothers():
    torch.manual_seed(0)
    labels = torch.arange(3000) % 3
    images = (torch.rand(3000, 1, 8, 8) * 0.2 + labels.view(-1, 1, 1, 1) * 0.4).clamp(max=1) * 2 - 1
    term = class_targets(release(small_model(), images, 0.0, labels=labels, resolution=4, image_clip=1e9), (1, 8, 8),
                         3, torch.device("cpu"))
    assert term.loss(images[:300], labels[:300]).item() < 0.1 < 1.0 < term.loss(images[:300],
                                                                            (labels[:300] + 1) % 3).item()
