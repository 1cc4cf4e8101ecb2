"""Whether DGD's synthetic images carry what transfers, without any noise: a generator trained against the baseline
(DGD's settings, or others given as generator fields), 20,000 of its images, how the baseline and the ensemble label
them (class balance, confidence, agreement, per-class pixel spread against real images), and a cnn student trained
supervised on them from the ensemble's exact plurality, its vote shares, or the baseline's labels.

    .venv/bin/python benchmarks/experiments/dgd_images.py BASELINE ENSEMBLE [--set FIELD=VALUE ...]
        [--targets ensemble,ensemble-soft,baseline] [--arch cnn]

BASELINE: a `train-teacher` output (teacher-fmnist), ENSEMBLE: the 250 scattering heads
(teachers-250-heads-scatter-fmnist); FIELD: a DataFreeConfig field (steps=1000, final_batchnorm=false,
batchnorm_weight=1). One core; on a shared 2-core machine about 10 minutes a student.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from dpdistill.data import load_dataset
from dpdistill.data.base import ImageDataset
from dpdistill.methods.pate import vote_counts
from dpdistill.methods.teachers import read_teacher
from dpdistill.settings import parse_assignments
from dpdistill.training.data_free import DataFreeConfig, generate, train_data_free_generator
from dpdistill.training.teacher import TeacherConfig, train_classifier

IMAGES = 20000
STUDENT_STEPS = 1500


def per_class_spread(images: torch.Tensor, labels: torch.Tensor, classes: int) -> list[float | None]:
    """Each class's pixel standard deviation, averaged over pixels: how varied its images are."""
    return [images[labels == c].std(0).mean().item() if (labels == c).sum() > 1 else None for c in range(classes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("baseline", type=Path)
    parser.add_argument("ensemble", type=Path)
    parser.add_argument("--set", dest="settings", action="append", default=[])
    parser.add_argument("--targets", default="ensemble,baseline")
    parser.add_argument("--arch", default="cnn")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = load_dataset("fmnist")
    baseline, _ = read_teacher(args.baseline)
    ensemble, _ = read_teacher(args.ensemble)
    config = DataFreeConfig(**parse_assignments(args.settings, DataFreeConfig))
    generator, training = train_data_free_generator(baseline, data.input_shape, config, 0, "cpu")
    images = generate(generator, IMAGES, 0, "cpu")
    with torch.inference_mode():
        baseline_logits = torch.cat([baseline.eval()(batch) for batch in images.split(1000)])
    votes = vote_counts(ensemble.eval(), images, data.num_classes, torch.device("cpu"))
    baseline_labels, plurality = baseline_logits.argmax(1), votes.argmax(1)
    found = {"generator": dict(vars(config), width=list(config.width)), "terms": training["terms"],
             "pixel_mean": images.mean().item(), "real_pixel_mean": data.x_train.mean().item(),
             "baseline_classes": torch.bincount(baseline_labels, minlength=data.num_classes).tolist(),
             "ensemble_classes": torch.bincount(plurality, minlength=data.num_classes).tolist(),
             "baseline_confidence": F.softmax(baseline_logits, 1).max(1).values.mean().item(),
             "ensemble_top_vote_share": (votes.max(1).values / votes.sum(1)).float().mean().item(),
             "agreement": (baseline_labels == plurality).float().mean().item(),
             "spread": per_class_spread(images, baseline_labels, data.num_classes),
             "real_spread": per_class_spread(data.x_train, data.y_train, data.num_classes)}
    print(json.dumps(found), flush=True)
    targets = {"ensemble": (plurality, None), "ensemble-soft": (plurality, votes.float() / votes.sum(1, keepdim=True)),
               "baseline": (baseline_labels, None)}
    for name in args.targets.split(","):
        labels, soft = targets[name]
        student_data = ImageDataset("dgd-images", images, labels, data.x_test, data.y_test, data.num_classes,
                                    "DGD's synthetic images")
        _, report = train_classifier(student_data, TeacherConfig(arch=args.arch, epochs=1, min_steps=STUDENT_STEPS),
                                     evaluate_each_epoch=False, targets=soft)
        print(json.dumps({"targets": name, "arch": args.arch, "test_accuracy": report["test_accuracy"]}), flush=True)


if __name__ == "__main__":
    main()
