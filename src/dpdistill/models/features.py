"""Outputs of frozen layers on a data set: a pretrained encoder's features, or a fixed transform's (scattering)
coefficients, which private training and heads-only ensembles learn on instead of the images."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from dpdistill.atomic import write_atomically
from dpdistill.paths import features_home
from dpdistill.progress import Progress


@torch.inference_mode()
def in_batches(model: nn.Module, compute: Callable[[Tensor], Tensor], images: Tensor, batch_size: int,
               device: str | torch.device, progress: Progress | None = None) -> Tensor:
    """`compute` on each batch of `images`, in eval mode (the model's mode is restored afterwards), on the CPU;
    `progress` gets the images done (a feature pass over 60,000 images takes minutes on a CPU)."""
    was_training = model.training
    model.eval()
    outputs = []
    for start in range(0, len(images), batch_size):
        outputs.append(compute(images[start:start + batch_size].to(device)).cpu())
        if progress:
            progress({"phase": FEATURES_PHASE, "done": start + len(outputs[-1]), "total": len(images)})
    model.train(was_training)
    return torch.cat(outputs)


def outputs(module: nn.Module, images: Tensor, batch_size: int = 1024, device: str | torch.device = "cpu",
            progress: Progress | None = None) -> Tensor:
    """module(images), computed in eval mode in batches: a frozen encoder's or a fixed transform's outputs."""
    return in_batches(module, module, images, batch_size, device, progress)


FEATURES_PHASE = "features"
CACHE_LIMIT_GB = 4.0  # on disk: about six Fashion-MNIST scattering passes (train and test)
FIXED_FEATURES_CACHE_SIZE = 4  # in memory: train and test features of the last two (transform, images) pairs
_fixed_features: dict[str, Tensor] = {}  # insertion order: oldest first


def frozen_features(frozen: nn.Module, images: Tensor, device: torch.device, fixed: bool,
                    progress: Progress | None = None) -> Tensor:
    """The frozen layers' outputs of `images` (an encoder's features, or a fixed transform's coefficients).

    A fixed transform (no parameters, no state) gives the same outputs in every run, so they are computed once per
    data set: kept in memory and on disk under features_home() (owner-only, like the data they come from), keyed
    by the transform and a digest of the images. Other epsilons, seeds and routes then skip the transform."""
    if not fixed:
        return outputs(frozen, images, device=device, progress=progress)
    images = images.contiguous()
    key = hashlib.blake2b(repr(frozen).encode() + str(tuple(images.shape)).encode() + images.numpy().tobytes(),
                          digest_size=16).hexdigest()
    if key not in _fixed_features:
        while len(_fixed_features) >= FIXED_FEATURES_CACHE_SIZE:
            del _fixed_features[next(iter(_fixed_features))]
        _fixed_features[key] = _stored_features(
            key, lambda: outputs(frozen, images, batch_size=256, device=device, progress=progress), progress)
    return _fixed_features[key]


def _stored_features(key: str, compute: Callable[[], Tensor], progress: Progress | None) -> Tensor:
    """The features stored under `key`, computed and stored (mode 0600) on first use, the cache then kept under
    its limit and its size announced; an unreadable file is recomputed."""
    path = features_home() / f"{key}.safetensors"
    with contextlib.suppress(OSError, SafetensorError, KeyError):
        features = load_file(path)["features"]
        path.touch()  # recently used: the last to go when the cache is trimmed
        return features
    computed = compute()
    with contextlib.suppress(OSError):  # a read-only home only costs the next run the transform again
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomically({path: lambda target: _save_private(computed, target)})
        removed = trim_cache(keep=path)
        if progress:
            held = cache_size()
            progress({"phase": FEATURES_PHASE, "cached": f"{path.stat().st_size / 1e6:.0f} MB kept in {path.parent} "
                      f"({held / 1e9:.2f} GB in all{f', {removed} older removed' if removed else ''}; `dpdistill "
                      f"cache --clear` empties it)"})
    return computed


def cached_files() -> list[Path]:
    """The stored features, least recently used first."""
    folder = features_home()
    files = list(folder.glob("*.safetensors")) if folder.is_dir() else []
    return sorted(files, key=lambda path: path.stat().st_mtime)


def cache_size() -> int:
    return sum(path.stat().st_size for path in cached_files())


def cache_limit() -> int:
    """Bytes the feature cache may hold: $DPDISTILL_CACHE_LIMIT_GB, by default CACHE_LIMIT_GB."""
    return int(float(os.environ.get("DPDISTILL_CACHE_LIMIT_GB") or CACHE_LIMIT_GB) * 1e9)


def trim_cache(keep: Path | None = None) -> int:
    """Remove the least recently used features until the cache fits its limit (never `keep`); how many went."""
    removed, files = 0, cached_files()
    total = sum(path.stat().st_size for path in files)
    for path in files:
        if total <= cache_limit():
            break
        if path != keep:
            total -= path.stat().st_size
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _save_private(features: Tensor, path: Path) -> None:
    save_file({"features": features.contiguous()}, path)
    path.chmod(0o600)
