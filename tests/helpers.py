"""Shared by the tests: privacy figures computed without dpdistill (closed-form Gaussian DP, randomized response
convolved exactly), a teacher that counts its reads, the release a run recorded in its teacher's ledger, a folder
of IDX files, a folder of images by class, a sample source as `dpdistill synthesize` writes it, costly fixtures
built once for all workers, the benchmark harness as a module, a user's model written in two files, the CLI in a
fresh process, the memory order a model's layers compute in."""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import scipy.optimize
import scipy.signal
import scipy.stats
import dp_accounting
from PIL import Image
from dp_accounting import gaussian_mechanism
from torch import Tensor, nn

import dpdistill
from dpdistill.data.idx import write_idx
from dpdistill.models.ensemble import TeacherEnsemble
from dpdistill.privacy.accounting import GaussianQuery
from dpdistill.privacy.ledger import LEDGER_FILE, ReleaseLedger, event_to_json


def exact_gaussian(count: int, epsilon: float, delta: float) -> GaussianQuery:
    """The Gaussian whose `count` answers spend exactly epsilon: the analytic calibration of their composition (one
    Gaussian of multiplier z / sqrt(count)), independent of dpdistill's search."""
    return GaussianQuery(gaussian_mechanism.get_sigma_gaussian(epsilon, delta) * math.sqrt(count) * (1 + 1e-9))


def gdp_delta(epsilon: float, mu: float) -> float:
    """delta(eps) of mu-GDP: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong, Roth and Su 2019)."""
    head = scipy.stats.norm.cdf(-epsilon / mu + mu / 2)
    return head - math.exp(epsilon + scipy.stats.norm.logcdf(-epsilon / mu - mu / 2))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The epsilon at which mu-GDP reaches `delta`, by root finding on the closed form."""
    return scipy.optimize.brentq(lambda epsilon: gdp_delta(epsilon, mu) - delta, 0.0, 100 * mu + 100, xtol=1e-12)


def exact_randomized_response_epsilon(epsilon0: float, candidates: int, count: int, delta: float) -> float:
    """Exact epsilon of `count` k-ary randomized-response answers, by convolving the privacy-loss distribution.

    Neighbours differ in the true label (a under D, b under D'); under D the answer is a with probability
    p = e^eps0 / (e^eps0 + k - 1) (loss +eps0), b with q = 1 / (e^eps0 + k - 1) (loss -eps0), any other class
    with q (loss 0). The composed loss is eps0 times an integer, so delta(eps) = E[(1 - e^(eps - L))+] is exact
    on that lattice."""
    scale = math.exp(epsilon0) + candidates - 1
    single = np.array([1 / scale, (candidates - 2) / scale, math.exp(epsilon0) / scale])  # loss -1, 0, +1 (x eps0)
    total = self_convolved(single, count)
    return lattice_epsilon(total, epsilon0 * (np.arange(len(total)) - count), delta)


def self_convolved(pmf: np.ndarray, count: int) -> np.ndarray:
    """The `count`-fold convolution of a probability mass function on an integer lattice (repeated squaring)."""
    total, power, remaining = np.array([1.0]), pmf, count
    while remaining:
        if remaining & 1:
            total = np.clip(scipy.signal.fftconvolve(total, power), 0, None)
        remaining >>= 1
        if remaining:
            power = np.clip(scipy.signal.fftconvolve(power, power), 0, None)
    return total


def lattice_epsilon(probabilities: np.ndarray, losses: np.ndarray, delta: float) -> float:
    """The exact epsilon of a privacy-loss distribution: the root of E[(1 - e^(eps - loss))+] = delta."""
    return scipy.optimize.brentq(lambda eps: np.sum(probabilities * -np.expm1(np.minimum(eps - losses, 0))) - delta,
                                 0.0, losses.max(), xtol=1e-12)


@dataclass
class TeacherReads:
    """Every read of a teacher: the examples of each call (and their images), and how many had been read when the run
    settled its release in the teacher's ledger (reads after that, such as the private record's test accuracy,
    release nothing)."""

    calls: list[int] = field(default_factory=list)
    at_settle: int | None = None
    inputs: list[Tensor] = field(default_factory=list)  # the images of each call

    @property
    def examples(self) -> int:
        return sum(self.calls)


def count_reads(teacher: nn.Module, reads: TeacherReads) -> nn.Module:
    """Make `teacher` record every read in `reads`: `features` for one network (its forward and every discriminator
    pass go through it), `member_logits` for an ensemble (every member's answer on a batch)."""
    name = "member_logits" if isinstance(teacher, TeacherEnsemble) else "features"
    read = getattr(teacher, name)

    def counted(images: Tensor) -> Any:
        reads.calls.append(len(images))
        reads.inputs.append(images.detach().cpu())
        return read(images)

    object.__setattr__(teacher, name, counted)
    return teacher


def counting_teacher_reads(monkeypatch: pytest.MonkeyPatch) -> TeacherReads:
    """Count every read of the teacher a pipeline run loads, and note the count when the run settles its release."""
    from dpdistill.methods import teachers

    reads, load, settle = TeacherReads(), teachers.load_teacher, ReleaseLedger.settle

    def settled(ledger: ReleaseLedger, *args: Any, **kwargs: Any) -> Any:
        reads.at_settle = reads.examples
        return settle(ledger, *args, **kwargs)

    def loaded(directory: Path) -> tuple[nn.Module, dict]:
        teacher, meta = load(directory)
        return count_reads(teacher, reads), meta

    monkeypatch.setattr(teachers, "load_teacher", loaded)
    monkeypatch.setattr(ReleaseLedger, "settle", settled)
    return reads


def charged_queries(teacher_dir: Path, out_dir: Path) -> int:
    """How many answers the teacher's ledger.json charged the finished run writing `out_dir` for."""
    entries = json.loads((teacher_dir / LEDGER_FILE).read_text())["entries"]
    (entry,) = [entry for entry in entries if entry["out_dir"] == str(out_dir.resolve())]
    assert entry["status"] == "spent"
    event = entry["event"]
    if event["type"] == "ComposedDpEvent":  # the answers, then the reads no mechanism protects
        event = event["events"][0]
    return event.get("count", 0)  # a run that charged nothing records a NoOpDpEvent


def write_idx_folder(folder: Path, test_prefix: str = "t10k", suffix: str = ".gz", side: int = 6) -> None:
    """Thirty training and ten test images of side x side pixels in three classes, as IDX files."""
    rng = np.random.default_rng(1)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", 30), (test_prefix, 10)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte{suffix}", rng.integers(0, 256, (n, side, side), dtype=np.uint8))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}", np.arange(n, dtype=np.uint8) % 3)


def write_image_folder(root: Path, classes=("emu", "cat", "dog"), per_class=(6, 2), size=(12, 10), mode="RGB",
                       seed: int = 0) -> Path:
    """A folder of images by class (ROOT/train/CLASS/*.png, ROOT/test/CLASS/*.png): random images, each class's
    pixels around its own grey level so that the labels can be checked."""
    rng = np.random.default_rng(seed)
    for split, count in zip(("train", "test"), per_class):
        for name in classes:
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            level = 40 * (sorted(classes).index(name) + 1)
            for index in range(count):
                pixels = np.clip(rng.normal(level, 5, (*size, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).convert(mode).save(folder / f"{index}.png")
    return root


def write_sample_source(directory: Path, x: np.ndarray, y: np.ndarray, noise_multiplier: float = 20.0,
                        delta: float = 1e-6, **privacy: Any) -> Path:
    """A `dpdistill synthesize --method datalens` output in `directory`: synthetic.npz (`x`, `y`) and report.json
    whose release is one Gaussian of `noise_multiplier` at its closed-form epsilon; `privacy` overrides its
    privacy section (None: leave the key out)."""
    directory.mkdir(parents=True, exist_ok=True)
    np.savez(directory / "synthetic.npz", x=x, y=y)
    section = {"epsilon": gdp_epsilon(1 / noise_multiplier, delta), "delta": delta,
               "event": event_to_json(dp_accounting.GaussianDpEvent(noise_multiplier)),
               "covered": "the generator and its samples", **privacy}
    report = {"method": "datalens", "dataset": "digits",
              "privacy": {key: value for key, value in section.items() if value is not None}}
    (directory / "report.json").write_text(json.dumps(report))
    return directory


TWO_FILE_MODEL = {
    "blocks.py": (
        "from torch import nn\n\n\n"
        "class ConvBlock(nn.Module):\n"
        "    def __init__(self, cin, cout):\n"
        "        super().__init__()\n"
        "        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)\n"
        "        self.bn = nn.BatchNorm2d(cout)\n"
        "        self.act = nn.ReLU(inplace=True)\n\n"
        "    def forward(self, x):\n"
        "        return self.act(self.bn(self.conv(x)))\n"),
    "scannet.py": (
        "from torch import nn\n\nfrom blocks import ConvBlock\n\n\n"
        "def build(in_shape, num_classes):\n"
        "    return nn.Sequential(ConvBlock(in_shape[0], 8), nn.MaxPool2d(2), ConvBlock(8, 8),\n"
        "                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))\n"),
}


def write_two_file_model(folder: Path, files: dict[str, str] | None = None) -> str:
    """A user's model in `folder` as people write one: scannet.py's factory imports ConvBlock (Conv2d, BatchNorm2d,
    ReLU(inplace=True)) from the module blocks.py beside it; `files` replace or add files. Its
    `--student-arch`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in {**TWO_FILE_MODEL, **(files or {})}.items():
        (folder / name).write_text(text)
    return f"{folder / 'scannet.py'}:build"


def dpdistill_elsewhere(cwd: Path, *args) -> subprocess.CompletedProcess:
    """The CLI in a fresh process whose working directory and PYTHONPATH know nothing of a factory's folder."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHONPATH"] = str(Path(dpdistill.__file__).resolve().parents[1])
    return subprocess.run([sys.executable, "-m", "dpdistill.cli.main", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def assert_confusion_matches_accuracy(report: dict, out: Path, classes: int) -> None:
    """The report's confusion matrix counts the evaluation images by true and predicted class: its diagonal is the
    student's accuracy, and report.md shows its figure."""
    counts = np.array(report["confusion"])
    assert counts.shape == (classes, classes) and counts.sum() > 0
    assert np.trace(counts) / counts.sum() == pytest.approx(report["accuracy"]["student"], abs=1e-6)
    assert json.loads((out / "report.json").read_text())["confusion"] == report["confusion"]
    assert (out / "confusion.png").stat().st_size > 0 and "](confusion.png)" in (out / "report.md").read_text()


def input_orders(model: nn.Module, kind: type[nn.Module]) -> list[bool]:
    """Filled as `model` runs: for each call of a `kind` layer, whether its input maps were in the standard memory
    order (not channels-last)."""
    orders: list[bool] = []
    for layer in model.modules():
        if isinstance(layer, kind):
            layer.register_forward_pre_hook(lambda _layer, inputs: orders.append(inputs[0].is_contiguous()))
    return orders


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """A copy of what `build(directory)` writes, built once per test run: under pytest-xdist the first worker to ask
    builds it while the others wait, and each worker gets its own copy, so a test that writes into it (a ledger, a
    damaged teacher) leaves the other workers' alone."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        directory = tmp_path_factory.mktemp(name) / name
        build(directory)
        return directory
    shared = tmp_path_factory.getbasetemp().parent / "built-once"  # the run's folder, above each worker's own
    shared.mkdir(exist_ok=True)
    built = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():
            partial = shared / f"{name}.partial"  # a worker that failed half-way leaves no finished copy
            shutil.rmtree(partial, ignore_errors=True)
            build(partial)
            partial.rename(built)
    return Path(shutil.copytree(built, tmp_path_factory.mktemp(name) / name))


def benchmark_harness():
    """benchmarks/run.py as a module (it is a script, not a package)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("benchmark_harness", Path(__file__).resolve().parents[1] / "benchmarks"
                                                  / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
