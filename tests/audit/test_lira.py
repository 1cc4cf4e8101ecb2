"""Offline LiRA: shadows that never see a canary calibrate its difficulty, which the plain score cannot."""

from pathlib import Path

import numpy as np
import torch

from dpdistill.audit import lira
from dpdistill.audit.canaries import make_canaries
from dpdistill.audit.one_run import auc
from dpdistill.data import load_dataset
from dpdistill.training.teacher import TeacherConfig


def test_calibrating_each_canarys_difficulty_separates_what_the_raw_score_cannot():
    rng = np.random.default_rng(0)
    canaries, shadows = 400, 8
    difficulty = rng.normal(0, 3, canaries)  # some wrong labels are easy to fit, some hard, in or out
    included = rng.random(canaries) < 0.5
    target = difficulty + rng.normal(0, 1, canaries) + 1.5 * included
    out_models = difficulty + rng.normal(0, 1, (shadows, canaries))
    assert auc(target, included) < 0.7  # the raw confidence: the difficulty drowns the membership
    assert auc(lira.offline_lira(target, out_models), included) > 0.8  # measured 0.84 (0.64 raw)


def test_logit_confidence_is_the_log_odds_of_the_label():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    images, labels = torch.randn(5, 1, 2, 2), torch.tensor([0, 1, 2, 0, 1])
    with torch.no_grad():
        p = model(images).softmax(-1)[torch.arange(5), labels].double()
    assert np.allclose(lira.logit_confidence(model, images, labels), torch.log(p / (1 - p)).numpy(), atol=1e-5)


def test_shadows_never_see_a_canary_and_each_learns_from_its_own_half(monkeypatch, tmp_path: Path):
    digits = load_dataset("digits")
    canaries = make_canaries(digits, 100, seed=1)
    seen: list[set[int]] = []
    real = lira.train_classifier

    def recording(data, config, *args, **kwargs):
        seen.append({int(i) for i in data.ids_train})
        return real(data, config, *args, **kwargs)

    monkeypatch.setattr(lira, "train_classifier", recording)
    confidences = lira.shadow_confidences(digits, canaries, TeacherConfig(arch="cnn", epochs=1), 3)
    assert confidences.shape == (3, 100) and np.isfinite(confidences).all()
    canary_ids = {int(digits.ids_train[i]) for i in canaries.indices}
    population = len(digits.y_train) - 100
    assert all(not ids & canary_ids and len(ids) == population // 2 for ids in seen)
    assert seen[0] != seen[1] != seen[2]
