"""An IterableDataset's worker threads (NOTE [ Iterable datasets ] in iterable.py): each
iterates its share of the dataset (get_worker_info()) and puts each sample, through map,
into its bounded queue, for the iterator of its epoch to merge."""

from __future__ import annotations

import atexit
import copy
import queue
import threading
import time
import warnings
import weakref
from typing import Any, List

import torch

from .errors import add_note
from .workers import set_thread_worker_info

__all__ = ["MIN_QUEUE_ROWS", "MIN_WORKER_ROWS", "DONE", "Skipped", "Failed", "StreamWorker",
           "datapipes", "live_workers", "warn_self_split", "watch_rank_calls"]

MIN_QUEUE_ROWS = 64  # rows the workers may hold ahead of the loop (automatic prefetch)
MIN_WORKER_ROWS = 16  # and each of them
DONE = object()  # a worker's stream ended
_EXIT_JOIN_SECONDS = 2.0

# Worker threads alive (an epoch left with a break keeps them until its iterator goes): at
# exit they are told to stop and joined before the interpreter finalizes, as the stage's
# threads are (stoker/_stage/pool.py): a daemon thread that takes the GIL back from a
# native call (torch's) once finalization began is unwound through that C++ frame, which
# aborts the process ("terminate called without an active exception").
live_workers: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()


@atexit.register
def _stop_workers_at_exit() -> None:
    workers = list(live_workers)
    for w in workers:
        w.stop.set()  # type: ignore[attr-defined]
    deadline = time.monotonic() + _EXIT_JOIN_SECONDS
    for w in workers:
        if w is not threading.current_thread():
            w.join(max(0.0, deadline - time.monotonic()))


# A dataset asking torch.distributed for its rank from a worker of a stream that stoker
# splits across ranks splits itself too (NOTE [ Iterable datasets ]): said once per stream.
_watching = threading.local()
_watch_lock = threading.Lock()
_watched = False


def _watch_rank_calls(stream: Any) -> None:
    """In a worker thread of a stream that stoker splits: torch.distributed.get_rank() or
    get_world_size() called from here (the dataset splitting itself) warns, once."""
    global _watched
    _watching.stream = stream
    with _watch_lock:
        if _watched:
            return
        _watched = True
        dist = torch.distributed
        for name in ("get_rank", "get_world_size"):
            original = getattr(dist, name)

            def watched(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                s = getattr(_watching, "stream", None)
                if s is not None and not s.warned_self_split:
                    s.warned_self_split = True
                    if not getattr(_watching, "quiet", False):  # a process says it: its reply
                        warn_self_split()
                return _original(*args, **kwargs)

            setattr(dist, name, watched)


def warn_self_split() -> None:
    warnings.warn(
        "stoker: the IterableDataset asks torch.distributed for its rank (it splits itself "
        "by rank) while stoker splits its stream across ranks too (even_batches=, rank= or "
        "world_size= given): each rank would get a 1/world_size share of a share. Leave "
        "those out (each rank is then given the dataset as it is, DataLoader's rule) or "
        "stop the dataset's own split", RuntimeWarning, stacklevel=3)


def watch_rank_calls(stream: Any, quiet: bool = False) -> None:
    """_watch_rank_calls; `quiet`: only marked on the stream (a worker process, whose
    replies carry the mark to the loader's process, which warns)."""
    _watch_rank_calls(stream)
    _watching.quiet = quiet


class Failed:
    """A row whose map raised: the error, raised by the loop at the row's batch."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


class Skipped:
    """A row whose map raised with on_error="skip": consumed, not yielded; `what` names it
    and its error (the warning at the epoch's end says it)."""

    __slots__ = ("what",)

    def __init__(self, what: str):
        self.what = what


class StreamWorker(threading.Thread):
    """Worker `wid` of `n` of one epoch: its iterator of the dataset, each sample through
    map (keyed by its place in the stream), into its queue."""

    def __init__(self, it: Any, wid: int, n: int, pipe: Any = None):
        super().__init__(name=f"stoker-iterable-{wid}", daemon=True)
        self.pipe = pipe  # an IterDataPipe's copy for this worker (datapipes), else None
        # rows it may read ahead of the stage: a credit is taken before each row is read
        # (so that no row is read past them) and given back when the stage takes one
        self.q: "queue.Queue[Any]" = queue.Queue()
        self.credits = threading.Semaphore(it.stream.queue_rows(n))
        self.it, self.wid, self.n = it, wid, n
        self.stop = threading.Event()

    def _credit(self) -> bool:
        while not self.stop.is_set():
            if self.credits.acquire(timeout=0.1):
                return True
        return False

    def take(self, timeout: float, held: Any = None) -> Any:
        """The next row (a Failed, DONE); queue.Empty after `timeout` seconds. (`held`:
        the leases of rows that are views, which a thread's rows never are.)"""
        item = self.q.get(timeout=timeout)
        self.credits.release()
        return item

    def run(self) -> None:
        it = self.it
        s = it.stream
        try:
            set_thread_worker_info(self.wid, self.n, s.seed, s.dataset)
            if s.split_ranks and it.world > 1:
                _watch_rank_calls(s)
            if s.worker_init_fn is not None and s.first_start(self.wid):
                s.worker_init_fn(self.wid)
            rows = iter(s.dataset if self.pipe is None else self.pipe)
            j = 0
            while self._credit():
                t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                try:
                    item = next(rows)
                except StopIteration:
                    break
                # keyed by the row's place in the merged stream while every worker runs
                # (rows are taken round-robin): the same draws for any timing
                row = it.mapped(item, j * self.n + self.wid)
                s.python_ns += time.perf_counter_ns() - t0  # the row's time in Python
                s.python_cpu_ns += time.thread_time_ns() - c0
                self.q.put(row)
                j += 1
        except BaseException as e:  # the loop raises it at this worker's place
            self.q.put(Failed(add_note(e, f"stoker: raised by the IterableDataset in "
                                          f"worker {self.wid}")))
        self.q.put(DONE)


def datapipes(stream: Any, n: int) -> List[Any]:
    """An IterDataPipe's graphs for an epoch's workers, as DataLoader makes them: one
    seed drawn at iter() from the loader's generator (torch's global one without it)
    for the shufflers of every worker, and each worker's own copy sharded to it (its
    sharding_filter), since a DataPipe has one iterator at a time. [] for other
    datasets."""
    ds = stream.dataset
    if not isinstance(ds, torch.utils.data.IterDataPipe):
        return []
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=stream.generator).item())
    settings = torch.utils.data.graph_settings
    pipes = []
    for w in range(max(1, n)):
        pipe = ds if n == 0 else copy.deepcopy(ds)
        if n > 0:
            pipe = settings.apply_sharding(pipe, n, w)
        pipes.append(settings.apply_random_seed(pipe, torch.Generator().manual_seed(seed)))
    return pipes
