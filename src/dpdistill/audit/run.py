"""`dpdistill audit`: a route run end to end on private data holding canaries, then audited from its release.

1. Canaries: mislabelled training examples, each included with probability 1/2 (audit/canaries.py); the private
   data the route sees is written under the audit's private folder.
2. Route: the route runs on that data exactly as a user would run it (audit/routes.py): DP-SGD, a synthesis
   method, or a teacher route whose teacher or ensemble is first trained on the data, into `OUT/route`.
3. Score: every canary by the released student's fit to its wrong label; where the route releases a synthetic
   set, by the nearest synthetic image of that label; with shadow models, by offline LiRA (audit/lira.py). With
   --white-box (DP-SGD), the canaries are gradients in the optimizer's clipped sum instead (audit/white_box.py).
4. Bound: the one-run audit (audit/one_run.py) turns the guesses into an epsilon lower bound at 95%, reported
   beside the route's claimed epsilon. A bound above the claim refutes the implementation.
5. Inversion: each class reconstructed from the student alone (audit/inversion.py), as the seeds evaluate theirs.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpdistill.atomic import write_atomically
from dpdistill.audit.canaries import Canaries, loss_scores, make_canaries, write_audited_data
from dpdistill.audit.inversion import invert
from dpdistill.audit.lira import logit_confidence, offline_lira, shadow_confidences
from dpdistill.audit.one_run import CONFIDENCE, AuditResult, audit, auc, tpr_at
from dpdistill.audit.routes import PrivateModels, Route, check_route, route_named
from dpdistill.audit.white_box import GradientCanaries, gradient_canaries
from dpdistill.data import load_dataset
from dpdistill.data.base import ImageDataset
from dpdistill.errors import ConfigError
from dpdistill.models.ensemble import load_saved
from dpdistill.privacy.individuals import DatasetLedger
from dpdistill.methods.synthetic import SYNTHETIC_FILE
from dpdistill.progress import Progress, announce_start
from dpdistill.reporting.audit import audit_markdown, save_score_histogram
from dpdistill.reporting.report import PRIVATE_DIR, is_covered, save_image_grid, write_private_record
from dpdistill.runs import claim_out_dir, exclusive
from dpdistill.training.teacher import TeacherConfig

AUDITED_DATA = "audited-data.npz"
ROUTE_DIR = "route"


@dataclass(frozen=True)
class AuditConfig:
    dataset: str
    method: str = "dpsgd"  # the audited route (audit/routes.py), or "nonprivate", the reference
    canaries: int = 1000
    epsilon: float | None = None  # the route's budget
    delta: float = 1e-5  # the route's delta, and the audit's
    student_arch: str | None = None  # None: the route's own (scatter-linear for nonprivate and dpsgd)
    epochs: int | None = None  # nonprivate and dpsgd; None: the route's default
    teachers: int | None = None  # teacher routes: ensemble members (1: a single teacher); None: the route's default
    teacher_arch: str = "cnn"  # a single teacher's architecture
    preset: str | None = None  # transcription and synthesis routes: their preset
    settings: tuple[str, ...] = ()  # the route's other settings, KEY=VALUE as its command's --set
    inversion: bool = True  # reconstruct each class from the released student (inversion.png)
    shadows: int = 0  # offline LiRA's shadow models (0: no LiRA score; else at least 2)
    white_box: bool = False  # dpsgd: gradient canaries in the optimizer's clipped sum instead of mislabelled data
    confidence: float = CONFIDENCE
    seed: int = 0  # which canaries, their labels and inclusion (the audit's secret); the route's initialisation
    device: str = "cpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", tuple(self.settings))
        check_route(self)
        if not 0.5 <= self.confidence < 1:
            raise ConfigError(f"confidence must be in [0.5, 1), got {self.confidence}")
        if self.epochs is not None and self.epochs < 1:
            raise ConfigError(f"epochs must be at least 1, got {self.epochs}")
        if self.shadows == 1 or self.shadows < 0:
            raise ConfigError(f"--shadows must be 0 (no LiRA) or at least 2 (a mean and a spread), got {self.shadows}")
        if self.white_box and (self.method != "dpsgd" or self.shadows):
            raise ConfigError("--white-box puts gradient canaries into DP-SGD's optimizer: use it with --method "
                              "dpsgd and without --shadows")

    @property
    def route(self) -> Route:
        return route_named(self.method)

    @property
    def teacher_count(self) -> int:
        return self.teachers if self.teachers is not None else self.route.default_teachers or 1


def membership_inference(model: nn.Module, dataset: ImageDataset, canaries: Canaries,
                         config: AuditConfig) -> dict[str, float | int]:
    """The loss-threshold attack on ordinary examples: as many training examples the route saw (canaries aside)
    as test images it never saw (the last ones: PATE's and DGD's public pool is the first part of the test split),
    each scored by minus its loss; the attack's AUC and TPR at 1% FPR."""
    count = min(config.canaries, len(dataset.y_test) // 2)
    seen = torch.ones(len(dataset.y_train), dtype=torch.bool)
    seen[canaries.indices] = False
    members = seen.nonzero().squeeze(1)[torch.randperm(int(seen.sum()),
                                                       generator=torch.Generator().manual_seed(config.seed))[:count]]
    scores = np.concatenate([loss_scores(model, dataset.x_train[members], dataset.y_train[members], config.device),
                             loss_scores(model, dataset.x_test[-count:], dataset.y_test[-count:], config.device)])
    truth = np.arange(2 * count) < count
    return {"members": count, "non_members": count, "auc": auc(scores, truth),
            "tpr_at_1pct_fpr": tpr_at(scores, truth, 0.01)}


def synthetic_scores(route_dir: Path, canaries: Canaries) -> np.ndarray | None:
    """Where the route releases a synthetic set: minus each canary's distance to the nearest synthetic image of
    its wrong label (a generator that memorised an included canary draws close to it); None where it has none."""
    path = route_dir / SYNTHETIC_FILE
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as arrays:
        images, labels = torch.from_numpy(arrays["x"]).flatten(1), torch.from_numpy(arrays["y"])
    scores = torch.full((len(canaries.labels),), -math.inf, dtype=torch.float64)
    flat = canaries.images.flatten(1)
    for label in canaries.labels.unique():
        mine, theirs = canaries.labels == label, images[labels == label]
        if len(theirs):
            scores[mine] = -torch.cdist(flat[mine], theirs).min(1).values.double()
    return scores.clamp_min(-1e6).numpy()


def score_canaries(route_dir: Path, model: nn.Module, arch: str, canaries: Canaries, dataset: ImageDataset,
                   config: AuditConfig, progress: Progress | None) -> dict[str, np.ndarray]:
    """Every score the release affords: the student's fit to each wrong label; the synthetic set's nearness where
    there is one; with shadows, offline LiRA on the student (shadows of its architecture `arch`)."""
    scores = {"student": loss_scores(model, canaries.images, canaries.labels, config.device)}
    samples = synthetic_scores(route_dir, canaries)
    if samples is not None:
        scores["samples"] = samples
    if config.shadows:
        epochs = {} if config.epochs is None else {"epochs": config.epochs}
        shadow = TeacherConfig(arch=arch, seed=config.seed, device=config.device, **epochs)
        scores["lira"] = offline_lira(logit_confidence(model, canaries.images, canaries.labels, config.device),
                                      shadow_confidences(dataset, canaries, shadow, config.shadows, progress))
    return scores


SCORERS = {"student": "minus the released student's cross-entropy on a canary's wrong label",
           "samples": "minus the distance from a canary to the nearest released synthetic image of its wrong label",
           "lira": "offline LiRA: the student's logit confidence on a canary's wrong label against shadow models "
                   "that never saw it",
           "gradient": "the sum over DP-SGD's steps of the noisy gradient on the canary's own weight coordinate"}
CANARY = {False: "a training example with a wrong label",
          True: "a gradient of norm C on its own weight coordinate, in DP-SGD's clipped sum when included and "
                "drawn by its own Poisson sampling (white box)"}


def audit_scores(scores: dict[str, np.ndarray], included: np.ndarray, config: AuditConfig
                 ) -> tuple[str, AuditResult, dict[str, AuditResult]]:
    """One audit per score, the confidence split evenly among them (Bonferroni): the best bound holds at
    `config.confidence`. The scorer that gave it, its result, and every scorer's."""
    each = 1 - (1 - config.confidence) / len(scores)
    results = {name: dataclasses.replace(audit(values, included, config.delta, each), confidence=config.confidence)
               for name, values in scores.items()}
    best = max(results, key=lambda name: results[name].epsilon_lower_bound)
    return best, results[best], results


def claim(route_report: dict[str, Any], route: Route) -> dict[str, Any]:
    """What the route claims: its epsilon (infinite without privacy), what its report says it covers, and whether
    that is a formal guarantee."""
    privacy = route_report.get("privacy", {}) if route.takes_epsilon else {}
    stated = {"epsilon": privacy.get("epsilon", math.inf), "delta": privacy.get("delta"), "mode": privacy.get("mode"),
              "covered": privacy.get("covered", "")}
    return {**stated, "formal_guarantee": route.takes_epsilon and is_covered(privacy | stated)}


def run_audit(config: AuditConfig, out_dir: Path, progress: Progress | None = None,
              overwrite: bool = False) -> dict[str, Any]:
    """Canaries in, the route run once, the canaries scored and the bound computed; report.json, report.md,
    scores.png and inversion.png in `out_dir` (the route's own run in `out_dir/route`; the audited data, the
    teachers and which canaries were in under `private/`)."""
    with exclusive(out_dir):
        clear_previous = claim_out_dir(out_dir, False, overwrite, False, "audit")
        data = out_dir / PRIVATE_DIR / AUDITED_DATA
        # a wrong setting is refused before anything is written; white-box canaries leave the data as it is
        built = config.route.build(config, config.dataset if config.white_box else str(data), out_dir / ROUTE_DIR)
        dataset = load_dataset(config.dataset)
        canaries = make_canaries(dataset, config.canaries, config.seed)
        clear_previous()
        announce_start(progress)
        data.parent.mkdir(parents=True, exist_ok=True)
        white_box = GradientCanaries(canaries.included, config.seed) if config.white_box else None
        if white_box is None:
            write_audited_data(dataset, canaries, data)
            # the route reads the data's individuals, its canaries being some of them relabelled: its releases are
            # charged to all of them (a changed copy would be another example to the ledger)
            audited = load_dataset(str(data))
            DatasetLedger.of(audited.digest, str(data), lambda: np.union1d(audited.example_ids.numpy(),
                                                                           dataset.example_ids.numpy()))
        with gradient_canaries(white_box):
            route_report = config.route.run(built, PrivateModels(config, str(data), progress), progress)
        model, meta, _ = load_saved(out_dir / ROUTE_DIR)
        scores = ({"gradient": white_box.observed.numpy()} if white_box is not None else
                  score_canaries(out_dir / ROUTE_DIR, model, meta["arch"], canaries, dataset, config, progress))
        included = canaries.included.numpy()
        scorer, result, results = audit_scores(scores, included, config)
        claimed = claim(route_report, config.route)
        report = {"method": "audit", "dataset": config.dataset, "route": config.method,
                  "route_summary": config.route.summary,
                  "audit": {**result.to_dict(), "delta": config.delta, "scorer": scorer,
                            "canary": f"{CANARY[config.white_box]}, scored by {SCORERS[scorer]}"},
                  "scorers": {name: {**value.to_dict(), "score": SCORERS[name]} for name, value in results.items()},
                  "privacy": claimed, "refuted": result.epsilon_lower_bound > claimed["epsilon"],
                  "accuracy": {"student": route_report["accuracy"].get("student",
                                                                       route_report["accuracy"].get("teacher"))},
                  "config": dataclasses.asdict(config)}
        # measured on private examples without noise: the private record's, never the report's
        private = {"membership": membership_inference(model, dataset, canaries, config)}
        if config.inversion:
            inversion = invert(model, dataset.x_train, dataset.y_train, dataset.num_classes, config.device)
            save_image_grid(inversion.images, out_dir / "inversion.png", columns=dataset.num_classes,
                            titles=dataset.class_names)
            report["inversion"] = {"image": "inversion.png"}  # the reconstructions: the student's alone
            private["inversion"] = {"class_match": inversion.class_match, "correlation": inversion.correlation}
        save_score_histogram(scores[scorer], included, out_dir / "scores.png", SCORERS[scorer])
        write_atomically({out_dir / "report.json": lambda temporary: temporary.write_text(json.dumps(report, indent=2)),
                          out_dir / "report.md": lambda temporary: temporary.write_text(audit_markdown(report))})
        write_private_record(out_dir, private)
        np.savez(out_dir / PRIVATE_DIR / "canary-scores.npz", included=included, **scores)  # which were in: private
        return report
