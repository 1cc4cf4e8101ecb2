"""DP-SGD on several processes (training/distributed.py): the union of the ranks' Poisson samples is the single
process's sample, the noise is added once a step, a failure on any rank ends the run with one error, and a
two-process run learns as one process does with the epsilon of its saved plan."""

import json
import math
from functools import partial
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dpdistill.errors import ConfigError, DistributedError
from dpdistill.methods import private_training
from dpdistill.pipeline import train_private
from dpdistill.privacy.randomness import noise_source
from dpdistill.training.distributed import Group, on_processes
from dpdistill.training.private import PoissonBatchSampler, PrivateTrainingConfig, opacus_sampling, plan_private_training
from ranks import BATCH, CLIP, data, fails_on_one_rank, steps_on_each_rank

DIGITS_TRAIN = 1437


def _union_of_samples(examples: int, rate: float, steps: int, reproducible: bool,
                      processes: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Which examples a step's batches take on all the ranks together (steps x examples), and each rank's batch
    sizes: each rank samples its shard as the trainer does, with the noise source the trainer gives its rank."""
    taken, sizes = np.zeros((steps, examples), dtype=bool), np.zeros((processes, steps))
    shards = [Group(rank, processes).shard(torch.arange(examples)) for rank in range(processes)]
    assert sorted(torch.cat(shards).tolist()) == list(range(examples))  # every example in exactly one shard
    for rank, shard in enumerate(shards):
        sampler = PoissonBatchSampler(len(shard), rate, steps, noise_source(reproducible, 7, rank))
        for step, batch in enumerate(sampler):
            taken[step, shard[batch].numpy()] = True
            sizes[rank, step] = len(batch)
    return taken, sizes


@pytest.mark.parametrize("reproducible", [False, True])
def test_the_ranks_samples_together_are_a_poisson_sample_at_the_plans_rate(reproducible):
    """Margins about five times the spreads measured over 30 secure draws of these sizes (mean +- std): the union's
    standardised mean batch -0.19 +- 0.88, its batch sizes' variance over the Poisson one 1.000 +- 0.027, the
    examples' counts' variance over the binomial one 1.002 +- 0.043, the ranks' batch sizes' correlation
    0.003 +- 0.019, and how often the examples at one position of the two shards are taken together, over rate^2,
    0.996 +- 0.016. Ranks drawing one stream would take the same positions of their equal shards: a correlation
    of 1, twice the variance, together at the rate instead of its square."""
    examples, rate, steps = 1000, 0.05, 2000
    taken, sizes = _union_of_samples(examples, rate, steps, reproducible)
    per_step, per_example = taken.sum(1), taken.sum(0)
    assert abs(per_step.mean() - examples * rate) < 5 * math.sqrt(examples * rate * (1 - rate) / steps)
    assert per_step.var(ddof=1) / (examples * rate * (1 - rate)) == pytest.approx(1, abs=0.13)
    assert per_example.var(ddof=1) / (steps * rate * (1 - rate)) == pytest.approx(1, abs=0.22)
    assert abs(np.corrcoef(sizes)[0, 1]) < 0.1
    assert (taken[:, 0::2] & taken[:, 1::2]).mean() / rate**2 == pytest.approx(1, abs=0.08)


def _clipped_sum(weight: torch.Tensor, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The sum of the examples' gradients, each clipped to CLIP as Opacus clips (factor C / (norm + 1e-6))."""
    total = torch.zeros_like(weight)
    for example, label in zip(inputs, labels):
        trained = weight.clone().requires_grad_()
        F.cross_entropy((example @ trained.T)[None], label[None]).backward()
        total += trained.grad * min(1.0, CLIP / (float(trained.grad.norm()) + 1e-6))
    return total


@pytest.mark.slow
def test_the_noise_is_added_once_a_step_by_rank_zero_to_the_sum_of_every_ranks_clipped_gradients():
    """Two processes (gloo), three steps: rank 0 draws one Gaussian a step and rank 1 none, and both ranks step on
    (the clipped gradients of all ten examples + that one draw) / the plan's batch, the single process's update."""
    steps = 3
    ranks = on_processes(2, "cpu", partial(steps_on_each_rank, steps))
    inputs, labels = data()
    for clipping in range(2):  # materialised per-example gradients, then ghost clipping
        leader, follower = (ranks[rank][clipping] for rank in range(2))
        assert len(leader["draws"]) == steps and follower["draws"] == []
        assert leader["grads"] == follower["grads"] and leader["before"] == follower["before"]
        for before, grad, draw in zip(leader["before"], leader["grads"], leader["draws"]):
            expected = (_clipped_sum(torch.tensor(before), inputs, labels) + torch.tensor(draw)) / BATCH
            assert torch.allclose(torch.tensor(grad), expected, atol=1e-6)
            assert torch.tensor(draw).std() > 0.5 * 0.5 * CLIP  # a draw of std sigma C, not a zero stub


def test_a_failure_on_any_rank_ends_every_rank_with_its_one_error():
    """The other rank, left waiting in an exchange, fails after it: the error raised is the first."""
    with pytest.raises(DistributedError, match=r"^process 1 of 2 failed: ValueError: a mistake on rank 1 "
                                               r"\(ranks.py:\d+\)$"):
        on_processes(2, "cpu", partial(fails_on_one_rank, 1))
    with pytest.raises(ConfigError, match="^a refusal on rank 0$"):  # a user's error keeps its kind and words
        on_processes(2, "cpu", partial(fails_on_one_rank, 0))


def test_several_processes_are_refused_where_they_cannot_keep_the_plan(monkeypatch):
    with pytest.raises(ConfigError, match="only dpsgd trains on several processes"):
        PrivateTrainingConfig(dataset="digits", epsilon=1.0, method="dpdfd-direct", processes=2)
    with pytest.raises(ConfigError, match="--processes must be at least 1"):
        PrivateTrainingConfig(dataset="digits", epsilon=1.0, processes=0)
    config = PrivateTrainingConfig(dataset="digits", epsilon=10.0, sigma=2.0, processes=2).fitted(DIGITS_TRAIN)
    monkeypatch.setattr(Group, "current", classmethod(lambda cls: cls(0, 3)))  # torchrun started three
    with pytest.raises(ConfigError, match="planned for --processes 2 and 3 processes were started"):
        private_training.share_plan(config, plan_private_training(config, DIGITS_TRAIN))


# This run's settings, six runs each on 2 shared cores: one process 92.50-94.17% (mean 93.19%, std 0.72 points),
# two processes 92.78-94.72% (mean 93.52%, std 0.78); chance is 10%
TWO_PROCESSES = {"dataset": "digits", "student_arch": "scatter-linear", "epsilon": 3.0, "batch_size": 256, "lr": 2.0,
                 "epochs": 5, "processes": 2}


def _stop_after_the_first_epoch(record: dict) -> None:
    if record.get("epoch") == 1:
        raise KeyboardInterrupt


@pytest.mark.slow
def test_two_processes_learn_as_one_does_with_the_epsilon_of_their_saved_plan(tmp_path: Path):
    """Interrupted after its first epoch (rank 0's checkpoint) and resumed, as a user would."""
    with pytest.raises(KeyboardInterrupt):
        train_private(PrivateTrainingConfig(**TWO_PROCESSES), tmp_path, progress=_stop_after_the_first_epoch)
    assert (tmp_path / "private" / "resume").exists() and not (tmp_path / "report.json").exists()
    report = train_private(None, tmp_path, resume=True)
    assert [record["epoch"] for record in report["history"]] == [1, 2, 3, 4, 5]
    assert report["accuracy"]["student"] == pytest.approx(0.932, abs=0.03)  # one process's mean, 4 of its stds
    assert report["timing"]["processes"] == 2
    assert "| processes (each its share of the examples, the same privacy) | 2 |" in (tmp_path / "report.md").read_text()
    assert sorted(path.name for path in tmp_path.iterdir()) == [  # rank 0's files, as one process writes them
        ".ledger.lock", "config.json", "confusion.png", "ledger.json", "private", "report.json", "report.md",
        "student.json", "student.safetensors", "training.png"]
    # the epsilon again, from the saved settings and the plan's figures, by dp-accounting's own PLD accountant
    config = json.loads((tmp_path / "config.json").read_text())
    privacy = json.loads((tmp_path / "report.json").read_text())["privacy"]
    assert config["processes"] == 2 and privacy["declared_size"] == DIGITS_TRAIN
    rate, steps_per_epoch = opacus_sampling(privacy["declared_size"], config["batch_size"])
    assert privacy["sample_rate"] == rate and privacy["steps"] == config["epochs"] * steps_per_epoch
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    step = dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(privacy["noise_multiplier"]))
    accountant.compose(step, privacy["steps"])
    assert privacy["steps"] == privacy["planned_steps"]
    epsilon = accountant.get_epsilon(config["delta"])
    assert privacy["epsilon"] == pytest.approx(epsilon, abs=2e-3) and epsilon <= config["epsilon"] + 1e-3
    single = plan_private_training(PrivateTrainingConfig(**{**TWO_PROCESSES, "processes": 1}), DIGITS_TRAIN)
    assert privacy["noise_multiplier"] == single.noise_multiplier  # the single process's plan
