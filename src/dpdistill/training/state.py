"""Save and restore a run's full training state without pickle: tensors in safetensors, the rest in JSON.

Nested state (model and optimizer state dicts, RNG states, counters) is flattened: every tensor goes into one
safetensors file under a path-like name, and a JSON skeleton records where it was. Dict keys keep their type
(optimizer state is keyed by integers), so the restored structure is exactly the saved one. The same two parts, in
memory, carry a state from one process of a run to the others (training/distributed.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load, load_file, save, save_file

from dpdistill.atomic import write_atomically
from dpdistill.errors import CheckpointError

STATE_TENSORS = "state.safetensors"
STATE_SKELETON = "state.json"
CHECKPOINT_SECONDS = 30.0  # at most between two checkpoints of a resumable loop: an interrupt loses under a minute
SAVE_SHARE = 0.1  # at most this share of a run's time goes to saving: a large state (DataLens' 2 GB of teachers)
# is saved less often than every CHECKPOINT_SECONDS


class Checkpoints:
    """When a resumable loop saves its state: after every `every` steps where a run sets a count, and whenever
    CHECKPOINT_SECONDS have passed since the last save, so that an interrupt loses under a minute of work however
    long a step takes on the machine at hand (a step count alone cannot promise that). A state that takes long to
    write waits for its save to cost at most SAVE_SHARE of the time."""

    def __init__(self, every: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.clock = every, clock
        self.last, self.cost = clock(), 0.0  # when the last save ended, and how long it took

    def __call__(self, step: int, save: Callable[[], None], final: bool = False) -> None:
        """`save()` after `step` (counted from 1) where it is due, or where the loop's last step (`final`) leaves
        a long phase after it that a resumed run should not redo the loop for."""
        waited = self.clock() - self.last
        if final or (self.every is not None and step % self.every == 0) or \
                waited >= max(CHECKPOINT_SECONDS, self.cost / SAVE_SHARE):
            began = self.clock()
            save()
            self.last = self.clock()
            self.cost = self.last - began


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
