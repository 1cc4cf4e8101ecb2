"""One declaration per setting, from which the command line, the Python API and the docs are generated.

A configuration dataclass declares each setting once: its type and default as the field's, its help text (and
where needed its lower bound) in `setting(...)`. A `CommandSpec` beside the method names which of those fields
its command offers, the few options that are the command's own (--out, --resume, ...), and how a run is made from
their values. From it come the command's options and --help (cli/declared.py), the API function's keyword arguments
and docstring (api.py) and the docs' option table (`option_table`), so none of them can drift from the
configuration, and validation happens once, in the configuration's own checks, before any work.

This is a small layer of our own over typer, which already builds a command from a function's signature: a
generated signature is all it needs. pydantic or a dataclass-to-click library would add a dependency and a
second notion of a configuration for what a field's metadata carries."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable

from dpdistill.errors import ConfigError
from dpdistill.progress import Progress
from dpdistill.settings import parse_assignments, parse_typed

HELP, MIN, SHOW_DEFAULT = "help", "min", "show_default"
REQUIRED = ...  # a setting the caller must give
SETTINGS = "settings"  # where `CommandSpec.values` keeps the settable fields given beyond the options
# help texts several configurations share
SEED_HELP = "seeds what is not private (initialisation, order); the privacy noise is secret"
REPRODUCIBLE_NOISE_HELP = "noise from --seed: debugging only, NO privacy guarantee"
SAMPLE_SOURCE_HELP = "ask about the images of this `dpdistill synthesize` --out; its epsilon counts in --epsilon"
ENSEMBLE_HELP = "a teacher ensemble's directory (made by train-teacher --partitions M)"
# every kind of data set a --dataset option reads (dataset_help)
DATASETS = "fmnist, mnist, digits, a folder of images by class, a folder of IDX files, or an .npz"
RESUME_FROM_ANSWERS_HELP = ("continue the interrupted run in --out from its released answers, with its saved "
                            "settings (other options are then ignored)")


def dataset_help(role: str) -> str:
    """A --dataset option's help: what the data set is for, then every kind of data set a command reads."""
    return f"{role}: {DATASETS}"


def setting(default: Any = dataclasses.MISSING, help: str = "", *, min: float | None = None,
            show_default: bool = True) -> Any:
    """A configuration field with what its option shows: `help`, its lower bound `min`, and whether --help prints
    its default."""
    return dataclasses.field(default=default, metadata={HELP: help, MIN: min, SHOW_DEFAULT: show_default})


@dataclass(frozen=True)
class Option:
    """One option of a command: a configuration field's, or the command's own (`field=False`)."""

    name: str
    annotation: Any
    default: Any = REQUIRED
    help: str = ""
    flags: tuple[str, ...] = ()
    min: float | None = None
    show_default: bool = True
    field: bool = True

    def parameter(self) -> inspect.Parameter:
        """The keyword parameter typer reads this option from."""
        import typer

        option = typer.Option(self.default, *self.flags, help=self.help, min=self.min,
                              show_default=self.show_default)
        return inspect.Parameter(self.name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                 annotation=self.annotation)

    def flag(self) -> str:
        return self.flags[0] if self.flags else f"--{self.name.replace('_', '-')}"


def out_option(help: str) -> Option:
    return Option("out", Path, help=help, field=False)


def resume_option(help: str = "continue the interrupted run in --out") -> Option:
    return Option("resume", bool, False, help, flags=("--resume",), show_default=False, field=False)


def preset_options(declared: dict[str, tuple[type, str]]) -> tuple[Option, ...]:
    """Options (name: type, help) whose None means 'not given': the preset's value, or the method's default."""
    return tuple(Option(name, kind | None, None, help, field=False) for name, (kind, help) in declared.items())


def set_option(help: str) -> Option:
    """--set KEY=VALUE (repeatable): any field of the command's `settable` configuration, shown as an option or not."""
    return Option("set_", list[str], [], help, flags=("--set",), field=False)


OVERWRITE_OPTION = Option("overwrite", bool, False, "replace the run already in --out (its outputs are removed "
                          "first)", flags=("--overwrite",), show_default=False, field=False)


def field_options(config_type: type, names: tuple[str, ...]) -> tuple[Option, ...]:
    """The options of `config_type`'s fields `names`, as declared there."""
    hints = typing.get_type_hints(config_type)
    fields = {field.name: field for field in dataclasses.fields(config_type)}
    unknown = [name for name in names if name not in fields]
    if unknown:
        raise TypeError(f"{config_type.__name__} has no field {unknown[0]!r}")
    options = []
    for name in names:
        field, metadata = fields[name], fields[name].metadata
        default = REQUIRED if field.default is dataclasses.MISSING else field.default
        options.append(Option(name, hints[name], default, metadata.get(HELP, ""), min=metadata.get(MIN),
                              show_default=metadata.get(SHOW_DEFAULT, True)))
    return tuple(options)


@dataclass(frozen=True)
class AuditRoute:
    """How `dpdistill audit` runs the command on its canaried data, exactly as a user would: the option values the
    route fixes (`fixed`: method="dpsd"), those the audit's own options may replace (`defaults`), and which options
    receive the audited data and the non-private models trained on it (`inputs`: option name to "data", "teacher"
    (one model on all the data), "ensemble" (one per partition) or "transcribed" (the ensemble with --teachers
    above 1, else the teacher)). `epochs`: whether the audit's --epochs reaches the command's own."""

    name: str
    summary: str
    inputs: dict[str, str]
    fixed: dict[str, Any] = dataclasses.field(default_factory=dict)
    defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    epochs: bool = False


@dataclass(frozen=True)
class CommandSpec:
    """A command, declared once: its name, help (first line: the summary) and options, and how a run is made from
    the options' values. `configure(values)` gives the configuration the run completes (a fresh run's, checked
    before any work; a resumed run's saved one, or None where nothing is saved); `run(values, config, progress)`
    makes the run and returns its report; `progress_of(values, config)` the progress total (None: unknown) and
    description."""

    name: str
    help: str
    options: tuple[Option, ...]
    configure: Callable[[dict[str, Any]], Any]
    run: Callable[[dict[str, Any], Any, Progress | None], dict[str, Any]]
    progress_of: Callable[[dict[str, Any], Any], tuple[int | None, str]]
    positional: tuple[str, ...] = ()  # the API function's positional arguments, in order
    settable: tuple[type, ...] = ()  # the configurations whose every field --set (and an API keyword) reaches
    prefixed: tuple[tuple[str, type], ...] = ()  # and a nested configuration's fields under a prefix (generator_)
    audits: tuple[AuditRoute, ...] = ()  # the routes `dpdistill audit` runs through this command

    def accepts(self, name: str) -> bool:
        """Whether the command takes `name`, as an option or a settable field."""
        return name in {option.name for option in self.options} or any(
            name in {field.name for field in dataclasses.fields(kind)} for kind in self.settable)

    def assignments(self, settings: list[str]) -> dict[str, Any]:
        """`KEY=VALUE` settings as the command takes them: its --set where it has one, else each a field option's
        value, parsed as its default is typed."""
        if any(option.name == "set_" for option in self.options):
            return {"set_": list(settings)}
        typed = {option.name: (dataclasses.MISSING if option.default is REQUIRED else option.default,
                               str(option.annotation)) for option in self.options if option.field}
        return parse_typed(settings, typed)

    def settings(self, values: dict[str, Any], kind: type | None = None) -> dict[str, Any]:
        """The fields of `kind` (the first settable configuration unless told) set beyond the options: --set's
        KEY=VALUE, or the API's keywords."""
        kind = kind or self.settable[0]
        given = values.get(SETTINGS, {})
        foreign = sorted(set(given) - {field.name for field in dataclasses.fields(kind)})
        if foreign:  # a field of another of the command's configurations (DP-MERF's, given to DataLens)
            raise ConfigError(f"{self.name} with its {kind.__name__} has no setting {foreign[0]!r}")
        return {**parse_assignments(values.get("set_", []), kind), **given}

    def field_values(self, values: dict[str, Any]) -> dict[str, Any]:
        """The values of the options that are configuration fields: the configuration's keyword arguments (a
        path as the string a configuration saves)."""
        return {option.name: str(values[option.name]) if isinstance(values[option.name], Path) else values[option.name]
                for option in self.options if option.field}

    def values(self, given: dict[str, Any]) -> dict[str, Any]:
        """Every option's value: `given` over the declared defaults, and under SETTINGS the fields of `settable`
        given that are not options (the Python API's --set); an unknown or missing name is refused."""
        names = {option.name for option in self.options}
        settable = {field.name for kind in self.settable for field in dataclasses.fields(kind)} | {
            prefix + field.name for prefix, kind in self.prefixed for field in dataclasses.fields(kind)}
        unknown = sorted(set(given) - names - settable)
        if unknown:
            kinds = self._settable_words()
            raise ConfigError(f"{self.name} takes no option {unknown[0]!r}; it takes {', '.join(sorted(names))}"
                              + (f" and any field of {kinds}" if kinds else ""))
        values = {option.name: option.default for option in self.options} | {
            name: value for name, value in given.items() if name in names}
        values[SETTINGS] = {name: value for name, value in given.items() if name not in names}
        for option in self.options:  # a choice given as its word, as the command line takes it
            if isinstance(option.annotation, type) and issubclass(option.annotation, Enum):
                values[option.name] = _choice(option, values[option.name])
        missing = [option.flag() for option in self.options if values[option.name] is REQUIRED]
        if missing:
            raise ConfigError(f"{self.name} needs {missing[0]}")
        return values

    def _settable_words(self) -> str:
        return " or ".join([kind.__name__ for kind in self.settable]
                           + [f"{kind.__name__} prefixed {prefix}" for prefix, kind in self.prefixed])

    def signature(self) -> inspect.Signature:
        """The command line's: every option a keyword parameter typer reads."""
        return inspect.Signature([option.parameter() for option in self.options])

    def api_signature(self) -> inspect.Signature:
        """The Python API's: the positional arguments, then keywords with the same defaults, then `progress`."""
        kind = inspect.Parameter
        by_name = {option.name: option for option in self.options}
        first = [kind(name, kind.POSITIONAL_OR_KEYWORD,
                      annotation=str | Path if by_name[name].annotation is Path else by_name[name].annotation)
                 for name in self.positional]
        rest = [kind(option.name, kind.KEYWORD_ONLY, annotation=option.annotation,
                     default=kind.empty if option.default is REQUIRED else option.default)
                for option in self.options if option.name not in self.positional]
        return inspect.Signature([*first, *rest, kind("progress", kind.KEYWORD_ONLY, default=False,
                                                      annotation=Progress | bool)])

    def api_doc(self) -> str:
        """The API function's docstring: the command's help, then each keyword and what it does."""
        lines = [f"`dpdistill {self.name}`: {self.help}", "", "Keyword arguments (as the command's options):"]
        for option in self.options:
            default = "" if option.default is REQUIRED else f" [default: {option.default!r}]"
            lines.append(f"- {option.name}: {option.help or option.flag()}{default}")
        if self.settable or self.prefixed:
            lines.append(f"- any other field of {self._settable_words()}, as --set does")
        lines.append("- progress: True shows progress on stderr; a callable gets every progress record")
        return "\n".join(lines)


def _choice(option: Option, value: Any) -> Enum:
    choices = [member.value for member in option.annotation]
    if value not in choices:
        raise ConfigError(f"{option.flag()} must be one of {', '.join(choices)}, got {value!r}")
    return option.annotation(value)


def option_table(spec: CommandSpec) -> str:
    """The docs' markdown table of a command's options, generated so that it says what --help says."""
    rows = ["| option | default | what it does |", "|---|---|---|"]
    for option in spec.options:
        default = option.default.value if isinstance(option.default, Enum) else option.default
        default = "required" if default is REQUIRED else "" if default in (None, []) else f"`{default}`"
        rows.append(f"| `{option.flag()}` | {default} | {option.help.replace('|', '/')} |")
    return "\n".join(rows)
