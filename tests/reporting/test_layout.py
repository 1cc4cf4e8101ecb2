"""Reporting sits at the bottom: a method's report section imports only report.py's shared pieces, never a method."""

import ast
from pathlib import Path

import dpdistill.reporting

REPORTING = Path(dpdistill.reporting.__file__).parent
ALLOWED = ("dpdistill.reporting", "dpdistill.atomic")


def test_reporting_imports_nothing_above_it():
    imported = {}
    for path in REPORTING.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                     else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            imported[path.name] = imported.get(path.name, set()) | {name for name in names
                                                                   if name.startswith("dpdistill")}
    assert {"report.py", "transcription.py", "pate.py", "audit.py"} <= set(imported)
    assert {name: sorted(modules) for name, modules in imported.items()
            if any(not module.startswith(ALLOWED) for module in modules)} == {}
