"""The settings of a federated run, checked on construction so that a bad value fails before any owner trains."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from dpdistill.data.public import pool_size
from dpdistill.defaults import FEDERATED_DELTA, PUBLIC_POOL_SIZE
from dpdistill.errors import ConfigError, PrivacyParameterError
from dpdistill.federated.graph import GRAPHS
from dpdistill.federated.protocol import check_dropouts
from dpdistill.options import SEED_HELP, dataset_help, setting
from dpdistill.training.teacher import TeacherConfig

FEDERATED_METHODS = ("pate", "dpsd")
ENGINES = ("simulation", "deployment", "remote")
DEFAULT_MEMBERS = {"pate": 10, "dpsd": 1}  # teachers each owner trains on its own data (FedDPSD: one, as seed 000)
DEFAULT_QUERIES = 1000


# the settings only one route reads: set for the other, they would be silently ignored
METHOD_SETTINGS = {"dpsd": ("preset", "iterations", "beta", "top_k"),
                   "pate": ("queries", "public", "public_size", "answer_targets", "self_training_rounds", "epochs",
                            "min_steps")}


@dataclass(frozen=True)
class FederatedConfig:
    """A federation of `clients` data owners and the route that transcribes their teachers."""

    dataset: str = setting(help=dataset_help("the private data, divided among the owners"))
    clients: int = setting(help="M, the data owners (one Flower SuperNode each)")
    method: str = setting("pate", "pate: the owners' members vote on public images; dpsd: FedDPSD, their bounded "
                                  "gradients on synthetic images teach a student")
    epsilon: float | None = setting(None, "privacy budget (sound, replace-one)")
    delta: float = setting(FEDERATED_DELTA, "delta of (epsilon, delta)-DP (each owner answers only at its own)")
    dirichlet_alpha: float | None = setting(None, "owners' holdings: Dirichlet(A) per class [default: an even keyed "
                                                  "split]")
    dropouts: int = setting(0, "owners that may fail in a round; each owner's noise share grows so that the others' "
                               "sum keeps the planned noise")
    colluders: int = setting(1, "owners whose noise shares an adversary may know (each owner knows its own): the "
                                "shares are sized so the other owners' alone meet the budget")
    secagg_graph: str = setting("sparse", "secure aggregation's key-sharing graph: sparse (each owner shares keys "
                                          "with a few random neighbours; its failure bound is added to delta) or "
                                          "full (every owner with every other: no failure, minutes a round past "
                                          "150 owners)")
    accept_noise: bool = setting(False, "run even where the answers would be near random (refused by default)",
                                 show_default=False)
    engine: str = setting("simulation", "simulation (Flower's, one process), deployment (a SuperLink and M "
                                        "SuperNodes as processes on loopback) or remote (owners on their own "
                                        "machines: `dpdistill federated serve`)")
    address: str = setting("127.0.0.1:9092", "remote: HOST:PORT where the SuperLink listens for the owners (HOST "
                                             "named in the server's certificate)")
    certificates: str | None = setting(None, "remote: folder holding ca.crt, server.pem and server.key (TLS)")
    owner_wait: float = setting(600.0, "remote: seconds to wait for every owner to join")
    members_per_owner: int | None = setting(None, "teachers each owner trains on its data [default: 10 (pate), 1 "
                                                  "(dpsd)]")
    teacher_arch: str = "cnn"
    teacher_init: str | None = None  # as `train-teacher --init` (scatter: heads on scattering features)
    teacher_heads_only: bool = False
    teacher_epochs: int = 5
    teacher_lr: float = 1e-3
    teacher_weight_decay: float = 0.0
    teacher_min_steps: int = 0
    round_queries: int = 250  # query rows per secure-aggregation round
    stage_timeout: float = 120.0  # deployment: seconds the server waits for the owners' replies in a SecAgg+ stage
    # FedDPSD: the server's side, as `dpdistill transcribe` in data mode (None: the preset's)
    preset: str = "paper,federated"  # the transcription presets (methods/config.py): "paper,federated" is seed
    # 000's Algorithm 2 (Algorithm 1's settings with fresh latent vectors and no top-k)
    iterations: int | None = setting(None, "dpsd: T, one secure round each [default: 200]")
    beta: float | None = None
    top_k: int | None = None
    # PATE: the server's side, as `dpdistill pate`
    queries: int | None = setting(None, "public images the owners' teachers vote on [default: 1000, or the whole "
                                        "public pool if smaller]")
    public: str | None = None
    public_size: int | None = None  # None: PUBLIC_POOL_SIZE, or half the evaluation test split if that is smaller
    answer_targets: str = "argmax"
    self_training_rounds: int = 1
    student_arch: str = setting("datalens", "the student's architecture")
    epochs: int = 10
    min_steps: int = 1500
    batch_size: int | None = None  # PATE: the student's (128); FedDPSD: b, synthetic images a round
    lr: float | None = None  # the student's learning rate (None: PATE's default, or the FedDPSD preset's)
    seed: int = setting(0, SEED_HELP)
    device: str = setting("cpu", "cpu or cuda")

    def __post_init__(self) -> None:
        if self.epsilon is None:
            raise PrivacyParameterError("a privacy budget --epsilon is required")
        if self.method not in FEDERATED_METHODS:
            raise ConfigError(f"unknown federated method {self.method!r}; choose one of {', '.join(FEDERATED_METHODS)}")
        if self.secagg_graph not in GRAPHS:
            raise ConfigError(f"unknown secure-aggregation graph {self.secagg_graph!r}; choose one of "
                              f"{', '.join(GRAPHS)}")
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")
        check_dropouts(self.clients, self.dropouts, self.colluders)
        if self.dirichlet_alpha is not None and not self.dirichlet_alpha > 0:
            raise ConfigError(f"the Dirichlet concentration must be positive, got {self.dirichlet_alpha}")
        for name in ("members", "round_queries", "teacher_epochs"):
            value = self.members if name == "members" else getattr(self, name)
            if value < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be at least 1, got {value}")
        if not self.stage_timeout > 0 or not self.owner_wait > 0:
            raise ConfigError(f"stage-timeout and owner-wait must be positive, got {self.stage_timeout} and "
                              f"{self.owner_wait}")
        if self.engine == "remote":
            host_and_port(self.address)
            if self.certificates is None:
                raise ConfigError("owners on other machines are reached with TLS: give --certificates DIR (ca.crt, "
                                  "server.pem, server.key)")
            Certificates(Path(self.certificates))
        other = "dpsd" if self.method == "pate" else "pate"
        stray = [name for name in METHOD_SETTINGS[other] if getattr(self, name) != FIELD_DEFAULTS[name]]
        if stray:
            raise ConfigError(f"{', '.join(name.replace('_', '-') for name in stray)}: only the {other} route reads "
                              f"it, drop it with --method {self.method}")
        self.teacher_config()  # its own checks, now rather than after some owners trained
        if self.method == "pate":
            self.pate_config()
        else:
            self.transcription_config()

    @property
    def members(self) -> int:
        return self.members_per_owner or DEFAULT_MEMBERS[self.method]

    def teacher_config(self) -> TeacherConfig:
        """What each owner trains its teachers with (owners' side; in a real federation each owner's own choice)."""
        return TeacherConfig(arch=self.teacher_arch, epochs=self.teacher_epochs, lr=self.teacher_lr,
                             min_steps=self.teacher_min_steps, init=self.teacher_init,
                             heads_only=self.teacher_heads_only, weight_decay=self.teacher_weight_decay,
                             seed=self.seed, device=self.device)

    def pate_config(self, test_images: int | None = None) -> "PateConfig":
        """The server's PATE settings: which public images are asked, how the student learns from the answers.
        Unset sizes fit the evaluation set's `test_images` (a small data set keeps half its test split to measure
        accuracy on)."""
        from dpdistill.methods.pate import PateConfig

        pool = (self.public_size or PUBLIC_POOL_SIZE) if test_images is None else pool_size(self.public_size,
                                                                                            self.public, test_images)
        return PateConfig(epsilon=self.epsilon, delta=self.delta, dataset=self.dataset,
                          queries=self.queries or min(DEFAULT_QUERIES, pool), public=self.public, public_size=pool,
                          answer_targets=self.answer_targets,
                          self_training_rounds=self.self_training_rounds, student_arch=self.student_arch,
                          epochs=self.epochs, min_steps=self.min_steps, batch_size=self.batch_size or PateConfig.batch_size,
                          **({} if self.lr is None else {"lr": self.lr}), seed=self.seed, device=self.device)

    def transcription_config(self) -> "TranscriptionConfig":
        """FedDPSD's server settings: DPSD's data mode with the preset's loop, sound accounting, the noise
        calibrated for the owners' shares (federated/protocol.py), never a sigma of its own."""
        from dpdistill.methods.config import build_config

        overrides = {"method": "dpsd", "iterations": self.iterations, "batch_size": self.batch_size,
                     "top_k": self.top_k, "student_arch": self.student_arch, "student_lr": self.lr,
                     "seed": self.seed, "device": self.device}
        privacy = {"mode": "data", "epsilon": self.epsilon, "delta": self.delta, "beta": self.beta,
                   "accounting": "sound"}
        return build_config(self.preset, overrides, privacy)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "FederatedConfig":
        try:
            return cls(**values)
        except TypeError as error:
            raise ConfigError(f"the saved configuration does not describe a federated run ({error})") from error


@dataclass(frozen=True)
class Certificates:
    """A federation's TLS files, as Flower's SuperLink takes them: the certificate authority every party trusts,
    and the server's certificate (naming the host the owners reach) and private key."""

    directory: Path
    NAMES: ClassVar[tuple[str, str, str]] = ("ca.crt", "server.pem", "server.key")

    def __post_init__(self) -> None:
        missing = [name for name in self.NAMES if not (self.directory / name).is_file()]
        if missing:
            raise ConfigError(f"--certificates {self.directory} lacks {', '.join(missing)} (the federation's CA "
                              f"certificate, the server's certificate and its key)")

    @property
    def ca(self) -> Path:
        return (self.directory / self.NAMES[0]).resolve()

    def superlink_flags(self) -> list[str]:
        ca, certificate, key = (str((self.directory / name).resolve()) for name in self.NAMES)
        return ["--ssl-ca-certfile", ca, "--ssl-certfile", certificate, "--ssl-keyfile", key]


def host_and_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"address {address!r} is not HOST:PORT")
    return host, int(port)


FIELD_DEFAULTS = {field.name: field.default for field in dataclasses.fields(FederatedConfig)}
