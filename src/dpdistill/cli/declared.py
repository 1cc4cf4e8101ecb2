"""The commands methods declare (dpdistill/commands.py), made into typer commands from their declaration when one
runs or its help is asked: the same options, help, one-line errors, --quiet, progress and summary as every
command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import typer
from typer.core import TyperGroup

from dpdistill.cli.output import clear_errors, print_summary, progress_display
from dpdistill.commands import DECLARED
from dpdistill.options import CommandSpec


class CommandsWithDeclared(TyperGroup):
    """The app's own commands, then the declared ones: listed from their summaries, built when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *DECLARED]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in DECLARED:
            return command_from(DECLARED[name].spec())
        return super().get_command(ctx, name)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                             list[str]]:
        """A party's command of a federation is two words (`federated serve`): resolved before the one-word one."""
        if len(args) > 1 and f"{args[0]} {args[1]}" in self.list_commands(ctx):
            name = f"{args[0]} {args[1]}"
            return name, self.get_command(ctx, name), args[2:]
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, with each declared command's summary read from its line, not by importing it."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        listed = {name: click.Command(name, help=DECLARED[name].summary) if name in DECLARED
                  else super(CommandsWithDeclared, self).get_command(ctx, name) for name in names}
        rows = [(name, command.get_short_help_str(limit)) for name, command in listed.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def command_from(spec: CommandSpec) -> click.Command:
    """The click command of `spec`: its options from the declaration, its run through the declared steps."""

    def run(**values: Any) -> None:
        config = spec.configure(values)  # a bad setting is refused here, before any progress is drawn
        total, description = spec.progress_of(values, config)
        with progress_display(total, description) as update:
            report = spec.run(values, config, update)
        if report is not None:  # None: a process of a run under torchrun other than rank 0, which reports
            print_summary(report, Path(values["out"]))

    run.__signature__ = spec.signature()
    run.__annotations__ = {option.name: option.annotation for option in spec.options}
    single = typer.Typer(add_completion=False, rich_markup_mode=None)
    single.command(spec.name, help=spec.help)(clear_errors(run))
    return typer.main.get_command(single)
