"""SecAgg+'s threshold on a real deployment: 5 owners, T = 2 dropouts tolerated (threshold 3), PATE votes in four
rounds. Once round 1 is journaled one owner's SuperNode is killed (absent at round 2's roll call) and a second one
a few seconds later, while round 2 runs. Every revealed sum must hold at least 3 owners' noise shares, and each
owner's own ledger must hold the charge its client computed.

    .venv/bin/python benchmarks/experiments/federated_threshold.py [OUT_DIR]
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from safetensors.torch import save_file

from dpdistill.data import load_dataset
from dpdistill.federated.config import FederatedConfig
from dpdistill.federated.engines import deploy
from dpdistill.federated.owners import prepare_owners
from dpdistill.federated.protocol import RunTerms
from dpdistill.federated.server_app import FederationPlan, RoundJournal
from dpdistill.federated.method import calibrated_wire, vote_wire
from dpdistill.privacy.ledger import ReleaseLedger

OWNERS, DROPOUTS, QUERIES, ROUND_QUERIES = 5, 2, 80, 20
SECOND_KILL_DELAY = 3.0  # seconds after the first kill: inside round 2's secure-aggregation stages


def main(out: Path) -> None:
    config = FederatedConfig(epsilon=10.0, dataset="digits", clients=OWNERS, dropouts=DROPOUTS, members_per_owner=2,
                             teacher_epochs=1, queries=QUERIES)
    owner_dirs = prepare_owners(out / "owners", config)
    wire, query = calibrated_wire(config, vote_wire(config, 10, (1, 8, 8)), QUERIES, 0.0)
    wire = dataclasses.replace(wire, terms=RunTerms(f"threshold-{int(time.time())}", QUERIES, OWNERS, DROPOUTS,
                                                    config.colluders, config.delta))
    save_file({"images": load_dataset("digits").x_test[:QUERIES].contiguous()}, out / "queries.safetensors")
    plan = FederationPlan(wire, OWNERS, DROPOUTS, str(out / "rounds"), 30.0, round_queries=ROUND_QUERIES,
                          queries_file=str(out / "queries.safetensors"), colluders=config.colluders)
    plan.save(out / "plan.json")
    journal, killed = RoundJournal(out / "rounds"), []

    def kill_two_owners(processes) -> None:
        supernodes = processes.started[1:]  # the first process is the SuperLink

        def watch() -> None:
            while journal.read(0) is None and supernodes[0].poll() is None:
                threading.Event().wait(0.2)
            for index, delay in ((3, 0.0), (4, SECOND_KILL_DELAY)):
                threading.Event().wait(delay)
                os.killpg(supernodes[index].pid, signal.SIGKILL)
                killed.append({"owner": index, "at": time.strftime("%H:%M:%S")})

        threading.Thread(target=watch, daemon=True).start()

    started = time.perf_counter()
    outcome = deploy(out / "plan.json", owner_dirs, out / "deployment", config.delta, kill_two_owners)
    rounds = len(plan.rounds(QUERIES))
    contributors = [None if journal.read(i) is None else journal.read(i)[1] for i in range(rounds)]
    result = {"status": outcome["status"], "wall_seconds": time.perf_counter() - started, "killed": killed,
              "threshold": OWNERS - DROPOUTS, "contributors": contributors,
              "lost_rounds": [i + 1 for i in range(rounds) if journal.lost(i)], "failure": journal.failure(),
              "honest_shares": query.honest, "share_sigma": wire.share_sigma,
              "owner_spent_epsilon": [ReleaseLedger(path).read().spent() for path in owner_dirs]}
    (out / "result.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    revealed = [count for count in contributors if count is not None]
    print("fewest contributors in a revealed sum:", min(revealed) if revealed else None,
          "(threshold", OWNERS - DROPOUTS, ")")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/experiments/federated-threshold"))
