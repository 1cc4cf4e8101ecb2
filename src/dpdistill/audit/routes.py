"""The routes an audit can run on its canaried data, each exactly as a user runs it from the command line.

A route is two steps: `build` makes the route's own config from the audit's (before anything is written, so a
wrong setting costs nothing), `run` trains what the route starts from and runs it. Teacher routes start from
non-private models trained on the audited data (a teacher, or an ensemble of linear heads on scattering features,
one per partition, as the scattering rows of the benchmarks): the canaries then sit in the teacher's training set
or in one member's partition, where the route's guarantee has to hide them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from dpdistill import jobs, pipeline
from dpdistill.errors import ConfigError, PrivacyParameterError
from dpdistill.progress import Progress
from dpdistill.training.teacher import TeacherConfig

if TYPE_CHECKING:
    from dpdistill.audit.run import AuditConfig

ENSEMBLE_DEFAULT = 250  # members of a teacher route's ensemble: DGD's n, the scattering heads of the benchmarks
TEACHER_DIR, ENSEMBLE_DIR = "teacher", "teachers"


def private_model_dir(data: str, name: str) -> Path:
    """Where an audit keeps the non-private model `name` a teacher route starts from: beside the audited data,
    in the audit's private folder."""
    return Path(data).parent / name


class PrivateModels:
    """The non-private models a teacher route starts from, trained on the audited data `data` when first asked
    for, beside it in the audit's private folder (they are what the route protects: never released)."""

    def __init__(self, config: "AuditConfig", data: str, progress: Progress | None) -> None:
        self.config, self.data, self.progress = config, data, progress

    def teacher(self) -> Path:
        """One teacher on all the audited data (`--teacher-arch`)."""
        out = private_model_dir(self.data, TEACHER_DIR)
        if not out.is_dir():
            jobs.train_teacher(self.data, out, TeacherConfig(arch=self.config.teacher_arch, seed=self.config.seed,
                                                                 device=self.config.device), self.progress)
        return out

    def ensemble(self) -> Path:
        """`config.teachers` linear heads on scattering features, one per keyed partition."""
        out = private_model_dir(self.data, ENSEMBLE_DIR)
        if not out.is_dir():
            heads = TeacherConfig(init="scatter", heads_only=True, lr=0.01, weight_decay=0.01, seed=self.config.seed,
                                  device=self.config.device)
            jobs.train_teacher_ensemble(self.data, out, heads, self.config.teacher_count, progress=self.progress)
        return out

    def transcribed(self) -> Path:
        """What a transcription route converts: the ensemble with --teachers above 1, else the single teacher."""
        return self.ensemble() if self.config.teacher_count > 1 else self.teacher()


@dataclass(frozen=True)
class Route:
    """One audited route: how it reads the data (`teachers`: None, its own data; "single" or "ensemble", the
    default teacher count), whether it takes a budget, and its two steps."""

    name: str
    summary: str
    teachers: str | None
    takes_epsilon: bool
    build: Callable[["AuditConfig", str], Any]
    run: Callable[[Any, PrivateModels, Path, Progress | None], dict[str, Any]]
    presets: bool = False  # whether --preset names one of the route's presets

    @property
    def default_teachers(self) -> int | None:
        return {None: None, "single": 1, "ensemble": ENSEMBLE_DEFAULT}[self.teachers]


def _student(config: "AuditConfig", kind: type) -> dict[str, str]:
    """The student's architecture where the route's config `kind` has one to choose (refused where it has none)."""
    if config.student_arch is None:
        return {}
    if "student_arch" not in kind.__dataclass_fields__:
        raise ConfigError(f"the {config.method} route sets its own student: drop --student-arch")
    return {"student_arch": config.student_arch}


def _settings(config: "AuditConfig", kind: type, **given: Any) -> dict[str, Any]:
    """The route config's values: what the audit fixes, then `--set KEY=VALUE`, then the student's architecture."""
    from dpdistill.settings import parse_assignments

    return {**given, **parse_assignments(list(config.settings), kind), **_student(config, kind)}


def _epochs(config: "AuditConfig") -> dict[str, int]:
    return {} if config.epochs is None else {"epochs": config.epochs}


def _build_nonprivate(config: "AuditConfig", data: str) -> tuple[str, TeacherConfig]:
    from dpdistill.settings import parse_assignments

    return data, TeacherConfig(**{**parse_assignments(list(config.settings), TeacherConfig),
                                  "arch": config.student_arch or "scatter-linear", "seed": config.seed,
                                  "device": config.device, **_epochs(config)})


def _build_dpsgd(config: "AuditConfig", data: str) -> Any:
    from dpdistill.training.private import PrivateTrainingConfig

    values = _settings(config, PrivateTrainingConfig, student_arch="scatter-linear")
    return PrivateTrainingConfig(**{**values, "dataset": data, "method": "dpsgd", "epsilon": config.epsilon,
                                    "delta": config.delta, "seed": config.seed, "device": config.device,
                                    **_epochs(config)})


def _synthesis(method: str) -> Callable[["AuditConfig", str], Any]:
    def build(config: "AuditConfig", data: str) -> Any:
        from dpdistill.methods.datalens import synthesis_method

        chosen = synthesis_method(method)
        return chosen.build_config(config.preset, {
            "dataset": data, "epsilon": config.epsilon, "delta": config.delta, "seed": config.seed,
            "device": config.device, **_settings(config, chosen.config_type)})
    return build


def _build_pate(config: "AuditConfig", data: str) -> Any:
    from dpdistill.methods.pate import PateConfig

    return PateConfig(**{**_settings(config, PateConfig), "epsilon": config.epsilon, "delta": config.delta,
                         "dataset": data, "seed": config.seed, "device": config.device})


def _build_dgd(config: "AuditConfig", data: str) -> Any:
    from dpdistill.methods.dgd import build_dgd_config, parse_dgd_assignments

    if config.student_arch is not None:
        raise ConfigError("set DGD's student with --set student_arch=NAME")
    baseline = str(private_model_dir(data, TEACHER_DIR))  # PrivateModels.teacher, trained before the generator reads it
    return build_dgd_config(config.epsilon, baseline, None, parse_dgd_assignments(list(config.settings)),
                            delta=config.delta, dataset=data, seed=config.seed, device=config.device)


def _transcription(method: str, mode: str) -> Callable[["AuditConfig", str], Any]:
    def build(config: "AuditConfig", data: str) -> Any:
        from dpdistill.methods.config import TranscriptionConfig, build_config

        return build_config(config.preset, {"method": method, "seed": config.seed, "device": config.device,
                                             **_settings(config, TranscriptionConfig)},
                            {"mode": mode, "epsilon": config.epsilon, "delta": config.delta})
    return build


def _run_nonprivate(built: tuple[str, TeacherConfig], models: PrivateModels, out: Path,
                    progress: Progress | None) -> dict[str, Any]:
    data, teacher = built
    return jobs.train_teacher(data, out, teacher, progress)


def _run_dpsgd(built: Any, models: PrivateModels, out: Path, progress: Progress | None) -> dict[str, Any]:
    return pipeline.train_private(built, out, progress=progress)


def _run_synthesis(built: Any, models: PrivateModels, out: Path, progress: Progress | None) -> dict[str, Any]:
    return pipeline.synthesize(built, out, progress=progress)


def _run_pate(built: Any, models: PrivateModels, out: Path, progress: Progress | None) -> dict[str, Any]:
    return pipeline.pate(models.ensemble(), built, out, progress=progress)


def _run_dgd(built: Any, models: PrivateModels, out: Path, progress: Progress | None) -> dict[str, Any]:
    models.teacher()  # the baseline the faithful generator learns against
    return pipeline.dgd(models.ensemble(), built, out, progress=progress)


def _run_transcription(built: Any, models: PrivateModels, out: Path, progress: Progress | None) -> dict[str, Any]:
    return pipeline.transcribe(models.transcribed(), built, out, models.data, progress=progress)


ROUTES = {route.name: route for route in (
    Route("nonprivate", "the reference: the same student trained without privacy (train-teacher)", None, False,
          _build_nonprivate, _run_nonprivate),
    Route("dpsgd", "DP-SGD on the data (train-private)", None, True, _build_dpsgd, _run_dpsgd),
    Route("datalens", "DataLens' synthetic data and the classifier trained on it (synthesize)", None, True,
          _synthesis("datalens"), _run_synthesis, presets=True),
    Route("dp-merf", "DP-MERF's synthetic data and the classifier trained on it (synthesize)", None, True,
          _synthesis("dp-merf"), _run_synthesis, presets=True),
    Route("pate", "PATE: the ensemble's noisy votes on public images teach a student", "ensemble", True,
          _build_pate, _run_pate),
    Route("dgd", "faithful DGD: the generator learns against a teacher on all the data (NO formal guarantee)",
          "ensemble", True, _build_dgd, _run_dgd),
    Route("dpsd", "DPSD transcription of the teacher (--teachers N: of an ensemble)", "single", True,
          _transcription("dpsd", "data"), _run_transcription, presets=True),
    Route("dpdfd", "DPDFD transcription of the teacher", "single", True, _transcription("dpdfd", "data"),
          _run_transcription, presets=True),
    Route("srr", "DP-DFD with selective randomized response (NO formal guarantee)", "single", True,
          _transcription("srr", "label"), _run_transcription, presets=True),
)}


def route_named(name: str) -> Route:
    if name not in ROUTES:
        raise ConfigError(f"unknown audited route {name!r}: choose one of {', '.join(ROUTES)}")
    return ROUTES[name]


def check_route(config: "AuditConfig") -> None:
    """The audit's options against its route, in one line each."""
    route = route_named(config.method)
    if route.takes_epsilon and config.epsilon is None:
        raise PrivacyParameterError(f"auditing {config.method} needs its privacy budget --epsilon")
    if not route.takes_epsilon and config.epsilon is not None:
        raise ConfigError("the non-private reference has no epsilon: drop --epsilon")
    if route.teachers is None and config.teachers is not None:
        raise ConfigError(f"the {config.method} route reads the data itself, not teachers: drop --teachers")
    if route.teachers == "ensemble" and config.teachers is not None and config.teachers < 2:
        raise ConfigError(f"the {config.method} route asks an ensemble: --teachers must be at least 2")
    if config.epochs is not None and config.method not in ("nonprivate", "dpsgd"):
        raise ConfigError(f"--epochs is the nonprivate and dpsgd students': set the {config.method} route's "
                          f"schedule with --set")
    if config.preset is not None and not route.presets:
        raise ConfigError(f"the {config.method} route has no presets: drop --preset")
