"""`dpdistill synthesize`: a tiny DataLens run writes its generator, synthetic set and classifier, states a
composable release, and moves towards the data; a tiny DP-MERF run writes a synthetic set that teaches a
classifier and a release a teacher route composes with; user mistakes are one line, exit 2, and nothing written."""

import json
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpdistill.api import load_model, synthesize
from dpdistill.data import load_dataset
from dpdistill.models.datalens import ConditionalGenerator
from dpdistill.cli.main import app
from dpdistill.models.checkpoint import load_conditional_generator
from dpdistill.data.sample_source import load_sample_source
from dpdistill.methods.datalens import saved_synthesis_method, synthesis_method
from dpdistill.methods.synthetic import CLASSIFIER_PHASE
from dpdistill.training.mean_embedding import FIT_PHASE, SUMS_PHASE
from dpdistill.privacy.ledger import event_from_json
from dpdistill.privacy.accounting import rdp_epsilon
from helpers import built_once

runner = CliRunner()
TINY = ("--dataset", "digits", "--teachers", "10", "--top-k", "16", "--synthetic-size", "600",
        "--set", "student_epochs=4", "--set", "teacher_warmup=20", "--set", "generator_hidden=64",
        "--set", "generator_width=16", "--set", "discriminator_width=8", "--set", "discriminator_hidden=16",
        "--set", "teacher_batch=16")


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="session")  # not the module's: a worker handed tests one at a time leaves the module between
def synthesized(tmp_path_factory) -> Path:  # two of them, and a module's fixture would be built again
    def run(out: Path) -> None:
        # a loose budget and little noise: the votes of ten teachers are nearly exact
        result = invoke("synthesize", *TINY, "--epsilon", "1000000", "--sigma", "0.5", "--steps", "80",
                        "--batch-size", "32", "--set", "threshold=0.3", "--out", out)
        assert result.exit_code == 0, result.output

    return built_once(tmp_path_factory, "datalens", run)


def test_a_run_writes_generator_synthetic_set_and_classifier(synthesized: Path):
    report = json.loads((synthesized / "report.json").read_text())
    data = np.load(synthesized / "synthetic.npz", allow_pickle=False)
    assert data["x"].shape == (600, 1, 8, 8) and data["x"].dtype == np.float32 and np.abs(data["x"]).max() <= 1
    assert np.bincount(data["y"]).tolist() == [60] * 10
    generator, meta = load_conditional_generator(synthesized)
    assert meta["kind"] == "conditional-generator" and generator.num_classes == 10
    assert load_model(synthesized, "student") is not None
    assert (synthesized / "samples.png").exists() and "synthetic set only" in (synthesized / "report.md").read_text()
    assert not any(path.name.startswith("teacher") for path in synthesized.iterdir())  # teachers stay private


def test_the_teachers_losses_stay_in_the_private_record(synthesized: Path):
    """They are computed from the teachers without noise: only the released direction's figures are public."""
    report = json.loads((synthesized / "report.json").read_text())
    assert report["history"] and all(set(record) == {"step", "kept_share"} for record in report["history"])
    section = (synthesized / "report.md").read_text().split("## Generator training")[1].split("##")[0]
    assert not [line for line in section.splitlines() if line.startswith("|") and "loss" in line]
    private = json.loads((synthesized / "private" / "record.json").read_text())
    assert set(private["teacher_history"][-1]) == {"step", "teacher_loss", "discriminator_loss"}


def test_the_report_states_a_release_another_route_can_compose(synthesized: Path):
    privacy = json.loads((synthesized / "report.json").read_text())["privacy"]
    event = event_from_json(privacy["event"])
    assert isinstance(event, dp_accounting.SelfComposedDpEvent) and event.count == privacy["queries"] == 80 * 32
    assert privacy["epsilon"] <= 1000000 and privacy["formal_guarantee"] is True
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    assert rdp_epsilon(accountant, event, privacy["delta"]) == pytest.approx(privacy["epsilon_rdp"], rel=1e-6)


def test_the_released_directions_move_the_samples_towards_the_private_data(synthesized: Path):
    """The generator starts where a fresh one with the same seed starts; the teachers' votes pull its samples'
    mean image towards the real one."""
    generator, meta = load_conditional_generator(synthesized)
    torch.manual_seed(0)  # the run's seed: the same initialisation
    fresh = ConditionalGenerator(meta["latent_dim"], 10, (1, 8, 8), meta["hidden"], meta["width"]).eval()
    real_mean = load_dataset("digits").x_train.mean(0)
    latents, classes = torch.rand(600, meta["latent_dim"]) * 2 - 1, torch.arange(600) % 10
    with torch.no_grad():
        before = (fresh(latents, classes).mean(0) - real_mean).norm()
        after = (generator(latents, classes).mean(0) - real_mean).norm()
    # nine runs measured after / before from 0.52 to 0.76 (the noise is secret, so every run differs);
    # a reversed direction moves the mean away (a ratio above 1)
    assert after < 0.9 * before


MERF_TINY = ("--method", "dp-merf", "--dataset", "digits", "--synthetic-size", "300", "--steps", "60",
             "--set", "rff_features=256", "--set", "batch_per_class=10", "--set", "student_epochs=20")


@pytest.fixture(scope="session")  # not the module's: the slow test that reads it runs first, the others later
def merf_synthesized(tmp_path_factory) -> Path:
    def run(out: Path) -> None:
        result = invoke("synthesize", *MERF_TINY, "--epsilon", "1000", "--out", out)
        assert result.exit_code == 0, result.output

    return built_once(tmp_path_factory, "dpmerf", run)  # by whichever worker asks first


@pytest.mark.slow
def test_dpmerf_writes_a_synthetic_set_that_teaches_a_classifier(merf_synthesized: Path):
    """At a loose budget the released means are nearly exact: the set teaches far above chance (10%)."""
    report = json.loads((merf_synthesized / "report.json").read_text())
    data = np.load(merf_synthesized / "synthetic.npz", allow_pickle=False)
    assert data["x"].shape == (300, 1, 8, 8) and data["x"].dtype == np.float32 and np.abs(data["x"]).max() <= 1
    assert np.bincount(data["y"]).tolist() == [30] * 10
    assert report["accuracy"]["student"] > 0.6  # measured 0.87
    assert load_model(merf_synthesized, "student") is not None and (merf_synthesized / "samples.png").exists()
    assert not (merf_synthesized / "generator.safetensors").exists()


def test_dpmerf_release_composes_with_a_teacher_route(merf_synthesized: Path):
    privacy = json.loads((merf_synthesized / "report.json").read_text())["privacy"]
    event = event_from_json(privacy["event"])
    assert isinstance(event, dp_accounting.GaussianDpEvent) and privacy["epsilon"] <= 1000
    source = load_sample_source(merf_synthesized, (1, 8, 8), 10)
    assert source.formal_guarantee and source.release.epsilon == privacy["epsilon"] and len(source.labels) == 300


def test_the_python_api_runs_dpmerf_and_names_the_classifiers_phase(tmp_path: Path):
    records: list[dict] = []
    result = synthesize("digits", tmp_path / "api", method="dp-merf", epsilon=1000.0, synthetic_size=100, steps=5,
                        rff_features=64, student_epochs=1, progress=records.append)
    assert result.generator is None and result.report["method"] == "dp-merf"
    assert (tmp_path / "api" / "synthetic.npz").exists()
    # the classifier's epochs (minutes on 60,000 images) are a phase of their own, not a silence after the steps
    assert [record["epoch"] for record in records
            if record.get("phase") == CLASSIFIER_PHASE and "train_loss" in record] == [1]
    phases = list(dict.fromkeys(record.get("phase") for record in records))  # every record in a named phase
    assert phases[-3:] == [SUMS_PHASE, FIT_PHASE, CLASSIFIER_PHASE] and set(phases) <= {
        f"{SUMS_PHASE}: features", SUMS_PHASE, FIT_PHASE, CLASSIFIER_PHASE}
    assert {record["total"] for record in records if record["phase"] == FIT_PHASE} == {5}


TEACHER_GUIDED_SMALL = {"batch_size": 32, "student_steps": 2, "replay_size": 256, "generator_width": (16, 8, 4),
                        "eval_every": 2, "synthetic_epochs": 1}


@pytest.mark.slow
def test_the_teacher_guided_synthesiser_is_the_release_under_replace_one_and_is_resumed_as_itself(tmp_path: Path):
    """synthesize's budget is replace-one for every method: the release's teacher and statistics are calibrated
    to it; the run's saved settings name this synthesiser, and the API hands back its generator and teacher."""
    out = tmp_path / "guided"
    result = synthesize("digits", out, method="teacher-guided", epsilon=2.0, synthetic_size=100, steps=2,
                        **TEACHER_GUIDED_SMALL)
    privacy = result.report["privacy"]
    assert privacy["relation"] == "replace-one" and privacy["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert synthesis_method(saved_synthesis_method(out)).name == "teacher-guided"  # what --resume continues
    assert result.generator.latent_dim > 0 and isinstance(result.teacher, torch.nn.Module)
    drawn = np.load(out / "synthetic.npz", allow_pickle=False)["x"]
    assert drawn.shape[1:] == (1, 8, 8) and 0 < len(drawn) <= 100  # a class the generator misses ends short
    assert result.report["accuracy"]["synthetic"] is not None and (out / "samples.png").exists()


DATALENS_BASE = ("--top-k", "16")
MERF_BASE = ("--method", "dp-merf")
GUIDED_BASE = ("--method", "teacher-guided")


@pytest.mark.parametrize("base, extra, message", [
    (DATALENS_BASE, ("--top-k", "100"), "exceeds the 64 pixels"),
    (DATALENS_BASE, ("--preset", "fancy"), "unknown DataLens preset"),
    (DATALENS_BASE, ("--sigma", "2000", "--steps", "100000"), "at most"),
    (DATALENS_BASE, ("--set", "colour=1"), "cannot set"),
    (DATALENS_BASE, ("--teachers", "1"), "at least 2"),
    (MERF_BASE, ("--teachers", "10"), "not a dp-merf setting"),
    (MERF_BASE, ("--preset", "paper"), "dp-merf has no preset"),
    (MERF_BASE, ("--set", "embedding=pixels"), "distinct parts"),
    (MERF_BASE, ("--set", "teachers=3"), "cannot set"),
    (MERF_BASE, ("--synthetic-size", "5"), "gives some of the 10 classes no image"),
    (GUIDED_BASE, ("--teachers", "10"), "not a teacher-guided setting"),
    (GUIDED_BASE, ("--set", "sigma=3"), "cannot set"),
    (GUIDED_BASE, ("--preset", "fancy"), "preset"),
    (GUIDED_BASE, ("--top-k", "5"), "top-k: a setting of a teacher's noisy answers"),
    (("--method", "dpsgd"), (), "lists every method and the command that runs it"),
])
def test_mistakes_are_one_line_and_write_nothing(tmp_path: Path, base, extra, message):
    out = tmp_path / "run"
    result = invoke("synthesize", "--dataset", "digits", "--epsilon", "1", *base, *extra, "--out", out)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not out.exists()
