"""The model-inversion figure of BENCHMARKS.md: each class reconstructed from the released student of audit rows.

    .venv/bin/python benchmarks/inversion.py [RUNS_DIR]

For each audit row named in ROWS whose run is in RUNS_DIR (default runs/bench), the student its route released
(`route/`) is inverted as `dpdistill audit` does (audit/inversion.py: deterministic from the grey image, so the
images are the ones of its `inversion.png`), one row of the figure per route, written to
`benchmarks/inversion.png`; the class matches printed beside them come from the audits' reports. Seconds on 2
cores.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dpdistill.audit.inversion import invert_classes  # noqa: E402
from dpdistill.data import load_dataset  # noqa: E402
from dpdistill.models.ensemble import load_saved  # noqa: E402

ROWS = (("audit-nonprivate-cnn-fmnist", "non-private cnn (no guarantee)"),
        ("audit-dpsd-t-engine-eps10-fmnist", "DPSD-T, eps 10 (NO formal guarantee)"),
        ("audit-dgd-paper-eps10-fmnist", "faithful DGD, eps 10 (NO formal guarantee)"),
        ("audit-pate-250-heads-scatter-linear-eps1-fmnist", "PATE, eps 1 (covered)"),
        ("audit-dpsgd-scatter-linear-eps1-fmnist", "DP-SGD, eps 1 (covered)"))
FIGURE = Path(__file__).with_name("inversion.png")


def main(runs: Path) -> None:
    found = [(runs / name / "seed0", label) for name, label in ROWS if (runs / name / "seed0" / "report.json").exists()]
    if not found:
        raise SystemExit(f"no audit run of {', '.join(name for name, _ in ROWS)} under {runs}")
    dataset = load_dataset("fmnist")
    figure, axes = plt.subplots(len(found), dataset.num_classes, figsize=(dataset.num_classes * 0.9,
                                                                          len(found) * 1.05), squeeze=False)
    for row, (run, label) in enumerate(found):
        model = load_saved(run / "route")[0]
        images = invert_classes(model, tuple(dataset.input_shape), dataset.num_classes)
        match = json.loads((run / "report.json").read_text())["inversion"]["class_match"]
        for column, axis in enumerate(axes[row]):
            axis.imshow((images[column, 0].numpy() + 1) / 2, cmap="gray", vmin=0, vmax=1)
            axis.set_xticks([])
            axis.set_yticks([])
        axes[row, 0].set_title(f"{label}: classes matched {100 * match:.0f}%", fontsize=7, loc="left")
        print(f"{run.parent.name}: class match {100 * match:.0f}%")
    figure.tight_layout(pad=0.2)
    figure.savefig(FIGURE, dpi=110)
    print(f"-> {FIGURE}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/bench"))
