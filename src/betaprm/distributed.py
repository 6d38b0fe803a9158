"""Several processes sharing one run, started by torchrun (``torchrun --nproc_per_node N -m
betaprm score ...``, or ``--nnodes`` with a rendezvous endpoint for several machines): scoring
and evaluation, and the problem loops of ACA and search (``SharedTaskRecords``, their problems
dealt out by count).

Who does what: every process reads the same input and works out the same plan (the forward
passes a single process would run, in the same groups); the groups are dealt out by their
tokens (``balanced_shares``), so each process gets about the same compute whatever the
lengths of its records. Each process appends what it scores to its own part file
(``OUT.part0``, ``OUT.part1``, ...); rank 0 alone checks the output's settings, holds its
lock, and at the end writes the records of every part into the output in input order and
removes the parts (``merge_parts``). A lone process (no torchrun) writes the output itself,
as it always has, unless part files of an interrupted run are there to be finished.

What is done is known per record, not per process: the ids in the output and in every part
file on disk (``done_ids``), so a run killed mid-way (one process or all of them) resumes
under any number of processes, scoring each record once. The part files must be on a file
system every process sees (a cluster's shared file system with several machines).

The processes talk through a gloo process group (``torch.distributed``): they exchange only
small Python objects (ids, token counts, the scores of an evaluation), never tensors, so gloo
serves on GPUs too and no NCCL communicator takes GPU memory. Each process scores on its own
device (``process_device``: ``cuda:LOCAL_RANK`` on a GPU machine).
"""

from __future__ import annotations

import atexit
import contextlib
import heapq
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import BetaPRMInputError
from .progress import progress_bar
from .provenance import (
    TaskRecords,
    completed_ids,
    meta_path,
    open_output,
    part_files,
    part_path,
    records_in_order,
)

logger = logging.getLogger(__name__)

__all__ = [
    "Processes",
    "balanced_shares",
    "discard_parts",
    "done_ids",
    "merge_parts",
    "process_device",
    "processes",
    "read_part_records",
    "shared_output",
    "task_records",
]

# How long a process waits for the others at a meeting point (the end of its share): the
# shares are balanced by tokens, so this is a wait for the slowest device, or for rank 0
# checking the output before anyone starts. A process that dies makes torchrun stop the rest.
TIMEOUT_MINUTES = 120
EXIT_WAIT_S = 60


@dataclass(frozen=True)
class Processes:
    """This process's place among the processes of a run: ``rank`` of ``world``, and its
    ``local_rank`` on its machine. A lone process is rank 0 of 1, and its collective
    operations return at once."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj):
        """Rank 0's ``obj``, on every process."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather(self, obj) -> list:
        """Every process's ``obj``, by rank, on every process (also a meeting point)."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def gather(self, obj) -> list | None:
        """Every process's ``obj``, by rank, on rank 0; None on the others."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world if self.main else None
        dist.gather_object(obj, out, dst=0)
        return out


_CURRENT: Processes | None = None


def processes() -> Processes:
    """This process's ``Processes``, from torchrun's environment (``WORLD_SIZE``, ``RANK``,
    ``LOCAL_RANK``); the first call with several processes starts the gloo process group
    (through torchrun's rendezvous variables). Without torchrun: rank 0 of 1."""
    global _CURRENT
    if _CURRENT is None:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if world > 1:
            from datetime import timedelta

            import torch.distributed as dist

            if not dist.is_initialized():
                dist.init_process_group("gloo", timeout=timedelta(minutes=TIMEOUT_MINUTES))
                atexit.register(_end_process_group)
            _CURRENT = Processes(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
        else:
            _CURRENT = Processes()
    return _CURRENT


def _end_process_group() -> None:
    """At exit: the processes meet, then each takes the process group down. Without the
    meeting, a process that tore its group down while another was still finishing (rank 0
    merging the parts) sometimes aborted in gloo's teardown (SIGABRT: "terminate called
    without an active exception"). A process that ends while the others are elsewhere
    (one failed) waits at most ``EXIT_WAIT_S`` for them."""
    from datetime import timedelta

    import torch.distributed as dist

    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.monitored_barrier(timeout=timedelta(seconds=EXIT_WAIT_S))
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def process_device(choice: str) -> str:
    """The device this process scores on: ``auto`` is cuda when there is one, else cpu; with
    several processes ``auto`` and ``cuda`` are ``cuda:LOCAL_RANK`` (one GPU each; more
    processes on a machine than GPUs share them in turn); a device with an index (``cuda:1``)
    is taken as given."""
    import torch

    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    procs = processes()
    if choice == "cuda" and procs.world > 1:
        index = procs.local_rank % max(torch.cuda.device_count(), 1)
        # The current device too: what this process loads on "cuda" (a policy, a judge) is on its own GPU.
        torch.cuda.set_device(index)
        return f"cuda:{index}"
    return choice


# ---------------------------------------------------------------------- shares
def balanced_shares(weights: Sequence[int], n: int) -> list[list[int]]:
    """Indices of ``weights`` dealt to ``n`` processes so that the weights (tokens) of their
    shares are about equal: heaviest first, each to the process with the least so far (the
    lower rank on a tie), then each share in index order. The same on every process."""
    heap = [(0, r) for r in range(n)]
    shares: list[list[int]] = [[] for _ in range(n)]
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        total, r = heapq.heappop(heap)
        shares[r].append(i)
        heapq.heappush(heap, (total + weights[i], r))
    return [sorted(s) for s in shares]


# ---------------------------------------------------------------------- part files
def done_ids(path) -> set[str]:
    """Ids already scored into ``path``: in the output and in each of its part files (a last
    line an interrupted write left without its newline is cut off). Read by rank 0 before
    any process writes."""
    done = completed_ids(path)
    for p in part_files(path):
        done |= completed_ids(p)
    return done


def _index_parts(path) -> dict[str, tuple[Path, int, int]]:
    """Where each id's record is in the part files: ``id -> (file, offset, length)``, the
    first one found when an id is there twice; a last line without its newline is left out."""
    index: dict[str, tuple[Path, int, int]] = {}
    for p in part_files(path):
        offset = 0
        with open(p, "rb") as f:
            for n, line in enumerate(f, 1):
                if not line.endswith(b"\n"):
                    break
                if line.strip():
                    try:
                        rid = str(json.loads(line)["id"])
                    except (ValueError, KeyError, TypeError, RecursionError):
                        raise BetaPRMInputError(
                            f"{p}:{n}: a part file line is not a scored record; move the file away or fix it"
                        ) from None
                    index.setdefault(rid, (p, offset, len(line)))
                offset += len(line)
    return index


def merge_parts(path, ids_in_order: Sequence[str]) -> int:
    """Append the records of ``path``'s part files that the output does not hold yet, in
    ``ids_in_order`` (the input's order; ids of no input record after them, as found), sync
    the output, then remove the part files. The records are copied byte for byte. A merge
    killed half way resumes: records already in the output are not written twice. Returns
    the number of records written."""
    path = Path(path)
    index = _index_parts(path)
    have = completed_ids(path)
    known = set(ids_in_order)
    order = [i for i in ids_in_order if i in index] + [i for i in index if i not in known]
    written = 0
    files: dict = {}
    try:
        with open(path, "ab") as out:
            for rid in order:
                if rid in have:
                    continue
                p, offset, length = index[rid]
                if p not in files:
                    files[p] = open(p, "rb")
                f = files[p]
                f.seek(offset)
                out.write(f.read(length))
                have.add(rid)
                written += 1
            out.flush()
            os.fsync(out.fileno())
    finally:
        for f in files.values():
            f.close()
    for p in part_files(path):
        p.unlink()
    return written


def read_part_records(path) -> dict[str, dict]:
    """Every record of ``path``'s part files by id (the first of an id found twice)."""
    records: dict[str, dict] = {}
    for rid, (p, offset, length) in _index_parts(path).items():
        with open(p, "rb") as f:
            f.seek(offset)
            records[rid] = json.loads(f.read(length))
    return records


def discard_parts(path) -> None:
    """Remove ``path``'s part files and its sidecar: the scores an evaluation kept for a
    resume, once its results are written."""
    for p in part_files(path):
        p.unlink(missing_ok=True)
    meta_path(path).unlink(missing_ok=True)


class PartWriter:
    """This process's part file of ``path``, appended to (one write per group of records,
    flushed, so a kill leaves at most one torn last line, which the next run cuts off)."""

    def __init__(self, path, procs: Processes):
        self.path = part_path(path, procs.rank)
        self.rank = procs.rank
        self.writes = 0
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, lines: Sequence[str]) -> None:
        self._file.writelines(lines)
        self._file.flush()
        self.writes += 1

    def close(self) -> None:
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def shared_output(procs: Processes, path, settings: dict, info: dict | None = None, flag="--out", adopt=False):
    """``provenance.open_output`` for a run of several processes: rank 0 checks the output's
    settings (and the settings of its part files' records) and holds its lock for the
    duration; the others wait for its verdict and stop with it when the output is refused
    (exit 2 without repeating the message rank 0 prints)."""
    if procs.world == 1:
        with open_output(path, settings, info, flag=flag, adopt=adopt) as p:
            yield p
        return
    with contextlib.ExitStack() as stack:
        problem = None
        if procs.main:
            try:
                stack.enter_context(open_output(path, settings, info, flag=flag, adopt=adopt))
            except BetaPRMInputError as e:
                problem = str(e)
        problem = procs.broadcast(problem)
        if problem is not None:
            if procs.main:
                raise BetaPRMInputError(problem)
            raise SystemExit(2)
        yield Path(path)


# ---------------------------------------------------------------------- task loops
class SharedTaskRecords(TaskRecords):
    """``provenance.TaskRecords`` for the processes ``procs`` of one run (``aca``, ``search``):
    the problems not done yet (in the output or in any part file, read by rank 0) are dealt
    out by count, since what a problem costs is known only as it runs; each process appends
    its finished problems to its part file, and at the end rank 0 appends them to the output
    in input order (``merge_parts``; after any records a single process had written there, in
    the order they finished). ``records()`` is every record on rank 0, in input order, only
    this process's on the others."""

    def __init__(self, out, ids, what: str, procs: Processes, progress: bool = True, desc: str | None = None):
        super().__init__(None, ids, what, progress, desc)
        self.out, self.procs = out, procs
        problem, done = None, None
        if procs.main:
            try:
                done = done_ids(out)
            except BetaPRMInputError as e:  # a bad line in the output or a part file
                problem = str(e)
        problem, self.done = procs.broadcast((problem, done))
        if problem is not None:  # said once, by rank 0; the others stop with it (as shared_output)
            if procs.main:
                raise BetaPRMInputError(problem)
            raise SystemExit(2)
        left = [i for i in self.ids if i not in self.done]
        self.mine = {left[j] for j in balanced_shares([1] * len(left), procs.world)[procs.rank]}

    def todo(self, tasks) -> list:
        return [t for t in tasks if t.id in self.mine]

    def __enter__(self):
        self._file = PartWriter(self.out, self.procs)  # what TaskRecords appends to
        if self.progress and self.procs.main and self.mine:
            self._bar = progress_bar(len(self.mine), self.desc, "problem")
        return self

    def _append(self, line: str) -> None:
        self._file.write([line])

    def __exit__(self, *exc):
        super().__exit__(*exc)
        if exc[0] is None:
            self.procs.all_gather(None)  # every part complete from here on
            if self.procs.main:
                merge_parts(self.out, self.ids)

    def records(self) -> list[dict]:
        if not self.procs.main:
            return [self.fresh[i] for i in self.ids if i in self.fresh]
        return records_in_order(self.ids, {}, self.out)


def task_records(out, ids, what: str, procs: Processes | None = None, progress: bool = True, desc: str | None = None):
    """The records of a loop over problems: ``SharedTaskRecords`` under torchrun (``procs``
    of several processes; ``out`` required), or when part files of an interrupted run of
    several are there to be finished; else a lone process's ``TaskRecords``."""
    procs = procs or Processes()
    if procs.world > 1 and out is None:
        raise BetaPRMInputError(f"{what} with {procs.world} processes needs an output file (--out)")
    if out is not None and (procs.world > 1 or part_files(out)):
        return SharedTaskRecords(out, ids, what, procs, progress, desc)
    return TaskRecords(out, ids, what, progress, desc)
