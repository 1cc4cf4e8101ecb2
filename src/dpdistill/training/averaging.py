"""An exponential moving average of a model's weights over the iterates of its training, released instead of the
last iterate.

Under DP-SGD every iterate is post-processing of the noisy gradients released so far, so any average of them is
too: it costs no privacy. It averages out part of the noise the last steps leave in the weights (Polyak-Ruppert
averaging, as in De et al. 2022's DP-SGD recipe).

The average is bias-corrected: after t steps it is sum_i decay^(t-i) w_i / sum_i decay^(t-i) over the iterates
w_1 .. w_t after each step, so the initial weights never weigh in and a decay whose horizon 1 / (1 - decay) is
longer than the run tends to the uniform average of the iterates.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import Tensor, nn


class IterateAverage:
    """The moving average of the trainable weights of `module` with `decay` in (0, 1), updated after each step."""

    def __init__(self, module: nn.Module, decay: float) -> None:
        self.decay = decay
        self.weights = [weight for weight in module.parameters() if weight.requires_grad]
        self.sums = [torch.zeros_like(weight) for weight in self.weights]  # sum_i decay^(t-i) w_i
        self.mass = 0.0  # sum_i decay^(t-i): what the sums are divided by

    def update(self) -> None:
        """Take in the iterate the last step left."""
        self.mass = self.decay * self.mass + 1.0
        with torch.no_grad():
            for total, weight in zip(self.sums, self.weights):
                total.mul_(self.decay).add_(weight)

    def averages(self) -> list[Tensor]:
        """The averaged weights (after at least one step)."""
        return [total / self.mass for total in self.sums]

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The module holds the averaged weights inside the block, its own again after it."""
        current = [weight.detach().clone() for weight in self.weights]
        self._load(self.averages())
        try:
            yield
        finally:
            self._load(current)

    def apply(self) -> None:
        """Put the averaged weights into the module for good: the student the run releases."""
        self._load(self.averages())

    def _load(self, values: list[Tensor]) -> None:
        with torch.no_grad():
            for weight, value in zip(self.weights, values):
                weight.copy_(value)

    def state(self) -> dict[str, Any]:
        return {"mass": self.mass, "sums": list(self.sums)}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's average (of the same weights and decay: the run's saved configuration)."""
        self.mass = state["mass"]
        for total, saved in zip(self.sums, state["sums"]):
            total.copy_(saved)
