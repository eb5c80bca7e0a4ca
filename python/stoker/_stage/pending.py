"""The batches the Python stage is mapping (NOTE [ Python stage ] in
stoker/_stage/__init__.py): each chunk a stage thread runs fills its positions of the
batch's record, until the thread that finishes the last chunk assembles it."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

__all__ = ["Pending", "PendingBatches"]


class Pending:
    """A batch being mapped: its rows (or each position's error), the samples skipped in
    it, a bug of the stage that fails it, the arenas of process workers its rows are
    views of, and the memory they were written into directly."""

    __slots__ = ("rows", "errors", "skipped", "internal", "leases", "task", "direct")

    def __init__(self, task: Any):
        self.rows: List[Any] = [None] * task.samples
        self.errors: Dict[int, BaseException] = {}
        self.skipped = 0
        self.internal: Optional[BaseException] = None
        self.leases: List[Any] = []  # process workers' arenas that rows are views of
        self.task = task
        # the batch's memory planned before its chunks went out (a DirectBatch: NOTE
        # [ Direct rows ] in direct.py); False: its rows go by the arenas
        self.direct: Any = None

    def release(self) -> None:
        """The rows are no longer read: their arenas may be written again, and what the
        record holds goes (its rows, its batch memory, a bug's error: that error's
        frames hold this record, a cycle that kept its batch's memory until a garbage
        collection, after close() too). A thread still running one of its chunks plans
        no memory for it again (direct False)."""
        self.rows = [None] * len(self.rows)
        self.direct = False
        self.internal = None
        self.errors = {}
        leases, self.leases = self.leases, []
        for lease in leases:
            lease.release()


class PendingBatches:
    """The stage's batches being mapped, by task id. A batch whose stream stopped before
    all its chunks were taken (break, close) is never finished by a thread: it leaves the
    table at the next new batch, or with the consumer's purge (a thread running one of
    its chunks keeps its own reference)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: Dict[int, Pending] = {}

    def __len__(self) -> int:
        return len(self._batches)

    def of(self, task: Any) -> Pending:
        """`task`'s record, made at its first chunk (when stopped batches leave too)."""
        dropped: List[Pending] = []
        with self._lock:
            pending = self._batches.get(task.id)
            if pending is None:
                pending = self._batches[task.id] = Pending(task)
                dropped = self._stopped()
        for p in dropped:
            p.release()
        return pending

    def pop(self, task: Any) -> None:
        """`task` is finished (assembled or failed): out of the table."""
        with self._lock:
            self._batches.pop(task.id, None)

    def drop_stopped(self) -> None:
        """The batches whose stream stopped leave the table, their arenas released."""
        with self._lock:
            dropped = self._stopped()
        for p in dropped:
            p.release()

    def _stopped(self) -> List[Pending]:
        dropped = [p for p in self._batches.values() if p.task.stopped]
        for p in dropped:
            del self._batches[p.task.id]
        return dropped

    def oldest(self) -> Any:
        """The task of the oldest batch in the table (by epoch, then batch), or None."""
        with self._lock:
            tasks = [p.task for p in self._batches.values()]
        return min(tasks, key=lambda t: (t.epoch, t.batch), default=None)

    def reset(self) -> None:
        """close(): every batch leaves the table, its arenas released."""
        with self._lock:
            dropped = list(self._batches.values())
            self._batches.clear()
        for p in dropped:
            p.release()
