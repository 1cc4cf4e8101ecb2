"""How many heads on the frozen encoder, and how many answers at a sound epsilon? Fashion-MNIST.

    .venv/bin/python benchmarks/experiments/head_members.py [ENCODER_DIR]

ENCODER_DIR defaults to the harness's `runs/bench/pretrain-fmnist/seed0` (row `pretrain-fmnist`). For M heads
(the `teachers-1000-heads-*` recipe: Adam 0.01, weight decay 0.01, 300 full-batch steps), prints the members'
mean test accuracy and their plurality vote's on the 5,000 test images PATE measures on, then, on the 5,000
public images, how often GNMax answers name the true class at sound epsilon 1 and 10 for several numbers of
answers (sigma calibrated as `dpdistill pate` does; the mean of five noise draws). M = 1 is the linear probe
on all 60,000 images: what the features hold. M = 50 and 100 are for epsilon 10, where fewer, stronger members
outvote the smaller noise. Last, for each M, the heads' parameter average instead of their votes (subsample and
aggregate: one Gaussian release of the clipped heads' sum for the whole budget) without noise and at epsilon
1 and 10 with the clipping bound read from the heads (their median norm): data-dependent, so those figures are NOT
a guarantee, only what the route could reach with a well-chosen bound. About five minutes on 2 cores.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch import Tensor

from dpdistill.data import load_dataset
from dpdistill.data.partition import new_partition_key, partition_indices
from dpdistill.evaluation.metrics import features
from dpdistill.methods.pate import PateConfig
from dpdistill.models.ensemble import HeadEnsemble, plurality_counts
from dpdistill.privacy.accounting import GaussianQuery, calibrate
from dpdistill.privacy.budget import plan_privacy
from dpdistill.privacy.mechanisms import noisy_votes
from dpdistill.privacy.randomness import ReproducibleNoise
from dpdistill.training.teacher import TeacherConfig, load_encoder, train_heads

PUBLIC = 5000
ANSWERS = (200, 500, 1000, 2000)
DELTA = 1e-5


def answer_sigma(epsilon: float, answers: int) -> float:
    """The GNMax noise std `dpdistill pate` calibrates for `answers` answers at sound `epsilon` (delta 1e-5)."""
    return plan_privacy(PateConfig(epsilon=epsilon).privacy_request(2, 10), 10, answers, 1).sigma


def answers_right(votes: Tensor, labels: Tensor, sigma: float, draws: int = 5) -> float:
    """How often GNMax answers on images with these `votes` (n, classes) name their `labels`: the mean over
    `draws` noise draws (seeded, so reruns agree: a measurement, not a release)."""
    noise = ReproducibleNoise(0)
    every_class = torch.ones_like(votes, dtype=torch.bool)
    return sum((noisy_votes(votes, every_class, sigma, noise).argmax(1) == labels).float().mean().item()
               for _ in range(draws)) / draws


def parameter_average(heads: HeadEnsemble, measured: Tensor, labels: Tensor, epsilons: tuple[float, ...]) -> str:
    """Accuracy on `measured` features of the heads' parameter average, without noise or clipping and released
    once at each epsilon (mean of five draws). Each head's weights and bias are clipped to the median norm C; one
    example changes one head, so the sum moves by at most 2C and one Gaussian of std z * 2C would cover it for a C
    fixed in advance. Here C is read from the private heads, so the epsilon is NOT a guarantee: the figures show
    what the route could reach with a bound that good."""
    flat = torch.cat([heads.weight.detach().flatten(1), heads.bias.detach()], 1)
    norms = flat.norm(dim=1)
    clip = norms.median().item()
    total = (flat * (clip / norms.clamp(min=clip))[:, None]).sum(0)

    def accuracy(parameters: Tensor) -> float:  # a sum or a mean: the argmax is the same
        logits = measured @ parameters[:-10].view(-1, 10) + parameters[-10:]
        return (logits.argmax(1) == labels).float().mean().item()

    generator = torch.Generator().manual_seed(0)
    noisy = []
    for epsilon in epsilons:
        noise_std = calibrate(GaussianQuery, 1, epsilon, DELTA).noise_multiplier * 2 * clip
        draws = [accuracy(total + noise_std * torch.randn(total.shape, generator=generator)) for _ in range(5)]
        noisy.append(f"{100 * sum(draws) / 5:.2f}% at epsilon {epsilon:g} (noise std {noise_std:.2f}; "
                     f"median clip: not a guarantee)")
    return (f"parameter mean {100 * accuracy(flat.mean(0)):.2f}% without noise or clipping, {', '.join(noisy)}; "
            f"clip {clip:.2f}, a sum of {len(flat)}")


def main(encoder_dir: Path) -> None:
    dataset = load_dataset("fmnist")
    encoder = load_encoder(encoder_dir, "cnn", dataset.input_shape, dataset.num_classes)
    train_features, test_features = features(encoder, dataset.x_train), features(encoder, dataset.x_test)
    public, measured = test_features[:PUBLIC], test_features[PUBLIC:]
    public_labels, measured_labels = dataset.y_test[:PUBLIC], dataset.y_test[PUBLIC:]
    sigmas = {(epsilon, count): answer_sigma(epsilon, count) for epsilon in (1.0, 10.0) for count in ANSWERS}
    config = TeacherConfig(lr=0.01, weight_decay=0.01, min_steps=300, init=str(encoder_dir), heads_only=True)
    for members in (1, 50, 100, 250, 500, 1000, 2000):
        started = time.perf_counter()
        parts = partition_indices(dataset.ids_train, members, new_partition_key())
        weight, bias, _ = train_heads(train_features, dataset.y_train, parts, dataset.num_classes, config)
        heads = HeadEnsemble(encoder, weight, bias)
        with torch.no_grad():
            measured_logits, public_logits = heads.head_logits(measured), heads.head_logits(public)
        member_mean = (measured_logits.argmax(-1) == measured_labels).float().mean().item()
        plurality = plurality_counts(measured_logits, 10).argmax(1)
        counts = plurality_counts(public_logits, 10)
        right = [f"eps {epsilon:g}, {count}: {100 * answers_right(counts[:count], public_labels[:count], sigma):.1f}%"
                 for (epsilon, count), sigma in sigmas.items()]
        print(f"M={members}: members {100 * member_mean:.2f}%, plurality "
              f"{100 * (plurality == measured_labels).float().mean().item():.2f}%, "
              f"{time.perf_counter() - started:.0f} s; answers right: {'; '.join(right)}; "
              f"{parameter_average(heads, measured, measured_labels, (1.0, 10.0))}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/bench/pretrain-fmnist/seed0"))
