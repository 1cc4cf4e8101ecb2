"""DP-DFD with selective randomized response (seed 001, "Privacy-Preserving Student Learning with Differentially
Private Data-Free Distillation").

1. Pretrain the generator with the teacher as fixed discriminator: CE + 5 entropy + 10 BatchNorm statistics.
   The teacher is read without noise: nothing trained on these samples has a formal guarantee.
2. For each stage: generate a synthetic batch and ask the teacher once per sample.
3. Release by selective randomized response: the candidates are the classes the current student gives more than
   1 / (2 classes) (at least two); if the teacher's class is among them, randomized response over them, else a
   uniform draw from them (label mode).
4. Learn: the student fits the answers (cross-entropy to a one-hot answer is its KL up to a constant) and replays
   earlier ones (post-processing); the generator is fine-tuned with the student as discriminator.
The loop is the shared engine (methods/engine.py) with these settings.
"""

from __future__ import annotations

from typing import Any, ClassVar

from dpdistill.methods.base import Needs
from dpdistill.methods.transcription import TranscriptionMethod


class SRR(TranscriptionMethod):
    name = "srr"
    needs = Needs.SINGLE_TEACHER
    summary = ("data-free transcription with a generator pretrained on the teacher and selective randomized "
               "response (label mode; no formal guarantee)")
    paper = "Privacy-Preserving Student Learning with Differentially Private Data-Free Distillation (seed 001)"
    protects = "label"
    defaults: ClassVar[dict[str, Any]] = {
        "candidates": "threshold", "generator_pretrain_steps": 1000, "latents": "fresh", "entropy_weight": 5.0,
        "batchnorm_weight": 10.0, "activation_weight": 0.0, "generator_width": (64, 32, 16), "generator_lr": 1e-3,
        "generator_beta1": 0.5, "replay_size": 20000, "student_steps": 8, "student_schedule": "cosine"}
    # seed 001 (section III-A): "Resnet18 in label-sensitive experiments" (its DataLens student is the
    # data-sensitive tables'); its loss weights and threshold are the defaults above
    paper_settings: ClassVar[dict[str, Any]] = {"student_arch": "resnet18"}
