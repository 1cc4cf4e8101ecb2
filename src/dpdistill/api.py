"""dpdistill from Python: `load_model`, and one call per command with the command line's defaults.

Every call takes keyword arguments named as the command's options (underscores for dashes; a command's knobs are
the fields of its configuration class, with that class's defaults) and returns what the command wrote: `out`, the
`report` it saved, and the model it made, loaded as an `nn.Module`.

Images are what dpdistill's data sets hold: float tensors (N, C, H, W) in [-1, 1]. Every model `load_model` gives
takes them so and returns logits; an imported teacher applies its own input transform inside (its range and
normalisation from `import_teacher`), so the same images serve every model, as in `evaluate`.

A call prints nothing unless asked: `progress=True` shows its progress on stderr as the command does (a bar on a
terminal, plain lines in a log); a callable gets every progress record (a dict such as {"epoch": 3, "total": 10,
"test_accuracy": 0.9}) instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from torch import nn

from dpdistill import jobs
from dpdistill.commands import DECLARED
from dpdistill.defaults import PUBLIC_POOL_SIZE, TEACHER_MIN_STEPS
from dpdistill.errors import ConfigError
from dpdistill.methods.release import TEACHER_DIR
from dpdistill.models.checkpoint import (ENCODER, STUDENT, load_classifier, load_conditional_generator, load_generator,
                                         read_meta)
from dpdistill.models.ensemble import load_saved
from dpdistill.models.transform import DPDISTILL_RANGE, input_transform_spec
from dpdistill.privacy.ledger import DEFAULT_DELTA, Budget, ReleaseLedger
from dpdistill.privacy.provenance import ADD_REMOVE, Provenance
from dpdistill.progress import Progress, shown


@dataclass(frozen=True)
class Result:
    """What a command wrote (`out`) and reported (`report`: its report.json, or evaluate's JSON)."""

    out: Path
    report: dict[str, Any]


@dataclass(frozen=True)
class ModelResult(Result):
    """A teacher, teacher ensemble or encoder, loaded from `out`."""

    model: nn.Module


@dataclass(frozen=True)
class StudentResult(Result):
    """A private student, loaded from `out`."""

    student: nn.Module


def api_name(command: str) -> str:
    """The Python function of a command: `train-private` -> train_private, `federated serve` -> federated_serve."""
    return command.replace("-", "_").replace(" ", "_")


def declared(name: str, result: Callable[[Path, dict[str, Any]], Result]) -> Callable[..., Result]:
    """The API function of the command `name` declares (dpdistill/commands.py): its keyword arguments, defaults and
    docstring are the command's options; `result` makes what it returns from the output directory and report."""
    spec = DECLARED[name].spec()

    def call(*args: Any, progress: Progress | bool = False, **given: Any) -> Result | None:
        values = spec.values({**dict(zip(spec.positional, args)), **given})
        config = spec.configure(values)
        with shown(progress, spec.name) as shown_to:
            report = spec.run(values, config, shown_to)
        return None if report is None else result(Path(values["out"]), report)  # None: torchrun's other ranks

    call.__signature__, call.__doc__ = spec.api_signature(), spec.api_doc()
    call.__name__ = call.__qualname__ = api_name(name)
    return call


def _student(out: Path, report: dict[str, Any]) -> StudentResult:
    return StudentResult(out, report, load_model(out, STUDENT))


transcribe = declared("transcribe", _student)
pate = declared("pate", _student)
train_private = declared("train-private", _student)
federated = declared("federated", _student)
federated_serve = declared("federated serve", _student)
federated_finish = declared("federated finish", _student)
dgd = declared("dgd", _student)


def load_model(path: str | Path, name: str | None = None) -> nn.Module:
    """The model saved in `path`, in eval mode: a teacher (trained or imported), a teacher ensemble, or a run's
    student; `name` picks another checkpoint of the directory (its file stem). It takes images in [-1, 1], as
    `evaluate` feeds them, and applies its own input transform."""
    return load_saved(Path(path), name)[0]


def train_teacher(dataset: str, out: str | Path, *, partitions: int = 1, dirichlet_alpha: float | None = None,
                  resume: bool = False, overwrite: bool = False, budget: float | None = None,
                  budget_delta: float = DEFAULT_DELTA, progress: Progress | bool = False,
                  **options: Any) -> ModelResult:
    """`dpdistill train-teacher`: one teacher, or with `partitions` > 1 an ensemble; `options` are TeacherConfig's
    fields (arch, epochs, batch_size, lr, min_steps, init, heads_only, ...)."""
    from dpdistill.training.teacher import TeacherConfig

    out = Path(out)
    total = None if budget is None else Budget(budget, budget_delta)  # refused before hours of training
    config = TeacherConfig(**{"min_steps": TEACHER_MIN_STEPS, **options})
    if partitions == 1 and (dirichlet_alpha is not None or config.heads_only):
        raise ConfigError("dirichlet_alpha and heads_only shape an ensemble: use them with partitions > 1")
    if partitions > 1 or resume:
        with shown(progress, "train-teacher") as shown_to:
            report = jobs.train_teacher_ensemble(dataset, out, config, partitions, dirichlet_alpha, shown_to, resume,
                                                 overwrite)
    else:
        with shown(progress, "train-teacher") as shown_to:
            report = jobs.train_teacher(dataset, out, config, shown_to, overwrite)
    if total is not None:
        ReleaseLedger(out).set_total(total.epsilon, total.delta)
    return ModelResult(out, report, load_model(out))


def import_teacher(factory: str, weights: str | Path, dataset: str, out: str | Path, *,
                   input_range: Sequence[float] = DPDISTILL_RANGE, mean: Sequence[float] | None = None,
                   std: Sequence[float] | None = None, overwrite: bool = False, dp_epsilon: float | None = None,
                   dp_delta: float = DEFAULT_DELTA, dp_relation: str = ADD_REMOVE,
                   code: str | Path | None = None) -> ModelResult:
    """`dpdistill import-teacher`: the network `factory` builds (`file.py:callable` or `module:callable`) with the
    safetensors `weights`, as a teacher in `out`; `input_range`, `mean` and `std` describe the inputs it was
    trained on (mean and std: one value, or one per channel). `dp_epsilon` (with `dp_delta`, `dp_relation`): the
    DP guarantee its owner declares it was trained under; reported as that claim, not verified. `code`: the folder
    of the model's code kept with it (default: the factory file's own folder)."""
    out = Path(out)
    transform = input_transform_spec(input_range, mean, std)
    declared = None if dp_epsilon is None else Provenance.declared(dp_epsilon, dp_delta, dp_relation)
    report = jobs.import_teacher(factory, Path(weights), dataset, out, transform, overwrite, declared,
                                 None if code is None else Path(code))
    return ModelResult(out, report, load_model(out))


def pretrain(dataset: str, out: str | Path, *, public: str | None = None, public_size: int = PUBLIC_POOL_SIZE,
             overwrite: bool = False, progress: Progress | bool = False, **options: Any) -> ModelResult:
    """`dpdistill pretrain`: a contrastive encoder on the public pool; `options` are ContrastiveConfig's fields
    (arch, steps, batch_size, temperature, lr, seed, device)."""
    from dpdistill.training.self_supervised import ContrastiveConfig

    out = Path(out)
    with shown(progress, "pretrain") as shown_to:
        report = jobs.pretrain(dataset, public, public_size, ContrastiveConfig(**options), out, shown_to, overwrite)
    return ModelResult(out, report, load_classifier(out, ENCODER, kind="encoder")[0])


def audit(dataset: str, out: str | Path, *, method: str = "dpsgd", overwrite: bool = False,
          progress: Progress | bool = False, **options: Any) -> dict[str, Any]:
    """`dpdistill audit`: `options` are AuditConfig's fields (canaries, epsilon, delta, student_arch, epochs,
    teachers, teacher_arch, preset, settings, inversion, shadows, white_box, seed, device); the report, whose
    `audit` holds the epsilon lower bound beside the claimed `privacy.epsilon`."""
    from dpdistill.audit.run import AuditConfig, run_audit

    with shown(progress, "audit") as shown_to:
        return run_audit(AuditConfig(dataset=dataset, method=method, **options), Path(out), shown_to, overwrite)


@dataclass(frozen=True)
class SyntheticResult(StudentResult):
    """A private synthetic set, `out / "synthetic.npz"` (arrays x, y), the classifier trained on it (`student`), and
    its generator: DataLens' `generator(latents, classes)`, latents uniform in [-1, 1]; teacher-guided's
    `generator(latents)`, latents standard normal, as a release's; None for dp-merf, whose images are fitted
    directly."""

    generator: nn.Module | None


@dataclass(frozen=True)
class ReleaseResult(SyntheticResult):
    """A release: the student, the generator it was transcribed with (`generator(latents)`, latents standard normal
    of its `latent_dim`), the DP teacher (in `out / "teacher"`), and the synthetic set `out / "synthetic.npz"`."""

    teacher: nn.Module


def _release(out: Path, report: dict[str, Any]) -> ReleaseResult:
    return ReleaseResult(out, report, load_model(out, STUDENT), load_generator(out)[0],
                         load_model(out / TEACHER_DIR, STUDENT))


release = declared("release", _release)


def _synthetic(out: Path, report: dict[str, Any]) -> SyntheticResult:
    if not (out / "generator.safetensors").exists():
        return SyntheticResult(out, report, load_model(out, STUDENT), None)
    if read_meta(out, "generator")["kind"] == "generator":  # teacher-guided: the release's run
        return _release(out, report)
    return SyntheticResult(out, report, load_model(out, STUDENT), load_conditional_generator(out)[0])


synthesize = declared("synthesize", _synthetic)


def evaluate(model: str | Path, dataset: str, *, name: str | None = None) -> Result:
    """`dpdistill evaluate`: the accuracy of the model in `model` (a directory) on `dataset`'s test split, which
    images it was measured on (`measured_on`) and `warnings`; `out` is the directory evaluated."""
    return Result(Path(model), jobs.evaluate(Path(model), dataset, name))
