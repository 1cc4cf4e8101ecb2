"""The server's side (Flower ServerApp): send each round's queries to the owners and receive only their sum.
PATE's rounds are run here; FedDPSD's are the DPSD engine's queries (federated/transcription.py).

Each round runs Flower's SecAgg+ workflow on a one-round strategy: the owners' noisy integer answers are masked,
summed and unmasked only if at least the threshold's owners (owners - dropouts) contributed, so the server never
sees one owner's answer, nor a sum carrying less noise than the accounting charged (on a sparse key-sharing graph,
except with the probability federated/graph.py bounds and the accounting adds to delta). Every released sum is kept in
the round journal before the next round starts; a restarted server continues after the last kept round. A round
that cannot be completed stops the run cleanly: the failure is recorded, nothing of that round is released.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
import flwr.compat.common.recorddict_compat as compat
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.common import FitIns, GetPropertiesIns, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.constant import MessageTypeLegacy
from flwr.server import LegacyContext
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
from flwr.serverapp import Grid, ServerApp
from safetensors.torch import load_file, save_file
from torch import Tensor

from dpdistill.atomic import write_atomically
from dpdistill.federated.graph import SecAggGraph, full_graph
from dpdistill.federated.protocol import Encoding, Wire

PLAN = "plan"  # run config key: the federation plan's path (deployment)
FAILURE_FILE = "failure.json"
ENDED_FILE = "ended"  # the ServerApp returned (its status then comes from Flower)
OWNER_WAIT_SECONDS = 300.0


@dataclass(frozen=True)
class FederationPlan:
    """What the server runs: the wire every owner answers by, the owners and threshold, the queries, the journal."""

    wire: Wire
    owners: int
    dropouts: int
    journal_dir: str
    stage_timeout: float | None  # None: wait for every owner's reply (a simulation)
    method: str = "pate"
    members: int = 1  # each owner's
    colluders: int = 0  # owners whose shares an adversary may know: the noise was sized for the rest
    owner_wait: float = OWNER_WAIT_SECONDS  # how long the first roll call waits for every owner to join
    # PATE
    round_queries: int = 0
    queries_file: str = ""  # safetensors with "images": the public (or covered synthetic) images asked about
    # FedDPSD
    transcription: dict[str, Any] | None = None  # the engine's TranscriptionConfig
    dataset: str = ""  # the student's accuracy is measured on its test split
    work_dir: str = ""  # the engine's checkpoints, answer journal and finished result

    def save(self, path: Path) -> None:
        payload = {**asdict(self), "wire": self.wire.to_json()}
        write_atomically({path: lambda temporary: temporary.write_text(json.dumps(payload, indent=2))})

    @classmethod
    def load(cls, path: Path) -> "FederationPlan":
        data = json.loads(path.read_text())
        return cls(**{**data, "wire": Wire.from_json(data["wire"])})

    def rounds(self, rows: int) -> list[slice]:
        return [slice(start, min(start + self.round_queries, rows)) for start in range(0, rows, self.round_queries)]


class RoundJournal:
    """The released sums, one file per round, written before the next round is asked."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, index: int) -> Path:
        return self.directory / f"round-{index:04d}.safetensors"

    def write(self, index: int, total: Tensor, contributors: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tensors = {"sum": total.contiguous(), "contributors": torch.tensor([contributors])}
        write_atomically({self.path(index): lambda temporary: save_file(tensors, temporary)})

    def lose(self, index: int) -> None:
        """The round was asked but not completed: spent, never answered again."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path(index).with_suffix(".lost").touch()

    def lost(self, index: int) -> bool:
        return self.path(index).with_suffix(".lost").exists()

    def done(self, index: int) -> bool:
        return self.path(index).exists() or self.lost(index)

    def read(self, index: int) -> tuple[Tensor, int] | None:
        if not self.path(index).exists():
            return None
        tensors = load_file(self.path(index))
        return tensors["sum"], int(tensors["contributors"][0])

    def fail(self, index: int, reason: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"round": index, "reason": reason})
        write_atomically({self.directory / FAILURE_FILE: lambda temporary: temporary.write_text(text)})

    def failure(self) -> dict[str, Any] | None:
        path = self.directory / FAILURE_FILE
        return json.loads(path.read_text()) if path.exists() else None

    def clear_failure(self) -> None:
        (self.directory / FAILURE_FILE).unlink(missing_ok=True)

    def end(self) -> None:
        """The ServerApp is returning: a deployment waiting on the run reads this file every fraction of a second
        and asks Flower for the run's status only then (each `flwr ls` is a process and over a second of CPU)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / ENDED_FILE).touch()

    def ended(self) -> bool:
        return (self.directory / ENDED_FILE).exists()

    def clear_end(self) -> None:
        (self.directory / ENDED_FILE).unlink(missing_ok=True)


class PromptGrid(Grid):
    """The ServerApp's grid, collecting the owners' replies every tenth of a second as Flower's simulation grid does:
    Flower's deployed grid checks every 3 s, so each of a round's five stages (the roll call and SecAgg+'s four)
    waited up to 3 s after its last reply."""

    PULL_SECONDS = 0.1

    def __init__(self, grid: Grid) -> None:
        self.grid = grid

    def set_run(self, run: Any) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Any:
        return self.grid.run

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def get_nodes(self) -> Iterable[Any]:
        return self.grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        waiting = set(self.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while waiting and (deadline is None or time.monotonic() < deadline):
            pulled = list(self.pull_messages(waiting))
            replies += pulled
            waiting -= {reply.metadata.reply_to_message_id for reply in pulled}
            if waiting:
                time.sleep(self.PULL_SECONDS)
        return replies


class _OneRound(Strategy):
    """A strategy for exactly one SecAgg+ round: every owner gets the same query; the sum is kept."""

    def __init__(self, proxies: list[GridClientProxy], query: FitIns) -> None:
        self.proxies, self.query = proxies, query
        self.mean: np.ndarray | None = None
        self.contributors = 0

    def initialize_parameters(self, client_manager: Any) -> None:
        return None

    def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> list:
        return [(proxy, self.query) for proxy in self.proxies]

    def aggregate_fit(self, server_round: int, results: list, failures: list) -> tuple[None, dict]:
        if results:  # SecAgg+ hands every result the same unmasked mean
            self.mean = parameters_to_ndarrays(results[0][1].parameters)[0]
            self.contributors = len(results)
        return None, {}

    def configure_evaluate(self, server_round: int, parameters: Any, client_manager: Any) -> list:
        return []

    def aggregate_evaluate(self, server_round: int, results: list, failures: list) -> tuple[None, dict]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Any) -> None:
        return None


LOST = "lost"  # a round that reached SecAgg+'s unmasking and failed there


def round_graph(plan: FederationPlan) -> SecAggGraph:
    """The key-sharing graph the run's terms name (the full graph for a plan without terms)."""
    terms = plan.wire.terms
    return full_graph(plan.owners, plan.dropouts) if terms is None else terms.graph()


def secagg_workflow(plan: FederationPlan, encoding: Encoding) -> SecAggPlusWorkflow:
    """SecAgg+ on the run's graph (federated/graph.py). Its threshold is an integer: Flower reads a float as a
    fraction of the owners present at that round's roll call, so with owners missing the full graph would unmask
    fewer contributors' sum than the noise was sized for."""
    shares, threshold = round_graph(plan).workflow_settings()
    return SecAggPlusWorkflow(num_shares=shares, reconstruction_threshold=threshold, max_weight=1.0,
                              clipping_range=float(encoding.clipping_range),
                              quantization_range=encoding.quantization_range, timeout=plan.stage_timeout)


def secure_sum(grid: Grid, context: Context, nodes: list[int], arrays: list[np.ndarray], plan: FederationPlan,
               index: int) -> tuple[Tensor, int] | str | None:
    """The owners' summed noisy answers to `arrays` and how many owners contributed; None when fewer than
    owners - dropouts completed the masked upload (stopped before unmasking: nothing is revealed); LOST when
    unmasking itself failed (the server then holds key shares that could unmask the completed owners' sum)."""
    encoding = Encoding(plan.wire.clipping_range)
    query = FitIns(ndarrays_to_parameters(arrays), {"wire": json.dumps(plan.wire.to_json())})
    strategy = _OneRound([GridClientProxy(node, grid, context.run_id) for node in nodes], query)
    legacy = LegacyContext(context, strategy=strategy)
    legacy.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({Key.CURRENT_ROUND: index + 1})
    legacy.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
    threshold = plan.owners - plan.dropouts
    workflow = secagg_workflow(plan, encoding)
    state = WorkflowState()  # the workflow's own stages, one by one: where it stops decides what was revealed
    for stage in (workflow.setup_stage, workflow.share_keys_stage, workflow.collect_masked_vectors_stage):
        if not stage(grid, legacy, state):
            return None
    if len(state.active_node_ids) < threshold:  # a sparse graph's own threshold counts neighbours, not owners
        return None
    if not workflow.unmask_stage(grid, legacy, state) or strategy.mean is None or strategy.contributors < threshold:
        return LOST
    return Encoding.decode_sum(strategy.mean, strategy.contributors), strategy.contributors


def owner_names(grid: Grid, nodes: list[int], timeout: float | None) -> dict[int, str]:
    """Each answering node's owner name, asked of all nodes at once; a node silent for `timeout` is left out."""
    content = compat.getpropertiesins_to_recorddict(GetPropertiesIns({}))
    messages = [Message(content=content, message_type=MessageTypeLegacy.GET_PROPERTIES, dst_node_id=node)
                for node in nodes]
    names = {}
    for reply in grid.send_and_receive(messages, timeout=timeout):
        if not reply.has_error():
            names[reply.metadata.src_node_id] = str(
                compat.recorddict_to_getpropertiesres(reply.content).properties.get("owner"))
    return names


def owner_nodes(grid: Grid, owners: int, timeout: float | None, wait: float = OWNER_WAIT_SECONDS) -> list[int]:
    """The nodes of the `owners` owners, once all have joined; refused if two nodes speak for one owner."""
    deadline = time.monotonic() + wait
    nodes = sorted(grid.get_node_ids())
    while len(nodes) < owners:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(nodes)} of {owners} data owners joined within {wait:.0f} s")
        time.sleep(1.0)
        nodes = sorted(grid.get_node_ids())
    names = owner_names(grid, nodes, timeout)
    if len(set(names.values())) != len(nodes) or len(nodes) != owners:
        raise RuntimeError(f"the federation expects {owners} distinct data owners; its nodes name "
                           f"{sorted(names.values())}")
    return nodes


class FederationStopped(Exception):
    """A round could not be completed before unmasking (or no federation formed): nothing of it was revealed, the
    run stops; `index` is the round's (-1: before the first)."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index, self.reason = index, reason


class Rounds:
    """A run's secure-aggregation rounds, each journaled before the next is asked (PATE's and FedDPSD's alike).

    Each round is asked of the owners that answered the last roll call: the one that formed the federation for the
    first round asked, one just before it for each later round (a roll call is a message to every owner and back,
    seconds on a deployment). Fewer owners than the threshold at a roll call, or in a round's masked upload, stop
    the run (`FederationStopped`): nothing of that round was revealed. A round whose unmasking fails (an owner lost
    in SecAgg+'s last stage, or one that never exchanged keys) is journaled as lost: a curious server could still
    unmask the sum of the owners that completed it, at least the threshold's noise shares, so it counts as spent and
    is never asked again. A round already in the journal (a restarted server) is read back, never asked twice."""

    def __init__(self, grid: Grid, context: Context, plan: FederationPlan, journal: RoundJournal) -> None:
        self.grid, self.context, self.plan, self.journal = grid, context, plan, journal
        self.threshold = plan.owners - plan.dropouts
        try:
            self.nodes = owner_nodes(grid, plan.owners, plan.stage_timeout, plan.owner_wait)
        except RuntimeError as error:
            raise FederationStopped(-1, str(error)) from error
        self.called = True  # owner_nodes' roll call stands for the first round asked

    def ask(self, index: int, arrays: list[np.ndarray]) -> tuple[Tensor, int] | None:
        """Round `index`'s released sum and its contributors; None for a lost round."""
        if self.journal.done(index):
            return self.journal.read(index)
        plan = self.plan
        if not self.called:
            self.nodes = sorted(owner_names(self.grid, self.nodes, plan.stage_timeout))
        self.called = False
        if len(self.nodes) < self.threshold:
            raise FederationStopped(index, f"{len(self.nodes)} of {plan.owners} data owners answered the roll call; "
                                           f"the noise shares were sized for at least {self.threshold}")
        result = secure_sum(self.grid, self.context, self.nodes, arrays, plan, index)
        if result is None:
            raise FederationStopped(index, f"fewer than {self.threshold} of {plan.owners} data owners completed the "
                                           f"round's masked upload (nothing of it was revealed)")
        if result == LOST:
            self.journal.lose(index)
            return None
        self.journal.write(index, *result)
        return result


def run_rounds(rounds: Rounds) -> None:
    """PATE: ask every round of the plan's public queries."""
    images = load_file(rounds.plan.queries_file)["images"]
    for index, rows in enumerate(rounds.plan.rounds(len(images))):
        rounds.ask(index, [images[rows].numpy()])


def make_server_app(plan_path: Path | None = None) -> ServerApp:
    """The ServerApp; `plan_path` for a simulation (a deployed run names its plan in the run config)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        plan = FederationPlan.load(plan_path or Path(str(context.run_config[PLAN])))
        journal = RoundJournal(Path(plan.journal_dir))
        journal.clear_failure()
        try:
            rounds = Rounds(PromptGrid(grid), context, plan, journal)
            if plan.method == "dpsd":
                from dpdistill.federated.transcription import run_transcription

                run_transcription(rounds)
            else:
                run_rounds(rounds)
        except FederationStopped as stop:
            journal.fail(stop.index, stop.reason)
        finally:
            journal.end()

    return app


app = make_server_app()
