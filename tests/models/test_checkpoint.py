"""Checkpoints round-trip exactly and refuse, with a clear CheckpointError, whatever is not theirs."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from dpdistill.errors import CheckpointError
from dpdistill.models import build_classifier, build_generator, load_classifier, load_generator, save_model
from dpdistill.models import checkpoint
from dpdistill.models.per_example import per_example
from helpers import input_orders


def _meta(arch: str = "cnn", num_classes: int = 10, **options) -> dict:
    return {"kind": "classifier", "arch": arch, "arch_options": options, "in_shape": [1, 8, 8],
            "num_classes": num_classes, "dataset": "digits", "normalisation": "[-1, 1]", "dpdistill_version": "test"}


def _generator_meta() -> dict:
    return {"kind": "generator", "latent_dim": 12, "out_shape": [1, 8, 8], "width": [8, 8, 4]}


def _trained(model: torch.nn.Module, *shape: int) -> torch.nn.Module:
    """One train-mode pass, so BatchNorm statistics differ from a fresh model's and the round trip means something."""
    model.train()(torch.randn(8, *shape))
    return model.eval()


def _save_teacher(directory: Path, arch: str = "cnn", **options) -> torch.nn.Module:
    model = _trained(build_classifier(arch, (1, 8, 8), 10, **options), 1, 8, 8)
    save_model(directory, model, _meta(arch, **options))
    return model


@pytest.mark.parametrize("arch, options", [("cnn", {}), ("datalens", {}), ("resnet18", {"width": 4})])
def test_classifier_round_trip_is_exact(tmp_path, arch, options):
    model = _save_teacher(tmp_path, arch, **options)
    loaded, meta = load_classifier(tmp_path)
    x = torch.randn(4, 1, 8, 8)
    assert not loaded.training
    assert torch.equal(model(x), loaded(x))
    assert meta == _meta(arch, **options)


def test_a_model_trained_by_dp_sgd_is_rebuilt_in_the_standard_order_it_was_trained_in(tmp_path):
    """A cnn made per-example (BatchNorm -> GroupNorm) and saved so computes on load as DP-SGD trained it: its
    GroupNorm layers read maps in the standard order, where PyTorch's CPU GroupNorm is twenty times faster than on
    channels-last maps, and its outputs are the saved model's."""
    model, _ = per_example(build_classifier("cnn", (1, 8, 8), 10).train())
    save_model(tmp_path, model.eval(), {**_meta(), "opacus_fixed": True})
    loaded, _ = load_classifier(tmp_path)
    orders = input_orders(loaded, torch.nn.GroupNorm)
    x = torch.randn(4, 1, 8, 8)
    assert torch.equal(loaded(x), model(x))
    assert orders == [True] * 3


def test_teacher_directory_layout(tmp_path):
    _save_teacher(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json", "model.json", "model.safetensors"]
    assert json.loads((tmp_path / "meta.json").read_text()) == _meta()
    with safe_open(tmp_path / "model.safetensors", "pt") as weights:
        assert weights.metadata() == {"dpdistill_kind": "classifier"}


def test_identical_saves_are_identical_bytes(tmp_path):
    """Reproducible runs must give byte-identical checkpoints, so a checksum can compare them."""
    model = _trained(build_classifier("cnn", (1, 8, 8), 10), 1, 8, 8)
    contents = set()
    for attempt in range(16):
        save_model(tmp_path / str(attempt), model, _meta())
        contents.add((tmp_path / str(attempt) / "model.safetensors").read_bytes())
    assert len(contents) == 1


def test_generator_round_trip_is_exact(tmp_path):
    generator = _trained(build_generator(12, (1, 8, 8), (8, 8, 4)), 12)
    save_model(tmp_path, generator, _generator_meta(), name="generator")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["generator.json", "generator.safetensors"]
    loaded, meta = load_generator(tmp_path)
    z = torch.randn(3, 12)
    assert not loaded.training and meta == _generator_meta()
    assert torch.equal(generator(z), loaded(z))


def test_hand_placed_meta_json_describes_a_teacher(tmp_path):
    """Without model.json, the meta.json a user placed beside the weights rebuilds the same network."""
    model = _save_teacher(tmp_path, "resnet18", width=4)
    (tmp_path / "model.json").unlink()
    loaded, meta = load_classifier(tmp_path)
    assert meta == _meta("resnet18", width=4)
    x = torch.randn(3, 1, 8, 8)
    assert not loaded.training and torch.equal(loaded(x), model(x))


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = _save_teacher(tmp_path)

    def crash(path, text):  # the description, written after the weights
        path.write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", crash)
    with pytest.raises(KeyboardInterrupt):
        save_model(tmp_path, build_classifier("cnn", (1, 8, 8), 10), _meta())
    assert not list(tmp_path.glob("*.tmp"))
    loaded, _ = load_classifier(tmp_path)
    x = torch.randn(2, 1, 8, 8)
    assert torch.equal(loaded(x), model(x))


def test_missing_teacher_says_what_is_expected_and_how_to_make_one(tmp_path):
    with pytest.raises(CheckpointError) as error:
        load_classifier(tmp_path / "nothing")
    message = str(error.value)
    assert "no teacher at" in message and "model.safetensors" in message and "meta.json" in message
    assert "dpdistill train-teacher" in message



def test_missing_encoder_says_to_pretrain_one(tmp_path):
    with pytest.raises(CheckpointError, match="no encoder at .*; pretrain one on public images with `dpdistill pretrain`"):
        load_classifier(tmp_path / "nothing", checkpoint.ENCODER, kind="encoder")

def test_missing_student_names_its_files(tmp_path):
    with pytest.raises(CheckpointError, match="student.safetensors and .*student.json"):
        load_classifier(tmp_path, name="student")


def test_missing_meta_is_a_checkpoint_error(tmp_path):
    _save_teacher(tmp_path)
    for name in ("model.json", "meta.json"):
        (tmp_path / name).unlink()
    with pytest.raises(CheckpointError, match="no model.json or meta.json"):
        load_classifier(tmp_path)


def test_a_student_never_borrows_the_teacher_description(tmp_path):
    _save_teacher(tmp_path)
    os.replace(tmp_path / "model.safetensors", tmp_path / "student.safetensors")
    with pytest.raises(CheckpointError, match="no student.json"):
        load_classifier(tmp_path, name="student")


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "no 'kind'"),
    ('{"name": "x"}', "no 'kind'"),
    ('{"kind": "classifier", "arch": "cnn", "num_classes": 10}', "lacks or garbles"),
    ('{"kind": "classifier", "arch": "cnn", "in_shape": [8, 8], "num_classes": 10}', "cannot be built"),
    ('{"kind": "classifier", "arch": "vgg99", "in_shape": [1, 8, 8], "num_classes": 10}', "cannot be built"),
])
def test_broken_meta_is_a_checkpoint_error(tmp_path, text, message):
    _save_teacher(tmp_path)
    for name in ("model.json", "meta.json"):
        (tmp_path / name).write_text(text)
    with pytest.raises(CheckpointError, match=message):
        load_classifier(tmp_path)


@pytest.mark.parametrize("damage", ["random", "truncated", "empty"])
def test_corrupt_weights_are_a_checkpoint_error(tmp_path, damage):
    _save_teacher(tmp_path)
    path = tmp_path / "model.safetensors"
    data = {"random": os.urandom(512), "truncated": path.read_bytes()[:-100], "empty": b""}[damage]
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_classifier(tmp_path)


def test_foreign_checkpoint_lists_the_keys_that_do_not_fit(tmp_path):
    _save_teacher(tmp_path, "datalens")
    for name in ("model.json", "meta.json"):
        (tmp_path / name).write_text(json.dumps(_meta("cnn")))
    with pytest.raises(CheckpointError, match=r"does not fit architecture 'cnn'.*missing \['backbone\.1\."):
        load_classifier(tmp_path)


def test_weights_of_the_wrong_size_are_refused(tmp_path):
    _save_teacher(tmp_path)
    for name in ("model.json", "meta.json"):
        (tmp_path / name).write_text(json.dumps(_meta(num_classes=7)))
    with pytest.raises(CheckpointError, match=r"wrong shape \['head\.bias', 'head\.weight'\]"):
        load_classifier(tmp_path)


def test_kinds_are_not_interchangeable(tmp_path):
    save_model(tmp_path, build_generator(12, (1, 8, 8), (8, 8, 4)), _generator_meta(), name="model")
    with pytest.raises(CheckpointError, match="holds a generator, not a classifier"):
        load_classifier(tmp_path)
    _save_teacher(tmp_path)
    with pytest.raises(CheckpointError, match="holds a classifier, not a generator"):
        load_generator(tmp_path, name="model")


def test_class_names_are_read_from_a_description_and_refused_when_garbled():
    assert checkpoint.saved_class_names({**_meta(num_classes=2), "class_names": ["cat", "dog"]}) == ("cat", "dog")
    assert checkpoint.saved_class_names(_meta()) is None  # saved before descriptions held them
    with pytest.raises(CheckpointError, match="holds class_names that are not one string a class"):
        checkpoint.saved_class_names({**_meta(num_classes=3), "class_names": ["cat", "dog"]})
