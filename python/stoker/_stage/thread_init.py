"""DataLoader's worker protocol on the Python stage's threads (NOTE [ Python stage ] in
stoker/_stage/__init__.py): get_worker_info() answers in each stage thread that runs the
user's code, worker_init_fn runs when it starts and, without persistent_workers, again at
each epoch's start (where DataLoader would have made the worker again). Worker processes
do the same for themselves (Samples.worker_started)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from .errors import add_note
from .placement import Placement
from .workers import set_thread_worker_info, worker_info_wanted

__all__ = ["ThreadInit"]


class ThreadInit:
    """worker_init_fn (None when not given) on the `threads` stage threads of a stage
    over `source`, seeded with `seed`, unless `placement` says worker processes run the
    user's code. Its error fails the next batch, in the loop (take_error())."""

    def __init__(self, worker_init_fn: Optional[Callable], persistent_workers: bool,
                 source: Any, seed: int, threads: int, placement: Placement):
        self.worker_init_fn = worker_init_fn
        self.persistent_workers = persistent_workers
        self._source = source
        self._seed = seed
        self._threads = threads
        self._placement = placement
        self._epochs: Dict[int, int] = {}  # stage thread -> the epoch it last ran init in
        self._error: Optional[BaseException] = None
        # the epoch of the last iter(), which starts the threads (None before the first)
        self.start_epoch: Optional[int] = None

    def started(self, slot: int) -> None:
        """In each stage thread as it starts: get_worker_info() answers there,
        worker_init_fn runs."""
        if self._placement.processes:
            return  # the worker processes call it (a process per two threads)
        # the epoch this init is for: a thread that takes nothing of it runs init again
        # before it reads anything of a later one (epoch())
        if self.start_epoch is None:
            self._epochs.pop(slot, None)
        else:
            self._epochs[slot] = self.start_epoch
        try:
            if self.worker_init_fn is not None or worker_info_wanted(self._source):
                set_thread_worker_info(slot, self._threads, self._seed,
                                       getattr(self._source, "obj", self._source))
            if self.worker_init_fn is not None:
                self.worker_init_fn(slot)
        except BaseException as e:
            add_note(e, f"stoker: raised by worker_init_fn in worker thread {slot}")
            self._error = e

    def epoch(self, slot: int, epoch: int) -> None:
        """Stage thread `slot` takes work of `epoch`: without persistent_workers, the first
        time it does in a later epoch than its last, worker_init_fn runs again."""
        last = self._epochs.get(slot)
        self._epochs[slot] = epoch
        if last is None or last == epoch or self.persistent_workers or \
                self.worker_init_fn is None or self._placement.processes:
            return
        try:
            self.worker_init_fn(slot)
        except BaseException as e:
            add_note(e, f"stoker: raised by worker_init_fn in worker thread {slot} at the "
                        f"start of epoch {epoch}")
            self._error = e

    def take_error(self) -> Optional[BaseException]:
        """worker_init_fn's error since the last call, if it raised (then raised in the
        loop)."""
        e, self._error = self._error, None
        return e
