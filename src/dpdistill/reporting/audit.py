"""The report of an audit (`dpdistill audit`): the empirical bound beside the route's claim, and the canary scores'
histogram. Each method's report section lives in a reporting module named for its method or family; what several
share is in `report.py`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from dpdistill.reporting.report import number, percent, pyplot, save_plot


def save_score_histogram(scores: np.ndarray, included: np.ndarray, path: Path, score: str) -> None:
    """An audit's canary scores, included against excluded: the further apart, the more the release reveals."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(5, 3))
    bins = np.linspace(scores.min(), scores.max(), 41) if scores.max() > scores.min() else 10
    axis.hist(scores[included], bins=bins, alpha=0.6, label=f"included ({int(included.sum())})")
    axis.hist(scores[~included], bins=bins, alpha=0.6, label=f"excluded ({int((~included).sum())})")
    axis.set_xlabel(f"canary score ({score})", fontsize=7)
    axis.set_ylabel("canaries")
    axis.legend()
    save_plot(figure, path)


def audit_claim(privacy: dict[str, Any]) -> str:
    """What an audited route claims, in words: a guarantee, nothing, or an accounted epsilon that is none."""
    if privacy["formal_guarantee"]:
        return f"the claimed epsilon {number(privacy['epsilon'])}"
    if math.isinf(privacy["epsilon"]):
        return "no claim (the route runs without privacy)"
    return f"the epsilon its accounting states, {number(privacy['epsilon'])}, which is NO formal guarantee"


def audit_markdown(report: dict[str, Any]) -> str:
    """The human-readable report of an audit: the bound beside the claim, how it was reached."""
    result, privacy = report["audit"], report["privacy"]
    claim = audit_claim(privacy)
    verdict = ("**REFUTED**: the release reveals more than that epsilon allows" if report["refuted"] else
               "not refuted (a one-run audit cannot confirm a guarantee, only refute one)")
    lines = [f"# dpdistill audit: {report['route']} on {report['dataset']}", "",
             f"Audited route: {report['route_summary']}.", "",
             f"Empirical epsilon lower bound {number(result['epsilon_lower_bound'])} at "
             f"{100 * result['confidence']:g}% confidence (delta {result['delta']:g}), against {claim}: "
             f"{verdict}.", "",
             "| quantity | value |", "| --- | --- |",
             f"| canaries (included) | {result['canaries']} ({result['included']}) |",
             f"| canary | {result['canary']} |",
             f"| guesses: in / out / right | {result['guesses_in']} / {result['guesses_out']} / {result['right']} |",
             f"| attack AUC | {number(result['auc'])} |",
             f"| TPR at 1% FPR | {percent(result['tpr_at_1pct_fpr'])} |",
             f"| student accuracy (real test images) | {percent(report['accuracy']['student'])} |"]
    lines += [f"| scored by {name}: lower bound / AUC | {number(value['epsilon_lower_bound'])} / "
              f"{number(value['auc'])} |" for name, value in report["scorers"].items() if len(report["scorers"]) > 1]
    inversion = report.get("inversion")
    lines += ["", "The guess counts are searched on a grid (1% to 50% of the canaries on each side) with the "
              "confidence split evenly among its points and among the scores. The route's own report is in "
              "`route/`. Figures measured on private examples without noise (a loss-threshold membership attack on "
              "ordinary training images, the inversion's match with each class's mean private image) are in "
              "`private/record.json`: never publish them.", "", "![canary scores](scores.png)", ""]
    if inversion:
        lines += ["Each class reconstructed from the released student alone (gradient ascent on its logit):", "",
                  "![model inversion](inversion.png)", ""]
    return "\n".join(lines)
