"""The reports of the private synthesisers of `dpdistill synthesize`: DataLens and DP-MERF (mean embeddings), around
one layout for a synthetic set. Each method's report section lives in a reporting module named for its method or
family; what several share is in `report.py`."""

from __future__ import annotations

import json
from typing import Any

from dpdistill.reporting.report import as_written, guarantee, number, percent


def datalens_markdown(report: dict[str, Any]) -> str:
    """The human-readable report of a private generator (`dpdistill synthesize`)."""
    privacy, timing = report["privacy"], report["timing"]
    statement = (f"{guarantee(privacy)} with respect to {privacy['unit']}: {privacy['queries']} generated samples, "
                 f"each answered by {privacy['teachers']} teacher discriminators through TopAgg, composed with "
                 f"{privacy['accountant']}. Covered: {privacy['covered']}. The teachers never leave `private/`.")
    rows = [f"| same classifier, official protocol: maximum over its epochs (optimistic) | "
            f"{percent(report['accuracy']['official_protocol_max_over_epochs'])} |",
            f"| epsilon (sound) | {number(privacy['epsilon'])} |",
            f"| epsilon (RDP, the official code's bound 2 k lambda / sigma^2 a query) | {number(privacy['epsilon_rdp'])} |",
            f"| delta | {privacy['delta']:g} |",
            f"| teachers N, top-k, vote threshold | {privacy['teachers']}, {privacy['top_k']}, "
            f"{number(privacy['threshold_votes'])} |",
            f"| sigma (noise std on each summed vote), noise multiplier | {number(privacy['sigma'])}, "
            f"{number(privacy['noise_multiplier'])} |",
            f"| generator steps, samples asked | {privacy['steps']}, {privacy['queries']} |",
            f"| wall time of the student (the generator's: in the private record) | "
            f"{timing['student_seconds']:.1f} s |"]
    training = ["## Generator training", "", "Share of the pixels the released direction moved (the teachers' losses "
                "are private: `private/record.json`).", "", "| step | share of coordinates kept |", "| --- | --- |"]
    training += [f"| {r['step']} | {number(r['kept_share'])} |" for r in report["history"]]
    return _synthetic_markdown(report, statement, rows, training,
                               "initialisation, latents, classes, quantisation coins")


def mean_embedding_markdown(report: dict[str, Any]) -> str:
    """The human-readable report of a mean-embedding synthesiser (`dpdistill synthesize --method dp-merf`)."""
    privacy, timing = report["privacy"], report["timing"]
    statement = (f"{guarantee(privacy)} with respect to {privacy['unit']}: one release of the class-wise sums of "
                 f"the embedding ({', '.join(privacy['embedding'])}), L2 sensitivity {number(privacy['sensitivity'])}, "
                 f"{privacy['accountant']}. Covered: {privacy['covered']}.")
    rows = [f"| epsilon (sound, replace-one) | {number(privacy['epsilon'])} |",
            f"| epsilon (add/remove) | {number(privacy['epsilon_add_remove'])} |",
            f"| epsilon (RDP cross-check) | {number(privacy['epsilon_rdp'])} |",
            f"| delta | {privacy['delta']:g} |",
            f"| sigma (noise std on each summed coordinate), noise multiplier | {number(privacy['sigma'])}, "
            f"{number(privacy['noise_multiplier'])} |",
            f"| wall time: fit, student (the release's: in the private record) | {timing['fit_seconds']:.1f} s, "
            f"{timing['student_seconds']:.1f} s |"]
    training = ["## Fit", "", "Squared distance of the synthetic means to the released means, summed over the classes "
                "(post-processing of the release).", "", "| step | distance |", "| --- | --- |"]
    training += [f"| {r['step']} | {number(r['distance'])} |" for r in report["history"]]
    return _synthetic_markdown(report, statement, rows, training, "random features, initial images, batches")


def _synthetic_markdown(report: dict[str, Any], statement: str, rows: list[str], training: list[str],
                        seeded: str) -> str:
    """A synthesiser's report: its guarantee, the classifier trained on the synthetic set, the method's own
    figures (`rows`, `training`), the samples and the configuration."""
    synthetic = report["synthetic"]
    lines = [f"# dpdistill report: {report['method']} on {report['dataset']}", "", statement, "",
             "| quantity | value |", "| --- | --- |",
             f"| {report['student_arch']} trained on the synthetic set only, final model ({report['measured_on']}) | "
             f"{percent(report['accuracy']['student'])} |", *rows,
             f"| synthetic images ({synthetic['file']}) | {synthetic['images']} |",
             "", "## Synthetic samples (ten per class, titled with their class)", "", "![synthetic samples](samples.png)",
             "", *training]
    scored = [record for record in report["student_history"] if "test_accuracy" in record]
    if len(scored) > 1:  # a curve, where the classifier was scored after each epoch
        lines += ["", "## Classifier on the synthetic set", "", "| epoch | real test accuracy |", "| --- | --- |"]
        lines += [f"| {r['epoch']} | {percent(r['test_accuracy'])} |" for r in scored]
    lines += ["", "## Configuration", "", "```json", json.dumps(as_written(report["config"]), indent=2), "```", "",
              f"Seed {report['seed']} ({seeded}). Noise: {report['privacy']['noise']}. Every figure above is also in "
              f"`report.json`."]
    return "\n".join(lines) + "\n"
