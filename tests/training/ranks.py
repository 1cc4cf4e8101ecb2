"""What the processes that tests/training/test_distributed.py starts run: imported afresh by each (spawned), so it
imports only what they all need (the optimizers' modules, seconds to import, where they are used)."""

import torch
import torch.nn.functional as F
from torch import nn

from dpdistill.errors import ConfigError
from dpdistill.privacy.randomness import ReproducibleNoise
from dpdistill.training.distributed import Group


class CountingNoise(ReproducibleNoise):
    """The reproducible source, keeping every Gaussian draw it makes."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.drawn: list[torch.Tensor] = []

    def normal(self, shape, std, device="cpu"):
        noise = super().normal(shape, std, device)
        self.drawn.append(noise.clone())
        return noise


EXAMPLES, FEATURES, CLASSES, CLIP, BATCH = 10, 6, 3, 0.1, 10.0  # BATCH: the public expected batch of the plan


def data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(EXAMPLES, FEATURES, generator=generator),
            torch.randint(0, CLASSES, (EXAMPLES,), generator=generator))


def steps_on_each_rank(steps: int, progress) -> list[dict]:
    """`steps` DP-SGD steps on this rank's shard of `data()` with each distributed optimizer (materialised
    per-example gradients, then ghost clipping); every rank's draws, weights before each step and gradients."""
    from opacus import GradSampleModule
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    from dpdistill.training.private import (NoiseSourceDistributedDPOptimizer,
                                            NoiseSourceDistributedGhostClippingOptimizer)

    group = Group.current()
    inputs, labels = (group.shard(tensor) for tensor in data())
    records = []
    for ghost in (False, True):
        torch.manual_seed(0)
        layer = nn.Linear(FEATURES, CLASSES, bias=False)
        noise = CountingNoise(group.rank + 1)
        settings = {"noise": noise, "noise_multiplier": 0.5, "max_grad_norm": CLIP,
                    "expected_batch_size": BATCH / group.size}
        sgd = torch.optim.SGD(layer.parameters(), lr=1.0)
        before, grads = [], []
        if ghost:
            module = GradSampleModuleFastGradientClipping(layer, max_grad_norm=CLIP)
            optimizer = NoiseSourceDistributedGhostClippingOptimizer(sgd, **settings)
            loss = DPLossFastGradientClipping(module, optimizer, nn.CrossEntropyLoss())
        else:
            module = GradSampleModule(layer)
            optimizer = NoiseSourceDistributedDPOptimizer(sgd, **settings)
        for _ in range(steps):
            before.append(layer.weight.detach().clone().tolist())
            optimizer.zero_grad(set_to_none=True)
            if ghost:
                loss(module(inputs), labels).backward()
            else:
                F.cross_entropy(module(inputs), labels).backward()
            optimizer.step()
            grads.append(layer.weight.grad.tolist())
        records.append({"draws": [draw.tolist() for draw in noise.drawn], "before": before, "grads": grads})
    return group.gather_json(records)


def fails_on_one_rank(failing: int, progress) -> None:
    """`failing` raises while the other rank waits in an exchange with it."""
    group = Group.current()
    if group.rank == failing:
        raise (ConfigError("a refusal on rank 0") if failing == 0 else ValueError("a mistake on rank 1"))
    group.sum(1.0)
