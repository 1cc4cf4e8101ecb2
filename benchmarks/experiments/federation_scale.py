"""Seconds per secure-aggregation round against the number of data owners: federated PATE on Flower's simulation
(2 cores), 5% of the owners tolerated as dropouts and 5% as colluders (at least one), two rounds of 250
Fashion-MNIST queries, on the sparse or the full SecAgg+ graph. Round 2's time is the steady cost of a round (the
roll call, SecAgg+'s four stages, every owner's answer); round 1's includes the simulation's start-up.

Every owner holds a copy of one owner's teacher (one cnn member trained on a 50th of the training split): a
round's cost does not depend on what the teachers learnt, and training a thousand owners would take hours. Each
copy is its own owner (its own identity and ledger).

    .venv/bin/python benchmarks/experiments/federation_scale.py OUT_DIR [--owners 10,50,250,1000] [--graph sparse]
        [--flower-delivery]

`--flower-delivery` runs Flower 1.41's own message delivery instead of dpdistill's one pass a tick
(`engines.delivered_in_one_pass`): each tick asks the link state for every node's next message, and each ask
checks every stored message.

Writes `OUT_DIR/federation_scale.json` and, with --record, benchmarks/experiments/results/federation_scale.json and
federation_scale.png beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
from pathlib import Path

from dpdistill.data import load_dataset
from dpdistill.data.partition import new_partition_key, partition_indices
from dpdistill.federated import engines
from dpdistill.federated.config import FederatedConfig
from dpdistill.federated.owners import OWNERS_FILE, owner_directory, owners_spec
from dpdistill.jobs import train_teacher_ensemble
from dpdistill.models.ensemble import PARTITION_KEY_FILE, is_ensemble, write_partition_key
from dpdistill.pipeline import federated
from dpdistill.reporting.report import write_json

RESULTS = Path(__file__).parent / "results"
TEACHER = dict(dataset="fmnist", members_per_owner=1, teacher_epochs=1, teacher_min_steps=50)
TEMPLATE_OWNERS = 50


def settings(owners: int, graph: str) -> FederatedConfig:
    tolerated = owners // 20
    return FederatedConfig(**TEACHER, clients=owners, method="pate", epsilon=10.0, dropouts=tolerated,
                           colluders=max(1, tolerated), secagg_graph=graph, queries=500, round_queries=250,
                           epochs=1, min_steps=10, accept_noise=True)


def template_owner(directory: Path) -> Path:
    """One owner: its cnn member trained on a keyed 50th of the training split."""
    owner = owner_directory(directory, 0)
    if not is_ensemble(owner):
        key = new_partition_key()
        directory.mkdir(parents=True, exist_ok=True)
        write_partition_key(directory, key)
        holding = partition_indices(load_dataset(TEACHER["dataset"]).ids_train, TEMPLATE_OWNERS, key)[0]
        config = FederatedConfig(**TEACHER, clients=TEMPLATE_OWNERS, epsilon=10.0)
        train_teacher_ensemble(config.dataset, owner, config.teacher_config(), config.members, holding=holding,
                               overwrite=owner.exists())
    return directory


def copied_owners(root: Path, template: Path, config: FederatedConfig) -> Path:
    """`config.clients` owners in `root`, each a copy of the template's first owner (fresh identity and ledger)."""
    if (root / OWNERS_FILE).exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    source = owner_directory(template, 0)
    for index in range(config.clients):
        shutil.copytree(source, owner_directory(root, index),
                        ignore=shutil.ignore_patterns("ledger.json", "owner-id", ".ledger.lock"))
    shutil.copyfile(template / PARTITION_KEY_FILE, root / PARTITION_KEY_FILE)
    write_json(root / OWNERS_FILE, owners_spec(config))
    return root


def measure(out: Path, owners: int, graph: str, template: Path, delivery: str) -> dict:
    config = settings(owners, graph)
    root = copied_owners(out / f"owners-{owners}", template, config)
    run_dir = out / f"run-{owners}-{graph}"
    shutil.rmtree(run_dir, ignore_errors=True)
    report = federated(config, run_dir, root)
    first, second = report["federation"]["round_seconds"]
    privacy = report["privacy"]
    return {"owners": owners, "graph": privacy["secagg_graph"], "delivery": delivery,
            "shares": privacy["secagg_shares"],
            "share_threshold": privacy["secagg_share_threshold"], "dropouts": config.dropouts,
            "colluders": config.colluders, "failure_over_run": privacy["secagg_failure"],
            "round_1_seconds": first, "round_2_seconds": second,
            "contributors": report["federation"]["contributors"], "epsilon": privacy["epsilon"]}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5, 3.5))
    for graph, delivery in sorted({(row["graph"], row["delivery"]) for row in rows}):
        chosen = [row for row in rows if (row["graph"], row["delivery"]) == (graph, delivery)]
        axes.plot([row["owners"] for row in chosen], [row["round_2_seconds"] for row in chosen], "o-",
                  label=f"{graph} graph, {delivery} delivery")
    axes.set(xscale="log", yscale="log", xlabel="data owners", ylabel="seconds per round (round 2)",
             title="Federated PATE round on Flower's simulation, 2 cores")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--owners", default="10,50,250,1000")
    parser.add_argument("--graph", default="sparse", choices=("sparse", "full"))
    parser.add_argument("--flower-delivery", action="store_true", help="Flower's own message delivery")
    parser.add_argument("--record", action="store_true", help="add the rows to benchmarks/experiments/results")
    args = parser.parse_args()
    delivery = "flower" if args.flower_delivery else "one pass"
    if args.flower_delivery:
        engines.delivered_in_one_pass = contextlib.nullcontext
    template = template_owner(args.out / "template")
    rows = []
    for owners in [int(count) for count in args.owners.split(",")]:
        rows.append(measure(args.out, owners, args.graph, template, delivery))
        print(json.dumps(rows[-1]), flush=True)
        write_json(args.out / "federation_scale.json", rows)
    if args.record:
        path = RESULTS / "federation_scale.json"
        kept = json.loads(path.read_text()) if path.exists() else []
        key = lambda row: (row["graph"], row["delivery"], row["owners"])  # noqa: E731
        measured = {key(row) for row in rows}
        rows = sorted([row for row in kept if key(row) not in measured] + rows, key=key)
        write_json(path, rows)
        plot(rows, RESULTS / "federation_scale.png")


if __name__ == "__main__":
    main()
