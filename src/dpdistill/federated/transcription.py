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
from typing import Any

import torch
from flwr.app import Context
from flwr.serverapp import Grid
from torch import Tensor

from dpdistill.federated.protocol import GRID_STEPS, Wire, query_cost
from dpdistill.methods.config import TranscriptionConfig
from dpdistill.privacy.accounting import PrivacyLedger
from dpdistill.privacy.budget import PrivacyPlan
from dpdistill.training.annotation import gradient_targets
from dpdistill.training.state import STATE_SKELETON, load_state, save_state

RESULT_DIR = "result"


class FederationStopped(Exception):
    """A round could not be completed before unmasking: nothing of it was revealed, the run stops."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index, self.reason = index, reason


def gradient_privacy_plan(config: TranscriptionConfig, wire: Wire, owners: int, dropouts: int,
                          num_classes: int) -> PrivacyPlan:
    """The engine's plan for owners' answers: every synthetic sample one distributed discrete Gaussian query."""
    count = config.query_iterations(config.iterations) * config.batch_size
    return PrivacyPlan(config.privacy, query_cost(wire, owners, dropouts), count, count, num_classes,
                       config.batch_size)


@dataclass
class OwnersAnnotator:
    """The engine's annotator when the teachers are the owners': one secure sum per query iteration."""

    secure_round: Any  # (index, arrays) -> (sum, contributors) | LOST; raises FederationStopped
    beta: float
    step: float
    members: int

    def annotate(self, images: Tensor, student_logits: Tensor, ledger: PrivacyLedger) -> Tensor:
        index = ledger.answered // len(images)
        ledger.charge(len(images))
        result = self.secure_round(index, [images.cpu().numpy(), student_logits.cpu().numpy()])
        if result is None:  # lost while unmasking: spent, never answered; the student skips the batch
            return torch.zeros_like(student_logits)
        total, contributors = result
        noisy_sum = total.to(student_logits) * (self.beta / GRID_STEPS)
        return gradient_targets(student_logits, noisy_sum, self.step, contributors * self.members)


def run_transcription(grid: Grid, context: Context, plan: Any) -> None:
    """The engine, its queries answered by the owners' secure sums; the result is written to `plan.work_dir`."""
    from dpdistill.federated.server_app import LOST, RoundJournal, owner_names, owner_nodes, secure_sum
    from dpdistill.methods.engine import TranscriptionEngine
    from dpdistill.methods.teachers import evaluation_set

    journal = RoundJournal(Path(plan.journal_dir))
    journal.clear_failure()
    config = TranscriptionConfig.from_dict(plan.transcription)
    wire, threshold = plan.wire, plan.owners - plan.dropouts
    try:
        nodes = owner_nodes(grid, plan.owners, plan.stage_timeout)
    except RuntimeError as error:
        journal.fail(-1, str(error))
        return

    def secure_round(index: int, arrays: list) -> tuple[Tensor, int] | None:
        """The round's sum: the kept one if this round was revealed before a restart (asking again would release
        it twice under one charge), else asked of the owners that answer a roll call."""
        nonlocal nodes
        if journal.done(index):
            return journal.read(index)
        nodes = sorted(owner_names(grid, nodes, plan.stage_timeout))
        if len(nodes) < threshold:
            raise FederationStopped(index, f"{len(nodes)} of {plan.owners} data owners answered the roll call; the "
                                           f"noise shares were sized for at least {threshold}")
        result = secure_sum(grid, context, nodes, arrays, plan, index)
        if result is None:
            raise FederationStopped(index, f"fewer than {threshold} of {plan.owners} data owners completed the "
                                           f"round's masked upload (nothing of it was revealed)")
        if result == LOST:
            journal.lose(index)
            return None
        journal.write(index, *result)
        return result

    work_dir = Path(plan.work_dir)
    annotator = OwnersAnnotator(secure_round, config.privacy.beta, config.target_step, plan.members)
    engine = TranscriptionEngine(config, None, wire.in_shape, wire.num_classes,
                                 evaluation_set(plan.dataset, wire.in_shape, wire.num_classes), work_dir,
                                 owners=annotator, privacy_plan=gradient_privacy_plan(
                                     config, wire, plan.owners, plan.dropouts, wire.num_classes))
    resume = engine.journal.iterations() or (work_dir / "resume" / STATE_SKELETON).exists()
    try:
        result = engine.run(resume=bool(resume))
    except FederationStopped as stop:
        journal.fail(stop.index, stop.reason)
        return
    save_state(work_dir / "resume" / RESULT_DIR, {
        "student": result.student.state_dict(), "generator": result.generator.state_dict(),
        "latents": result.latents, "answered": result.answered, "history": result.history,
        "wall_seconds": result.wall_seconds, "phases": result.phase_seconds})


def read_result(work_dir: Path) -> dict[str, Any] | None:
    """The finished engine's models and history, as `run_transcription` wrote them; None if it did not finish."""
    directory = work_dir / "resume" / RESULT_DIR
    return load_state(directory) if (directory / STATE_SKELETON).exists() else None
