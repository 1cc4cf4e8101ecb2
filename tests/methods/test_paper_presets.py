"""The seed papers' presets are what their docs pages' side-by-side tables say, and stay literal: each page's table
(between `<!-- paper preset: OPTIONS -->` and `<!-- /paper preset -->`) names, in its third column, the settings
the preset gives (`field=value`, `privacy.field=value`), and the configuration built from those options has them.
The pieces the readings brought are checked beside what they belong to (Xavier initialisation: tests/models; Eq. 3 in
probability space: tests/methods/test_annotation.py, test_engine.py)."""

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from dpdistill.federated.config import FederatedConfig
from dpdistill.methods.config import PAPER_POOL, build_config
from dpdistill.methods.dgd import build_dgd_config
from dpdistill.settings import parse_assignments

DOCS = Path(__file__).resolve().parents[2] / "docs" / "methods"
BLOCK = re.compile(r"<!-- paper preset: (.*?) -->(.*?)<!-- /paper preset -->", re.S)
SETTING = re.compile(r"`([a-z_.]+)=([^`]*)`")


def documented_presets() -> list[tuple[str, str, dict[str, str]]]:
    """(page, options, {setting: value}) of every table that states a preset's settings."""
    found = []
    for page in sorted(DOCS.glob("*.md")):
        for options, table in BLOCK.findall(page.read_text()):
            rows = [line.split("|") for line in table.splitlines() if line.startswith("|")]
            here = " ".join(cells[3] for cells in rows if len(cells) > 4)
            found.append((page.name, options, dict(SETTING.findall(here))))
    return found


def value_of(name: str, text: str, kind: type) -> Any:
    """A table's value as `--set` reads it for the dataclass `kind` (and None, which no typed field parses)."""
    return None if text == "None" else parse_assignments([f"{name}={text}"], kind)[name]


def transcription_config(options: str) -> Any:
    """The configuration `transcribe` (or `federated --method dpsd`, whose options start with `federated`) builds."""
    words = shlex.split(options)
    if words[0] == "federated":
        values = dict(zip(words[1::2], words[2::2]))
        return FederatedConfig(epsilon=float(values["--epsilon"]), dataset="digits", clients=5, method="dpsd",
                               **({"preset": values["--preset"]} if "--preset" in values else {})
                               ).transcription_config()
    values = dict(zip(words[::2], words[1::2]))
    return build_config(values["--preset"], {"method": values["--method"]},
                        {"mode": values["--privacy"], "epsilon": float(values["--epsilon"]),
                         "accounting": values.get("--accounting", "sound")})


def test_every_seed_page_states_its_presets_settings():
    pages = {page for page, _, _ in documented_presets()}
    assert {"dpsd.md", "dpdfd.md", "srr.md", "federated.md", "dgd.md", "datalens.md"} <= pages


@pytest.mark.parametrize("page, options, settings", [entry for entry in documented_presets()
                                                     if entry[0] not in ("dgd.md", "datalens.md")],
                         ids=lambda value: value if isinstance(value, str) else "")
def test_a_transcription_preset_has_the_settings_its_table_states(page: str, options: str,
                                                                   settings: dict[str, str]):
    config = transcription_config(options)
    assert settings, f"{page}: the table names no setting"
    for name, text in settings.items():
        owner, _, field = name.rpartition(".")
        holder = config.privacy if owner == "privacy" else config
        actual = getattr(holder, field)
        assert actual == value_of(field, text, type(holder)), f"{page} ({options}): {name} is {actual!r}, not {text}"


def test_dgds_preset_has_the_settings_its_table_states():
    [(_, options, settings)] = [entry for entry in documented_presets() if entry[0] == "dgd.md"]
    words = dict(zip(shlex.split(options)[::2], shlex.split(options)[1::2]))
    config = build_dgd_config(float(words["--epsilon"]), baseline="b", preset=words["--preset"])
    for name, text in settings.items():
        owner, _, field = name.rpartition(".")
        holder = config.generator if owner == "generator" else config.labelling
        actual = getattr(holder, field)
        assert actual == value_of(field, text, type(holder)), f"dgd.md: {name} is {actual!r}, the table says {text}"


def test_datalens_preset_has_the_settings_its_table_states():
    from dpdistill.methods.datalens import preset_settings
    from dpdistill.training.datalens import DataLensConfig

    for _, options, settings in (entry for entry in documented_presets() if entry[0] == "datalens.md"):
        words = dict(zip(shlex.split(options)[::2], shlex.split(options)[1::2]))
        preset = preset_settings(words["--preset"], float(words["--epsilon"]), words["--dataset"])
        for name, text in settings.items():
            expected = value_of(name, text, DataLensConfig)
            assert preset[name] == expected, f"datalens.md ({options}): {name} is {preset[name]!r}, not {text}"


def test_the_paper_preset_stays_literal_and_the_workload_is_a_separate_departure():
    privacy = {"mode": "data", "epsilon": 10.0, "accounting": "paper"}
    paper = build_config("paper", {"method": "dpsd"}, privacy)
    workload = build_config("paper,paper-workload", {"method": "dpsd"}, privacy)
    assert (paper.student_steps, paper.replay_size, paper.iterations, paper.batch_size) == (1, 0, 200, 256)
    assert (workload.student_steps, workload.replay_size) == (400, PAPER_POOL) and PAPER_POOL == 200 * 256
    assert {**workload.to_dict(), "student_steps": 1, "replay_size": 0} == paper.to_dict()  # nothing else moves
    assert not workload.generator_sees_teacher  # replayed answers are post-processing: still covered


def test_feddpsd_runs_algorithm_2_unless_another_preset_is_asked_for():
    default = FederatedConfig(epsilon=10.0, dataset="digits", clients=5, method="dpsd").transcription_config()
    assert (default.latents, default.top_k, default.student_lr) == ("fresh", None, 0.1)
    asked = FederatedConfig(epsilon=10.0, dataset="digits", clients=5, method="dpsd", preset="paper",
                            lr=1e-3).transcription_config()
    assert (asked.latents, asked.top_k, asked.student_lr) == ("trainable", 3, 1e-3)


def test_dgds_paper_student_decays_linearly_and_takes_eq_6_as_written():
    paper = build_dgd_config(10.0, baseline="b", preset="paper").labelling.consistency_config()
    assert (paper.schedule, paper.feature_distance) == ("linear", "raw")
    fixed = build_dgd_config(10.0, baseline="b").labelling
    assert (fixed.student_schedule, fixed.feature_distance, fixed.student_training) == ("cosine", "normalized",
                                                                                         "supervised")
