"""Save and restore a run's full training state without pickle: tensors in safetensors, the rest in JSON.

Nested state (model and optimizer state dicts, RNG states, counters) is flattened: every tensor goes into one
safetensors file under a path-like name, and a JSON skeleton records where it was. Dict keys keep their type
(optimizer state is keyed by integers), so the restored structure is exactly the saved one. The same two parts, in
memory, carry a state from one process of a run to the others (training/distributed.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, load_file, save, save_file

from dpdistill.atomic import write_atomically
from dpdistill.errors import CheckpointError

STATE_TENSORS = "state.safetensors"
STATE_SKELETON = "state.json"


def _flatten(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().cpu().contiguous()
        return {"__tensor__": path}
    if isinstance(value, dict):
        return {"__dict__": [[key, _flatten(item, f"{path}.{key}", tensors)] for key, item in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"__list__": [_flatten(item, f"{path}.{i}", tensors) for i, item in enumerate(value)]}
    return value


def _unflatten(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            return tensors[skeleton["__tensor__"]]
        if "__dict__" in skeleton:
            return {key: _unflatten(item, tensors) for key, item in skeleton["__dict__"]}
        if "__list__" in skeleton:
            return [_unflatten(item, tensors) for item in skeleton["__list__"]]
    return skeleton


def encode_state(state: dict[str, Any]) -> tuple[str, bytes]:
    """`state` as its JSON skeleton and its tensors in safetensors' format."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _flatten(state, "state", tensors)
    return json.dumps(skeleton), save(tensors)


def decode_state(skeleton: str, tensors: bytes) -> dict[str, Any]:
    """The state `encode_state` encoded."""
    return _unflatten(json.loads(skeleton), load(tensors))


def save_state(directory: Path, state: dict[str, Any]) -> None:
    """Write `state` atomically: a crash mid-save leaves the previous state intact."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _flatten(state, "state", tensors)
    write_atomically({directory / STATE_TENSORS: lambda path: save_file(tensors, path),
                      directory / STATE_SKELETON: lambda path: path.write_text(json.dumps(skeleton))})


def load_state(directory: Path) -> dict[str, Any]:
    """Read a state written by `save_state`; a damaged one is a CheckpointError, never a crash."""
    try:
        tensors = load_file(directory / STATE_TENSORS)
        skeleton = json.loads((directory / STATE_SKELETON).read_text())
        return _unflatten(skeleton, tensors)
    except FileNotFoundError as error:
        raise CheckpointError(f"no resumable state in {directory}: {error.filename} is missing") from error
    except (SafetensorError, json.JSONDecodeError, KeyError, OSError) as error:
        raise CheckpointError(f"the resumable state in {directory} is damaged ({error}); start a new run") from error
