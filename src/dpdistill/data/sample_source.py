"""A sample source: the synthetic images a differentially private generator made from the private data
(`dpdistill synthesize`), asked about instead of a public pool (PATE) or of a generator trained with the student
(transcription).

The generator learnt from the private data, so its release and the route's answers compose: the run's epsilon
is theirs together, and the route's noise is calibrated so that the composition stays within --epsilon. The
source is read and checked whole before any work (`load_sample_source`): every bad input is one clear error.

A source directory holds `synthetic.npz` (`x`: float (n, C, H, W) in [-1, 1], `y`: integer (n,) classes) and
`report.json` (`method`, `dataset`, and `privacy` with `epsilon`, `delta` and `event`, a dp-accounting event as
`ledger.event_to_json` writes it, stated under replace-one neighbours; `formal_guarantee: false` where it has none).
"""

from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dp_accounting
import numpy as np
import torch
from torch import Tensor

from dpdistill.data.base import ImageDataset
from dpdistill.data.public import PoolSource, PublicSplit, whole_test_split
from dpdistill.errors import ConfigError, DpDistillError
from dpdistill.privacy.accounting import Cost
from dpdistill.privacy.ledger import (
    Release,
    UncoveredRead,
    composed_epsilon,
    composed_release,
    event_from_json,
    event_to_json,
)

SAMPLES_FILE = "synthetic.npz"
SOURCE_REPORT = "report.json"
SYNTHETIC_SPLIT = "synthetic"  # a PoolSource's split for a sample source: it shares no image with a test split


@dataclass(frozen=True)
class SampleSource:
    """A checked sample source: its images and labels, the release that made them, and what it is."""

    path: Path
    method: str
    dataset: str | None
    images: Tensor  # float32 (n, C, H, W) in [-1, 1]
    labels: Tensor  # int64 (n,): the class each image was generated for
    release: Release
    formal_guarantee: bool

    @property
    def description(self) -> str:
        guarantee = (f"epsilon {self.release.epsilon:.4g} at delta {self.release.delta:g}" if self.formal_guarantee
                     else "NO formal guarantee")
        return (f"the {len(self.labels)} synthetic images of the sample source {self.path} ({self.method} on "
                f"{self.dataset}, {guarantee})")

    def summary(self) -> dict[str, Any]:
        """The report's `sample_source` entry."""
        return {"path": str(self.path), "method": self.method, "dataset": self.dataset,
                "epsilon": self.release.epsilon, "delta": self.release.delta,
                "event": event_to_json(self.release.event), "formal_guarantee": self.formal_guarantee}

    def cost(self, epsilon: float, delta: float) -> Cost | None:
        """What a route's answers spend against the run's total (`epsilon`, `delta`): this release composed with
        theirs. None for a source without a formal guarantee: nothing composes with it, the route is calibrated
        alone and its coverage says so (`uncovered`). A source that leaves no budget is refused."""
        if not self.formal_guarantee:
            return None
        if self.release.delta > delta:
            raise ConfigError(f"the sample source {self.path} is stated at delta {self.release.delta:g}, above this "
                              f"run's delta {delta:g}: raise --delta or use a source made at a smaller one")
        if self.release.epsilon >= epsilon:
            raise ConfigError(f"the sample source {self.path} already spent epsilon {self.release.epsilon:.4g}, "
                              f"which leaves nothing of --epsilon {epsilon:g} (the run's total): raise --epsilon")
        return lambda query, count: composed_epsilon([self.release, Release.of_query(query, count, delta)], delta)

    def composed(self, route: Release) -> Release:
        """The run's release, as the teacher's ledger records it: this release composed with the route's (sound,
        and conservative where the source learnt from other data). A route without a mechanism, or a source
        without a guarantee, composes to no bound: the route's own release and its uncovered reads say so."""
        if not self.formal_guarantee or not math.isfinite(route.epsilon):
            return route
        return composed_release([route, self.release], route.delta)  # the answers first, as in every ledger entry

    def privacy(self, section: dict[str, Any], route: Release) -> dict[str, Any]:
        """A report's `privacy` section with the source: `epsilon` the composition's, `route_epsilon` the route's
        answers' alone (and its RDP cross-check), and the source's own figures."""
        total = self.composed(route).epsilon
        section = {**section, **{key: total for key in ("epsilon", "epsilon_replace_one", "epsilon_add_remove")
                                 if key in section}}
        if "epsilon_rdp" in section:
            section["route_epsilon_rdp"] = section.pop("epsilon_rdp")
        return {**section, "route_epsilon": route.epsilon, "sample_source": self.summary()}

    @property
    def uncovered(self) -> list[UncoveredRead]:
        """A source without a formal guarantee read the private data unprotected, as far as anyone can prove."""
        if self.formal_guarantee:
            return []
        return [UncoveredRead(f"the private data, by the sample source {self.path} ({self.method}, no formal "
                              f"guarantee)", "NO formal guarantee: the samples come from a source without one",
                              "were its samples free of private information,")]

    def pool(self, evaluation: ImageDataset) -> PublicSplit:
        """The synthetic images as PATE's pool, unlabelled; accuracy on the whole real test split, none of which
        is in the pool."""
        count = len(self.labels)
        return PublicSplit(self.images, evaluation.x_test, evaluation.y_test,
                           f"{self.description} (unlabelled); accuracy on the {len(evaluation.y_test)} test images "
                           f"of {evaluation.name}", PoolSource(str(self.path), SYNTHETIC_SPLIT, count),
                           f"{whole_test_split(evaluation)}; the pool is {self.description}")


def load_sample_source(path: Path, in_shape: tuple[int, ...], num_classes: int) -> SampleSource:
    """The sample source in `path`, checked against the teacher's inputs and classes; every bad input is one
    ConfigError, before any work."""
    if not path.is_dir():
        raise ConfigError(f"--sample-source {path} is not a directory: give the --out of `dpdistill synthesize`")
    images, labels = _read_samples(path / SAMPLES_FILE, tuple(in_shape), num_classes)
    report = _read_report(path / SOURCE_REPORT)
    privacy = report["privacy"]
    if privacy.get("formal_guarantee", True) is False:  # nothing to compose: a vacuous release
        release = Release(dp_accounting.NonPrivateDpEvent(), 1.0, math.inf)
        return SampleSource(path, report["method"], report.get("dataset"), images, labels, release, False)
    where = f"the sample source's {path / SOURCE_REPORT}"
    try:
        event = event_from_json(privacy["event"])
        epsilon, delta = float(privacy["epsilon"]), float(privacy["delta"])
    except KeyError as error:
        raise ConfigError(f"{where} has no privacy {error.args[0]!r}: its release cannot be composed") from None
    except (AttributeError, TypeError, ValueError, DpDistillError) as error:
        raise ConfigError(f"{where} states its privacy wrongly ({error})") from None
    if not (epsilon > 0 and math.isfinite(epsilon) and 0 < delta < 1):
        raise ConfigError(f"{where} states epsilon {epsilon} and delta {delta}: a formal guarantee needs a finite "
                          f"positive epsilon and a delta in (0, 1)")
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
        raise ConfigError(f"{where} records a NonPrivateDpEvent but claims a formal guarantee")
    discrete = privacy.get("discrete", False) is True
    return SampleSource(path, report["method"], report.get("dataset"), images, labels,
                        Release(event, delta, epsilon, discrete), True)


def _read_samples(file: Path, in_shape: tuple[int, ...], num_classes: int) -> tuple[Tensor, Tensor]:
    """`x` and `y` of synthetic.npz, refused unless they are images the teacher takes and classes it knows."""
    if not file.is_file():
        raise ConfigError(f"the sample source has no {file}: give the --out of `dpdistill synthesize`")
    try:
        with np.load(file, allow_pickle=False) as arrays:
            missing = {"x", "y"} - set(arrays.files)
            if missing:
                raise ConfigError(f"{file} lacks the array(s) {', '.join(sorted(missing))}: it needs x (images) and y "
                                  f"(labels)")
            x, y = arrays["x"], arrays["y"]
    except ValueError as error:  # numpy refuses pickled (object) arrays without allow_pickle
        raise ConfigError(f"{file} cannot be read without unpickling ({error}): dpdistill reads plain arrays only") from None
    except (OSError, zipfile.BadZipFile, EOFError) as error:
        raise ConfigError(f"{file} is not a readable .npz ({error})") from None
    if not np.issubdtype(x.dtype, np.floating) or x.ndim != 4 or tuple(x.shape[1:]) != in_shape or len(x) == 0:
        raise ConfigError(f"{file}: x is {x.dtype} {tuple(x.shape)}, the teacher takes float images (n, "
                          f"{', '.join(map(str, in_shape))}) with n >= 1")
    if not np.issubdtype(y.dtype, np.integer) or y.shape != (len(x),):
        raise ConfigError(f"{file}: y is {y.dtype} {tuple(y.shape)}, expected integer labels ({len(x)},)")
    if not np.isfinite(x).all():
        raise ConfigError(f"{file}: x holds non-finite values")
    if x.min() < -1 or x.max() > 1:
        raise ConfigError(f"{file}: x spans [{x.min():.4g}, {x.max():.4g}], images must lie in [-1, 1]")
    if y.min() < 0 or y.max() >= num_classes:
        raise ConfigError(f"{file}: y spans [{y.min()}, {y.max()}], the teacher has classes 0..{num_classes - 1}")
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.int64))


def _read_report(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise ConfigError(f"the sample source has no {file}: its release cannot be composed without it")
    try:
        report = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{file} is not readable JSON ({error})") from None
    if not isinstance(report, dict) or not isinstance(report.get("method"), str) \
            or not isinstance(report.get("privacy"), dict):
        raise ConfigError(f"{file} is not a sample source's report: it needs \"method\" and a \"privacy\" section")
    return report
