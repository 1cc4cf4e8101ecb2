"""A user's model written in several files: the modules beside its factory file stay importable wherever the model
is copied, pickled or sent to another process, and two model folders never mix modules of one name."""

import copy
import io
import multiprocessing
import pickle
import shutil

import pytest
import torch
from opacus.validators import ModuleValidator

from dpdistill.errors import ConfigError
from dpdistill.models.checkpoint import load_classifier, save_model
from dpdistill.models.registry import build_classifier
from helpers import write_two_file_model

SHAPE = (1, 8, 8)


def logits(model, x):
    with torch.no_grad():
        return model.eval()(x)


def test_a_model_whose_factory_imports_a_module_beside_it_copies_and_pickles(tmp_path):
    model = build_classifier(write_two_file_model(tmp_path / "mycode"), SHAPE, 10)
    x = torch.randn(3, *SHAPE)
    saved = io.BytesIO()
    torch.save(model, saved)
    saved.seek(0)
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model)), torch.load(saved, weights_only=False)):
        assert torch.equal(logits(copied, x), logits(model, x))
    fixed = ModuleValidator.fix(model.train())  # copies the model through torch.save
    assert not ModuleValidator.validate(fixed)


def _unpickled_logits(pickled: bytes, x: torch.Tensor) -> torch.Tensor:
    return logits(pickle.loads(pickled), x)


@pytest.mark.slow
def test_a_process_started_afterwards_unpickles_the_model(tmp_path):
    """multiprocessing's spawn starts a fresh interpreter: it imports the model's modules from the folder the factory
    file left on sys.path."""
    model = build_classifier(write_two_file_model(tmp_path / "mycode"), SHAPE, 10)
    x = torch.randn(2, *SHAPE)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        remote = pool.apply(_unpickled_logits, (pickle.dumps(model), x))
    assert torch.equal(remote, logits(model, x))


def test_a_factory_may_import_beside_it_when_called(tmp_path):
    lazy = ("def build(in_shape, num_classes):\n    from blocks import ConvBlock\n    from torch import nn\n\n"
            "    return nn.Sequential(ConvBlock(in_shape[0], 4), nn.Flatten(), nn.LazyLinear(num_classes))\n")
    spec = write_two_file_model(tmp_path / "mycode", {"scannet.py": lazy})
    assert build_classifier(spec, SHAPE, 10)(torch.randn(2, *SHAPE)).shape == (2, 10)


def test_two_model_folders_never_mix_modules_of_one_name(tmp_path):
    first = build_classifier(write_two_file_model(tmp_path / "first"), SHAPE, 10)
    same = build_classifier(write_two_file_model(tmp_path / "copy"), SHAPE, 10)  # the same code elsewhere: shared
    assert type(same.module[0]) is type(first.module[0])

    wider = write_two_file_model(tmp_path / "other", {"blocks.py": (tmp_path / "first" / "blocks.py").read_text()
                                                      .replace("padding=1", "padding=2")})
    with pytest.raises(ConfigError, match=r"imports its module 'blocks'.*another model's module 'blocks'") as refused:
        build_classifier(wider, SHAPE, 10)
    assert "\n" not in str(refused.value) and str(tmp_path / "first" / "blocks.py") in str(refused.value)
    again = build_classifier(write_two_file_model(tmp_path / "first"), SHAPE, 10)  # the first still builds, as it was
    assert type(again.module[0]) is type(first.module[0])
    pickle.loads(pickle.dumps(first))

    unused = "from torch import nn\n\n\ndef build(num_classes):\n    return nn.Sequential(nn.Flatten(), " \
             "nn.Linear(64, num_classes))\n"
    spec = write_two_file_model(tmp_path / "unused", {"scannet.py": unused, "blocks.py": "raise SystemExit\n"})
    assert build_classifier(spec, SHAPE, 10)  # a module of the same name it never imports is no clash


def test_a_saved_model_keeps_its_code_and_loads_without_the_folder_it_was_built_from(tmp_path):
    spec = write_two_file_model(tmp_path / "mycode")
    model = build_classifier(spec, SHAPE, 10)
    meta = {"kind": "classifier", "arch": spec, "in_shape": list(SHAPE), "num_classes": 10}
    save_model(tmp_path / "run", model, meta, name="student")
    shutil.rmtree(tmp_path / "mycode")
    loaded, saved = load_classifier(tmp_path / "run", "student")
    assert saved["arch"] == "code/scannet.py:build" and saved["factory"]["copied_from"] == spec.rpartition(":")[0]
    assert sorted(path.name for path in (tmp_path / "run" / "code").iterdir()) == ["blocks.py", "scannet.py"]
    x = torch.randn(2, *SHAPE)
    assert torch.equal(logits(loaded, x), logits(model, x))
