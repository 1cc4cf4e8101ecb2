"""A model's provenance: only a run whose epsilon is a formal guarantee makes its models DP releases, a declared
guarantee stays a claim, and a provenance is bound to the weights and the run it describes."""

import math

import pytest

from dpdistill.errors import CheckpointError, PrivacyParameterError
from dpdistill.privacy.provenance import PROVENANCE, Provenance, file_digest, privacy_digest
from dpdistill.privacy.selection import SELECTION

DPSGD_PRIVACY = {"mode": "data", "epsilon": 0.9996, "delta": 1e-5, "relation": "add-remove",
                 "epsilon_add_remove": 0.9996, "epsilon_replace_one": 2.154, "formal_guarantee": True,
                 "covered": "the student (DP-SGD: every update is a clipped, noised per-example gradient)"}


def test_a_covered_run_makes_its_models_dp_releases_under_its_relation():
    provenance = Provenance.of_run("dpsgd", DPSGD_PRIVACY, "/runs/dp")
    assert (provenance.release, provenance.epsilon, provenance.delta) == ("dpsgd", 0.9996, 1e-5)
    assert (provenance.relation, provenance.epsilon_replace_one, provenance.verified) == ("add-remove", 2.154, True)
    privacy = provenance.privacy()
    assert privacy["epsilon"] == privacy["epsilon_add_remove"] == 0.9996 and privacy["epsilon_replace_one"] == 2.154
    assert privacy["teacher_release"]["run"] == "/runs/dp"
    assert "adding or removing one private training example" in provenance.statement()


def test_a_teacher_release_is_stated_under_replace_one_unless_it_says_otherwise():
    pate = {"mode": "data", "epsilon": 1.0, "delta": 1e-5, "covered": "the student"}
    assert Provenance.of_run("pate", pate, "/runs/pate").epsilon_replace_one == 1.0


@pytest.mark.parametrize("change", [
    {"formal_guarantee": False},  # reproducible noise, a simulated split, an unprotected read
    {"covered": "NO formal guarantee: the synthetic inputs depend on the non-private teacher"},
    {"mode": "none", "epsilon": math.inf},  # a teacher's unprotected answers
    {"epsilon": math.inf},
])
def test_a_run_without_a_formal_guarantee_releases_no_dp_model(change):
    assert Provenance.of_run("dpsgd", {**DPSGD_PRIVACY, **change}, "/runs/x") is None


def test_a_transcription_of_a_dp_teacher_passes_its_guarantee_on():
    inherited = {"mode": "none", **Provenance.of_run("dpsgd", DPSGD_PRIVACY, "/runs/dp").privacy(),
                 "covered": "the student (post-processing of the teacher's own DP release)"}
    chained = Provenance.of_run("dpsd", inherited, "/runs/tr")
    assert (chained.epsilon, chained.relation, chained.verified) == (0.9996, "add-remove", True)


def test_a_declared_guarantee_is_reported_as_its_owners_unverified_claim():
    declared = Provenance.declared(2.0, 1e-6, "replace-one")
    assert not declared.verified and "NOT verified" in declared.statement()
    assert declared.privacy()["epsilon_scope"].endswith("(post-processing; not verified)")
    inherited = {"mode": "none", **declared.privacy(), "covered": "the student"}
    assert Provenance.of_run("dpsd", inherited, "/runs/tr").verified is False  # a claim stays a claim downstream


@pytest.mark.parametrize("epsilon, delta, relation", [(0, 1e-5, "add-remove"), (1, 0, "add-remove"),
                                                      (math.inf, 1e-5, "add-remove"), (1, 1e-5, "swap-two")])
def test_an_impossible_declaration_is_refused(epsilon, delta, relation):
    with pytest.raises(PrivacyParameterError):
        Provenance.declared(epsilon, delta, relation)


def test_a_damaged_provenance_in_a_description_is_a_checkpoint_error():
    assert Provenance.of_meta({"kind": "classifier"}) is None
    with pytest.raises(CheckpointError, match="damaged provenance"):
        Provenance.of_meta({PROVENANCE: {"release": "dpsgd", "epsilon": -1}})


def test_a_provenance_binds_its_runs_privacy_section_and_carries_its_notes_on():
    noted = {**DPSGD_PRIVACY, SELECTION: ["settings chosen on this private data"]}
    provenance = Provenance.of_run("dpsgd", noted, "/runs/dp")
    assert provenance.report_sha256 == privacy_digest(noted) != privacy_digest(DPSGD_PRIVACY)
    assert privacy_digest({**noted, "epsilon": math.inf}) == privacy_digest({**noted, "epsilon": "inf"})  # as written
    assert provenance.notes == ("settings chosen on this private data",)
    inherited = {"mode": "none", **provenance.privacy(), "covered": "the student"}
    assert inherited[SELECTION] == ["settings chosen on this private data"]  # a free transcription repeats them
    assert Provenance.of_run("dpsd", inherited, "/runs/tr").notes == provenance.notes


def test_a_provenance_is_written_bound_to_the_weights_and_checked_against_them(tmp_path):
    weights = tmp_path / "student.safetensors"
    weights.write_bytes(b"the released weights")
    description = tmp_path / "student.json"
    provenance = Provenance.of_run("dpsgd", DPSGD_PRIVACY, "/runs/dp")
    meta = provenance.describing({"kind": "classifier"}, weights.read_bytes())
    bound = Provenance.of_meta(meta, description)
    assert bound.weights_sha256 == file_digest(weights)
    bound.check_weights(weights, description)
    weights.write_bytes(b"other weights")
    with pytest.raises(CheckpointError, match=f"{weights} is not the model its provenance"):
        bound.check_weights(weights, description)
    with pytest.raises(CheckpointError, match="bound to no weights"):  # an older or pasted block
        provenance.check_weights(weights, description)


def test_a_description_of_a_model_trained_without_dp_never_carries_a_provenance(tmp_path):
    provenance = Provenance.declared(2.0, 1e-6, "replace-one")
    private = {"kind": "classifier", "data_digest (private)": "0123"}
    with pytest.raises(CheckpointError, match="nothing private"):
        provenance.describing(private, b"weights")
    with pytest.raises(CheckpointError, match="'data_digest \\(private\\)'.*description was altered"):
        Provenance.of_meta({**private, PROVENANCE: provenance.to_json()}, tmp_path / "meta.json")
    ensemble = {"kind": "classifier", "ensemble": {"data_digest (private)": "0123"}, PROVENANCE: provenance.to_json()}
    with pytest.raises(CheckpointError, match="description was altered"):
        Provenance.of_meta(ensemble, tmp_path / "meta.json")
