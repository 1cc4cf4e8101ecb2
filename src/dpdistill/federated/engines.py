"""Three ways to run the same ServerApp and ClientApp: Flower's simulation in this process; a deployment of a
SuperLink and one SuperNode per owner as separate processes on loopback (Flower's own commands, as across hosts);
and across machines, the server's SuperLink with TLS (`serve`) that each owner's SuperNode joins (`federated/
parties.py`).

The deployment starts every process itself, checks the run's real status (`flwr run` exits 0 even when the run
failed) and stops every process it started, by PID, whatever happens.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Callable, Iterator

from dpdistill.errors import ConfigError
from dpdistill.federated.config import Certificates, host_and_port
from dpdistill.federated.client_app import OWNER_DELTA, OWNER_DIR, make_client_app
from dpdistill.federated.server_app import PLAN, FederationPlan, RoundJournal, make_server_app

APP_NAME = "dpdistill-federation"
# RAY_worker_niceness: Ray starts its workers (the simulated owners' ClientApps) at nice 15, so that beside any
# other work on the machine the owners' answers waited, the run with them (seven times as long beside two busy cores)
FLOWER_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "RAY_DEDUP_LOGS": "0",
              "RAY_USAGE_STATS_ENABLED": "0", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0", "RAY_worker_niceness": "0"}
STATUS_POLL_SECONDS = 15.0  # each poll starts a `flwr ls` process: over a second of CPU, which the owners need
ENDED_POLL_SECONDS = 0.2  # the ServerApp's "returned" file, read in between
ENDED_ASK_SECONDS = 1.0  # once it has returned, until Flower says the run finished
STOP_GRACE_SECONDS = 10.0
START_SECONDS = 120.0  # how long the SuperLink may take to listen
CONNECTION = "federation"  # the `flwr` connection dpdistill writes into its FLWR_HOME


def simulate(plan_path: Path, owner_dirs: list[Path], owner_delta: float) -> None:
    """Flower's simulation runtime (Ray): every owner a virtual SuperNode in this machine's worker processes, its
    messages delivered in one pass a tick (`delivered_in_one_pass`), each owner at `owner_delta`."""
    from flwr.simulation import run_simulation

    os.environ.update(FLOWER_ENV)
    flower = logging.getLogger("flwr")
    level = flower.level
    flower.setLevel(logging.ERROR)  # its per-stage messages (and run_simulation's deprecation) would bury progress
    try:
        with delivered_in_one_pass():
            run_simulation(make_server_app(plan_path), make_client_app([str(path) for path in owner_dirs], owner_delta),
                           num_supernodes=len(owner_dirs),
                           backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                           "init_args": {"include_dashboard": False, "log_to_driver": False}})
    finally:
        flower.setLevel(level)


@contextmanager
def delivered_in_one_pass() -> Iterator[None]:
    """Flower 1.41's simulation hands messages to its workers by asking the link state, every 0.1 s and for every
    node, for that node's next message; each ask checks every stored message (expiry, federation), so a tick costs
    nodes x messages checks and a round of a thousand owners holds the state's lock for most of its time
    (docs/methods/federated.md, "What it reaches"). Within this context the same delivery is one pass over the
    stored messages a tick: each checked once, at most one a node a tick, as Flower's own."""
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate import InMemoryLinkState
    from flwr.supercore.date import now

    flowers = vce_api.add_messages_to_queue

    def deliver(state, queue, nodes_mapping, f_stop) -> None:  # noqa: ANN001 - Flower's signature
        if not isinstance(state, InMemoryLinkState):
            return flowers(state, queue, nodes_mapping, f_stop)
        nodes = set(nodes_mapping)
        while not f_stop.is_set():
            with state.lock:
                state._check_stored_messages(set(state.message_ins_store))  # drops expired or foreign messages
                served: set[int] = set()
                for message in list(state.message_ins_store.values()):
                    node = message.metadata.dst_node_id
                    if message.metadata.delivered_at == "" and node in nodes and node not in served:
                        served.add(node)
                        message.metadata.delivered_at = now().isoformat()
                        queue.put(message)
            f_stop.wait(0.1)
        return None

    vce_api.add_messages_to_queue = deliver
    try:
        yield
    finally:
        vce_api.add_messages_to_queue = flowers


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(host: str, port: int, process: subprocess.Popen, timeout: float = START_SECONDS) -> None:
    """Until something listens on `host`:`port`; refused if `process` exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the SuperLink exited with status {process.returncode} before listening")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1" if host in ("0.0.0.0", "") else host, port)) == 0:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the SuperLink did not listen on port {port} within {timeout:.0f} s")


def _executable(name: str) -> str:
    """A Flower command of this Python environment (the one dpdistill runs in)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise ConfigError(f"{name} is not installed beside {sys.executable}: install dpdistill's dependencies")
    return str(path)


def write_app(directory: Path) -> Path:
    """A Flower App project whose components are dpdistill's (installed already: nothing to install per run)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pyproject.toml").write_text(f'''[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{APP_NAME}"
version = "1.0.0"
description = "dpdistill's federated transcription: the server and the data owners"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "dpdistill"

[tool.flwr.app.components]
serverapp = "dpdistill.federated.server_app:app"
clientapp = "dpdistill.federated.client_app:app"

[tool.flwr.app.config]
{PLAN} = ""
''')
    return directory


class Processes:
    """The processes a deployment started, stopped on exit by PID (never anything it did not start)."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir, self.env = log_dir, env
        self.started: list[subprocess.Popen] = []

    def start(self, name: str, command: list[str]) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                   start_new_session=True)  # its own group: its children stop with it
        self.started.append(process)
        return process

    def stop(self) -> None:
        """SIGTERM to each process group, SIGKILL to what is left after the grace period; returns once every
        group is empty (the ServerApp and ClientApp processes Flower starts belong to their parent's group)."""
        for process in self.started:
            if _group_alive(process):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for process in self.started:
            while _group_alive(process) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _group_alive(process):
                os.killpg(process.pid, signal.SIGKILL)
                killed = time.monotonic() + STOP_GRACE_SECONDS  # only unreaped zombies could outlast this
                while _group_alive(process) and time.monotonic() < killed:
                    time.sleep(0.1)

    def pids(self) -> list[int]:
        return [process.pid for process in self.started]


@contextmanager
def stopped_on_terminate() -> Iterator[None]:
    """SIGTERM as KeyboardInterrupt while Flower processes run, so that a terminated dpdistill stops the processes
    it started on its way out (the main thread only, where Python delivers signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _group_alive(process: subprocess.Popen) -> bool:
    """Whether any process of `process`'s group is left (its leader reaped first: a zombie still counts)."""
    process.poll()
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    return True


def flower_env(home: Path) -> dict[str, str]:
    """The environment of the Flower processes dpdistill starts: its own FLWR_HOME, this Python's commands first."""
    home.mkdir(parents=True, exist_ok=True)
    return {**os.environ, **FLOWER_ENV, "FLWR_HOME": str(home),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def start_superlink(processes: Processes, address: str, certificates: Certificates | None) -> str:
    """A SuperLink listening on `address` (TLS with `certificates`, else insecure), once it listens; the `flwr`
    connection that reaches it, written into FLWR_HOME's config."""
    host, port = host_and_port(address)
    security = ["--insecure"] if certificates is None else certificates.superlink_flags()
    superlink = processes.start("superlink", [_executable("flower-superlink"), *security,
                                              "--disable-runtime-dependency-installation", "--host", host,
                                              "--port", str(port)])
    wait_for_port(host, port, superlink)
    trust = "insecure = true" if certificates is None else f'root-certificates = "{certificates.ca}"'
    (Path(processes.env["FLWR_HOME"]) / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "{address}"\n{trust}\n')
    return CONNECTION


def supernode_command(superlink: str, owner_dir: Path, ca: Path | None, delta: float, extra_config: str = ""
                      ) -> list[str]:
    """An owner's SuperNode: it reaches `superlink` (trusting `ca`, else insecure) and names its owner folder and
    the delta the owner states its epsilon at."""
    security = ["--insecure"] if ca is None else ["--root-certificates", str(ca.resolve())]
    return [_executable("flower-supernode"), *security, "--superlink", superlink, "--port", str(free_port()),
            "--node-config", f'{OWNER_DIR}="{owner_dir.resolve()}" {OWNER_DELTA}="{delta!r}"{extra_config}']


@contextmanager
def flower_processes(work_dir: Path) -> Iterator[Processes]:
    """The Flower processes a run starts (their logs and Flower home in `work_dir`), every one stopped on exit,
    a SIGTERM included."""
    logs = work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    processes = Processes(logs, flower_env(work_dir / "flwr-home"))
    with stopped_on_terminate():
        try:
            yield processes
        finally:
            processes.stop()


@contextmanager
def deployed(work_dir: Path, owner_dirs: list[Path], owner_delta: float
             ) -> Iterator[tuple[Processes, dict[str, str], str]]:
    """A SuperLink and one SuperNode per owner on loopback (insecure: one machine), each owner at `owner_delta`,
    stopped on exit."""
    with flower_processes(work_dir) as processes:
        address = f"127.0.0.1:{free_port()}"
        connection = start_superlink(processes, address, None)
        for index, owner in enumerate(owner_dirs):
            processes.start(f"supernode-{index:03d}", supernode_command(
                address, owner, None, owner_delta, f" partition-id={index} num-partitions={len(owner_dirs)}"))
        yield processes, processes.env, connection


def deploy(plan_path: Path, owner_dirs: list[Path], work_dir: Path, owner_delta: float,
           started: Callable[[Processes], None] | None = None) -> dict[str, object]:
    """Run the federation as separate processes, each owner at `owner_delta`; the run's final status and the
    deployment's wall time."""
    began = time.perf_counter()
    with deployed(work_dir, owner_dirs, owner_delta) as (processes, env, connection):
        if started:
            started(processes)
        run_id, status = submit(plan_path, work_dir, env, connection)
    return {"status": status, "run_id": run_id, "wall_seconds": time.perf_counter() - began}


def serve(plan_path: Path, work_dir: Path, address: str, certificates: Certificates) -> dict[str, object]:
    """The server's side across machines: a SuperLink with TLS on `address` for the owners' SuperNodes (started by
    each owner, `dpdistill federated owner`), the run submitted to it; stopped once the run ends."""
    began = time.perf_counter()
    with flower_processes(work_dir) as processes:
        run_id, status = submit(plan_path, work_dir, processes.env,
                                start_superlink(processes, address, certificates))
    return {"status": status, "run_id": run_id, "wall_seconds": time.perf_counter() - began}


def submit(plan_path: Path, work_dir: Path, env: dict[str, str], connection: str) -> tuple[int, str]:
    """`flwr run` the federation's app with its plan on `connection`; its id and final status."""
    app = write_app(work_dir / "app")
    journal = RoundJournal(Path(FederationPlan.load(plan_path).journal_dir))
    journal.clear_end()
    submitted = subprocess.run([_executable("flwr"), "run", str(app), connection, "--format", "json",
                                "--run-config", f'{PLAN}="{plan_path.resolve()}"'],
                               capture_output=True, text=True, env=env, timeout=600)
    run_id = _run_id(submitted)
    return run_id, _wait_for_run(run_id, env, connection, journal)


def _run_id(submitted: subprocess.CompletedProcess) -> int:
    try:
        return int(json.loads(submitted.stdout)["run-id"])
    except (ValueError, KeyError, TypeError) as error:
        raise RuntimeError(f"flwr run did not start the federation: {submitted.stdout[-500:]} "
                           f"{submitted.stderr[-500:]}") from error


def _wait_for_run(run_id: int, env: dict[str, str], connection: str, journal: RoundJournal) -> str:
    """The run's final status, asked of Flower once the ServerApp has returned (its journal says so), and every
    STATUS_POLL_SECONDS in case it died before it could say."""
    asked = time.monotonic()
    while True:
        since = time.monotonic() - asked
        if since >= STATUS_POLL_SECONDS or (journal.ended() and since >= ENDED_ASK_SECONDS):
            listed = subprocess.run([_executable("flwr"), "ls", connection, "--run-id", str(run_id), "--format",
                                     "json"], capture_output=True, text=True, env=env, timeout=120)
            asked = time.monotonic()
            try:
                status = json.loads(listed.stdout)["runs"][0]["status"]
            except (ValueError, KeyError, IndexError, TypeError):
                status = "unknown"
            if status.startswith("finished"):
                return status
        time.sleep(ENDED_POLL_SECONDS)
