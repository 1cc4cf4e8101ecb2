"""The moving average of the iterates: the bias-corrected weighted sum it promises, swapped in and out without
disturbing the weights, and carried through a checkpoint."""

import torch
from torch import nn

from dpdistill.training.averaging import IterateAverage


def _set(layer: nn.Linear, value: float) -> None:
    with torch.no_grad():
        layer.weight.fill_(value)
        layer.bias.fill_(-value)


def test_the_average_weighs_each_iterate_by_the_decay_to_the_power_of_its_age():
    layer = nn.Linear(3, 2)
    average = IterateAverage(layer, 0.5)
    for value in (1.0, 2.0, 4.0):
        _set(layer, value)
        average.update()
    expected = (0.25 * 1 + 0.5 * 2 + 4) / (0.25 + 0.5 + 1)  # the initial weights take no part
    weight, bias = average.averages()
    assert torch.allclose(weight, torch.full((2, 3), expected)) and torch.allclose(bias, torch.full((2,), -expected))
    with average.swapped_in():
        assert torch.allclose(layer.weight, weight)
    assert torch.equal(layer.weight, torch.full((2, 3), 4.0))  # the last iterate again, training goes on from it
    average.apply()
    assert torch.allclose(layer.weight, weight)


def test_a_frozen_weight_is_not_averaged():
    layer = nn.Linear(3, 2)
    layer.bias.requires_grad_(False)
    assert [weight.shape for weight in IterateAverage(layer, 0.9).weights] == [(2, 3)]


def test_an_average_restored_from_its_state_continues_as_the_uninterrupted_one():
    layer, other = nn.Linear(3, 2), nn.Linear(3, 2)
    whole, resumed = IterateAverage(layer, 0.9), IterateAverage(other, 0.9)
    for value in (1.0, 3.0):
        _set(layer, value)
        whole.update()
    resumed.restore(whole.state())
    for average, module in ((whole, layer), (resumed, other)):
        _set(module, 5.0)
        average.update()
    assert all(torch.equal(a, b) for a, b in zip(whole.averages(), resumed.averages()))
