"""Every command's --help reads whole in an 80-column terminal: no line is longer, nothing is cut short with an
ellipsis, and no word or option name is split across two lines."""

import contextlib
import io
import re
from typing import Any

import click
import pytest
import typer

from dpdistill.cli.main import app
from dpdistill.options import DATASETS

WIDTH = 80


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """The app itself and every command under it (click commands, the declared ones built as when they run), with
    the words that call each."""
    found = [(path, command)]
    if isinstance(command, click.Group):
        with click.Context(command) as context:
            for name in command.list_commands(context):
                found += _commands(command.get_command(context, name), (*path, name))
    return found


COMMANDS = _commands(typer.main.get_command(app))

@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    """Every command's help as an 80-column terminal shows it: click's formatter reads COLUMNS for each help (here,
    in this process: a process of its own cost 4-6 s of imports; CliRunner would impose its own width)."""
    command, printed = typer.main.get_command(app), {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", str(WIDTH))
        for path, _ in COMMANDS:
            text = io.StringIO()
            with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
                command.main([*path, "--help"], prog_name="dpdistill", standalone_mode=False)
            printed[" ".join(path)] = text.getvalue()
    return printed


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(path) or "dpdistill" for path, _ in COMMANDS])
def test_help_fits_80_columns_whole(path: tuple[str, ...], command: Any, helps: dict[str, str]):
    text = helps[" ".join(path)]
    lines = text.splitlines()
    assert lines[0].startswith(" ".join(("Usage: dpdistill", *path))), text[:200]
    assert [line for line in lines if len(line) > WIDTH] == []
    body = [line for line in lines if not line.startswith("Usage:")]  # click's "[ARGS]..." is not a cut
    assert [line for line in body if "..." in line or "\u2026" in line] == []
    split = [f"{line.strip()} / {after.strip()}" for line, after in zip(lines, lines[1:])
             if re.search(r"\w-$", line) and re.match(r"\s*\w", after)]
    assert split == []  # a word or name broken at its hyphen
    names = [name for parameter in command.params for name in (*parameter.opts, *parameter.secondary_opts)]
    names += list(getattr(command, "commands", {}))
    words = set(re.findall(r"[\w-]+", text))
    # each option and subcommand named in one piece (a party's two-word command on one line)
    assert [name for name in names if name not in (text if " " in name else words)] == []


def test_every_data_set_option_names_every_kind_of_data_set():
    """A --dataset (or DATASET) that reads a data set says it may be a folder of images by class, and the rest."""
    helps = {" ".join(path): parameter.help for path, command in COMMANDS for parameter in command.params
             if parameter.name == "dataset" and not isinstance(parameter.type, click.Choice)}  # demo's two choices
    assert {"train-teacher", "train-private", "evaluate", "transcribe", "pate", "synthesize", "release",
            "federated", "import-teacher", "budget", "audit", "pretrain", "plan"} <= set(helps)
    assert {path: text for path, text in helps.items() if not text.endswith(DATASETS)} == {}
