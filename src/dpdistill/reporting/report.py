"""Reports a person can read (Markdown with figures) and a machine can parse (JSON), from one dict."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

import numpy as np
from torch import Tensor

from dpdistill.atomic import write_atomically


PRIVATE_DIR = "private"  # inside a release's --out: what must never be published
PRIVATE_RECORD = "record.json"
PRIVATE_NOTICE = ("KEEP, NEVER PUBLISH. This folder holds what the run computed from the private data or the "
                  "non-private teacher without noise (the teacher's accuracy, the data set's exact size, losses on "
                  "private data) and, while a run is unfinished, its resumable state (checkpoints, raw answers). "
                  "Publishing any of it voids the privacy guarantee. Everything else in the output folder "
                  "(report.json, report.md, the student, the generator, the samples) is the release.")


def write_private_record(out_dir: Path, record: dict[str, Any]) -> None:
    """The run's private figures in `out_dir/private/record.json`, beside a notice that says never to publish them."""
    directory = out_dir / PRIVATE_DIR
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / PRIVATE_RECORD, {"notice": PRIVATE_NOTICE, **record})
    write_atomically({directory / "DO-NOT-PUBLISH.txt": lambda temporary: temporary.write_text(PRIVATE_NOTICE + "\n")})


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Atomic JSON write; infinities become the string 'inf' so the file stays standard JSON."""
    text = json.dumps(as_written(payload), indent=2)
    write_atomically({path: lambda temporary: temporary.write_text(text)})


def as_written(value: Any) -> Any:
    """`value` as write_json stores it: infinities as the string 'inf', tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: as_written(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_written(item) for item in value]
    return value


def _pyplot() -> ModuleType:
    """matplotlib's pyplot, drawing to files only, imported when a figure is drawn: half a second of the start of
    every process that writes a report (an owner answering a round, the CLI) would go to it otherwise."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def save_image_grid(images: Tensor, path: Path, columns: int = 16, labels: list[int] | None = None) -> None:
    """A grid of images in [-1, 1] (N, C, H, W), optionally titled with labels: one mosaic on one axes (an axes per
    image took two seconds to lay out for 64 images, three to four for 100: a tenth of that now)."""
    pictures = ((images.detach().cpu().float().clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1).numpy()
    count, height, width, channels = pictures.shape
    rows = max(1, math.ceil(count / columns))
    gap, title = max(1, height // 8), (height // 2 if labels is not None else 0)  # pixels beside and above a tile
    cell_height, cell_width = title + height + gap, width + gap
    mosaic = np.ones((rows * cell_height, columns * cell_width, channels), dtype=np.float32)  # white between tiles
    for index, picture in enumerate(pictures):
        top, left = index // columns * cell_height + title, index % columns * cell_width
        mosaic[top:top + height, left:left + width] = picture
    plt = _pyplot()
    figure = plt.figure(figsize=(columns * 0.6, columns * 0.6 * mosaic.shape[0] / mosaic.shape[1]))
    axis = figure.add_axes((0, 0, 1, 1))
    axis.axis("off")
    axis.imshow(mosaic[..., 0] if channels == 1 else mosaic, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    for index, label in enumerate(labels[:count] if labels is not None else []):
        axis.text(index % columns * cell_width + (width - 1) / 2, index // columns * cell_height + (title - 1) / 2,
                  str(label), fontsize=6, ha="center", va="center")
    figure.savefig(path, dpi=120)
    plt.close(figure)


def save_training_curve(history: list[dict], path: Path) -> None:
    """Student test accuracy and losses over iterations."""
    evaluated = [record for record in history if record.get("student_accuracy") is not None]
    plt = _pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3))
    left.plot([r["iteration"] for r in evaluated], [100 * r["student_accuracy"] for r in evaluated], marker="o")
    left.set_xlabel("iteration")
    left.set_ylabel("student test accuracy (%)")
    left.grid(alpha=0.3)
    for name in ("student", "generator"):  # a frozen generator (generator_updates=false) has no loss
        points = [(r["iteration"], r[f"{name}_loss"]) for r in history if f"{name}_loss" in r]
        if points:
            right.plot(*zip(*points), label=name)
    right.set_xlabel("iteration")
    right.set_ylabel("loss")
    right.legend()
    right.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def save_score_histogram(scores: np.ndarray, included: np.ndarray, path: Path, score: str) -> None:
    """An audit's canary scores, included against excluded: the further apart, the more the release reveals."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(5, 3))
    bins = np.linspace(scores.min(), scores.max(), 41) if scores.max() > scores.min() else 10
    axis.hist(scores[included], bins=bins, alpha=0.6, label=f"included ({int(included.sum())})")
    axis.hist(scores[~included], bins=bins, alpha=0.6, label=f"excluded ({int((~included).sum())})")
    axis.set_xlabel(f"canary score ({score})", fontsize=7)
    axis.set_ylabel("canaries")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def audit_claim(privacy: dict[str, Any]) -> str:
    """What an audited route claims, in words: a guarantee, nothing, or an accounted epsilon that is none."""
    if privacy["formal_guarantee"]:
        return f"the claimed epsilon {_number(privacy['epsilon'])}"
    if math.isinf(privacy["epsilon"]):
        return "no claim (the route runs without privacy)"
    return f"the epsilon its accounting states, {_number(privacy['epsilon'])}, which is NO formal guarantee"


def audit_markdown(report: dict[str, Any]) -> str:
    """The human-readable report of an audit: the bound beside the claim, how it was reached."""
    result, privacy = report["audit"], report["privacy"]
    claim = audit_claim(privacy)
    verdict = ("**REFUTED**: the release reveals more than that epsilon allows" if report["refuted"] else
               "not refuted (a one-run audit cannot confirm a guarantee, only refute one)")
    lines = [f"# dpdistill audit: {report['route']} on {report['dataset']}", "",
             f"Audited route: {report['route_summary']}.", "",
             f"Empirical epsilon lower bound {_number(result['epsilon_lower_bound'])} at "
             f"{100 * result['confidence']:g}% confidence (delta {result['delta']:g}), against {claim}: "
             f"{verdict}.", "",
             "| quantity | value |", "| --- | --- |",
             f"| canaries (included) | {result['canaries']} ({result['included']}) |",
             f"| canary | {result['canary']} |",
             f"| guesses: in / out / right | {result['guesses_in']} / {result['guesses_out']} / {result['right']} |",
             f"| attack AUC | {_number(result['auc'])} |",
             f"| TPR at 1% FPR | {_percent(result['tpr_at_1pct_fpr'])} |",
             f"| student accuracy (real test images) | {_percent(report['accuracy']['student'])} |",
             f"| loss-threshold membership attack on {report['membership']['members']} training and as many test "
             f"images: AUC / TPR at 1% FPR | {_number(report['membership']['auc'])} / "
             f"{_percent(report['membership']['tpr_at_1pct_fpr'])} |"]
    lines += [f"| scored by {name}: lower bound / AUC | {_number(value['epsilon_lower_bound'])} / "
              f"{_number(value['auc'])} |" for name, value in report["scorers"].items() if len(report["scorers"]) > 1]
    inversion = report.get("inversion")
    if inversion:
        lines.append(f"| model inversion: classes whose reconstruction matches its own class's mean private image "
                     f"best / mean correlation | {_percent(inversion['class_match'])} / "
                     f"{_number(inversion['correlation'])} |")
    lines += ["", "The guess counts are searched on a grid (1% to 50% of the canaries on each side) with the "
              "confidence split evenly among its points and among the scores. The route's own report is in "
              "`route/`.", "", "![canary scores](scores.png)", ""]
    if inversion:
        lines += ["Each class reconstructed from the released student alone (gradient ascent on its logit):", "",
                  "![model inversion](inversion.png)", ""]
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}%"


def _number(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    return str(value)


def privacy_statement(privacy: dict[str, Any]) -> str:
    """Plain words on what the epsilon covers."""
    mode = privacy.get("mode")
    teacher = privacy.get("teacher_release")
    if teacher is not None:
        answers = ("" if mode == "none" else f" Its {privacy['queries']} noisy answers alone spend epsilon "
                   f"{_number(privacy.get('route_epsilon'))} more, recorded in the teacher's ledger.")
        claim = ("its owner's declaration, NOT verified by dpdistill" if not teacher["verified"]
                 else f"dpdistill's {teacher['release']} run {teacher.get('run')}")
        return (f"{_guarantee(privacy)} with respect to {privacy['unit']}, by post-processing: the teacher is itself "
                f"a DP release ({claim}), and nothing else private was read.{answers} Covered: {privacy['covered']}.")
    if mode == "none":
        return "**No privacy guarantee.** The student learned from the teacher's unprotected answers."
    unit, notion = (("one private training example", "DP") if mode == "data"
                    else ("the label of one private training example", "label-DP"))
    covered = privacy["covered"]
    return (f"{_guarantee(privacy, notion)} with respect to {unit}: "
            f"{privacy['queries']} teacher answers, each protected by the mechanism, composed with "
            f"{privacy['accountant']}. Covered: {covered}. The teacher itself is not private and must not be "
            f"released.")


def is_covered(privacy: dict[str, Any]) -> bool:
    """Whether a report's epsilon covers its release: there was noise, and nothing voided the guarantee
    (reproducible noise, a simulated split, a generator or a student update that read private data unprotected)."""
    return ((privacy.get("mode") != "none" or "teacher_release" in privacy)
            and privacy.get("formal_guarantee") is not False and not privacy.get("covered", "").startswith("NO"))


def _guarantee(privacy: dict[str, Any], notion: str = "DP") -> str:
    """The headline: (epsilon, delta)-DP, or, where something voids it (reproducible noise, a simulated split, a
    generator that read the teacher), that there is no formal guarantee and what the accounting alone says."""
    figure = f"({_number(privacy['epsilon'])}, {privacy['delta']:g})-{notion}"
    if not is_covered(privacy):
        return f"**NO formal guarantee** (the mechanism's accounting alone: {figure})"
    return f"**{figure}**"


ENGINE_KEYS = ("discriminator", "latents", "generator_width", "generator_lr", "generator_student_weight",
               "one_hot_weight", "entropy_weight", "activation_weight", "batchnorm_weight", "smoothness_weight",
               "adversarial_weight", "student_steps", "replay_size", "augment_shift", "augment_flip",
               "student_schedule", "class_balanced", "distill_loss", "gradient_operation", "top_k", "candidates",
               "candidate_threshold")


def _engine_lines(config: dict[str, Any]) -> list[str]:
    """Which options of the data-free loop were on: the generator's teacher, its loss terms, the student's diet."""
    lines = ["| option | value |", "| --- | --- |"]
    lines += [f"| {key} | {config[key]} |" for key in ENGINE_KEYS if key in config]
    return lines


def _phase_breakdown(phases: dict[str, float]) -> str:
    total = sum(phases.values()) or 1.0
    return ", ".join(f"{phase} {seconds:.1f} s ({seconds / total:.0%})" for phase, seconds in phases.items())


def _paper_epsilon_row(privacy: dict[str, Any]) -> list[str]:
    """A seed's own figure for the run, where it states one, labelled as the formula it is."""
    if "paper_epsilon" not in privacy:
        return []
    return [f"| paper_epsilon ({privacy['paper_epsilon_label']}) | {_number(privacy['paper_epsilon'])} |"]


def _sample_source_rows(privacy: dict[str, Any]) -> list[str]:
    """Where a sample source supplied the samples: its release and the route's, which compose to `epsilon`."""
    source = privacy.get("sample_source")
    if source is None:
        return []
    return [f"| sample source ({source['method']}, {source['path']}): epsilon at its delta {_number(source['delta'])} "
            f"| {_number(source['epsilon'])} |",
            f"| epsilon of the answers alone (composed with the source's: the epsilon above) | "
            f"{_number(privacy['route_epsilon'])} |"]


def _samples_and_curve(report: dict[str, Any]) -> list[str]:
    """A transcription's samples (the generator's grid, or where a sample source's came from) and its training
    curve (transcription and FedDPSD reports)."""
    samples = (["## Samples", "", f"The samples were {report['samples']}."] if "samples" in report else
               ["## Synthetic samples from the private generator", "", "![synthetic samples](samples.png)", "",
                "Titles are the student's predicted classes."])
    return [*samples, "", "## Training", "", "![training curve](training.png)"]


def privacy_mode_words(report: dict[str, Any]) -> str:
    """A transcription's privacy mode in words: of a DP teacher, what makes it private is the teacher."""
    mode = f"{report['privacy_mode']} privacy"
    return f"a DP teacher, {mode}" if "teacher_release" in report["privacy"] else mode


def release_markdown(report: dict[str, Any]) -> str:
    """The report of `dpdistill release`: the DP teacher it trained, then its transcription."""
    teacher = report["teacher"]
    return transcription_markdown(report, f"# dpdistill release on {report['dataset']}: a DP teacher, transcribed", [
        f"| DP teacher ({teacher['arch']}, {teacher['path']}): accuracy (real test set) | "
        f"{_percent(teacher['accuracy'])} |",
        f"| DP teacher: wall time | {teacher['wall_seconds']:.1f} s |",
        f"| release: wall time (teacher and transcription) | {report['timing']['release_seconds']:.1f} s |"])


def _synthetic_rows(report: dict[str, Any]) -> list[str]:
    """A synthetic set's rows: its size and labels, what a classifier trained on it alone reaches, its fidelity."""
    synthetic = report.get("synthetic")
    if synthetic is None:
        return []
    rows = [f"| synthetic set ({synthetic['file']}) | {synthetic['images']} images, labelled by "
            f"{synthetic['labelled_by']} |"]
    if "classifier" in synthetic:
        fidelity = synthetic["fidelity"]
        rows += [f"| a {synthetic['classifier']} classifier trained on the synthetic set alone "
                 f"({synthetic['classifier_epochs']} epochs, final model): accuracy on {synthetic['measured_on']} | "
                 f"{_percent(report['accuracy']['synthetic'])} |",
                 f"| synthetic set to the real test split: scattering Fréchet distance (lower is closer; two halves "
                 f"of the test split: {fidelity['real_halves']:.3g}) | {fidelity['synthetic_to_real']:.4g} |"]
    return rows


def transcription_markdown(report: dict[str, Any], title: str | None = None,
                           leading_rows: Sequence[str] = ()) -> str:
    """The human-readable report of a transcription run (`title` and `leading_rows`: another route's around it)."""
    privacy = report["privacy"]
    accuracy = report["accuracy"]
    teacher = ([f"| teacher accuracy (real test set; public: the teacher is a DP release) | "
                f"{_percent(accuracy['teacher'])} |"] if "teacher" in accuracy else [])
    lines = [
        title or f"# dpdistill report: {report['method'].upper()} ({privacy_mode_words(report)}) on "
                 f"{report['dataset']}",
        "",
        privacy_statement(privacy),
        "",
        "| quantity | value |",
        "| --- | --- |",
        f"| student accuracy (real test set) | {_percent(accuracy['student'])} |",
        *_synthetic_rows(report),
        *teacher,
        *leading_rows,
        f"| epsilon (sound, {privacy.get('accountant') or privacy.get('epsilon_scope', 'n/a')}) | "
        f"{_number(privacy.get('epsilon'))} |",
        *([f"| epsilon, replace one example | {_number(privacy['epsilon_replace_one'])} |"]
          if privacy.get("relation") == "add-remove" else []),
        f"| epsilon (RDP cross-check) | {_number(privacy.get('epsilon_rdp'))} |",
        f"| delta | {_number(privacy.get('delta'))} |",
        f"| budget (as requested, {privacy.get('accounting', 'sound')} accounting) | "
        f"{_number(privacy.get('budget_epsilon'))} |",
        f"| paper_epsilon ({privacy.get('paper_epsilon_label', 'n/a')}) | {_number(privacy.get('paper_epsilon'))} |",
        f"| teacher queries | {privacy.get('queries')} |",
        *_sample_source_rows(privacy),
    ]
    for key in ("teachers", "aggregation", "sigma", "beta", "noise_std", "epsilon0", "num_candidates"):
        if key in privacy:
            lines.append(f"| {key} | {_number(privacy[key])} |")
    timing = report["timing"]
    lines += [
        f"| wall time | {timing['wall_seconds']:.1f} s |",
        f"| samples per second | {_number(timing.get('samples_per_second'))} |",
        "",
        *_samples_and_curve(report),
        "",
        "Time per phase: " + _phase_breakdown(timing.get("phases", {})),
        "",
        "## Data-free engine",
        "",
        *_engine_lines(report["config"]),
        "",
        "## Configuration",
        "",
        "```json",
        json.dumps(as_written(report["config"]), indent=2),
        "```",
        "",
        f"Seed {report['seed']}. Every figure above is also in `report.json`.",
    ]
    if report.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"


PRIVATE_TRAINING_ROWS = (  # (privacy key, row label) of the private-training report, in this order when present
    ("relation", "neighbouring relation"), ("epsilon_add_remove", "epsilon, add/remove one example"),
    ("epsilon_replace_one", "epsilon, replace one example"),
    ("epsilon_rdp", "epsilon (dp-accounting RDP, add/remove, cross-check)"),
    ("epsilon_opacus", "epsilon (Opacus RDP accountant, add/remove)"), ("delta", "delta"), ("budget_epsilon", "budget"),
    ("noise_multiplier", "noise multiplier (std / sensitivity)"),
    ("sigma", "sigma (noise std / beta)"), ("beta", "beta (norm of each output gradient)"),
    ("max_grad_norm", "max grad norm (clipping)"), ("noise_std", "noise std"), ("target_step", "target step gamma"),
    ("sample_rate", "sampling rate (Poisson)"),
    ("steps", "steps"), ("planned_steps", "planned steps"),
)


def private_training_markdown(report: dict[str, Any]) -> str:
    """The human-readable report of a private-training baseline: what the epsilon covers first, then the figures."""
    privacy = report["privacy"]
    if privacy["formal_guarantee"]:
        statement = (f"**({_number(privacy['epsilon'])}, {privacy['delta']:g})-DP** with respect to "
                     f"{privacy['unit']} ({privacy['accountant']}). Covered: {privacy['covered']}.")
    else:
        statement = (f"**{privacy['covered']}.** Their epsilon: {_number(privacy['epsilon'])} at delta "
                     f"{privacy['delta']:g}, with respect to {privacy['unit']} ({privacy['accountant']}).")
    config = report["config"]
    start = ("" if not config["student_init"] else
             f"The student starts from the encoder {config['student_init']}; "
             + ("only its last layer learns, on the encoder's frozen features. " if config["train_layers"] == "head"
                else "its BatchNorm layers keep the encoder's statistics. "))
    lines = [f"# dpdistill report: private training ({report['method']}) on {report['dataset']}", "", statement, "",
             f"{start}Accuracy is measured on {report['measured_on']}.", "",
             "| quantity | value |", "| --- | --- |",
             f"| student accuracy | {_percent(report['accuracy']['student'])} |",
             f"| epsilon ({privacy['accountant']}) | {_number(privacy['epsilon'])} |"]
    lines += [f"| {label} | {_number(privacy[key])} |" for key, label in PRIVATE_TRAINING_ROWS if key in privacy]
    timing = report["timing"]
    lines += [f"| wall time (training, this session) | {timing['wall_seconds']:.1f} s |",
              f"| planning (noise calibration) | {timing['planning_seconds']:.1f} s |",
              "", "## Epochs", "", "| epoch | test accuracy | steps |", "| --- | --- | --- |"]
    lines += [f"| {r['epoch']} | {_percent(r['test_accuracy'])} | {r['steps']} |" for r in report["history"]]
    lines += ["", "## Settings", "", "```json", json.dumps(as_written(config), indent=2), "```", "",
              f"Seed {report['seed']} (initialisation only). Noise and sampling: {privacy['noise']}. "
              f"Every figure above is also in `report.json`; figures computed from the private data without "
              f"noise are in `private/record.json` (never publish it)."]
    if report.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"


def datalens_markdown(report: dict[str, Any]) -> str:
    """The human-readable report of a private generator (`dpdistill synthesize`)."""
    privacy, timing = report["privacy"], report["timing"]
    statement = (f"{_guarantee(privacy)} with respect to {privacy['unit']}: {privacy['queries']} generated samples, "
                 f"each answered by {privacy['teachers']} teacher discriminators through TopAgg, composed with "
                 f"{privacy['accountant']}. Covered: {privacy['covered']}. The teachers never leave `private/`.")
    rows = [f"| epsilon (sound) | {_number(privacy['epsilon'])} |",
            f"| epsilon (RDP, the official code's bound 2 k lambda / sigma^2 a query) | {_number(privacy['epsilon_rdp'])} |",
            f"| delta | {privacy['delta']:g} |",
            f"| teachers N, top-k, vote threshold | {privacy['teachers']}, {privacy['top_k']}, "
            f"{_number(privacy['threshold_votes'])} |",
            f"| sigma (noise std on each summed vote), noise multiplier | {_number(privacy['sigma'])}, "
            f"{_number(privacy['noise_multiplier'])} |",
            f"| generator steps, samples asked | {privacy['steps']}, {privacy['queries']} |",
            f"| wall time: generator, student | {timing['generator_seconds']:.1f} s, {timing['student_seconds']:.1f} s |",
            f"| generator steps per second | {_number(timing['steps_per_second'])} |"]
    training = ["## Generator training", "", "Share of the pixels the released direction moved (the teachers' losses "
                "are private: `private/record.json`).", "", "| step | share of coordinates kept |", "| --- | --- |"]
    training += [f"| {r['step']} | {_number(r['kept_share'])} |" for r in report["history"]]
    return _synthetic_markdown(report, statement, rows, training,
                               "initialisation, latents, classes, quantisation coins")


def mean_embedding_markdown(report: dict[str, Any]) -> str:
    """The human-readable report of a mean-embedding synthesiser (`dpdistill synthesize --method dp-merf`)."""
    privacy, timing = report["privacy"], report["timing"]
    statement = (f"{_guarantee(privacy)} with respect to {privacy['unit']}: one release of the class-wise sums of "
                 f"the embedding ({', '.join(privacy['embedding'])}), L2 sensitivity {_number(privacy['sensitivity'])}, "
                 f"{privacy['accountant']}. Covered: {privacy['covered']}.")
    rows = [f"| epsilon (sound, replace-one) | {_number(privacy['epsilon'])} |",
            f"| epsilon (add/remove) | {_number(privacy['epsilon_add_remove'])} |",
            f"| epsilon (RDP cross-check) | {_number(privacy['epsilon_rdp'])} |",
            f"| delta | {privacy['delta']:g} |",
            f"| sigma (noise std on each summed coordinate), noise multiplier | {_number(privacy['sigma'])}, "
            f"{_number(privacy['noise_multiplier'])} |",
            f"| wall time: release, fit, student | {timing['release_seconds']:.1f} s, {timing['fit_seconds']:.1f} s, "
            f"{timing['student_seconds']:.1f} s |"]
    training = ["## Fit", "", "Squared distance of the synthetic means to the released means, summed over the classes "
                "(post-processing of the release).", "", "| step | distance |", "| --- | --- |"]
    training += [f"| {r['step']} | {_number(r['distance'])} |" for r in report["history"]]
    return _synthetic_markdown(report, statement, rows, training, "random features, initial images, batches")


def _synthetic_markdown(report: dict[str, Any], statement: str, rows: list[str], training: list[str],
                        seeded: str) -> str:
    """A synthesiser's report: its guarantee, the classifier trained on the synthetic set, the method's own
    figures (`rows`, `training`), the samples and the configuration."""
    synthetic = report["synthetic"]
    lines = [f"# dpdistill report: {report['method']} on {report['dataset']}", "", statement, "",
             "| quantity | value |", "| --- | --- |",
             f"| {report['student_arch']} trained on the synthetic set only, final model ({report['measured_on']}) | "
             f"{_percent(report['accuracy']['student'])} |", *rows,
             f"| synthetic images ({synthetic['file']}) | {synthetic['images']} |",
             "", "## Synthetic samples (ten per class, titled with their class)", "", "![synthetic samples](samples.png)",
             "", *training]
    scored = [record for record in report["student_history"] if "test_accuracy" in record]
    if len(scored) > 1:  # a curve, where the classifier was scored after each epoch
        lines += ["", "## Classifier on the synthetic set", "", "| epoch | real test accuracy |", "| --- | --- |"]
        lines += [f"| {r['epoch']} | {_percent(r['test_accuracy'])} |" for r in scored]
    lines += ["", "## Configuration", "", "```json", json.dumps(as_written(report["config"]), indent=2), "```", "",
              f"Seed {report['seed']} ({seeded}). Noise: {report['privacy']['noise']}. Every figure above is also in "
              f"`report.json`."]
    return "\n".join(lines) + "\n"


def job_markdown(report: dict[str, Any], title: str) -> str:
    """The report of a job that releases nothing (a teacher, an ensemble, an encoder, an imported model): what it is,
    on which data, how accurate, and that it is private or public, not a release."""
    dataset = report.get("dataset")
    rows = [("data set", dataset["name"] if isinstance(dataset, dict) else dataset), ("architecture", report.get("arch")),
            ("public images", report.get("public"))]
    rows += [(name.replace("_", " "), _percent(value)) for name, value in report.get("accuracy", {}).items()]
    if "ensemble" in report:
        rows += [("members", report["ensemble"]["members"]), ("layout", report["ensemble"]["layout"])]
    if "timing" in report:
        rows.append(("wall time", f"{report['timing']['wall_seconds']:.1f} s"))
    lines = [f"# {title}", "", "| quantity | value |", "| --- | --- |"]
    lines += [f"| {name} | {value} |" for name, value in rows if value is not None]
    lines += ["", f"**Privacy:** {report['privacy']['guarantee']}", ""]
    lines += [f"**Warning:** {warning}" for warning in report.get("warnings", [])]
    return "\n".join(lines).rstrip() + "\n"


def write_report(out_dir: Path, report: dict[str, Any], markdown: str) -> None:
    """report.json and report.md in `out_dir`, each written atomically."""
    write_json(out_dir / "report.json", report)
    write_atomically({out_dir / "report.md": lambda temporary: temporary.write_text(markdown)})


PATE_ROWS = (("epsilon_rdp", "epsilon (RDP cross-check)"), ("delta", "delta"), ("budget_epsilon", "budget"),
             ("teachers", "teachers (ensemble)"), ("queries", "answers released"),
             ("kept_answers", "answers kept (noisy lead >= vote margin)"), ("sigma", "sigma (per vote count: the Gaussian's std, the Laplace's scale)"),
             ("noise_std", "noise std per vote count"),
             ("noise_multiplier", "noise multiplier (Gaussian: std / sqrt 2; Laplace: 1 / eps0)"), ("vote_margin", "vote margin (sigmas)"),
             ("answer_targets", "student's targets (argmax: noisy winner; posterior: soft)"))


FEDERATED_ROWS = (("owners", "data owners"), ("threshold", "owners needed in every round (owners - dropouts)"),
                  ("colluders", "colluding owners tolerated (each knows its own share)"),
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
             f"{_guarantee(privacy)} with respect to {privacy['unit']} "
             f"({privacy['accountant']}; {privacy['aggregation']}). Covered: {privacy['covered']}. No party saw an "
             f"owner's data or its answers; the owners' teachers are not private and stay with their owners.", ""]
    lines += [f"Public images: {report['public']}.", ""] if pate else []
    lines += ["| quantity | value |", "| --- | --- |",
              f"| student accuracy (real test images{', none of them public' if pate else ''}) | "
              f"{_percent(accuracy['student'])} |"]
    lines += [f"| answers naming the true class | {_percent(accuracy['answers'])} |"] if pate else []
    lines += [f"| epsilon (sound, RDP) | {_number(privacy['epsilon'])} |"]
    lines += [f"| {label} | {_number(privacy[key])} |" for key, label in FEDERATED_ROWS if key in privacy]
    lines += _paper_epsilon_row(privacy)
    lines += [f"| engine | {federation['engine']} |",
              f"| secure-aggregation rounds | {federation['rounds']} |",
              f"| owners that contributed, per round | {_contributors(federation['contributors'])} |",
              f"| rounds lost during secure aggregation (spent, unanswered) | "
              f"{', '.join(map(str, federation['lost_rounds'])) or 'none'} |",
              f"| federation wall time | {federation['wall_seconds']:.1f} s |",
              f"| wall time{' (resumed run: this part)' if report.get('resumed') else ''} | "
              f"{report['timing']['wall_seconds']:.1f} s |", ""]
    if pate:
        return "\n".join(lines + ["## Student rounds", ""] + _student_rounds(report, "sums")) + "\n"
    engine_config = json.dumps(as_written(report["engine_config"]), indent=2)
    lines += [*_samples_and_curve(report), "", "## Configuration of the server's engine", "", "```json",
              engine_config, "```"]
    return "\n".join(lines) + "\n"


def _contributors(counts: list[int]) -> str:
    """Per-round contributor counts, run-length encoded (a FedDPSD run has hundreds of rounds)."""
    runs: list[list[int]] = []
    for count in counts:
        if runs and runs[-1][0] == count:
            runs[-1][1] += 1
        else:
            runs.append([count, 1])
    return ", ".join(f"{count} x {repeat}" if repeat > 1 else str(count) for count, repeat in runs)


STUDENT_TRAINING_NOTES = {
    "consistency": " Each round is consistency training (FixMatch): the student also learns from every public image, "
                   "unlabelled, to give a hard view the class it gives an easy one.",
    "tangent-normal": " Each round is tangent-normal training (DGD, seed 004): a VAE fitted to the public images "
                      "reconstructs each one, a step along its manifold and a step across it, and the student's "
                      "features should not move within each triple."}


def pate_markdown(report: dict[str, Any]) -> str:
    """The human-readable report of a PATE run: the guarantee, the public images, the rounds."""
    privacy = report["privacy"]
    lines = [f"# dpdistill report: PATE on public images, {report['dataset']}", "",
             f"{_guarantee(privacy)} with respect to {privacy['unit']} "
             f"({privacy['accountant']}; {privacy['aggregation']}). Covered: {privacy['covered']}. The teachers "
             f"are not private and must not be released.", "",
             f"Public images: {report['public']}.", ""]
    return "\n".join(lines + _answers_and_rounds(report, report["config"])) + "\n"


def dgd_markdown(report: dict[str, Any]) -> str:
    """The human-readable report of a DGD run: the guarantee (none where the generator read the baseline), the
    generative stream, the answers, the student."""
    privacy, generative, config = report["privacy"], report["generative"], report["config"]
    lines = [f"# dpdistill report: DGD (discriminative-generative distillation), {report['dataset']}", "",
             f"{_guarantee(privacy)} with respect to {privacy['unit']} "
             f"({privacy['accountant']}; {privacy['aggregation']}). Covered: {privacy['covered']}. The teachers "
             f"are not private and must not be released.", ""]
    if generative:
        training = generative.get("training")
        lines += ["## Generative stream", "",
                  f"A generator trained data-free against the baseline {generative['baseline']} (read without noise) "
                  f"made the {generative['images']:,} images the student learns from"
                  + (f"; its last loss terms {', '.join(f'{k} {v:.4g}' for k, v in training['terms'].items())} "
                     f"({training['wall_seconds']:.0f} s)." if training else " (resumed run: the saved generator)."),
                  "", "![synthetic images](samples.png)", ""]
    else:
        lines += ["![the images the student learns from](samples.png)", ""] if "sample_source" in privacy else []
    lines += [f"Images: {report['public']}.", ""]
    return "\n".join(lines + _answers_and_rounds(report, config["labelling"])) + "\n"


def _answers_and_rounds(report: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """PATE's and DGD's figures: the student, the answers, the budget, the student's rounds (`settings`: PATE's)."""
    privacy, accuracy = report["privacy"], report["accuracy"]
    lines = ["| quantity | value |", "| --- | --- |",
             f"| student accuracy (real test images, none of them public) | {_percent(accuracy['student'])} |",
             f"| kept answers naming the true class | {_percent(accuracy['answers'])} |",
             f"| epsilon (sound, {privacy['accountant']}) | {_number(privacy['epsilon'])} |"]
    lines += [f"| {label} | {_number(privacy[key])} |" for key, label in PATE_ROWS if key in privacy]
    lines += _sample_source_rows(privacy) + _paper_epsilon_row(privacy)
    timing = report["timing"]
    lines += [f"| wall time{' (resumed run: this part)' if report.get('resumed') else ''} | "
              f"{timing['wall_seconds']:.1f} s |",
              f"| of which voting and noise | {timing['release_seconds']:.1f} s |",
              "", "## Student rounds", "",
              "Round 1 learns from the kept answers; each self-training round adds the public images the previous "
              "student labels confidently (post-processing: no further answers)."
              + STUDENT_TRAINING_NOTES.get(settings.get("student_training"), ""), ""]
    return lines + _student_rounds(report, "answers")


def _student_rounds(report: dict[str, Any], released: str) -> list[str]:
    """A PATE student's rounds, the settings and where the released `released` are (PATE, federated PATE)."""
    lines = ["| round | examples | test accuracy | wall s |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['round']} | {r['examples']} | {_percent(r['test_accuracy'])} | {r['wall_seconds']:.1f} |"
              for r in report["history"]]
    return lines + ["", "## Settings", "", "```json", json.dumps(as_written(report["config"]), indent=2), "```", "",
                    f"Seed {report['seed']}; the released {released} are in `answers.safetensors`. Every figure "
                    f"above is also in `report.json`."]


