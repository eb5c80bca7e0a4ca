"""A small pool of daemon threads for transfers.

``concurrent.futures.ThreadPoolExecutor`` joins its threads when the interpreter exits,
so a process with a download in flight (or stuck on a stalled server) could not exit
until it ended; and its shutdown cancels queued work in a way whose callbacks see
``CancelledError``. This pool's threads are daemons, and its owner cancels their transfers
and waits for them a bounded time (:meth:`DaemonPool.join`), so neither ``close()`` nor
exit ever waits on the network.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Deque, List, Tuple

from .retry import Cancelled

__all__ = ["DaemonPool"]


class DaemonPool:
    """``submit(fn, *args) -> Future`` on at most ``threads`` daemon threads named
    ``name-N``, started as work arrives."""

    def __init__(self, threads: int, name: str):
        self._max = max(1, threads)
        self._name = name
        self._cond = threading.Condition()
        self._queue: Deque[Tuple[Future, Callable[..., Any], Tuple[Any, ...]]] = \
            collections.deque()
        self._threads: List[threading.Thread] = []
        self._idle = 0
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        fut: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the pool is shut down")
            self._queue.append((fut, fn, args))
            if self._idle == 0 and len(self._threads) < self._max:
                t = threading.Thread(target=self._work, daemon=True,
                                     name=f"{self._name}-{len(self._threads)}")
                self._threads.append(t)
                t.start()
            else:
                self._cond.notify()
        return fut

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                if not self._queue:
                    return  # closed
                fut, fn, args = self._queue.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as e:  # handed to the future's owner
                fut.set_exception(e)
            else:
                fut.set_result(result)

    def shutdown(self) -> None:
        """No new work; queued work that has not started fails with :class:`Cancelled`."""
        with self._cond:
            self._closed = True
            queued = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for fut, _, _ in queued:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(Cancelled())

    def join(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for the threads to end (after
        :meth:`shutdown`); whether they all did."""
        deadline = time.monotonic() + timeout
        for t in list(self._threads):
            if t is threading.current_thread():
                continue
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads
                       if t is not threading.current_thread())

    @property
    def closed(self) -> bool:
        return self._closed
