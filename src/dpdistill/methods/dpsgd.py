"""DP-SGD (Abadi et al. 2016, "Deep Learning with Differential Privacy"), the baseline the seed papers compare
against, with Opacus' parts (training/private.py: DPSGDTrainer).

For each of `epochs` x steps-per-epoch steps:
1. Sample: every private example joins the batch independently with probability q (Poisson, secret randomness).
2. Ask: the gradient of each example's loss w.r.t. the student's weights.
3. Release: clip each to norm C, sum, add N(0, sigma^2 C^2) (noise from the run's NoiseSource); the accountant
   composes the Poisson-subsampled Gaussian over the steps.
4. Learn: Adam or SGD on the noisy sum (post-processing).
Every update is a noisy release, so the released student is covered (add/remove one example, or replace-one).
On several processes (`processes`, training/distributed.py) the same steps run data-parallel: each process samples
and clips its share of the examples, rank 0 adds the noise once, the privacy is the single process's.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from dpdistill.methods.base import Source
from dpdistill.methods.dpdfd_direct import DPDFDDirect
from dpdistill.methods.lifecycle import execute
from dpdistill.methods.private_training import PrivateTrainingMethod, follow_plan
from dpdistill.options import AuditRoute, OVERWRITE_OPTION, CommandSpec, field_options, out_option, resume_option
from dpdistill.progress import Progress
from dpdistill.runs import saved_config
from dpdistill.training.distributed import Group, on_processes
from dpdistill.training.private import PrivateTrainingConfig


class DPSGD(PrivateTrainingMethod):
    name = "dpsgd"
    summary = "DP-SGD on the private data (Opacus): per-example clipping and Gaussian noise on every step"
    paper = "Abadi et al., Deep Learning with Differential Privacy (CCS 2016)"
    covers = "the student (DP-SGD: every update is a clipped, noised per-example gradient)"


PRIVATE_TRAINERS: dict[str, PrivateTrainingMethod] = {method.name: method for method in (DPSGD(), DPDFDDirect())}


def _configure(values: dict[str, Any]) -> PrivateTrainingConfig | None:
    """A fresh run's settings from the options; a resumed run's saved ones (None: nothing saved, which the run
    then says)."""
    if values["resume"]:
        saved = saved_config(Path(values["out"]))
        return None if saved is None else PrivateTrainingConfig.from_dict(saved)
    return PrivateTrainingConfig(**COMMAND.field_values(values))


def train_private(config: PrivateTrainingConfig | None, out_dir: Path, resume: bool = False,
                  progress: Progress | None = None, overwrite: bool = False) -> dict[str, Any] | None:
    """Train the student on the private data directly (DP-SGD or DPDFD's direct mode): the baseline transcription
    is compared to. With `resume`, the configuration saved in `out_dir` continues from its last finished epoch. On
    several processes, rank 0 runs the lifecycle and returns the report; under torchrun the other ranks return
    None."""
    saved = saved_config(out_dir) if resume and out_dir.is_dir() else None
    settings = saved or (config.to_dict() if config is not None else {})
    name = settings.get("method") or "dpsgd"
    return on_processes(settings.get("processes", 1), settings.get("device", "cpu"),
                        partial(_train_on_rank, name, None if resume else config, out_dir, resume, overwrite),
                        progress)


def _train_on_rank(name: str, config: PrivateTrainingConfig | None, out_dir: Path, resume: bool, overwrite: bool,
                   progress: Progress | None) -> dict[str, Any] | None:
    """One process's part: rank 0 (or the only process) runs the method's lifecycle, the others follow its plan."""
    if Group.current().leads:
        return execute(PRIVATE_TRAINERS[name], Source(), config, out_dir, resume, overwrite, progress)
    follow_plan(out_dir)
    return None


COMMAND = CommandSpec(
    name="train-private", help="Train the student on the private data directly with DP. The baseline "
                               "transcription is compared to.",
    options=(*field_options(PrivateTrainingConfig, ("dataset",)),
             out_option("directory for student.safetensors, config.json, report.json and report.md"),
             *field_options(PrivateTrainingConfig, (
                 "method", "epsilon", "delta", "sigma", "max_grad_norm", "beta", "target_step", "student_arch",
                 "epochs", "batch_size", "lr", "optimizer", "momentum", "ema_decay", "student_init", "train_layers", "public",
                 "public_size", "dataset_size", "count_share", "relation", "seed", "reproducible_noise", "device",
                 "processes", "accept_defaults")),
             resume_option("continue the interrupted run in --out with its saved settings (other options are then "
                           "ignored)"), OVERWRITE_OPTION),
    configure=_configure,
    run=lambda values, config, progress: train_private(config, Path(values["out"]), values["resume"], progress,
                                                       values["overwrite"]),
    progress_of=lambda values, config: ((None, "train-private") if config is None
                                        else (config.epochs, f"{config.method} on {config.dataset}")),
    positional=("dataset", "out"),
    audits=(AuditRoute("dpsgd", "DP-SGD on the data (train-private)", {"dataset": "data"}, {"method": "dpsgd"},
                       {"student_arch": "scatter-linear"}, epochs=True),))
