"""Shared fixtures: the small digits teachers, ensemble, encoder and foreign model that many tests read, each
built once per test run (helpers.built_once: by whichever pytest-xdist worker asks first; every worker gets its own
copy)."""

import os
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch

from dpdistill.jobs import train_teacher
from dpdistill.training.teacher import TeacherConfig
from helpers import TeacherReads, built_once, counting_teacher_reads


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The runs that train (marked slow) first, in their order: with two workers (handed tests one at a time, see
    pyproject.toml) the short tests then fill the gaps at the end instead of one long run starting last. The runs on
    Flower (marked flower) are spread evenly among the other slow ones, so that a simulation and a deployment never
    run side by side: each starts processes that keep a core busy (Flower's, Ray's). The simulations (marked
    simulation) stay together as one unit of the spread, so that each worker takes several in a row and keeps Ray
    between them (tests/federated/conftest.py) instead of starting it for each."""
    slow = [item for item in items if item.get_closest_marker("slow")]
    spread = [item for item in slow if not item.get_closest_marker("flower")]
    units: dict[str, list[pytest.Item]] = {}
    for item in slow:
        if item.get_closest_marker("flower"):
            units.setdefault("simulation" if item.get_closest_marker("simulation") else item.nodeid, []).append(item)
    others, inserted = len(spread), 0
    for index, unit in enumerate(units.values()):
        position = round(index * others / len(units)) + inserted
        spread[position:position] = unit
        inserted += len(unit)
    items[:] = spread + [item for item in items if not item.get_closest_marker("slow")]


@pytest.fixture(scope="session", autouse=True)
def _threads():
    """Two threads on the machine's two cores; one each where pytest-xdist runs two workers side by side, in the
    worker and in the processes it starts (the CLI, the benchmark harness, Flower's): two workers of two threads each
    would contend for the two cores, and torch's threads spin while they wait (runs take several times as long)."""
    threads = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)


@pytest.fixture
def fresh_features(tmp_path: Path, monkeypatch) -> Callable[[], None]:
    """The test's own feature cache (DPDISTILL_HOME at tmp_path) and an empty memory of fixed features: a feature
    pass runs, or reads that cache, instead of reusing another test's in the same worker. Calling it forgets the
    memory again, as a later process starts with none."""
    from dpdistill.models import features

    def forget() -> None:
        monkeypatch.setenv("DPDISTILL_HOME", str(tmp_path))
        monkeypatch.setattr(features, "_fixed_features", {})

    forget()
    return forget


@pytest.fixture(autouse=True)
def _near_random_answers_allowed(request):
    """Most tests run tiny settings whose answers are near random on purpose: they check mechanics, accounting and
    resumption, not accuracy. The pre-flight refusal is checked by the tests marked `preflight` (and by every test
    that runs a command in another process, which passes --accept-noise where it means to). Its own patch: a test
    that undoes its monkeypatch keeps this one."""
    if request.node.get_closest_marker("preflight") is not None:
        yield
        return
    from dpdistill.privacy import preflight

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(preflight, "refuse_near_random", lambda advice, accepted: None)
        yield


@pytest.fixture(scope="session", autouse=True)
def _ledgers_of_the_session(tmp_path_factory):
    """The data sets' ledgers of this session's runs, apart from the machine's own (a total a test sets there
    would refuse other runs)."""
    os.environ["DPDISTILL_LEDGER_HOME"] = str(tmp_path_factory.mktemp("ledgers"))


@pytest.fixture(autouse=True)
def _model_code_forgotten(monkeypatch):
    """Each test's user model code is its own: the modules loaded beside a factory file (which models/code.py keeps
    for the life of the process) and their folders on sys.path are forgotten after the test, so that another test's
    module of the same name is not refused as a clash."""
    from dpdistill.models import code

    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in [name for name in sys.modules if name.partition(".")[0] in code.LOADED_CODE]:
        del sys.modules[name]
    code.LOADED_CODE.clear()


@pytest.fixture(scope="session")
def digits_teacher(tmp_path_factory) -> Path:
    def build(directory: Path) -> None:
        report = train_teacher("digits", directory, TeacherConfig(arch="cnn", epochs=6, batch_size=64))
        assert report["accuracy"]["teacher"] > 0.9

    return built_once(tmp_path_factory, "teacher", build)


@pytest.fixture(scope="session")
def digits_dp_teacher(tmp_path_factory) -> Path:
    """A DP-SGD scatter-linear student on digits at epsilon 2 (a few seconds): a DP release, so a teacher that costs
    nothing to transcribe. Copy it before a run that writes into its ledger."""
    from dpdistill.pipeline import train_private
    from dpdistill.training.private import PrivateTrainingConfig

    def build(directory: Path) -> None:
        report = train_private(PrivateTrainingConfig(dataset="digits", epsilon=2.0, student_arch="scatter-linear",
                                                     epochs=10), directory)
        assert report["accuracy"]["student"] > 0.8

    return built_once(tmp_path_factory, "dp-teacher", build)


@pytest.fixture(scope="session")
def digits_ensemble(tmp_path_factory) -> Path:
    """Four cnn teachers on disjoint IID quarters of the digits training split (a few seconds)."""
    from dpdistill.jobs import train_teacher_ensemble

    return built_once(tmp_path_factory, "ensemble", lambda directory: train_teacher_ensemble(
        "digits", directory, TeacherConfig(arch="cnn", epochs=1, batch_size=64, min_steps=60), 4))


@pytest.fixture(scope="session")
def digits_encoder(tmp_path_factory) -> Path:
    """A cnn encoder pretrained briefly on the digits public pool (the first 200 test images)."""
    from dpdistill.jobs import pretrain
    from dpdistill.training.self_supervised import ContrastiveConfig

    return built_once(tmp_path_factory, "encoder", lambda directory: pretrain(
        "digits", None, 200, ContrastiveConfig(steps=5, batch_size=32), directory))


FOREIGN_FACTORY = '''
"""A small ResNet written without dpdistill: its factory takes num_classes only, and it expects inputs in [0, 1]."""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class SmallResNet(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layer1 = Block(16)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layer1(self.stem(x))), 1))


def small_resnet(num_classes=10):
    return SmallResNet(num_classes)
'''


@pytest.fixture(scope="session")
def foreign_teacher(tmp_path_factory) -> tuple[Path, Path]:
    """(factory file, safetensors weights under the network's own keys) of a small ResNet trained outside
    dpdistill on digits scaled to [0, 1] (a few seconds)."""
    import importlib.util

    from safetensors.torch import save_file

    from dpdistill.data import load_dataset

    def build(folder: Path) -> None:
        folder.mkdir()
        factory = folder / "my_resnet.py"
        factory.write_text(FOREIGN_FACTORY)
        spec = importlib.util.spec_from_file_location("foreign_resnet_for_training", factory)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        torch.manual_seed(0)
        model = module.small_resnet(num_classes=10)
        data = load_dataset("digits")
        x01 = (data.x_train + 1) / 2
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        for step in range(120):
            batch = torch.randint(0, len(x01), (64,))
            loss = torch.nn.functional.cross_entropy(model(x01[batch]), data.y_train[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        save_file({key: value.contiguous() for key, value in model.state_dict().items()},
                  folder / "weights.safetensors")

    folder = built_once(tmp_path_factory, "elsewhere", build)
    return folder / "my_resnet.py", folder / "weights.safetensors"


@pytest.fixture
def teacher_reads(monkeypatch) -> TeacherReads:
    """Every read of the teacher (or ensemble) the next pipeline run loads, and the count when it settled."""
    return counting_teacher_reads(monkeypatch)
