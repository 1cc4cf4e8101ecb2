"""Settings chosen on a data set name it by its digest: a run on the same images and labels is told, under any name,
and a run on other data is told they are a fixed public choice."""

import dataclasses

import pytest

from dpdistill.data import load_dataset
from dpdistill.errors import DatasetError
from dpdistill.methods.config import DP_TEACHER_SELECTION, PRESETS, build_config
from dpdistill.privacy.selection import FASHION_MNIST, MNIST_SET, SELECTION, Selection, selection_notes, with_selection

CHOICE = Selection("these settings", {"lr": 8.0, "epochs": 40}, "Fashion-MNIST (a validation split)", FASHION_MNIST)


def test_a_note_says_whether_the_run_is_on_the_data_the_settings_were_chosen_on():
    assert CHOICE.note(FASHION_MNIST) == ("these settings were chosen on Fashion-MNIST (a validation split), which is "
                                          "this private data (same digest): a use of it that no epsilon here covers")
    assert CHOICE.note(MNIST_SET).endswith("(a validation split): a fixed public choice for this data")
    assert CHOICE.note(None) == "these settings were chosen on Fashion-MNIST (a validation split)"  # no data named
    assert selection_notes([CHOICE], {"lr": 8.0, "epochs": 40, "seed": 3}, FASHION_MNIST) == [CHOICE.note(FASHION_MNIST)]
    assert selection_notes([CHOICE], {"lr": 8.0, "epochs": 20}, FASHION_MNIST) == []  # the user's own choice


def test_a_runs_notes_follow_those_it_inherits_once_each():
    inherited = {"epsilon": 1.0, SELECTION: ["the teacher's note"]}
    assert with_selection(inherited, ["the teacher's note", "this run's note"])[SELECTION] == [
        "the teacher's note", "this run's note"]
    assert SELECTION not in with_selection({"epsilon": 1.0}, [])


def test_only_the_dp_teacher_preset_uses_the_settings_chosen_on_the_mnist_set():
    used = [preset for preset in PRESETS
            if DP_TEACHER_SELECTION.used_by(dataclasses.asdict(build_config(preset, {}, {"mode": "none"})))]
    assert used == ["dp-teacher"]
    assert DP_TEACHER_SELECTION.used_by(dataclasses.asdict(build_config(None, {}, {"mode": "none"}, dp_teacher=True)))


@pytest.mark.parametrize("name, digest", [("fmnist", FASHION_MNIST), ("mnist", MNIST_SET)])
def test_the_data_settings_were_chosen_on_is_named_by_its_own_digest(name: str, digest: str):
    try:
        dataset = load_dataset(name)
    except DatasetError as error:  # not on this machine: `make data`
        pytest.skip(str(error))
    assert dataset.digest == digest
