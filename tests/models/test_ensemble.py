"""Teacher ensembles: trained on disjoint partitions, saved member by member, loaded whole or refused clearly;
partitioned by a secret key of their own, and every release says what the partition assumes."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dpdistill.data import load_dataset
from dpdistill.data.partition import KEY_BYTES, partition_indices
from dpdistill.errors import CheckpointError, ConfigError
from dpdistill.methods.config import build_config
from dpdistill.methods.pate import PateConfig
from dpdistill.models.checkpoint import load_classifier
from dpdistill.models.ensemble import (ENSEMBLE_FILE, HEADS, PARTITION_KEY_FILE, HeadEnsemble, MemberEnsemble,
                                       TeacherEnsemble, load_teacher, member_directory, partition_assumption,
                                       read_partition_key)
from dpdistill import jobs
from dpdistill.jobs import train_teacher_ensemble
from dpdistill.pipeline import pate, transcribe
from dpdistill.training.teacher import TeacherConfig, train_classifier

KEYED = ("a keyed hash of each example's id (secret key from OS entropy): adding, removing or replacing one example "
         "changes one member")


def test_training_writes_members_and_a_report_of_their_partitions(digits_ensemble: Path):
    report = json.loads((digits_ensemble / "report.json").read_text())
    assert report["ensemble"] == {"members": 4, "partition": {"scheme": "keyed-hash",
                                                              "key": "partition-key.json (private: never release it)",
                                                              "ids": load_dataset("digits").ids_source,
                                                              "assumption": KEYED},
                                  "layout": "separate networks"}
    assert json.loads((digits_ensemble / ENSEMBLE_FILE).read_text())["partition"] == report["ensemble"]["partition"]
    assert report["privacy"]["guarantee"].endswith(f"partition: {KEYED}")
    key = read_partition_key(digits_ensemble)
    assert len(key) == KEY_BYTES and (digits_ensemble / PARTITION_KEY_FILE).stat().st_mode & 0o077 == 0
    assert all(key.hex() not in path.read_text() for path in digits_ensemble.glob("*.json")
               if path.name != PARTITION_KEY_FILE)
    parts = partition_indices(load_dataset("digits").ids_train, 4, key)  # the members' partitions, from the key
    assert [member["examples"] for member in report["members"]] == [len(part) for part in parts]
    assert sum(member["examples"] for member in report["members"]) == 1437  # the whole digits training split
    accuracy = report["accuracy"]
    assert accuracy["member_min"] > 0.5 and accuracy["teacher"] >= accuracy["member_mean"] - 0.02
    assert 0.8 < accuracy["plurality_vote"] <= 1


def test_each_member_trains_on_its_own_keyed_partition_and_they_are_disjoint(tmp_path: Path, monkeypatch):
    """The ids each member actually trained on: pairwise disjoint, together the whole training split, and each
    the keyed-hash partition the saved key gives (so one example is in exactly one member)."""
    trained_on: list[torch.Tensor] = []

    def recording(dataset, config, *args, **kwargs):
        trained_on.append(dataset.ids_train.clone())
        return train_classifier(dataset, config, *args, **kwargs)

    monkeypatch.setattr(jobs, "train_classifier", recording)
    train_teacher_ensemble("digits", tmp_path, TeacherConfig(arch="cnn", epochs=1, batch_size=64, min_steps=1), 3)
    ids = load_dataset("digits").ids_train
    assert len(trained_on) == 3 and all(len(part) > 0 for part in trained_on)
    assert sum(len(part) for part in trained_on) == len(ids)
    assert torch.equal(torch.cat(trained_on).sort().values, ids.sort().values)  # disjoint, and nothing left out
    keyed = partition_indices(ids, 3, read_partition_key(tmp_path))
    assert all(torch.equal(part, ids[index]) for part, index in zip(trained_on, keyed))


def test_an_ensemble_loads_whole_and_each_member_alone(digits_ensemble: Path):
    ensemble, meta = load_teacher(digits_ensemble)
    assert isinstance(ensemble, TeacherEnsemble) and len(ensemble) == 4 and meta["ensemble"]["members"] == 4
    member, _ = load_classifier(member_directory(digits_ensemble, 2))
    images = torch.randn(5, *meta["in_shape"])
    with torch.no_grad():
        assert torch.allclose(ensemble.member_logits(images)[2], member(images))
        mean_probability = F.softmax(ensemble.member_logits(images), -1).mean(0)
        assert torch.allclose(ensemble(images).exp(), mean_probability, atol=1e-6)
    single, _ = load_teacher(member_directory(digits_ensemble, 0))
    assert not isinstance(single, TeacherEnsemble)


def test_a_broken_ensemble_is_a_clear_error(digits_ensemble: Path, tmp_path: Path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / ENSEMBLE_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="not a valid ensemble description"):
        load_teacher(broken)
    (broken / ENSEMBLE_FILE).write_text(json.dumps({"kind": "ensemble", "members": 2}))
    with pytest.raises(CheckpointError, match="no teacher at"):  # members missing
        load_teacher(broken)
    (broken / ENSEMBLE_FILE).write_text(json.dumps({"kind": "student", "members": 2}))
    with pytest.raises(CheckpointError, match="does not describe"):
        load_teacher(broken)


def test_ensemble_forward_is_the_log_of_the_mean_probability():
    members = [torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3)) for _ in range(3)]
    ensemble = MemberEnsemble(members)  # type: ignore[arg-type]
    x = torch.randn(2, 1, 2, 2)
    expected = torch.log(torch.stack([F.softmax(m(x), -1) for m in members]).mean(0))
    assert torch.allclose(ensemble(x), expected, atol=1e-6)
    assert math.isclose(ensemble(x).exp().sum(-1)[0].item(), 1.0, rel_tol=1e-5)


def test_an_interrupted_ensemble_training_resumes_after_its_last_finished_member(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch):
    key = bytes(range(KEY_BYTES))
    fresh_keys = iter([key, key])  # one per fresh training: the resumed one must reuse its saved key
    monkeypatch.setattr(jobs, "new_partition_key", lambda: next(fresh_keys))
    config = TeacherConfig(arch="cnn", epochs=1, batch_size=64, min_steps=5)
    whole = train_teacher_ensemble("digits", tmp_path / "whole", config, 3)

    shown: list[dict] = []

    def stop_after_two(record: dict) -> None:
        shown.append(record)
        if record.get("member") == 2:
            raise KeyboardInterrupt

    out = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        train_teacher_ensemble("digits", out, config, 3, progress=stop_after_two)
    assert not (out / ENSEMBLE_FILE).exists()  # a partial ensemble is never loadable
    assert {record["phase"] for record in shown if "phase" in record} == {"member 1/3", "member 2/3"}  # its epochs
    with pytest.raises(ConfigError, match="unfinished run"):
        train_teacher_ensemble("digits", out, config, 3)
    trained_sizes = []

    def counting(subset, *args, **kwargs):
        trained_sizes.append(len(subset.y_train))
        return train_classifier(subset, *args, **kwargs)

    monkeypatch.setattr(jobs, "train_classifier", counting)
    resumed = train_teacher_ensemble("cifar-does-not-matter", out, TeacherConfig(epochs=9), 7, resume=True)
    assert resumed["ensemble"]["members"] == 3  # the saved settings, not the call's
    assert trained_sizes == [whole["members"][2]["examples"]]  # only the unfinished member is trained
    def trained(report: dict) -> list[dict]:
        return [{key: value for key, value in member.items() if key != "wall_seconds"} for member in report["members"]]

    assert trained(resumed) == trained(whole) and resumed["accuracy"] == whole["accuracy"]  # as if never stopped
    assert resumed["timing"]["wall_seconds"] > sum(member["wall_seconds"] for member in resumed["members"][:2])
    assert not (out / "resume").exists() and read_partition_key(out) == key
    with pytest.raises(ConfigError, match="nothing to resume"):
        train_teacher_ensemble("digits", out, config, 3, resume=True)


def test_an_interrupted_training_without_its_partition_key_is_not_resumed(tmp_path: Path):
    """An older dpdistill's unfinished run: a new key would give its finished members' examples to others."""
    (tmp_path / "resume").mkdir()
    (tmp_path / "resume" / "ensemble-plan.json").write_text(json.dumps(
        {"dataset": "digits", "partitions": 3, "alpha": None, "config": {"epochs": 1}}))
    with pytest.raises(CheckpointError, match="no valid partition key at .*partition-key.json"):
        train_teacher_ensemble("digits", tmp_path, TeacherConfig(), 3, resume=True)


@pytest.fixture(scope="module")
def digits_heads(digits_encoder: Path, tmp_path_factory) -> Path:
    """Four linear heads on the frozen digits encoder, one per IID quarter of the training split."""
    directory = tmp_path_factory.mktemp("heads")
    config = TeacherConfig(lr=0.05, min_steps=100, weight_decay=1e-3, init=str(digits_encoder), heads_only=True)
    train_teacher_ensemble("digits", directory, config, 4)
    return directory


def test_heads_on_a_frozen_encoder_train_as_an_ensemble(digits_heads: Path, digits_encoder: Path):
    report = json.loads((digits_heads / "report.json").read_text())
    assert report["ensemble"]["members"] == 4 and "frozen encoder" in report["ensemble"]["layout"]
    assert sum(member["examples"] for member in report["members"]) == 1437
    accuracy = report["accuracy"]
    assert accuracy["member_min"] > 0.5 and accuracy["plurality_vote"] > 0.6
    ensemble, meta = load_teacher(digits_heads)
    assert isinstance(ensemble, HeadEnsemble) and len(ensemble) == 4 and meta["kind"] == "head-ensemble"
    encoder, _ = load_classifier(digits_encoder, "encoder", kind="encoder")
    images = torch.randn(5, 1, 8, 8)
    with torch.no_grad():
        features = encoder.features(images)  # the encoder is saved along, unchanged
        assert torch.allclose(ensemble.member_logits(images)[2], features @ ensemble.weight[2] + ensemble.bias[2],
                              atol=1e-5)
        mean_probability = F.softmax(ensemble.member_logits(images), -1).mean(0)
        assert torch.allclose(ensemble(images).exp(), mean_probability, atol=1e-6)


def test_heads_on_scattering_features_need_no_encoder(tmp_path: Path):
    config = TeacherConfig(arch="cnn", lr=0.05, min_steps=100, init="scatter", heads_only=True)
    assert config.arch == "scatter-linear"  # the features' model, whatever --arch said
    report = train_teacher_ensemble("digits", tmp_path, config, 4)
    assert "scattering features" in report["ensemble"]["layout"]
    assert report["accuracy"]["member_min"] > 0.5 and report["accuracy"]["plurality_vote"] > 0.6  # chance 0.1
    ensemble, meta = load_teacher(tmp_path)
    assert isinstance(ensemble, HeadEnsemble) and meta["arch"] == "scatter-linear" and len(ensemble) == 4
    assert not any(weight.requires_grad for weight in ensemble.encoder.parameters())
    digits = load_dataset("digits")
    with torch.no_grad():
        votes = ensemble.member_logits(digits.x_test).argmax(-1)
    assert (votes == digits.y_test).float().mean(1).min() == pytest.approx(report["accuracy"]["member_min"], abs=1e-6)


def test_a_broken_head_ensemble_is_a_clear_error(digits_heads: Path, tmp_path: Path):
    for name in (ENSEMBLE_FILE, f"{HEADS}.json", f"{HEADS}.safetensors"):
        (tmp_path / name).write_bytes((digits_heads / name).read_bytes())
    description = json.loads((tmp_path / ENSEMBLE_FILE).read_text())
    (tmp_path / ENSEMBLE_FILE).write_text(json.dumps({**description, "members": 5}))
    with pytest.raises(CheckpointError, match="announces 5 members"):
        load_teacher(tmp_path)
    (tmp_path / ENSEMBLE_FILE).write_text(json.dumps(description))
    meta = json.loads((tmp_path / f"{HEADS}.json").read_text())
    (tmp_path / f"{HEADS}.json").write_text(json.dumps({**meta, "members": 3}))
    with pytest.raises(CheckpointError, match="wrong shape"):
        load_teacher(tmp_path)
    (tmp_path / f"{HEADS}.json").write_text(json.dumps(meta))
    (tmp_path / f"{HEADS}.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_teacher(tmp_path)


def test_each_ensemble_training_draws_its_own_key_whatever_its_seed(digits_heads: Path, digits_encoder: Path,
                                                                     tmp_path: Path):
    config = TeacherConfig(lr=0.05, min_steps=10, init=str(digits_encoder), heads_only=True, seed=0)  # as digits_heads
    report = train_teacher_ensemble("digits", tmp_path, config, 4)
    key = read_partition_key(tmp_path)
    assert key != read_partition_key(digits_heads)
    parts = partition_indices(load_dataset("digits").ids_train, 4, key)
    assert [member["examples"] for member in report["members"]] == [len(part) for part in parts]


@pytest.mark.parametrize("ensemble, holds, words", [
    (None, True, "one teacher, no partition"),
    ({"partition": {"scheme": "keyed-hash"}}, True, KEYED),
    ({"partition": {"scheme": "dirichlet", "alpha": 0.5, "seed": 0}}, False, "held apart by their owners"),
    ({"partition": {"scheme": "iid", "alpha": None, "seed": 0}}, False, "older dpdistill"),
    ({"kind": "ensemble", "members": 2}, False, "unknown partition scheme None"),
])
def test_each_partition_states_its_assumption_and_whether_it_holds(ensemble, holds, words):
    assumption = partition_assumption(ensemble)
    assert assumption.holds is holds and words in assumption.statement
    assert ("NO formal guarantee" in assumption.statement) is not holds


@pytest.fixture(scope="module")
def dirichlet_heads(digits_encoder: Path, tmp_path_factory) -> Path:
    """Four heads on Dirichlet(0.5) class proportions: owners who hold their data apart, simulated."""
    directory = tmp_path_factory.mktemp("dirichlet-heads")
    config = TeacherConfig(lr=0.05, min_steps=50, weight_decay=1e-3, init=str(digits_encoder), heads_only=True)
    train_teacher_ensemble("digits", directory, config, 4, alpha=0.5)
    return directory


TINY_PATE = PateConfig(epsilon=1e6, sigma=0.05, queries=50, public_size=200, min_steps=20, self_training_rounds=0)


def test_a_dirichlet_ensemble_says_its_split_is_simulated_and_its_releases_have_no_formal_guarantee(
        dirichlet_heads: Path, digits_ensemble: Path, tmp_path: Path):
    partition = json.loads((dirichlet_heads / ENSEMBLE_FILE).read_text())["partition"]
    assert partition == {"scheme": "dirichlet", "alpha": 0.5, "seed": 0,
                         "assumption": partition_assumption({"partition": partition}).statement}
    assert not (dirichlet_heads / PARTITION_KEY_FILE).exists()  # a seeded simulation, no key
    privacy = pate(dirichlet_heads, TINY_PATE, tmp_path / "dirichlet")["privacy"]
    assert privacy["partition_assumption"] == partition["assumption"] and privacy["formal_guarantee"] is False
    assert privacy["covered"].startswith("NO formal guarantee: the members' data are held apart by their owners")
    assert "Covered: NO formal guarantee" in (tmp_path / "dirichlet" / "report.md").read_text()
    keyed = pate(digits_ensemble, TINY_PATE, tmp_path / "keyed")["privacy"]
    assert keyed["partition_assumption"] == KEYED and "formal_guarantee" not in keyed
    assert not keyed["covered"].startswith("NO formal guarantee")
    key = read_partition_key(digits_ensemble).hex()
    assert all(key not in (tmp_path / "keyed" / name).read_text() for name in ("report.json", "report.md"))


def test_an_older_ensemble_split_by_position_is_transcribed_without_a_formal_guarantee(digits_ensemble: Path,
                                                                                      tmp_path: Path):
    older = tmp_path / "older"
    shutil.copytree(digits_ensemble, older)
    (older / PARTITION_KEY_FILE).unlink()
    description = json.loads((older / ENSEMBLE_FILE).read_text())
    (older / ENSEMBLE_FILE).write_text(json.dumps({**description,
                                                   "partition": {"scheme": "iid", "alpha": None, "seed": 0}}))
    config = build_config("demo", {"iterations": 3, "batch_size": 16}, {"mode": "label", "epsilon": 1.0})
    privacy = transcribe(older, config, tmp_path / "run", "digits")["privacy"]
    assert privacy["formal_guarantee"] is False and "older dpdistill" in privacy["partition_assumption"]
    assert privacy["covered"].startswith("NO formal guarantee: a shuffled split of positions")
    assert "Covered: NO formal guarantee" in (tmp_path / "run" / "report.md").read_text()
    keyed = transcribe(digits_ensemble, config, tmp_path / "keyed", "digits")["privacy"]
    assert keyed["partition_assumption"] == KEYED and "formal_guarantee" not in keyed
