"""DataLens (Wang et al., CCS 2021; seed 003) as a method, `dpdistill synthesize --method datalens`: a private
class-conditional generator, its labelled synthetic set, and the standard evaluation of private synthetic data.

1. Split: the private training set into N disjoint keyed partitions, one per teacher discriminator.
2. Teachers: each takes GAN steps on its own partition (real) against the generator's samples (fake).
3. Ask: the generator makes a batch of samples of random classes; every teacher computes the gradient of the
   generator's loss with respect to each sample's pixels.
4. Release (TopAgg): each teacher's gradient -> top-k stochastic signs; summed over teachers, plus Gaussian noise,
   thresholded at beta x N. One example changes one teacher's signs (L2 sensitivity 2 sqrt(k)): each sample is a
   Gaussian query, and all compose (dp-accounting).
5. Learn: the generator fits its samples moved along the released direction (post-processing).
6. Evaluate: a classifier trained only on the synthetic set, tested on the real test split (final model).
Training is training/datalens.py.

Presets: `paper` is the official code's Fashion-MNIST / MNIST command (4,000 teachers of 15 images; Fashion-MNIST:
k 200, sigma 5000, threshold 0.7 at epsilon <= 1, k 350, sigma 1000, threshold 0.27, latent 64 above; MNIST at
epsilon 10: the paper's k 350 where the official command has 300, sigma 800, threshold 0.2; 15 samples a step, as
many steps as the budget affords; docs/methods/datalens.md sets it beside the paper). `cpu` fits about an hour on two CPU cores at epsilon 10 on Fashion-MNIST. `control` is the same pipeline without noise (no
guarantee): what the implementation learns before privacy is added.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from dpdistill import __version__
from dpdistill.data import load_dataset
from dpdistill.data.base import ImageDataset
from dpdistill.errors import ConfigError
from dpdistill.methods.base import Job, Needs, Outcome, Source, data_read
from dpdistill.methods.config import TranscriptionConfig
from dpdistill.methods.dpmerf import DpMerf
from dpdistill.methods.lifecycle import execute
from dpdistill.methods.release import TeacherGuided
from dpdistill.methods.synthetic import (CLASSIFIER_STATE, StudentSettings, SynthesisMethod, evaluate_synthetic,
                                         student_model, synthetic_files)
from dpdistill.models.checkpoint import CLASS_NAMES
from dpdistill.models.datalens import ConditionalGenerator
from dpdistill.models.features import joined
from dpdistill.options import (AuditRoute, OVERWRITE_OPTION, REPRODUCIBLE_NOISE_HELP, CommandSpec, Option, dataset_help,
                               out_option, preset_options, resume_option, set_option)
from dpdistill.privacy.ledger import Release, UncoveredRead, event_to_json, reproducible_noise_read
from dpdistill.progress import Progress
from dpdistill.reporting.synthesis import datalens_markdown
from dpdistill.runs import release_state, saved_config
from dpdistill.training.datalens import DataLensConfig, DataLensTrainer, plan_datalens
from dpdistill.training.mean_embedding import MeanEmbeddingConfig
from dpdistill.training.state import STATE_SKELETON

STUDENT_ARCH = "datalens"  # the papers' evaluation classifier
OFFICIAL_PROTOCOL = "official_protocol_max_over_epochs"
NOISELESS_VOTES = [UncoveredRead("every teacher vote, thresholded without noise (the control)",
                                 "NO guarantee: the control releases the votes without noise")]
COVERS = ("the generator, the synthetic set and the student trained on it: all are post-processing of TopAgg's "
          "noisy votes")


PRESETS = ("paper", "cpu", "control")


def preset_settings(preset: str | None, epsilon: float | None, dataset: str) -> dict[str, Any]:
    """The settings a preset fixes (the caller's explicit options override them)."""
    if preset is None:
        return {}
    if preset not in PRESETS:
        raise ConfigError(f"unknown DataLens preset {preset!r}: choose {', '.join(PRESETS)}")
    if preset == "control":
        return CONTROL
    if preset == "cpu":
        return CPU
    if epsilon is not None and epsilon <= 1:
        return OFFICIAL_EPSILON_1
    return OFFICIAL_FMNIST if dataset == "fmnist" else OFFICIAL_MNIST


# the official repository's commands: 4,000 teachers of 15 images, as many steps as the budget affords; the vote
# settings per epsilon and data set
OFFICIAL = {"teachers": 4000, "batch_size": 15, "teacher_batch": 15, "teacher_warmup": 10, "discriminator_steps": 2,
            "step_size": 1e-3, "steps": None}
OFFICIAL_EPSILON_1 = {**OFFICIAL, "top_k": 200, "sigma": 5000.0, "threshold": 0.7, "latent_dim": 50}
OFFICIAL_FMNIST = {**OFFICIAL, "top_k": 350, "sigma": 1000.0, "threshold": 0.27, "latent_dim": 64}
# MNIST above epsilon 1: the paper's top-k 350 ("top-k=350 MNIST and Fashion-MNIST" at epsilon 10, section 5.1; the
# official command has 300), the official command's sigma and threshold, which the paper does not give
OFFICIAL_MNIST = {**OFFICIAL, "top_k": 350, "sigma": 800.0, "threshold": 0.2, "latent_dim": 50}
# the official epsilon-10 Fashion-MNIST settings on two CPU cores: half the teachers (partitions of about 30, a
# minibatch of 8 a teacher step, one teacher step a generator step), a dense layer of 32 units (the weights and Adam
# moments fit a few GB), 5 samples a step so that the noise calibrated to 150 steps keeps the official ratio of sigma
# to N (512 / 2,000 at epsilon 10)
CPU = {**OFFICIAL_FMNIST, "teachers": 2000, "batch_size": 5, "teacher_batch": 8, "discriminator_steps": 1,
       "discriminator_hidden": 32, "steps": 150, "sigma": None}
# the epsilon-10 Fashion-MNIST paper preset without noise, at the 190 steps its budget affords: few teachers with
# large partitions (each vote counts, the threshold a few votes)
CONTROL = {**OFFICIAL_FMNIST, "teachers": 10, "steps": 190, "sigma": 0.0, "epsilon": math.inf}


def build_datalens_config(preset: str | None, values: dict[str, Any]) -> DataLensConfig:
    """A config from a preset and explicit values (None: not given). Sigma and the number of steps fix each other
    through the budget: given steps alone, sigma is calibrated to them; otherwise the steps are all that sigma
    affords. The control takes no epsilon: it guarantees nothing."""
    given = {key: value for key, value in values.items() if value is not None}
    if "dataset" not in given or ("epsilon" not in given and preset != "control"):
        raise ConfigError("DataLens needs --dataset and --epsilon")
    if "steps" in given and "sigma" not in given and preset != "control":  # the steps asked for fix the noise
        given["sigma"] = None
    return DataLensConfig(**{**preset_settings(preset, given.get("epsilon"), given["dataset"]), **given})


class DataLens(SynthesisMethod):
    name = "datalens"
    summary = ("DataLens: a generator trained by N teacher discriminators through TopAgg (top-k signs, Gaussian "
               "votes), and its labelled synthetic set")
    needs = Needs.PRIVATE_DATA
    paper = "Wang et al., DataLens (CCS 2021), seed 003"
    presets = PRESETS
    config_type = DataLensConfig

    def build_config(self, preset: str | None, values: dict[str, Any]) -> DataLensConfig:
        return build_datalens_config(preset, values)

    def plan(self, source: Source, config: DataLensConfig, out_dir: Path, progress: Progress | None) -> "DataLensJob":
        return DataLensJob(config, out_dir, progress)

    def config_record(self, source: Source, config: DataLensConfig) -> dict[str, Any]:
        return config.to_dict()

    def interrupted(self, out_dir: Path) -> tuple[None, DataLensConfig] | None:
        """Resumable after its first checkpoint."""
        saved = saved_config(out_dir)
        if saved is None or not (release_state(out_dir) / STATE_SKELETON).exists():
            return None
        return None, DataLensConfig.from_dict(saved)

    def markdown(self, report: dict[str, Any]) -> str:
        return datalens_markdown(report)


def generator_meta(generator: ConditionalGenerator, config: DataLensConfig, dataset: ImageDataset) -> dict[str, Any]:
    return {"kind": "conditional-generator", "latent_dim": config.latent_dim, "num_classes": dataset.num_classes,
            CLASS_NAMES: list(dataset.class_names), "out_shape": list(dataset.input_shape),
            "hidden": config.generator_hidden, "width": config.generator_width,
            "latent_distribution": "uniform(-1, 1)", "dataset": config.dataset, "normalisation": "[-1, 1]",
            "dpdistill_version": __version__}


def synthesize(generator: ConditionalGenerator, count: int, seed: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` images, classes balanced in a seeded order, from latents drawn with `seed`, in batches of `batch`
    (the generator's batch norm reads each batch: the training's batch size gives the statistics it learnt with)."""
    latents_from = torch.Generator().manual_seed(seed)
    labels = (torch.arange(count) % generator.num_classes)[torch.randperm(count, generator=latents_from)]
    latents = torch.rand(count, generator.latent_dim, generator=latents_from) * 2 - 1
    device = next(generator.parameters()).device
    starts = list(range(0, count, batch))
    if len(starts) > 1 and count - starts[-1] < 2:  # batch norm needs two samples: the last batch takes one more
        starts.pop()
    ends = starts[1:] + [count]
    with torch.no_grad():
        images = joined((generator(latents[start:end].to(device), labels[start:end].to(device)).cpu()
                         for start, end in zip(starts, ends)), count)
    return images, labels


class DataLensJob(Job):
    """The plan is fixed (and an overspending one refused) before the private data is read for training."""

    def __init__(self, config: DataLensConfig, out_dir: Path, progress: Progress | None) -> None:
        self.config, self.progress, self.state_dir = config, progress, release_state(out_dir)
        self.dataset = load_dataset(config.dataset)
        pixels = self.dataset.x_train[0].numel()
        if config.top_k > pixels:
            raise ConfigError(f"top-k {config.top_k} exceeds the {pixels} pixels of a {config.dataset} image: "
                              f"lower --top-k")
        self.plan = plan_datalens(config)
        self.trainer = DataLensTrainer(config, self.dataset, self.plan, self.state_dir, progress)
        self.uncovered = NOISELESS_VOTES if self.plan.query is None else reproducible_noise_read(config.reproducible_noise)
        self.planned = Release(self.plan.release_event(), config.delta, self.plan.epsilon(config.delta))
        self.data_set = data_read(self.dataset, config.dataset)  # whose ledger records the release

    def run(self, resume: bool) -> Outcome:
        config, dataset = self.config, self.dataset
        result = self.trainer.run(resume)
        images, labels = synthesize(result.generator, config.synthetic_size, config.seed, config.batch_size)
        student, evaluation, student_seconds = evaluate_synthetic(dataset, images, labels, "DataLens", StudentSettings(
            STUDENT_ARCH, config.student_epochs, config.student_lr, config.student_batch, config.seed, config.device),
            self.progress, self.state_dir / CLASSIFIER_STATE)
        # the official evaluation reports the best test epoch: optimistic, shown beside the final model, labelled
        evaluation["accuracy"][OFFICIAL_PROTOCOL] = max(record["test_accuracy"] for record in evaluation["student_history"])
        privacy = {**self.plan.summary(config.delta), "formal_guarantee": True,
                   "event": event_to_json(self.plan.release_event()),
                   "teachers": config.teachers, "top_k": config.top_k, "threshold_votes": config.threshold * config.teachers,
                   "noise": self.trainer.noise.description,
                   "unit": "one example of the private training set (replace-one; it changes one teacher's partition)"}
        report = {"dataset": config.dataset,
                  "data": {key: value for key, value in dataset.describe().items() if key != "n_train"},
                  **evaluation,
                  # the generator's steps train teachers on the private data: their time is the private record's
                  "timing": {"student_seconds": student_seconds},
                  "history": result.history}
        return Outcome(
            report=report, privacy=privacy, covers=COVERS,
            models={"generator": (result.generator, generator_meta(result.generator, config, dataset)),
                    "student": student_model(student, STUDENT_ARCH, dataset, config.dataset)},
            private_record=lambda: {"train_images": len(dataset.y_train),
                                    "partition_sizes": self.trainer.part_sizes.tolist(),
                                    "teacher_history": result.teacher_history,
                                    "timing": {"wall_seconds": result.wall_seconds + student_seconds,
                                               "generator_seconds": result.wall_seconds,
                                               "steps_per_second": self.plan.steps / max(result.wall_seconds, 1e-9),
                                               **result.timing}},
            write_files=synthetic_files(images, labels, dataset.class_names))


SYNTHESIS_METHODS: dict[str, SynthesisMethod] = {method.name: method for method in (DataLens(), DpMerf(),
                                                                                   TeacherGuided())}


def synthesis_method(name: str) -> SynthesisMethod:
    if name not in SYNTHESIS_METHODS:
        raise ConfigError(f"unknown method {name!r}: `synthesize` runs {', '.join(SYNTHESIS_METHODS)} "
                          f"(`dpdistill.methods()` lists every method and the command that runs it)")
    return SYNTHESIS_METHODS[name]


def run_synthesis(config: Any, out_dir: Path, resume: bool = False, progress: Progress | None = None,
                  overwrite: bool = False) -> dict[str, Any]:
    """A labelled private synthetic set (DataLens, DP-MERF: methods/dpmerf.py, or the release's teacher-guided
    generator: methods/release.py; the method whose settings `config` is). With `resume`, the run saved in `out_dir`
    continues with its saved method and settings."""
    method = (synthesis_method(saved_synthesis_method(out_dir)) if resume else
              next(method for method in SYNTHESIS_METHODS.values() if isinstance(config, method.config_type)))
    return execute(method, Source(), config, out_dir, resume, overwrite, progress)


def saved_synthesis_method(out_dir: Path) -> str:
    """The method of the `synthesize` run saved in `out_dir` (DataLens' settings name none)."""
    saved = saved_config(out_dir) if out_dir.is_dir() else None
    return (saved or {}).get("method", "datalens")


def _configure(values: dict[str, Any]) -> Any:
    """A fresh run's settings: the preset's, then the options given; a resumed run's saved ones."""
    out = Path(values["out"])
    if values["resume"]:
        chosen = synthesis_method(saved_synthesis_method(out))
        saved = saved_config(out) if out.is_dir() else None
        return None if saved is None else chosen.config_type.from_dict(saved)
    chosen = synthesis_method(values["method"])
    given = {name: values[name] for name in PRESET_OPTIONS}
    return chosen.build_config(values["preset"], {**given, "dataset": values["dataset"],
                                                  "reproducible_noise": values["reproducible_noise"] or None,
                                                  **COMMAND.settings(values, chosen.settings_type)})


def _progress_of(values: dict[str, Any], config: Any) -> tuple[int | None, str]:
    """Each phase of a synthesiser counts its own work (DataLens' generator steps, DP-MERF's image fitting)."""
    return None, f"{getattr(config, 'method', values['method'])} on {values['dataset']}"


# options whose None means the preset's value (or the method's default)
PRESET_OPTIONS = {
    "epsilon": (float, "privacy budget (sound, replace-one)"),
    "delta": (float, "delta of (epsilon, delta)-DP [default 1e-5]"),
    "teachers": (int, "datalens: N teacher discriminators, one per partition"),
    "top_k": (int, "datalens: k, coordinates each teacher votes on"),
    "sigma": (float, "datalens: noise std on each summed vote [default: 1000; fitted to --steps when only they are "
                     "given]"),
    "threshold": (float, "datalens: beta, keep coordinates whose |noisy vote| >= beta N"),
    "steps": (int, "generator (datalens, default: all the budget affords), image (dp-merf) or transcription "
                   "(teacher-guided) steps"),
    "batch_size": (int, "datalens: samples a step, each one query; teacher-guided: samples an iteration"),
    "synthetic_size": (int, "images written to synthetic.npz"),
    "seed": (int, "seeds initialisation and latents, never the noise"),
    "device": (str, "cpu or cuda"),
}

COMMAND = CommandSpec(
    name="synthesize", help="Make a private labelled synthetic set from the data.",
    options=(Option("dataset", str, help=dataset_help("the private data"),
                    field=False),
             out_option("directory for generator, synthetic.npz, samples.png, student and report"),
             Option("method", str, "datalens", "datalens (seed 003): N teacher discriminators, TopAgg; dp-merf: one "
                                               "noisy release of class-wise mean embeddings; teacher-guided: the "
                                               "release's DP teacher and released statistics guide a generator",
                    field=False),
             Option("preset", str | None, None, "datalens: paper, the official code's command (4,000 teachers); cpu, "
                                                "about an hour on two cores at epsilon 10; control, no noise (no "
                                                "guarantee, no --epsilon); teacher-guided: the transcription "
                                                "engine's, the release's loop by default", field=False),
             *preset_options(PRESET_OPTIONS),
             Option("reproducible_noise", bool, False, REPRODUCIBLE_NOISE_HELP, show_default=False, field=False),
             resume_option(), set_option("any knob of the method, KEY=VALUE (repeatable), e.g. clip=1e-5"),
             OVERWRITE_OPTION),
    configure=_configure,
    run=lambda values, config, progress: run_synthesis(None if values["resume"] else config, Path(values["out"]),
                                                       values["resume"], progress, values["overwrite"]),
    progress_of=_progress_of, positional=("dataset", "out"),
    settable=(DataLensConfig, MeanEmbeddingConfig, TranscriptionConfig),
    audits=(AuditRoute("datalens", "DataLens' synthetic data and the classifier trained on it (synthesize)",
                       {"dataset": "data"}, {"method": "datalens"}),
            AuditRoute("dp-merf", "DP-MERF's synthetic data and the classifier trained on it (synthesize)",
                       {"dataset": "data"}, {"method": "dp-merf"})))
