"""What the command line prints, and where: errors and warnings as one line each on stderr, always; progress and
summaries on stderr, silenced by --quiet; a command's own answer (a listing, JSON) on stdout."""

from __future__ import annotations

import functools
import json
import inspect
import signal
import warnings
from pathlib import Path
from typing import Any, Callable

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dpdistill.errors import DpDistillError, Note
from dpdistill.progress import ProgressDisplay

console = Console(stderr=True)  # errors and warnings: one line each, always
summary = Console(stderr=True)  # progress lines and what a run made: silenced by --quiet
QUIET = typer.Option(False, "--quiet", "-q", show_default=False,
                     help="print nothing but errors and warnings (the report files are written as always)")


def clear_errors(command: Callable) -> Callable:
    """Turn the library's user-facing errors into one 'error: ...' line on stderr and exit code 2, and warnings
    into one 'warning: ...' line each (a `Note`, one 'note: ...' line); give the command --quiet."""

    @functools.wraps(command)
    def wrapper(*args: Any, quiet: bool = False, **kwargs: Any) -> Any:
        signal.signal(signal.SIGTERM, _interrupt)
        summary.quiet = quiet
        try:
            with warnings.catch_warnings():  # a library's Python warning too: one line, not its source location
                warnings.showwarning = lambda message, category, *_: (note if issubclass(category, Note)
                                                                       else warn)(str(message))
                return command(*args, **kwargs)
        except DpDistillError as error:
            console.print(f"[bold red]error:[/] {_one_line(str(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=2) from None
        except KeyboardInterrupt:
            console.print("interrupted: the last checkpoint is kept; continue with the same command and --resume")
            raise typer.Exit(code=130) from None
        finally:
            summary.quiet = False

    signature = inspect.signature(command)
    wrapper.__signature__ = signature.replace(parameters=[
        *signature.parameters.values(), inspect.Parameter("quiet", inspect.Parameter.KEYWORD_ONLY, default=QUIET,
                                                          annotation=bool)])
    wrapper.__annotations__ = {**command.__annotations__, "quiet": bool}
    return wrapper


def warn(message: str) -> None:
    console.print(f"[bold yellow]warning:[/] {_one_line(message)}", highlight=False, soft_wrap=True)


def note(message: str) -> None:
    console.print(f"[bold]note:[/] {_one_line(message)}", highlight=False, soft_wrap=True)


def _one_line(message: str) -> str:
    """`message` on one line, printed as written: a bracket in it (a path, a library's "[file.cc:553]") is no
    markup."""
    return escape(" ".join(message.splitlines()))


def _interrupt(_signum: int, _frame: Any) -> None:
    """SIGTERM (a scheduler stopping the job) ends a run like Ctrl-C: the last checkpoint stays resumable."""
    raise KeyboardInterrupt


def progress_display(total: int | None, description: str) -> ProgressDisplay:
    """The run's progress on stderr, from its first record on (a refused run shows only its error)."""
    return ProgressDisplay(description, total, quiet=summary.quiet)


def private_timing(out: Path) -> dict[str, float]:
    """The wall times a run keeps in its private record (they grow with the private count): shown to its owner here,
    never published."""
    from dpdistill.reporting.report import PRIVATE_DIR, PRIVATE_RECORD

    try:
        return dict(json.loads((out / PRIVATE_DIR / PRIVATE_RECORD).read_text()).get("timing", {}))
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def print_summary(report: dict, out: Path) -> None:
    """Every method's result from its report: accuracy, the sound epsilon (and the paper's figure, which is none),
    the answers it took, what all releases from its teacher spent, and first of all what the guarantee covers."""
    from dpdistill.privacy.provenance import Provenance
    from dpdistill.reporting.transcription import WITH_TEACHER, privacy_mode_words

    privacy, accuracy = report["privacy"], report["accuracy"]
    mode = [privacy_mode_words(report)] if "privacy_mode" in report else []
    table = Table(title=" / ".join([report["method"], *mode, str(report["dataset"])]))
    table.add_column("quantity")
    table.add_column("value")
    if accuracy["student"] is not None:
        table.add_row("student accuracy", f"{100 * accuracy['student']:.2f}%")
    if accuracy.get("synthetic") is not None:
        table.add_row(f"a {report['synthetic']['classifier']} classifier trained on the synthetic set alone",
                      f"{100 * accuracy['synthetic']:.2f}%")
    if accuracy.get("teacher") is not None:  # a DP teacher's: public
        table.add_row("the DP teacher's accuracy", f"{100 * accuracy['teacher']:.2f}%")
    if privacy["mode"] == "none" and "teacher_release" not in privacy:
        table.add_row("privacy", "none")
    else:
        budget = f" (budget {privacy['budget_epsilon']:g})" if privacy.get("budget_epsilon") is not None else ""
        scope = privacy.get("epsilon_scope") or ("sound" + (f", {privacy['relation']}" if "relation" in privacy else ""))
        table.add_row(f"epsilon ({scope})", f"{privacy['epsilon']:.4g} at delta {privacy['delta']:g}{budget}")
        if privacy.get("epsilon_replace_one") is not None and privacy.get("relation") != "replace-one":
            table.add_row("epsilon, replace one example", f"{privacy['epsilon_replace_one']:.4g}")
        if "teacher_release" in privacy:
            table.add_row("teacher (a DP release: this run is post-processing)",
                          Provenance(**privacy["teacher_release"]).statement())
            if "route_epsilon" in privacy:
                table.add_row("epsilon of the noisy answers alone", f"{privacy['route_epsilon']:.4g}")
        if "sample_source" in privacy:  # the epsilon above is their composition
            table.add_row("epsilon: sample source / answers alone",
                          f"{privacy['sample_source']['epsilon']:.4g} / {privacy['route_epsilon']:.4g}")
        if "epsilon_opacus" in privacy:
            table.add_row("epsilon (RDP, add/remove: dp-accounting / Opacus)",
                          f"{privacy['epsilon_rdp']:.4g} / {privacy['epsilon_opacus']:.4g}")
        if privacy.get("paper_epsilon") is not None:
            table.add_row("paper_epsilon (NOT a guarantee)", f"{privacy['paper_epsilon']:.4g}")
        if privacy.get("teachers", 1) > 1:
            table.add_row("teachers (ensemble)", str(privacy["teachers"]))
        if "queries" in privacy:
            table.add_row("teacher queries", str(privacy["queries"]))
        if "sample_rate" in privacy:
            table.add_row("noise multiplier, sampling rate, steps",
                          f"{privacy['noise_multiplier']:.4g}, {privacy['sample_rate']:.4g}, {privacy['steps']}")
        if "training_set_size" in privacy:
            table.add_row("training-set size the sampling follows", privacy["training_set_size"])
    if "ledger" in privacy:  # what the runs recorded there spent, not the teacher's own epsilon above
        ledger = privacy["ledger"]
        total = "no total set" if ledger["total_epsilon"] is None else f"of {ledger['total_epsilon']:g}"
        table.add_row("epsilon recorded in the teacher's ledger", f"{ledger['spent_epsilon']:.4g} ({total})")
    timing = {**private_timing(out), **report["timing"]}  # the owner's terminal may show the private record's
    if WITH_TEACHER in timing:
        table.add_row("wall time of the whole release", f"{timing[WITH_TEACHER]:.1f} s")
    loop = " of the transcription's loop" if "privacy_mode" in report else ""
    if "wall_seconds" in timing:
        table.add_row(f"wall time{loop}{' (resumed run: this part)' if report.get('resumed') else ''}",
                      f"{timing['wall_seconds']:.1f} s")
    table.add_row("report", str(out / "report.md"))
    summary.print(table)
    style = "bold red" if privacy.get("formal_guarantee") is False else ""
    summary.print(f"covered by the guarantee: {privacy['covered']}", style=style, highlight=False)
