"""Federated transcription on Flower: PATE across data owners (and FedDPSD, seed 000's Algorithm 2).

Several owners each hold private data and their own teachers; no party may see another's data or raw answers.
1. Owners: each trains its teachers on the examples it holds (federated/owners.py simulates the owners here).
2. Plan: the server fixes the queries (public images) and calibrates each owner's share of the noise so that the
   sum of at least `owners - dropouts` shares meets the budget (`DistributedDiscreteGaussianQuery`, RDP,
   replace-one, one example held by one owner).
3. Ask: round by round, the owners answer the queries through secure aggregation (federated/server_app.py,
   client_app.py): each owner's vote counts plus its discrete Gaussian share, masked; the server learns the sum,
   which it journals before the next round.
4. Learn: the student learns from the noisy sums exactly as PATE's does on one machine (methods/pate.py).
The engine is Flower's simulation in this process or a deployment of separate processes on loopback.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from dpdistill.atomic import write_atomically
from dpdistill.data import load_dataset
from dpdistill.data.base import ImageDataset
from dpdistill.data.public import PUBLIC_POOL, PublicSplit, public_split
from dpdistill.errors import ConfigError
from dpdistill.federated.config import FederatedConfig
from dpdistill.federated.engines import deploy, simulate
from dpdistill.federated.owners import check_owners, owner_directory
from dpdistill.federated.protocol import CLIP_TAIL, Encoding, Wire, query_cost
from dpdistill.federated.server_app import FederationPlan, RoundJournal
from dpdistill.methods.base import Job, Method, Needs, Outcome, Progress, Source
from dpdistill.methods.pate import (ANSWERS_FILE, COVERS, Answers, PateConfig, answer_accuracy, choose_queries,
                                   train_student)
from dpdistill.methods.teachers import classifier_meta
from dpdistill.privacy.accounting import DistributedDiscreteGaussianQuery, calibrate
from dpdistill.privacy.budget import SAME_UNDER_BOTH
from dpdistill.privacy.ledger import Release
from dpdistill.privacy.randomness import noise_source
from dpdistill.reporting.report import federated_markdown
from dpdistill.runs import release_state, saved_config

PLAN_FILE, QUERIES_FILE, ROUNDS_DIR = "plan.json", "queries.safetensors", "rounds"


class FederationError(ConfigError):
    """The federation stopped before every round was answered (what was released is kept)."""


class Federated(Method):
    name = "federated"
    summary = "data owners' teachers answer through secure aggregation with distributed noise (Flower)"
    needs = Needs.ENSEMBLE
    command = "federated"
    paper = ("PATE (Papernot et al. 2018) across data owners: SecAgg+ (Bell et al. 2020), distributed discrete "
             "Gaussian (Kairouz, Liu and Steinke 2021)")

    def plan(self, source: Source, config: FederatedConfig, out_dir: Path, progress: Progress | None) -> "FederatedJob":
        return FederatedJob(Path(source.teacher), config, out_dir, progress)

    def config_record(self, source: Source, config: FederatedConfig) -> dict[str, Any]:
        return {"owners": str(source.teacher), "federated": config.to_dict()}

    def interrupted(self, out_dir: Path) -> tuple[Source, FederatedConfig] | None:
        saved = saved_config(out_dir)
        if saved is None or "federated" not in saved or not (release_state(out_dir) / PLAN_FILE).exists():
            return None
        return Source(Path(saved["owners"])), FederatedConfig.from_dict(saved["federated"])

    def markdown(self, report: dict[str, Any]) -> str:
        return federated_markdown(report)


def plan_votes(config: FederatedConfig, queries: int, num_classes: int, in_shape: tuple[int, ...]
               ) -> tuple[Wire, DistributedDiscreteGaussianQuery]:
    """Each owner's noise share for `queries` vote histograms within the budget, and the wire that carries them:
    an owner's counts reach at most its member count, one example moves one vote (two counts by one)."""
    members, owners, dropouts = config.members, config.clients, config.dropouts
    template = Wire(num_classes, tuple(in_shape), 1.0, 2, float(members), math.sqrt(2))
    query = calibrate(lambda sigma: query_cost(dataclasses.replace(template, share_sigma=sigma), owners, dropouts),
                      queries, config.epsilon, config.delta)
    encoding = Encoding.for_answers(members, query.share_sigma, owners)
    return dataclasses.replace(template, share_sigma=query.share_sigma,
                               clipping_range=encoding.clipping_range), query


@dataclass(frozen=True)
class ServerPlan:
    """The server's side of a federated run, fixed before any owner trains: data set, public split, mechanism."""

    evaluation: ImageDataset
    pate: PateConfig
    split: PublicSplit
    wire: Wire
    query: DistributedDiscreteGaussianQuery

    @classmethod
    def of(cls, config: FederatedConfig) -> "ServerPlan":
        evaluation = load_dataset(config.dataset)
        pate = config.pate_config(len(evaluation.y_test))
        split = public_split(evaluation, pate.public, pate.pool_size)
        wire, query = plan_votes(config, pate.queries, evaluation.num_classes, evaluation.input_shape)
        return cls(evaluation, pate, split, wire, query)


class FederatedJob(Job):
    """Federated PATE, planned: the owners exist, the noise share is calibrated, nothing is asked yet."""

    def __init__(self, owners_root: Path, config: FederatedConfig, out_dir: Path, progress: Progress | None) -> None:
        check_owners(owners_root, config)
        self.owner_dirs = [owner_directory(owners_root, index) for index in range(config.clients)]
        server = ServerPlan.of(config)
        self.evaluation, self.pate, self.split, self.wire, self.query = (server.evaluation, server.pate, server.split,
                                                                         server.wire, server.query)
        self.config, self.progress = config, progress
        self.ledger_dir = owners_root
        self.planned = Release.of_query(self.query, self.pate.queries, config.delta)
        self.state_dir = release_state(out_dir)

    def _write_plan(self, split_pool: torch.Tensor) -> FederationPlan:
        """The queries and the plan the server runs from, kept before the first round."""
        indices = choose_queries(split_pool, self.pate)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tensors = {"images": split_pool[indices].contiguous(), "indices": indices.contiguous()}
        write_atomically({self.state_dir / QUERIES_FILE: lambda temporary: save_file(tensors, temporary)})
        # a simulated owner cannot vanish, and its stages queue on this machine's workers: wait for every reply
        timeout = self.config.stage_timeout if self.config.engine == "deployment" else None
        plan = FederationPlan(self.wire, self.config.clients, self.config.dropouts, self.config.round_queries,
                              str((self.state_dir / QUERIES_FILE).resolve()),
                              str((self.state_dir / ROUNDS_DIR).resolve()), timeout)
        plan.save(self.state_dir / PLAN_FILE)
        return plan

    def _federate(self, plan: FederationPlan, plan_path: Path, rows: int) -> dict[str, Any]:
        """Run the rounds not yet journaled on the chosen engine, reporting each journaled round as it lands."""
        started, finished = time.perf_counter(), threading.Event()
        watcher = threading.Thread(target=self._watch_rounds, args=(plan, rows, finished), daemon=True)
        watcher.start()
        try:
            if self.config.engine == "simulation":
                simulate(plan_path, self.owner_dirs)
                return {"engine": "simulation", "wall_seconds": time.perf_counter() - started}
            return {"engine": "deployment", **deploy(plan_path, self.owner_dirs, self.state_dir / "deployment")}
        finally:
            finished.set()
            watcher.join()

    def _watch_rounds(self, plan: FederationPlan, rows: int, finished: threading.Event) -> None:
        journal, total, reported = RoundJournal(Path(plan.journal_dir)), len(plan.rounds(rows)), -1
        while True:
            done = sum(journal.done(index) for index in range(total))
            if self.progress and done != reported:
                self.progress({"round": done, "total": total})
                reported = done
            if finished.wait(1.0):
                return

    def _answers(self, plan: FederationPlan, indices: torch.Tensor, federation: dict[str, Any]
                 ) -> tuple[Answers, list[int], list[int]]:
        """The released sums as PATE's answers (lost rounds left out: spent, unanswered), the owners that
        contributed to each, and the lost rounds; or a clean stop at the first round not asked."""
        journal = RoundJournal(Path(plan.journal_dir))
        rounds = plan.rounds(len(indices))
        sums, contributors, asked, lost = [], [], [], []
        for index, rows in enumerate(rounds):
            if journal.lost(index):
                lost.append(index + 1)
                continue
            kept = journal.read(index)
            if kept is None:
                failure = journal.failure() or {"round": index, "reason": self._stopped(federation)}
                where = (f"at round {failure['round'] + 1} of {len(rounds)}" if failure["round"] >= 0
                         else "before its first round")
                raise FederationError(
                    f"the federation stopped {where}: {failure['reason']}; the rounds before it are kept and the "
                    f"whole budget stays reserved: --resume continues once the owners are back")
            sums.append(kept[0])
            contributors.append(kept[1])
            asked.append(indices[rows])
        if not sums:
            raise FederationError(f"every one of the {len(rounds)} rounds was lost (owners failed during secure "
                                  f"aggregation): the budget is spent, nothing was learnt")
        votes = torch.cat(sums).float()
        answers = Answers(torch.cat(asked), votes, votes.argmax(1), torch.ones(len(votes), dtype=torch.bool))
        return answers, contributors, lost

    def _stopped(self, federation: dict[str, Any]) -> str:
        """Why a run without a recorded failure ended early: the server process itself."""
        if federation["engine"] == "deployment":
            return (f"the deployed run ended as {federation['status']} (the SuperLink's log: "
                    f"{self.state_dir / 'deployment' / 'logs' / 'superlink.log'})")
        return "the server stopped"

    def run(self, resume: bool) -> Outcome:
        config, started = self.config, time.perf_counter()
        num_classes = self.evaluation.num_classes
        split = self.split
        plan_path = self.state_dir / PLAN_FILE
        plan = FederationPlan.load(plan_path) if resume else self._write_plan(split.pool)
        indices = load_file(plan.queries_file)["indices"]
        federation = self._federate(plan, plan_path, len(indices))
        answers, contributors, lost = self._answers(plan, indices, federation)
        answers.save(self.state_dir / ANSWERS_FILE)
        release_seconds = time.perf_counter() - started
        sigma = self.wire.share_sigma * math.sqrt(min(contributors))  # the sums' noise, for posterior targets
        student_progress = None if self.progress is None else (
            lambda record: self.progress({**record, "total": self.pate.progress_total()}))
        student, history = train_student(split, answers, self.pate, num_classes, sigma, student_progress)
        privacy = {"epsilon": self.planned.epsilon, "delta": config.delta, "queries": self.pate.queries,
                   "accountant": "dp-accounting RDP of the distributed discrete Gaussian (Kairouz, Liu and Steinke "
                                 "2021)",
                   "aggregation": "each owner's members' vote counts plus its own discrete Gaussian share, summed "
                                  "by SecAgg+ (the server sees only the sum)",
                   "unit": "one private training example (held by one owner, it changes one member's vote)",
                   **SAME_UNDER_BOTH, "epsilon_replace_one": self.planned.epsilon,
                   "epsilon_add_remove": self.planned.epsilon, "epsilon_rdp": self.planned.epsilon,
                   "budget_epsilon": config.epsilon, "mode": "data", "owners": config.clients,
                   "dropouts": config.dropouts, "threshold": config.clients - config.dropouts,
                   "share_sigma": self.wire.share_sigma, "sigma_at_threshold": self.query.total_sigma,
                   "noise_multiplier": self.query.noise_multiplier, "clipping_range": self.wire.clipping_range,
                   "clip_probability_bound": CLIP_TAIL,
                   "noise": noise_source().description}
        report = {"dataset": config.dataset, "public": split.description,
                  "federation": {**federation, "owners": [str(path) for path in self.owner_dirs],
                                 "rounds": len(contributors), "contributors": contributors,
                                 "lost_rounds": lost},
                  "accuracy": {"student": history[-1]["test_accuracy"],
                               "answers": answer_accuracy(answers, split.pool_labels)},
                  "timing": {"wall_seconds": time.perf_counter() - started, "release_seconds": release_seconds},
                  "history": history, "resumed": resume}
        answers_path = self.state_dir / ANSWERS_FILE

        def write_files(out_dir: Path, _report: dict[str, Any]) -> None:
            shutil.copyfile(answers_path, out_dir / ANSWERS_FILE)

        meta = classifier_meta(self.pate.student_arch, self.evaluation.input_shape, num_classes, config.dataset)
        return Outcome(report=report, privacy=privacy, covers=COVERS,
                       models={"student": (student, {**meta, PUBLIC_POOL: dataclasses.asdict(split.source)})},
                       private_record=lambda: {"owners": [json.loads((path / "report.json").read_text())["accuracy"]
                                                          for path in self.owner_dirs
                                                          if (path / "report.json").exists()]},
                       release=self.planned, write_files=write_files)
