"""Print a Markdown table from transcription report.json files (the figures of BENCHMARKS.md)."""

import json
import sys
from pathlib import Path


def main(paths: list[str]) -> None:
    print("| run | mode | accounting | student acc. | teacher acc. | sound eps (delta) | RDP eps | paper_epsilon "
          "| queries | sigma / eps0 | wall s | samples/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for path in paths:
        report = json.loads(Path(path).read_text())
        if "privacy_mode" not in report:  # a teacher's report
            continue
        p, a, t = report["privacy"], report["accuracy"], report["timing"]
        noise = f"sigma {p['sigma']:.4g}" if "sigma" in p else f"eps0 {p.get('epsilon0', 0):.4g}"
        print(f"| {Path(path).parent.name} | {report['privacy_mode']} | {p.get('accounting')} "
              f"| {100 * a['student']:.2f}% | {100 * a['teacher']:.2f}% | {float(p['epsilon']):.4g} ({p['delta']:g}) "
              f"| {float(p['epsilon_rdp']):.4g} | {float(p['paper_epsilon']):.4g} | {p['queries']} | {noise} "
              f"| {t['wall_seconds']:.0f} | {t['samples_per_second']:.0f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
