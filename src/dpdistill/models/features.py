"""Outputs of frozen layers on a data set: a pretrained encoder's features, or a fixed transform's (scattering)
coefficients, which private training and heads-only ensembles learn on instead of the images."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import torch
from torch import Tensor, nn

from dpdistill.atomic import write_atomically
from dpdistill.paths import features_home
from dpdistill.progress import Progress


@torch.inference_mode()
def batches(model: nn.Module, compute: Callable[[Tensor], Tensor], images: Tensor, batch_size: int,
            device: str | torch.device, progress: Progress | None = None) -> Iterator[Tensor]:
    """`compute` on each batch of `images`, in eval mode (the model's mode is restored afterwards), each output on
    the CPU; `progress` gets the images done (a feature pass over 60,000 images takes minutes on a CPU)."""
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(images), batch_size):
            output = compute(images[start:start + batch_size].to(device)).cpu()
            if progress:
                progress({"phase": FEATURES_PHASE, "done": start + len(output), "total": len(images)})
            yield output
    finally:
        model.train(was_training)


def in_batches(model: nn.Module, compute: Callable[[Tensor], Tensor], images: Tensor, batch_size: int,
               device: str | torch.device, progress: Progress | None = None) -> Tensor:
    """`batches` joined in memory."""
    return joined(batches(model, compute, images, batch_size, device, progress), len(images))


def joined(parts: Iterable[Tensor], count: int) -> Tensor:
    """Consecutive batches' outputs, `count` rows in all, written into one tensor allocated at the first. Small
    outputs kept in a list between each batch's large temporaries pin the C library's heap (it can hand back no
    memory below a live block): a scattering pass over 60,000 images then grew the process by 3.5 GB instead of 0.2."""
    result, done = None, 0
    for part in parts:
        if result is None:
            result = part.new_empty((count, *part.shape[1:]))
        result[done:done + len(part)] = part
        done += len(part)
    if result is None:
        raise ValueError("no batches to join")
    return result


def outputs(module: nn.Module, images: Tensor, batch_size: int = 1024, device: str | torch.device = "cpu",
            progress: Progress | None = None) -> Tensor:
    """module(images), computed in eval mode in batches: a frozen encoder's or a fixed transform's outputs."""
    return in_batches(module, module, images, batch_size, device, progress)


FEATURES_PHASE = "features"
CACHE_LIMIT_GB = 4.0  # on disk: about six Fashion-MNIST scattering passes (train and test)
# images a batch of a fixed transform's pass: on a CPU few, so that a batch's spectra stay in its caches (the
# scattering of Fashion-MNIST ran 2.5 times faster in batches of 32 than of 256, on 2 cores); on a GPU many
FEATURE_BATCH = {"cpu": 32, "cuda": 1024}
FIXED_FEATURES_CACHE_SIZE = 4  # in memory: train and test features of the last two (transform, images) pairs
_fixed_features: dict[str, Tensor] = {}  # insertion order: oldest first


def frozen_features(frozen: nn.Module, images: Tensor, device: torch.device, fixed: bool,
                    progress: Progress | None = None) -> Tensor:
    """The frozen layers' outputs of `images` (an encoder's features, or a fixed transform's coefficients).

    A fixed transform (no parameters, no state) gives the same outputs in every run, so they are computed once per
    data set: stored under features_home() (owner-only, like the data they come from), keyed by the transform and
    a digest of the images, and read back memory-mapped, so a data set whose coefficients outgrow the memory still
    trains (200,000 RGB 32x32 images: 12 GB). Other epsilons, seeds and routes then skip the transform."""
    if not fixed:
        return outputs(frozen, images, device=device, progress=progress)
    images = images.contiguous()
    digest = hashlib.blake2b(repr(frozen).encode() + str(tuple(images.shape)).encode(), digest_size=16)
    digest.update(memoryview(images.numpy()))  # no copy of the images
    key = digest.hexdigest()
    if key not in _fixed_features:
        while len(_fixed_features) >= FIXED_FEATURES_CACHE_SIZE:
            del _fixed_features[next(iter(_fixed_features))]
        _fixed_features[key] = _stored_features(key, frozen, images, device, progress)
    return _fixed_features[key]


def _stored_features(key: str, frozen: nn.Module, images: Tensor, device: torch.device,
                     progress: Progress | None) -> Tensor:
    """The features stored under `key`, memory-mapped; computed batch by batch into the file (mode 0600) on first
    use, the cache then kept under its limit and its size announced. An unreadable file is computed again; a home
    that cannot be written keeps them in memory instead."""
    path = features_home() / f"{key}.npy"
    with contextlib.suppress(OSError, ValueError):
        features = _mapped(path, len(images))
        path.touch()  # recently used: the last to go when the cache is trimmed
        return features
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomically({path: lambda target: _write_features(frozen, images, device, target, progress)})
    except OSError:  # a read-only home only costs the next run the transform again
        return outputs(frozen, images, batch_size=feature_batch(device), device=device, progress=progress)
    removed = trim_cache(keep=path)
    if progress:
        progress({"phase": FEATURES_PHASE, "cached": f"{path.stat().st_size / 1e6:.0f} MB kept in {path.parent} "
                  f"({cache_size() / 1e9:.2f} GB in all{f', {removed} older removed' if removed else ''}; `dpdistill "
                  f"cache --clear` empties it)"})
    return _mapped(path, len(images))


def _write_features(frozen: nn.Module, images: Tensor, device: torch.device, target: Path,
                    progress: Progress | None) -> None:
    """The transform's outputs written into a .npy file batch by batch: never all of them in memory at once."""
    stored, start = None, 0
    target.touch(mode=0o600)
    target.chmod(0o600)  # private before any coefficient is written
    for output in batches(frozen, frozen, images, feature_batch(device), device, progress):
        if stored is None:
            stored = np.lib.format.open_memmap(target, mode="w+", dtype=np.float32,
                                               shape=(len(images), *output.shape[1:]))
        stored[start:start + len(output)] = output.numpy()
        start += len(output)
    if stored is not None:
        stored.flush()


def feature_batch(device: str | torch.device) -> int:
    """How many images a batch of a fixed transform's pass takes on `device`."""
    return FEATURE_BATCH["cuda" if torch.device(device).type == "cuda" else "cpu"]


def _mapped(path: Path, count: int) -> Tensor:
    """Stored features, memory-mapped copy-on-write (a change stays in the process, never reaches the file);
    a file that is not count float32 rows raises ValueError."""
    features = np.load(path, mmap_mode="c", allow_pickle=False)
    if (features.dtype != np.float32 or features.ndim < 2 or len(features) != count
            or path.stat().st_size != features.offset + features.nbytes):  # truncated: a page maps past its end
        raise ValueError(f"{path}: not {count} float32 rows")
    return torch.from_numpy(features)


def cached_files() -> list[Path]:
    """The stored features, least recently used first; files of the earlier format (.safetensors, read whole)
    are never read again but still counted, trimmed and cleared."""
    folder = features_home()
    files = [*folder.glob("*.npy"), *folder.glob("*.safetensors")] if folder.is_dir() else []
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
