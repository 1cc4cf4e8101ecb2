"""Secret randomness in private training: the Poisson sampler and the DP-SGD noise come from the NoiseSource, so
neither can be regenerated from the released seed; the debug mode repeats and says it has no guarantee."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch
from opacus import GradSampleModule
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import TensorDataset
from typer.testing import CliRunner

from dpdistill.cli.main import app
from dpdistill.data import load_dataset
from dpdistill.errors import CheckpointError, PrivacyParameterError
from dpdistill.training.state import load_state
from dpdistill.pipeline import train_private
from dpdistill.privacy.accounting import composed_epsilon
from dpdistill.privacy.randomness import NoiseSource, ReproducibleNoise, SecureNoise
from dpdistill.training.private import (TRAINERS, NoiseSourceDPOptimizer, NoiseSourceGhostClippingOptimizer,
                                        PoissonBatchSampler, PrivateTrainingConfig, ghost_clipping_applies,
                                        plan_private_training, poisson_loader)

DELTA = 1e-5
DIGITS_TRAIN = 1437
TINY = {"dataset": "digits", "student_arch": "datalens", "batch_size": 64, "lr": 3e-3}  # 23 Poisson batches an epoch
ONE_EPOCH = {**TINY, "epsilon": 10.0, "sigma": 1.0, "epochs": 1}


def _trainer(tmp_path: Path, **values):
    config = PrivateTrainingConfig(**{**ONE_EPOCH, **values})
    dataset = load_dataset("digits")
    return TRAINERS[config.method](config, dataset, plan_private_training(config, len(dataset.y_train)), tmp_path)


def _batches(trainer) -> list[list[int]]:
    return list(trainer.loader.batch_sampler)


def _seeded_predictions(seed: int) -> list[list[list[int]]]:
    """What the seeded code would have sampled: Opacus' sampler on generators rebuilt from the report's seed."""
    predictions = []
    for generator in (torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)):
        predictions.append(list(UniformWithReplacementSampler(num_samples=DIGITS_TRAIN, sample_rate=1 / 23,
                                                              generator=generator)))
    torch.manual_seed(seed)  # the global generator Opacus' DPDataLoader fell back to
    predictions.append(list(UniformWithReplacementSampler(num_samples=DIGITS_TRAIN, sample_rate=1 / 23)))
    return predictions


def test_private_seeded_generators_do_not_predict_the_secure_batches(tmp_path: Path):
    secure = _batches(_trainer(tmp_path, seed=3))
    for predicted in _seeded_predictions(3):
        assert len(predicted) == len(secure) == 23
        assert not any(batch in secure for batch in predicted)  # ~62 of 1437 examples: no coincidence
    # the same attack on the debug mode, which draws from the seed, predicts every batch
    debug = _batches(_trainer(tmp_path, seed=3, reproducible_noise=True))
    assert debug == list(PoissonBatchSampler(DIGITS_TRAIN, 1 / 23, 23, ReproducibleNoise(3)))
    assert secure != _batches(_trainer(tmp_path, seed=3))  # and a second secure run samples afresh


def test_private_poisson_sampler_samples_at_the_planned_rate():
    num_samples, rate, steps = 1000, 0.05, 200
    batches = list(PoissonBatchSampler(num_samples, rate, steps, SecureNoise()))
    assert len(batches) == steps
    assert all(batch == sorted(set(batch)) and all(0 <= index < num_samples for index in batch) for batch in batches)
    taken = sum(len(batch) for batch in batches)
    assert scipy.stats.binomtest(taken, num_samples * steps, rate).pvalue > 1e-4
    counts = np.bincount(np.concatenate([np.array(batch, dtype=int) for batch in batches]), minlength=num_samples)
    assert scipy.stats.binomtest(int(counts[:10].sum()), 10 * steps, rate).pvalue > 1e-4  # every example alike


def test_private_loader_runs_the_planned_steps_and_refuses_another_plan(tmp_path: Path):
    trainer = _trainer(tmp_path)
    assert len(trainer.loader) == trainer.plan.steps_per_epoch == 23
    assert sum(1 for _ in trainer.loader) == 23
    # the plan's rate and steps come from the declared size: another count of examples runs the same steps
    dataset = TensorDataset(torch.zeros(100, 3), torch.zeros(100, dtype=torch.int64))
    assert sum(1 for _ in poisson_loader(dataset, trainer.plan, SecureNoise(), trainer.config.batch_size)) == 23
    with pytest.raises(PrivacyParameterError, match="Opacus' rule samples at rate 0.333.* for 3 steps"):
        poisson_loader(dataset, trainer.plan, SecureNoise(), trainer.plan.size // 3)  # another batch size


class NeverSampled(NoiseSource):
    """Uniforms as close to 1 as they come: no example is ever sampled."""

    reproducible, description = True, "test"

    def bits(self, count: int) -> np.ndarray:
        return np.full(count, 2**64 - 1, dtype=np.uint64)

    def randbelow(self, bound: int) -> int:
        return bound - 1


def test_private_loader_keeps_shapes_of_empty_batches(tmp_path: Path):
    plan = _trainer(tmp_path).plan
    dataset = TensorDataset(torch.zeros(DIGITS_TRAIN, 1, 8, 8), torch.zeros(DIGITS_TRAIN, dtype=torch.int64))
    batches = list(poisson_loader(dataset, plan, NeverSampled(), 64))
    assert len(batches) == 23
    assert all(inputs.shape == (0, 1, 8, 8) and labels.shape == (0,) and labels.dtype == torch.int64
               for inputs, labels in batches)


class EveryOtherSampled(NeverSampled):
    """Bits that sample the examples at even positions only (below any rate), the others never."""

    def bits(self, count: int) -> np.ndarray:
        return np.where(np.arange(count) % 2 == 0, 0, 2**64 - 1).astype(np.uint64)


def test_a_batch_holds_exactly_the_sampled_examples_with_their_labels(tmp_path: Path):
    """The batch is gathered at once (GatheredTensors): the rows and labels of the sampled examples, in order."""
    plan = _trainer(tmp_path).plan
    inputs = torch.arange(DIGITS_TRAIN, dtype=torch.float32)[:, None, None, None].expand(-1, 1, 8, 8).contiguous()
    labels = torch.arange(DIGITS_TRAIN) % 10
    batch_inputs, batch_labels = next(iter(poisson_loader(TensorDataset(inputs, labels), plan, EveryOtherSampled(),
                                                          64)))
    sampled = torch.arange(0, DIGITS_TRAIN, 2)
    assert torch.equal(batch_inputs, inputs[sampled]) and torch.equal(batch_labels, labels[sampled])


def _dpsgd_step(layer: nn.Linear, inputs: torch.Tensor, labels: torch.Tensor, noise: NoiseSource, ghost: bool,
                noise_multiplier: float, max_grad_norm: float) -> None:
    """One DP-SGD step (SGD, lr 1, mean loss) on `layer`, clipping materialised per-example gradients or by ghost
    norms."""
    settings = {"noise": noise, "noise_multiplier": noise_multiplier, "max_grad_norm": max_grad_norm,
                "expected_batch_size": len(labels)}
    sgd = torch.optim.SGD(layer.parameters(), lr=1.0)
    warnings.filterwarnings("ignore", message="Full backward hook is firing")  # inputs need no gradient
    if ghost:
        module = GradSampleModuleFastGradientClipping(layer, max_grad_norm=max_grad_norm)
        optimizer = NoiseSourceGhostClippingOptimizer(sgd, **settings)
        DPLossFastGradientClipping(module, optimizer, nn.CrossEntropyLoss())(module(inputs), labels).backward()
    else:
        module = GradSampleModule(layer)
        optimizer = NoiseSourceDPOptimizer(sgd, **settings)
        nn.functional.cross_entropy(module(inputs), labels).backward()
    optimizer.step()


def _noise_added(noise: NoiseSource, ghost: bool = False, noise_multiplier: float = 1.5,
                 max_grad_norm: float = 2.0) -> torch.Tensor:
    """The update of one DP-SGD step on zero gradients (zero inputs, a layer without bias), times the batch size:
    minus the noise alone."""
    layer = nn.Linear(60, 50, bias=False)
    before = layer.weight.detach().clone()
    _dpsgd_step(layer, torch.zeros(8, 60), torch.zeros(8, dtype=torch.int64), noise, ghost, noise_multiplier,
                max_grad_norm)
    return ((before - layer.weight.detach()) * 8).flatten()


def test_ghost_clipping_gives_the_update_of_per_example_clipping():
    inputs, labels = torch.randn(32, 40) * 3, torch.randint(0, 10, (32,))
    updates = []
    for ghost_clipping in (False, True):
        torch.manual_seed(0)
        layer = nn.Linear(40, 10)
        _dpsgd_step(layer, inputs, labels, ReproducibleNoise(1), ghost_clipping, 1.0, max_grad_norm=0.05)
        updates.append(torch.cat([weight.detach().flatten() for weight in layer.parameters()]))
    assert torch.allclose(updates[0], updates[1], atol=1e-6)  # same clipping, same noise


def test_ghost_clipping_applies_to_linear_layers_only():
    assert ghost_clipping_applies(nn.Linear(4, 2))
    assert ghost_clipping_applies(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)))
    assert not ghost_clipping_applies(nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4, 2)))
    frozen_conv = nn.Sequential(nn.Conv2d(1, 4, 3).requires_grad_(False), nn.Flatten(), nn.Linear(4, 2))
    assert ghost_clipping_applies(frozen_conv)  # only the layers that learn count


@pytest.mark.parametrize("ghost", [False, True])
def test_private_dpsgd_noise_has_the_planned_std_and_is_not_the_seeded_one(ghost: bool):
    noise = _noise_added(SecureNoise(), ghost)
    assert len(noise) == 60 * 50
    assert scipy.stats.kstest(noise.double().numpy() / 3.0, "norm").pvalue > 1e-4  # std 1.5 * 2.0
    assert noise.std().item() == pytest.approx(3.0, rel=0.06)
    for seed in (0, 1):  # Opacus' noise from the seeded generator the old code used
        seeded = torch.normal(0, 3.0, (len(noise),), generator=torch.Generator().manual_seed(seed))
        assert not torch.allclose(noise, seeded, atol=1.0)
    assert not torch.equal(noise, _noise_added(SecureNoise(), ghost))
    # the debug mode repeats its noise (up to the float rounding of different initial weights)
    assert torch.allclose(_noise_added(ReproducibleNoise(5), ghost), _noise_added(ReproducibleNoise(5), ghost),
                          atol=1e-4)


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "student.safetensors")


@pytest.mark.slow
def test_private_dpsgd_identical_secure_runs_release_different_students(tmp_path: Path):
    reports = [train_private(PrivateTrainingConfig(**ONE_EPOCH), tmp_path / name) for name in ("a", "b")]
    first, second = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert not any(torch.equal(first[name], second[name]) for name in first if name.endswith("weight"))
    for report in reports:
        privacy = report["privacy"]
        assert privacy["formal_guarantee"] is True and privacy["noise"].startswith("secure: os.urandom")
        assert privacy["relation"] == "add-remove" and privacy["epsilon_add_remove"] == privacy["epsilon"]
        assert privacy["epsilon"] < privacy["epsilon_replace_one"] <= 10.0
        assert "expected_batch_size" not in privacy
        assert all(set(record) == {"epoch", "steps", "test_accuracy"} for record in report["history"])
    saved = (tmp_path / "a" / "report.json").read_text() + (tmp_path / "a" / "report.md").read_text()
    assert "train_loss" not in saved and "expected_batch_size" not in saved and "train loss" not in saved


@pytest.mark.slow
def test_private_dpsgd_reproducible_noise_repeats_and_says_no_guarantee(tmp_path: Path):
    config = PrivateTrainingConfig(**ONE_EPOCH, reproducible_noise=True)
    reports = [train_private(config, tmp_path / name) for name in ("a", "b")]
    first, second = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert all(torch.equal(first[name], second[name]) for name in first)
    privacy = reports[0]["privacy"]
    assert privacy["formal_guarantee"] is False and privacy["covered"] == "NO guarantee: the noise is reproducible"
    assert privacy["noise"].startswith("reproducible from the seed")
    assert "**NO guarantee: the noise is reproducible.**" in (tmp_path / "a" / "report.md").read_text()


@pytest.mark.slow
def test_private_figures_stay_out_of_the_public_result(tmp_path: Path):
    result = _trainer(tmp_path).run()
    assert result.private_figures["train_size"] == DIGITS_TRAIN
    assert result.private_figures["expected_batch_size"] == pytest.approx(DIGITS_TRAIN / 23)
    assert [record["epoch"] for record in result.private_figures["train_loss"]] == [1]
    assert result.private_figures["train_loss"][0]["train_loss"] > 0
    assert "expected_batch_size" not in result.privacy and "train_loss" not in result.history[0]


@pytest.mark.slow
def test_private_dpsgd_replace_one_calibrates_more_noise_to_the_budget(tmp_path: Path):
    values = {**TINY, "epsilon": 2.0, "epochs": 1}  # its accounting 3 s (10 s at epsilon 10)
    add_remove = plan_private_training(PrivateTrainingConfig(**values), DIGITS_TRAIN)
    report = train_private(PrivateTrainingConfig(**values, relation="replace-one"), tmp_path)
    privacy = report["privacy"]
    assert privacy["noise_multiplier"] > add_remove.noise_multiplier
    assert privacy["relation"] == "replace-one" and privacy["unit"] == "replacing one private training example"
    assert 1.98 < privacy["epsilon"] == privacy["epsilon_replace_one"] <= 2.0
    assert privacy["epsilon_add_remove"] < privacy["epsilon_replace_one"]
    assert privacy["epsilon_add_remove"] == pytest.approx(
        composed_epsilon(add_remove.query.__class__(privacy["noise_multiplier"], 1 / 23), 23, DELTA))
    assert privacy["relation_rdp"] == "add-remove"
    assert "with respect to replacing one private training example" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_private_secure_checkpoint_keeps_no_noise_state_and_resumes(tmp_path: Path):
    config = PrivateTrainingConfig(**{**ONE_EPOCH, "epochs": 2})

    def interrupt_after_first_epoch(record: dict) -> None:
        if "test_accuracy" in record:  # the epoch's end (records within it say how far into it the run is)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_private(config, tmp_path, progress=interrupt_after_first_epoch)
    state = load_state(tmp_path / "private" / "resume")
    assert state["noise"] is None and not {"sampler_rng", "noise_rng"} & set(state)
    resumed = train_private(None, tmp_path, resume=True)
    assert resumed["privacy"]["steps"] == resumed["privacy"]["planned_steps"] == 46
    assert json.loads((tmp_path / "report.json").read_text())["privacy"]["formal_guarantee"] is True


def test_private_cli_refuses_an_unknown_relation(tmp_path: Path):
    result = CliRunner().invoke(app, ["train-private", "--dataset", "digits", "--out", str(tmp_path), "--epsilon",
                                      "1", "--relation", "sideways"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "unknown --relation 'sideways'" in errors[0]


def test_private_refuses_to_resume_a_checkpoint_of_seeded_noise(tmp_path: Path):
    trainer = _trainer(tmp_path)
    seeded = {key: value for key, value in trainer._state().items() if key != "noise"}
    with pytest.raises(CheckpointError, match="drew its noise from seeded generators"):
        trainer._restore({**seeded, "sampler_rng": torch.get_rng_state()})
