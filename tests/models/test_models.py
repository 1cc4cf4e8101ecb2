"""Architectures, the generator, and checkpoints that refuse what is not theirs."""

import textwrap
from pathlib import Path

import pytest
import torch

from dpdistill.errors import CheckpointError, ConfigError
from dpdistill.models.checkpoint import load_classifier, load_generator, save_model
from dpdistill.models.registry import CLASSIFIERS, build_classifier, build_generator

SHAPES = [(1, 28, 28), (1, 8, 8)]


@pytest.mark.parametrize("arch", sorted(CLASSIFIERS))
@pytest.mark.parametrize("shape", SHAPES + [(3, 32, 32)])
def test_classifiers_give_logits_and_features(arch, shape):
    options = {"width": 8} if arch.startswith("resnet") else {}
    model = build_classifier(arch, shape, 7, **options).eval()
    x = torch.randn(3, *shape)
    features = model.features(x)
    assert features.dim() == 2 and features.shape[0] == 3
    assert torch.allclose(model(x), model.classify(features))
    assert model(x).shape == (3, 7)


@pytest.mark.parametrize("shape", SHAPES + [(3, 32, 32)])
def test_generator_shape_and_range(shape):
    images = build_generator(16, shape, (16, 8, 4))(torch.randn(5, 16))
    assert images.shape == (5, *shape)
    assert images.min() >= -1 and images.max() <= 1


def _meta(arch="cnn", shape=(1, 8, 8)):
    return {"kind": "classifier", "arch": arch, "arch_options": {}, "in_shape": list(shape), "num_classes": 10}


def test_classifier_round_trip_is_exact(tmp_path: Path):
    model = build_classifier("cnn", (1, 8, 8), 10).eval()
    save_model(tmp_path, model, _meta())
    loaded, meta = load_classifier(tmp_path)
    x = torch.randn(4, 1, 8, 8)
    assert torch.equal(model(x), loaded(x))
    assert (tmp_path / "meta.json").exists() and meta["arch"] == "cnn"
    assert not list(tmp_path.glob("*.tmp"))


def test_generator_round_trip_is_exact(tmp_path: Path):
    generator = build_generator(12, (1, 8, 8), (8, 8, 4)).eval()
    save_model(tmp_path, generator, {"kind": "generator", "latent_dim": 12, "out_shape": [1, 8, 8], "width": [8, 8, 4]},
               name="generator")
    loaded, _ = load_generator(tmp_path)
    z = torch.randn(3, 12)
    assert torch.equal(generator(z), loaded(z))


def test_missing_teacher_says_how_to_make_one(tmp_path: Path):
    with pytest.raises(CheckpointError, match="train-teacher"):
        load_classifier(tmp_path / "nothing")


def test_corrupt_weights_are_a_checkpoint_error(tmp_path: Path):
    save_model(tmp_path, build_classifier("cnn", (1, 8, 8), 10), _meta())
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage" * 50)
    with pytest.raises(CheckpointError, match="safetensors"):
        load_classifier(tmp_path)


def test_broken_meta_is_a_checkpoint_error(tmp_path: Path):
    save_model(tmp_path, build_classifier("cnn", (1, 8, 8), 10), _meta())
    for name in ("model.json", "meta.json"):
        (tmp_path / name).write_text("{not json")
    with pytest.raises(CheckpointError, match="JSON"):
        load_classifier(tmp_path)


def test_foreign_checkpoint_is_refused(tmp_path: Path):
    save_model(tmp_path, build_classifier("datalens", (1, 8, 8), 10), _meta("datalens"))
    meta = _meta("cnn")
    for name in ("model.json", "meta.json"):
        (tmp_path / name).write_text(__import__("json").dumps(meta))
    with pytest.raises(CheckpointError, match="does not fit"):
        load_classifier(tmp_path)


def test_a_generator_is_not_a_classifier(tmp_path: Path):
    save_model(tmp_path, build_generator(4, (1, 8, 8), (4, 4, 4)),
               {"kind": "generator", "latent_dim": 4, "out_shape": [1, 8, 8], "width": [4, 4, 4]}, name="model")
    with pytest.raises(CheckpointError, match="not a classifier"):
        load_classifier(tmp_path)


def test_unknown_arch_names_the_choices():
    with pytest.raises(ConfigError, match="cnn, datalens"):
        build_classifier("vgg99", (1, 8, 8), 10)


def test_user_factory_is_adapted_saved_and_reloaded(tmp_path: Path, monkeypatch):
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""
        from torch import nn
        def tiny(in_shape, num_classes):
            return nn.Sequential(nn.Flatten(), nn.Linear(in_shape[1] * in_shape[2], 16), nn.ReLU(),
                                 nn.Linear(16, num_classes))
        NOT_CALLABLE = 3
        def wrong(in_shape, num_classes):
            return nn.Linear(3, 3)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    model = build_classifier("my_models:tiny", (1, 8, 8), 10).eval()
    x = torch.randn(2, 1, 8, 8)
    assert model.features(x).shape == (2, 16)
    assert torch.allclose(model.classify(model.features(x)), model(x))
    save_model(tmp_path / "ckpt", model, _meta("my_models:tiny"))
    loaded, _ = load_classifier(tmp_path / "ckpt")
    assert torch.equal(loaded(x), model(x))
    for bad in ("my_models:NOT_CALLABLE", "my_models:absent", "no_such_module:f"):
        with pytest.raises(ConfigError):
            build_classifier(bad, (1, 8, 8), 10)
    with pytest.raises(ConfigError, match="fails on inputs"):
        build_classifier("my_models:wrong", (1, 8, 8), 10)
