"""How the Python stage's threads take chunks from the C++ hand-off (NOTE [ Python stage ]
in stoker/_stage/__init__.py): within a slice, the GIL released while they wait; with
worker processes, numbered in the order they were claimed, which the requests keep (NOTE
[ Python stage processes ] in processes.py)."""

from __future__ import annotations

import threading
import time
from typing import Any, List, Optional, Set, Tuple

from .state import PROCESS_THREADS_PER_WORKER

__all__ = ["SendOrder"]


class SendOrder:
    """The order a worker's stage threads claimed their chunks in, which their requests
    keep: a chunk of an earlier batch never waits at a worker behind a later batch's (a
    map stuck on a sample holds up its own batch and later ones, never an earlier one).
    claim() numbers a chunk as it is taken; a request waits for its turn(); done() after
    it went out, or for a chunk never sent. Numbers of an earlier generation (threads of
    a pool since stopped) count for nothing. The claims themselves come in batch order:
    the hand-off serves a batch only once every earlier one reached it (NOTE [ Hand-off
    order ] in csrc/pipeline/stream.cpp)."""

    _TURN_SECONDS = 5.0  # a safety net: an earlier request that never says done()

    def __init__(self, workers: int):
        self._take = [threading.Lock() for _ in range(workers)]
        self._cv = threading.Condition()
        self._gen = 0
        self._claimed = [0] * workers
        self._next = [0] * workers
        self._done: List[Set[int]] = [set() for _ in range(workers)]

    def reset(self) -> None:
        """A new generation of stage threads (the pool starts again)."""
        with self._cv:
            self._gen += 1
            n = len(self._claimed)
            self._claimed, self._next = [0] * n, [0] * n
            self._done = [set() for _ in range(n)]
            self._cv.notify_all()

    def claim(self, worker: int, take: Any) -> Any:
        """take()'s chunk (task, lo, hi) numbered for `worker`: (task, lo, hi, turn)."""
        with self._take[worker]:
            item = take()
            if item is None:
                return None
            with self._cv:
                turn = (self._gen, self._claimed[worker])
                self._claimed[worker] += 1
        return (*item, turn)

    def wait(self, worker: int, turn: Tuple[int, int], stopped: Any) -> None:
        deadline = time.monotonic() + self._TURN_SECONDS
        with self._cv:
            while turn[0] == self._gen and self._next[worker] < turn[1] and not stopped() \
                    and time.monotonic() < deadline:
                self._cv.wait(0.05)

    def done(self, worker: int, turn: Tuple[int, int]) -> None:
        with self._cv:
            if turn[0] != self._gen:
                return
            done = self._done[worker]
            done.add(turn[1])
            while self._next[worker] in done:
                done.discard(self._next[worker])
                self._next[worker] += 1
            self._cv.notify_all()


class _Taker:
    """A pool thread's wait: a chunk from the hand-off, within a slice (the GIL is
    released while it waits). Holds the hand-off, never the stage."""

    __slots__ = ("handoff", "order")
    slice_ms = 100

    def __init__(self, handoff: Any, order: Optional[SendOrder] = None):
        self.handoff = handoff
        self.order = order  # process workers: each chunk numbered for its worker

    def __call__(self, slot: int) -> Any:
        if self.order is None:
            return self.handoff.take(self.slice_ms)
        return self.order.claim(slot // PROCESS_THREADS_PER_WORKER,
                                lambda: self.handoff.take(self.slice_ms))

    def wake(self) -> None:
        """Ends the waits now (the process is exiting)."""
        self.handoff.close()
