"""Jobs that release nothing leave what a method's run leaves: config.json, report.json and report.md."""

import json
from pathlib import Path


def test_a_teacher_keeps_its_settings_and_a_readable_report(digits_teacher: Path):
    settings = json.loads((digits_teacher / "config.json").read_text())
    assert settings["dataset"] == "digits" and settings["config"]["epochs"] == 6
    report = json.loads((digits_teacher / "report.json").read_text())
    markdown = (digits_teacher / "report.md").read_text()
    assert markdown.startswith("# Teacher\n") and "| data set | digits |" in markdown
    assert f"| teacher | {100 * report['accuracy']['teacher']:.2f}% |" in markdown
    assert "**Privacy:** none: this is the private model" in markdown


def test_an_ensemble_report_names_its_members_and_layout(digits_ensemble: Path):
    settings = json.loads((digits_ensemble / "config.json").read_text())
    assert settings["partitions"] == 4 and settings["alpha"] is None
    markdown = (digits_ensemble / "report.md").read_text()
    assert markdown.startswith("# Teacher ensemble\n") and "| members | 4 |" in markdown
    assert "| plurality vote |" in markdown and "separate networks" in markdown
