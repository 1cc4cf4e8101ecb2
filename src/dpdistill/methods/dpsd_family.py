"""The data-free transcription methods (the DPSD family: dpsd, dpdfd, srr) by name: the settings each brings to a
TranscriptionConfig (its defaults, its paper's settings, its checks); their run, and `dpdistill transcribe`'s
declaration."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any

from dpdistill.errors import ConfigError
from dpdistill.methods.base import Source
from dpdistill.methods.config import TranscriptionConfig, build_config
from dpdistill.methods.dpdfd import DPDFD
from dpdistill.methods.dpsd import DPSD
from dpdistill.methods.lifecycle import execute
from dpdistill.methods.srr import SRR
from dpdistill.methods.teachers import teacher_provenance
from dpdistill.methods.transcription import TranscriptionMethod
from dpdistill.options import (AuditRoute, OVERWRITE_OPTION, REPRODUCIBLE_NOISE_HELP, SAMPLE_SOURCE_HELP, CommandSpec,
                               Option, dataset_help, out_option, preset_options, resume_option, set_option)
from dpdistill.progress import Progress
from dpdistill.runs import saved_config

TRANSCRIPTIONS: dict[str, TranscriptionMethod] = {method.name: method for method in (DPSD(), DPDFD(), SRR())}


def family_member(name: str) -> TranscriptionMethod:
    """The transcription method called `name`, refused with the names `transcribe` runs."""
    if name not in TRANSCRIPTIONS:
        raise ConfigError(f"unknown method {name!r}: `transcribe` runs {', '.join(TRANSCRIPTIONS)} "
                          f"(`dpdistill.methods()` lists every method and the command that runs it)")
    return TRANSCRIPTIONS[name]


def transcribe(teacher_dir: Path, config: TranscriptionConfig | None, out_dir: Path, dataset_name: str | None = None,
               resume: bool = False, progress: Progress | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Convert the teacher in `teacher_dir` into a private student and generator in `out_dir` with the data-free
    method `config.method` (dpsd, dpdfd or srr).

    The dataset is read only for its test split, to report accuracies. With `resume`, the configuration saved
    in `out_dir` is used and the run continues from its last checkpoint with the budget it had spent.
    """
    saved = saved_config(out_dir) if resume and out_dir.is_dir() else None
    method = family_member((saved or {}).get("method") or (config.method if config is not None else "dpsd"))
    return execute(method, Source(teacher_dir, dataset_name), config, out_dir, resume, overwrite, progress)


class PrivacyMode(str, Enum):
    data = "data"
    label = "label"
    none = "none"


class Accounting(str, Enum):
    sound = "sound"
    paper = "paper"


# the options whose None means the preset's value: the engine's settings (TranscriptionConfig's fields, named as in
# FIELD_NAMES where the option's name differs) and, PRIVACY_NAMES, its privacy request's
PRESET_OPTIONS = {
    "iterations": (int, "T"),
    "batch_size": (int, "b: synthetic samples per iteration"),
    "sigma": (float, "data mode noise scale (std = sigma * beta); default: calibrated"),
    "beta": (float, "data mode normalization bound"),
    "epsilon0": (float, "label mode per-query RR epsilon; default: calibrated"),
    "top_k": (int, "k of top-k (gradient entries / candidate labels)"),
    "gradient_op": (str, "data mode: normalize (DPSD, DPDFD) or clip the output gradient to norm beta (DPDFD's C)"),
    "student_arch": (str, ""),
    "student_lr": (float, ""),
    "generator_lr": (float, ""),
    "student_steps": (int, ""),
    "distill_loss": (str, "dkd or kd"),
    "latents": (str, "trainable (DPSD) or fresh (new latent vectors each iteration)"),
    "class_balanced": (bool, "weight the student's loss by inverse class frequency"),
    "discriminator": (str, "student (DPSD, covered) or teacher (DPSD-T: NO guarantee)"),
}
PRIVACY_NAMES = ("sigma", "beta", "epsilon0")
FIELD_NAMES = {"gradient_op": "gradient_operation"}


def _configure(values: dict[str, Any]) -> TranscriptionConfig | None:
    """A fresh run's settings: the preset's, then the options given; a resumed run's saved ones."""
    if values["resume"]:
        saved = saved_config(Path(values["out"])) if Path(values["out"]).is_dir() else None
        return None if saved is None else TranscriptionConfig.from_dict(saved)
    source = values["sample_source"]
    engine = {FIELD_NAMES.get(name, name): values[name] for name in PRESET_OPTIONS if name not in PRIVACY_NAMES}
    return build_config(
        values["preset"],
        {"method": values["method"], "seed": values["seed"], "device": values["device"], **engine,
         "reproducible_noise": values["reproducible_noise"] or None,
         "sample_source": None if source is None else str(source), **COMMAND.settings(values)},
        {"mode": values["privacy"].value, "epsilon": values["epsilon"], "delta": values["delta"],
         "accounting": values["accounting"].value, "accept_noise": values["accept_noise"] or None,
         **{name: values[name] for name in PRIVACY_NAMES}},
        dp_teacher=Path(values["teacher"]).exists() and teacher_provenance(Path(values["teacher"])) is not None)


COMMAND = CommandSpec(
    name="transcribe", help="Convert a teacher into a private student and generator. Both are differentially private.",
    options=(Option("teacher", Path, help="teacher directory (model.safetensors + meta.json), or an ensemble's "
                                          "(ensemble.json + member-XXX/)", field=False),
             out_option("output directory"),
             Option("method", str, "dpsd", "dpsd (seed 000), dpdfd (seed 002: data mode, no top-k) or srr (seed 001: "
                                           "label mode, generator pretrained on the teacher: NO formal guarantee)",
                    field=False),
             Option("privacy", PrivacyMode, PrivacyMode.data, "data, label, or none (no guarantee)", field=False),
             Option("epsilon", float | None, None, "privacy budget (sound by default)", field=False),
             Option("delta", float | None, None, "delta of (epsilon, delta)-DP [default 1e-5]", field=False),
             Option("preset", str | None, None, "paper (seed settings), paper-workload (with paper: the student "
                                                "workload the seed's figures imply, 400 steps an iteration on every "
                                                "answer so far), federated (FedDPSD's Alg. 2: fresh latent vectors, "
                                                "no top-k), demo (small and fast), engine (the strongest "
                                                "data-free loop: NO guarantee), upper-bound (engine, 600 iterations; "
                                                "default for --privacy none), pate (an ensemble answers every 25th "
                                                "iteration only), dp-teacher (the default for a teacher that is a DP "
                                                "release, without noise: free); combine: paper,engine", field=False),
             Option("accept_noise", bool, False, "run even where the answers would be near random (refused by "
                                                 "default, from the capacity bound or the response rate)",
                    flags=("--accept-noise",), show_default=False, field=False),
             Option("accounting", Accounting, Accounting.sound, "sound (dp-accounting) or paper (reproduce the "
                                                                "papers' tables)", field=False),
             *preset_options(PRESET_OPTIONS),
             Option("dataset", str | None, None, dataset_help("evaluation data set (default: the teacher's)"),
                    field=False),
             Option("seed", int | None, None, "seeds initialisation and latent vectors, never the noise", field=False),
             Option("reproducible_noise", bool, False, REPRODUCIBLE_NOISE_HELP, show_default=False, field=False),
             Option("device", str | None, None, "cpu or cuda", field=False),
             resume_option(), set_option("any config knob, KEY=VALUE (repeatable), e.g. replay_size=20000"),
             Option("sample_source", Path | None, None, SAMPLE_SOURCE_HELP, field=False), OVERWRITE_OPTION),
    configure=_configure,
    run=lambda values, config, progress: transcribe(Path(values["teacher"]), config, Path(values["out"]),
                                                    values["dataset"], values["resume"], progress,
                                                    values["overwrite"]),
    progress_of=lambda values, config: (None if config is None else config.iterations,
                                        f"{values['method'] if config is None else config.method} "
                                        f"{values['privacy'].value}"),
    positional=("teacher", "out"), settable=(TranscriptionConfig,),
    audits=(AuditRoute("dpsd", "DPSD transcription of the teacher (--teachers N: of an ensemble)",
                       {"teacher": "transcribed", "dataset": "data"}, {"method": "dpsd", "privacy": "data"}),
            AuditRoute("dpdfd", "DPDFD transcription of the teacher", {"teacher": "transcribed", "dataset": "data"},
                       {"method": "dpdfd", "privacy": "data"}),
            AuditRoute("srr", "DP-DFD with selective randomized response (NO formal guarantee)",
                       {"teacher": "transcribed", "dataset": "data"}, {"method": "srr", "privacy": "label"})))
