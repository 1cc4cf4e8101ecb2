"""Non-private supervised training: this produces the private model that dpdistill later converts."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from dpdistill.data.augment import shift_and_flip
from dpdistill.data.base import ImageDataset
from dpdistill.errors import ConfigError
from dpdistill.evaluation.metrics import accuracy
from dpdistill.models.base import Classifier
from dpdistill.models.checkpoint import ENCODER, load_classifier
from dpdistill.models.registry import build_classifier
from dpdistill.progress import Pace, Progress, with_total
from dpdistill.training.state import STATE_SKELETON, Checkpoints, load_state, save_state


SCATTER_INIT = "scatter"  # --init value: heads on the fixed scattering transform, no encoder and no public images
SCATTER_ARCH = "scatter-linear"  # the model whose (parameter-free) backbone gives those features


@dataclass(frozen=True)
class TeacherConfig:
    arch: str = "cnn"
    epochs: int = 5
    batch_size: int = 128
    lr: float = 1e-3
    min_steps: int = 0  # at least this many optimizer steps: a small partition gets more epochs
    augment_shift: int = 0  # translate each training batch by up to this many pixels (a few hundred labels
    # go further; 0: off)
    init: str | None = None  # start from this encoder's weights (`dpdistill pretrain`), not random ones; with
    # heads_only, SCATTER_INIT: the members sit on scattering features
    heads_only: bool = False  # an ensemble's members are linear heads on the frozen encoder `init` (train_heads)
    weight_decay: float = 0.0
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.heads_only and self.init is None:
            raise ConfigError("heads-only members sit on frozen features: give a pretrained encoder with --init "
                              "(`dpdistill pretrain` makes it), or --init scatter for scattering features")
        if self.init == SCATTER_INIT:
            if not self.heads_only:
                raise ConfigError("--init scatter makes members linear heads on scattering features: add "
                                  "--heads-only (or train whole members with --arch scatter-cnn)")
            object.__setattr__(self, "arch", SCATTER_ARCH)  # frozen: the features' model is what is saved
        if self.heads_only and self.augment_shift:
            raise ConfigError("heads-only members learn from the features of the training images as they are "
                              "(computed once): drop --augment-shift")
        if self.weight_decay < 0:
            raise ConfigError(f"weight-decay must be at least 0, got {self.weight_decay}")

    @property
    def full_batch_steps(self) -> int:
        """Optimizer steps of full-batch training (heads): max(epochs, min_steps), one step an epoch."""
        return max(self.epochs, self.min_steps)


SCHEDULES = ("cosine", "linear")  # how a classifier's learning rate decays to zero over its steps


def fresh_classifier(arch: str, in_shape: tuple[int, ...], num_classes: int, lr: float, total_steps: int,
                     seed: int, device: torch.device, init: str | None = None, schedule: str = "cosine"
                     ) -> tuple[Classifier, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """A seeded new classifier (random, or a copy of the pretrained encoder at `init`) with Adam, its learning
    rate decayed to zero over `total_steps` by a cosine (the recipe of every supervised and semi-supervised
    training here) or linearly (DGD's student)."""
    torch.manual_seed(seed)
    model = build_classifier(arch, in_shape, num_classes)
    if init is not None:
        model.load_state_dict(load_encoder(Path(init), arch, in_shape, num_classes).state_dict())
    model = model.to(device)
    optimizer, cosine = _adam_with_cosine(list(model.parameters()), lr, 0.0, total_steps)
    if schedule == "linear":
        return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / total_steps)
    return model, optimizer, cosine


def _adam_with_cosine(parameters: list[torch.Tensor], lr: float, weight_decay: float, total_steps: int
                      ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    optimizer = torch.optim.Adam(parameters, lr=lr, weight_decay=weight_decay)
    return optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)


def train_heads(features: Tensor, labels: Tensor, parts: list[Tensor], num_classes: int, config: TeacherConfig,
                progress: Progress | None = None) -> tuple[Tensor, Tensor, dict]:
    """One linear head per partition on frozen `features` (N, F), all trained at once: weight (M, F, classes)
    and bias (M, classes), with the report's loss history and wall time.

    Full-batch Adam with cosine decay for max(epochs, min_steps) steps. The loss is the sum over heads of each
    head's mean cross-entropy on its own partition (padding masked out), and Adam works weight by weight, so a
    head's training reads its partition only: one example changes one head, as with separate members."""
    device = torch.device(config.device)
    order, groups = _padded_groups(features, labels, parts, device)
    # Heads live in `order` (grouped by partition size), so a group's heads are one slice of the weights.
    weight = torch.zeros(len(parts), features.shape[1], num_classes, device=device, requires_grad=True)
    bias = torch.zeros(len(parts), num_classes, device=device, requires_grad=True)
    steps = config.full_batch_steps
    optimizer, schedule = _adam_with_cosine([weight, bias], config.lr, config.weight_decay, steps)
    started, history = time.perf_counter(), []
    pace = Pace(with_total(progress, steps))  # a hundred heads' step takes seconds: their position, every second
    for step in range(1, steps + 1):
        loss = torch.zeros((), device=device)
        for first, inputs, targets, present, counts in groups:
            heads = slice(first, first + len(inputs))
            logits = torch.baddbmm(bias[heads, None], inputs, weight[heads])
            losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(present)
            loss = loss + ((losses * present).sum(1) / counts).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 50 == 0 or step == steps:
            history.append({"step": step, "loss": loss.item() / len(parts)})
            pace(history[-1])
        else:
            pace.within({"step": step})
    back = torch.argsort(order).to(device)  # from grouped order back to the partitions' order
    return (weight.detach()[back], bias.detach()[back],
            {"history": history, "wall_seconds": time.perf_counter() - started})


def _padded_groups(features: Tensor, labels: Tensor, parts: list[Tensor], device: torch.device
                   ) -> tuple[Tensor, list[tuple[int, Tensor, Tensor, Tensor, Tensor]]]:
    """The partitions ordered by size (`order`), and their features in consecutive groups, each padded to its
    own largest partition: (first position in `order`, inputs (g, L, F), targets (g, L), present (g, L), counts
    (g,), each head's number of examples, at least 1). A group closes before padding would double its cells, so
    equal (IID) partitions make one group and unequal (Dirichlet) ones pad little, where padding all to the
    overall largest could need gigabytes."""
    sizes = [max(1, len(part)) for part in parts]
    order = sorted(range(len(parts)), key=sizes.__getitem__)
    bounds, cells = [0], 0
    for position, member in enumerate(order):
        cells += sizes[member]
        if sizes[member] * (position - bounds[-1] + 1) > 2 * cells:  # this head would double the padding
            bounds.append(position)
            cells = sizes[member]
    bounds.append(len(parts))
    groups = []
    for first, stop in zip(bounds, bounds[1:]):
        members = order[first:stop]
        index = torch.zeros(len(members), sizes[members[-1]], dtype=torch.long)
        present = torch.zeros(len(members), sizes[members[-1]], dtype=torch.bool)
        for row, member in enumerate(members):
            index[row, :len(parts[member])], present[row, :len(parts[member])] = parts[member], True
        groups.append((first, features[index].to(device), labels[index].to(device), present.to(device),
                       present.sum(1).clamp(min=1).to(device)))
    return torch.tensor(order), groups


def load_encoder(directory: Path, arch: str, in_shape: tuple[int, ...], num_classes: int,
                 public_pool: str | None = None) -> Classifier:
    """The pretrained encoder at `directory`, refused unless it is the architecture about to be trained and, where
    a run measures accuracy beside a `public_pool` (its description), was pretrained on exactly that pool: on any
    other, the images accuracy is measured on may be ones the encoder saw."""
    encoder, meta = load_classifier(directory, ENCODER, kind="encoder")
    found = (meta["arch"], tuple(meta["in_shape"]), int(meta["num_classes"]))
    if found != (arch, tuple(in_shape), num_classes):
        raise ConfigError(f"the encoder at {directory} is {found[0]!r} for inputs {found[1]} and {found[2]} classes; "
                          f"this training needs {arch!r} for {tuple(in_shape)} and {num_classes}: pretrain one "
                          f"with `dpdistill pretrain --arch {arch}` on images of that shape")
    if public_pool is not None and meta.get("pretrained_on") != public_pool:
        raise ConfigError(f"the encoder at {directory} was pretrained on {meta.get('pretrained_on')!r}, this run's "
                          f"public pool is {public_pool!r}: pretrain on this pool (`dpdistill pretrain` with the same "
                          f"--public and --public-size), so accuracy is measured on images the encoder never saw")
    return encoder


def train_classifier(dataset: ImageDataset, config: TeacherConfig, progress: Progress | None = None,
                     evaluate_each_epoch: bool = True, targets: Tensor | None = None,
                     state_dir: Path | None = None) -> tuple[Classifier, dict]:
    """Train `config.arch` on the training split (Adam, cosine learning-rate decay); report test accuracy per epoch
    (or, without `evaluate_each_epoch`, after the last one only: an ensemble's many small members). `targets`
    (N, classes), class probabilities, replace the training labels where soft targets are known. With
    `state_dir`, the training is saved there at least every CHECKPOINT_SECONDS, between two batches, and continues
    from there when it was stopped: the model it would have trained without a stop (epochs on 60,000 images take
    minutes)."""
    expected = (len(dataset.y_train), dataset.num_classes)
    if targets is not None and tuple(targets.shape) != expected:
        raise ConfigError(f"soft targets must be (training images, classes) = {expected}, got "
                          f"{tuple(targets.shape)}")
    labels = dataset.y_train if targets is None else targets
    device = torch.device(config.device)
    steps_per_epoch = -(-len(dataset.x_train) // config.batch_size)
    epochs = max(config.epochs, -(-config.min_steps // steps_per_epoch))
    model, optimizer, schedule = fresh_classifier(config.arch, dataset.input_shape, dataset.num_classes, config.lr,
                                                  epochs * steps_per_epoch, config.seed, device, config.init)
    order_generator = torch.Generator().manual_seed(config.seed)
    started = time.perf_counter()
    epoch, first, total_loss, history = 1, 0, 0.0, []
    if state_dir is not None and (state_dir / STATE_SKELETON).exists():
        saved = load_state(state_dir)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        order_generator.set_state(saved["order"])
        torch.set_rng_state(saved["torch_rng"])
        epoch, first, total_loss, history = saved["epoch"], saved["batch"], saved["loss"], saved["history"]
    pace = Pace(progress)  # a long epoch (60,000 images) reports how far into it the run is
    checkpoints = Checkpoints()
    while epoch <= epochs:
        model.train()
        epoch_order = order_generator.get_state()  # what a resumed run draws this epoch's order from again
        order = torch.randperm(len(dataset.x_train), generator=order_generator)
        for start in range(first, len(order), config.batch_size):
            pace.within({"epoch": round(epoch - 1 + start / len(order), 2), "total": epochs})
            index = order[start:start + config.batch_size]
            images = dataset.x_train[index].to(device)
            if config.augment_shift:
                images = shift_and_flip(images, config.augment_shift, flip=False)
            loss = F.cross_entropy(model(images), labels[index].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total_loss += loss.item() * len(index)
            if state_dir is not None:
                checkpoints(start, lambda: save_state(state_dir, {
                    "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict(), "order": epoch_order, "torch_rng": torch.get_rng_state(),
                    "epoch": epoch, "batch": start + config.batch_size, "loss": total_loss, "history": history}))
        record = {"epoch": epoch, "train_loss": total_loss / len(order)}
        if evaluate_each_epoch or epoch == epochs:
            record["test_accuracy"] = accuracy(model, dataset.x_test, dataset.y_test, device=device)
        history.append(record)
        pace({**record, "total": epochs})
        epoch, first, total_loss = epoch + 1, 0, 0.0
    report = {"test_accuracy": history[-1]["test_accuracy"], "history": history,
              "wall_seconds": time.perf_counter() - started}
    return model.eval(), report
