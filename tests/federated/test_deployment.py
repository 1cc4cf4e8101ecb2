"""The deployment engine: a SuperLink and one SuperNode per owner as real processes on loopback. An owner killed
mid-run leaves the later rounds to the others (never fewer than the threshold the noise was sized for), the run
completes, and no process the deployment started outlives it."""

import dataclasses
import os
import signal
import threading
from pathlib import Path

import pytest
from safetensors.torch import save_file

from dpdistill.data import load_dataset
from dpdistill.federated.config import FederatedConfig
from dpdistill.federated.engines import deploy
from dpdistill.federated.owners import prepare_owners
from dpdistill.federated.protocol import RunTerms
from dpdistill.federated.server_app import FederationPlan, RoundJournal
from dpdistill.federated.method import calibrated_wire, vote_wire

pytestmark = [pytest.mark.slow, pytest.mark.flower]


def test_a_killed_owner_leaves_a_completed_run_with_enough_noise_and_no_process_behind(tmp_path: Path):
    config = FederatedConfig(epsilon=10.0, dataset="digits", clients=3, dropouts=1, members_per_owner=2,
                             teacher_epochs=1, queries=40)
    owner_dirs = prepare_owners(tmp_path / "owners", config)
    wire, query = calibrated_wire(config, vote_wire(config, 10, (1, 8, 8)), 40)
    wire = dataclasses.replace(wire, terms=RunTerms("deployment-test", 40, 3, 1, config.colluders, config.delta))
    save_file({"images": load_dataset("digits").x_test[:40].contiguous()}, tmp_path / "queries.safetensors")
    plan = FederationPlan(wire, 3, 1, str(tmp_path / "rounds"), 30.0, round_queries=20,
                          queries_file=str(tmp_path / "queries.safetensors"))
    plan.save(tmp_path / "plan.json")
    journal, started = RoundJournal(tmp_path / "rounds"), []

    def kill_an_owner_after_the_first_round(processes) -> None:
        started.extend(processes.pids())
        supernode = processes.started[2]  # owner 1's SuperNode (the first process is the SuperLink)

        def watch() -> None:
            while journal.read(0) is None and supernode.poll() is None:
                threading.Event().wait(0.5)
            os.killpg(supernode.pid, signal.SIGKILL)

        threading.Thread(target=watch, daemon=True).start()

    outcome = deploy(tmp_path / "plan.json", owner_dirs, tmp_path / "deployment", kill_an_owner_after_the_first_round)
    assert outcome["status"] == "finished:completed", outcome
    assert [journal.read(index)[1] for index in range(2)] == [3, 2]  # round 2 without the killed owner
    # what the threshold's sum carries beyond the one colluder's share: one honest share of the two
    assert query.honest == 1 and query.total_sigma == pytest.approx(wire.share_sigma)
    assert len(started) == 4
    for pid in started:  # each process group the deployment started is gone
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
