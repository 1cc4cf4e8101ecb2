"""The data owner's side (Flower ClientApp): answer each round's queries from the owner's own teachers, through
the boundary check and the owner's noise share, into secure aggregation (`secaggplus_mod`: the answer leaves the
owner only masked; the server learns the sum of at least the threshold's owners).

An owner is found by its node's `owner-dir` (each SuperNode started with `--node-config "owner-dir=..."`), or in a
simulation by its partition id among the run's owner directories; it states its epsilon at its node's `owner-delta`
(`federated owner --delta`), in a simulation at the delta its caller set for the simulated owners. torch is imported
only when a round asks for an answer: SecAgg+'s key-exchange stages run without it (a deployed SuperNode starts a
process per message).
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.app import Context, RecordDict
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE

from dpdistill.defaults import FEDERATED_DELTA

if TYPE_CHECKING:
    from dpdistill.federated.protocol import SecAggSettings

OWNER_DIR = "owner-dir"
OWNER_DELTA = "owner-delta"
OWNER_ID_FILE = "owner-id"
_teachers: dict[str, tuple[Any, dict[str, Any]]] = {}  # an owner's teacher and its description, loaded once a process


class OwnerClient(NumPyClient):
    """One data owner: its teachers answer; the protocol bounds, rounds and noises the answer."""

    def __init__(self, owner_dir: Path, delta: float, node_state: RecordDict) -> None:
        """`node_state`: the node's state, where `secaggplus_mod` keeps the settings of the round it runs."""
        self.owner_dir, self.delta, self.node_state = owner_dir, delta, node_state

    def get_properties(self, config: dict[str, Any]) -> dict[str, Any]:
        """The owner's identity, so the server can refuse two nodes that speak for one owner."""
        return {"owner": owner_identity(self.owner_dir)}

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict]:
        from dpdistill.federated.answers import owner_answer, owner_of

        teacher, meta = self._teacher()
        return [owner_answer(self.owner_dir, teacher, owner_of(teacher, meta, self.delta),
                             secagg_settings(self.node_state), parameters, json.loads(str(config["wire"])))], 1, {}

    def _teacher(self) -> tuple[Any, dict[str, Any]]:
        """The owner's teachers and their saved description."""
        key = str(self.owner_dir.resolve())
        if key not in _teachers:
            from dpdistill.methods.teachers import read_teacher

            teacher, meta = read_teacher(self.owner_dir)
            _teachers[key] = teacher.eval(), meta
        return _teachers[key]


def owner_identity(owner_dir: Path) -> str:
    """A random name kept in the owner's directory (drawn by whichever node reads it first): two nodes on one
    owner's data name the same owner, and the name says nothing about the data."""
    path = owner_dir / OWNER_ID_FILE
    try:
        with open(path, "x") as created:
            created.write(secrets.token_hex(16))
    except FileExistsError:
        pass
    for _ in range(100):  # a node that lost the race to create it may find it still empty for a moment
        name = path.read_text().strip()
        if name:
            return name
        time.sleep(0.01)
    raise ValueError(f"{path} holds no owner name")


def owner_dir_of(context: Context, owner_dirs: list[str] | None) -> Path:
    """This node's owner directory: its own node config, or its partition id among `owner_dirs`."""
    if OWNER_DIR in context.node_config:
        return Path(str(context.node_config[OWNER_DIR]))
    if owner_dirs is None:
        raise ValueError(f'this SuperNode names no data owner: start it with --node-config "{OWNER_DIR}=DIR"')
    return Path(owner_dirs[int(context.node_config["partition-id"])])


def owner_client(context: Context, owner_dirs: list[str] | None, delta: float) -> OwnerClient:
    """This node's owner (`owner_dir_of`), at its node's `owner-delta`, else at `delta`."""
    return OwnerClient(owner_dir_of(context, owner_dirs), float(str(context.node_config.get(OWNER_DELTA, delta))),
                       context.state)


def secagg_settings(node_state: RecordDict) -> SecAggSettings | None:
    """The settings SecAgg+ took at this round's setup, as `secaggplus_mod` keeps them in the node's state; None
    where no secure aggregation runs."""
    from dpdistill.federated.protocol import SecAggSettings

    if RECORD_KEY_STATE not in node_state.config_records:
        return None
    state = node_state.config_records[RECORD_KEY_STATE]
    return SecAggSettings(int(state["sample_num"]), int(state["share_num"]), int(state["threshold"]),
                          float(state["clipping_range"]), int(state["target_range"]), float(state["max_weight"]))


def make_client_app(owner_dirs: list[str] | None = None, delta: float = FEDERATED_DELTA) -> ClientApp:
    """The ClientApp; `owner_dirs` names the owners of a simulation and `delta` theirs (deployed nodes name their
    own)."""

    def client_fn(context: Context):
        return owner_client(context, owner_dirs, delta).to_client()

    return ClientApp(client_fn=client_fn, mods=[secaggplus_mod])


app = make_client_app()
