"""Typed configuration of a transcription run, with the seed papers' settings as presets.

A run's configuration is one `TranscriptionConfig`: it is written whole into every report, so a run can be
repeated from its report alone. Presets are plain override dictionaries applied before the user's options.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dpdistill.errors import ConfigError
from dpdistill.models.registry import INITIALISATIONS
from dpdistill.privacy.budget import PrivacyRequest
from dpdistill.privacy.selection import FASHION_MNIST, MNIST_SET, Selection
from dpdistill.training.annotation import OUTPUT_SPACES


# the knobs of a teacher's noisy answers: a run that reads its teacher without noise (privacy mode none, as a
# release reads its DP teacher) never uses them
NOISY_ANSWER_SETTINGS = frozenset({"top_k", "gradient_operation", "candidates", "vote_margin", "candidate_threshold",
                                   "target_step", "output_space"})


@dataclass
class TranscriptionConfig:
    """Every knob of a DPSD-family run (defaults: DPSD's settings where the seed gives them)."""

    method: str = "dpsd"
    privacy: PrivacyRequest = field(default_factory=lambda: PrivacyRequest(mode="data", epsilon=10.0))
    iterations: int = 200  # T
    batch_size: int = 256  # b: synthetic samples, hence teacher queries, per iteration
    query_every: int = 1  # ask the teacher on every n-th iteration only; in between the student learns from the
    # replay buffer and the generator from the student (post-processing). Fewer answers, each less noisy at the
    # same budget: the PATE-style route for ensembles
    top_k: int | None = 3  # k: top-k gradient entries (data mode) and candidate-set size (label mode)
    gradient_operation: str = "normalize"  # or "clip" (the seeds' ablation)
    candidates: str = "top-k"  # label mode's candidate classes: the student's top k (DPSD) or "threshold" (SRR)
    vote_margin: float = 0.0  # ensemble label mode: samples whose noisy plurality leads by fewer than this many
    # noise sigmas get no label (PATE's confident answers; post-processing of the released noisy counts)
    candidate_threshold: float = 0.0  # "threshold": classes above this probability, at least two (0: 1/(2 classes))
    target_step: float = 0.1  # gamma_s of DPSD Eq. 3: step of the noisy gradient on the student's output
    output_space: str = "logits"  # data mode: the answer is the gradient with respect to the student's logits, which
    # it moves (target: their softmax), or "probabilities": with respect to its prediction p = Phi_s(x), which it
    # moves (DPSD Eq. 2-3 as written)
    distill_loss: str = "dkd"  # or "kd"
    dkd_alpha: float = 1.0
    dkd_beta: float = 8.0  # DPSD's lambda: weight of the non-target-class term
    temperature: float = 1.0
    student_arch: str = "datalens"
    init: str = "default"  # the student's and generator's initial weights: PyTorch's per-layer default, or "xavier"
    # (Glorot-uniform weights, zero biases: DPSD Alg. 1 line 1)
    student_lr: float = 1e-3
    student_steps: int = 1  # student updates per iteration: the first on the fresh batch, the others on batches
    # drawn from the replay buffer (free: post-processing of earlier answers)
    student_schedule: str = "constant"  # or "cosine": the student's learning rate decays to 0 over the run
    replay_size: int = 0  # annotated samples kept for the extra student steps (0: no buffer, extra steps reuse
    # the fresh batch, whose data-mode targets are relative to the first forward pass)
    augment_shift: int = 0  # replayed samples are translated by up to this many pixels (0: off)
    augment_flip: bool = False  # and mirrored left-right; without privacy the teacher labels the augmented
    # images afresh, otherwise they keep their released targets (assumes the augmentation preserves labels)
    latent_dim: int = 100
    generator_width: tuple[int, int, int] = (128, 128, 64)
    generator_lr: float = 1e-2  # gamma_g
    generator_beta1: float = 0.9  # Adam's first-moment decay for the generator (GAN practice: 0.5)
    latents: str = "trainable"  # "trainable": DPSD's learned z (Alg. 1); "fresh": new z every iteration (DAFL)
    generator_student_weight: float = 1.0  # weight of L_s in the generator's loss (DPSD Eq. 8: 1)
    class_balanced: bool = False  # weight each sample by 1 / (batch count of its target class): post-processing
    discriminator: str = "student"  # "teacher" = DPSD-T: better samples, but no formal guarantee (see report)
    one_hot_weight: float = 1.0
    entropy_weight: float = 5.0
    activation_weight: float = 0.1
    batchnorm_weight: float = 0.0  # match the discriminator's BatchNorm running statistics (DP-DFD, DeepInversion)
    statistics_weight: float = 0.0  # match the teacher's released feature statistics (training/feature_statistics.py:
    # its normalisation layers' input means and variances over the private data, a release's DP picture of the data)
    smoothness_weight: float = 0.0  # total variation of the generated images: an image prior that needs no data
    generator_updates: bool = True  # False: the generator stays as initialised or pretrained during the loop
    generator_pretrain_steps: int = 0  # DP-DFD/SRR: train the generator this many steps with the teacher as fixed
    # discriminator before the private loop; the teacher is then read without protection (no formal guarantee)
    adversarial_weight: float = 0.0  # seek inputs where student and teacher disagree (DFAD): unprotected teacher
    # access, so with a weight above 0 nothing is covered by the guarantee (like DPSD-T)
    synthetic_size: int = 0  # images drawn from the final generator into synthetic.npz, classes balanced (0: none),
    # labelled by the teacher where reading it is free (a DP teacher, or no privacy), else by the student
    synthetic_classifier: str = "datalens"  # trained on the synthetic set alone to measure it (accuracy.synthetic)
    synthetic_epochs: int = 10  # of that classifier (DataLens' protocol: Adam 1e-3, batch 128, final model)
    eval_every: int = 20
    checkpoint_every: int = 20
    seed: int = 0  # initialisation and latent vectors; never the privacy noise, which is secret
    reproducible_noise: bool = False  # debugging only: noise drawn from the seed, so the run has NO guarantee
    sample_source: str | None = None  # a `dpdistill synthesize` directory: each batch is drawn from its images
    # instead of generated, and no generator is trained (data/sample_source.py)
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
        from dpdistill.methods.dpsd_family import family_member  # the methods configure this class

        family_member(self.method).check(self)
        for name in ("iterations", "batch_size", "query_every", "student_steps", "latent_dim", "eval_every",
                     "checkpoint_every", "synthetic_epochs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.query_every > 1 and not self.replay_size:
            raise ConfigError("query-every above 1 needs a replay buffer (--set replay_size=N): between queries the "
                              "student learns only from earlier answers")
        if self.vote_margin > 0 and not self.privacy.votes:
            raise ConfigError("vote-margin applies to an ensemble's noisy votes: label mode with an ensemble as "
                              "--teacher")
        if self.top_k is not None and not 1 <= self.top_k <= num_classes:
            raise ConfigError(f"top-k must be between 1 and the number of classes ({num_classes}), got {self.top_k}")
        if self.distill_loss not in ("dkd", "kd"):
            raise ConfigError(f"unknown distillation loss {self.distill_loss!r}: choose dkd or kd")
        if self.discriminator not in ("student", "teacher"):
            raise ConfigError(f"unknown discriminator {self.discriminator!r}: choose student or teacher")
        if self.latents not in ("trainable", "fresh"):
            raise ConfigError(f"unknown latent mode {self.latents!r}: choose trainable or fresh")
        if self.output_space not in OUTPUT_SPACES:
            raise ConfigError(f"unknown output space {self.output_space!r}: choose {' or '.join(OUTPUT_SPACES)}")
        if self.output_space == "probabilities" and self.temperature != 1 and self.privacy.mode == "data":
            raise ConfigError("output-space probabilities moves the student's prediction at temperature 1 (DPSD Eq. 3): "
                              f"drop temperature {self.temperature:g} or use output_space=logits")
        if self.init not in INITIALISATIONS:
            raise ConfigError(f"unknown initialisation {self.init!r}: choose {' or '.join(INITIALISATIONS)}")
        if self.gradient_operation not in ("normalize", "clip"):
            raise ConfigError(f"unknown gradient operation {self.gradient_operation!r}: choose normalize or clip")
        if self.candidates not in ("top-k", "threshold"):
            raise ConfigError(f"unknown candidate rule {self.candidates!r}: choose top-k or threshold")
        if not 0 <= self.candidate_threshold < 1:
            raise ConfigError(f"candidate-threshold must be in [0, 1), got {self.candidate_threshold}")
        if self.student_schedule not in ("constant", "cosine"):
            raise ConfigError(f"unknown student schedule {self.student_schedule!r}: choose constant or cosine")
        for name in ("vote_margin", "replay_size", "augment_shift", "generator_pretrain_steps", "batchnorm_weight",
                     "adversarial_weight", "one_hot_weight", "entropy_weight", "activation_weight",
                     "generator_student_weight", "smoothness_weight", "statistics_weight", "synthetic_size"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name.replace('_', '-')} must not be negative, got {getattr(self, name)}")
        if self.synthetic_size and self.synthetic_size < num_classes:
            raise ConfigError(f"synthetic-size {self.synthetic_size} gives some of the {num_classes} classes no image: "
                              f"ask for at least {num_classes}, or 0 for none")
        if self.synthetic_size and self.sample_source is not None:
            raise ConfigError("--sample-source replaces the generator, so there is no generator to draw a synthetic "
                              "set from: drop synthetic_size (the source's own synthetic.npz is the set)")
        if not 0 <= self.generator_beta1 < 1:
            raise ConfigError(f"generator-beta1 must be in [0, 1), got {self.generator_beta1}")
        if self.sample_source is not None:
            shaping = [what for what, used in (("generator pretraining", self.generator_pretrain_steps > 0),
                                               ("the teacher as discriminator", self.discriminator == "teacher"),
                                               ("the adversarial term", self.adversarial_weight > 0)) if used]
            if shaping:
                raise ConfigError(f"--sample-source replaces the generator, so {self.method} cannot use "
                                  f"{' or '.join(shaping)} (its settings or preset's): use dpsd or dpdfd with "
                                  f"the student as discriminator")
        self.privacy.validate(num_classes)

    def query_iterations(self, before: int) -> int:
        """How many of the iterations before `before` ask the teacher: iterations 0, n, 2n, ..."""
        return -(-before // self.query_every)

    @property
    def generator_sees_teacher(self) -> bool:
        """True when the generator learns from the unprotected teacher: its samples then carry no guarantee."""
        return self.discriminator == "teacher" or self.adversarial_weight > 0 or self.generator_pretrain_steps > 0


def paper_preset(privacy_mode: str, epsilon: float | None, accounting: str, method: str) -> dict[str, Any]:
    """The seeds' published settings: what the three share here, then the method's own `paper_settings`
    (methods/dpsd.py, dpdfd.py, srr.py; each docs page sets them beside the paper's words). DPSD (seed 000): sigma
    100, beta 1e-3 (eps <= 1) or 5e-3, b 256, T 200. DPDFD (seed 002) states sigma 100 (its best, Tab. 5) and a
    small norm bound C (Fig. 2): DPSD's sigma, C, loop sizes and what else it leaves open, without top-k. SRR (seed
    001) states its threshold, loss weights and student: DPSD's b and T, and eps as the per-query
    randomized-response budget under paper accounting.

    Under sound accounting the noise is calibrated to the budget instead of fixed at sigma = 100, because
    sigma = 100 at these settings spends a sound epsilon of about 29.
    """
    beta = 1e-3 if epsilon is not None and epsilon <= 1 else 5e-3
    privacy: dict[str, Any] = {"beta": beta, "delta": 1e-5}
    if accounting == "paper" and privacy_mode == "data":
        privacy["sigma"] = 100.0
    values: dict[str, Any] = {"iterations": 200, "batch_size": 256, "privacy": privacy}
    from dpdistill.methods.dpsd_family import family_member  # the methods configure this class

    return {**values, **family_member(method).paper_settings}


# seed 000 states T = 200 iterations of b = 256 answers and one student step each (Alg. 1); its figures imply far
# more student steps (33 minutes for 20 iterations; accuracy converging near 120,000 samples), and it defers its
# GAN settings to FastDFKD [25], whose every iteration synthesises one batch of 256 and then takes 400 student steps
# on everything synthesised so far (kd_steps 400, its image pool)
PAPER_POOL = 200 * 256  # every answer of the paper's T x b
CITED_STUDENT_STEPS = 400  # FastDFKD's kd_steps


def paper_workload_preset(privacy_mode: str, epsilon: float | None, accounting: str, method: str) -> dict[str, Any]:
    """The workload seed 000's figures imply (a departure from its Algorithm 1, named as one): the same answers, but
    each iteration the student takes FastDFKD's 400 steps on the pool of every answer so far, as its cited recipe
    does. Replayed answers are post-processing, so the guarantee is the paper preset's. Combine: `paper,paper-workload`."""
    return {"replay_size": PAPER_POOL, "student_steps": CITED_STUDENT_STEPS}


def federated_preset(privacy_mode: str, epsilon: float | None, accounting: str, method: str) -> dict[str, Any]:
    """FedDPSD's differences from DPSD's loop (seed 000, Appendix D, Alg. 2): the server samples fresh noise vectors
    every round (line 3: the generator learns, not the vectors) and each owner normalises its whole gradient (line
    26: top-k only selects label mode's candidates). The default of `federated --method dpsd`, after `paper`."""
    return {"latents": "fresh", "top_k": None}


def demo_preset(privacy_mode: str, epsilon: float | None, accounting: str, method: str) -> dict[str, Any]:
    """Small and fast: for the 8x8 digits demo and smoke tests on 2 CPU cores."""
    return {"iterations": 150, "batch_size": 128, "generator_width": (64, 32, 16),
            "eval_every": 25, "checkpoint_every": 50}


def engine_preset(privacy_mode: str, epsilon: float | None, accounting: str, method: str) -> dict[str, Any]:
    """The strongest data-free engine measured here (BENCHMARKS.md): the generator learns from the teacher
    (BatchNorm statistics, confident and balanced classes) and seeks inputs where student and teacher disagree;
    the student replays recent samples. The teacher is read without protection, so a private run with these
    options carries no formal guarantee; combine with another preset as `paper,engine`."""
    return {"discriminator": "teacher", "latents": "fresh", "generator_width": (64, 32, 16), "generator_lr": 1e-3,
            "generator_beta1": 0.5, "batchnorm_weight": 1.0, "adversarial_weight": 1.0, "activation_weight": 0.0,
            "generator_student_weight": 0.0, "replay_size": 20000, "student_steps": 8, "student_schedule": "cosine"}


def upper_bound_preset(privacy_mode: str, epsilon: float | None, accounting: str, method: str) -> dict[str, Any]:
    """The non-private upper bound (the default of `--privacy none`): the engine with twice the student steps,
    replayed samples shifted and mirrored and labelled afresh by the teacher, run long enough to converge."""
    return {**engine_preset(privacy_mode, epsilon, accounting, method), "iterations": 600, "temperature": 4.0, "eval_every": 100,
            "checkpoint_every": 50, "student_steps": 16, "augment_shift": 2, "augment_flip": True}


def pate_preset(privacy_mode: str, epsilon: float | None, accounting: str, method: str) -> dict[str, Any]:
    """Few answers, each less noisy (PATE's lesson for ensembles): the teacher is asked on every 25th iteration
    only (2,048 answers at b 256, T 200), the student takes 8 steps an iteration on replayed answers, and the
    generator keeps learning from the student in between. The generator never reads the teacher, so a private run
    with these options is covered by the guarantee. Combine with the paper's loop as `paper,pate`."""
    return {"query_every": 25, "replay_size": 20000, "student_steps": 8, "generator_width": (64, 32, 16)}


# What the dp-teacher preset's search compared on the MNIST set and kept (benchmarks/experiments/dp_teacher_engine.py,
# docs/methods/release.md): the discriminator and its terms, the temperature, the relabelled augmentation, the latents
DP_TEACHER_CHOICE: dict[str, Any] = {"discriminator": "student", "adversarial_weight": 0.0,
                                     "generator_student_weight": 1.0, "temperature": 4.0, "augment_shift": 2,
                                     "augment_flip": True, "latents": "fresh"}
DP_TEACHER_SELECTION = Selection("the dp-teacher preset's engine settings", DP_TEACHER_CHOICE,
                                 "the MNIST set (transcriptions of its DP-SGD teacher)", MNIST_SET)
# `release`'s longer loop: twice the preset's iterations and student steps, 1.5 points of student accuracy on
# Fashion-MNIST's test split for one DP teacher (docs/methods/release.md)
RELEASE_LOOP = {"iterations": 600, "student_steps": 8}
RELEASE_LOOP_SELECTION = Selection("the release's transcription loop (600 iterations of 8 student steps)",
                                   RELEASE_LOOP, "Fashion-MNIST (a transcription of its DP-SGD teacher, scored on "
                                   "its test split)", FASHION_MNIST)


def dp_teacher_preset(privacy_mode: str, epsilon: float | None, accounting: str, method: str) -> dict[str, Any]:
    """The engine for a teacher that is itself a DP release, read without noise (post-processing: covered whatever
    the engine reads of it): the upper bound's loop, each replayed sample shifted, mirrored and labelled afresh by
    the teacher, without the BatchNorm-statistics term (DP-SGD's models normalise per example and have none), the
    student as the generator's discriminator (on the MNIST set, the proxy these settings were chosen on, within
    half a point of the teacher as discriminator at half a CPU's cost) and 4 student steps an iteration for 300
    iterations: about a quarter of an hour on 2 cores at 28 x 28."""
    return {**upper_bound_preset(privacy_mode, epsilon, accounting, method), **DP_TEACHER_CHOICE,
            "batchnorm_weight": 0.0, "student_steps": 4, "iterations": 300, "eval_every": 50}


PRESETS = {"paper": paper_preset, "paper-workload": paper_workload_preset, "federated": federated_preset,
           "demo": demo_preset, "engine": engine_preset, "upper-bound": upper_bound_preset, "pate": pate_preset,
           "dp-teacher": dp_teacher_preset}
DEFAULT_PRESETS = {"none": "upper-bound"}  # the preset used when none is named, per privacy mode
DP_TEACHER_PRESET = "dp-teacher"  # ... and for a DP teacher read without noise


def build_config(preset: str | None, overrides: dict[str, Any], privacy_overrides: dict[str, Any],
                 dp_teacher: bool = False) -> TranscriptionConfig:
    """Defaults, then the method's differences from DPSD, then the presets in order (`paper,engine`; without one:
    the mode's default, or `dp-teacher` for a `dp_teacher` without noise), then the user's explicit options (None
    means 'not given')."""
    mode = privacy_overrides.get("mode", "data")
    epsilon = privacy_overrides.get("epsilon")
    accounting = privacy_overrides.get("accounting") or "sound"
    method = overrides.get("method") or "dpsd"
    from dpdistill.methods.dpsd_family import family_member  # the methods configure this class

    values: dict[str, Any] = dict(family_member(method).defaults)
    privacy_values: dict[str, Any] = {"mode": mode, "epsilon": epsilon}
    if preset is None:
        preset = DP_TEACHER_PRESET if dp_teacher and mode == "none" else DEFAULT_PRESETS.get(mode)
    for name in preset.split(",") if preset else ():
        if name.strip() not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}: choose one or more (comma-separated) of {', '.join(PRESETS)}")
        preset_values = PRESETS[name.strip()](mode, epsilon, accounting, method)
        privacy_values.update(preset_values.pop("privacy", {}))
        values.update(preset_values)
    values.update({k: v for k, v in overrides.items() if v is not None})
    privacy_values.update({k: v for k, v in privacy_overrides.items() if v is not None})
    if values.get("top_k") is not None:
        privacy_values["num_candidates"] = values["top_k"]
    if values.get("candidates") == "threshold":  # sets of any size >= 2: binary randomized response is the worst
        privacy_values["num_candidates"] = 2
    values["privacy"] = PrivacyRequest(**privacy_values)
    return TranscriptionConfig(**values)
