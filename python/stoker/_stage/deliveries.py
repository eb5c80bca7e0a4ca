"""What a batch of the Python stage carries besides its tensors (NOTE [ Python stage ] in
stoker/_stage/__init__.py): object fields, a whole batch (collate_fn, batch_map on the CPU)
or the user's exception, kept by ticket until the consumer takes the batch; the C++ batch
carries only the ticket (a C++ thread never holds a Python object)."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Hashable, List, Optional

__all__ = ["UNSET", "Deliveries", "Delivery", "not_none"]

UNSET = object()  # a delivery that carries no whole batch


class Delivery:
    """What a batch carries besides its tensors, by ticket: object fields, a whole
    batch, or an error; and which batch it is."""

    __slots__ = ("objects", "whole", "error", "epoch", "rank", "world_size", "batch", "task",
                 "since")

    def __init__(self, task: Any):
        self.objects: Dict[Hashable, List[Any]] = {}
        self.whole: Any = UNSET
        self.error: Optional[BaseException] = None
        self.epoch = task.epoch
        self.rank = task.rank
        self.world_size = task.world_size
        self.batch = task.batch
        self.task = task  # holds its stream weakly: stopped() once the stream is gone
        self.since = 0.0


def not_none(batch: Any, what: str) -> Any:
    """batch_map's value: None is an error, never a batch (nor the end of the epoch)."""
    if batch is None:
        raise TypeError(f"batch_map returned None for {what}: did it modify the batch in "
                        "place without returning it? End it with `return batch`")
    return batch


class Deliveries:
    """The deliveries by ticket. Those of batches their stream dropped (stop, close,
    break) are never taken: they are purged, but never while a consumer is in next() (a
    batch it was handed may belong to a stream that stopped since, the last of an epoch,
    its delivery not taken yet)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._table: Dict[int, Delivery] = {}
        self._next = 1
        self._consumers = 0  # consumers in next() now
        self._purges = 0

    def __len__(self) -> int:
        return len(self._table)

    def put(self, d: Delivery) -> int:
        """Keeps `d`; its ticket."""
        d.since = time.monotonic()
        with self._lock:
            if self._next % 16 == 0 and not self._consumers:
                # a consumer takes its own within moments of the stop its error causes
                old = d.since - 5.0
                stale = [t for t, x in self._table.items() if x.since < old and x.task.stopped]
                for t in stale:
                    del self._table[t]
            ticket = self._next
            self._next += 1
            self._table[ticket] = d
            return ticket

    def take(self, ticket: int) -> Optional[Delivery]:
        if not ticket:
            return None
        with self._lock:
            return self._table.pop(ticket, None)

    def error(self, ticket: int) -> Optional[BaseException]:
        """The exception a failed batch carries (None if it is not known here)."""
        d = self.take(ticket)
        return None if d is None else d.error

    def enter(self) -> None:
        """A consumer is in next(): until it leaves, no purge drops a delivery."""
        with self._lock:
            self._consumers += 1

    def drop_stopped(self) -> None:
        """close(): the deliveries of batches whose stream stopped go now (each holds its
        task, and so its batch memory), unless a consumer is in next()."""
        with self._lock:
            if not self._consumers:
                for t in [t for t, d in self._table.items() if d.task.stopped]:
                    del self._table[t]

    def leave(self) -> bool:
        """The consumer left next(); now and then the purge: whether it ran (the caller's
        cue to drop the stage's other records of stopped batches)."""
        with self._lock:
            self._consumers -= 1
        self._purges += 1
        if self._purges % 16 and len(self._table) < 64:
            return False
        with self._lock:
            if self._consumers:
                return False
            stale = [t for t, d in self._table.items() if d.task.stopped]
            for t in stale:
                del self._table[t]
        return True
