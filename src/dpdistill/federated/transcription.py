"""FedDPSD's server side (seed 000, Algorithm 2): the DPSD engine runs on the server, and each of its queries is a
secure-aggregation round in which the data owners answer for their teachers.

Per iteration the server generates a batch of synthetic images and sends them with the student's logits on them;
each owner returns the sum of its members' bounded distillation gradients on an integer grid plus its discrete
Gaussian share (federated/answers.py); SecAgg+ reveals only the sum. The targets are DPSD's: the student's logits
moved against the mean noisy gradient. The engine journals every answer before the student sees it and
checkpoints as on one machine, so a restarted server resumes; the finished run's models and history are written
for the command that started it (a deployed server runs in another process).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from dpdistill.federated.protocol import GRID_STEPS, Wire, query_cost
from dpdistill.federated.server_app import FederationPlan, Rounds
from dpdistill.methods.config import TranscriptionConfig
from dpdistill.methods.engine import TranscriptionResult
from dpdistill.models.registry import build_classifier, build_generator
from dpdistill.privacy.accounting import PrivacyLedger
from dpdistill.privacy.budget import PrivacyPlan
from dpdistill.privacy.randomness import noise_source
from dpdistill.training.annotation import gradient_targets
from dpdistill.training.state import STATE_SKELETON, load_state, save_state

RESULT_DIR = "result"


def gradient_privacy_plan(config: TranscriptionConfig, wire: Wire, owners: int, dropouts: int,
                          colluders: int) -> PrivacyPlan:
    """The engine's plan for owners' answers: every synthetic sample one distributed discrete Gaussian query."""
    count = config.query_iterations(config.iterations) * config.batch_size
    return PrivacyPlan(config.privacy, query_cost(wire, owners, dropouts, colluders), count, count, wire.num_classes,
                       config.batch_size)


@dataclass
class OwnersAnnotator:
    """The engine's annotator when the teachers are the owners': one secure sum per query iteration."""

    rounds: Rounds
    beta: float
    step: float
    members: int
    space: str = "logits"  # what the owners' gradients are taken with respect to (GradientAnswer.space)

    def annotate(self, images: Tensor, student_logits: Tensor, ledger: PrivacyLedger) -> Tensor:
        index = ledger.answered // len(images)
        ledger.charge(len(images))
        result = self.rounds.ask(index, [images.cpu().numpy(), student_logits.cpu().numpy()])
        if result is None:  # lost while unmasking: spent, never answered; the student skips the batch
            return torch.zeros_like(student_logits)
        total, contributors = result
        noisy_sum = total.to(student_logits) * (self.beta / GRID_STEPS)
        return gradient_targets(student_logits, noisy_sum, self.step, contributors * self.members, self.space)


def run_transcription(rounds: Rounds) -> None:
    """The engine, its queries answered by the owners' secure sums (a round that cannot be completed stops it
    with `FederationStopped`); the result is written into `plan.work_dir`'s private state."""
    from dpdistill.methods.engine import TranscriptionEngine
    from dpdistill.methods.teachers import evaluation_set

    plan = rounds.plan
    config, wire, work_dir = TranscriptionConfig.from_dict(plan.transcription), plan.wire, Path(plan.work_dir)
    annotator = OwnersAnnotator(rounds, config.privacy.beta, config.target_step, plan.members, plan.wire.gradient.space)
    engine = TranscriptionEngine(config, None, wire.in_shape, wire.num_classes,
                                 evaluation_set(plan.dataset, wire.in_shape, wire.num_classes), work_dir,
                                 owners=annotator,
                                 privacy_plan=gradient_privacy_plan(config, wire, plan.owners, plan.dropouts,
                                                                    plan.colluders))
    resume = engine.journal.iterations() or (work_dir / "resume" / STATE_SKELETON).exists()
    result = engine.run(resume=bool(resume))
    save_state(work_dir / "resume" / RESULT_DIR, {
        "student": result.student.state_dict(), "generator": result.generator.state_dict(),
        "latents": result.latents, "answered": result.answered, "history": result.history,
        "wall_seconds": result.wall_seconds, "phases": result.phase_seconds})


def read_result(plan: FederationPlan) -> TranscriptionResult | None:
    """The finished engine's result, its models rebuilt from what `run_transcription` wrote; None if it did not
    finish."""
    directory = Path(plan.work_dir) / "resume" / RESULT_DIR
    if not (directory / STATE_SKELETON).exists():
        return None
    saved, config, wire = load_state(directory), TranscriptionConfig.from_dict(plan.transcription), plan.wire
    student = build_classifier(config.student_arch, wire.in_shape, wire.num_classes)
    student.load_state_dict(saved["student"])
    generator = build_generator(config.latent_dim, wire.in_shape, config.generator_width)
    generator.load_state_dict(saved["generator"])
    return TranscriptionResult(student.eval(), generator.eval(), saved["latents"],
                               gradient_privacy_plan(config, wire, plan.owners, plan.dropouts, plan.colluders),
                               int(saved["answered"]), saved["history"], float(saved["wall_seconds"]),
                               noise_source(), saved["phases"])
