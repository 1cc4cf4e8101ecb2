"""DPDFD's direct training on private data (seed 002, "Model Conversion via Differentially Private Data-Free
Distillation", the comparison with DP-SGD in its Tab. 4), with the trainer in training/private.py
(DirectOutputGradientTrainer).

For each Poisson-sampled batch of private examples:
1. Ask: g_i = d CE(student(x_i), y_i) / d logits, the private label as a certain teacher.
2. Release: normalise each g_i to norm beta and add N(0, sigma^2 beta^2) (DPSD's data-mode annotation).
3. Learn: the student fits softmax(logits - gamma * noisy gradient).
The update still reads the private input through d logits / d weights, which nothing bounds: the student has NO
formal guarantee; the epsilon covers only the released noisy output gradients (replace-one).
"""

from __future__ import annotations

from dpdistill.methods.private_training import PrivateTrainingMethod
from dpdistill.privacy.ledger import UncoveredRead


class DPDFDDirect(PrivateTrainingMethod):
    name = "dpdfd-direct"
    summary = "DPDFD's noisy output-gradient targets on the private data (no formal guarantee for the student)"
    paper = "Model Conversion via Differentially Private Data-Free Distillation, IJCAI 2023 (seed 002), Tab. 4"
    covers = "the released noisy output gradients"
    student_read = UncoveredRead(
        "the private inputs, by the student's update (d logits / d weights)",
        "NO formal guarantee: the student's update depends on the private inputs through d logits / d weights, which "
        "the output-gradient mechanism does not bound; the stated epsilon covers only the released noisy output "
        "gradients")
