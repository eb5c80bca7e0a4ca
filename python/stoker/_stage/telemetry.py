"""Where the Python stage's time goes: CPU, waiting for a core, blocked (the GIL), and
the C++ fetch time the stage leaves out of its own."""

from __future__ import annotations

import threading
import time
from typing import Tuple

__all__ = ["thread_sched", "native_times"]


def thread_sched() -> Tuple[int, int]:
    """(CPU ns, ns waiting for a CPU) of the calling thread so far, from the kernel's
    schedstat: a thread that is neither on a CPU nor waiting for one is blocked, which
    for the stage's threads is mostly waiting for the GIL. Falls back to (thread time, 0)
    where there is no /proc."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            cpu, wait, _ = f.read().split()
        return int(cpu), int(wait)
    except (OSError, ValueError):
        return time.thread_time_ns(), 0


class _NativeTimes(threading.local):
    """Time the current thread spent in C++ fetching samples (read, decode, ops), so the
    Python stage's time leaves it out; sources add to it."""

    def __init__(self) -> None:
        self.native_ns = self.read_ns = self.decode_ns = self.ops_ns = self.bytes = 0

    def reset(self) -> "_NativeTimes":
        self.native_ns = self.read_ns = self.decode_ns = self.ops_ns = self.bytes = 0
        return self


native_times = _NativeTimes()
