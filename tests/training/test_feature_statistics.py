"""The released feature statistics: per-example moments clipped, the release's noise as planned, its accounting, the
file round trip, and the generator's term against them."""

from pathlib import Path

import pytest
import torch
from torch import nn

from dpdistill.errors import CheckpointError, ConfigError
from dpdistill.losses.generator import FeatureStatistics
from dpdistill.privacy.accounting import ADD_REMOVE, REPLACE_ONE, GaussianQuery, composed_epsilon
from dpdistill.privacy.randomness import noise_source
from dpdistill.training.feature_statistics import (StatisticsPlan, load_statistics, per_example_moments,
                                                   plan_statistics, release_statistics, save_statistics,
                                                   statistics_targets)


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
    released = release_statistics(model, images, len(images), 0.0, noise_source(True, 0), clip=1e9)
    for name, (mean, var) in exact_statistics(model, images).items():
        assert torch.allclose(released[name][0], mean, atol=1e-5) and torch.allclose(released[name][1], var, atol=1e-4)


def test_the_noise_on_each_released_mean_has_the_planned_spread():
    model, images = small_model(), torch.randn(200, 1, 6, 6)
    exact = release_statistics(model, images, len(images), 0.0, noise_source(True, 0), clip=2.0)
    deviations = torch.cat([release_statistics(model, images, len(images), 3.0, noise_source(False), clip=2.0)[name][0]
                            - exact[name][0] for _ in range(60) for name in exact])
    # noise of std 3 * 2 on each sum, over 200 examples: 0.03 on a mean; the sample std of 420 draws has a relative
    # spread of 1 / sqrt(840), 3.5%: 15% is over four of those (a false failure about once in 100,000 runs)
    assert deviations.std().item() == pytest.approx(3.0 * 2.0 / 200, rel=0.15)


def test_the_plan_spends_its_share_under_either_relation_and_doubles_the_noise_for_replacement():
    add_remove, replace_one = plan_statistics(0.1, 1e-6, ADD_REMOVE), plan_statistics(0.1, 1e-6, REPLACE_ONE)
    assert replace_one.multiplier == pytest.approx(2 * add_remove.multiplier)
    for plan, relation in ((add_remove, ADD_REMOVE), (replace_one, REPLACE_ONE)):
        assert 0.099 < plan.epsilon(relation) <= 0.1
    assert add_remove.epsilon(REPLACE_ONE) > 0.19  # the same noise against twice the sensitivity
    assert add_remove.release(REPLACE_ONE).epsilon == composed_epsilon(GaussianQuery(add_remove.multiplier / 2), 1,
                                                                       1e-6)


def test_the_file_keeps_the_statistics_and_their_release_and_is_refused_for_another_model(tmp_path: Path):
    model, images = small_model(), torch.randn(40, 1, 6, 6)
    released = release_statistics(model, images, 40, 1.0, noise_source(False))
    plan = StatisticsPlan(1.0, 1e-6)
    save_statistics(tmp_path / "s.safetensors", released, plan.figures())
    loaded, figures = load_statistics(tmp_path / "s.safetensors")
    assert figures == plan.figures() and StatisticsPlan.of_figures(figures) == plan
    assert all(torch.equal(loaded[name][0], released[name][0]) for name in released)
    targets = statistics_targets(model, loaded, torch.device("cpu"))
    assert len(targets) == 2
    other = nn.Sequential(nn.Conv2d(1, 5, 3), nn.GroupNorm(1, 5))
    with pytest.raises(ConfigError, match="another model"):
        statistics_targets(other, loaded, torch.device("cpu"))
    (tmp_path / "bad.safetensors").write_bytes(b"not a file")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_statistics(tmp_path / "bad.safetensors")


def test_the_term_is_near_zero_on_the_data_it_was_released_from_and_large_elsewhere():
    model, images = small_model(), torch.randn(2000, 1, 6, 6)
    targets = statistics_targets(model, release_statistics(model, images, len(images), 0.0, noise_source(True, 0),
                                                           clip=1e9), torch.device("cpu"))
    with FeatureStatistics(targets) as matched:
        model(images)
    with FeatureStatistics(targets) as shifted:
        model(images * 3 + 1)
    assert matched.loss().item() < 1e-3 < 1.0 < shifted.loss().item()
