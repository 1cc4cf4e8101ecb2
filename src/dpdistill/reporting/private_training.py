"""The report of a private-training baseline (`dpdistill train-private`: DP-SGD, DPDFD's direct route). Each
method's report section lives in a reporting module named for its method or family; what several share is in
`report.py`."""

from __future__ import annotations

import json
from typing import Any

from dpdistill.reporting.report import as_written, number, percent


PRIVATE_TRAINING_ROWS = (  # (privacy key, row label) of the private-training report, in this order when present
    ("relation", "neighbouring relation"), ("epsilon_add_remove", "epsilon, add/remove one example"),
    ("epsilon_replace_one", "epsilon, replace one example"),
    ("epsilon_rdp", "epsilon (dp-accounting RDP, add/remove, cross-check)"),
    ("epsilon_opacus", "epsilon (Opacus RDP accountant, add/remove)"), ("delta", "delta"), ("budget_epsilon", "budget"),
    ("noise_multiplier", "noise multiplier (std / sensitivity)"),
    ("sigma", "sigma (noise std / beta)"), ("beta", "beta (norm of each output gradient)"),
    ("max_grad_norm", "max grad norm (clipping)"), ("noise_std", "noise std"), ("target_step", "target step gamma"),
    ("sample_rate", "sampling rate (Poisson)"), ("size_count_epsilon", "of which the noisy count of the training set"),
    ("steps", "steps"), ("planned_steps", "planned steps"),
)


def private_training_markdown(report: dict[str, Any]) -> str:
    """The human-readable report of a private-training baseline: what the epsilon covers first, then the figures."""
    privacy = report["privacy"]
    if privacy["formal_guarantee"]:
        statement = (f"**({number(privacy['epsilon'])}, {privacy['delta']:g})-DP** with respect to "
                     f"{privacy['unit']} ({privacy['accountant']}). Covered: {privacy['covered']}.")
    else:
        statement = (f"**{privacy['covered']}.** Their epsilon: {number(privacy['epsilon'])} at delta "
                     f"{privacy['delta']:g}, with respect to {privacy['unit']} ({privacy['accountant']}).")
    config = report["config"]
    start = ("" if not config["student_init"] else
             f"The student starts from the encoder {config['student_init']}; "
             + ("only its last layer learns, on the encoder's frozen features. " if config["train_layers"] == "head"
                else "its BatchNorm layers keep the encoder's statistics. "))
    lines = [f"# dpdistill report: private training ({report['method']}) on {report['dataset']}", "", statement, "",
             f"{start}Accuracy is measured on {report['measured_on']}. The sampling rate and the steps follow "
             f"the training-set size {privacy['training_set_size']}.", "",
             "| quantity | value |", "| --- | --- |",
             f"| student accuracy | {percent(report['accuracy']['student'])} |",
             f"| epsilon ({privacy['accountant']}) | {number(privacy['epsilon'])} |"]
    lines += [f"| {label} | {number(privacy[key])} |" for key, label in PRIVATE_TRAINING_ROWS if key in privacy]
    timing = report["timing"]
    lines += [f"| planning (noise calibration) | {timing['planning_seconds']:.1f} s |",
              f"| processes (each its share of the examples, the same privacy) | {timing['processes']} |",
              "", "## Epochs", "", "![test accuracy after each epoch](training.png)", "",
              "| epoch | test accuracy | steps |", "| --- | --- | --- |"]
    lines += [f"| {r['epoch']} | {percent(r['test_accuracy'])} | {r['steps']} |" for r in report["history"]]
    lines += ["", "## Settings", "", "```json", json.dumps(as_written(config), indent=2), "```", "",
              f"Seed {report['seed']} (initialisation only). Noise and sampling: {privacy['noise']}. "
              f"Every figure above is also in `report.json`; figures computed from the private data without "
              f"noise are in `private/record.json` (never publish it)."]
    if report.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"
