"""`dpdistill audit` end to end on the embedded digits: the canaries differ from the data in their label only, the
non-private reference reveals them (the audit has power), DP-SGD, PATE (canaries in the members' partitions) and
DP-MERF (scored by the student and the synthetic set) stay under their claims."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpdistill.audit.canaries import make_canaries, write_audited_data
from dpdistill.audit.routes import routes
from dpdistill.audit.run import AuditConfig, run_audit
from dpdistill.models.ensemble import load_teacher
from dpdistill.cli.main import app
from dpdistill.data import load_dataset
from dpdistill.errors import ConfigError, PrivacyParameterError
from dpdistill.methods.base import data_read
from dpdistill.privacy.individuals import DatasetLedger


def test_the_audited_data_holds_the_included_canaries_with_their_wrong_labels_only(tmp_path: Path):
    digits = load_dataset("digits")
    canaries = make_canaries(digits, 100, seed=3)
    assert (canaries.labels != digits.y_train[canaries.indices]).all()
    assert 30 < int(canaries.included.sum()) < 70
    write_audited_data(digits, canaries, tmp_path / "data.npz")
    audited = load_dataset(str(tmp_path / "data.npz"))
    assert len(audited.y_train) == len(digits.y_train) - 100 + int(canaries.included.sum())
    ids = {int(i): position for position, i in enumerate(audited.ids_train)}
    for index, label, included in zip(canaries.indices, canaries.labels, canaries.included):
        original = int(digits.ids_train[index])
        assert (original in ids) == bool(included)  # an excluded canary leaves no trace, not even its true label
        if included:
            assert audited.y_train[ids[original]] == label
            assert torch.allclose(audited.x_train[ids[original]], digits.x_train[index], atol=1e-6)
    assert torch.allclose(audited.x_test, digits.x_test, atol=1e-6)


@pytest.mark.slow
def test_the_non_private_reference_reveals_its_canaries(tmp_path: Path):
    report = run_audit(AuditConfig("digits", method="nonprivate", canaries=200, student_arch="cnn", epochs=30),
                       tmp_path)
    assert report["audit"]["epsilon_lower_bound"] > 2 and report["audit"]["auc"] > 0.95  # measured 3.11, 0.9996
    private = json.loads((tmp_path / "private" / "record.json").read_text())  # measured on private examples
    assert private["membership"]["auc"] > 0.55 and "membership" not in report  # ordinary members: measured 0.61
    assert not report["refuted"] and (tmp_path / "scores.png").exists() and (tmp_path / "route").is_dir()
    assert "not refuted" in (tmp_path / "report.md").read_text()
    # reconstructions that look like their classes; over seeds 0-5 class_match 0.3-0.9 and correlation 0.23-0.40,
    # an untrained cnn's 0-0.2 and -0.09-0.05
    assert private["inversion"]["class_match"] >= 0.3 and private["inversion"]["correlation"] > 0.1
    assert report["inversion"] == {"image": "inversion.png"} and (tmp_path / "inversion.png").exists()
    again = run_audit(AuditConfig("digits", method="nonprivate", canaries=200, epochs=1), tmp_path, overwrite=True)
    assert again["config"]["epochs"] == 1  # every file an audit writes is its own: --overwrite replaces them


def test_dpsgd_at_epsilon_1_stays_under_its_claim_and_is_charged_to_the_data(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DPDISTILL_LEDGER_HOME", str(tmp_path / "ledgers"))
    report = run_audit(AuditConfig("digits", method="dpsgd", epsilon=1.0, canaries=200, student_arch="cnn"),
                       tmp_path / "audit")
    assert report["privacy"]["epsilon"] == pytest.approx(1.0, abs=1e-3)
    assert report["audit"]["epsilon_lower_bound"] <= 1.0 and not report["refuted"]
    private = json.loads((tmp_path / "audit" / "private" / "record.json").read_text())
    assert abs(private["membership"]["auc"] - 0.5) < 0.08  # measured 0.501
    route = json.loads((tmp_path / "audit" / "route" / "report.json").read_text())["privacy"]
    ledger = DatasetLedger(*data_read(load_dataset("digits"), "digits"))  # the route read the audited copy
    assert ledger.standing(ledger.read())["spent_epsilon"] == pytest.approx(route["epsilon_replace_one"])
    scores = np.load(tmp_path / "audit" / "private" / "canary-scores.npz")
    assert len(scores["student"]) == 200  # kept private: which canaries were in


def test_an_audit_of_data_that_declare_no_size_counts_them_noisily_and_charges_it(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DPDISTILL_LEDGER_HOME", str(tmp_path / "ledgers"))
    digits = load_dataset("digits")
    np.savez(tmp_path / "mine.npz", x_train=((digits.x_train + 1) * 127.5).round().numpy().astype(np.uint8),
             y_train=digits.y_train.numpy(), x_test=((digits.x_test + 1) * 127.5).round().numpy().astype(np.uint8),
             y_test=digits.y_test.numpy())
    run_audit(AuditConfig(str(tmp_path / "mine.npz"), method="dpsgd", epsilon=1.0, canaries=200, epochs=2,
                          inversion=False), tmp_path / "audit")
    route = json.loads((tmp_path / "audit" / "route" / "report.json").read_text())["privacy"]
    assert "a noisy count" in route["training_set_size"] and route["size_count_epsilon"] == 0.01
    ledger = DatasetLedger(*data_read(load_dataset(str(tmp_path / "mine.npz")), "mine"))
    assert ledger.standing(ledger.read())["spent_epsilon"] == pytest.approx(route["epsilon_replace_one"])


# the lower bound from 200 canaries varies from run to run: at epsilon 10, 1.24 to 2.15 over 12 runs (median 1.7)
@pytest.mark.parametrize("epsilon, lowest, highest", [(1.0, 0.0, 1.0), (10.0, 0.75, 10.0)])
def test_white_box_gradient_canaries_meet_dpsgds_noise_and_stay_under_its_claim(tmp_path: Path, epsilon, lowest,
                                                                                  highest):
    report = run_audit(AuditConfig("digits", method="dpsgd", epsilon=epsilon, canaries=200, white_box=True,
                                   inversion=False), tmp_path)
    assert report["audit"]["scorer"] == "gradient" and "white box" in report["audit"]["canary"]
    assert lowest <= report["audit"]["epsilon_lower_bound"] <= highest  # 0 at 1; at 10 of the reference's 3.11
    assert not (tmp_path / "private" / "audited-data.npz").exists()  # the data as it is: the canaries are gradients


def test_pate_keeps_the_canaries_in_its_members_partitions_under_its_guarantee(tmp_path: Path):
    report = run_audit(AuditConfig("digits", method="pate", epsilon=5.0, canaries=200, teachers=25,
                                   student_arch="cnn", settings=("queries=100", "public_size=200", "min_steps=100",
                                                                 "self_training_rounds=0")), tmp_path)
    assert len(load_teacher(tmp_path / "private" / "teachers")[0]) == 25  # trained on the canaried data, kept private
    assert report["privacy"]["formal_guarantee"] and report["privacy"]["epsilon"] == pytest.approx(5.0, abs=1e-3)
    # a student that learnt: 0.38 to 0.69 over 39 runs (mean 0.54) on its 160 test images; chance 0.1
    assert report["accuracy"]["student"] > 0.25
    assert report["audit"]["epsilon_lower_bound"] <= 5.0 and not report["refuted"]  # measured 0


@pytest.mark.slow
def test_a_synthetic_set_is_scored_too_with_the_confidence_split(tmp_path: Path):
    report = run_audit(AuditConfig("digits", method="dp-merf", epsilon=1.0, canaries=200, inversion=False,
                                   settings=("rff_features=64", "synthetic_size=200", "steps=10")),  # any generator
                       tmp_path)
    assert set(report["scorers"]) == {"student", "samples"}
    assert report["audit"]["confidence"] == 0.95 and report["privacy"]["formal_guarantee"]
    assert report["audit"]["epsilon_lower_bound"] <= 1.0 and "inversion" not in report  # measured 0 (five runs)
    assert "scored by samples" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("name", sorted(routes()))
def test_every_route_builds_its_own_config_from_the_audits_options(tmp_path: Path, name: str):
    config = AuditConfig("digits", method=name, epsilon=None if name == "nonprivate" else 1.0)
    built = config.route.build(config, str(tmp_path / "data.npz"), tmp_path / "route")
    assert built is not None and not any(tmp_path.iterdir())


@pytest.mark.parametrize("name", sorted(routes()))
def test_every_route_is_named_in_the_audits_help_and_docs(name: str):
    """The routes come from the methods' declarations; the audit's --help and docs/audit.md list them by hand."""
    helped = CliRunner().invoke(app, ["audit", "--help"], env={"COLUMNS": "400"})
    assert re.search(rf"\b{name}\b", helped.output.split("--method", 1)[1].split("--canaries")[0])
    assert f"`{name}`" in (Path(__file__).resolve().parents[2] / "docs" / "audit.md").read_text()


@pytest.mark.parametrize("values, error, message", [
    ({"method": "nonprivate", "epsilon": 1.0}, ConfigError, "no epsilon"),
    ({"method": "dpsgd"}, PrivacyParameterError, "--epsilon"),
    ({"method": "pate-fast", "epsilon": 1.0}, ConfigError, "unknown audited route"),
    ({"method": "dpsgd", "epsilon": 1.0, "canaries": 10_000}, ConfigError, "half the training set"),
    ({"method": "pate", "epsilon": 1.0, "settings": ("queries=0",)}, ConfigError, "queries"),
    ({"method": "pate", "epsilon": 1.0, "preset": "paper"}, ConfigError, "no presets"),
    ({"method": "dpsd", "epsilon": 1.0, "epochs": 3}, ConfigError, "--epochs"),
    ({"method": "datalens", "epsilon": 1.0, "student_arch": "cnn"}, ConfigError, "no setting 'student_arch'"),
    ({"method": "pate", "epsilon": 1.0, "settings": ("epochs=x",)}, ConfigError, "epochs expects"),
    ({"method": "nonprivate", "white_box": True}, ConfigError, "--white-box"),
    ({"method": "dpsgd", "epsilon": 1.0, "shadows": 1}, ConfigError, "--shadows"),
])
def test_impossible_audits_are_refused_before_any_write(tmp_path: Path, values, error, message):
    with pytest.raises(error, match=message):
        run_audit(AuditConfig("digits", **{"canaries": 200, **values}), tmp_path / "audit")
    assert not (tmp_path / "audit" / "private").exists()
