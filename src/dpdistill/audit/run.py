"""`dpdistill audit`: a route run end to end on private data holding canaries, then audited from its release.

1. Canaries: mislabelled training examples, each included with probability 1/2 (audit/canaries.py); the private
   data the route sees is written under the audit's private folder.
2. Route: the route trains on that data exactly as a user would run it (`train-private --method dpsgd`, or the
   non-private reference, `train-teacher`), into `OUT/route`.
3. Score: every canary by the released student's fit to its wrong label.
4. Bound: the one-run audit (audit/one_run.py) turns the guesses into an epsilon lower bound at 95%, reported
   beside the route's claimed epsilon. A bound above the claim refutes the implementation.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from dpdistill import pipeline
from dpdistill.atomic import write_atomically
from dpdistill.audit.canaries import Canaries, loss_scores, make_canaries, write_audited_data
from dpdistill.audit.one_run import CONFIDENCE, audit, auc, tpr_at
from dpdistill.data import load_dataset
from dpdistill.data.base import ImageDataset
from dpdistill.errors import ConfigError, PrivacyParameterError
from dpdistill.models.ensemble import load_saved
from dpdistill.reporting.report import PRIVATE_DIR, audit_markdown, save_score_histogram
from dpdistill.runs import claim_out_dir, exclusive
from dpdistill.training.private import PrivateTrainingConfig
from dpdistill.training.teacher import TeacherConfig

AUDITED_ROUTES = ("nonprivate", "dpsgd")
AUDITED_DATA = "audited-data.npz"
ROUTE_DIR = "route"


@dataclass(frozen=True)
class AuditConfig:
    dataset: str
    method: str = "dpsgd"  # the audited route: "dpsgd" (train-private), or "nonprivate" (train-teacher, reference)
    canaries: int = 1000
    epsilon: float | None = None  # dpsgd's budget
    delta: float = 1e-5  # the route's delta, and the audit's
    student_arch: str = "scatter-linear"
    epochs: int | None = None  # None: the route's default
    confidence: float = CONFIDENCE
    seed: int = 0  # which canaries, their labels and inclusion (the audit's secret); the route's initialisation
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.method not in AUDITED_ROUTES:
            raise ConfigError(f"unknown audited route {self.method!r}: choose one of {', '.join(AUDITED_ROUTES)}")
        if self.method == "dpsgd" and self.epsilon is None:
            raise PrivacyParameterError("auditing dpsgd needs its privacy budget --epsilon")
        if self.method == "nonprivate" and self.epsilon is not None:
            raise ConfigError("the non-private reference has no epsilon: drop --epsilon")
        if not 0.5 <= self.confidence < 1:
            raise ConfigError(f"confidence must be in [0.5, 1), got {self.confidence}")
        if self.epochs is not None and self.epochs < 1:
            raise ConfigError(f"epochs must be at least 1, got {self.epochs}")

    def run_route(self, data: Path, out_dir: Path, progress: Callable[[dict], None] | None) -> dict[str, Any]:
        """Train the audited route on `data` into `out_dir`; its report."""
        epochs = {} if self.epochs is None else {"epochs": self.epochs}
        if self.method == "nonprivate":
            config = TeacherConfig(arch=self.student_arch, seed=self.seed, device=self.device, **epochs)
            return pipeline.train_teacher(str(data), out_dir, config, progress)
        config = PrivateTrainingConfig(dataset=str(data), method="dpsgd", epsilon=self.epsilon, delta=self.delta,
                                       student_arch=self.student_arch, seed=self.seed, device=self.device, **epochs)
        return pipeline.train_private(config, out_dir, progress=progress)


def membership_inference(model: nn.Module, dataset: ImageDataset, canaries: Canaries,
                         config: AuditConfig) -> dict[str, float | int]:
    """The loss-threshold attack on ordinary examples: as many training examples the route saw (canaries aside)
    as test images it never saw, each scored by minus its loss; the attack's AUC and TPR at 1% FPR."""
    count = min(config.canaries, len(dataset.y_test))
    seen = torch.ones(len(dataset.y_train), dtype=torch.bool)
    seen[canaries.indices] = False
    members = seen.nonzero().squeeze(1)[torch.randperm(int(seen.sum()),
                                                       generator=torch.Generator().manual_seed(config.seed))[:count]]
    scores = np.concatenate([loss_scores(model, dataset.x_train[members], dataset.y_train[members], config.device),
                             loss_scores(model, dataset.x_test[:count], dataset.y_test[:count], config.device)])
    truth = np.arange(2 * count) < count
    return {"members": count, "non_members": count, "auc": auc(scores, truth),
            "tpr_at_1pct_fpr": tpr_at(scores, truth, 0.01)}


def run_audit(config: AuditConfig, out_dir: Path, progress: Callable[[dict], None] | None = None,
              overwrite: bool = False) -> dict[str, Any]:
    """Canaries in, the route run once, the canaries scored and the bound computed; report.json, report.md and
    scores.png in `out_dir` (the route's own run in `out_dir/route`, the audited data under `private/`)."""
    with exclusive(out_dir):
        clear_previous = claim_out_dir(out_dir, False, overwrite, False, "audit")
        dataset = load_dataset(config.dataset)
        canaries = make_canaries(dataset, config.canaries, config.seed)
        clear_previous()
        data = out_dir / PRIVATE_DIR / AUDITED_DATA
        data.parent.mkdir(parents=True, exist_ok=True)
        write_audited_data(dataset, canaries, data)
        route = config.run_route(data, out_dir / ROUTE_DIR, progress)
        model = load_saved(out_dir / ROUTE_DIR)[0]
        scores = loss_scores(model, canaries.images, canaries.labels, config.device)
        included = canaries.included.numpy()
        result = audit(scores, included, config.delta, config.confidence)
        claimed = route.get("privacy", {}).get("epsilon", math.inf)
        report = {"method": "audit", "dataset": config.dataset, "route": config.method,
                  "audit": {**result.to_dict(), "delta": config.delta, "canary": "a training example with a wrong "
                            "label, scored by minus the released student's cross-entropy on it"},
                  "membership": membership_inference(model, dataset, canaries, config),
                  "privacy": {"epsilon": claimed, "delta": config.delta},
                  "refuted": result.epsilon_lower_bound > claimed,
                  "accuracy": {"student": route["accuracy"].get("student", route["accuracy"].get("teacher"))},
                  "config": dataclasses.asdict(config)}
        save_score_histogram(scores, included, out_dir / "scores.png")
        write_atomically({out_dir / "report.json": lambda temporary: temporary.write_text(json.dumps(report, indent=2)),
                          out_dir / "report.md": lambda temporary: temporary.write_text(audit_markdown(report))})
        np.savez(out_dir / PRIVATE_DIR / "canary-scores.npz", scores=scores, included=included)  # which were in: private
        return report
