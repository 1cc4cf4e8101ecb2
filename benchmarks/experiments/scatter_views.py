"""Two candidate improvements of scatter-linear DP-SGD (`train-private`'s default student), each measured beside
the plain run on the same loop:

- augmentation multiplicity (De et al. 2022): each example's gradient is the mean of its gradients on K fixed views
  of the image (itself, mirrored, shifted by a pixel) before clipping, so one example still moves the sum by at most
  the clip and the accounting is unchanged;
- standardised features (Tramer & Boneh's data normalisation): every coefficient (`feature`) or every scattering
  channel (`channel`) shifted and scaled by the training set's exact mean and deviation. Exact statistics are the
  noise-free upper bound of the private version: if they do not help, a noisy release of them cannot.

    .venv/bin/python benchmarks/experiments/scatter_views.py DATASET [--views id,flip,...] [--standardise feature]
        [--seeds 0,1] [--epsilon 1]

The loop is train-private's: the defaults' batch, step, epochs and clip (SGD with momentum 0.9), Poisson batches
and the calibrated noise multiplier of the same plan, the Gaussian noise drawn from the secure source. The linear
layer's per-example gradient norms are computed in closed form, so a run takes 20 s per view on 2 cores once the
features are cached (each view's first run computes its scattering, about 25 s). One JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from dpdistill.data import load_dataset
from dpdistill.models.features import frozen_features
from dpdistill.models.registry import build_classifier
from dpdistill.privacy.randomness import SecureNoise
from dpdistill.training.private import (PrivateTrainingConfig, plan_private_training, public_train_size,
                                       with_public_size)


def shifted(images: Tensor, rows: int, cols: int) -> Tensor:
    """The images moved by (rows, cols) pixels, the uncovered border filled with the background (the minimum)."""
    height, width = images.shape[-2:]
    padded = F.pad(images, (1, 1, 1, 1), value=float(images.min()))
    return padded[..., 1 + rows:1 + rows + height, 1 + cols:1 + cols + width].contiguous()


VIEWS: dict[str, Callable[[Tensor], Tensor]] = {
    "id": lambda images: images,
    "flip": lambda images: images.flip(3).contiguous(),
    "up": lambda images: shifted(images, 1, 0), "down": lambda images: shifted(images, -1, 0),
    "left": lambda images: shifted(images, 0, 1), "right": lambda images: shifted(images, 0, -1),
}


def standardised(train: Tensor, test: Tensor, how: str, channels: int) -> tuple[Tensor, Tensor]:
    """Both sets shifted and scaled by the training set's exact mean and deviation, per coefficient or channel."""
    if how == "none":
        return train, test
    grouped = train.reshape(*train.shape[:-1], channels, -1)
    dims = tuple(range(grouped.dim() - 2)) + ((grouped.dim() - 1,) if how == "channel" else ())
    mean, deviation = grouped.mean(dims, keepdim=True), grouped.std(dims, keepdim=True).clamp_min(1e-3)
    centre, scale = mean.reshape(mean.shape[-2:]), deviation.reshape(deviation.shape[-2:])  # (channels, 1 or cells)

    def apply(features: Tensor) -> Tensor:
        shaped = features.reshape(*features.shape[:-1], channels, -1)
        return ((shaped - centre) / scale).reshape(features.shape)
    return apply(train), apply(test)


def train_once(features: Tensor, labels: Tensor, config: PrivateTrainingConfig, noise_multiplier: float,
               sample_rate: float, steps: int) -> tuple[Tensor, Tensor]:
    """DP-SGD on a linear layer over (N, K, D) views: each example's K view gradients averaged, then clipped."""
    size, views, dims = features.shape
    classes = int(labels.max()) + 1
    weight, bias = torch.zeros(classes, dims), torch.zeros(classes)
    momentum_weight, momentum_bias = torch.zeros_like(weight), torch.zeros_like(bias)
    noise, clip = SecureNoise(), config.max_grad_norm
    for _ in range(steps):
        batch = (noise.uniform((size,)) < sample_rate).nonzero()[:, 0]
        inputs = features[batch]
        errors = torch.softmax(inputs @ weight.T + bias, -1) - F.one_hot(labels[batch], classes)[:, None].float()
        norms = (((inputs @ inputs.transpose(1, 2) + 1) * (errors @ errors.transpose(1, 2))).sum((1, 2))
                 / views**2).sqrt()
        weighted = errors * ((clip / norms).clamp(max=1.0) / views)[:, None, None]
        grad_weight = torch.einsum("bkc,bkd->cd", weighted, inputs) + noise.normal(weight.shape, noise_multiplier * clip)
        grad_bias = weighted.sum((0, 1)) + noise.normal(bias.shape, noise_multiplier * clip)
        momentum_weight = config.momentum * momentum_weight + grad_weight / config.batch_size
        momentum_bias = config.momentum * momentum_bias + grad_bias / config.batch_size
        weight -= config.lr * momentum_weight
        bias -= config.lr * momentum_bias
    return weight, bias


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--views", default="id", help=f"comma-separated, of {', '.join(VIEWS)}")
    parser.add_argument("--standardise", choices=("none", "feature", "channel"), default="none")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seeds", default="0", help="comma-separated; a label only: the noise is secret")
    args = parser.parse_args()
    dataset = load_dataset(args.dataset)
    backbone = build_classifier("scatter-linear", dataset.input_shape, dataset.num_classes).backbone
    device = torch.device("cpu")
    names = args.views.split(",")
    train = torch.stack([frozen_features(backbone, VIEWS[name](dataset.x_train), device, True) for name in names], 1)
    test = frozen_features(backbone, dataset.x_test, device, True)
    channels = backbone[0][1].num_channels
    train, test = standardised(train.flatten(2), test.flatten(1), args.standardise, channels)
    config = with_public_size(PrivateTrainingConfig(dataset=args.dataset, epsilon=args.epsilon,
                                                    student_arch="scatter-linear"), dataset)
    plan = plan_private_training(config, public_train_size(config, dataset))
    config = config.fitted(plan.size)
    for seed in args.seeds.split(","):
        started = time.perf_counter()
        weight, bias = train_once(train, dataset.y_train, config, plan.noise_multiplier, plan.sample_rate, plan.steps)
        accuracy = ((test @ weight.T + bias).argmax(1) == dataset.y_test).float().mean().item()
        print(json.dumps({"dataset": args.dataset, "views": args.views, "standardise": args.standardise,
                          "epsilon": args.epsilon, "run": seed, "noise_multiplier": round(plan.noise_multiplier, 3),
                          "steps": plan.steps, "test_accuracy": round(100 * accuracy, 2),
                          "seconds": round(time.perf_counter() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
