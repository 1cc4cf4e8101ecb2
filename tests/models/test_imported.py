"""Models trained outside dpdistill: factories called with what they accept, weights fitted under their own keys,
NaN refused, and the declared input transform applied inside the model wherever it is loaded."""

import json
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import dpdistill
from dpdistill.errors import CheckpointError, ConfigError
from dpdistill.methods.config import build_config
from dpdistill.models import build_classifier, load_classifier
from dpdistill.models.imported import import_classifier
from dpdistill.models.transform import input_transform_spec, parse_input_transform
from dpdistill.jobs import import_teacher
from dpdistill.pipeline import transcribe

FACTORIES = textwrap.dedent("""
    import torch
    from torch import nn


    def _net(num_classes=10, received=None):
        model = nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))
        model.received = received
        return model


    def classes_only(num_classes):
        return _net(num_classes, {"num_classes": num_classes})


    def shape_only(in_shape):
        return _net(10, {"in_shape": in_shape})


    def both(in_shape, num_classes):
        return _net(num_classes, {"in_shape": in_shape, "num_classes": num_classes})


    def anything(**options):
        return _net(options["num_classes"], options)


    def neither():
        return _net(10, {})


    class Statistics(nn.Module):
        '''Logits 0-2 are the batch's minimum, maximum and mean input (the last Linear is the identity).'''

        def __init__(self, num_classes):
            super().__init__()
            self.fc = nn.Linear(num_classes, num_classes)

        def forward(self, x):
            flat = x.flatten(1)
            stats = torch.stack([flat.min(1).values, flat.max(1).values, flat.mean(1)], 1)
            return self.fc(torch.cat([stats, torch.zeros(len(x), self.fc.in_features - 3)], 1))


    def statistics(num_classes):
        return Statistics(num_classes)
""")


@pytest.fixture
def factories(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "factories.py"
    path.parent.mkdir()
    path.write_text(FACTORIES)
    return path


@pytest.mark.parametrize("name, received", [
    ("classes_only", {"num_classes": 10}),
    ("shape_only", {"in_shape": (1, 8, 8)}),
    ("both", {"in_shape": (1, 8, 8), "num_classes": 10}),
    ("anything", {"in_shape": (1, 8, 8), "num_classes": 10}),
    ("neither", {}),
])
def test_a_factory_is_called_with_the_arguments_it_accepts(factories, name, received):
    model = build_classifier(f"{factories}:{name}", (1, 8, 8), 10)
    assert model.module.received == received


def _identity_statistics(path: Path) -> Path:
    weights = path / "statistics.safetensors"
    save_file({"fc.weight": torch.eye(10), "fc.bias": torch.zeros(10)}, weights)
    return weights


def test_a_module_factory_stays_a_reference(user_module, tmp_path):
    network = build_classifier(f"{user_module}:tiny", (1, 8, 8), 10).module.eval()
    weights = tmp_path / "tiny.safetensors"
    save_file({key: value.contiguous() for key, value in network.state_dict().items()}, weights)
    teacher = tmp_path / "teacher"
    import_teacher(f"{user_module}:tiny", weights, "digits", teacher)
    meta = json.loads((teacher / "meta.json").read_text())
    assert meta["arch"] == meta["factory"]["reference"] == f"{user_module}:tiny"
    assert "PYTHONPATH" in meta["factory"]["note"]
    assert not (teacher / "factory.py").exists()
    x = torch.randn(4, 1, 8, 8)
    assert torch.equal(load_classifier(teacher)[0](x), network(x))


def test_weights_under_other_keys_are_refused_in_one_line(factories, tmp_path):
    weights = tmp_path / "prefixed.safetensors"
    save_file({"module.fc.weight": torch.eye(10), "module.fc.bias": torch.zeros(10)}, weights)
    with pytest.raises(CheckpointError) as error:
        import_classifier(f"{factories}:statistics", weights, (1, 8, 8), 10, None)
    message = str(error.value)
    assert "\n" not in message
    assert "missing ['fc.bias', 'fc.weight']" in message
    assert "unexpected ['module.fc.bias', 'module.fc.weight']" in message


def test_nan_weights_are_refused_at_import(factories, tmp_path):
    weights = tmp_path / "nan.safetensors"
    save_file({"fc.weight": torch.eye(10), "fc.bias": torch.tensor([float("nan")] + [0.0] * 9)}, weights)
    with pytest.raises(CheckpointError, match=r"NaN or infinite values in 1 tensor\(s\), e.g. \['fc.bias'\]"):
        import_classifier(f"{factories}:statistics", weights, (1, 8, 8), 10, None)


def test_a_teacher_whose_weights_became_nan_is_refused_on_load_before_any_budget_is_spent(factories, tmp_path):
    teacher = tmp_path / "teacher"
    dpdistill.import_teacher(f"{factories}:statistics", _identity_statistics(tmp_path), "digits", teacher)
    tensors = load_file(teacher / "model.safetensors")
    tensors["module.fc.weight"][0, 0] = float("inf")
    save_file(tensors, teacher / "model.safetensors")
    with pytest.raises(CheckpointError, match="NaN or infinite"):
        load_classifier(teacher)
    config = build_config("demo", {"iterations": 2}, {"mode": "label", "epsilon": 10.0})
    with pytest.raises(CheckpointError, match="NaN or infinite"):
        transcribe(teacher, config, tmp_path / "run")
    assert not (teacher / "ledger.json").exists() and not (tmp_path / "run").exists()


def test_the_input_transform_is_applied_inside_the_model_wherever_it_is_loaded(factories, tmp_path):
    teacher = tmp_path / "teacher"
    result = dpdistill.import_teacher(f"{factories}:statistics", _identity_statistics(tmp_path), "digits", teacher,
                                      input_range=(0, 1), mean=[0.5], std=[0.25])
    x = torch.tensor([-1.0, 1.0, 1.0, 1.0]).repeat(16).view(1, 1, 8, 8)  # min -1, max 1, mean 0.5
    expected = torch.tensor([(0 - 0.5) / 0.25, (1 - 0.5) / 0.25, (0.75 - 0.5) / 0.25])
    for model in (result.model, dpdistill.load_model(teacher), load_classifier(teacher)[0]):
        assert torch.allclose(model(x)[0, :3], expected)
        assert torch.allclose(model.classify(model.features(x)), model(x))
    untransformed = dpdistill.import_teacher(f"{factories}:statistics", _identity_statistics(tmp_path), "digits",
                                             tmp_path / "plain").model
    assert torch.allclose(untransformed(x)[0, :3], torch.tensor([-1.0, 1.0, 0.5]))


@pytest.mark.parametrize("input_range, normalize, expected", [
    (None, None, None),
    ("-1,1", None, None),
    ("0,1", None, {"range": [0.0, 1.0], "mean": None, "std": None}),
    ("0,255", "0.1307,0.3081", {"range": [0.0, 255.0], "mean": [0.1307], "std": [0.3081]}),
    (None, "0.4,0.5,0.6,0.2,0.3,0.4", {"range": [-1.0, 1.0], "mean": [0.4, 0.5, 0.6], "std": [0.2, 0.3, 0.4]}),
])
def test_command_line_transforms(input_range, normalize, expected):
    assert parse_input_transform(input_range, normalize) == expected


@pytest.mark.parametrize("input_range, normalize, message", [
    ("1,0", None, "LOW < HIGH"),
    ("0,1,2", None, "LOW < HIGH"),
    ("zero,one", None, "comma-separated numbers"),
    (None, "0.5", "even number"),
    (None, "0.5,0", "positive"),
    ("0,nan", None, "finite"),
])
def test_impossible_transforms_are_config_errors(input_range, normalize, message):
    with pytest.raises(ConfigError, match=message):
        parse_input_transform(input_range, normalize)


def test_normalisation_must_match_the_channels(factories, tmp_path):
    with pytest.raises(ConfigError, match="1 channel"):
        import_classifier(f"{factories}:statistics", _identity_statistics(tmp_path), (1, 8, 8), 10,
                          input_transform_spec((0, 1), [0.4, 0.5, 0.6], [0.2, 0.2, 0.2]))
