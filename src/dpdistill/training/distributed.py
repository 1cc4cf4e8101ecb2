"""DP-SGD on several processes: Opacus' distributed design (DifferentiallyPrivateDistributedDataParallel and
DistributedDPOptimizer) on torch.distributed, started here (`--processes N`: N local processes, gloo on CPU, NCCL
on GPUs) or by torchrun (its environment variables: this process joins the group torchrun formed).

What runs where, and why the privacy is the single process's:
- Rank 0 leads: it plans the run (the sampling rate, the steps, the calibrated noise: the one PrivatePlan, from the
  public training-set size) and shares the plan; it alone writes the run's files (config.json, the ledger's
  reservation, the checkpoints, the report) and evaluates. The other ranks write nothing.
- Each rank trains on a fixed shard of the training set, position modulo the number of processes (a rule that
  looks at no example), and Poisson-samples its shard at the plan's rate with its own secret NoiseSource: every
  example is in exactly one shard and joins a step's batch independently with the plan's probability, so the union
  of the ranks' batches is a Poisson sample of the whole set at that rate, as the accountant assumes. Every rank
  runs the plan's steps (an empty batch still steps), so their exchanges pair up.
- Each rank clips its examples' gradients and sums them; rank 0 alone adds the Gaussian noise N(0, sigma^2 C^2)
  to its sum, once a step, from its own secure source, and the sums are all-reduced (Opacus'
  DistributedDPOptimizer, in training/private.py): the total carries exactly the single process's noise, the
  accountant's. The alternative, a share of variance sigma^2 C^2 / N from each rank, sums to the same distribution
  only while every rank draws and adds its share; one draw on one rank leaves nothing to get wrong (no rank can
  fall short of the variance the accountant assumes), and is Opacus' design. The un-noised sums travel between
  the processes: on one machine, through its loopback; across machines under torchrun, the network between them
  must be as private as the machines.
- The accounting is unchanged: the same PrivatePlan, the same epsilon, computed by rank 0 alone.

A failure on any rank ends every rank: a rank that fails makes the others' next exchange fail (gloo notices a
closed connection at once); the processes started here are watched by the launching process, which stops the
others (SIGTERM, then SIGKILL after a grace period, NCCL included) and raises the first failure as one error;
torchrun's agent stops a failed group itself.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Callable

import torch
import torch.distributed as dist

from dpdistill.errors import ConfigError, DistributedError, DpDistillError
from dpdistill.progress import Progress, announce_start
from dpdistill.training.state import decode_state, encode_state

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # what torchrun sets
STOP_GRACE_SECONDS = 30.0  # a stopped rank's time to end by itself (rank 0 settles its ledger) before SIGKILL
Work = Callable[[Progress | None], Any]  # one rank's part of a run: rank 0's returns the run's result


@dataclass(frozen=True)
class Group:
    """This process's place among the processes of a run, and their exchanges. A group of one (the single-process
    run) exchanges nothing."""

    rank: int = 0
    size: int = 1
    device: torch.device = torch.device("cpu")  # where the exchanged tensors live (NCCL: the GPU)

    @classmethod
    def current(cls) -> "Group":
        """The group torch.distributed has formed in this process, or a group of one."""
        if not (dist.is_available() and dist.is_initialized()):
            return cls()
        device = (torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl"
                  else torch.device("cpu"))
        return cls(dist.get_rank(), dist.get_world_size(), device)

    @property
    def leads(self) -> bool:
        """Whether this process plans, evaluates and writes the run (rank 0)."""
        return self.rank == 0

    def shard(self, examples: torch.Tensor) -> torch.Tensor:
        """This rank's examples: position modulo the number of processes, a rule blind to the examples."""
        return examples[self.rank::self.size]

    def sum(self, *values: float) -> list[float]:
        """Each value summed over the ranks."""
        if self.size == 1:
            return list(values)
        summed = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(summed)
        return summed.tolist()

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Rank 0's `data` on every rank (the others pass None)."""
        if self.size == 1:
            return data
        length = torch.tensor([len(data) if self.leads else 0], dtype=torch.int64, device=self.device)
        dist.broadcast(length, 0)
        buffer = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device) if self.leads
                  else torch.empty(int(length), dtype=torch.uint8, device=self.device))
        dist.broadcast(buffer, 0)
        return data if self.leads else buffer.cpu().numpy().tobytes()

    def broadcast_json(self, value: Any = None) -> Any:
        """Rank 0's `value` (JSON: no pickle crosses between the processes) on every rank."""
        return json.loads(self.broadcast_bytes(json.dumps(value).encode() if self.leads else None))

    def broadcast_state(self, state: dict[str, Any] | None) -> dict[str, Any]:
        """Rank 0's training state (tensors and their JSON skeleton, as a checkpoint keeps them) on every rank."""
        if self.size == 1:
            return state
        if self.leads:
            skeleton, tensors = encode_state(state)
            self.broadcast_bytes(skeleton.encode())
            self.broadcast_bytes(tensors)
            return state
        skeleton = self.broadcast_bytes(None).decode()
        return decode_state(skeleton, self.broadcast_bytes(None))

    def gather_json(self, value: Any) -> list[Any]:
        """Every rank's `value`, by rank, on every rank."""
        if self.size == 1:
            return [value]
        data = json.dumps(value).encode()
        lengths = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.size)]
        dist.all_gather(lengths, torch.tensor([len(data)], dtype=torch.int64, device=self.device))
        longest = max(int(length) for length in lengths)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        buffers = [torch.empty(longest, dtype=torch.uint8, device=self.device) for _ in range(self.size)]
        dist.all_gather(buffers, padded.to(self.device))
        return [json.loads(buffer[:int(length)].cpu().numpy().tobytes()) for buffer, length in zip(buffers, lengths)]


def on_processes(processes: int, device: str, work: Work, progress: Progress | None = None) -> Any:
    """Run `work` on every process of a run and return rank 0's result (None on torchrun's other ranks): in this
    process alone (one process), as this process's rank of the group torchrun started, or in `processes` processes
    started here, this one relaying rank 0's progress and result. `work` must pickle (a module-level function or a
    partial of one): the processes started here import it afresh."""
    if all(name in os.environ for name in TORCHRUN_VARIABLES) and int(os.environ["WORLD_SIZE"]) > 1:
        rank, local_rank, size = (int(os.environ[name]) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        return _as_rank(rank, size, local_rank, "env://", device, work, progress if rank == 0 else None)
    if processes == 1:
        return work(progress)
    return _launched(processes, device, work, progress)


def _as_rank(rank: int, size: int, local_rank: int, rendezvous: str, device: str, work: Work,
             progress: Progress | None, failed: Callable[[DpDistillError], None] = lambda error: None) -> Any:
    """Join the group as `rank` (gloo on CPU, NCCL on the GPU `local_rank`), do `work`, leave the group. Any failure
    here is one DpDistillError, told to `failed` before this process leaves the group (its leaving ends the others'
    exchanges, whose failures then come after it)."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=rendezvous, rank=rank, world_size=size)
    try:
        return work(progress)
    except DpDistillError as error:
        failed(error)
        raise
    except Exception as error:  # its own fault, or another rank's end reaching it as a failed exchange
        exchange = any(f"{os.sep}distributed{os.sep}" in frame.filename
                       for frame in traceback.extract_tb(error.__traceback__))
        failed_how = ("lost the others (an exchange failed: when a process ends, its own error says why)" if exchange
                      else "failed")
        described = DistributedError(f"process {rank} of {size} {failed_how}: {_described(error)}")
        failed(described)
        raise described from error
    finally:
        dist.destroy_process_group()


def _described(error: BaseException) -> str:
    """An unexpected error on one line: its type, first line and where it was raised."""
    where = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    place = f" ({os.path.basename(where.filename)}:{where.lineno})" if where else ""
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}{place}"


class _Relayed:
    """Rank 0's progress records, sent to the launching process's display."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def __call__(self, record: dict) -> None:
        self.connection.send(("progress", record))

    def start(self) -> None:
        self.connection.send(("start", None))


def _stopped(signum: int, frame: Any) -> None:
    """SIGTERM from the launching process: end as on Ctrl-C, so rank 0 keeps its checkpoint and settles its ledger."""
    raise KeyboardInterrupt


def _worker(rank: int, size: int, rendezvous: str, device: str, threads: int, work: Work, connection: Connection,
            relay: bool) -> None:
    """One process started by `_launched`: its rank's work, its outcome ("done" or "failed", with when) sent to the
    launcher. Stopped (SIGTERM), it ends quietly: the launcher knows why."""
    signal.signal(signal.SIGTERM, _stopped)
    torch.set_num_threads(threads)
    try:
        result = _as_rank(rank, size, rank, rendezvous, device, work, _Relayed(connection) if relay else None,
                          lambda error: connection.send(("failed", (time.time(), error))))
        connection.send(("done", result))
    except (KeyboardInterrupt, DpDistillError):  # stopped, or failed and said so
        pass


def _launched(processes: int, device: str, work: Work, progress: Progress | None) -> Any:
    """Start `processes` processes (spawned: each imports afresh, nothing forked from this one), rank 0 relaying
    its progress, and watch them until all have ended."""
    if torch.device(device).type == "cuda" and torch.cuda.device_count() < processes:
        raise ConfigError(f"--processes {processes} on cuda needs a GPU for each process and {torch.cuda.device_count()} "
                          f"are visible: give fewer processes, or start them across machines with torchrun")
    context = multiprocessing.get_context("spawn")
    threads = max(1, torch.get_num_threads() // processes)  # the cores shared out, none oversubscribed
    with tempfile.TemporaryDirectory(prefix="dpdistill-processes-") as rendezvous:
        workers = []
        try:
            for rank in range(processes):
                receiver, sender = context.Pipe(duplex=False)
                worker = context.Process(target=_worker, name=f"dpdistill-rank-{rank}", daemon=True,
                                         args=(rank, processes, f"file://{rendezvous}/store", device, threads, work,
                                               sender, rank == 0 and progress is not None))
                worker.start()
                sender.close()
                workers.append((worker, receiver))
            return _watched(workers, progress)
        finally:
            _stop([worker for worker, _ in workers])


def _watched(workers: list[tuple[BaseProcess, Connection]], progress: Progress | None) -> Any:
    """Relay rank 0's progress until every process has ended, and return its result; at the first failure stop the
    others and raise it (the first in time: the others' failures follow from it)."""
    result, finished = None, set()
    running = list(range(len(workers)))
    while running:
        wait([handle for rank in running for handle in (workers[rank][0].sentinel, workers[rank][1])])
        failures = []  # (when, error): a rank that fails ends the others' exchanges, so they fail after it
        for rank in list(running):
            process, receiver = workers[rank]
            alive = process.is_alive()  # before reading: an ended process's last words are then all in the pipe
            for kind, value in _received(receiver):
                if kind == "progress":
                    progress(value)
                elif kind == "start":
                    announce_start(progress)
                elif kind == "done":
                    result = value if rank == 0 else result
                    finished.add(rank)
                else:
                    failures.append(value)
            if not alive:
                running.remove(rank)
                if rank not in finished:  # killed, or crashed without a word: first, whatever the others said
                    failures.append((-math.inf, DistributedError(
                        f"process {rank} of {len(workers)} ended (exit code {process.exitcode}) before its work was "
                        f"done")))
        if failures:
            _stop([workers[rank][0] for rank in running])
            raise min(failures, key=lambda failure: failure[0])[1]
    return result


def _received(receiver: Connection) -> list[tuple[str, Any]]:
    """The messages waiting in `receiver` (none once its process has closed it)."""
    messages = []
    try:
        while receiver.poll():
            messages.append(receiver.recv())
    except EOFError:
        pass
    return messages


def _stop(processes: list[BaseProcess]) -> None:
    """End `processes`: SIGTERM (rank 0 keeps its checkpoint and settles its ledger), SIGKILL after the grace."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
