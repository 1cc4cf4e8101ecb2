"""ImageDataset and from_arrays: one normalisation and one set of checks for every source."""

import json

import numpy as np
import pytest
import torch

from dpdistill.data import ImageDataset, from_arrays
from dpdistill.errors import DatasetError


def _build(x_train, y_train=None, x_test=None, y_test=None, **kwargs) -> ImageDataset:
    y_train = np.arange(len(x_train)) % 3 if y_train is None else y_train
    x_test = x_train[:4] if x_test is None else x_test
    y_test = np.arange(len(x_test)) % 3 if y_test is None else y_test
    return from_arrays("toy", x_train, y_train, x_test, y_test, "made up by a test", **kwargs)


@pytest.mark.parametrize("shape, expected", [
    ((12, 5, 6), (1, 5, 6)),
    ((12, 5, 6, 1), (1, 5, 6)),
    ((12, 5, 6, 3), (3, 5, 6)),
    ((12, 1, 5, 6), (1, 5, 6)),
    ((12, 3, 5, 6), (3, 5, 6)),
])
def test_layouts_become_nchw(shape, expected):
    x = np.random.default_rng(0).random(shape)
    dataset = _build(x)
    assert dataset.input_shape == expected and dataset.x_train.shape == (12, *expected)
    assert dataset.x_train.dtype == torch.float32 and dataset.x_train.is_contiguous()
    assert dataset.y_train.dtype == torch.int64
    nchw = x if shape[1] in (1, 3) else (x[:, None] if len(shape) == 3 else x.transpose(0, 3, 1, 2))
    assert torch.allclose(dataset.x_train, torch.from_numpy(nchw * 2 - 1).float(), atol=1e-6)


def test_uint8_and_float_scaling_reach_exactly_minus_one_and_one():
    ints = _build(np.array([0, 255] * 3, dtype=np.uint8).reshape(6, 1, 1, 1).repeat(2, 2).repeat(2, 3))
    floats = _build(np.array([0.0, 1.0] * 3, dtype=np.float32).reshape(6, 1, 1).repeat(2, 1).repeat(2, 2))
    for dataset in (ints, floats):
        assert dataset.x_train.min().item() == -1.0 and dataset.x_train.max().item() == 1.0


def test_num_classes_is_inferred_from_the_public_labels_or_given():
    x = np.zeros((6, 4, 4), dtype=np.uint8)
    assert _build(x, y_train=np.array([0, 1, 3, 0, 1, 2]), y_test=np.array([0, 1, 2, 4])).num_classes == 5
    with pytest.raises(DatasetError, match="no test label holds"):  # a class only the private labels hold
        _build(x, y_train=np.array([0, 1, 4, 0, 1, 2]), y_test=np.array([0, 1, 2, 3]))
    assert _build(x, num_classes=10).num_classes == 10
    with pytest.raises(DatasetError, match=r"outside \[0, 2\)"):
        _build(x, num_classes=2)


def test_describe_is_json_able():
    description = _build(np.zeros((6, 4, 4), dtype=np.uint8)).describe()
    assert json.loads(json.dumps(description)) == {
        "name": "toy", "input_shape": [1, 4, 4], "num_classes": 3, "class_names": ["0", "1", "2"], "n_train": 6,
        "n_test": 4, "source": "made up by a test", "normalisation": "[-1, 1] (x / max * 2 - 1)"}


def test_class_names_give_the_number_of_classes_and_name_classes_in_warnings():
    x = np.zeros((6, 4, 4), dtype=np.uint8)
    with pytest.warns(UserWarning, match=r"class\(es\) 3 \(owl\) of 4 have no training image"):
        named = _build(x, class_names=["emu", "cat", "dog", "owl"])
    assert named.num_classes == 4 and named.class_names == ("emu", "cat", "dog", "owl")
    assert named.describe()["class_names"] == ["emu", "cat", "dog", "owl"]
    with pytest.warns(UserWarning, match=r"class\(es\) 3 of 4 have no training image"):  # unnamed: the label alone
        _build(x, num_classes=4)
    with pytest.raises(DatasetError, match=r"every training image is of class 1 \(cat\)"):
        _build(x, y_train=np.ones(6, dtype=np.int64), class_names=["emu", "cat", "dog"])


@pytest.mark.parametrize("names, message", [
    (["emu", "cat"], "2 class names for 3 classes: give one name a class, in label order"),
    (["emu", "cat", "emu"], "class names must be distinct, non-empty strings"),
    (["emu", "", "dog"], "class names must be distinct, non-empty strings"),
])
def test_bad_class_names_are_clear_errors(names, message):
    with pytest.raises(DatasetError, match=message):
        _build(np.zeros((6, 4, 4), dtype=np.uint8), num_classes=3, class_names=names)


@pytest.mark.parametrize("arrays, message", [
    ({"x_train": np.zeros((5, 7))},
     r"x_train has shape \(5, 7\): expected \(N, H, W\), \(N, H, W, C\) or \(N, C, H, W\)"),
    ({"x_train": np.zeros((5, 4, 4, 2))}, "shape"),
    ({"x_train": np.zeros((5, 2, 2, 2, 2))}, "shape"),
    ({"x_train": np.array(["a"] * 5)}, "dtype"),
    ({"x_train": np.zeros((5, 4, 4), dtype=bool)}, "dtype"),
    ({"x_train": np.full((5, 4, 4), 1.5)}, r"outside floats in \[0, 1\]"),
    ({"x_train": np.full((5, 4, 4), np.nan)}, r"x_train holds NaN in 5 image\(s\)"),
    ({"x_test": np.array([np.zeros((4, 4)), np.full((4, 4), np.inf)])}, r"x_test holds infinite values in 1 image"),
    ({"y_train": np.zeros(5, dtype=np.int64)}, "every training image is of class 0: a classifier needs at least two"),
    ({"x_train": np.full((5, 4, 4), 256)}, "outside integers in 0..255"),
    ({"x_train": np.full((5, 4, 4), -1, dtype=np.int64)}, "outside"),
    ({"y_train": np.zeros(3, dtype=np.int64)}, "x_train has 5 images but y_train has 3 labels"),
    ({"y_test": np.zeros(5, dtype=np.int64)}, "x_test has 2 images but y_test has 5 labels"),
    ({"y_train": -np.ones(5, dtype=np.int64)}, "negative"),
    ({"y_train": np.zeros(5)}, "integer"),
    ({"y_train": np.zeros((5, 1), dtype=np.int64)}, "1-D"),
    ({"x_test": np.zeros((0, 4, 4)), "y_test": np.zeros(0, dtype=np.int64)}, "test split is empty"),
    ({"x_test": np.zeros((2, 5, 5))}, "differ in shape"),
])
def test_bad_arrays_are_clear_errors(arrays, message):
    base = {"x_train": np.zeros((5, 4, 4)), "y_train": np.arange(5) % 2,
            "x_test": np.zeros((2, 4, 4)), "y_test": np.arange(2)}
    with pytest.raises(DatasetError, match=message):
        from_arrays("toy", **(base | arrays), source="test")


def test_the_dataclass_checks_tensors_built_without_from_arrays():
    x, y = torch.zeros(4, 1, 2, 2), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(DatasetError, match="float32"):
        ImageDataset("t", x.double(), y, x, y, 2, "test")
    with pytest.raises(DatasetError, match="float32"):
        ImageDataset("t", x[0], y, x, y, 2, "test")
    with pytest.raises(DatasetError, match="int64"):
        ImageDataset("t", x, y.int(), x, y, 2, "test")
    with pytest.raises(DatasetError, match=r"shape \(4,\)"):
        ImageDataset("t", x, y[:3], x, y, 2, "test")
    with pytest.raises(DatasetError, match="outside"):
        ImageDataset("t", x, y + 2, x, y, 2, "test")
    with pytest.raises(DatasetError, match="num_classes"):
        ImageDataset("t", x, y, x, y, 0, "test")
    assert ImageDataset("t", x, y, x, y, 2, "test").input_shape == (1, 2, 2)
