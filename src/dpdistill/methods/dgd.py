"""DGD (Wang et al., "Learning Privacy-Preserving Student Networks via Discriminative-Generative Distillation",
TIP 2023; seed 004) as a method, `dpdistill dgd`: PATE's noisy votes on synthetic images, and a student that also
learns from every synthetic image through a VAE of them.

1. Generate (faithful, `--baseline DIR`): a generator learns data-free against the baseline, a classifier trained
   without noise on all the private data (DAFL's terms; training/data_free.py), and makes as many images as there
   are private examples. The baseline is read without protection: neither these images nor anything learnt from
   them has a formal guarantee. Covered: the images of a sample source (`--sample-source`, a `dpdistill
   synthesize` output) or public images instead, and no baseline.
2. Ask: the teacher ensemble (disjoint partitions) labels a few of them by noisy votes: LNMax, argmax of the votes
   plus Laplace noise of scale 2 / eps0 = 40 (faithful: the seed's setting), or GNMax calibrated to the budget
   (covered: DGD+); the answers compose (privacy/accounting.py), with the sample source's release where there is
   one. The control (`--set vote_noise=none`) asks about every image and releases the exact votes: what the
   pipeline learns without privacy, reported as NOT private.
3. Learn (`--preset paper`): a VAE (latent 32) is fitted to the images; each becomes a triple (its reconstruction,
   the reconstruction from its code moved along the manifold and across it) and the student learns from the answers
   by cross-entropy and from the triples by feature consistency and prediction entropy (losses/tangent_normal.py).
   By default (`--preset fixed`) a scatter-linear student learns from the answers alone, and the generator also
   matches the baseline's BatchNorm statistics: the seed's own student learns 24% from exact votes on every image,
   this one 83% (docs/methods/dgd.md).
Steps 2 and 3 are PATE's (methods/pate.py) with DGD's settings; this module adds the generative stream and says
what the guarantee covers. The seed's generative-stream analysis (Laplace noise on the VAE's latent codes, eps1 =
0.01) protects the synthetic images, not the baseline they came from: it appears only as a paper formula.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dp_accounting
import torch
from safetensors.torch import load_file, save_file

from dpdistill.atomic import write_atomically
from dpdistill.data.sample_source import SampleSource
from dpdistill.errors import CheckpointError, ConfigError, PrivacyParameterError
from dpdistill.methods.base import Outcome, Source
from dpdistill.methods.lifecycle import execute
from dpdistill.methods.pate import EXACT_VOTES, PATE, PateConfig, PateJob
from dpdistill.methods.teachers import data_digest, read_teacher
from dpdistill.models.base import Classifier
from dpdistill.options import (AuditRoute, ENSEMBLE_HELP, OVERWRITE_OPTION, RESUME_FROM_ANSWERS_HELP,
                               SAMPLE_SOURCE_HELP, SETTINGS, CommandSpec, Option, field_options, out_option,
                               resume_option, set_option)
from dpdistill.privacy.accounting import DiscreteLaplaceQuery
from dpdistill.privacy.ledger import Release, UncoveredRead
from dpdistill.privacy.selection import FASHION_MNIST, Selection, selection_notes, with_selection
from dpdistill.progress import Progress
from dpdistill.reporting.pate import dgd_markdown
from dpdistill.reporting.report import save_image_grid
from dpdistill.runs import release_state
from dpdistill.settings import parse_assignments
from dpdistill.training.data_free import (DataFreeConfig, check_batchnorm_term, generate,
                                         train_data_free_generator)

PAPER_QUERIES = {1.0: 27, 10.0: 1300}  # the seed's answers at epsilon 1 and 10 (Tables II, III)
PAPER_LAPLACE_SCALE = 40  # 2 / eps0
PAPER_EPSILON1 = 0.01  # the seed's generative-stream budget (latent Laplace noise)
PAPER_ROUNDS = 500  # the seed's "iteration rounds" of its VAE and student
# `--preset`: the departures its control showed to transfer without noise (the default: the seed's own student
# learns 24% from exact votes, these 83%), or the seed's settings
DEFAULT_PRESET = "fixed"
PRESETS: dict[str, dict[str, Any]] = {
    # the seed's student (section IV): "the learning rate is first set to 0.001 and decays linearly with iteration
    # round to 0", and Eq. 6's distances between the backbone features themselves
    "paper": {"student_schedule": "linear", "feature_distance": "raw"},
    "fixed": {"generator_batchnorm_weight": 1.0, "student_arch": "scatter-linear", "student_training": "supervised",
              "augment_shift": 0},
}
FIXED_SELECTION = Selection("the settings of DGD's `fixed` preset", PRESETS[DEFAULT_PRESET],
                            "Fashion-MNIST (a control of exact votes, without noise)", FASHION_MNIST)
GENERATOR_STATE = "generator.safetensors"
GENERATOR_PREFIX = "generator_"  # `--set generator_steps=...` sets DataFreeConfig's steps
SAMPLES_SHOWN = 64


def baseline_read(baseline: str) -> UncoveredRead:
    return UncoveredRead(
        f"the private data, through the non-private baseline {baseline} read without noise by DGD's generator",
        "NO formal guarantee for the student or the synthetic images: the generator learnt from a classifier trained "
        "on the private data without noise; the stated epsilon covers only the ensemble's noisy answers given those "
        "images")


@dataclass(frozen=True)
class DgdConfig:
    """A DGD run: PATE's settings for the answers and the student (`labelling`, with DGD's defaults), and the
    generative stream's."""

    labelling: PateConfig
    baseline: str | None = None  # faithful: the classifier the generator learns against (no formal guarantee)
    generator: DataFreeConfig = DataFreeConfig()
    synthetic_size: int | None = None  # images the generator makes; None: as many as the private examples

    def __post_init__(self) -> None:
        if self.baseline is not None and (self.labelling.sample_source is not None
                                          or self.labelling.public is not None):
            raise ConfigError("--baseline makes DGD's own images: drop --sample-source (the covered variant) or "
                              "--public")
        if self.synthetic_size is not None and (self.baseline is None or self.synthetic_size < 1):
            raise ConfigError("synthetic_size counts the images the baseline-trained generator makes: it needs "
                              "--baseline and must be at least 1")

    @property
    def seed(self) -> int:
        return self.labelling.seed

    @property
    def faithful(self) -> bool:
        return self.baseline is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def settings(self) -> dict[str, Any]:
        """Its settings under the names `--set` gives them: PATE's, and the generator's prefixed."""
        generator = {GENERATOR_PREFIX + key: value for key, value in dataclasses.asdict(self.generator).items()}
        return {**dataclasses.asdict(self.labelling), **generator}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "DgdConfig":
        try:
            generator = {**values["generator"], "width": tuple(values["generator"]["width"])}
            return cls(PateConfig.from_dict(values["labelling"]), values["baseline"], DataFreeConfig(**generator),
                       values["synthetic_size"])
        except (KeyError, TypeError) as error:
            raise ConfigError(f"the saved configuration does not describe a DGD run ({error})") from error


def paper_labelling(epsilon: float | None, faithful: bool) -> dict[str, Any]:
    """DGD's settings of the answers and the student: the seed's answer count for its budget (27 at epsilon 1,
    1,300 at 10), LNMax at 2 / eps0 = 40 (faithful) or GNMax calibrated to the budget (covered, DGD+), the
    tangent-normal student (cnn, the teachers' structure in the seed) without self-training, the VAE and the student
    trained for the seed's 500 rounds (read as steps of its batch of 128, each with as many triples; the seed does
    not give the ratio)."""
    values: dict[str, Any] = {"student_training": "tangent-normal", "student_arch": "cnn", "self_training_rounds": 0,
                              "entropy_weight": 1.0, "answer_targets": "argmax", "batch_size": 128,
                              "consistency_steps": PAPER_ROUNDS, "vae_steps": PAPER_ROUNDS, "unlabelled_ratio": 1}
    if epsilon in PAPER_QUERIES:
        values["queries"] = PAPER_QUERIES[epsilon]
    if faithful:
        values |= {"vote_noise": "laplace", "sigma": float(PAPER_LAPLACE_SCALE)}
    return values


def parse_dgd_assignments(assignments: list[str]) -> dict[str, Any]:
    """The CLI's `--set KEY=VALUE` as typed settings: KEY a PATE setting, `synthetic_size`, or `generator_` and a
    generator setting (`generator_steps=500`)."""
    values: dict[str, Any] = {}
    for item in assignments:
        key = item.split("=")[0].strip().replace("-", "_")
        if key.startswith(GENERATOR_PREFIX):
            generator = parse_assignments([item.strip()[len(GENERATOR_PREFIX):]], DataFreeConfig)
            values |= {GENERATOR_PREFIX + name: value for name, value in generator.items()}
        else:
            values |= parse_assignments([item], DgdConfig if key == "synthetic_size" else PateConfig)
    return values


def build_dgd_config(epsilon: float | None, baseline: str | None = None, sample_source: str | None = None,
                     settings: dict[str, Any] | None = None, preset: str | None = None, **pate: Any) -> DgdConfig:
    """DGD's defaults (`paper_labelling`), then the preset's settings, then `settings` (PATE's fields,
    `synthetic_size`, `generator_`-prefixed generator fields) and `pate` (PateConfig's fields given by name: delta,
    seed, device...)."""
    preset = preset or DEFAULT_PRESET
    if preset not in PRESETS:
        raise ConfigError(f"unknown DGD preset {preset!r}: choose {', '.join(PRESETS)}")
    given = {**PRESETS[preset], **(settings or {}), **pate}
    control = given.get("vote_noise") == EXACT_VOTES
    if epsilon is None and not control:
        raise PrivacyParameterError("a privacy budget --epsilon is required (or the control: --set vote_noise=none)")
    generator = {key[len(GENERATOR_PREFIX):]: value for key, value in given.items() if key.startswith(GENERATOR_PREFIX)}
    synthetic_size = given.pop("synthetic_size", None)
    labelling = paper_labelling(epsilon, baseline is not None)
    if given.get("vote_noise") in ("gaussian", EXACT_VOTES) and "sigma" not in given:
        labelling.pop("sigma", None)  # the seed's Laplace scale is no Gaussian sigma (nor any noise's, the control's)
    labelling |= {key: value for key, value in given.items() if not key.startswith(GENERATOR_PREFIX)}
    if control and "queries" not in labelling:
        if synthetic_size is None:
            raise ConfigError("the control asks about every synthetic image: give their count, --set queries=N (the "
                              "training set's size unless --set synthetic_size=N)")
        labelling["queries"] = synthetic_size
    if "queries" not in labelling:
        raise ConfigError(f"the seed states its answer counts at epsilon 1 and 10 only ({PAPER_QUERIES[1.0]} and "
                          f"{PAPER_QUERIES[10.0]}): give the answer count (--set queries=N) at epsilon {epsilon}")
    try:
        return DgdConfig(PateConfig(**{**labelling, "epsilon": epsilon, "sample_source": sample_source}), baseline,
                         DataFreeConfig(**generator), synthetic_size)
    except TypeError as error:
        raise ConfigError(f"unknown DGD setting ({error})") from None


def paper_epsilon(answers: int, scale: float, delta: float) -> float:
    """The seed's Theorem: |Ds| eps0^2 + eps0 sqrt(-2 |Ds| log delta) + eps1, eps0 = 2 / scale (a paper formula:
    it states the answers' cost and the latent-noise step's, never the baseline's)."""
    eps0 = 2 / scale
    return answers * eps0 ** 2 + eps0 * math.sqrt(-2 * answers * math.log(delta)) + PAPER_EPSILON1


class DGD(PATE):
    """PATE's lifecycle (its config kept under "dgd", resumable once its answers are released, and from its saved
    generator) with DGD's job and report."""

    name = "dgd"
    summary = ("DGD: an ensemble labels a few synthetic images by noisy votes (LNMax); a student learns from them and "
               "from every image through a VAE's tangent and normal neighbours")
    command = "dgd"
    paper = "Wang et al., Discriminative-Generative Distillation (TIP 2023), seed 004"  # its settings: --preset paper
    config_type = DgdConfig

    def plan(self, source: Source, config: DgdConfig, out_dir: Path, progress: Progress | None) -> "DgdJob":
        return DgdJob(source.teacher, config, release_state(out_dir), progress)

    def markdown(self, report: dict[str, Any]) -> str:
        return dgd_markdown(report)


class DgdJob(PateJob):
    """PATE's answers and student on DGD's images: the baseline-trained generator's (faithful) or a covered
    source's."""

    def __init__(self, teacher_dir: Path, config: DgdConfig, state_dir: Path, progress: Progress | None) -> None:
        super().__init__(teacher_dir, config.labelling, state_dir, progress, public_pool=not config.faithful)
        self.config = self.dgd = config
        self.baseline: Classifier | None = None
        if config.faithful:
            self.baseline = self._read_baseline(Path(config.baseline))
            check_batchnorm_term(self.baseline, config.generator, f"--baseline {config.baseline}",
                                 f"give --preset paper or --set generator_batchnorm_weight=0 (--preset "
                                 f"{DEFAULT_PRESET} sets it to 1)")
            # as many images as private examples, counted by the data set's declared size: the exact count is private
            self.synthetic_size = config.synthetic_size or self.evaluation.declared_size
            if self.synthetic_size is None:
                raise ConfigError(f"{self.dataset_name} declares no training-set size: give the number of images "
                                  f"DGD's generator makes with --set synthetic_size=N (the exact count is private)")
            if config.labelling.queries > self.synthetic_size:
                raise ConfigError(f"{config.labelling.queries} queries need at least as many synthetic images; "
                                  f"synthetic_size is {self.synthetic_size}")
            self.uncovered = [baseline_read(config.baseline), *self.uncovered]
            # the baseline's own ledger records the read: unbounded, refused where it has a total
            self.also_reads = [(Path(config.baseline), Release(dp_accounting.NonPrivateDpEvent(), config.labelling.delta,
                                                               math.inf))]

    def _read_baseline(self, baseline_dir: Path) -> Classifier:
        """The baseline, refused unless it is one classifier on the ensemble's inputs and classes."""
        if not baseline_dir.is_dir():
            raise ConfigError(f"--baseline {baseline_dir} is not a directory: give a `dpdistill train-teacher` --out")
        model, meta = read_teacher(baseline_dir)
        if not isinstance(model, Classifier):
            raise ConfigError(f"--baseline {baseline_dir} holds an ensemble; DGD's baseline is one classifier trained "
                              f"on all the private data (dpdistill train-teacher without --partitions)")
        if tuple(meta["in_shape"]) != self.in_shape or int(meta["num_classes"]) != self.evaluation.num_classes:
            raise ConfigError(f"--baseline {baseline_dir} takes {tuple(meta['in_shape'])} with "
                              f"{meta['num_classes']} classes, the ensemble {self.in_shape} with "
                              f"{self.evaluation.num_classes}")
        return model

    def run(self, resume: bool) -> Outcome:
        started = time.perf_counter()
        generative = self._generate(resume) if self.dgd.faithful else {}
        outcome = super().run(resume)
        labelling = self.privacy_plan.query
        privacy = dict(outcome.privacy)
        scale = self.privacy_plan.sigma
        if self.dgd.faithful:
            privacy.pop("sample_source", None)  # the images are DGD's own, described in `generative`
        if isinstance(labelling, DiscreteLaplaceQuery):  # the seed's LNMax, whose figure its Theorem states
            privacy |= {"paper_epsilon": paper_epsilon(self.pate.queries, scale, self.pate.delta),
                        "paper_epsilon_label": f"paper formula: seed 004's Theorem at 2 / eps0 = {scale:g} and eps1 "
                                               f"= {PAPER_EPSILON1}, which leaves out the baseline"}
        privacy = with_selection(privacy, selection_notes((FIXED_SELECTION,), self.dgd.settings(),
                                                          data_digest(self.meta, self.evaluation)))
        report = {**outcome.report, "generative": generative, "labelling_query": type(labelling).__name__,
                  "timing": {**outcome.report["timing"], "wall_seconds": time.perf_counter() - started}}
        write_pate_files = outcome.write_files

        def write_files(out_dir: Path, written: dict[str, Any]) -> None:
            write_pate_files(out_dir, written)
            if self.source is not None:
                save_image_grid(self.source.images[:SAMPLES_SHOWN], out_dir / "samples.png", columns=16)

        return dataclasses.replace(outcome, report=report, privacy=privacy, write_files=write_files)

    def _generate(self, resume: bool) -> dict[str, Any]:
        """Train (or, resuming, reload) the generator against the baseline; its images become the pool."""
        config, seed, device = self.dgd.generator, self.pate.seed, self.pate.device
        path = self.state_dir / GENERATOR_STATE
        report: dict[str, Any] = {"baseline": self.dgd.baseline, "images": self.synthetic_size}
        if resume:
            generator = config.build(self.in_shape)
            try:
                generator.load_state_dict(load_file(path))
            except (OSError, RuntimeError) as error:
                raise CheckpointError(f"the run's generator in {path} cannot be read ({error}): its answers name "
                                      f"images only it makes; start a new run elsewhere") from error
            generator = generator.to(device).eval()
        else:
            generator, report["training"] = train_data_free_generator(self.baseline, self.in_shape, config, seed,
                                                                      device, self.progress)
            self.state_dir.mkdir(parents=True, exist_ok=True)
            weights = {name: tensor.detach().cpu().contiguous() for name, tensor in generator.state_dict().items()}
            write_atomically({path: lambda temporary: save_file(weights, temporary)})
        images = generate(generator, self.synthetic_size, seed, device, self.progress)
        unlabelled = torch.zeros(len(images), dtype=torch.long)  # the generator is unconditional
        self.source = SampleSource(Path(self.dgd.baseline), "dgd data-free generator", self.dataset_name, images,
                                   unlabelled, Release(dp_accounting.NonPrivateDpEvent(), 1.0, math.inf), False)
        return report


def run_dgd(teacher_dir: Path, config: DgdConfig | None, out_dir: Path, resume: bool = False,
            progress: Progress | None = None, overwrite: bool = False) -> dict[str, Any]:
    """DGD: PATE's answers and a tangent-normal student on the images of a generator trained against
    `config.baseline` (no formal guarantee) or of a covered source. With `resume`, the run saved in `out_dir`
    continues from its released answers (and saved generator) with its saved settings."""
    return execute(DGD(), Source(teacher_dir), None if resume else config, out_dir, resume, overwrite, progress)


def _configure(values: dict[str, Any]) -> DgdConfig | None:
    """A fresh run's settings: DGD's defaults, then --set's (or the API's keywords); a resumed run's saved ones."""
    if values["resume"]:
        saved = DGD().interrupted(Path(values["out"]))
        return None if saved is None else saved[1]
    paths = {name: None if values[name] is None else str(values[name]) for name in ("baseline", "sample_source")}
    return build_dgd_config(values["epsilon"], paths["baseline"], paths["sample_source"],
                            {**parse_dgd_assignments(values["set_"]), **values.get(SETTINGS, {}),
                             **({"accept_noise": True} if values["accept_noise"] else {})},
                            values["preset"], delta=values["delta"], seed=values["seed"], device=values["device"],
                            reproducible_noise=values["reproducible_noise"])


COMMAND = CommandSpec(
    name="dgd", help="DGD: noisy votes and a VAE teach a student.\n\nAn ensemble labels a few synthetic images by "
                     "noisy votes; a student learns from them and, through a VAE of the images, from every one. With "
                     "--baseline the images come from a generator trained against it (faithful, no formal "
                     "guarantee); with --sample-source from a covered generator; with neither, public images "
                     "(covered).",
    options=(Option("teacher", Path, help=ENSEMBLE_HELP, field=False),
             out_option("directory for student.safetensors, answers.safetensors, samples.png, report.json and "
                        "report.md"),
             Option("epsilon", float | None, None, "privacy budget of the answers (with a sample source: of the "
                                                   "source and the answers together); none for the control, --set "
                                                   "vote_noise=none (exact votes, NOT private)", field=False),
             Option("baseline", Path | None, None, "faithful DGD: a classifier trained on all the private data "
                                                   "(train-teacher --out); the generator learns against it without "
                                                   "noise, so NO formal guarantee", field=False),
             Option("sample_source", Path | None, None, SAMPLE_SOURCE_HELP, field=False),
             Option("preset", str | None, None, "fixed (the default), the departures that make its pipeline "
                                                "learn without noise: the generator matches the baseline's "
                                                "BatchNorm statistics, a supervised scatter-linear student (the "
                                                "teachers' structure) on the images as they were answered (no "
                                                "shift); paper, the seed's settings; --set overrides either",
                    field=False),
             *field_options(PateConfig, ("delta",)),
             set_option("any setting, KEY=VALUE (repeatable): a `pate` option (queries=27), synthetic_size, or "
                        "generator_ and a generator setting (generator_steps=500)"),
             Option("accept_noise", bool, False, "run even where the answers would be near random (refused by "
                                                 "default: even a unanimous vote would rarely survive the noise)",
                    flags=("--accept-noise",), show_default=False, field=False),
             *field_options(PateConfig, ("seed", "reproducible_noise", "device")),
             resume_option(RESUME_FROM_ANSWERS_HELP), OVERWRITE_OPTION),
    configure=_configure,
    run=lambda values, config, progress: run_dgd(Path(values["teacher"]), config, Path(values["out"]),
                                                 values["resume"], progress, values["overwrite"]),
    progress_of=lambda values, config: (None if config is None else config.labelling.progress_total(),
                                        "dgd student steps"),
    positional=("teacher", "out"), settable=(PateConfig, DgdConfig), prefixed=((GENERATOR_PREFIX, DataFreeConfig),),
    audits=(AuditRoute("dgd", "faithful DGD, the seed's recipe unless --preset: the generator learns against a "
                              "teacher on all the data (NO formal guarantee)",
                       {"teacher": "ensemble", "baseline": "teacher", "dataset": "data"},
                       defaults={"preset": "paper"}),))
