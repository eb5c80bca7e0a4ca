"""One sample of the Python stage (NOTE [ Python stage ] in stoker/_stage/__init__.py):
fetched from its source, mapped, checked against the batch's layout, or replaced under
on_error="skip"; in a stage thread, or in a worker process (NOTE [ Python stage processes
] in processes.py), which gets this part of the stage and nothing else of it."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .collate import BatchLayout
from .errors import add_note, names_itself
from .rng import rng_from_key, rng_keys
from .sources import DatasetSource
from .state import forks
from .workers import seed_globals, set_process_worker_info

__all__ = ["Samples"]


class Samples:
    """Sample j of `source`: fetched (``source.sample(j)``, or ``source.raw(j)`` for
    collate_fn without map), mapped by `map_fn` with its generator (seed, epoch, j),
    checked against `layout` unless collate_fn takes the samples as they are. `here` is
    the thread-local whose ``doing`` the calling thread's record is (activity.py): each
    phase of user code is marked on it for the stall report."""

    def __init__(self, source: Any, layout: BatchLayout, *, map_fn: Optional[Callable],
                 collate_fn: Optional[Callable], seed: int, skip: bool,
                 worker_init_fn: Optional[Callable], persistent_workers: bool,
                 here: threading.local):
        self.source = source
        self.layout = layout
        self.map_fn = map_fn
        self.collate_fn = collate_fn
        self.seed = seed
        self.skip = skip
        self.worker_init_fn = worker_init_fn
        self.persistent_workers = persistent_workers
        self._here = here
        # A process forked inside user code that returns from it ends there (NOTE
        # [ Worker faults ] in lifecycle.py): the pid the stage runs in.
        self._pid = os.getpid()
        self._forks = forks()

    def describe(self, index: int) -> str:
        """Sample `index` in words (for messages: never raises)."""
        try:
            return self.source.describe(index)
        except Exception:
            return f"dataset index {index}"

    def produce(self, index: int, epoch: int, key: Optional[np.ndarray]) -> Any:
        """Sample `index` fetched (and mapped): what map returns, or the dataset's item."""
        source = self.source
        doing = getattr(self._here, "doing", None)
        try:
            if doing is not None:
                doing.at(index, "dataset")
            if self.map_fn is None and self.collate_fn is not None:
                return source.raw(index, epoch)
            sample = source.sample(index, epoch)
        except BaseException as e:
            if not names_itself(e):
                add_note(e, f"stoker: raised while loading {source.describe(index)}")
            raise
        finally:
            self.check_fork()
        if self.map_fn is not None:
            try:
                if doing is not None:
                    doing.at(index, "map")
                sample = self.map_fn(sample, rng_from_key(key))
            except BaseException as e:
                add_note(e, f"stoker: raised by map for {source.describe(index)}")
                raise
            finally:
                self.check_fork()
        return sample

    def row(self, index: int, epoch: int, key: Optional[np.ndarray],
            produced: Optional[List[Any]] = None) -> Any:
        """A batch row: produce()'s value, checked against the layout (unless collate_fn
        takes the samples as they are); `produced` gets the value itself."""
        sample = self.produce(index, epoch, key)
        if produced is not None:
            produced.append(sample)
        if self.collate_fn is not None:
            return sample
        return self.layout.check(sample, lambda: self.source.describe(index))

    def replacement(self, index: int, epoch: int, make: Callable[[int, int, Any], Any],
                    stopped: Callable[[], bool] = lambda: False) -> Tuple[Any, bool]:
        """on_error="skip": the next sample in dataset order whose fetch and map succeed
        takes the place of a failed one, as the C++ sample writer does for a bad record;
        each with its own generator. (value, True), or (None, False) if none does."""
        n = len(self.source)
        for step in range(1, n):
            if stopped():
                break
            alt = (index + step) % n
            try:
                key = None if self.map_fn is None else rng_keys(self.seed, epoch, [alt])[0]
                return make(alt, epoch, key), True
            except Exception:
                continue
        return None, False

    _replacement = replacement  # (the worker process's loop, processes.py, calls it so)

    def check_fork(self) -> None:
        """After user code: a process it forked (os.fork) that returned from it ends here,
        before it could write to a worker's socket or complete a batch of the loader's
        (NOTE [ Worker faults ] in lifecycle.py); its result is ignored."""
        if forks() != self._forks and os.getpid() != self._pid:
            os._exit(0)

    # -- in a worker process ---------------------------------------------------------

    def worker_copy(self) -> Samples:
        """This part as a worker process uses it, right after fork(): a layout with a
        fresh lock (a thread of the loader's process may have held one at the fork), a
        record of its own, and a stoker dataset opened again by path and identity (the
        same generation), so that none of the loader's mutexes is inherited locked."""
        import copy

        w = copy.copy(self)
        w.layout = copy.copy(self.layout)
        w.layout._lock = threading.Lock()
        w._pid = os.getpid()
        w._forks = forks()
        w._here = threading.local()
        if isinstance(self.source, DatasetSource):
            w.source = self.source.reopened()
        return w

    def set_status(self, status: Any) -> None:
        """In a worker process: where produce() says what it is doing (shared memory the
        loader's process reads for its stall report)."""
        self._here.doing = status

    def worker_started(self, worker_id: int, num_workers: int) -> Optional[BaseException]:
        """In a worker process, first: get_worker_info() answers, worker_init_fn runs; its
        error, if it raised."""
        dataset = getattr(self.source, "obj", None)
        if dataset is None:
            dataset = getattr(self.source, "dataset", None)
        set_process_worker_info(worker_id, num_workers, self.seed, dataset)
        if self.worker_init_fn is None:
            return None
        try:
            self.worker_init_fn(worker_id)
        except BaseException as e:
            return add_note(e, f"stoker: raised by worker_init_fn in worker process "
                               f"{worker_id}")
        return None

    def worker_sample(self, index: int, epoch: int, key: Optional[np.ndarray]) -> Any:
        """In a worker process: produce()'s value, sent as it is; the loader's process
        checks it against the layout (once: NOTE [ Python stage processes ]), except with
        on_error="skip", where it is checked here too, so that a sample that does not fit
        is replaced in the worker. Python's, NumPy's and torch's global generators are
        seeded for the sample first (NOTE [ Global random generators ] in workers.py)."""
        seed_globals(self.seed, epoch, index)
        sample = self.produce(index, epoch, key)
        if self.collate_fn is None and self.skip:
            self.layout.check(sample, lambda: self.source.describe(index))
        return sample

