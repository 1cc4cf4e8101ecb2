"""FedDPSD (seed 000, Algorithm 2): each owner's answer is its members' bounded distillation gradients on an integer
grid plus its noise share, one example moves it no further than the accounted sensitivity, the server's targets
are DPSD's, and on Flower's simulation a run completes, or stops cleanly when an owner fails and resumes."""

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dpdistill.errors import ConfigError
from dpdistill.federated.answers import bounded_gradients, owner_answer
from dpdistill.federated.config import FederatedConfig
from dpdistill.federated.owners import owner_directory, prepare_owners
from dpdistill.federated.protocol import (GRID_STEPS, AnswerRejected, GradientAnswer, Owner, RunTerms,
                                          SecAggSettings, Wire)
from dpdistill.federated.transcription import OwnersAnnotator
from dpdistill.federated.method import FederationError, ServerPlan
from dpdistill.models.registry import build_classifier
from dpdistill.privacy.accounting import GaussianQuery, PrivacyLedger
from dpdistill.training.annotation import DistillationGradient
from dpdistill.pipeline import federated
from safetensors.torch import load_file, save_file

ANSWER = GradientAnswer(top_k=3)
WIRE = Wire(10, (1, 8, 8), 5.0, 2**20, float(GRID_STEPS), ANSWER.sensitivity(10), ANSWER,
            RunTerms("test-run", 256, 5, 0, 1, 1e-5))
OWNER = Owner(10, (1, 8, 8), 1, 1e-5)  # each of the test's owners: one teacher
SECAGG = SecAggSettings(5, 5, 5, 2.0**20, 2**21, 1.0)  # as WIRE's rounds run


def teachers(count: int) -> list[torch.nn.Module]:
    torch.manual_seed(0)
    return [build_classifier("cnn", (1, 8, 8), 10).eval() for _ in range(count)]


def queries(rows: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.rand(rows, 1, 8, 8, generator=generator) * 2 - 1, torch.randn(rows, 10, generator=generator)


def test_the_owners_sum_is_their_bounded_gradients_on_the_grid_plus_the_planned_noise(tmp_path):
    images, logits = queries(256)
    owners = teachers(5)
    shares = sum(owner_answer(tmp_path, teacher, OWNER, SECAGG, [images.numpy(), logits.numpy()], WIRE.to_json())
                 for teacher in owners)
    exact = sum(torch.trunc(bounded_gradients(teacher, images, logits, ANSWER)) for teacher in owners)
    residual = torch.from_numpy(shares) - exact.double()
    assert residual.std().item() == pytest.approx(WIRE.share_sigma * math.sqrt(5), rel=0.1)
    rows = bounded_gradients(owners[0], images, logits, ANSWER)
    assert rows.norm(dim=1).max().item() <= GRID_STEPS and ((rows != 0).sum(1) <= 3).all()  # top-k, bounded


def test_one_example_moves_an_owners_integer_row_within_the_accounted_sensitivity():
    """The worst case: the one member an example trains is replaced by any other model. Normalisation, top-k and
    truncation together stay within 2 GRID_STEPS + sqrt(classes)."""
    images, logits = queries(512)
    first, second = (torch.trunc(bounded_gradients(teacher, images, logits, ANSWER)) for teacher in teachers(2))
    distance = (first - second).norm(dim=1)
    assert distance.max().item() <= ANSWER.sensitivity(10)
    assert distance.max().item() > GRID_STEPS  # of the bound's order: two teachers' gradients can disagree wholly


def test_algorithm_2s_owner_answers_its_whole_gradient_at_the_prediction_and_refuses_an_unknown_space(tmp_path):
    """Alg. 2 line 25-26: the gradient with respect to Phi_s (the prediction), normalised whole (no top-k); the server
    moves the prediction by it."""
    images, logits = queries(64)
    teacher = teachers(1)[0]
    answer = GradientAnswer(top_k=None, space="probabilities")
    rows = bounded_gradients(teacher, images, logits, answer)
    expected = DistillationGradient(space="probabilities")(teacher(images), logits)
    assert torch.allclose(rows, GRID_STEPS * expected / (expected.norm(dim=1, keepdim=True) + 1e-4), atol=1e-3)
    assert ((rows != 0).sum(1) == 10).all()
    annotator = OwnersAnnotator(SimpleNamespace(ask=lambda index, arrays: (rows.round().long(), 1)), beta=0.01,
                                step=5.0, members=1, space="probabilities")
    targets = annotator.annotate(images, logits, PrivacyLedger(GaussianQuery(1.0), 64))
    assert torch.allclose(targets, torch.softmax(logits, 1) - 5.0 * rows.round() * 0.01 / GRID_STEPS, atol=1e-6)
    wire = Wire(10, (1, 8, 8), 5.0, 2**20, float(GRID_STEPS), ANSWER.sensitivity(10),
                GradientAnswer(top_k=None, space="odds"), RunTerms("test-run", 256, 5, 0, 1, 1e-5))
    with pytest.raises(ConfigError, match="output space"):
        owner_answer(tmp_path, teacher, OWNER, SECAGG, [images.numpy(), logits.numpy()], wire.to_json())


def test_an_owner_refuses_malformed_student_logits(tmp_path):
    images, logits = queries(8)
    teacher = teachers(1)[0]
    for bad in (logits[:, :9], torch.full_like(logits, float("nan"))):
        with pytest.raises(AnswerRejected, match="student logits"):
            owner_answer(tmp_path, teacher, OWNER, SECAGG, [images.numpy(), bad.numpy()], WIRE.to_json())


def test_the_server_moves_the_students_logits_against_the_mean_noisy_gradient_and_charges_lost_rounds():
    logits = torch.randn(4, 10)
    total = torch.zeros(4, 10, dtype=torch.int64)
    total[:, 3] = 2 * GRID_STEPS  # two contributors, each a full-norm gradient on class 3
    answers = iter([(total, 2), None])
    rounds = SimpleNamespace(ask=lambda index, arrays: next(answers))  # a kept round, then a lost one
    annotator = OwnersAnnotator(rounds, beta=0.01, step=5.0, members=1)
    ledger = PrivacyLedger(GaussianQuery(1.0), 8)
    targets = annotator.annotate(torch.zeros(4, 1, 8, 8), logits, ledger)
    expected = torch.softmax(logits - 5.0 * torch.nn.functional.one_hot(torch.full((4,), 3), 10) * 0.01, dim=1)
    assert torch.allclose(targets, expected) and ledger.answered == 4
    lost = annotator.annotate(torch.zeros(4, 1, 8, 8), logits, ledger)
    assert (lost == 0).all() and ledger.answered == 8  # spent, unanswered: the student skips the batch


def test_the_server_plan_is_seed_000s_loop_with_noise_calibrated_for_the_shares():
    plan = ServerPlan.of(FederatedConfig(epsilon=10.0, dataset="digits", clients=5, method="dpsd"))
    assert (plan.transcription.iterations, plan.transcription.batch_size, plan.transcription.top_k) == (200, 256, None)
    assert (plan.transcription.latents, plan.wire.gradient.space) == ("fresh", "probabilities")  # Alg. 2's
    assert plan.transcription.privacy.beta == 5e-3 and plan.queries == 200 * 256
    assert plan.query.epsilon(plan.queries, 1e-5) <= 10.0 < plan.query.epsilon(2 * plan.queries, 1e-5)
    with pytest.raises(Exception, match="data owners answer in data mode|teacher"):
        ServerPlan.of(FederatedConfig(epsilon=10.0, dataset="digits", clients=5, method="dpsd",
                                      preset="paper,engine"))


@pytest.mark.parametrize("method, stray, message", [
    ("dpsd", {"queries": 500}, "queries: only the pate route reads it"),
    ("dpsd", {"self_training_rounds": 0, "public_size": 100}, "public-size, self-training-rounds"),
    ("pate", {"iterations": 10}, "iterations: only the dpsd route reads it"),
    ("pate", {"preset": "demo"}, "drop it with --method pate"),
])
def test_a_setting_of_the_other_route_is_refused_not_ignored(method, stray, message):
    with pytest.raises(ConfigError, match=message):
        FederatedConfig(epsilon=10.0, dataset="digits", clients=5, method=method, **stray)


SETTINGS = dict(dataset="digits", clients=3, method="dpsd", teacher_epochs=2, iterations=4, batch_size=32,
                preset="demo")


@pytest.mark.slow
@pytest.mark.flower
@pytest.mark.simulation
def test_feddpsd_runs_on_the_simulation_stops_cleanly_when_an_owner_fails_and_resumes(tmp_path: Path):
    """Two simulations (each starts Ray, most of its time): the first stops at its first round, the resumed one
    runs every round, as a run that never stopped does."""
    owners = tmp_path / "owners"
    prepare_owners(owners, FederatedConfig(epsilon=10.0, **SETTINGS))
    weights = owner_directory(owners, 1) / "member-000" / "model.safetensors"  # owner 1 answers NaN
    kept = weights.with_suffix(".kept")
    shutil.copyfile(weights, kept)
    save_file({name: torch.full_like(value, float("nan")) if value.is_floating_point() else value
               for name, value in load_file(weights).items()}, weights)
    out = tmp_path / "run"
    with pytest.raises(FederationError, match="stopped at round 1 of 4"):
        federated(FederatedConfig(epsilon=10.0, **SETTINGS), out, owners)
    assert not list((out / "private").rglob("round-*.safetensors"))  # nothing of the failed round released
    assert json.loads((owners / "ledger.json").read_text())["entries"][-1]["status"] == "reserved"
    shutil.copyfile(kept, weights)  # the owner repairs its teacher
    report = federated(None, out, resume=True)
    assert report["federation"]["contributors"] == [3] * 4 and report["federation"]["lost_rounds"] == []
    assert report["resumed"] is True
    assert report["privacy"]["epsilon"] <= 10.0 and report["privacy"]["queries"] == 4 * 32
    assert (out / "generator.safetensors").exists() and report["history"][-1]["iteration"] == 4
    assert not (out / "private" / "resume").exists()  # raw sums and checkpoints go with the run
    assert json.loads((owners / "ledger.json").read_text())["entries"][-1]["status"] == "spent"
