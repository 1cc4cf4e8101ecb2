"""A user-architecture module on sys.path, as `dpdistill train-teacher --arch user_models:NAME` would see it."""

import sys
import textwrap
from pathlib import Path

import pytest

USER_MODULE = "dpdistill_test_user_models"

SOURCE = textwrap.dedent("""
    from torch import nn

    from dpdistill.models.classifiers import DataLensStudent


    def tiny(in_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(in_shape[0] * in_shape[1] * in_shape[2], 16),
                             nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, num_classes))


    def ready_made(in_shape, num_classes):
        return DataLensStudent(in_shape, num_classes)


    def softmax_after(in_shape, num_classes):
        return nn.Sequential(tiny(in_shape, num_classes), nn.Softmax(dim=1))


    def no_linear(in_shape, num_classes):
        return nn.Sequential(nn.Conv2d(in_shape[0], num_classes, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())


    def wrong_size(in_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(3, num_classes))


    def wrong_classes(in_shape, num_classes):
        return tiny(in_shape, num_classes + 1)


    def not_a_module(in_shape, num_classes):
        return "a model"


    def no_in_shape(num_classes):
        return nn.Linear(4, num_classes)


    def raises(in_shape, num_classes):
        raise RuntimeError("no such layer")


    NOT_CALLABLE = 3
""")


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Name of a fresh importable module of user factories; forgotten again after the test."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / f"{USER_MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, USER_MODULE, raising=False)
    yield USER_MODULE
    sys.modules.pop(USER_MODULE, None)
