"""DPSD: differentially private synthetic distillation (seed 000, the journal paper "Privacy-Preserving Model
Transcription with Differentially Private Synthetic Distillation", Algorithm 1).

Per iteration t, for T iterations:
1. Generate: x_i = G(z_i) for a batch of b trainable latent vectors z_i.
2. Ask: the teacher and the student predict on the synthetic batch.
3. Release through a mechanism (the ledger records its DpEvent):
   - data mode: the DKD loss's gradient w.r.t. the student's logits, top-k entries, normalised to norm beta,
     plus N(0, sigma^2 beta^2); the target is the student's logits moved against it by gamma_s;
   - label mode: randomized response over the student's top-k classes (an ensemble: noisy votes).
4. Learn: the student fits the noisy targets (Eq. 7); the generator and its latent vectors learn L_s + L_g with
   the student as discriminator (Eq. 8), so they see only noisy releases: post-processing.
DPSD-T (`--discriminator teacher`) lets the generator read the teacher: better samples, no formal guarantee.
The loop is the shared engine (methods/engine.py); DPSD is its default settings.
"""

from __future__ import annotations

from typing import Any, ClassVar

from dpdistill.methods.transcription import TranscriptionMethod


class DPSD(TranscriptionMethod):
    name = "dpsd"
    summary = "data-free transcription: a generator and a student learn from a teacher's noisy answers (data or label mode)"
    paper = "Privacy-Preserving Model Transcription with Differentially Private Synthetic Distillation (seed 000)"
    # what seed 000 states (section IV-A unless named; docs/methods/dpsd.md has the side-by-side table): gamma_s
    # 0.1 both as Eq. 3's step and as the student's learning rate (Alg. 1 line 5), gamma_g 0.01, lambda 8 (Eq. 2),
    # k 3, Xavier initialisation (Alg. 1 line 1), Eq. 3 in the prediction p = Phi_s(x) (section III-B), Eq. 8's
    # three terms unweighted
    paper_settings: ClassVar[dict[str, Any]] = {
        "target_step": 0.1, "student_lr": 0.1, "generator_lr": 1e-2, "dkd_beta": 8.0, "distill_loss": "dkd",
        "top_k": 3, "init": "xavier", "output_space": "probabilities", "one_hot_weight": 1.0, "entropy_weight": 1.0,
        "activation_weight": 1.0}
