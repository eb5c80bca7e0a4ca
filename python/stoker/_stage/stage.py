"""The Python stage of one loader (NOTE [ Python stage ] in stoker/_stage/__init__.py):
chunks of planned batches taken from the C++ hand-off, samples fetched and mapped, the
batch assembled (native batching, collate_fn, batch_map) and completed in its ring slot.
Here PythonStage's threads and worker processes; its other parts: a chunk's samples
(chunks.py), the batch's assembly (assemble.py), the consumer's side (consumer.py)."""

from __future__ import annotations

import os
import pickle
import threading
import time
import warnings
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import torch

from .. import _loader_args
from .assemble import BatchAssembly
from .chunks import ChunkRunner
from .collate import BatchLayout
from .consumer import Consumer
from .errors import add_note
from .pool import StagePool
from .processes import ProcessWorkers, SendOrder
from .sources import MapStyleSource
from .state import (
    END,
    PROCESS_THREADS_PER_WORKER,
    _Delivery,
    _Doing,
    _Pending,
    forks,
)
from .stuck import past_their_epoch
from .taking import _Taker
from .workers import set_thread_worker_info, worker_info_wanted

__all__ = ["PythonStage", "PROCESS_THREADS_PER_WORKER", "END"]


class PythonStage(ChunkRunner, BatchAssembly, Consumer):
    """One loader's Python stage (NOTE [ Python stage ]).

    Args:
        source: gives sample j: ``sample(j)`` (a dict; fetched for map and native
            batching), ``raw(j)`` (as the dataset returns it, for collate_fn without map),
            ``describe(j)`` (for errors), ``len()``.
        map_fn, batch_map, collate_fn: the user's hooks (None when not given).
        map_fields: declared layout (``BatchLayout``).
        seed: the loader's seed.
        skip: on_error="skip".
        threads: workers (Python threads, or processes).
        batch_map_on_consumer: batch_map runs when the consumer takes the batch (device
            batches: after the copy), not in the stage.
        workers: "thread", "process", or "auto" (threads, then processes once the stage
            measures that its Python holds the GIL: NOTE [ Python stage processes ]).
        inline: num_workers=0: the consumer's thread runs the chunks, in next().
        worker_init_fn: DataLoader's, called in each worker thread or process when it
            starts, and again at each epoch's start unless `persistent_workers` (as
            DataLoader's workers, made again each epoch without it).
        unbatched: batch_size=None: a batch is one sample, as default_convert makes it
            (or as collate_fn makes it from that one sample).
    """

    def __init__(self, source: Any, *, map_fn: Optional[Callable] = None,
                 batch_map: Optional[Callable] = None, collate_fn: Optional[Callable] = None,
                 map_fields: Optional[Mapping] = None, seed: int = 0, skip: bool = False,
                 threads: int = 1, batch_map_on_consumer: bool = False,
                 workers: str = "thread", nchw_views: Sequence[str] = (),
                 inline: bool = False, worker_init_fn: Optional[Callable] = None,
                 unbatched: bool = False, persistent_workers: bool = True):
        self.source = source
        self.map_fn = map_fn
        self.batch_map = batch_map
        self.unbatched = bool(unbatched)
        if unbatched and collate_fn is None:
            collate_fn = torch.utils.data.default_convert  # DataLoader's, for batch_size=None
        self.collate_fn = collate_fn
        self.inline = bool(inline)
        self.worker_init_fn = worker_init_fn
        self.persistent_workers = bool(persistent_workers)
        self._init_epochs: Dict[int, int] = {}  # stage thread -> the epoch it last ran init in
        self.seed = int(seed)
        self.skip = bool(skip)
        self.batch_map_on_consumer = batch_map_on_consumer
        self.layout = BatchLayout(map_fields, what="map output" if map_fn is not None
                                  else "dataset item",
                                  defaults=getattr(source, "default_layout", None))
        self._threads = max(1, int(threads))
        # Batches of sample indices (map, collate_fn, a map-style dataset), or batches the
        # C++ workers assembled (batch_map alone over a stoker dataset).
        self.per_sample = map_fn is not None or collate_fn is not None or \
            isinstance(source, MapStyleSource)
        self._lock = threading.Lock()
        self._pending: Dict[int, _Pending] = {}
        self._deliveries: Dict[int, _Delivery] = {}
        self._next_ticket = 1
        self._purge_count = 0
        # batch_map on a CUDA device: its stream (NOTE [ batch_map on the device ] in
        # consumer.py).
        self.side_device: Any = None
        self._side: Any = None
        self.handoff: Any = None
        self.pool: Optional[StagePool] = None
        # "auto" starts on threads (and may switch: _maybe_switch); "process" from the start
        self.auto = workers == "auto" and self.per_sample and not self.inline
        self.processes = workers == "process" and self.per_sample and not self.inline
        # Stage threads per worker: two per worker process (NOTE [ Python stage
        # processes ]), one when the threads run the code themselves.
        self._per_worker = PROCESS_THREADS_PER_WORKER if self.processes else 1
        self._delivered = 0  # batches the consumer took (auto: when to measure)
        # auto: (wall, process CPU, the stage's Python, CPU and wait seconds) at the
        # measurement's start
        self._since: Optional[Tuple[float, ...]] = None
        self.batch_size = 1  # samples in a batch (build() sets it): chunk sizes
        self._init_error: Optional[BaseException] = None  # worker_init_fn's, raised in next()
        self._probed = False  # the global generators watched over one sample
        self._probe_done = threading.Event()  # ... and its answer known
        # a thread stopped waiting for it: after how long (PROBE_WAIT_SECONDS), else 0
        self._probe_overran = 0.0
        self._global_draws = False  # ... and it drew from them
        # ... and auto goes to processes: until then threads run each sample seeded, as a
        # worker process does (NOTE [ Global random generators ] in workers.py)
        self._seed_on_threads = False
        # ... and threads keep running them: none of an epoch the loop has not started
        self._hold_ahead = False
        self._open_epoch = 0
        self._epoch_opened = threading.Condition(threading.Lock())
        self._unpicklable: Optional[str] = None  # ... and could not be pickled: why
        # Image fields of a C++-assembled batch that the loop gets as NCHW views of their
        # HWC memory (channels_last strides): batch_map sees them as the loop would.
        self.nchw_views = tuple(nchw_views)
        self.workers: Any = None  # ProcessWorkers, with processes
        self._order: Optional[SendOrder] = None  # with processes: the requests' order
        # A process forked inside user code that returns from it ends there (NOTE
        # [ Worker faults ] in processes.py): the pid the stage runs in.
        self._pid = os.getpid()
        self._forks = forks()
        # What each stage thread is doing, and the current thread's, for the stall
        # report; consumers in next() now (the purge spares their deliveries).
        self._doing: Dict[threading.Thread, _Doing] = {}
        self._here = threading.local()
        self._in_next = 0

    needs_handoff = True  # every batch goes through the stage's threads

    @property
    def threads(self) -> int:
        """Workers: the stage's Python threads, or its processes."""
        return self._threads

    # -- threads ---------------------------------------------------------------------

    def attach(self, handoff: Any) -> None:
        """Serves `handoff` (``_core.PythonHandoff``: take() gives (task, lo, hi)). Inline
        (num_workers=0) there are no threads: the consumer runs the chunks in next()."""
        self.handoff = handoff
        if self.inline:
            return
        self._order = SendOrder(self._threads) if self.processes else None
        self.pool = StagePool(self, _Taker(handoff, self._order), "run_chunk",
                              self._threads * self._per_worker, start_name="_thread_started")

    def _thread_started(self, slot: int) -> None:
        """In each stage thread as it starts: DataLoader's worker_init_fn, with
        get_worker_info() answering there (threads running the code themselves). Its
        error fails the next batch, in the loop."""
        if self.processes:
            return  # the worker processes call it (a process per two threads)
        self._init_epochs.pop(slot, None)  # (epoch_started: a new thread's first epoch)
        try:
            if self.worker_init_fn is not None or worker_info_wanted(self.source):
                set_thread_worker_info(slot, self._threads, self.seed,
                                       getattr(self.source, "obj", self.source))
            if self.worker_init_fn is not None:
                self.worker_init_fn(slot)
        except BaseException as e:
            add_note(e, f"stoker: raised by worker_init_fn in worker thread {slot}")
            self._init_error = e

    def epoch_started(self, slot: int, epoch: int) -> None:
        """Stage thread `slot` takes work of `epoch`: without persistent_workers, the first
        time it does in a later epoch than its last, worker_init_fn runs again (where
        DataLoader would have made the worker again). Its error fails the next batch."""
        last = self._init_epochs.get(slot)
        self._init_epochs[slot] = epoch
        if last is None or last == epoch or self.persistent_workers or \
                self.worker_init_fn is None or self.processes:
            return
        try:
            self.worker_init_fn(slot)
        except BaseException as e:
            add_note(e, f"stoker: raised by worker_init_fn in worker thread {slot} at the "
                        f"start of epoch {epoch}")
            self._init_error = e

    def start(self, epoch: Optional[int] = None) -> bool:
        """At iter() of `epoch`: the threads, and the worker processes (a worker that died,
        or is stuck in an earlier epoch, is replaced here, once per iter(); the first ones
        start before the threads, so that the fork copies a process with fewer threads
        running). True if a stuck worker was replaced: the batches it held never finish."""
        if self.pool is None:
            return False
        stuck = past_their_epoch(self, epoch)  # NOTE [ Stuck workers ] in stuck.py
        if self.processes:
            if self.workers is None:
                self.workers = ProcessWorkers(self._threads)
            self.workers.start(self)
        if not self.pool.running():
            if self._order is not None:
                self._order.reset()
            self.pool.start()
        return stuck

    def use_keys(self, keys: Dict[int, Any]) -> None:
        """A user sampler whose items are not indices (stoker/_samplers.py): the source
        reads them by epoch (a worker process gets those of its chunk with it)."""
        self.source.keys = keys

    def _claim_probe(self) -> bool:
        """The first sample a thread runs is watched (once per loader, by one thread)."""
        with self._lock:
            if self._probed:
                return False
            self._probed = True
            if self.processes or self.inline:
                self._probe_done.set()
                return False
            return True

    def _leaves_processes(self, row: Any) -> bool:
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

    def _global_draws_seen(self) -> None:
        """On the consumer's thread, once the watched sample drew from the global
        generators: auto goes to processes now; threads warn, once."""
        self._global_draws = False
        if self.auto:
            if self._probe_overran:
                warnings.warn(
                    f"stoker: the dataset's __getitem__ (or map) draws from the global random "
                    f"generators (random, numpy.random or torch), so python_workers='auto' "
                    f"moves to worker processes (each sample's generators seeded from (seed, "
                    f"epoch, index)); but its first sample took over {self._probe_overran:g} s, "
                    "and samples that ran on threads meanwhile got draws that depend on "
                    "timing: the first batches may differ from run to run. Pass "
                    "python_workers='process' to run every sample that way",
                    RuntimeWarning, stacklevel=4)
            self._to_processes()
            return
        if self.processes:
            return
        if self._unpicklable is not None:  # auto, and processes could not send them back
            warnings.warn(
                "stoker: the dataset's __getitem__ (or map) draws from the global random "
                "generators (random, numpy.random or torch), but its samples cannot be "
                f"pickled ({self._unpicklable}), so they stay on worker threads, where which "
                "sample gets which draw depends on timing: batches differ from run to run and "
                "a resume is not exact. Make the samples picklable (python_workers='process' "
                "then seeds each sample's global generators), or draw from map's rng",
                RuntimeWarning, stacklevel=4)
            return
        warnings.warn(
            "stoker: the dataset's __getitem__ (or map) draws from the global random "
            "generators (random, numpy.random or torch): on worker threads, which sample gets "
            "which draw depends on timing, so batches differ from run to run and a resume is "
            "not exact. Use python_workers='process' (each sample's global generators seeded "
            "from (seed, epoch, index)), or draw from map's rng", RuntimeWarning, stacklevel=4)

    def _to_processes(self) -> bool:
        """python_workers="auto": from now on the worker processes run the user's code
        (NOTE [ Python stage processes ]). The stage's threads are parked first, each after
        the chunk it holds, so that none is inside user code at the fork; batches already
        handed to the threads are finished by them, and are the same bytes either way."""
        pool = self.pool
        if pool is not None and pool.running() and not pool.quiesce(10.0):
            pool.resume()
            return False  # a thread stuck in user code: stay on threads
        try:
            workers = ProcessWorkers(self._threads)
            self.workers = workers
            self.processes, self.auto = True, False
            self._per_worker = PROCESS_THREADS_PER_WORKER
            self._order = SendOrder(self._threads)  # the requests' order at each worker
            if pool is not None:
                pool._wait.order = self._order  # the _Taker (no thread is taking now)
            workers.start(self)
            if self.handoff is not None and hasattr(self.handoff, "set_chunk_samples"):
                # as many chunks in a batch as workers (chunk_samples in stoker/_plan.py)
                self.handoff.set_chunk_samples(-(-self.batch_size // self._threads))
            if pool is not None:  # two stage threads per worker process
                pool.grow(self._threads * PROCESS_THREADS_PER_WORKER)
        finally:
            if pool is not None:
                pool.resume()
        return True

    def _maybe_switch(self, core: Any) -> None:
        """python_workers="auto", on threads: every few batches, whether the user's Python
        holds the GIL (the verdict's rule, csrc/pipeline/autotuner.cpp gil_bound: two or
        more threads blocked a third of their time or more, at about one core between
        them); if so, processes from here on."""
        self._delivered += 1
        # measured from batch 2 (the first ones carry imports and cold caches), decided
        # at batch 4 and every 4 after, over the batches since batch 2
        if self._delivered < 2 or (self._delivered > 2 and self._delivered % 4):
            return
        if self.pool is None or self.pool.active < 2 or _loader_args.available_cores() < 2:
            self.auto = self._delivered < 64  # no second core: threads it is
            return
        s = core.stats()
        now = (time.monotonic(), time.process_time(), s["python_seconds"],
               s["python_cpu_seconds"], s["python_wait_seconds"])
        if self._since is None:
            self._since = now
            return
        cores = _loader_args.available_cores()
        d = [a - b for a, b in zip(now, self._since)]
        busy = d[1] / (d[0] * cores) if d[0] > 0 else 0.0
        if gil_bound(d[2], d[3], d[4], self.pool.active, busy):
            self._to_processes()

    def stop(self) -> None:
        """close(): the threads end, and the work they held (every stream stopped), within
        a few seconds whatever user code does: the worker processes are ended first (the
        threads waiting for their replies wake), then the threads are joined for at most
        pool.JOIN_SECONDS; a thread still in user code after that is left to end on its
        own (NOTE [ Python stage ])."""
        if self.pool is not None:
            self.pool.stop(join=False)
        if self.workers is not None:
            self.workers.stop()
        if self.pool is not None:
            self.pool.stop()
        with self._lock:
            dropped = list(self._pending.values())
            self._pending.clear()
        for p in dropped:
            p.release()

    def dropped(self) -> None:
        """The loader was dropped without close(): its worker processes are ended and their
        arenas closed even while a stage thread waits on one stuck in user code (which
        holds the stage), and the threads are told to stop (NOTE [ Stuck workers ])."""
        if self.pool is not None:
            self.pool.stop(join=False)
        if self.workers is not None:
            self.workers.stop()

    def follow(self, active: int) -> None:
        """Keeps `active` of the stage's threads working (the tuner's thread count)."""
        active *= self._per_worker
        if self.pool is not None and active != self.pool.active:
            self.pool.set_active(active)


def gil_bound(python_s: float, cpu_s: float, wait_s: float, threads: int,
              busy: float = 0.0) -> bool:
    """Whether `threads` stage threads that spent `python_s` in the user's Python, `cpu_s` of
    it on a core and `wait_s` waiting for one, take turns on the GIL: blocked (neither on a
    core nor waiting for one) a third of the time or more, at about one core between them
    (csrc/pipeline/autotuner.cpp gil_bound: threads blocked on sleeps or I/O use much less;
    a machine with no free core shows up as waiting, where processes would not help). Or
    blocked as much while this process keeps the cores it may use busy (`busy`, its CPU
    time over wall time and cores, 0..1): the user's code waits for work of this process
    on other threads (the GIL held by them, or a native thread pool such as OpenCV's),
    not for a sleep or I/O, and worker processes each get their own. With the cores
    that busy, a tenth of the time blocked is enough: it is time lost to the GIL, which
    processes win back (albumentations on OpenCV, bench/bench_python.py (a): threads
    blocked 13-16% at 1.6 cores, processes 1.13-1.2x threads' speed)."""
    if threads < 2 or python_s < 0.05:
        return False
    blocked = python_s - cpu_s - wait_s
    cores = threads * cpu_s / python_s
    if busy >= 0.85:
        # (not when they wait for a core more: the machine has no core to spare)
        return blocked > 0.1 * python_s and wait_s < blocked and cores < 0.9 * threads
    return blocked > 0.3 * python_s and 0.6 < cores < 1.5
