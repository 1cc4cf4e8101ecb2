"""The routes an audit can run on its canaried data, each exactly as a user runs it from the command line.

Each route is declared beside its method, with the method's command (`options.AuditRoute` in a `CommandSpec`), and
runs through that command's own `configure` and `run`; the audit adds only its reference, `nonprivate`. A route is
two steps: `build` makes the route's own config from the audit's (before anything is written, so a wrong setting
costs nothing), `run` trains what the route starts from and runs it. Teacher routes start from non-private models
trained on the audited data (a teacher, or an ensemble of linear heads on scattering features, one per partition,
as the scattering rows of the benchmarks): the canaries then sit in the teacher's training set or in one member's
partition, where the route's guarantee has to hide them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from dpdistill import jobs
from dpdistill.commands import DECLARED
from dpdistill.errors import ConfigError, PrivacyParameterError
from dpdistill.options import AuditRoute, CommandSpec
from dpdistill.progress import Progress
from dpdistill.settings import parse_assignments
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

    def prepare(self, kind: str) -> str:
        """The path of an input of kind "data", "teacher", "ensemble" or "transcribed", its model trained first."""
        return self.data if kind == "data" else str(getattr(self, kind)())


def input_path(kind: str, config: "AuditConfig", data: str) -> str:
    """Where the input of `kind` (as `PrivateModels.prepare`) will be, before anything is trained."""
    if kind == "transcribed":
        kind = "ensemble" if config.teacher_count > 1 else "teacher"
    return data if kind == "data" else str(private_model_dir(data, {"teacher": TEACHER_DIR,
                                                                   "ensemble": ENSEMBLE_DIR}[kind]))


@dataclass(frozen=True)
class Route:
    """One audited route: how it reads the data (`teachers`: None, its own data; "single" or "ensemble", the
    default teacher count), whether it takes a budget, and its two steps."""

    name: str
    summary: str
    teachers: str | None
    takes_epsilon: bool
    build: Callable[["AuditConfig", str, Path], Any]
    run: Callable[[Any, PrivateModels, Progress | None], dict[str, Any]]
    presets: bool = False  # whether --preset names one of the route's presets
    epochs: bool = False  # whether --epochs sets the route's epochs

    @property
    def default_teachers(self) -> int | None:
        return {None: None, "single": 1, "ensemble": ENSEMBLE_DEFAULT}[self.teachers]


def _build_nonprivate(config: "AuditConfig", data: str, out: Path) -> tuple[str, TeacherConfig, Path]:
    epochs = {} if config.epochs is None else {"epochs": config.epochs}
    return data, TeacherConfig(**{**parse_assignments(list(config.settings), TeacherConfig),
                                  "arch": config.student_arch or "scatter-linear", "seed": config.seed,
                                  "device": config.device, **epochs}), out


def _run_nonprivate(built: tuple[str, TeacherConfig, Path], models: PrivateModels,
                    progress: Progress | None) -> dict[str, Any]:
    data, teacher, out = built
    return jobs.train_teacher(data, out, teacher, progress)


NONPRIVATE = Route("nonprivate", "the reference: the same student trained without privacy (train-teacher)", None,
                   False, _build_nonprivate, _run_nonprivate, epochs=True)


def declared_route(spec: CommandSpec, audit: AuditRoute) -> Route:
    """The route `audit` declares, run through `spec`'s own configure and run: the audit's options become the
    command's values (its epsilon, delta, seed and device; --set as the command's; --preset, --student-arch and
    --epochs where it has them), the inputs the audited data and the models trained on it."""
    kinds = set(audit.inputs.values())
    teachers = "ensemble" if "ensemble" in kinds else "single" if kinds & {"teacher", "transcribed"} else None

    def build(config: "AuditConfig", data: str, out: Path) -> tuple[dict[str, Any], Any]:
        given = {**audit.defaults, "out": out, **spec.assignments(list(config.settings))}
        given |= {name: getattr(config, name) for name in ("epsilon", "delta", "seed", "device") if spec.accepts(name)}
        if config.preset is not None:
            given["preset"] = config.preset
        if config.student_arch is not None:
            if not spec.accepts("student_arch"):
                raise ConfigError(f"the {audit.name} route sets its own student: drop --student-arch")
            given["student_arch"] = config.student_arch
        if config.epochs is not None:
            given["epochs"] = config.epochs
        given |= {name: input_path(kind, config, data) for name, kind in audit.inputs.items()} | audit.fixed
        values = spec.values(given)
        return values, spec.configure(values)

    def run(built: tuple[dict[str, Any], Any], models: PrivateModels, progress: Progress | None) -> dict[str, Any]:
        for kind in dict.fromkeys(audit.inputs.values()):  # trained here, after the audit's checks and canaries
            models.prepare(kind)
        values, config = built
        return spec.run(values, config, progress)

    return Route(audit.name, audit.summary, teachers, spec.accepts("epsilon"), build, run,
                 presets=spec.accepts("preset"), epochs=audit.epochs)


def routes() -> dict[str, Route]:
    """Every audited route: the reference, then those the declared commands name (importing their methods)."""
    declared = [declared_route(spec, audit) for spec in (entry.spec() for entry in DECLARED.values())
                for audit in spec.audits]
    return {route.name: route for route in (NONPRIVATE, *declared)}


def route_named(name: str) -> Route:
    known = routes()
    if name not in known:
        raise ConfigError(f"unknown audited route {name!r}: choose one of {', '.join(known)}")
    return known[name]


def check_route(config: "AuditConfig") -> None:
    """The audit's options against its route, in one line each."""
    route = route_named(config.method)
    if route.takes_epsilon and config.epsilon is None:
        raise PrivacyParameterError(f"auditing {config.method} needs its privacy budget --epsilon")
    if not route.takes_epsilon and config.epsilon is not None:
        raise ConfigError(f"the {config.method} route has no epsilon: drop --epsilon")
    if route.teachers is None and config.teachers is not None:
        raise ConfigError(f"the {config.method} route reads the data itself, not teachers: drop --teachers")
    if route.teachers == "ensemble" and config.teachers is not None and config.teachers < 2:
        raise ConfigError(f"the {config.method} route asks an ensemble: --teachers must be at least 2")
    if config.epochs is not None and not route.epochs:
        raise ConfigError(f"--epochs is the nonprivate and dpsgd students': set the {config.method} route's "
                          f"schedule with --set")
    if config.preset is not None and not route.presets:
        raise ConfigError(f"the {config.method} route has no presets: drop --preset")
