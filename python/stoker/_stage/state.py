"""What the Python stage's parts share (NOTE [ Python stage ] in stoker/_stage/__init__.py):
the records of a batch being mapped (_Pending), of a batch's delivery to the consumer
(_Delivery) and of what a stage thread is doing (_Doing); the end of an epoch; the count
of forks this process came out of."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Dict, Hashable, List, Optional

import torch

__all__ = ["PROCESS_THREADS_PER_WORKER", "PROBE_WAIT_SECONDS", "END", "forks"]

# Stage threads per worker process (NOTE [ Python stage processes ] in processes.py).
PROCESS_THREADS_PER_WORKER = 2
# How long the other stage threads wait for the first sample, watched for draws from the
# global generators (NOTE [ Global random generators ] in workers.py), before they go on.
PROBE_WAIT_SECONDS = 10.0
# The end of an epoch, as PythonStage.next() says it: never a value a hook may return (a
# batch may be None).
END = object()
# Forks (os.fork) this process came out of: a stage compares it with its own count after
# each call of user code, and only then the pid (a syscall: not per sample).
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)


def forks() -> int:
    """Forks (os.fork) this process came out of, as counted at each."""
    return _forks


class _Doing:
    """What one stage thread is doing, for the stall report: the phase ("dataset", "map",
    "collate_fn", "batch_map", "worker": a chunk at a worker process; None: idle), the
    batch, the sample's dataset index, since when (time.monotonic())."""

    __slots__ = ("thread", "name", "phase", "task", "index", "since", "worker")

    def __init__(self, thread: threading.Thread):
        self.thread = thread
        self.name = thread.name
        self.phase: Optional[str] = None
        self.task: Any = None
        self.index = -1
        self.since = 0.0
        self.worker = -1

    def at(self, index: int, phase: str) -> None:
        self.index = index
        self.phase = phase
        self.since = time.monotonic()

    def idle(self) -> None:
        self.phase = None


class _Pending:
    """A batch being mapped: each chunk fills its positions (NOTE [ Python stage ])."""

    __slots__ = ("rows", "errors", "skipped", "internal", "leases", "task")

    def __init__(self, task: Any):
        self.rows: List[Any] = [None] * task.samples
        self.errors: Dict[int, BaseException] = {}
        self.skipped = 0
        self.internal: Optional[BaseException] = None
        self.leases: List[Any] = []  # process workers' arenas that rows are views of
        self.task = task

    def release(self) -> None:
        """The rows are no longer read: their arenas may be written again."""
        leases, self.leases = self.leases, []
        for lease in leases:
            lease.release()


class _Delivery:
    """What a batch carries besides its tensors, by ticket: object fields, a whole
    batch (collate_fn, batch_map on the CPU), or an error; and which batch it is."""

    __slots__ = ("objects", "whole", "error", "epoch", "rank", "world_size", "batch", "task",
                 "since")

    def __init__(self, task: Any):
        self.objects: Dict[Hashable, List[Any]] = {}
        self.whole: Any = _UNSET
        self.error: Optional[BaseException] = None
        self.epoch = task.epoch
        self.rank = task.rank
        self.world_size = task.world_size
        self.batch = task.batch
        self.task = task  # holds its stream weakly: stopped() once the stream is gone
        self.since = 0.0


_UNSET = object()  # a delivery that carries no whole batch


def _not_none(batch: Any, what: str) -> Any:
    """batch_map's value: None is an error, never a batch (nor the end of the epoch)."""
    if batch is None:
        raise TypeError(f"batch_map returned None for {what}: did it modify the batch in "
                        "place without returning it? End it with `return batch`")
    return batch


def _tensor_from_capsule(cap: Any) -> Any:
    from_capsule = getattr(torch._C, "_from_dlpack", None) or torch.from_dlpack
    return from_capsule(cap)
