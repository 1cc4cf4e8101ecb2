"""Federated transcription on Flower: PATE across data owners, and FedDPSD (seed 000's Algorithm 2).

Several owners each hold private data and their own teachers; no party may see another's data or raw answers.
1. Owners: each trains its teachers on the examples it holds (federated/owners.py simulates the owners here).
2. Plan: the server fixes what it will ask (PATE: public images; FedDPSD: T iterations of b synthetic images) and
   calibrates each owner's share of the noise so that the sum of at least `owners - dropouts` shares meets the
   budget (`DistributedDiscreteGaussianQuery`, RDP, replace-one, one example held by one owner).
3. Ask: round by round, the owners answer through secure aggregation (federated/server_app.py, client_app.py):
   each owner's vote counts (PATE) or bounded distillation gradients on an integer grid (FedDPSD) plus its
   discrete Gaussian share, masked; the server learns the sum, which it journals before the next round.
4. Learn: PATE's student learns from the noisy sums exactly as on one machine (methods/pate.py); FedDPSD's
   student and generator learn inside the DPSD engine as the rounds come (federated/transcription.py).
The engine is Flower's simulation in this process or a deployment of separate processes on loopback.
"""

from __future__ import annotations

import dataclasses
import json
import math
import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from dpdistill.atomic import write_atomically
from dpdistill.data import load_dataset
from dpdistill.data.base import ImageDataset
from dpdistill.data.public import PUBLIC_POOL, PublicSplit
from dpdistill.errors import ConfigError
from dpdistill.federated.config import Certificates, FederatedConfig
from dpdistill.federated.engines import deploy, serve, simulate
from dpdistill.federated.graph import SecAggGraph, plan_graph
from dpdistill.federated.owners import check_owners, owner_directory, prepare_owners
from dpdistill.federated.protocol import (CLIP_TAIL, GRID_STEPS, Encoding, GradientAnswer, RunTerms, Wire,
                                          answer_wire, query_cost, refusal)
from dpdistill.federated.server_app import FederationPlan, RoundJournal
from dpdistill.federated.transcription import read_result
from dpdistill.methods.base import Job, Method, Needs, Outcome, Source, data_read
from dpdistill.methods.lifecycle import execute
from dpdistill.methods.config import TranscriptionConfig
from dpdistill.methods.engine import check_remote_settings
from dpdistill.methods.pate import (ANSWERS_FILE, COVERS, Answers, PateConfig, answer_accuracy, choose_queries,
                                   train_student)
from dpdistill.methods.teachers import classifier_meta
from dpdistill.methods.transcription import COVERS as TRANSCRIPTION_COVERS, transcription_release
from dpdistill.privacy.accounting import DistributedDiscreteGaussianQuery, calibrate, paper_epsilon_dpsd_data
from dpdistill.privacy.budget import SAME_UNDER_BOTH
from dpdistill.privacy import preflight
from dpdistill.privacy.preflight import gradient_advice, vote_advice
from dpdistill.options import (OVERWRITE_OPTION, CommandSpec, Option, field_options, out_option, resume_option,
                               set_option)
from dpdistill.privacy.ledger import Budget, Release, ReleaseLedger
from dpdistill.privacy.randomness import noise_source
from dpdistill.progress import Progress, with_total
from dpdistill.reporting.federated import federated_markdown
from dpdistill.runs import claim_out_dir, release_state, saved_config

PLAN_FILE, QUERIES_FILE, ROUNDS_DIR = "plan.json", "queries.safetensors", "rounds"
AGGREGATION = {"pate": "each owner's members' vote counts plus its own discrete Gaussian share, summed by SecAgg+ "
                       "(the server sees only the sum)",
               "dpsd": "each owner's members' bounded distillation gradients on an integer grid plus its own discrete "
                       "Gaussian share, summed by SecAgg+ (the server sees only the sum)"}


class FederationError(ConfigError):
    """The federation stopped before every round was answered (what was released is kept)."""


class Federated(Method):
    name = "federated"
    summary = "data owners' teachers answer through secure aggregation with distributed noise (Flower)"
    needs = Needs.ENSEMBLE
    command = "federated"
    paper = ("PATE (Papernot et al. 2018) and FedDPSD (seed 000, Algorithm 2) across data owners: SecAgg+ (Bell "
             "et al. 2020), distributed discrete Gaussian (Kairouz, Liu and Steinke 2021)")

    def plan(self, source: Source, config: FederatedConfig, out_dir: Path, progress: Progress | None) -> "FederatedJob":
        return FederatedJob(None if source.teacher is None else Path(source.teacher), config, out_dir, progress)

    def config_record(self, source: Source, config: FederatedConfig) -> dict[str, Any]:
        return {"owners": None if source.teacher is None else str(source.teacher), "federated": config.to_dict()}

    def interrupted(self, out_dir: Path) -> tuple[Source, FederatedConfig] | None:
        saved = saved_config(out_dir)
        if saved is None or "federated" not in saved or not (release_state(out_dir) / PLAN_FILE).exists():
            return None
        owners = saved["owners"]
        return Source(None if owners is None else Path(owners)), FederatedConfig.from_dict(saved["federated"])

    def markdown(self, report: dict[str, Any]) -> str:
        return federated_markdown(report)


def calibrated_wire(config: FederatedConfig, template: Wire, queries: int, failure: float
                    ) -> tuple[Wire, DistributedDiscreteGaussianQuery]:
    """Each owner's noise share for `queries` answers of the `template`'s form within the budget (at delta less
    the graph's `failure`), and the wire that carries them (its integer encoding sized for answers up to the row
    bound plus the noise)."""
    owners, dropouts, colluders = config.clients, config.dropouts, config.colluders
    query = calibrate(lambda sigma: query_cost(dataclasses.replace(template, share_sigma=sigma), owners, dropouts,
                                               colluders), queries, config.epsilon, config.delta - failure)
    encoding = Encoding.for_answers(template.row_bound, query.share_sigma, owners)
    return dataclasses.replace(template, share_sigma=query.share_sigma,
                               clipping_range=encoding.clipping_range), query


def vote_wire(config: FederatedConfig, num_classes: int, in_shape: tuple[int, ...]) -> Wire:
    """PATE's answers: an owner's counts reach at most its member count, one example moves one vote (two counts by
    one)."""
    return answer_wire(num_classes, in_shape, config.members)


def gradient_wire(config: FederatedConfig, transcription: TranscriptionConfig, num_classes: int,
                  in_shape: tuple[int, ...]) -> Wire:
    """FedDPSD's answers: the sum of an owner's members' gradients, each of norm at most GRID_STEPS grid units."""
    answer = GradientAnswer(transcription.distill_loss, transcription.dkd_alpha, transcription.dkd_beta,
                            transcription.temperature, transcription.top_k, transcription.gradient_operation,
                            transcription.output_space)
    return answer_wire(num_classes, in_shape, config.members, answer)


@dataclass(frozen=True)
class ServerPlan:
    """The server's side of a federated run, fixed before any owner trains: data set, what is asked, mechanism."""

    evaluation: ImageDataset
    wire: Wire
    query: DistributedDiscreteGaussianQuery
    queries: int  # answers (query rows) the run asks for
    rounds: int  # secure-aggregation rounds that ask them
    graph: SecAggGraph
    pate: PateConfig | None = None  # PATE: the public split and the student's training
    split: PublicSplit | None = None
    transcription: TranscriptionConfig | None = None  # FedDPSD: the engine's settings

    @classmethod
    def of(cls, config: FederatedConfig) -> "ServerPlan":
        evaluation = load_dataset(config.dataset)
        num_classes, in_shape = evaluation.num_classes, evaluation.input_shape
        if config.method == "pate":
            pate = config.pate_config(len(evaluation.y_test))
            split = pate.public_split(evaluation)
            rounds = math.ceil(pate.queries / config.round_queries)
            graph = cls.graph_of(config, rounds)
            wire, query = calibrated_wire(config, vote_wire(config, num_classes, in_shape), pate.queries,
                                          graph.run_failure(rounds))
            preflight.refuse_near_random(vote_advice(noise_std(query), config.members * config.clients, num_classes,
                                                   "gaussian", "the owners' ensemble"), config.accept_noise)
            return cls(evaluation, wire, query, pate.queries, rounds, graph, pate=pate, split=split)
        transcription = config.transcription_config()
        transcription.validate(num_classes)
        check_remote_settings(transcription)
        rounds = transcription.query_iterations(transcription.iterations)
        queries = rounds * transcription.batch_size
        graph = cls.graph_of(config, rounds)
        wire, query = calibrated_wire(config, gradient_wire(config, transcription, num_classes, in_shape), queries,
                                      graph.run_failure(rounds))
        preflight.refuse_near_random(gradient_advice(queries, noise_std(query) / GRID_STEPS,
                                                     config.members * config.clients, num_classes), config.accept_noise)
        return cls(evaluation, wire, query, queries, rounds, graph, transcription=transcription)

    @staticmethod
    def graph_of(config: FederatedConfig, rounds: int) -> SecAggGraph:
        return plan_graph(config.secagg_graph, config.clients, config.dropouts, config.colluders, rounds,
                          config.delta)

    @property
    def failure(self) -> float:
        """The part of delta the key-sharing graph takes over the run."""
        return self.graph.run_failure(self.rounds)


def noise_std(query: DistributedDiscreteGaussianQuery) -> float:
    """The noise in a revealed sum that no adversary knows: the honest owners' shares, in the answer's units."""
    return query.share_sigma * math.sqrt(query.honest)


class FederatedJob(Job):
    """A federated run, planned: the owners exist, the noise share is calibrated, nothing is asked yet."""

    def __init__(self, owners_root: Path | None, config: FederatedConfig, out_dir: Path,
                 progress: Progress | None) -> None:
        """`owners_root` holds the owners simulated here; None for owners on their own machines (engine remote),
        whose ledgers their own clients keep."""
        if owners_root is not None:
            check_owners(owners_root, config)
        self.owner_dirs = [] if owners_root is None else [owner_directory(owners_root, index)
                                                          for index in range(config.clients)]
        self.server = ServerPlan.of(config)
        self.config, self.progress = config, progress
        self.ledger_dir = owners_root
        self.planned = Release.of_query(self.server.query, self.server.queries, config.delta, self.server.failure)
        # the owners simulated here hold parts of this data set: its ledger records their answers
        self.data_set = None if owners_root is None else data_read(self.server.evaluation, config.dataset)
        self.state_dir = release_state(out_dir)
        self.round_seconds: list[float] = []  # the rounds this process asked, as they landed

    def _write_plan(self) -> FederationPlan:
        """The plan the server runs from (and PATE's queries), kept before the first round."""
        config, server = self.config, self.server
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # a simulated owner cannot vanish, and its stages queue on this machine's workers: wait for every reply
        timeout = None if config.engine == "simulation" else config.stage_timeout
        graph = server.graph
        terms = RunTerms(secrets.token_hex(8), server.queries, config.clients, config.dropouts, config.colluders,
                         config.delta, None if graph.full else graph.shares, None if graph.full else graph.threshold,
                         server.rounds)
        plan = FederationPlan(dataclasses.replace(server.wire, terms=terms), config.clients, config.dropouts,
                              str((self.state_dir / ROUNDS_DIR).resolve()), timeout, config.method, config.members,
                              config.colluders, config.owner_wait)
        if server.pate is not None:
            indices = choose_queries(server.split.pool, server.pate)
            tensors = {"images": server.split.pool[indices].contiguous(), "indices": indices.contiguous()}
            write_atomically({self.state_dir / QUERIES_FILE: lambda temporary: save_file(tensors, temporary)})
            plan = dataclasses.replace(plan, round_queries=config.round_queries,
                                       queries_file=str((self.state_dir / QUERIES_FILE).resolve()))
        else:
            plan = dataclasses.replace(plan, transcription=server.transcription.to_dict(), dataset=config.dataset,
                                       work_dir=str(self.state_dir.parent.resolve()))
        plan.save(self.state_dir / PLAN_FILE)
        return plan

    def _federate(self, plan: FederationPlan, plan_path: Path) -> dict[str, Any]:
        """Run the rounds not yet journaled on the chosen engine, reporting each journaled round as it lands."""
        engine = self.config.engine
        if rounds_answered(plan):  # a resumed run whose rounds were all asked: no owner is asked again
            return {"engine": engine, "wall_seconds": 0.0}
        started, finished = time.perf_counter(), threading.Event()
        watcher = threading.Thread(target=self._watch_rounds, args=(plan, finished), daemon=True)
        watcher.start()
        try:
            if engine == "simulation":
                simulate(plan_path, self.owner_dirs, self.config.delta)  # the owners simulated here: the run's
                return {"engine": engine, "wall_seconds": time.perf_counter() - started}
            work_dir = self.state_dir / "deployment"
            if engine == "remote":
                return {"engine": engine, **serve(plan_path, work_dir, self.config.address,
                                                  Certificates(Path(str(self.config.certificates))))}
            return {"engine": engine, **deploy(plan_path, self.owner_dirs, work_dir, self.config.delta)}
        finally:
            finished.set()
            watcher.join()

    def _watch_rounds(self, plan: FederationPlan, finished: threading.Event) -> None:
        """Report each journaled round as it lands, and time the rounds of this process (to a second; the first
        holds the engine's start-up)."""
        journal, total = RoundJournal(Path(plan.journal_dir)), self.server.rounds
        reported, last = None, time.perf_counter()
        while True:
            done = sum(journal.done(index) for index in range(total))
            if reported is not None and done > reported:
                now = time.perf_counter()
                self.round_seconds += [(now - last) / (done - reported)] * (done - reported)
                last = now
            if self.progress and done != reported:
                self.progress({"round": done, "total": total})
            reported = done
            if finished.wait(1.0):
                return

    def _kept_rounds(self, plan: FederationPlan, federation: dict[str, Any], answered: bool
                     ) -> tuple[list[tuple[Tensor, int] | None], list[int]]:
        """Each round's released sum and contributors (None: lost, spent and unanswered) and the lost rounds'
        numbers; a clean stop at the first round not asked, unless the server `answered` every round (FedDPSD's
        engine finished: rounds after the budget's last are never asked)."""
        journal, total = RoundJournal(Path(plan.journal_dir)), self.server.rounds
        kept, lost = [], []
        for index in range(total):
            if journal.lost(index):
                lost.append(index + 1)
                kept.append(None)
                continue
            result = journal.read(index)
            if result is None and not answered:
                failure = journal.failure() or {"round": index, "reason": self._stopped(federation)}
                where = (f"at round {failure['round'] + 1} of {total}" if failure["round"] >= 0
                         else "before its first round")
                refused = [f"{directory.name} refused: {reason}" for directory in self.owner_dirs
                           if (reason := refusal(directory, plan.wire.terms.run)) is not None]
                raise FederationError(
                    f"the federation stopped {where}: {failure['reason']}"
                    f"{''.join(f' ({line})' for line in refused)}; the rounds before it are kept and the "
                    f"whole budget stays reserved: --resume continues once the owners are back")
            kept.append(result)
        if all(result is None for result in kept):
            raise FederationError(f"every one of the {total} rounds was lost (owners failed during secure "
                                  f"aggregation): the budget is spent, nothing was learnt")
        return kept, lost

    def _stopped(self, federation: dict[str, Any]) -> str:
        """Why a run without a recorded failure ended early: the server process itself."""
        if federation["engine"] == "deployment":
            return (f"the deployed run ended as {federation['status']} (the SuperLink's log: "
                    f"{self.state_dir / 'deployment' / 'logs' / 'superlink.log'})")
        return "the server stopped"

    def run(self, resume: bool) -> Outcome:
        started = time.perf_counter()
        plan_path = self.state_dir / PLAN_FILE
        plan = FederationPlan.load(plan_path) if resume else self._write_plan()
        federation = self._federate(plan, plan_path)
        if self.server.pate is not None:
            outcome = self._learn_pate(plan, federation, started)
        else:
            outcome = self._learn_dpsd(plan, federation)
        outcome.report["timing"]["wall_seconds"] = time.perf_counter() - started
        outcome.report["resumed"] = resume
        return outcome

    def _federation_report(self, federation: dict[str, Any], kept: list, lost: list[int]) -> dict[str, Any]:
        return {**federation, "method": self.config.method, "owners": [str(path) for path in self.owner_dirs],
                "rounds": len(kept), "round_seconds": self.round_seconds,
                "contributors": [result[1] for result in kept if result is not None], "lost_rounds": lost}

    def _privacy(self) -> dict[str, Any]:
        """The report's privacy section, the same for both methods but for what the owners answer."""
        config, server = self.config, self.server
        return {"epsilon": self.planned.epsilon, "delta": config.delta, "queries": server.queries,
                "accountant": "dp-accounting RDP of the distributed discrete Gaussian (Kairouz, Liu and Steinke "
                              "2021)",
                "aggregation": AGGREGATION[config.method],
                "unit": "one private training example (held by one owner, it changes one member's answer)",
                **SAME_UNDER_BOTH, "epsilon_replace_one": self.planned.epsilon,
                "epsilon_add_remove": self.planned.epsilon, "epsilon_rdp": self.planned.epsilon,
                "budget_epsilon": config.epsilon, "mode": "data", "owners": config.clients,
                "dropouts": config.dropouts, "threshold": config.clients - config.dropouts,
                "secagg_graph": server.graph.kind, "secagg_shares": server.graph.shares,
                "secagg_share_threshold": server.graph.threshold, "secagg_failure_per_round": server.graph.failure,
                "secagg_failure": server.failure, "secagg_stall_per_round": server.graph.stall,
                "colluders": config.colluders, "honest_shares": server.query.honest,
                "share_sigma": server.wire.share_sigma, "sigma_at_threshold": server.query.total_sigma,
                "noise_multiplier": server.query.noise_multiplier, "clipping_range": server.wire.clipping_range,
                "clip_probability_bound": CLIP_TAIL, "noise": noise_source().description}

    def _learn_pate(self, plan: FederationPlan, federation: dict[str, Any], started: float) -> Outcome:
        """PATE's student from the released vote sums, as on one machine (lost rounds left out)."""
        config, server = self.config, self.server
        split, pate, num_classes = server.split, server.pate, server.evaluation.num_classes
        indices = load_file(plan.queries_file)["indices"]
        kept, lost = self._kept_rounds(plan, federation, answered=False)
        asked = [indices[rows] for rows, result in zip(plan.rounds(len(indices)), kept) if result is not None]
        votes = torch.cat([result[0] for result in kept if result is not None]).float()
        answers = Answers(torch.cat(asked), votes, votes.argmax(1), torch.ones(len(votes), dtype=torch.bool))
        answers.save(self.state_dir / ANSWERS_FILE)
        release_seconds = time.perf_counter() - started
        contributors = [result[1] for result in kept if result is not None]
        sigma = server.wire.share_sigma * math.sqrt(min(contributors))  # the sums' noise, for posterior targets
        student, history = train_student(split, answers, pate, num_classes, sigma,
                                         with_total(self.progress, pate.progress_total()))
        report = {"dataset": config.dataset, "public": split.description,
                  "federation": self._federation_report(federation, kept, lost),
                  "accuracy": {"student": history[-1]["test_accuracy"],
                               "answers": answer_accuracy(answers, split.pool_labels)},
                  "timing": {"release_seconds": release_seconds}, "history": history}
        answers_path = self.state_dir / ANSWERS_FILE

        def write_files(out_dir: Path, _report: dict[str, Any]) -> None:
            shutil.copyfile(answers_path, out_dir / ANSWERS_FILE)

        meta = classifier_meta(pate.student_arch, server.evaluation.input_shape, server.evaluation.class_names,
                               config.dataset)
        return Outcome(report=report, privacy=self._privacy(), covers=COVERS,
                       models={"student": (student, {**meta, PUBLIC_POOL: dataclasses.asdict(split.source)})},
                       private_record=self._owners_record, release=self.planned, write_files=write_files)

    def _learn_dpsd(self, plan: FederationPlan, federation: dict[str, Any]) -> Outcome:
        """FedDPSD's student and generator, as the server's engine left them."""
        config, server, transcription = self.config, self.server, self.server.transcription
        in_shape, num_classes = tuple(server.evaluation.input_shape), server.evaluation.num_classes
        result = read_result(plan)
        kept, lost = self._kept_rounds(plan, federation, answered=result is not None)
        if result is None:
            raise FederationError(f"every round was answered but the server stopped before keeping the student "
                                  f"({self._stopped(federation)}): --resume finishes it without asking again")
        report, models, write_files = transcription_release(result, transcription, in_shape,
                                                            server.evaluation.class_names, config.dataset,
                                                            dataset=server.evaluation, progress=self.progress)
        report.update(federation=self._federation_report(federation, kept, lost),
                      engine_config=transcription.to_dict())
        sigma = server.query.total_sigma / GRID_STEPS  # the sum's noise in units of beta, as the seed states it
        privacy = {**self._privacy(), "beta": transcription.privacy.beta, "sigma": sigma,
                   "paper_epsilon": paper_epsilon_dpsd_data(transcription.privacy.beta, num_classes,
                                                            transcription.batch_size, self.server.rounds, sigma,
                                                            config.delta),
                   "paper_epsilon_label": "paper formula (DPSD Theorem 1) at the sum's noise, NOT a guarantee"}
        return Outcome(report=report, privacy=privacy, covers=TRANSCRIPTION_COVERS, models=models,
                       private_record=self._owners_record, release=self.planned, write_files=write_files)

    def _owners_record(self) -> dict[str, Any]:
        """The owners' teachers' accuracies: private, never in the released report."""
        return {"owners": [json.loads((path / "report.json").read_text())["accuracy"] for path in self.owner_dirs
                           if (path / "report.json").exists()]}


def rounds_answered(plan: FederationPlan) -> bool:
    """Whether every round of the plan is journaled (FedDPSD: the server's engine kept its student)."""
    if plan.transcription is not None:
        return read_result(plan) is not None
    journal = RoundJournal(Path(plan.journal_dir))
    return all(journal.done(index) for index in range(len(plan.rounds(plan.wire.terms.queries))))


def default_owners(out_dir: Path) -> Path:
    """Where a federated run keeps its simulated data owners unless told: beside `out_dir`, so that the run's
    outputs and the owners' private teachers (and their ledger) stay apart."""
    return out_dir.with_name(f"{out_dir.name}-owners")


def run_federated(config: FederatedConfig | None, out_dir: Path, owners: Path | None = None, resume: bool = False,
                  progress: Progress | None = None, overwrite: bool = False, budget: Budget | None = None
                  ) -> dict[str, Any]:
    """Federated transcription on Flower: the data owners in `owners` (trained first where missing: owners.py)
    answer through secure aggregation; a student learns from the sums. With `resume`, the run saved in `out_dir`
    continues after its last released round, with its saved settings. `budget` sets the total of the owners'
    ledger (every federated run of these owners) before anything runs."""
    method = Federated()
    saved = method.interrupted(out_dir) if out_dir.is_dir() else None
    if resume and saved is not None:
        source, config = saved
        owners = source.teacher
    elif not resume:
        claim_out_dir(out_dir, resume, overwrite, saved is not None, "federated run")  # refuse before the owners train
        if config.engine == "remote":  # the owners and their ledgers are on their own machines
            if owners is not None:
                raise ConfigError("with --engine remote each owner serves its own teachers (`dpdistill federated "
                                  "owner`): drop --owners")
        else:
            owners = owners or default_owners(out_dir)
            check_owners(owners, config)
        ServerPlan.of(config)  # the server's side too: data set, public pool, noise
    if budget is not None and owners is not None:
        owners.mkdir(parents=True, exist_ok=True)
        ReleaseLedger(owners).set_total(budget.epsilon, budget.delta)
    if owners is not None and config is not None:
        prepare_owners(owners, config, progress)
    return execute(method, Source(owners), config, out_dir, resume, overwrite, progress)


def _run(values: dict[str, Any], config: FederatedConfig | None, progress: Progress | None) -> dict[str, Any]:
    budget = None if values["budget"] is None else Budget(values["budget"], values["budget_delta"])
    owners = None if values["owners"] is None else Path(values["owners"])
    return run_federated(None if values["resume"] else config, Path(values["out"]), owners, values["resume"],
                         progress, values["overwrite"], budget)


COMMAND = CommandSpec(
    name="federated", help="Data owners answer through secure aggregation (Flower).",
    options=(*field_options(FederatedConfig, ("dataset", "clients")),
             out_option("directory for the student, the released sums and the report"),
             *field_options(FederatedConfig, ("method", "epsilon", "delta", "dirichlet_alpha", "dropouts", "colluders",
                                              "secagg_graph", "engine")),
             Option("owners", Path | None, None, "the owners' directory: reused if prepared, its ledger counting "
                                                 "every run [default: beside --out, named after it]", field=False),
             *field_options(FederatedConfig, ("members_per_owner", "queries", "iterations", "student_arch",
                                              "accept_noise", "seed", "device")),
             set_option("any other setting, KEY=VALUE (repeatable), e.g. teacher_init=scatter, batch_size=256"),
             resume_option("continue the interrupted run in --out after its last released round"),
             Option("budget", float | None, None, "total epsilon every federated run of these owners may spend (set "
                                                  "on the owners' ledger; each owner's own client keeps its own: "
                                                  "`dpdistill budget OWNER_DIR --set`)", field=False),
             Option("budget_delta", float, 1e-5, "delta of the total --budget", field=False), OVERWRITE_OPTION),
    configure=lambda values: None if values["resume"] else FederatedConfig(
        **COMMAND.field_values(values), **COMMAND.settings(values)),
    run=_run, progress_of=lambda values, config: (None, "federated: owners, then rounds and the student"),
    positional=("dataset", "clients", "out"), settable=(FederatedConfig,))
