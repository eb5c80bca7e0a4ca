"""What each of the Python stage's threads is doing (NOTE [ Python stage ] in
stoker/_stage/__init__.py): the phase, the batch and the sample it is on and since when,
read by the stall report (stall.py) and the stuck-worker checks (stuck.py)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional

__all__ = ["Activity", "Doing", "USER_PHASES"]

# The phases of a stage thread that run user code (not "worker": waiting for a process).
USER_PHASES = ("dataset", "map", "collate_fn", "batch_map")


class Doing:
    """What one stage thread is doing: the phase ("dataset", "map", "collate_fn",
    "batch_map", "worker": a chunk at a worker process; None: idle), the batch, the
    sample's dataset index, since when (time.monotonic()), and the worker process (phase
    "worker"). A worker process's record is its shared status (transport.py), which has
    the same at() and idle()."""

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
        # (and the batch let go: a record kept past its thread's work, or past close(),
        # would hold the batch's memory)
        self.phase = None
        self.task = None


class Activity:
    """The records of one stage's threads (a thread left behind by close() keeps its own
    until it ends), and the calling thread's own: ``here.doing``, which the code running
    user code marks (in a worker process, its shared status: ``Samples.set_status``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._doing: Dict[threading.Thread, Doing] = {}
        self.here = threading.local()

    def mine(self) -> Doing:
        """The calling stage thread's record (made at its first chunk)."""
        doing = getattr(self.here, "doing", None)
        if doing is None:
            me = threading.current_thread()
            doing = self.here.doing = Doing(me)
            with self._lock:
                for t in [t for t in self._doing if not t.is_alive()]:
                    del self._doing[t]
                self._doing[me] = doing
        return doing

    def current(self) -> Any:
        """The calling thread's record, if it has one (None on the consumer's thread)."""
        return getattr(self.here, "doing", None)

    def threads(self, which: Optional[Callable[[Doing], bool]] = None) -> List[Doing]:
        """The records of the threads alive now (those for which `which` holds)."""
        with self._lock:
            return [d for d in self._doing.values()
                    if d.thread.is_alive() and (which is None or which(d))]
