"""DP-SGD (Abadi et al. 2016, "Deep Learning with Differential Privacy"), the baseline the seed papers compare
against, with Opacus' parts (training/private.py: DPSGDTrainer).

For each of `epochs` x steps-per-epoch steps:
1. Sample: every private example joins the batch independently with probability q (Poisson, secret randomness).
2. Ask: the gradient of each example's loss w.r.t. the student's weights.
3. Release: clip each to norm C, sum, add N(0, sigma^2 C^2) (noise from the run's NoiseSource); the accountant
   composes the Poisson-subsampled Gaussian over the steps.
4. Learn: Adam or SGD on the noisy sum (post-processing).
Every update is a noisy release, so the released student is covered (add/remove one example, or replace-one).
"""

from __future__ import annotations

from dpdistill.methods.private_training import PrivateTrainingMethod


class DPSGD(PrivateTrainingMethod):
    name = "dpsgd"
    summary = "DP-SGD on the private data (Opacus): per-example clipping and Gaussian noise on every step"
    paper = "Abadi et al., Deep Learning with Differential Privacy (CCS 2016)"
    covers = "the student (DP-SGD: every update is a clipped, noised per-example gradient)"
