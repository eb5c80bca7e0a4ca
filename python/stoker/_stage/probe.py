"""The Python stage's watch on the global random generators (NOTE [ Global random
generators ] in workers.py): the first sample a stage thread runs is watched, and once it
drew from them, the threads either run what they hold seeded (python_workers="auto", on
its way to worker processes) or never run ahead of the loop's epoch."""

from __future__ import annotations

import pickle
import threading
import warnings
from typing import Any, Optional

__all__ = ["GlobalDraws"]


class GlobalDraws:
    """What the watched first sample told, and the epoch the loop has opened to threads
    held to it. ``done`` is set once the answer is known; ``drew`` until the consumer saw
    it (seen()); ``hold_ahead``: threads run none of an epoch the loop has not started."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claimed = False
        self.done = threading.Event()
        # a thread stopped waiting for the answer: after how long, else 0
        self.overran = 0.0
        self.drew = False
        self.hold_ahead = False
        self.open_epoch = 0
        self._opened = threading.Condition(threading.Lock())
        self._unpicklable: Optional[str] = None  # the sample could not be pickled: why

    def claim(self, watched: bool) -> bool:
        """Whether the caller's sample is the one watched: the first (once per loader, by
        one thread), and only where `watched` (threads that run the code themselves)."""
        with self._lock:
            if self._claimed:
                return False
            self._claimed = True
        if not watched:
            self.done.set()
        return watched

    def leaves_processes(self, row: Any) -> bool:
        """Whether a sample can come back from a worker process (pickled, as DataLoader's
        workers send theirs); if not, python_workers="auto" stays on threads, as
        DataLoader's num_workers=0 never pickles (a namedtuple class nested in another
        class, a lambda in a dict...)."""
        try:
            pickle.dumps(row, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            self._unpicklable = f"{type(e).__name__}: {e}"
            return False
        return True

    def wait_for_epoch(self, task: Any) -> None:
        """Threads held to the loop's epochs run none of an epoch it has not started (the
        next epoch's prefetch): the user's process is left alone between epochs."""
        with self._opened:
            while task.epoch > self.open_epoch and not task.stopped:
                self._opened.wait(0.1)

    def open(self, epoch: int) -> None:
        """The loop asks for a batch of `epoch`: threads held back may run it."""
        with self._opened:
            if epoch > self.open_epoch:
                self.open_epoch = epoch
                self._opened.notify_all()

    def seen(self, auto: bool, processes: bool) -> bool:
        """On the consumer's thread, once the watched sample drew from the global
        generators: whether auto goes to processes now (said in a warning if the first
        sample overran the watch); threads warn, once."""
        self.drew = False
        if auto:
            if self.overran:
                warnings.warn(
                    f"stoker: the dataset's __getitem__ (or map) draws from the global random "
                    f"generators (random, numpy.random or torch), so python_workers='auto' "
                    f"moves to worker processes (each sample's generators seeded from (seed, "
                    f"epoch, index)); but its first sample took over {self.overran:g} s, "
                    "and samples that ran on threads meanwhile got draws that depend on "
                    "timing: the first batches may differ from run to run. Pass "
                    "python_workers='process' to run every sample that way",
                    RuntimeWarning, stacklevel=4)
            return True
        if processes:
            return False
        if self._unpicklable is not None:  # auto, and processes could not send them back
            warnings.warn(
                "stoker: the dataset's __getitem__ (or map) draws from the global random "
                "generators (random, numpy.random or torch), but its samples cannot be "
                f"pickled ({self._unpicklable}), so they stay on worker threads, where which "
                "sample gets which draw depends on timing: batches differ from run to run and "
                "a resume is not exact. Make the samples picklable (python_workers='process' "
                "then seeds each sample's global generators), or draw from map's rng",
                RuntimeWarning, stacklevel=4)
            return False
        warnings.warn(
            "stoker: the dataset's __getitem__ (or map) draws from the global random "
            "generators (random, numpy.random or torch): on worker threads, which sample gets "
            "which draw depends on timing, so batches differ from run to run and a resume is "
            "not exact. Use python_workers='process' (each sample's global generators seeded "
            "from (seed, epoch, index)), or draw from map's rng", RuntimeWarning, stacklevel=4)
        return False
