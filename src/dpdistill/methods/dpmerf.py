"""DP-MERF-style mean embeddings (Harder et al., AISTATS 2021) as a method, `dpdistill synthesize --method
dp-merf`: a labelled synthetic set from one noisy release of the private data's class-wise mean embeddings, cheap
enough for two cores and a covered sample source for the teacher routes (`--sample-source`).

1. Embed: each private image as phi(x), norm 1: scattering coefficients, random Fourier features of them and of
   the pixels, and a counting coordinate; all fixed before the data are read.
2. Release: the class-wise sums of phi plus Gaussian noise, one Gaussian mechanism (L2 sensitivity 2 under
   replace-one), accounted by dp-accounting. It is the only read of the private data.
3. Fit: each class's synthetic images are moved until the mean of their embeddings meets the released mean
   (post-processing).
4. Evaluate: a classifier trained only on the synthetic set, tested on the real test split (final model).
Training is training/mean_embedding.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from dpdistill.data import load_dataset
from dpdistill.errors import ConfigError
from dpdistill.methods.base import Job, Needs, Outcome, Source, data_read
from dpdistill.methods.synthetic import (CLASSIFIER_STATE, StudentSettings, SynthesisMethod, evaluate_synthetic,
                                         given_settings, student_model, synthetic_files)
from dpdistill.privacy.accounting import composed_epsilon
from dpdistill.privacy.ledger import Release, event_to_json, reproducible_noise_read
from dpdistill.privacy.randomness import noise_source
from dpdistill.progress import Progress
from dpdistill.reporting.synthesis import mean_embedding_markdown
from dpdistill.runs import release_state, saved_config
from dpdistill.training.mean_embedding import (MeanEmbeddingConfig, MeanEmbeddingSynthesizer,
                                               plan_mean_embedding)
from dpdistill.training.state import STATE_SKELETON

COVERS = ("the synthetic set and the student trained on it: both are post-processing of the one noisy release of "
          "the class-wise mean embeddings")


def build_mean_embedding_config(preset: str | None, values: dict[str, Any]) -> MeanEmbeddingConfig:
    """A config from explicit values (None: not given); dp-merf has no preset."""
    if preset is not None:
        raise ConfigError(f"dp-merf has no preset (got {preset!r}): its defaults are the measured settings")
    return MeanEmbeddingConfig.from_dict(given_settings(
        "dp-merf", values, {field.name for field in dataclasses.fields(MeanEmbeddingConfig)},
        "see `dpdistill synthesize --help` and docs/methods/dp-merf.md"))


class DpMerf(SynthesisMethod):
    name = "dp-merf"
    summary = ("DP-MERF-style mean embeddings: one noisy release of the class-wise mean of scattering and random "
               "Fourier features, and synthetic images fitted to it")
    needs = Needs.PRIVATE_DATA
    paper = "Harder et al., DP-MERF (AISTATS 2021); not a seed paper"
    config_type = MeanEmbeddingConfig

    def build_config(self, preset: str | None, values: dict[str, Any]) -> MeanEmbeddingConfig:
        return build_mean_embedding_config(preset, values)

    def plan(self, source: Source, config: MeanEmbeddingConfig, out_dir: Path,
             progress: Progress | None) -> "DpMerfJob":
        return DpMerfJob(config, out_dir, progress)

    def config_record(self, source: Source, config: MeanEmbeddingConfig) -> dict[str, Any]:
        return config.to_dict()

    def interrupted(self, out_dir: Path) -> tuple[None, MeanEmbeddingConfig] | None:
        """Resumable once its release is saved: a resumed run fits the images to it and never spends again."""
        saved = saved_config(out_dir)
        if saved is None or saved.get("method") != self.name or not (release_state(out_dir) / STATE_SKELETON).exists():
            return None
        return None, MeanEmbeddingConfig.from_dict(saved)

    def markdown(self, report: dict[str, Any]) -> str:
        return mean_embedding_markdown(report)


class DpMerfJob(Job):
    """The noise is calibrated to the budget before the private data are read."""

    def __init__(self, config: MeanEmbeddingConfig, out_dir: Path, progress: Progress | None) -> None:
        self.config, self.progress, self.state_dir = config, progress, release_state(out_dir)
        self.dataset = load_dataset(config.dataset)
        self.plan = plan_mean_embedding(config)
        self.noise = noise_source(config.reproducible_noise, config.seed)
        self.synthesizer = MeanEmbeddingSynthesizer(config, self.dataset, self.plan, self.noise,
                                                    self.state_dir, progress)
        self.uncovered = reproducible_noise_read(config.reproducible_noise)
        self.planned = Release(self.plan.release_event(), config.delta,
                               composed_epsilon(self.plan.query, 1, config.delta))  # recorded in the data set's ledger
        self.data_set = data_read(self.dataset, config.dataset)

    def run(self, resume: bool) -> Outcome:
        config, dataset = self.config, self.dataset
        result = self.synthesizer.run(resume)
        student, evaluation, student_seconds = evaluate_synthetic(
            dataset, result.images, result.labels, "DP-MERF",
            StudentSettings(config.student_arch, config.student_epochs, config.student_lr, config.student_batch,
                            config.seed, config.device, every_epoch=False), self.progress,
            self.state_dir / CLASSIFIER_STATE)
        privacy = {**self.plan.summary(config.delta), "formal_guarantee": True,
                   "event": event_to_json(self.plan.release_event()), "noise": self.noise.description,
                   "embedding": list(config.embedding),
                   "unit": "one example of the private training set (replace-one: its image and its label)"}
        report = {"dataset": config.dataset,
                  "data": {key: value for key, value in dataset.describe().items() if key != "n_train"},
                  **evaluation,
                  # the class sums' time grows with the private count: it and the whole are the private record's
                  "timing": {"fit_seconds": result.wall_seconds - result.release_seconds,
                             "student_seconds": student_seconds},
                  "history": result.history}
        return Outcome(report=report, privacy=privacy, covers=COVERS,
                       models={"student": student_model(student, config.student_arch, dataset, config.dataset)},
                       private_record=lambda: {"train_images": len(dataset.y_train), "timing": {
                           "wall_seconds": result.wall_seconds + student_seconds,
                           "release_seconds": result.release_seconds}},
                       write_files=synthetic_files(result.images, result.labels, dataset.class_names))
