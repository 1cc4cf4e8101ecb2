"""A user's own model as DP-SGD's student: made per-example where it can be, refused in one line naming the layer
before any ledger entry where it cannot."""

from pathlib import Path

import pytest

from dpdistill.data import load_dataset
from dpdistill.errors import ConfigError
from dpdistill.pipeline import train_private
from dpdistill.privacy.individuals import DatasetLedger
from dpdistill.training.private import PrivateTrainingConfig
from helpers import TWO_FILE_MODEL, write_two_file_model

DIGITS_TRAIN = 1437
TINY = {"dataset": "digits", "epsilon": 10.0, "epochs": 1, "batch_size": 64, "lr": 3e-3}

UNUSED_LAYER = ("from torch import nn\n\nfrom blocks import ConvBlock\n\n\n"
                "class Net(nn.Module):\n"
                "    def __init__(self, channels, classes):\n"
                "        super().__init__()\n"
                "        self.block = ConvBlock(channels, 8)\n"
                "        self.spare = nn.Conv2d(8, 8, 1)  # defined, never called\n"
                "        self.fc = nn.Linear(8, classes)\n\n"
                "    def forward(self, x):\n"
                "        return self.fc(self.block(x).mean((2, 3)))\n\n\n"
                "def build(in_shape, num_classes):\n"
                "    return Net(in_shape[0], num_classes)\n")
IN_PLACE_IN_ITS_OWN_CODE = TWO_FILE_MODEL["blocks.py"].replace(
    "from torch import nn", "import torch.nn.functional as F\nfrom torch import nn").replace(
    "return self.act(self.bn(self.conv(x)))", "return F.relu(self.bn(self.conv(x)), inplace=True)")


def test_a_student_of_ones_own_needs_its_schedule_or_accepts_the_defaults(tmp_path: Path):
    """The default schedule was measured for the registered students: on one's own model it is refused when the run
    is configured, before anything is read or written, unless given or accepted."""
    spec = write_two_file_model(tmp_path / "mycode")
    for given in ({}, {"epochs": 10}, {"lr": 3e-3}):
        with pytest.raises(ConfigError, match=r"no DP-SGD schedule is measured for .*--accept-defaults") as refused:
            PrivateTrainingConfig(dataset="digits", epsilon=1.0, student_arch=spec, **given)
        assert "\n" not in str(refused.value)
    accepted = PrivateTrainingConfig(dataset="digits", epsilon=1.0, student_arch=spec, accept_defaults=True)
    assert (accepted.epochs, accepted.fitted(DIGITS_TRAIN).lr) == (3, 1e-3)
    assert PrivateTrainingConfig(dataset="digits", epsilon=1.0, student_arch=spec, epochs=10, lr=3e-3).epochs == 10
    assert PrivateTrainingConfig(dataset="digits", epsilon=1.0, student_arch="cnn").epochs == 3  # measured


@pytest.mark.slow
def test_a_layer_dpsgd_cannot_train_is_refused_in_one_line_before_any_ledger_entry(tmp_path: Path, monkeypatch):
    """The block's own forward changes the normalised map in place: no layer swap fixes that, and Opacus' hooks
    fail on it. The one pass of blank inputs when the run is planned finds it, before the ledger is written."""
    monkeypatch.setenv("DPDISTILL_LEDGER_HOME", str(tmp_path / "ledgers"))
    spec = write_two_file_model(tmp_path / "mycode", {"blocks.py": IN_PLACE_IN_ITS_OWN_CODE})
    with pytest.raises(ConfigError, match=r"its layer 0 \(ConvBlock\) changes a layer's output in place") as refused:
        train_private(PrivateTrainingConfig(**TINY, student_arch=spec), tmp_path / "run")
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "run" / "config.json").exists()
    assert DatasetLedger(load_dataset("digits").digest).read().entries == ()


@pytest.mark.slow
def test_weights_the_loss_never_reaches_are_refused_before_any_ledger_entry(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DPDISTILL_LEDGER_HOME", str(tmp_path / "ledgers"))
    spec = write_two_file_model(tmp_path / "mycode", {"scannet.py": UNUSED_LAYER})
    with pytest.raises(ConfigError, match=r"the loss never reaches its weights spare.weight, spare.bias"):
        train_private(PrivateTrainingConfig(**TINY, student_arch=spec), tmp_path / "run")
    assert DatasetLedger(load_dataset("digits").digest).read().entries == ()
