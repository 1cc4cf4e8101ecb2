"""A generator trained data-free against a fixed classifier (DAFL, as DGD's generative stream trains it).

The classifier is the only thing the generator learns from: its images are those the classifier labels
confidently, balanced over the classes, that excite its features strongly (losses/generator.py). Whatever the
classifier learnt from, the generator can carry: trained against a classifier fitted to private data without
noise, the generator and every image it makes have no formal guarantee (methods/dgd.py says so in its report).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from dpdistill.errors import ConfigError
from dpdistill.losses.generator import FeatureStatistics, data_free_terms
from dpdistill.models.base import Classifier
from dpdistill.models.generator import Generator
from dpdistill.models.registry import build_generator
from dpdistill.progress import Progress

GENERATION_BATCH = 1000
GENERATOR_PHASE = "generator"  # a progress display's name for training the generator
IMAGES_PHASE = "images"  # ... and for making the synthetic images with it


@dataclass(frozen=True)
class DataFreeConfig:
    """DGD's generator settings (seed 004: 200 "iteration rounds" of batch 128, Adam at 0.2 decayed tenfold every
    80 rounds; a round is read as an optimizer step, the decay at 40% and 80% of them)."""

    steps: int = 200
    batch_size: int = 128
    lr: float = 0.2
    latent_dim: int = 100
    width: tuple[int, int, int] = (64, 32, 16)
    one_hot_weight: float = 1.0
    entropy_weight: float = 5.0
    activation_weight: float = 0.1
    activation_norm: int = 1  # DGD's L1 activation term (DPSD and DPDFD use L2)
    final_batchnorm: bool = True  # DAFL's last layer, BatchNorm without affine terms (the seed names no architecture)
    batchnorm_weight: float = 0.0  # a departure from the seed: DeepInversion's match of the classifier's BatchNorm
    # statistics, which makes images the baseline's layers see as they see real ones

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "latent_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"generator {name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ConfigError(f"the generator's lr must be positive, got {self.lr}")
        if len(self.width) != 3 or min(self.width) < 1:
            raise ConfigError(f"generator width needs three positive channel counts, got {self.width}")
        if self.activation_norm not in (1, 2):
            raise ConfigError(f"generator activation-norm must be 1 or 2, got {self.activation_norm}")
        if self.batchnorm_weight < 0:
            raise ConfigError(f"generator batchnorm-weight must not be negative, got {self.batchnorm_weight}")

    def build(self, out_shape: tuple[int, int, int]) -> Generator:
        """A fresh generator of these settings."""
        return build_generator(self.latent_dim, out_shape, self.width, self.final_batchnorm)

    def decay_steps(self) -> list[int]:
        return [max(1, round(self.steps * fraction)) for fraction in (0.4, 0.8)]


def check_batchnorm_term(classifier: Classifier, config: DataFreeConfig, name: str = "the generator's classifier",
                         way_out: str = "set the generator's batchnorm-weight to 0") -> None:
    """The BatchNorm term matches the classifier's BatchNorm statistics: refused where it has none (a caller
    checks before it writes anything, naming the classifier and the way out in its own options)."""
    if config.batchnorm_weight > 0 and not FeatureStatistics.of_batchnorm(classifier).layers:
        raise ConfigError(f"{name} has no BatchNorm layers, whose statistics the generator's batchnorm-weight term "
                          f"matches: {way_out}")


def train_data_free_generator(classifier: Classifier, out_shape: tuple[int, int, int], config: DataFreeConfig,
                              seed: int, device: str, progress: Progress | None = None
                              ) -> tuple[Generator, dict]:
    """A generator fitted to `classifier` (fixed, eval mode) with fresh latents each step; its report gives the
    final loss terms and the wall time."""
    if not (hasattr(classifier, "features") and hasattr(classifier, "classify")):
        raise ConfigError("the generator's classifier must expose its features (a dpdistill classifier): an imported "
                          "model without them cannot drive the activation term")
    check_batchnorm_term(classifier, config)
    statistics = FeatureStatistics.of_batchnorm(classifier, enabled=config.batchnorm_weight > 0)
    torch.manual_seed(seed)
    generator = config.build(out_shape).to(device)
    classifier = classifier.to(device).eval().requires_grad_(False)
    optimizer = torch.optim.Adam(generator.parameters(), lr=config.lr)
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, config.decay_steps(), gamma=0.1)
    started, terms = time.perf_counter(), {}
    generator.train()
    for step in range(1, config.steps + 1):
        images = generator(torch.randn(config.batch_size, config.latent_dim, device=device))
        with statistics:
            features = classifier.features(images)
        terms = data_free_terms(classifier.classify(features), features, config.one_hot_weight,
                                config.entropy_weight, config.activation_weight, config.activation_norm)
        if config.batchnorm_weight > 0:
            terms["batchnorm"] = config.batchnorm_weight * statistics.loss()
        loss = sum(terms.values())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if progress:  # every step, so a display never sits still; the loss (a device sync, a logged line) now and then
            shown = {"loss": loss.item()} if step % 100 == 0 or step == config.steps else {}
            progress({"phase": GENERATOR_PHASE, "done": step, "total": config.steps, **shown})
    return generator.eval().requires_grad_(False), {
        "terms": {name: value.item() for name, value in terms.items()},
        "wall_seconds": time.perf_counter() - started}


@torch.inference_mode()
def generate(generator: Generator, count: int, seed: int, device: str, progress: Progress | None = None) -> Tensor:
    """`count` images (CPU) from latents drawn with `seed`: the same generator and seed give the same images; a
    display counts them (DGD's 60,000 take minutes on a CPU)."""
    latents = torch.randn(count, generator.latent_dim, generator=torch.Generator().manual_seed(seed))
    images = []
    for batch in latents.split(GENERATION_BATCH):
        images.append(generator(batch.to(device)).cpu())
        if progress:
            progress({"phase": IMAGES_PHASE, "done": sum(map(len, images)), "total": count})
    return torch.cat(images)
