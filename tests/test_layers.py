"""Packages import downward only: among src/dpdistill's packages and top-level modules no two import each other,
directly or around a circle, counting every import (module level, inside functions, for type checking)."""

import ast
from pathlib import Path

import dpdistill

SOURCE = Path(dpdistill.__file__).parent


def unit(path: Path) -> str:
    """The package a file belongs to, or the top-level module it is (`runs`, `api`); the root's __init__ is none."""
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return parts[0]


def imports() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in SOURCE.rglob("*.py"):
        source = unit(path)
        if source == "__init__":  # the package root: above everything
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                     else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            if isinstance(node, ast.ImportFrom) and node.module == "dpdistill":  # from dpdistill import jobs
                names = [f"dpdistill.{alias.name}" for alias in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] == "dpdistill" and len(parts) > 1 and parts[1] != source and parts[1] != "__version__":
                    edges.setdefault(source, set()).add(parts[1])
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every unit that can reach itself again, with the path that does."""
    found = []
    for start in sorted(edges):
        paths, seen = [[start]], {start}
        while paths:
            path = paths.pop()
            for following in sorted(edges.get(path[-1], ())):
                if following == start:
                    found.append(path + [start])
                elif following not in seen:
                    seen.add(following)
                    paths.append(path + [following])
    return found


def test_no_package_imports_one_that_imports_it_back():
    edges = imports()
    assert {"methods", "runs"} <= set(edges) and "federated" in edges["registry"]  # the scan sees the imports
    assert circles(edges) == []


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"], ["b", "c", "a", "b"],
                                                                         ["c", "a", "b", "c"]]
