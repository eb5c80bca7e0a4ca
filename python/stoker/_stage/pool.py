"""The Python threads of a loader's stage (``stoker-python-<i>``), and their end before
the interpreter finalizes.

Nothing here waits forever on user code: stop() and the end of the process join each
thread for at most JOIN_SECONDS in all; a thread still in user code after that (a map
that never returns) is left behind, a daemon thread told to stop: it ends when that code
returns, touching nothing of stoker's C++ once the process is exiting (exiting())."""

from __future__ import annotations

import atexit
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Callable, Dict, List, Tuple

from .. import _core

__all__ = ["StagePool", "JOIN_SECONDS", "exiting"]

# How long stop() and the process's end wait for the stage's threads, all together.
JOIN_SECONDS = 2.0
_exiting = False


def exiting() -> bool:
    """Whether the process is exiting (the stage's threads were told to end at exit): a
    thread left in user code must not call into C++ with the GIL released once it
    returns, as the interpreter may be finalizing (NOTE in _stop_every_stage_thread)."""
    return _exiting


# Threads a join gave up on (in user code): later joins do not wait for them again.
_abandoned: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()


def _join(threads: List[threading.Thread], seconds: float) -> List[threading.Thread]:
    """Joins `threads` (not the calling one, nor one given up on before) for at most
    `seconds` in all; those left, given up on."""
    deadline = time.monotonic() + seconds
    me = threading.current_thread()
    left = []
    for t in threads:
        if t is me or t in _abandoned:
            continue
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            left.append(t)
            _abandoned.add(t)
    return left


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
                 threads: int, name: str = "stoker-python", start_name: str = ""):
        self._owner = weakref.ref(owner)
        self._wait = wait
        self._handle_name = handle_name
        self._start_name = start_name  # the owner's method each thread calls first (slot)
        self.paused = False  # quiesce(): every thread parks after its current unit
        self._parked = [0]  # threads parked now (a holder: parked threads hold no pool)
        self._name = name
        self._size = max(1, int(threads))
        self._active = self._size
        self._threads: List[threading.Thread] = []
        # Per slot: its thread's generation; a thread whose slot moved on (replace()) ends
        # once it is back from the unit it holds.
        self._gens: List[int] = [0] * self._size
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

    def grow(self, n: int) -> None:
        """At least `n` threads from now on (those added start at once if the pool runs)."""
        with self._lock:
            if n <= self._size:
                return
            old, self._size = self._size, n
            self._active = n
            self._gens += [0] * (n - old)
            if not self._threads or self._stop.is_set():
                return  # start() makes them all
            for i in range(old, n):
                self._threads.append(self._thread(i))
                self._threads[-1].start()

    def quiesce(self, timeout: float) -> bool:
        """Parks every thread once it has finished the unit it holds; True once all are
        parked (within `timeout` s), else False (resume() either way)."""
        deadline = time.monotonic() + timeout
        with self._wake:
            self.paused = True
            self._wake.notify_all()
            while self._parked[0] < self.alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(min(left, 0.05))
        return True

    def resume(self) -> None:
        with self._wake:
            self.paused = False
            self._wake.notify_all()

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
        _join(old, JOIN_SECONDS)  # told to stop; one still in user code is left behind
        with self._lock:
            self._stop = threading.Event()
            self._threads = []
            for i in range(self._size):
                t = self._thread(i)
                self._threads.append(t)
                t.start()

    def _thread(self, i: int) -> threading.Thread:
        return threading.Thread(target=_pool_loop,
                                args=(self._owner, self._wait, self._handle_name, i,
                                      self._stop, weakref.ref(self), self._start_name,
                                      self._gens[i]),
                                name=f"{self._name}-{i}", daemon=True)

    def replace(self, thread: threading.Thread) -> bool:
        """A new thread in `thread`'s slot, now; `thread` (stuck in user code: NOTE [ Stuck
        workers ] in stuck.py) is left behind and ends once that code returns. False if
        it is not one of the pool's running threads."""
        with self._lock:
            if self._stop.is_set() or thread not in self._threads:
                return False
            i = self._threads.index(thread)
            self._gens[i] += 1
            _abandoned.add(thread)
            self._threads[i] = self._thread(i)
            self._threads[i].start()
        return True

    def stop(self, join: bool = True) -> List[threading.Thread]:
        """Tells the threads to end; with `join`, waits for them for at most
        JOIN_SECONDS. The threads still running (in user code), left behind."""
        with self._wake:
            self._stop.set()
            self._wake.notify_all()
            threads = list(self._threads)
        return _join(threads, JOIN_SECONDS) if join else []


# Every stage thread alive in this process, with its stop event and its wait: at exit
# they are stopped and joined before the interpreter finalizes. (A daemon thread that
# takes the GIL back after finalization began is ended by an unwind through the C++
# frame that released it, which aborts the process.)
_running: Dict[threading.Thread, Tuple[threading.Event, Callable[[int], Any]]] = {}
_running_lock = threading.Lock()


@atexit.register
def _stop_every_stage_thread() -> None:
    """Stops and joins the stage's threads before the interpreter finalizes, for at most
    JOIN_SECONDS: one still in user code then is left (it is a daemon thread; it ends at
    its next take of the GIL once finalization began, in CPython's own code, as long as
    it makes no call that releases the GIL in a C++ frame of stoker's: exiting())."""
    global _exiting
    _exiting = True
    with _running_lock:
        threads = list(_running.items())
    for _, (stop, wait) in threads:
        stop.set()
        wake = getattr(wait, "wake", None)
        if wake is not None:
            wake()
    _join([t for t, _ in threads], JOIN_SECONDS)


def _pool_loop(owner_ref: "weakref.ref[Any]", wait: Callable[[int], Any], handle_name: str,
               slot: int, stop: threading.Event, pool_ref: "weakref.ref[StagePool]",
               start_name: str = "", gen: int = 0) -> None:
    me = threading.current_thread()
    with _running_lock:
        _running[me] = (stop, wait)
    try:
        owner = owner_ref()
        if start_name and owner is not None:
            getattr(owner, start_name)(slot)  # reports its own failure to the owner
        del owner
        _serve(owner_ref, wait, handle_name, slot, stop, pool_ref, gen)
    finally:
        with _running_lock:
            _running.pop(me, None)


def _serve(owner_ref: "weakref.ref[Any]", wait: Callable[[int], Any], handle_name: str,
           slot: int, stop: threading.Event, pool_ref: "weakref.ref[StagePool]",
           gen: int = 0) -> None:
    try:
        _core.set_thread_name(threading.current_thread().name)
    except Exception:  # only a name
        pass
    while not stop.is_set():
        pool = pool_ref()
        if pool is None or owner_ref() is None or pool._gens[slot] != gen:
            return  # (replaced: another thread serves the slot)
        if slot >= pool._active or pool.paused:  # parked (the tuner, a quiesce): wait,
            wake, parked = pool._wake, pool._parked  # holding neither pool nor owner
            del pool
            with wake:
                parked[0] += 1
                wake.notify_all()
                wake.wait(0.5)
                parked[0] -= 1
            continue
        del pool
        try:
            item = wait(slot)
        except BaseException:  # the wait itself failed: a bug; report it, keep serving
            _report_internal()
            time.sleep(0.05)
            continue
        owner = owner_ref()
        if owner is None or _exiting:
            return
        # A chunk taken is run even when the stop came meanwhile: never dropped, as a
        # batch with a chunk that nobody runs would never complete (a stopped stream's
        # chunk ends at once: run_chunk sees task.stopped).
        if item is not None:
            try:
                getattr(owner, handle_name)(item, slot)
            except BaseException:  # the handler fails its batch itself; this is a bug
                _report_internal()
        del owner, item


def _report_internal() -> None:
    sys.stderr.write(f"stoker: internal error in the Python stage's thread "
                     f"{threading.current_thread().name}:\n{traceback.format_exc()}")
