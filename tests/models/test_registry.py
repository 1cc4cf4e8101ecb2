"""User architectures given as `module.path:callable`: built, adapted, checked, saved and reloaded."""

import pytest
import torch

from dpdistill.errors import ConfigError
from dpdistill.models import Classifier, ForeignClassifier, build_classifier, load_classifier, save_model
from dpdistill.models.classifiers import DataLensStudent
from dpdistill.models.registry import initialise


def _meta(arch: str) -> dict:
    return {"kind": "classifier", "arch": arch, "arch_options": {}, "in_shape": [1, 8, 8], "num_classes": 10}


def test_user_model_is_adapted_saved_and_reloaded(user_module, tmp_path):
    arch = f"{user_module}:tiny"
    model = build_classifier(arch, (1, 8, 8), 10)
    assert isinstance(model, ForeignClassifier) and model.training
    model(torch.randn(8, 1, 8, 8))  # move the BatchNorm statistics away from their initial values
    model.eval()
    x = torch.randn(2, 1, 8, 8)
    assert model.features(x).shape == (2, 16)
    assert torch.allclose(model.classify(model.features(x)), model(x))
    save_model(tmp_path / "teacher", model, _meta(arch))
    loaded, meta = load_classifier(tmp_path / "teacher")
    assert meta["arch"] == arch and isinstance(loaded, ForeignClassifier)
    assert torch.equal(loaded(x), model(x))


def test_user_classifier_subclass_is_used_as_is(user_module):
    assert type(build_classifier(f"{user_module}:ready_made", (1, 8, 8), 10)) is DataLensStudent


def test_build_check_leaves_batchnorm_statistics_alone(user_module):
    model = build_classifier(f"{user_module}:tiny", (1, 8, 8), 10)
    batch_norm = model.module[2]
    assert batch_norm.num_batches_tracked.item() == 0 and torch.equal(batch_norm.running_var, torch.ones(16))


@pytest.mark.parametrize("name, message", [
    ("NOT_CALLABLE", "not a callable"),
    ("absent", "cannot import"),
    ("not_a_module", "not a torch.nn.Module"),
    ("raises", r"failed when called as raises\(in_shape=\(1, 8, 8\), num_classes=10\): no such layer"),
    ("no_in_shape", "fails on inputs"),  # called with num_classes alone, it builds a layer for other inputs
    ("no_linear", "nn.Linear"),
    ("wrong_size", "fails on inputs"),
    ("wrong_classes", r"expected \(2, 10\)"),
    ("softmax_after", "differs from classify"),
])
def test_bad_user_factories_are_config_errors(user_module, name, message):
    with pytest.raises(ConfigError, match=message):
        build_classifier(f"{user_module}:{name}", (1, 8, 8), 10)


@pytest.mark.parametrize("spec", ["no_such_module_xyz:build", ":build", "dpdistill.models:", "a..b:c"])
def test_malformed_or_missing_factory_strings_are_config_errors(spec):
    with pytest.raises(ConfigError, match="module.path:callable|cannot import"):
        build_classifier(spec, (1, 8, 8), 10)


def test_foreign_classifier_is_a_classifier(user_module):
    assert isinstance(build_classifier(f"{user_module}:tiny", (1, 8, 8), 10), Classifier)


def test_xavier_draws_glorot_uniform_weights_and_zero_biases():
    torch.manual_seed(0)
    model = initialise(build_classifier("datalens", (1, 28, 28), 10), "xavier")
    for layer in (module for module in model.modules() if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear))):
        fan_in = layer.weight[0].numel()
        fan_out = layer.weight.shape[0] * layer.weight[0, 0].numel()
        bound = (6 / (fan_in + fan_out)) ** 0.5
        assert layer.weight.abs().max() <= bound and layer.weight.abs().max() > 0.9 * bound
        assert (layer.bias == 0).all()
