"""Typed configuration of a transcription run, with the seed papers' settings as presets.

A run's configuration is one `TranscriptionConfig`: it is written whole into every report, so a run can be
repeated from its report alone. Presets are plain override dictionaries applied before the user's options.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dpdistill.errors import ConfigError
from dpdistill.privacy.budget import PrivacyRequest


@dataclass
class TranscriptionConfig:
    """Every knob of a DPSD-family run (defaults: DPSD's settings where the seed gives them)."""

    method: str = "dpsd"
    privacy: PrivacyRequest = field(default_factory=lambda: PrivacyRequest(mode="data", epsilon=10.0))
    iterations: int = 200  # T
    batch_size: int = 256  # b: synthetic samples, hence teacher queries, per iteration
    top_k: int | None = 3  # k: top-k gradient entries (data mode) and candidate-set size (label mode)
    gradient_operation: str = "normalize"  # or "clip" (the seeds' ablation)
    target_step: float = 0.1  # gamma_s of DPSD Eq. 3: step of the noisy gradient on the student's logits
    distill_loss: str = "dkd"  # or "kd"
    dkd_alpha: float = 1.0
    dkd_beta: float = 8.0  # DPSD's lambda: weight of the non-target-class term
    temperature: float = 1.0
    student_arch: str = "datalens"
    student_lr: float = 1e-3
    student_steps: int = 1  # student updates per batch of annotations (free; in data mode the soft targets are
    # relative to the first forward pass, so further steps mostly undo the first one: keep 1 there)
    latent_dim: int = 100
    generator_width: tuple[int, int, int] = (128, 128, 64)
    generator_lr: float = 1e-2  # gamma_g
    latents: str = "trainable"  # "trainable": DPSD's learned z (Alg. 1); "fresh": new z every iteration (DAFL)
    generator_student_weight: float = 1.0  # weight of L_s in the generator's loss (DPSD Eq. 8: 1)
    class_balanced: bool = False  # weight each sample by 1 / (batch count of its target class): post-processing
    discriminator: str = "student"  # "teacher" = DPSD-T: better samples, but no formal guarantee (see report)
    one_hot_weight: float = 1.0
    entropy_weight: float = 5.0
    activation_weight: float = 0.1
    eval_every: int = 20
    checkpoint_every: int = 20
    seed: int = 0
    device: str = "cpu"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TranscriptionConfig":
        values = dict(values)
        values["privacy"] = PrivacyRequest(**values["privacy"])
        values["generator_width"] = tuple(values["generator_width"])
        return cls(**values)

    def validate(self, num_classes: int) -> None:
        for name in ("iterations", "batch_size", "student_steps", "latent_dim", "eval_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.top_k is not None and not 1 <= self.top_k <= num_classes:
            raise ConfigError(f"top-k must be between 1 and the number of classes ({num_classes}), got {self.top_k}")
        if self.distill_loss not in ("dkd", "kd"):
            raise ConfigError(f"unknown distillation loss {self.distill_loss!r}: choose dkd or kd")
        if self.discriminator not in ("student", "teacher"):
            raise ConfigError(f"unknown discriminator {self.discriminator!r}: choose student or teacher")
        if self.latents not in ("trainable", "fresh"):
            raise ConfigError(f"unknown latent mode {self.latents!r}: choose trainable or fresh")
        if self.gradient_operation not in ("normalize", "clip"):
            raise ConfigError(f"unknown gradient operation {self.gradient_operation!r}: choose normalize or clip")
        self.privacy.validate(num_classes)


def paper_preset(privacy_mode: str, epsilon: float | None, accounting: str) -> dict[str, Any]:
    """DPSD's published settings (seed 000): sigma 100, beta 1e-3 (eps <= 1) or 5e-3, b 256, T 200, k 3.

    Under sound accounting the noise is calibrated to the budget instead of fixed at sigma = 100, because
    sigma = 100 at these settings spends a sound epsilon of about 29.
    """
    beta = 1e-3 if epsilon is not None and epsilon <= 1 else 5e-3
    privacy: dict[str, Any] = {"beta": beta, "delta": 1e-5, "num_candidates": 3}
    if accounting == "paper" and privacy_mode == "data":
        privacy["sigma"] = 100.0
    return {"iterations": 200, "batch_size": 256, "top_k": 3, "target_step": 0.1, "generator_lr": 1e-2,
            "dkd_beta": 8.0, "distill_loss": "dkd", "privacy": privacy}


def demo_preset(privacy_mode: str, epsilon: float | None, accounting: str) -> dict[str, Any]:
    """Small and fast: for the 8x8 digits demo and smoke tests on 2 CPU cores."""
    return {"iterations": 150, "batch_size": 128, "generator_width": (64, 32, 16),
            "eval_every": 25, "checkpoint_every": 50}


PRESETS = {"paper": paper_preset, "demo": demo_preset}


def build_config(preset: str | None, overrides: dict[str, Any], privacy_overrides: dict[str, Any]) -> TranscriptionConfig:
    """Defaults, then the preset, then the user's explicit options (None means 'not given')."""
    mode = privacy_overrides.get("mode", "data")
    epsilon = privacy_overrides.get("epsilon")
    accounting = privacy_overrides.get("accounting") or "sound"
    values: dict[str, Any] = {}
    privacy_values: dict[str, Any] = {"mode": mode, "epsilon": epsilon}
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown preset {preset!r}: choose one of {', '.join(PRESETS)}")
        preset_values = PRESETS[preset](mode, epsilon, accounting)
        privacy_values.update(preset_values.pop("privacy", {}))
        values.update(preset_values)
    values.update({k: v for k, v in overrides.items() if v is not None})
    privacy_values.update({k: v for k, v in privacy_overrides.items() if v is not None})
    if values.get("top_k") is not None:
        privacy_values["num_candidates"] = values["top_k"]
    values["privacy"] = PrivacyRequest(**privacy_values)
    return TranscriptionConfig(**values)
