"""DataLens training: every sample asked is one charged query and one secret noise draw per coordinate, the
teachers never leave the private folder, and a run resumes from its checkpoint without exceeding its plan."""

from pathlib import Path

import pytest
import torch

from dpdistill.data import load_dataset
from dpdistill.data.partition import partition_indices
from dpdistill.privacy.randomness import SecureNoise
from dpdistill.training.datalens import DataLensConfig, DataLensTrainer, plan_datalens

SMALL = dict(dataset="digits", epsilon=5.0, teachers=8, top_k=10, batch_size=6, teacher_batch=4, teacher_warmup=2,
             generator_hidden=32, generator_width=8, discriminator_hidden=(8,), checkpoint_every=3)


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
    trainer = DataLensTrainer(config, load_dataset("digits"), plan, tmp_path, noise=noise)
    trainer.run()
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
