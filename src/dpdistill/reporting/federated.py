"""The report of a federated run (`dpdistill federated`): PATE or FedDPSD across data owners, and the federation's
rounds. Each method's report section lives in a reporting module named for its method or family; what several share
(PATE's student rounds, a transcription's samples and curve) is in `report.py`."""

from __future__ import annotations

import json
from typing import Any

from dpdistill.reporting.report import (as_written, guarantee, number, paper_epsilon_row, percent, samples_and_curve,
                                        student_rounds)


FEDERATED_ROWS = (("owners", "data owners"), ("threshold", "owners needed in every round (owners - dropouts)"),
                  ("colluders", "colluding owners tolerated (each knows its own share)"),
                  ("secagg_shares", "SecAgg+ key-sharing neighbours of each owner, itself included"),
                  ("secagg_share_threshold", "of those, the key shares needed to unmask"),
                  ("secagg_failure", "chance the graph exposed or split a sum over the run (part of delta)"),
                  ("honest_shares", "the fewest shares in a sum that no colluder knows: the noise is sized for them"),
                  ("queries", "queries asked"), ("share_sigma", "each owner's noise share (sigma)"),
                  ("sigma_at_threshold", "noise of the honest shares at the threshold (sigma)"),
                  ("beta", "bound on each member's gradient (beta)"),
                  ("sigma", "noise on each sum in units of beta (the seed's sigma)"))


def federated_markdown(report: dict[str, Any]) -> str:
    """The human-readable report of a federated run: the guarantee, the federation's rounds, the student."""
    privacy, accuracy, federation = report["privacy"], report["accuracy"], report["federation"]
    pate = federation.get("method", "pate") == "pate"
    lines = [f"# dpdistill report: federated {'PATE' if pate else 'DPSD (FedDPSD)'} across {privacy['owners']} "
             f"data owners, {report['dataset']}", "",
             f"{guarantee(privacy)} with respect to {privacy['unit']} "
             f"({privacy['accountant']}; {privacy['aggregation']}). Covered: {privacy['covered']}. No party saw an "
             f"owner's data or its answers; the owners' teachers are not private and stay with their owners.", ""]
    lines += [f"Public images: {report['public']}.", ""] if pate else []
    lines += ["| quantity | value |", "| --- | --- |",
              f"| student accuracy (real test images{', none of them public' if pate else ''}) | "
              f"{percent(accuracy['student'])} |"]
    lines += [f"| answers naming the true class | {percent(accuracy['answers'])} |"] if pate else []
    lines += [f"| epsilon (sound, RDP) | {number(privacy['epsilon'])} |"]
    lines += [f"| {label} | {number(privacy[key])} |" for key, label in FEDERATED_ROWS if key in privacy]
    lines += paper_epsilon_row(privacy)
    lines += [f"| engine | {federation['engine']} |",
              f"| secure-aggregation rounds | {federation['rounds']} |",
              f"| owners that contributed, per round | {_contributors(federation['contributors'])} |",
              f"| rounds lost during secure aggregation (spent, unanswered) | "
              f"{', '.join(map(str, federation['lost_rounds'])) or 'none'} |",
              f"| federation wall time | {federation['wall_seconds']:.1f} s |",
              *_round_times(federation.get("round_seconds", [])),
              f"| wall time{' (resumed run: this part)' if report.get('resumed') else ''} | "
              f"{report['timing']['wall_seconds']:.1f} s |", ""]
    if pate:
        return "\n".join(lines + ["## Student rounds", ""] + student_rounds(report, "sums")) + "\n"
    engine_config = json.dumps(as_written(report["engine_config"]), indent=2)
    lines += [*samples_and_curve(report), "", "## Configuration of the server's engine", "", "```json",
              engine_config, "```"]
    return "\n".join(lines) + "\n"


def _round_times(seconds: list[float]) -> list[str]:
    """The first round (with the engine's start-up) and the median of the others, to the watcher's second."""
    if not seconds:
        return []
    later = sorted(seconds[1:])
    rest = f", then {later[len(later) // 2]:.0f} s (median of {len(later)})" if later else ""
    return [f"| seconds per round, as journaled | first {seconds[0]:.0f} s (with start-up){rest} |"]


def _contributors(counts: list[int]) -> str:
    """Per-round contributor counts, run-length encoded (a FedDPSD run has hundreds of rounds)."""
    runs: list[list[int]] = []
    for count in counts:
        if runs and runs[-1][0] == count:
            runs[-1][1] += 1
        else:
            runs.append([count, 1])
    return ", ".join(f"{count} x {repeat}" if repeat > 1 else str(count) for count, repeat in runs)
