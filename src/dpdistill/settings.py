"""`KEY=VALUE` settings (the command line's `--set`, an audit's route settings) as typed overrides of a config
dataclass: every knob of a run, without a flag for each."""

from __future__ import annotations

import dataclasses
from typing import Any

from dpdistill.errors import ConfigError

# fields with options of their own (a privacy request, a sample source, the method's name): never set by KEY=VALUE
OWN_OPTIONS = ("privacy", "sample_source", "method")


def parse_assignments(assignments: list[str], kind: type) -> dict[str, Any]:
    """Each `KEY=VALUE` as a value of the field KEY of the dataclass `kind`, parsed as its default is typed; an
    unknown key or a value of the wrong type is a ConfigError naming what it expects."""
    typed = {field.name: (field.default_factory() if field.default_factory is not dataclasses.MISSING
                           else field.default, str(field.type))
             for field in dataclasses.fields(kind) if field.name not in OWN_OPTIONS}
    return parse_typed(assignments, dict(sorted(typed.items())))


def parse_typed(assignments: list[str], typed: dict[str, tuple[Any, str]]) -> dict[str, Any]:
    """Each `KEY=VALUE` as a value of KEY, parsed as `typed[KEY]` (its default and annotation) says."""
    values: dict[str, Any] = {}
    for assignment in assignments:
        key, separator, text = assignment.partition("=")
        key = key.strip().replace("-", "_")
        if not separator or key not in typed:
            raise ConfigError(f"cannot set {assignment!r}: use KEY=VALUE with KEY one of {', '.join(typed)}")
        default, annotation = typed[key]
        values[key] = parse_value(key, text.strip(), default, annotation)
    return values


def parse_value(key: str, text: str, default: Any, annotation: str = "") -> Any:
    """`text` as a value of the type of `default` (a tuple: comma-separated items of its first item's type; None:
    a string where the field is annotated as one, else an int or a float)."""
    if default is None and "str" in annotation:  # an optional name or path
        return text
    try:
        if isinstance(default, bool):
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("true", "1", "yes")
        if isinstance(default, tuple):  # of the type of its first item (int where it is empty)
            return tuple((type(default[0]) if default else int)(part.strip()) for part in text.split(","))
        if default is None or default is dataclasses.MISSING:  # an optional number
            return float(text) if any(mark in text.lower() for mark in ".e") else int(text)
        return type(default)(text)
    except ValueError:
        raise ConfigError(f"{key} expects a value like {default!r}, got {text!r}") from None
