"""DPSD end to end on the embedded digits data: learning happens, the budget holds, runs resume exactly."""

import json
from pathlib import Path

import pytest
import torch

from dpdistill.errors import BudgetExceededError, ConfigError
from dpdistill.methods.config import build_config
from dpdistill.models.checkpoint import load_classifier, load_generator
from dpdistill.pipeline import transcribe

CHANCE = 0.1


def _config(mode: str, epsilon: float | None = 10.0, **overrides):
    values = {"iterations": 60, "batch_size": 64, "eval_every": 30, "checkpoint_every": 20} | overrides
    return build_config("demo", values, {"mode": mode, "epsilon": epsilon})


@pytest.mark.parametrize("mode", ["data", "label"])
def test_private_run_writes_its_outputs_and_respects_its_budget(digits_teacher: Path, tmp_path: Path, mode: str):
    report = transcribe(digits_teacher, _config(mode, iterations=20), tmp_path, "digits")
    privacy = report["privacy"]
    assert 9.9 < privacy["epsilon"] <= 10.0
    assert privacy["queries"] == 20 * 64
    assert privacy["covered"].startswith("the student, the generator")
    for name in ("student.safetensors", "generator.safetensors", "latents.safetensors", "report.json", "report.md",
                 "samples.png", "training.png"):
        assert (tmp_path / name).exists()
    assert not (tmp_path / "private" / "resume").exists()
    saved = json.loads((tmp_path / "report.json").read_text())
    for key in ("method", "privacy_mode", "dataset", "config", "seed", "timing"):
        assert key in saved
    for key in ("epsilon", "delta", "accountant", "paper_epsilon", "queries"):
        assert key in saved["privacy"]
    assert 0 <= saved["accuracy"]["student"] <= 1 and "teacher" not in saved["accuracy"]
    record = json.loads((tmp_path / "private" / "record.json").read_text())
    assert record["accuracy"]["teacher"] > 0.9 and "NEVER PUBLISH" in record["notice"]
    assert "NOT a guarantee" in (tmp_path / "report.md").read_text()
    student, _ = load_classifier(tmp_path, "student")
    generator, _ = load_generator(tmp_path)
    assert student(generator(torch.randn(2, 100))).shape == (2, 10)


@pytest.mark.parametrize("mode, epsilon", [("data", 1e5), ("none", None)])
def test_tiny_run_learns_above_chance(digits_teacher: Path, tmp_path: Path, mode: str, epsilon):
    """DPSD-T (teacher as discriminator) with little or no noise: the loop itself must transfer knowledge."""
    config = build_config("demo", {"discriminator": "teacher", "latents": "fresh"}, {"mode": mode, "epsilon": epsilon})
    report = transcribe(digits_teacher, config, tmp_path, "digits")
    assert report["accuracy"]["student"] > CHANCE + 0.15
    assert report["privacy"]["covered"].startswith("NO formal guarantee" if mode == "data" else "nothing")


def test_interrupted_run_resumes_to_the_same_result(digits_teacher: Path, tmp_path: Path):
    whole = transcribe(digits_teacher, _config("data"), tmp_path / "whole", "digits")

    def interrupt(record: dict) -> None:
        if record["iteration"] == 45:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        transcribe(digits_teacher, _config("data"), tmp_path / "cut", "digits", progress=interrupt)
    with pytest.raises(ConfigError, match="--resume"):
        transcribe(digits_teacher, _config("data"), tmp_path / "cut", "digits")
    resumed = transcribe(digits_teacher, _config("data"), tmp_path / "cut", "digits", resume=True)
    assert resumed["privacy"]["queries"] == whole["privacy"]["queries"]
    assert resumed["privacy"]["epsilon"] == pytest.approx(whole["privacy"]["epsilon"])
    a, _ = load_classifier(tmp_path / "whole", "student")
    b, _ = load_classifier(tmp_path / "cut", "student")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


def test_a_run_never_answers_past_its_budget(digits_teacher: Path, tmp_path: Path, monkeypatch):
    config = _config("data", iterations=10)
    from dpdistill.methods import dpsd

    real_plan = dpsd.plan_privacy

    def short_plan(*args, **kwargs):  # a cap below the plan, as after a budget change on resume
        plan = real_plan(*args, **kwargs)
        return type(plan)(plan.request, plan.query, plan.planned_queries, 5 * 64, plan.num_classes, plan.batch_size)

    monkeypatch.setattr(dpsd, "plan_privacy", short_plan)
    seen = []
    with pytest.raises(BudgetExceededError):
        transcribe(digits_teacher, config, tmp_path, "digits", progress=lambda r: seen.append(r["queries"]))
    assert seen[-1] == 5 * 64


def test_sound_epsilon_one_run_never_exceeds_one(digits_teacher: Path, tmp_path: Path):
    report = transcribe(digits_teacher, _config("data", epsilon=1.0, iterations=20), tmp_path, "digits")
    assert report["privacy"]["epsilon"] <= 1.0
    assert report["privacy"]["epsilon"] > 0.99


def test_two_runs_never_write_the_same_directory(digits_teacher: Path, tmp_path: Path):
    import fcntl

    tmp_path.mkdir(exist_ok=True)
    with open(tmp_path / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match="another dpdistill run"):
            transcribe(digits_teacher, _config("data", iterations=2), tmp_path, "digits")
    assert not (tmp_path / "config.json").exists()
