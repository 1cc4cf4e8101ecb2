"""Release hygiene: what --out publishes holds no figure computed from the private data without noise."""

import json
import re
from pathlib import Path

from dpdistill.methods.config import build_config
from dpdistill.methods.pate import PateConfig
from dpdistill.pipeline import pate, train_private, transcribe
from dpdistill.reporting.report import PRIVATE_DIR, PRIVATE_RECORD, as_written
from dpdistill.training.private import PrivateTrainingConfig


def _numbers(value) -> list[float]:
    """Every number anywhere in a JSON value."""
    if isinstance(value, dict):
        return [number for item in value.values() for number in _numbers(item)]
    if isinstance(value, list):
        return [number for item in value for number in _numbers(item)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def _public_and_private(out: Path) -> tuple[dict, dict, str]:
    public = json.loads((out / "report.json").read_text())
    private = json.loads((out / PRIVATE_DIR / PRIVATE_RECORD).read_text())
    return public, private, (out / "report.md").read_text()


def test_a_transcription_publishes_no_teacher_accuracy(digits_teacher: Path, tmp_path: Path):
    config = build_config("demo", {"iterations": 2, "batch_size": 16}, {"mode": "data", "epsilon": 1.0})
    transcribe(digits_teacher, config, tmp_path)
    public, private, markdown = _public_and_private(tmp_path)
    teacher_accuracy = private["accuracy"]["teacher"]
    assert 0.9 < teacher_accuracy <= 1 and teacher_accuracy not in _numbers(public)
    assert f"{100 * teacher_accuracy:.2f}" not in markdown
    assert "teacher" not in public["accuracy"]
    privacy = public["privacy"]  # every report states its neighbouring relation
    assert privacy["relation"] == "replace-one" and privacy["epsilon_replace_one"] == privacy["epsilon"] <= 1.0


def test_pate_publishes_no_ensemble_accuracy(digits_ensemble: Path, tmp_path: Path):
    pate(digits_ensemble, PateConfig(epsilon=1, queries=50, public_size=100, epochs=1, min_steps=20), tmp_path)
    public, private, markdown = _public_and_private(tmp_path)
    ensemble_accuracy = private["accuracy"]["teacher"]
    assert 0.5 < ensemble_accuracy <= 1 and ensemble_accuracy not in _numbers(public)
    assert f"{100 * ensemble_accuracy:.2f}" not in markdown
    privacy = public["privacy"]
    assert privacy["relation"] == "replace-one" and privacy["epsilon_replace_one"] == privacy["epsilon"] <= 1.0


def test_dpsgd_publishes_neither_the_data_set_size_nor_losses_on_private_data(tmp_path: Path):
    config = PrivateTrainingConfig(dataset="digits", epsilon=1.0, epochs=1, batch_size=64, student_arch="cnn")
    report = train_private(config, tmp_path)
    public, private, markdown = _public_and_private(tmp_path)
    size = private["train_size"]
    # the sampling comes from the size the data set declares, a public figure (for the digits, its documented
    # 1,437), published as such and nowhere else: as a number of its own, not as digits inside another figure
    # (an epsilon's 1.3642715143723894 holds 1437)
    declared = {**public, "privacy": {k: v for k, v in public["privacy"].items() if k != "declared_size"}}
    assert public["privacy"]["declared_size"] == size > 1000
    assert size not in _numbers(declared) and not re.search(rf"(?<![\d.]){size}(?!\d)", json.dumps(declared))
    assert "expected_batch_size" not in public["privacy"]
    assert all(set(record) == {"epoch", "steps", "test_accuracy"} for record in public["history"])
    assert "train loss" not in markdown and as_written(report) == public
    privacy = public["privacy"]  # DP-SGD's budget is add/remove (Opacus' convention); replace-one costs more
    assert privacy["relation"] == "add-remove" and privacy["epsilon"] <= 1.0 < privacy["epsilon_replace_one"]
