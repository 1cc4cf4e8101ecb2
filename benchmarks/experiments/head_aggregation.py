"""What the M = 1,000 heads' answers can teach at sound epsilon 1, and two other ways to aggregate such heads.

    .venv/bin/python benchmarks/experiments/head_aggregation.py [HEADS_DIR]

HEADS_DIR defaults to the harness's `runs/bench/teachers-1000-heads-long-fmnist/seed0` (its encoder is read from
the ensemble). About 80 s on 2 cores. Three parts, each on the 5,000 public test images (answers) and the
other 5,000 (accuracy), Fashion-MNIST:

1. Answer targets. For seeds 0 to 2, the 500 answers `dpdistill pate --epsilon 1 --queries 500 --seed S` releases
   (the same noisy votes), and a linear probe on the frozen encoder's features trained on them: from the noisy
   winners (`--answer-targets argmax`), the same with two losses meant for noisy labels (label smoothing 0.1,
   generalized cross-entropy q = 0.7), from the posterior of the plurality (`posterior`), and, as a ceiling,
   from the true labels of the same images. A minute's proxy for the consistency-trained student. Then (1b) the
   noisy winners against the posterior for 300 to 1,500 answers, the same budget.
2. Heads fitted by linear discriminant analysis instead of logistic regression: each head's class means of its
   own partition with one shared covariance from the public images' features (shrunk towards its mean
   variance). Their plurality, and how often 500 GNMax answers at epsilon 1 are right (mean of five draws).
3. Parameter averaging instead of voting (subsample and aggregate): the heads' weights, each clipped to the
   median norm C, summed, plus one Gaussian draw of std z * 2C calibrated to epsilon 1 (one example changes one
   head, by at most 2C). The average's accuracy without noise and with it (mean of five draws).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from dpdistill.data import load_dataset
from dpdistill.data.partition import partition_indices
from dpdistill.data.public import public_split
from dpdistill.evaluation.metrics import features
from dpdistill.methods.pate import Answers, PateConfig, plurality_posterior, release_answers
from dpdistill.models.ensemble import HeadEnsemble, load_teacher, plurality_counts, read_partition_key
from dpdistill.privacy.budget import plan_privacy
from head_members import answer_sigma, answers_right, parameter_average  # the same measurements

PUBLIC, ANSWERS = 5000, 500


def generalized_cross_entropy(logits: Tensor, labels: Tensor, q: float = 0.7) -> Tensor:
    """(1 - p_label^q) / q (Zhang and Sabuncu 2018): bounded, so wrong labels pull less than under cross-entropy."""
    return ((1 - F.softmax(logits, 1).gather(1, labels[:, None]).clamp(min=1e-6) ** q) / q).mean()


def probe_accuracy(train: Tensor, targets: Tensor, test: Tensor, test_labels: Tensor,
                   loss_of=F.cross_entropy) -> float:
    """A linear probe (Adam 0.01, weight decay 1e-3, 500 full-batch steps) on `targets`: indices or probabilities."""
    torch.manual_seed(0)
    probe = torch.nn.Linear(train.shape[1], 10)
    optimizer = torch.optim.Adam(probe.parameters(), lr=1e-2, weight_decay=1e-3)
    for _ in range(500):
        loss = loss_of(probe(train), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return (probe(test).argmax(1) == test_labels).float().mean().item()


def released(heads: HeadEnsemble, split, queries: int, seed: int) -> tuple[Answers, float]:
    """The answers `dpdistill pate --epsilon 1 --queries Q --seed S` releases, and their sigma."""
    config = PateConfig(epsilon=1.0, queries=queries, public_size=PUBLIC, seed=seed)
    plan = plan_privacy(config.privacy_request(len(heads), 10), 10, queries, 1)
    return release_answers(heads, split.pool, plan, config, 10), plan.sigma


def standardised(public: Tensor, measured: Tensor) -> tuple[Tensor, Tensor]:
    """The probe's inputs, standardised by the public images' statistics."""
    centre, scale = public.mean(0), public.std(0) + 1e-6
    return (public - centre) / scale, (measured - centre) / scale


def answer_targets(heads: HeadEnsemble, split, public: Tensor, measured: Tensor) -> None:
    public_raw, (public, measured) = public, standardised(public, measured)
    scores: dict[str, list[float]] = {name: [] for name in ("argmax", "smoothed 0.1", "GCE 0.7", "posterior",
                                                             "true labels")}
    right, exact = [], []
    for seed in range(3):
        answers, sigma = released(heads, split, ANSWERS, seed)
        truth = split.pool_labels[answers.indices]
        right.append((answers.labels == truth).float().mean().item())
        with torch.no_grad():  # the same images' plurality without noise
            exact.append((plurality_counts(heads.head_logits(public_raw[answers.indices]), 10).argmax(1)
                          == truth).float().mean().item())
        inputs = public[answers.indices]
        posterior = plurality_posterior(answers.votes, sigma)
        for name, targets, loss_of in (
                ("argmax", answers.labels, F.cross_entropy),
                ("smoothed 0.1", answers.labels, lambda logits, labels: F.cross_entropy(logits, labels,
                                                                                        label_smoothing=0.1)),
                ("GCE 0.7", answers.labels, generalized_cross_entropy),
                ("posterior", posterior, F.cross_entropy), ("true labels", truth, F.cross_entropy)):
            scores[name].append(probe_accuracy(inputs, targets, measured, split.y_eval, loss_of))
    print(f"1. seeds 0-2: the asked images' plurality right {', '.join(f'{100 * value:.1f}%' for value in exact)}, "
          f"the noisy answers {', '.join(f'{100 * value:.1f}%' for value in right)}; a linear probe on them:")
    for name, values in scores.items():
        print(f"   {name:12s} {', '.join(f'{100 * value:.2f}' for value in values)}  mean "
              f"{100 * sum(values) / 3:.2f}%")


def answer_counts(heads: HeadEnsemble, split, public: Tensor, measured: Tensor) -> None:
    """Whether soft targets move the best number of answers: more answers carry more noise each, which the
    posterior states, so it could afford more of them than the noisy winners do."""
    public, measured = standardised(public, measured)
    for queries in (300, 500, 750, 1000, 1500):
        scores: dict[str, list[float]] = {"argmax": [], "posterior": []}
        for seed in range(3):
            answers, sigma = released(heads, split, queries, seed)
            inputs = public[answers.indices]
            scores["argmax"].append(probe_accuracy(inputs, answers.labels, measured, split.y_eval))
            scores["posterior"].append(probe_accuracy(inputs, plurality_posterior(answers.votes, sigma), measured,
                                                      split.y_eval))
        print(f"1b. {queries} answers (sigma {sigma:.1f}): probe "
              + ", ".join(f"{name} {100 * sum(values) / 3:.2f}%" for name, values in scores.items()))


def lda_heads(train: Tensor, labels: Tensor, parts: list[Tensor], public: Tensor, shrink: float
              ) -> tuple[Tensor, Tensor, Tensor]:
    """Weights (M, F, classes), biases (M, classes) and the centring mean of LDA heads with the public covariance."""
    mean = public.mean(0)
    covariance = torch.cov((public - mean).T)
    shrunk = (1 - shrink) * covariance + shrink * covariance.diagonal().mean() * torch.eye(len(covariance))
    precision = torch.linalg.inv(shrunk)
    weights, biases = [], []
    for part in parts:
        counts = torch.bincount(labels[part], minlength=10).float()
        means = torch.zeros(10, train.shape[1]).index_add_(0, labels[part], train[part] - mean)
        means = means / counts.clamp(min=1)[:, None]
        bias = -0.5 * (means @ precision * means).sum(1)
        weights.append(precision @ means.T)
        biases.append(torch.where(counts > 0, bias, torch.full_like(bias, -1e9)))  # a missing class never wins
    return torch.stack(weights), torch.stack(biases), mean


def other_aggregations(heads: HeadEnsemble, key: bytes, split, public: Tensor, measured: Tensor) -> None:
    dataset = load_dataset("fmnist")
    train = features(heads.encoder, dataset.x_train)
    parts = partition_indices(dataset.ids_train, len(heads), key)  # the heads' own partitions
    sigma = answer_sigma(1.0, ANSWERS)

    def compare(name: str, logits_of) -> None:
        """Plurality on the measured images; GNMax answers on the first public ones at epsilon 1 (five draws)."""
        with torch.no_grad():
            measured_votes, public_votes = (plurality_counts(logits_of(images), 10)
                                            for images in (measured, public[:ANSWERS]))
        plurality = (measured_votes.argmax(1) == split.y_eval).float().mean().item()
        right = answers_right(public_votes, split.pool_labels[:ANSWERS], sigma)
        print(f"2. {name}: plurality {100 * plurality:.2f}%, {ANSWERS} answers at epsilon 1 right "
              f"{100 * right:.1f}%")

    compare("logistic heads (the ensemble's own)", heads.head_logits)
    for shrink in (0.3, 0.4, 0.5):
        weight, bias, mean = lda_heads(train, dataset.y_train, parts, public, shrink)
        compare(f"LDA heads, shrinkage {shrink}",
                lambda images: torch.einsum("nf,mfc->mnc", images - mean, weight) + bias[:, None])
    print(f"3. {parameter_average(heads, measured, split.y_eval, (1.0,))}")


def main(heads_dir: Path) -> None:
    heads, _ = load_teacher(heads_dir)
    if not isinstance(heads, HeadEnsemble):
        raise SystemExit(f"{heads_dir} is not an ensemble of heads (train-teacher --heads-only)")
    dataset = load_dataset("fmnist")
    split = public_split(dataset, None, PUBLIC)
    public, measured = features(heads.encoder, split.pool), features(heads.encoder, split.x_eval)
    answer_targets(heads, split, public, measured)
    answer_counts(heads, split, public, measured)
    other_aggregations(heads, read_partition_key(heads_dir), split, public, measured)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/bench/teachers-1000-heads-long-fmnist/seed0"))
