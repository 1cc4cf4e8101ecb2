"""The peer of `dpdistill train-private` (scatter-linear, its defaults): the same run written as a plain script from
the documented APIs of Opacus 1.6 and kymatio 0.3, with nothing of dpdistill, so that anyone can time the two side
by side.

    pip install kymatio==0.3.0          # (or `pip install -e '.[bench]'`)
    python benchmarks/experiments/plain_opacus_scatter.py --epsilon 1 [--seed 0] [--idx-dir DIR]

What it does, as Tramer & Boneh (2021) describe ScatterNet + linear: kymatio's Scattering2D (J = 2, L = 8) on
Fashion-MNIST's images in [0, 1], computed once for the training and test images; per-example GroupNorm of the 81
coefficient channels in 27 groups (no learnt scale); one linear layer trained by Opacus' PrivacyEngine
(make_private_with_epsilon: Poisson sampling, clipping 0.1, noise calibrated to epsilon at delta 1e-5 by its PRV
accountant) with SGD, momentum 0.9, batch 8,192 (expected), learning rate 8, 40 epochs: dpdistill's defaults.
Its noise is Opacus' default (torch's generator, not secure mode, which needs torchcsprng): a plain script's cost.

Prints one JSON line: test accuracy, epsilon, and the seconds of each part (features, training, whole).
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

IDX_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist


def read_idx(path: Path) -> np.ndarray:
    """A gzipped IDX file as a numpy array (its 4-byte magic, its big-endian sizes, then the bytes)."""
    with gzip.open(path, "rb") as handle:
        data = handle.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape).copy()


def scattering_features(images: np.ndarray, batch: int = 2000) -> torch.Tensor:
    """kymatio's Scattering2D coefficients of uint8 images (N, 28, 28), flattened after a per-example GroupNorm."""
    from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D  # the top-level import needs an
    # older scipy (it imports scipy.special.sph_harm); the 2-D frontend does not

    scattering = ScatteringTorch2D(J=2, shape=(28, 28), L=8)
    norm = nn.GroupNorm(27, 81, affine=False)
    parts = []
    with torch.no_grad():
        for start in range(0, len(images), batch):
            x = torch.from_numpy(images[start:start + batch]).float() / 255.0
            coefficients = scattering(x)  # (n, 81, 7, 7)
            parts.append(norm(coefficients).flatten(1))
    return torch.cat(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--idx-dir", type=Path, default=IDX_DIR)
    options = parser.parse_args()

    from opacus import PrivacyEngine

    started = time.perf_counter()
    torch.manual_seed(options.seed)
    x_train = read_idx(options.idx_dir / "train-images-idx3-ubyte.gz")
    y_train = torch.from_numpy(read_idx(options.idx_dir / "train-labels-idx1-ubyte.gz").astype(np.int64))
    x_test = read_idx(options.idx_dir / "t10k-images-idx3-ubyte.gz")
    y_test = torch.from_numpy(read_idx(options.idx_dir / "t10k-labels-idx1-ubyte.gz").astype(np.int64))
    train_features, test_features = scattering_features(x_train), scattering_features(x_test)
    featured = time.perf_counter()

    model = nn.Linear(train_features.shape[1], 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=options.lr, momentum=0.9)
    loader = DataLoader(TensorDataset(train_features, y_train), batch_size=options.batch_size)
    engine = PrivacyEngine(accountant="prv")
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=model, optimizer=optimizer, data_loader=loader, target_epsilon=options.epsilon,
        target_delta=options.delta, epochs=options.epochs, max_grad_norm=0.1)
    loss = nn.CrossEntropyLoss()
    for _ in range(options.epochs):
        for inputs, labels in loader:
            optimizer.zero_grad()
            loss(model(inputs), labels).backward()
            optimizer.step()
    trained = time.perf_counter()
    with torch.no_grad():
        accuracy = (model(test_features).argmax(1) == y_test).float().mean().item()
    print(json.dumps({"accuracy": accuracy, "epsilon": engine.get_epsilon(options.delta),
                      "noise_multiplier": optimizer.noise_multiplier, "seed": options.seed,
                      "features_seconds": round(featured - started, 1), "training_seconds": round(trained - featured, 1),
                      "wall_seconds": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
