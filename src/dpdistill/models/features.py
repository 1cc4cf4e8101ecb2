"""Outputs of frozen layers on a data set: a pretrained encoder's features, or a fixed transform's (scattering)
coefficients, which private training and heads-only ensembles learn on instead of the images."""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from dpdistill.atomic import write_atomically
from dpdistill.paths import features_home


@torch.inference_mode()
def in_batches(model: nn.Module, compute: Callable[[Tensor], Tensor], images: Tensor, batch_size: int,
               device: str | torch.device) -> Tensor:
    """`compute` on each batch of `images`, in eval mode (the model's mode is restored afterwards), on the CPU."""
    was_training = model.training
    model.eval()
    outputs = [compute(images[i:i + batch_size].to(device)).cpu() for i in range(0, len(images), batch_size)]
    model.train(was_training)
    return torch.cat(outputs)


def outputs(module: nn.Module, images: Tensor, batch_size: int = 1024, device: str | torch.device = "cpu") -> Tensor:
    """module(images), computed in eval mode in batches: a frozen encoder's or a fixed transform's outputs."""
    return in_batches(module, module, images, batch_size, device)


FIXED_FEATURES_CACHE_SIZE = 4  # in memory: train and test features of the last two (transform, images) pairs
_fixed_features: dict[str, Tensor] = {}  # insertion order: oldest first


def frozen_features(frozen: nn.Module, images: Tensor, device: torch.device, fixed: bool) -> Tensor:
    """The frozen layers' outputs of `images` (an encoder's features, or a fixed transform's coefficients).

    A fixed transform (no parameters, no state) gives the same outputs in every run, so they are computed once per
    data set: kept in memory and on disk under features_home() (owner-only, like the data they come from), keyed
    by the transform and a digest of the images. Other epsilons, seeds and routes then skip the transform."""
    if not fixed:
        return outputs(frozen, images, device=device)
    images = images.contiguous()
    key = hashlib.blake2b(repr(frozen).encode() + str(tuple(images.shape)).encode() + images.numpy().tobytes(),
                          digest_size=16).hexdigest()
    if key not in _fixed_features:
        while len(_fixed_features) >= FIXED_FEATURES_CACHE_SIZE:
            del _fixed_features[next(iter(_fixed_features))]
        _fixed_features[key] = _stored_features(key, lambda: outputs(frozen, images, batch_size=256, device=device))
    return _fixed_features[key]


def _stored_features(key: str, compute: Callable[[], Tensor]) -> Tensor:
    """The features stored under `key`, computed and stored (mode 0600) on first use; an unreadable file is
    recomputed."""
    path = features_home() / f"{key}.safetensors"
    with contextlib.suppress(OSError, SafetensorError, KeyError):
        return load_file(path)["features"]
    computed = compute()
    with contextlib.suppress(OSError):  # a read-only home only costs the next run the transform again
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomically({path: lambda target: _save_private(computed, target)})
    return computed


def _save_private(features: Tensor, path: Path) -> None:
    save_file({"features": features.contiguous()}, path)
    path.chmod(0o600)
