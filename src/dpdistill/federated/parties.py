"""A federation across machines, one command per party (docs/methods/federated.md, "Across machines"):

- `dpdistill federated serve`: the server plans the run (noise, queries, key-sharing graph), starts a SuperLink with
  TLS, waits for the owners, asks the rounds and trains the student: `dpdistill federated` with `--engine remote`;
- `dpdistill federated owner`: an owner's SuperNode on the owner's own teacher folder, trusting the federation's
  CA certificate; its client keeps the owner's ledger there, at the owner's own delta, and refuses what the owner's
  budget does not allow and any run whose terms are not the owner's own;
- `dpdistill federated finish`: the student and report of a served run whose rounds were all asked (the server
  stopped after them), from its journal alone: no owner is asked again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpdistill.errors import ConfigError
from dpdistill.federated.config import FederatedConfig, host_and_port
from dpdistill.federated.engines import flower_processes, supernode_command
from dpdistill.federated.method import PLAN_FILE, Federated, rounds_answered, run_federated
from dpdistill.federated.server_app import FederationPlan
from dpdistill.models.ensemble import is_ensemble
from dpdistill.options import OVERWRITE_OPTION, CommandSpec, field_options, out_option, resume_option, set_option
from dpdistill.progress import Progress
from dpdistill.runs import release_state

OWNER_FLOWER_DIR = "flower"  # in the owner's folder: the SuperNode's Flower home and logs


def run_owner(teacher: Path, superlink: str, root_certificates: Path, delta: float) -> int:
    """Serve the owner's teachers to the federation at `superlink` until stopped (SIGINT or SIGTERM), answering only
    runs stated at the owner's `delta`; the SuperNode and every ClientApp process it started are stopped with it.
    Its exit status."""
    from dpdistill.privacy.accounting import validate_delta

    validate_delta(delta)
    if not is_ensemble(teacher):
        raise ConfigError(f"--teacher {teacher} is not a teacher ensemble: train one on your data with "
                          f"`dpdistill train-teacher --dataset DATA --partitions N --out {teacher}`")
    if not root_certificates.is_file():
        raise ConfigError(f"--root-certificates {root_certificates}: no such file (the federation's ca.crt)")
    host_and_port(superlink)
    work_dir = teacher / OWNER_FLOWER_DIR
    try:
        with flower_processes(work_dir) as processes:
            node = processes.start("supernode", supernode_command(superlink, teacher, root_certificates, delta))
            print(f"owner {teacher} joined the federation at {superlink} (log: {work_dir / 'logs'}); stop with "
                  f"Ctrl-C", flush=True)
            return node.wait()
    except KeyboardInterrupt:
        return 0


def finish(values: dict[str, Any], config: None, progress: Progress | None) -> dict[str, Any]:
    """The served run in --out, finished from its journal; refused while a round is unasked."""
    out_dir = Path(values["out"])
    if Federated().interrupted(out_dir) is None:
        raise ConfigError(f"--out {out_dir} holds no served federated run to finish")
    plan = FederationPlan.load(release_state(out_dir) / PLAN_FILE)
    if not rounds_answered(plan):
        raise ConfigError(f"the run in {out_dir} has rounds not yet asked: `dpdistill federated serve --resume --out "
                          f"{out_dir} --certificates DIR` asks them")
    return run_federated(None, out_dir, resume=True, progress=progress)


def _serve(values: dict[str, Any], config: FederatedConfig | None, progress: Progress | None) -> dict[str, Any]:
    return run_federated(config, Path(values["out"]), resume=values["resume"], progress=progress,
                         overwrite=values["overwrite"])


SERVE = CommandSpec(
    name="federated serve", help="A federation's server, owners on other machines.\n\nIt plans the run, starts a "
                                 "SuperLink with TLS, waits for the owners, asks the rounds and trains the student.",
    options=(*field_options(FederatedConfig, ("dataset", "clients")),
             out_option("directory for the student, the released sums and the report"),
             *field_options(FederatedConfig, ("certificates", "address", "owner_wait", "method", "epsilon", "delta",
                                              "dropouts", "colluders", "secagg_graph", "members_per_owner", "queries",
                                              "iterations", "student_arch", "accept_noise", "seed", "device")),
             set_option("any other setting, KEY=VALUE (repeatable), e.g. stage_timeout=300, batch_size=256"),
             resume_option("continue the interrupted run in --out after its last released round"), OVERWRITE_OPTION),
    configure=lambda values: None if values["resume"] else FederatedConfig(
        **{**SERVE.field_values(values), **SERVE.settings(values), "engine": "remote"}),
    run=_serve, progress_of=lambda values, config: (None, "federated serve: owners join, then rounds and student"),
    positional=("dataset", "clients", "out"), settable=(FederatedConfig,))

FINISH = CommandSpec(
    name="federated finish", help="A served federation's student, from its journal.\n\nFor a run stopped after "
                                  "its rounds: no owner is asked again.",
    options=(out_option("the served run's directory"),),
    configure=lambda values: None, run=finish,
    progress_of=lambda values, config: (None, "federated finish: the student from the released sums"),
    positional=("out",))
