"""White-box gradient canaries for DP-SGD (Steinke, Nasr and Jagielski 2023, Section 6: Dirac canaries).

Canary i is a gradient of norm C (the clipping bound) on one coordinate of the trained weights, its own: the
gradient a worst-case example could contribute. Included canaries join DP-SGD's clipped sum in the steps their
own Poisson draw (at the run's sampling rate) selects, before the noise is added; every canary is then scored by
the sum over all steps of the noisy gradient on its coordinate, as an auditor who sees every privatised gradient
would (the sampling stays unseen: the score never uses it). The data's own gradient on the canaries' coordinates
is removed first: that only lowers each example's clipped norm, so the guarantee still covers the run, and the
canaries are then scored against the noise alone (a small model's data gradients would drown them). This audits
the mechanism where it runs, the real optimizer's noise step, with the strongest canary the guarantee covers.
"""

from __future__ import annotations

import secrets
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

from dpdistill.errors import ConfigError
from dpdistill.training.private import GRADIENT_CANARIES


class GradientCanaries:
    """Canaries on distinct coordinates of the trained weights (chosen by `seed`), `included` (bool, one each)."""

    def __init__(self, included: Tensor, seed: int) -> None:
        self.included, self.seed = included.bool(), seed
        self.observed = torch.zeros(len(included), dtype=torch.float64)
        self.steps = 0

    def attach(self, optimizer: torch.optim.Optimizer, module: nn.Module, sample_rate: float,
               max_grad_norm: float) -> None:
        """Wrap `optimizer`'s noise step (Opacus' add_noise): canaries in before it, their coordinates read after."""
        weights = [weight for weight in module.parameters() if weight.requires_grad]
        sizes = torch.tensor([weight.numel() for weight in weights])
        count = len(self.included)
        if int(sizes.sum()) < count:
            raise ConfigError(f"{count} gradient canaries need as many trained weights; the student has "
                              f"{int(sizes.sum())}: lower --canaries")
        coordinates = torch.randperm(int(sizes.sum()), generator=torch.Generator().manual_seed(self.seed))[:count]
        owner = torch.bucketize(coordinates, sizes.cumsum(0), right=True)  # which weight tensor holds each
        local = coordinates - torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])[owner]
        sampling = torch.Generator().manual_seed(secrets.randbits(63))  # the mechanism's draw: unseen by the score
        add_noise = optimizer.add_noise

        def add_noise_with_canaries() -> None:
            present = (torch.rand(count, generator=sampling) < sample_rate) & self.included
            for index, weight in enumerate(weights):
                flat, mine = weight.summed_grad.view(-1), owner == index
                flat[local[mine].to(weight.device)] = 0.0  # the data's share there: only lowers each norm
                flat[local[mine & present].to(weight.device)] += max_grad_norm
            add_noise()
            for index, weight in enumerate(weights):
                mine = owner == index
                self.observed[mine] += weight.grad.detach().reshape(-1)[local[mine].to(weight.device)].double().cpu()
            self.steps += 1

        optimizer.add_noise = add_noise_with_canaries


@contextmanager
def gradient_canaries(canaries: GradientCanaries | None) -> Iterator[GradientCanaries | None]:
    """DP-SGD runs inside this block train with `canaries` (training/private.py reads GRADIENT_CANARIES); None:
    without any."""
    token = GRADIENT_CANARIES.set(canaries)
    try:
        yield canaries
    finally:
        GRADIENT_CANARIES.reset(token)
