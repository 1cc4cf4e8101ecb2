"""What the methods' reports share: report.json and report.md, the private record, the figures several methods draw
(image grids, training curves), the words on what an epsilon covers, and the rows and formatting helpers more than
one report section uses. A method's own section (its markdown and any figure only it draws) lives in the reporting
module named for its method or family, which the method calls: `transcription.py`, `pate.py`, `synthesis.py`,
`federated.py`, `private_training.py`, `audit.py`, `jobs.py`."""

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


def write_report(out_dir: Path, report: dict[str, Any], markdown: str) -> None:
    """report.json and report.md in `out_dir`, each written atomically."""
    write_json(out_dir / "report.json", report)
    write_atomically({out_dir / "report.md": lambda temporary: temporary.write_text(markdown)})


def pyplot() -> ModuleType:
    """matplotlib's pyplot, drawing to files only, imported when a figure is drawn: half a second of the start of
    every process that writes a report (an owner answering a round, the CLI) would go to it otherwise."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt


def save_plot(figure: Any, path: Path, left: float = 0.7, bottom: float = 0.5, right: float = 0.15) -> None:
    """Write a report's plot and close it. Its margins are fixed in inches (`left` and `bottom` for tick labels and
    an axis label, `right` for what stands beside the plot, a little room above) instead of matplotlib's tight
    layout, which lays every text out once more to measure it: a third of a figure's cost."""
    width, height = figure.get_size_inches()
    figure.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height,
                           top=1 - 0.15 / height, wspace=0.3)
    figure.savefig(path, dpi=110)
    pyplot().close(figure)


NAME_CHARS = 12  # the most characters of a class name a figure shows (a tile's width, a tick label's)


def shown_name(name: str) -> str:
    """A class name as a figure shows it: cut to NAME_CHARS characters."""
    return name if len(name) <= NAME_CHARS else name[:NAME_CHARS - 1] + "…"


def save_image_grid(images: Tensor, path: Path, columns: int = 16, titles: Sequence[str] | None = None) -> None:
    """A grid of images in [-1, 1] (N, C, H, W), optionally titled (with their class names): one mosaic on one axes
    (an axes per image took two seconds to lay out for 64 images, three to four for 100: a tenth of that now)."""
    pictures = ((images.detach().cpu().float().clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1).numpy()
    count, height, width, channels = pictures.shape
    rows = max(1, math.ceil(count / columns))
    gap, title = max(1, height // 8), (height // 2 if titles is not None else 0)  # pixels beside and above a tile
    cell_height, cell_width = title + height + gap, width + gap
    mosaic = np.ones((rows * cell_height, columns * cell_width, channels), dtype=np.float32)  # white between tiles
    for index, picture in enumerate(pictures):
        top, left = index // columns * cell_height + title, index % columns * cell_width
        mosaic[top:top + height, left:left + width] = picture
    plt = pyplot()
    figure = plt.figure(figsize=(columns * 0.6, columns * 0.6 * mosaic.shape[0] / mosaic.shape[1]))
    axis = figure.add_axes((0, 0, 1, 1))
    axis.axis("off")
    axis.imshow(mosaic[..., 0] if channels == 1 else mosaic, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    for index, text in enumerate(titles[:count] if titles is not None else []):
        axis.text(index % columns * cell_width + (width - 1) / 2, index // columns * cell_height + (title - 1) / 2,
                  shown_name(text), fontsize=6, ha="center", va="center")
    figure.savefig(path, dpi=120)
    plt.close(figure)


def save_accuracy_curve(history: list[dict], x_key: str, path: Path) -> None:
    """Test accuracy over `x_key` (epochs, rounds): the figure of a run that learns in a few evaluated steps."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(5, 3))
    evaluated = [record for record in history if record.get("test_accuracy") is not None]
    axis.plot([record[x_key] for record in evaluated], [100 * record["test_accuracy"] for record in evaluated],
              marker="o")
    axis.set_xlabel(x_key)
    axis.set_ylabel("test accuracy (%)")
    axis.grid(alpha=0.3)
    save_plot(figure, path)


def save_training_curve(history: list[dict], path: Path) -> None:
    """Student test accuracy and losses over iterations."""
    evaluated = [record for record in history if record.get("student_accuracy") is not None]
    plt = pyplot()
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
    save_plot(figure, path)


CONFUSION_FIGURE = "confusion.png"  # the released student's confusion matrix on the evaluation images


def save_confusion_matrix(counts: Tensor, path: Path, class_names: Sequence[str]) -> None:
    """Each true class's images (rows) by predicted class (columns), as shares of the row, with the counts written
    in and the classes named on the axes: where a student confuses two classes, or calls everything one."""
    counts = counts.cpu().double()
    shares = (counts / counts.sum(1, keepdim=True).clamp(min=1)).numpy()
    classes = len(counts)
    plt = pyplot()
    size = max(3.5, 0.45 * classes + 1.5)
    names = [shown_name(name) for name in class_names] if classes <= 20 else []  # beyond, nothing fits a cell
    longest = max(map(len, names), default=0)
    label_inches = 0.06 * longest  # the longest name at the ticks' 7 points
    figure, axis = plt.subplots(figsize=(size + label_inches, (size + label_inches) * 0.85))
    image = axis.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    if names:
        axis.set_xticks(range(classes), names, fontsize=7, rotation=90 if longest > 3 else 0)
        axis.set_yticks(range(classes), names, fontsize=7)
        for row in range(classes):
            for column in range(classes):
                axis.text(column, row, f"{int(counts[row, column])}", ha="center", va="center", fontsize=6,
                          color="white" if shares[row, column] > 0.5 else "black")
    axis.set_xlabel("predicted class")
    axis.set_ylabel("true class")
    figure.colorbar(image, ax=axis, label="share of the true class")
    save_plot(figure, path, left=0.5 + label_inches, bottom=0.4 + label_inches, right=0.45)  # the colour bar's label


def classes_section(class_names: Sequence[str]) -> str:
    """The report.md lines that name the classes by label (report.json's `class_names`)."""
    return f"\n## Classes\n\nBy label: {describe_classes(class_names)}.\n"


def confusion_section() -> str:
    """The report.md lines that show the confusion matrix (its counts are report.json's `confusion`)."""
    return ("\n## Confusion matrix\n\nThe released student's predictions on the images its accuracy is measured on: "
            "each row a true class, each column a predicted class (counts in `report.json`'s `confusion`).\n\n"
            f"![confusion matrix]({CONFUSION_FIGURE})\n")


CLASSES_SHOWN = 12  # the most classes a message or a report lists


def list_classes(names: Sequence[str]) -> str:
    """Class names as a message or a report lists them: the first CLASSES_SHOWN, then how many in all."""
    return ", ".join(names[:CLASSES_SHOWN]) + (f", ... ({len(names)} classes)" if len(names) > CLASSES_SHOWN else "")


def describe_classes(classes: Sequence[str]) -> str:
    """The label order in words, for a data set's source line and a report: `0 coat, 1 dress, ...`."""
    return list_classes([f"{label} {name}" for label, name in enumerate(classes)])


def selection_section(notes: list[str]) -> str:
    """The report.md lines that say which of the run's settings were chosen by looking at data, and on which
    (privacy/selection.py); none where no such setting ran."""
    if not notes:
        return ""
    return "\n## Settings chosen on data\n\n" + "".join(f"- {note}\n" for note in notes)


def percent(value: float | None) -> str:
    """A fraction as a report shows it: a percentage with two decimals, or n/a."""
    return "n/a" if value is None else f"{100 * value:.2f}%"


def number(value: Any) -> str:
    """A figure as a report shows it: four significant digits for a float, inf, or n/a for None."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    return str(value)


def is_covered(privacy: dict[str, Any]) -> bool:
    """Whether a report's epsilon covers its release: there was noise, and nothing voided the guarantee
    (reproducible noise, a simulated split, a generator or a student update that read private data unprotected)."""
    return ((privacy.get("mode") != "none" or "teacher_release" in privacy)
            and privacy.get("formal_guarantee") is not False and not privacy.get("covered", "").startswith("NO"))


def guarantee(privacy: dict[str, Any], notion: str = "DP") -> str:
    """The headline: (epsilon, delta)-DP, or, where something voids it (reproducible noise, a simulated split, a
    generator that read the teacher), that there is no formal guarantee and what the accounting alone says."""
    figure = f"({number(privacy['epsilon'])}, {privacy['delta']:g})-{notion}"
    if not is_covered(privacy):
        return f"**NO formal guarantee** (the mechanism's accounting alone: {figure})"
    return f"**{figure}**"


def paper_epsilon_row(privacy: dict[str, Any]) -> list[str]:
    """A seed's own figure for the run, where it states one, labelled as the formula it is."""
    if "paper_epsilon" not in privacy:
        return []
    return [f"| paper_epsilon ({privacy['paper_epsilon_label']}) | {number(privacy['paper_epsilon'])} |"]


def sample_source_rows(privacy: dict[str, Any]) -> list[str]:
    """Where a sample source supplied the samples: its release and the route's, which compose to `epsilon`."""
    source = privacy.get("sample_source")
    if source is None:
        return []
    return [f"| sample source ({source['method']}, {source['path']}): epsilon at its delta {number(source['delta'])} "
            f"| {number(source['epsilon'])} |",
            f"| epsilon of the answers alone (composed with the source's: the epsilon above) | "
            f"{number(privacy['route_epsilon'])} |"]


def samples_and_curve(report: dict[str, Any]) -> list[str]:
    """A transcription's samples (the generator's grid, or where a sample source's came from) and its training
    curve (transcription and FedDPSD reports)."""
    labels = (f"Titles are the synthetic set's labels: {report['synthetic']['labelled_by']}; up to ten images of "
              f"each class."
              if "synthetic" in report else "Titles are the student's predicted classes.")
    samples = (["## Samples", "", f"The samples were {report['samples']}."] if "samples" in report else
               ["## Synthetic samples from the private generator", "", "![synthetic samples](samples.png)", "",
                labels])
    return [*samples, "", "## Training", "", "![training curve](training.png)"]


def student_rounds(report: dict[str, Any], released: str) -> list[str]:
    """A PATE student's rounds, the settings and where the released `released` are (PATE, federated PATE)."""
    lines = ["| round | examples | test accuracy | wall s |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['round']} | {r['examples']} | {percent(r['test_accuracy'])} | {r['wall_seconds']:.1f} |"
              for r in report["history"]]
    return lines + ["", "## Settings", "", "```json", json.dumps(as_written(report["config"]), indent=2), "```", "",
                    f"Seed {report['seed']}; the released {released} are in `answers.safetensors`. Every figure "
                    f"above is also in `report.json`."]
