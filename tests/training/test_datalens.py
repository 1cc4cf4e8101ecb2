"""DataLens training: every sample asked is one charged query and one secret noise draw per coordinate, the
teachers never leave the private folder, and a run resumes from its checkpoint without exceeding its plan."""

import math
import re
from pathlib import Path

import dp_accounting
import pytest
import torch

from dpdistill.data import load_dataset
from dpdistill.data.partition import partition_indices
from dpdistill.errors import ConfigError
from dpdistill.privacy.randomness import SecureNoise
from dpdistill.training.datalens import DataLensConfig, DataLensTrainer, plan_datalens

SMALL = dict(dataset="digits", epsilon=5.0, teachers=8, top_k=10, batch_size=6, teacher_batch=4, teacher_warmup=2,
             generator_hidden=32, generator_width=8, discriminator_width=4, discriminator_hidden=8,
             checkpoint_every=3)


class CountingNoise(SecureNoise):
    """Secure noise that counts its Gaussian draws."""

    def __init__(self) -> None:
        super().__init__()
        self.drawn = 0

    def normal(self, shape, std, device="cpu"):
        self.drawn += int(torch.Size(shape).numel())
        return super().normal(shape, std, device)


def test_every_sample_is_one_charged_query_with_secret_noise_on_each_pixel(tmp_path: Path):
    config = DataLensConfig(**SMALL, steps=5, sigma=None)
    plan = plan_datalens(config)
    noise = CountingNoise()
    records: list[dict] = []
    trainer = DataLensTrainer(config, load_dataset("digits"), plan, tmp_path, progress=records.append, noise=noise)
    trainer.run()
    # a record after each teacher step too: a step of thousands of teachers takes seconds on a CPU
    assert [(record["step"], record.get("teacher_step")) for record in records] == [
        (0, 1), (0, 2), *[pair for step in range(1, 6) for pair in ((step - 1, 1), (step - 1, 2), (step, None))]]
    assert trainer.ledger.answered == plan.queries == 30
    assert noise.drawn == plan.queries * 64
    assert plan.epsilon(config.delta) <= config.epsilon


def test_one_example_belongs_to_one_teacher_whatever_the_others(tmp_path: Path):
    config = DataLensConfig(**SMALL, steps=1, sigma=None)
    trainer = DataLensTrainer(config, load_dataset("digits"), plan_datalens(config), tmp_path)
    parts = partition_indices(trainer.dataset.ids_train, config.teachers, trainer.partition_key)
    fewer = partition_indices(trainer.dataset.ids_train[1:], config.teachers, trainer.partition_key)
    moved = sum(set(trainer.dataset.ids_train[part].tolist()) != set(trainer.dataset.ids_train[1:][other].tolist())
                for part, other in zip(parts, fewer))
    assert moved == 1
    sizes = trainer.part_sizes.tolist()
    assert sum(sizes) == len(trainer.dataset.y_train)


def test_a_resumed_run_continues_from_its_checkpoint_within_its_plan(tmp_path: Path):
    config = DataLensConfig(**SMALL, steps=7, sigma=None)
    plan = plan_datalens(config)
    dataset = load_dataset("digits")

    def stop_after_checkpoint(record: dict) -> None:
        if record["step"] == 5:  # checkpointed at 3
            raise KeyboardInterrupt

    first = DataLensTrainer(config, dataset, plan, tmp_path, progress=stop_after_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        first.run()
    assert (tmp_path / "state.json").exists()
    second = DataLensTrainer(config, dataset, plan, tmp_path)
    second.run(resume=True)
    assert second.history[-1]["step"] == 7 and second.step_index == 7 and second.ledger.answered == plan.queries
    assert second.partition_key == first.partition_key


def test_a_teacher_step_reads_each_teachers_own_partition_only(tmp_path: Path):
    """Changing one partition's images changes that teacher's weights after a step, and no other teacher's."""
    config = DataLensConfig(**SMALL, steps=1, sigma=None)
    trainer = DataLensTrainer(config, load_dataset("digits"), plan_datalens(config), tmp_path)
    start = {name: value.clone() for name, value in trainer.teachers.state_dict().items()}
    coins, seed = trainer.coins.get_state(), torch.get_rng_state()

    def step_from_start(images: torch.Tensor) -> list[torch.Tensor]:
        trainer.teachers.load_state_dict(start)
        trainer.teacher_optimizer.state.clear()
        trainer.coins.set_state(coins)
        torch.set_rng_state(seed)
        trainer.part_images = images
        trainer._teacher_step()
        return [parameter.detach().reshape(config.teachers, -1).clone() for parameter in trainer.teachers.parameters()]

    original = trainer.part_images.clone()
    changed = original.clone()
    changed[3] = torch.rand_like(changed[3])
    before, after = step_from_start(original), step_from_start(changed)
    for first, second in zip(before, after):
        for teacher in range(config.teachers):
            if teacher != 3:
                assert torch.equal(first[teacher], second[teacher])
    assert any(not torch.equal(first[3], second[3]) for first, second in zip(before, after))


def test_the_control_draws_no_noise_and_guarantees_nothing(tmp_path: Path):
    config = DataLensConfig(**{**SMALL, "epsilon": math.inf}, steps=2, sigma=0.0)
    plan = plan_datalens(config)
    noise = CountingNoise()
    trainer = DataLensTrainer(config, load_dataset("digits"), plan, tmp_path, noise=noise)
    trainer.run()
    assert noise.drawn == 0 and trainer.ledger.answered == plan.queries
    assert plan.epsilon(config.delta) == math.inf
    assert isinstance(plan.release_event(), dp_accounting.NonPrivateDpEvent)
    assert plan.summary(config.delta)["accountant"] == "none: no noise"


@pytest.mark.parametrize("changes, message", [
    ({"sigma": 0.0, "steps": 3}, "no --epsilon"),
    ({"sigma": 0.0, "epsilon": math.inf}, "needs --steps"),
    ({"teacher_batch": 1}, "at least 2 (batch norm"),
    ({"sigma": -1.0}, "non-negative"),
])
def test_bad_settings_are_one_line_errors(changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        DataLensConfig(**{**SMALL, **changes})


def test_the_presets_hold_the_official_settings_and_the_cpu_budget():
    from dpdistill.methods.datalens import build_datalens_config

    ten = build_datalens_config("paper", {"dataset": "fmnist", "epsilon": 10.0})
    assert (ten.teachers, ten.top_k, ten.sigma, ten.threshold, ten.latent_dim, ten.batch_size) == (
        4000, 350, 1000.0, 0.27, 64, 15)
    one = build_datalens_config("paper", {"dataset": "fmnist", "epsilon": 1.0})
    assert (one.top_k, one.sigma, one.threshold, one.latent_dim) == (200, 5000.0, 0.7, 50)
    assert plan_datalens(ten).steps == 190 and plan_datalens(one).steps == 149
    cpu = build_datalens_config("cpu", {"dataset": "fmnist", "epsilon": 10.0})
    cpu_plan = plan_datalens(cpu)
    assert cpu_plan.steps == 150 and cpu_plan.epsilon(cpu.delta) <= 10 and 0.2 < cpu_plan.sigma / cpu.teachers < 0.3
    control = build_datalens_config("control", {"dataset": "fmnist"})
    assert control.sigma == 0 and control.epsilon == math.inf and control.teachers == 10
    assert plan_datalens(control).query is None
    # the epsilon-10 paper preset without its noise: the same steps and vote settings
    assert plan_datalens(control).steps == plan_datalens(ten).steps
    assert (control.top_k, control.threshold, control.latent_dim, control.batch_size) == (
        ten.top_k, ten.threshold, ten.latent_dim, ten.batch_size)
