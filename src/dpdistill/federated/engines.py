"""Two ways to run the same ServerApp and ClientApp: Flower's simulation in this process, or a deployment of a
SuperLink and one SuperNode per owner as separate processes on loopback (Flower's own commands, as across hosts).

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
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from dpdistill.errors import ConfigError
from dpdistill.federated.client_app import OWNER_DIR, make_client_app
from dpdistill.federated.server_app import PLAN, make_server_app

APP_NAME = "dpdistill-federation"
FLOWER_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "RAY_DEDUP_LOGS": "0",
              "RAY_USAGE_STATS_ENABLED": "0", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}
STATUS_POLL_SECONDS = 5.0  # each poll starts a `flwr ls` process: over a second of CPU, which the owners need
STOP_GRACE_SECONDS = 10.0
START_SECONDS = 120.0  # how long the SuperLink may take to listen


def simulate(plan_path: Path, owner_dirs: list[Path]) -> None:
    """Flower's simulation runtime (Ray): every owner a virtual SuperNode in this machine's worker processes."""
    from flwr.simulation import run_simulation

    os.environ.update(FLOWER_ENV)
    flower = logging.getLogger("flwr")
    level = flower.level
    flower.setLevel(logging.ERROR)  # its per-stage messages (and run_simulation's deprecation) would bury progress
    try:
        run_simulation(make_server_app(plan_path), make_client_app([str(path) for path in owner_dirs]),
                       num_supernodes=len(owner_dirs),
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                       "init_args": {"include_dashboard": False, "log_to_driver": False}})
    finally:
        flower.setLevel(level)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = START_SECONDS) -> None:
    """Until something listens on `port` of loopback; refused if `process` exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the SuperLink exited with status {process.returncode} before listening")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
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


def _group_alive(process: subprocess.Popen) -> bool:
    """Whether any process of `process`'s group is left (its leader reaped first: a zombie still counts)."""
    process.poll()
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def deployed(work_dir: Path, owner_dirs: list[Path]) -> Iterator[tuple[Processes, dict[str, str], str]]:
    """A SuperLink and one SuperNode per owner on loopback (insecure: one machine), stopped on exit."""
    home = work_dir / "flwr-home"
    logs = work_dir / "logs"
    for directory in (home, logs):
        directory.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **FLOWER_ENV, "FLWR_HOME": str(home),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    link = free_port()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
                                      f'address = "127.0.0.1:{link}"\ninsecure = true\n')
    processes = Processes(logs, env)
    try:
        superlink = processes.start("superlink", [_executable("flower-superlink"), "--insecure",
                                                  "--disable-runtime-dependency-installation", "--host", "127.0.0.1",
                                                  "--port", str(link)])
        wait_for_port(link, superlink)
        for index, owner in enumerate(owner_dirs):
            processes.start(f"supernode-{index:03d}", [
                _executable("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{link}",
                "--port", str(free_port()),
                "--node-config", f'{OWNER_DIR}="{owner.resolve()}" partition-id={index} '
                                 f'num-partitions={len(owner_dirs)}'])
        yield processes, env, "loopback"
    finally:
        processes.stop()


def deploy(plan_path: Path, owner_dirs: list[Path], work_dir: Path,
           started: Callable[[Processes], None] | None = None) -> dict[str, object]:
    """Run the federation as separate processes; the run's final status and the deployment's wall time."""
    began = time.perf_counter()
    app = write_app(work_dir / "app")
    with deployed(work_dir, owner_dirs) as (processes, env, connection):
        if started:
            started(processes)
        submitted = subprocess.run([_executable("flwr"), "run", str(app), connection, "--format", "json",
                                    "--run-config", f'{PLAN}="{plan_path.resolve()}"'],
                                   capture_output=True, text=True, env=env, timeout=600)
        run_id = _run_id(submitted)
        status = _wait_for_run(run_id, env, connection)
    return {"status": status, "run_id": run_id, "wall_seconds": time.perf_counter() - began}


def _run_id(submitted: subprocess.CompletedProcess) -> int:
    try:
        return int(json.loads(submitted.stdout)["run-id"])
    except (ValueError, KeyError, TypeError) as error:
        raise RuntimeError(f"flwr run did not start the federation: {submitted.stdout[-500:]} "
                           f"{submitted.stderr[-500:]}") from error


def _wait_for_run(run_id: int, env: dict[str, str], connection: str) -> str:
    while True:
        listed = subprocess.run([_executable("flwr"), "ls", connection, "--run-id", str(run_id), "--format", "json"],
                                capture_output=True, text=True, env=env, timeout=120)
        try:
            status = json.loads(listed.stdout)["runs"][0]["status"]
        except (ValueError, KeyError, IndexError, TypeError):
            status = "unknown"
        if status.startswith("finished"):
            return status
        time.sleep(STATUS_POLL_SECONDS)
