"""The report of a job that releases nothing (a teacher, an ensemble, an encoder, an imported model), which
`dpdistill/jobs.py` writes. Each method's report section lives in a reporting module named for its method or
family; what several share is in `report.py`."""

from __future__ import annotations

from typing import Any

from dpdistill.reporting.report import describe_classes, percent


def job_markdown(report: dict[str, Any], title: str) -> str:
    """The report of a job that releases nothing (a teacher, an ensemble, an encoder, an imported model): what it is,
    on which data, how accurate, and that it is private or public, not a release."""
    dataset = report.get("dataset")
    described = dataset if isinstance(dataset, dict) else {"name": dataset}
    rows = [("data set", described["name"]),
            ("classes", describe_classes(described["class_names"]) if "class_names" in described else None),
            ("architecture", report.get("arch")), ("public images", report.get("public"))]
    rows += [(name.replace("_", " "), percent(value)) for name, value in report.get("accuracy", {}).items()]
    if "ensemble" in report:
        rows += [("members", report["ensemble"]["members"]), ("layout", report["ensemble"]["layout"])]
    if "timing" in report:
        rows.append(("wall time", f"{report['timing']['wall_seconds']:.1f} s"))
    lines = [f"# {title}", "", "| quantity | value |", "| --- | --- |"]
    lines += [f"| {name} | {value} |" for name, value in rows if value is not None]
    lines += ["", f"**Privacy:** {report['privacy']['guarantee']}", ""]
    lines += [f"**Warning:** {warning}" for warning in report.get("warnings", [])]
    return "\n".join(lines).rstrip() + "\n"
