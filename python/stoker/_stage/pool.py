"""The Python threads of a loader's stage (``stoker-python-<i>``), and their end before
the interpreter finalizes."""

from __future__ import annotations

import atexit
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Callable, Dict, List, Tuple

from .. import _core

__all__ = ["StagePool"]



class StagePool:
    """The Python threads of one loader's stage, named ``stoker-python-<i>``.

    Each thread loops: ``wait(slot)`` waits for a unit of work (with the GIL released,
    for at most a short slice) and returns it or None; a unit goes to the owner's method
    ``handle_name``. Threads whose slot is at or above ``active`` park on an event
    instead (autotuning moves ``active`` as it moves the C++ workers). ``stop()`` ends
    them; the next ``start()`` begins new ones. While waiting a thread holds only `wait`
    (which must not hold the owner), and the owner only while handling a unit, so a
    loader dropped without ``close()`` is still collected, and its threads end within a
    slice.
    """

    def __init__(self, owner: Any, wait: Callable[[int], Any], handle_name: str,
                 threads: int, name: str = "stoker-python"):
        self._owner = weakref.ref(owner)
        self._wait = wait
        self._handle_name = handle_name
        self._name = name
        self._size = max(1, int(threads))
        self._active = self._size
        self._threads: List[threading.Thread] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pid = -1

    @property
    def size(self) -> int:
        return self._size

    @property
    def active(self) -> int:
        return self._active

    def alive(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    def set_active(self, n: int) -> None:
        with self._wake:
            n = max(1, min(self._size, int(n)))
            if n != self._active:
                self._active = n
                self._wake.notify_all()

    def running(self) -> bool:
        """Whether the threads run in this process (cheap: the consumer asks per batch)."""
        import os

        return self._pid == os.getpid() and not self._stop.is_set() and bool(self._threads)

    def start(self) -> None:
        """Starts the threads (again after stop(), or in a process forked from the one
        that started them); a no-op while they run."""
        import os

        pid = os.getpid()
        with self._lock:
            if pid == self._pid and self._threads and not self._stop.is_set() and \
                    all(t.is_alive() for t in self._threads):
                return
            old = self._threads if pid == self._pid else []  # a child has none of them
            self._pid = pid
            self._stop.set()
            self._wake.notify_all()
        me = threading.current_thread()
        for t in old:
            if t is not me:
                t.join()
        with self._lock:
            self._stop = threading.Event()
            self._threads = []
            for i in range(self._size):
                t = threading.Thread(target=_pool_loop,
                                     args=(self._owner, self._wait, self._handle_name, i,
                                           self._stop, weakref.ref(self)),
                                     name=f"{self._name}-{i}", daemon=True)
                self._threads.append(t)
                t.start()

    def stop(self, join: bool = True) -> None:
        with self._wake:
            self._stop.set()
            self._wake.notify_all()
            threads = list(self._threads)
        if join:
            me = threading.current_thread()
            for t in threads:
                if t is not me:
                    t.join()


# Every stage thread alive in this process, with its stop event and its wait: at exit
# they are stopped and joined before the interpreter finalizes. (A daemon thread that
# takes the GIL back after finalization began is ended by an unwind through the C++
# frame that released it, which aborts the process.)
_running: Dict[threading.Thread, Tuple[threading.Event, Callable[[int], Any]]] = {}
_running_lock = threading.Lock()


@atexit.register
def _stop_every_stage_thread() -> None:
    with _running_lock:
        threads = list(_running.items())
    for _, (stop, wait) in threads:
        stop.set()
        wake = getattr(wait, "wake", None)
        if wake is not None:
            wake()
    me = threading.current_thread()
    for t, _ in threads:
        if t is not me:
            t.join()


def _pool_loop(owner_ref: "weakref.ref[Any]", wait: Callable[[int], Any], handle_name: str,
               slot: int, stop: threading.Event, pool_ref: "weakref.ref[StagePool]") -> None:
    me = threading.current_thread()
    with _running_lock:
        _running[me] = (stop, wait)
    try:
        _serve(owner_ref, wait, handle_name, slot, stop, pool_ref)
    finally:
        with _running_lock:
            _running.pop(me, None)


def _serve(owner_ref: "weakref.ref[Any]", wait: Callable[[int], Any], handle_name: str,
           slot: int, stop: threading.Event, pool_ref: "weakref.ref[StagePool]") -> None:
    try:
        _core.set_thread_name(threading.current_thread().name)
    except Exception:  # only a name
        pass
    while not stop.is_set():
        pool = pool_ref()
        if pool is None or owner_ref() is None:
            return
        if slot >= pool._active:  # parked by the tuner: wait, holding neither pool nor owner
            wake = pool._wake
            del pool
            with wake:
                wake.wait(0.5)
            continue
        del pool
        try:
            item = wait(slot)
        except BaseException:  # the wait itself failed: a bug; report it, keep serving
            _report_internal()
            time.sleep(0.05)
            continue
        owner = owner_ref()
        if owner is None:
            return
        if item is not None and not stop.is_set():
            try:
                getattr(owner, handle_name)(item, slot)
            except BaseException:  # the handler fails its batch itself; this is a bug
                _report_internal()
        del owner, item


def _report_internal() -> None:
    sys.stderr.write(f"stoker: internal error in the Python stage's thread "
                     f"{threading.current_thread().name}:\n{traceback.format_exc()}")
