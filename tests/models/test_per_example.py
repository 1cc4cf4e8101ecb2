"""A student made trainable with per-example gradients as a user of Opacus expects: BatchNorm becomes GroupNorm,
in-place activations compute out of place, each kind of change said in one line; a layer no fix helps is refused in
one line naming it."""

import pytest
import torch
from torch import nn

from dpdistill.errors import ConfigError
from dpdistill.models.per_example import per_example
from dpdistill.models.registry import build_classifier
from helpers import write_two_file_model


def test_batchnorm_and_in_place_activations_are_replaced_and_each_kind_said_in_one_line(tmp_path):
    model = build_classifier(write_two_file_model(tmp_path / "mycode"), (1, 8, 8), 10).train()
    fixed, changes = per_example(model)
    assert not any(isinstance(layer, nn.BatchNorm2d) for layer in fixed.modules())
    assert sum(isinstance(layer, nn.GroupNorm) for layer in fixed.modules()) == 2
    assert not any(getattr(layer, "inplace", False) for layer in fixed.modules())
    assert len(changes) == 2 and all("\n" not in change for change in changes)
    assert changes[0].startswith("BatchNorm2d -> GroupNorm(8 groups) at 0.bn, 2.bn (")  # the user's own names
    assert changes[1].startswith("ReLU(inplace=True) -> ReLU(inplace=False) at 0.act, 2.act (")
    assert fixed(torch.randn(3, 1, 8, 8)).shape == (3, 10)


class Scaled(nn.Module):
    """A trainable scale that also keeps a running statistic of its inputs: a buffer no noise would cover."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.register_buffer("seen", torch.zeros(1))

    def forward(self, x):
        return x * self.scale


def test_a_trainable_layer_with_buffers_is_refused_in_one_line_naming_it():
    model = nn.Sequential(nn.Flatten(), Scaled(), nn.Linear(64, 10))
    with pytest.raises(ConfigError, match=r"cannot train the layer 1 \(Scaled\).*buffers \(seen\)") as refused:
        per_example(model)
    assert "\n" not in str(refused.value)

