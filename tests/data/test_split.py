"""`dpdistill data split`: training images held out as the test split of a new .npz, loading back bit for bit so
that the ledger of the individuals meets them, the data set's own test split left out."""

from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import Result
from typer.testing import CliRunner

from dpdistill.cli.main import app
from dpdistill.data import load_dataset

from helpers import write_image_folder


def split(*args: str) -> Result:
    return CliRunner().invoke(app, ["data", "split", *args])


def test_the_last_images_are_held_out_as_they_were_with_their_ids_names_and_a_declared_size(tmp_path: Path):
    out = tmp_path / "val.npz"
    result = split("--dataset", "digits", "--validation", "300", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "1137 train and 300 validation images" in " ".join(result.stderr.split())
    digits, held = load_dataset("digits"), load_dataset(str(out))
    assert torch.equal(held.x_train, digits.x_train[:-300]) and torch.equal(held.y_train, digits.y_train[:-300])
    assert torch.equal(held.x_test, digits.x_train[-300:]) and torch.equal(held.y_test, digits.y_train[-300:])
    assert torch.equal(held.ids_train, digits.ids_train[:-300]) and held.declared_size == 1437 - 300
    assert held.class_names == digits.class_names and held.num_classes == 10
    assert torch.equal(held.example_ids, digits.example_ids[:-300])  # the ledger of the individuals' keys
    with np.load(out) as archive:
        assert archive["x_train"].dtype == np.float32  # digits' 17 levels are not whole bytes: floats, exact


def test_a_seeded_draw_is_reproducible_and_covers_the_training_split_once(tmp_path: Path):
    draws = {}
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        assert split("--dataset", "digits", "--validation", "300", "--seed", seed, "--out",
                     str(tmp_path / f"{name}.npz")).exit_code == 0
        draws[name] = load_dataset(str(tmp_path / f"{name}.npz"))
    assert torch.equal(draws["a"].x_test, draws["b"].x_test) and not torch.equal(draws["a"].x_test, draws["c"].x_test)
    digits = load_dataset("digits")
    together = torch.cat([draws["c"].x_train, draws["c"].x_test]).flatten(1)
    assert sorted(map(tuple, together.tolist())) == sorted(map(tuple, digits.x_train.flatten(1).tolist()))


def test_bytes_stay_bytes_and_no_size_is_declared_where_the_source_declares_none(tmp_path: Path):
    root = write_image_folder(tmp_path / "pets")  # sorted by class: its last 6 training images are every emu
    out = tmp_path / "pets-val.npz"
    sorted_out = split("--dataset", str(root), "--validation", "6", "--out", str(out))
    assert sorted_out.exit_code == 2 and sorted_out.stderr == (
        "error: holding out 6 images would leave class(es) 2 (emu) of pets without a training image: the data may be "
        "sorted by class; draw them at random with --seed S\n") and not out.exists()
    assert split("--dataset", str(root), "--validation", "6", "--seed", "0", "--out", str(out)).exit_code == 0
    pets, held = load_dataset(str(root)), load_dataset(str(out))
    assert len(held.y_train) == 12 and set(held.y_train.tolist()) == {0, 1, 2} and held.declared_size is None
    with np.load(out) as archive:
        assert archive["x_train"].dtype == np.uint8 and "declared_size" not in archive.files


@pytest.mark.parametrize("args, message", [
    (["--validation", "0"], "--validation must hold out between 1 and 1436 of the 1437 training images of digits"),
    (["--validation", "1437"], "--validation must hold out between 1 and 1436"),
    (["--validation", "10", "--out", "val.np"], "--out val.np must end in .npz"),
])
def test_impossible_splits_are_refused_in_one_line_and_write_nothing(tmp_path: Path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = split("--dataset", "digits", *args, *([] if "--out" in args else ["--out", "val.npz"]))
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {message}") and result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_an_existing_file_is_kept_unless_overwrite_is_given(tmp_path: Path):
    out = tmp_path / "val.npz"
    out.write_bytes(b"mine")
    refused = split("--dataset", "digits", "--validation", "10", "--out", str(out))
    assert refused.exit_code == 2 and "--overwrite" in refused.stderr and out.read_bytes() == b"mine"
    assert split("--dataset", "digits", "--validation", "10", "--out", str(out), "--overwrite").exit_code == 0
    assert len(load_dataset(str(out)).y_test) == 10
