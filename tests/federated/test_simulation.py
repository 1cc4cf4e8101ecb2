"""Federated PATE on Flower's simulation: the server's sums are the owners' exact votes plus noise of the planned
size; an owner whose answers fail its boundary sits the round out, and the run either completes with the others
(the noise shares were sized for it) or stops cleanly, releasing nothing under-noised, and resumes. A server that
understates what one example moves is refused by every owner."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from dpdistill.cli.main import app
from dpdistill.data import load_dataset
from dpdistill.errors import BudgetExceededError
from dpdistill.data.public import public_split
from dpdistill.federated.config import FederatedConfig
from dpdistill.federated import method
from dpdistill.federated.owners import owner_directory, prepare_owners
from dpdistill.federated.method import FederationError
from dpdistill.methods.pate import ANSWERS_FILE
from dpdistill.methods.teachers import read_teacher
from dpdistill.models.ensemble import plurality_counts
from dpdistill.pipeline import federated
from dpdistill.privacy.ledger import Budget, ReleaseLedger
from helpers import built_once

pytestmark = [pytest.mark.slow, pytest.mark.flower, pytest.mark.simulation]
SETTINGS = dict(dataset="digits", clients=5, dirichlet_alpha=0.5, members_per_owner=4, teacher_epochs=3,
                teacher_min_steps=40, queries=160, round_queries=80, epochs=10, min_steps=400, public_size=200)


@pytest.fixture(scope="session")
def owners(tmp_path_factory) -> Path:
    """The five owners and their teachers, trained once for the run's tests (by whichever worker asks first; each
    worker has its own copy, kept for the session, as another module's test may run between two of them)."""
    return built_once(tmp_path_factory, "owners",
                      lambda directory: prepare_owners(directory, FederatedConfig(**{"epsilon": 30.0, **SETTINGS})))


def exact_votes(owner_dirs: list[Path], report: dict, out: Path) -> torch.Tensor:
    """Each owner's members' vote counts on the asked images, summed: what the noise hides."""
    answers = load_file(out / ANSWERS_FILE)
    pool = public_split(load_dataset("digits"), None, 200).pool[answers["indices"]]
    votes = []
    for directory in owner_dirs:
        ensemble, _ = read_teacher(directory)
        with torch.inference_mode():
            votes.append(plurality_counts(ensemble.member_logits(pool), 10))
    return torch.stack(votes)


def run(out: Path, owners: Path, **changes) -> dict:
    return federated(FederatedConfig(**{"epsilon": 30.0, **SETTINGS, **changes}), out, owners)


CLI_FLAGS = {"dataset", "clients", "dirichlet_alpha", "members_per_owner", "queries"}  # the rest: --set
QUICK_STUDENT = dict(epochs=1, min_steps=20)  # where only the rounds are checked, not what the student learns


def test_the_command_runs_a_federation_whose_sums_are_the_owners_votes_plus_the_planned_noise(tmp_path: Path,
                                                                                              owners: Path):
    """The acceptance command at a small scale (five owners on a Dirichlet(0.5) split, simulation engine), reusing
    the owners prepared for this module's runs where it keeps its own: beside --out, named after it."""
    owners = Path(shutil.copytree(owners, tmp_path / "run-owners"))
    weights = owner_directory(owners, 0) / "member-000" / "model.safetensors"
    trained = weights.read_bytes()
    options = [item for name, value in SETTINGS.items() for item in
               ((f"--{name.replace('_', '-')}", str(value)) if name in CLI_FLAGS else ("--set", f"{name}={value}"))]
    result = CliRunner().invoke(app, ["federated", "--epsilon", "30", "--method", "pate", "--out",
                                      str(tmp_path / "run"), *options])
    assert result.exit_code == 0, result.output
    assert "epsilon (sound, replace-one)" in result.output and (tmp_path / "run" / "report.md").exists()
    assert (tmp_path / "run" / "student.safetensors").exists() and weights.read_bytes() == trained  # reused
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["federation"]["contributors"] == [5, 5] and report["privacy"]["epsilon"] <= 30.0
    votes = load_file(tmp_path / "run" / ANSWERS_FILE)["votes"]
    residual = votes - exact_votes([owner_directory(owners, i) for i in range(5)], report, tmp_path / "run").sum(0)
    sigma = report["privacy"]["share_sigma"] * 5**0.5
    assert abs(residual.mean().item()) < 0.1 * sigma and residual.std().item() == pytest.approx(sigma, rel=0.1)
    # chance is 0.1; measured 0.53-0.67 over 8 runs (mean 0.61, std 0.05; its answers 0.63-0.79), and 0.50 once
    assert report["accuracy"]["student"] > 0.3
    ledger = json.loads((owners / "ledger.json").read_text())
    assert ledger["entries"][-1]["status"] == "spent" and ledger["entries"][-1]["discrete"] is True


@pytest.fixture
def broken_owner(owners: Path):
    """Owner 2's first member answers NaN (its weights damaged); restored afterwards."""
    weights = owner_directory(owners, 2) / "member-000" / "model.safetensors"
    kept = weights.with_suffix(".kept")
    shutil.copyfile(weights, kept)
    tensors = load_file(weights)
    save_file({name: torch.full_like(value, float("nan")) if value.is_floating_point() else value
               for name, value in tensors.items()}, weights)
    yield weights
    shutil.copyfile(kept, weights)


def test_a_refused_owner_is_a_dropout_the_noise_was_sized_for(tmp_path: Path, owners: Path, broken_owner: Path):
    report = run(tmp_path / "run", owners, dropouts=1, **QUICK_STUDENT)
    assert report["federation"]["contributors"] == [4, 4] and report["privacy"]["threshold"] == 4
    healthy = [owner_directory(owners, i) for i in (0, 1, 3, 4)]
    residual = (load_file(tmp_path / "run" / ANSWERS_FILE)["votes"]
                - exact_votes(healthy, report, tmp_path / "run").sum(0))
    sigma = report["privacy"]["share_sigma"] * 4**0.5  # the planned noise at the threshold: no less
    assert residual.std().item() == pytest.approx(sigma, rel=0.1)


def test_without_dropouts_a_refused_owner_stops_the_run_and_resume_finishes_it(tmp_path: Path, owners: Path,
                                                                               broken_owner: Path):
    out = tmp_path / "run"
    with pytest.raises(FederationError, match="stopped at round 1 of 2"):  # no colluders: a sparse graph of 3
        run(out, owners, colluders=0, **QUICK_STUDENT)  # shares, whose own threshold (2) would have unmasked 4
    assert not (out / ANSWERS_FILE).exists() and not list((out / "private").rglob("round-*.safetensors"))
    reserved = json.loads((owners / "ledger.json").read_text())["entries"][-1]
    assert reserved["status"] == "reserved" and reserved["out_dir"] == str(out)
    shutil.copyfile(broken_owner.with_suffix(".kept"), broken_owner)  # the owner repairs its teacher
    report = federated(None, out, resume=True)
    assert report["federation"]["contributors"] == [5, 5] and report["resumed"] is True
    privacy = report["privacy"]
    assert (privacy["secagg_graph"], privacy["secagg_shares"], privacy["secagg_share_threshold"]) == ("sparse", 3, 2)
    residual = (load_file(out / ANSWERS_FILE)["votes"]
                - exact_votes([owner_directory(owners, i) for i in range(5)], report, out).sum(0))
    assert residual.std().item() == pytest.approx(privacy["share_sigma"] * 5**0.5, rel=0.1)  # every mask removed
    assert json.loads((owners / "ledger.json").read_text())["entries"][-1]["status"] == "spent"


@pytest.fixture
def kept_ledgers(owners: Path):
    """The owners' ledgers as they were, restored after a test that sets their totals."""
    paths = [owners / "ledger.json", owner_directory(owners, 3) / "ledger.json"]
    saved = {path: path.read_bytes() if path.exists() else None for path in paths}
    yield
    for path, content in saved.items():
        path.unlink(missing_ok=True)
        if content is not None:
            path.write_bytes(content)


def test_an_owners_client_enforces_its_own_budget_and_the_server_says_why(tmp_path: Path, owners: Path,
                                                                        kept_ledgers):
    ledger = ReleaseLedger(owner_directory(owners, 3))
    spent = ledger.read().spent()
    ledger.set_total(spent + 1.0)  # no room for another run at epsilon 30
    with pytest.raises(FederationError, match="owner-003 refused: .*past its privacy budget"):
        run(tmp_path / "run", owners, **QUICK_STUDENT)
    assert ledger.read().spent() == pytest.approx(spent)  # it answered nothing
    assert not list((tmp_path / "run" / "private").rglob("round-*.safetensors"))  # and nothing was revealed


def test_federated_budget_caps_every_run_of_the_owners_before_any_round(tmp_path: Path, owners: Path, kept_ledgers):
    before = ReleaseLedger(owner_directory(owners, 0)).read().spent()
    with pytest.raises(BudgetExceededError, match="past its privacy budget"):
        federated(FederatedConfig(**{"epsilon": 30.0, **SETTINGS, **QUICK_STUDENT}), tmp_path / "run", owners,
                  budget=Budget(ReleaseLedger(owners).read().spent() + 1.0, 1e-5))
    assert ReleaseLedger(owner_directory(owners, 0)).read().spent() == before  # no owner was asked


def test_every_owner_refuses_a_server_that_understates_the_sensitivity_and_reveals_nothing(tmp_path: Path,
                                                                                          owners: Path, monkeypatch):
    """The server plans with one vote moving its owner's counts by 1e-3 (a sqrt(2) would be honest): its noise is
    then far too small for what it states. Each owner's client computes its sensitivity from its own answers."""
    def understated(config: FederatedConfig, num_classes: int, in_shape: tuple[int, ...]):
        return dataclasses.replace(method.answer_wire(num_classes, in_shape, config.members), member_sensitivity=1e-3)

    monkeypatch.setattr(method, "vote_wire", understated)  # the server's side only: the owners answer in Ray's workers
    directories = [owner_directory(owners, index) for index in range(5)]
    before = [ReleaseLedger(directory).read().entries for directory in directories]
    with pytest.raises(FederationError, match="stopped at round 1 of 2") as stopped:
        run(tmp_path / "run", owners, **QUICK_STUDENT)
    for directory in directories:
        assert f"{directory.name} refused: the run states terms this owner computes otherwise: member_sensitivity " \
               f"0.001 (this owner's: 1.414" in str(stopped.value)
    assert [ReleaseLedger(directory).read().entries for directory in directories] == before  # nothing charged
    assert not list((tmp_path / "run" / "private").rglob("round-*.safetensors"))  # nothing revealed
