"""The Python stage of one loader (NOTE [ Python stage ] in stoker/_stage/__init__.py):
chunks of planned batches taken from the C++ hand-off, samples fetched and mapped, the
batch assembled (native batching, collate_fn, batch_map) and completed in its ring slot.
PythonStage holds its parts, each with its own state, and runs what spans them: its
threads' and worker processes' start and end, next(), the move to worker processes."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import torch

from .. import _core, _loader_args
from .activity import Activity
from .assemble import BatchAssembly
from .chunks import ChunkRunner
from .collate import BatchLayout
from .consumer import Consumer
from .deliveries import Deliveries
from .direct import direct_rows
from .pending import PendingBatches
from .placement import Placement, gil_bound
from .pool import StagePool
from .probe import GlobalDraws
from .processes import ProcessWorkers
from .samples import Samples
from .sources import MapStyleSource
from .stall import stall_report
from .state import END, PROCESS_THREADS_PER_WORKER
from .stuck import past_their_epoch, past_timeout
from .taking import _Taker
from .thread_init import ThreadInit
from .views import tensor_from_capsule

__all__ = ["PythonStage", "PROCESS_THREADS_PER_WORKER", "END", "gil_bound"]

# A stall is reported again this often (as the C++ core reports a slow first batch).
_STALL_REPEAT_SECONDS = 10.0
_log = logging.getLogger("stoker")


class PythonStage:
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

    Its parts: ``Samples`` (one sample, what a worker process runs), ``PendingBatches``
    (batches being mapped), ``ChunkRunner`` (a chunk, in a stage thread), ``BatchAssembly``
    (a batch whose chunks are done), ``Deliveries`` (what a batch carries by ticket),
    ``Consumer`` (the batch the loop gets), ``Activity`` (what each thread does),
    ``GlobalDraws`` (the watched first sample), ``Placement`` (threads or processes),
    ``ThreadInit`` (worker_init_fn on threads), and the threads (``StagePool``).
    """

    needs_handoff = True  # every batch goes through the stage's threads

    def __init__(self, source: Any, *, map_fn: Optional[Callable] = None,
                 batch_map: Optional[Callable] = None, collate_fn: Optional[Callable] = None,
                 map_fields: Optional[Mapping] = None, seed: int = 0, skip: bool = False,
                 threads: int = 1, batch_map_on_consumer: bool = False,
                 workers: str = "thread", nchw_views: Sequence[str] = (),
                 inline: bool = False, worker_init_fn: Optional[Callable] = None,
                 unbatched: bool = False, persistent_workers: bool = True):
        if unbatched and collate_fn is None:
            collate_fn = torch.utils.data.default_convert  # DataLoader's, for batch_size=None
        self.source = source
        self.inline = bool(inline)
        self.batch_size = 1  # samples in a batch (build() sets it): chunk sizes
        self._threads = max(1, int(threads))
        # Batches of sample indices (map, collate_fn, a map-style dataset), or batches the
        # C++ workers assembled (batch_map alone over a stoker dataset).
        per_sample = map_fn is not None or collate_fn is not None or \
            isinstance(source, MapStyleSource)
        layout = BatchLayout(map_fields, what="map output" if map_fn is not None
                             else "dataset item",
                             defaults=getattr(source, "default_layout", None))
        self._activity = Activity()
        self._samples = Samples(source, layout, map_fn=map_fn, collate_fn=collate_fn,
                                seed=int(seed), skip=bool(skip),
                                worker_init_fn=worker_init_fn,
                                persistent_workers=bool(persistent_workers),
                                here=self._activity.here)
        self._placement = Placement(self._threads, workers, per_sample and not self.inline)
        self._draws = GlobalDraws()
        self._init = ThreadInit(worker_init_fn, bool(persistent_workers), source, int(seed),
                                self._threads, self._placement)
        self._pending = PendingBatches()
        self._deliveries = Deliveries()
        direct = direct_rows(self._samples, unbatched=bool(unbatched), per_sample=per_sample)
        self._assembly = BatchAssembly(self._samples, self._pending, self._deliveries,
                                       self._activity, batch_map=batch_map,
                                       batch_map_on_consumer=batch_map_on_consumer,
                                       unbatched=bool(unbatched), per_sample=per_sample,
                                       nchw_views=nchw_views, direct=direct)
        self._chunks = ChunkRunner(self._samples, self._pending, self._activity, self._draws,
                                   self._placement, self._assembly.finish, self._init.epoch,
                                   per_sample=per_sample, inline=self.inline, direct=direct)
        self._consumer = Consumer(self._samples, self._deliveries, batch_map=batch_map,
                                  batch_map_on_consumer=batch_map_on_consumer,
                                  per_sample=per_sample, nchw_views=nchw_views)
        self.handoff: Any = None
        self.pool: Optional[StagePool] = None
        self._taker: Optional[_Taker] = None  # the threads' wait for chunks

    # -- what the loader reads and sets ------------------------------------------------

    @property
    def threads(self) -> int:
        """Workers: the stage's Python threads, or its processes."""
        return self._threads

    @property
    def processes(self) -> bool:
        """Whether worker processes run the user's code (NOTE [ Python stage processes ])."""
        return self._placement.processes

    @property
    def auto(self) -> bool:
        """python_workers="auto", still on threads: it may move to processes."""
        return self._placement.auto

    @property
    def workers(self) -> Optional[ProcessWorkers]:
        """The worker processes, once started (None on threads)."""
        return self._placement.workers

    @property
    def collate_fn(self) -> Optional[Callable]:
        return self._samples.collate_fn

    @property
    def layout(self) -> BatchLayout:
        return self._samples.layout

    @property
    def side_device(self) -> Any:
        """The CUDA device whose side stream runs batch_map after the copy (or None)."""
        return self._consumer.side_device

    @side_device.setter
    def side_device(self, device: Any) -> None:
        self._consumer.side_device = device

    @property
    def per_sample(self) -> bool:
        """Whether batches are made of rows the stage fetched (else the C++ workers
        assembled them: batch_map alone over a stoker dataset)."""
        return self._assembly.per_sample

    @per_sample.setter
    def per_sample(self, value: bool) -> None:
        self._assembly.per_sample = self._consumer.per_sample = bool(value)

    # -- threads and worker processes ------------------------------------------------

    def attach(self, handoff: Any) -> None:
        """Serves `handoff` (``_core.PythonHandoff``: take() gives (task, lo, hi)). Inline
        (num_workers=0) there are no threads: the consumer runs the chunks in next()."""
        self.handoff = handoff
        if self.inline:
            return
        self._taker = _Taker(handoff, self._placement.order)
        self.pool = StagePool(self, self._taker, "run_chunk",
                              self._threads * self._placement.per_worker,
                              start_name="thread_started")
        self._chunks.pool = self.pool

    def thread_started(self, slot: int) -> None:
        """In each stage thread as it starts (ThreadInit)."""
        self._init.started(slot)

    def run_chunk(self, item: Tuple[Any, ...], slot: int = 0) -> None:
        """A stage thread's unit of work: chunk `item` of a batch (ChunkRunner)."""
        self._chunks.run(item, slot)

    def start(self, epoch: Optional[int] = None) -> bool:
        """At iter() of `epoch`: the threads, and the worker processes (a worker that died,
        or is stuck in an earlier epoch, is replaced here, once per iter(); the first ones
        start before the threads, so that the fork copies a process with fewer threads
        running). True if a stuck worker was replaced: the batches it held never finish."""
        if self.pool is None:
            return False
        stuck = past_their_epoch(self._placement.workers, self._activity, self.pool,
                                 self._samples.describe, epoch)  # NOTE [ Stuck workers ]
        self._placement.processes_started(self._samples, epoch)
        self._init.start_epoch = epoch  # (read by each thread as it starts)
        self._start_threads()
        return stuck

    def _start_threads(self) -> None:
        if self.pool is not None and not self.pool.running():
            if self._placement.order is not None:
                self._placement.order.reset()
            self.pool.start()

    def use_keys(self, keys: Dict[int, Any]) -> None:
        """A user sampler whose items are not indices (stoker/_samplers.py): the source
        reads them by epoch (a worker process gets those of its chunk with it)."""
        self.source.keys = keys

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
            workers = self._placement.to_processes()
            if self._taker is not None:  # (no thread is taking now)
                self._taker.order = self._placement.order
            workers.start(self._samples)
            if self.handoff is not None and hasattr(self.handoff, "set_chunk_samples"):
                # as many chunks in a batch as workers (chunk_samples in stoker/_plan.py)
                self.handoff.set_chunk_samples(-(-self.batch_size // self._threads))
            if pool is not None:  # two stage threads per worker process
                pool.grow(self._threads * PROCESS_THREADS_PER_WORKER)
        finally:
            if pool is not None:
                pool.resume()
        return True

    def stop(self) -> None:
        """close(): the threads end, and the work they held (every stream stopped), within
        a few seconds whatever user code does: the worker processes are ended first (the
        threads waiting for their replies wake), then the threads are joined for at most
        pool.JOIN_SECONDS; a thread still in user code after that is left to end on its
        own (NOTE [ Python stage ])."""
        if self.pool is not None:
            self.pool.stop(join=False)
        if self._placement.workers is not None:
            self._placement.workers.stop()
        if self.pool is not None:
            self.pool.stop()
        self._pending.reset()
        # What the stopped streams' batches left here holds their batch memory: it goes
        # now, not at the next iter() or when the loader is collected (anyone still
        # writing into a batch, a thread left in user code, holds the batch itself)
        self._deliveries.drop_stopped()
        drop = getattr(self.handoff, "drop_stopped", None)
        if drop is not None:
            drop()

    def dropped(self) -> None:
        """The loader was dropped without close(): its worker processes are ended and their
        arenas closed even while a stage thread waits on one stuck in user code (which
        holds the stage), and the threads are told to stop (NOTE [ Stuck workers ])."""
        if self.pool is not None:
            self.pool.stop(join=False)
        if self._placement.workers is not None:
            self._placement.workers.stop()

    def follow(self, active: int) -> None:
        """Keeps `active` of the stage's threads working (the tuner's thread count)."""
        active *= self._placement.per_worker
        if self.pool is not None and active != self.pool.active:
            self.pool.set_active(active)

    # -- the consumer ----------------------------------------------------------------

    def next(self, it: Any, consumer_stream: Optional[int], entered: int,
             timeout: float = 0.0, core: Any = None) -> Any:
        """The consumer's next batch from core iterator `it` (END at the end of the epoch:
        any value, None included, is a batch): the user's exception object when the
        batch failed in the stage. The loop's time in next() outside the core's wait
        (since `entered`, perf_counter_ns) goes to the iterator's hand-off time, counted
        in data_stall as the plain path's. `timeout`: DataLoader's (0: none); `core`: the
        loader core, whose stats auto reads."""
        self._start_threads()
        error = self._init.take_error()
        if error is not None:  # a worker thread's worker_init_fn raised
            raise error
        draws = self._draws
        if draws.drew:
            self._draws_seen()
        if draws.hold_ahead:  # threads that draw from the globals: this epoch may run
            draws.open(it.epoch)
        side = self._consumer.side_stream(consumer_stream)
        self._deliveries.enter()  # until its delivery is taken, no purge drops it
        try:
            calling = time.perf_counter_ns()
            failed: Optional[BaseException] = None
            try:
                got = self._wait(it, consumer_stream or 0, side, timeout)
            except _core.PythonStageError as e:
                failed = self._deliveries.error(e.ticket)
                if failed is None:
                    raise
            if failed is not None:
                raise failed  # outside the except block: the user's exception, as it was
            if got is None:
                return END
            t0 = time.perf_counter_ns()
            caps, ticket = got
            batch = self._consumer.deliver(
                {name: tensor_from_capsule(cap) for name, cap in caps}, ticket)
            it.note_handoff(calling - entered + time.perf_counter_ns() - t0)
            placement = self._placement
            if placement.auto and core is not None and placement.should_move(
                    core, self.pool.active if self.pool is not None else 0):
                self._to_processes()
            return batch
        finally:
            if self._deliveries.leave():
                self._pending.drop_stopped()

    def _draws_seen(self) -> None:
        """The watched sample drew from the global generators: auto moves to processes."""
        if self._draws.seen(self._placement.auto, self._placement.processes):
            self._to_processes()

    def _wait(self, it: Any, stream: int, side: int, timeout: float = 0.0) -> Any:
        """The core's next(): inline (num_workers=0) this thread runs the chunks meanwhile;
        auto notices a watched sample that drew from the global generators; `timeout` > 0
        is DataLoader's (an error after that many seconds); and a progress message goes to
        the "stoker" logger while a batch is late: after the slow-batch time (the slow
        first batch's, NOTE [ Slow first batch ] in csrc/pipeline/loader_core.h) at INFO,
        then at WARNING every _STALL_REPEAT_SECONDS, naming what each stage thread or
        worker process is doing and since when; once the batch comes, its time."""
        slow = _loader_args.SLOW_FIRST_BATCH_SECONDS
        report_at: Optional[float] = slow if slow and slow > 0 else None
        deadline = timeout if timeout > 0 else None
        auto = self._placement.auto
        if report_at is None and deadline is None and not self.inline and not auto:
            return it.next(stream, with_ticket=True, side_stream=side)
        start = time.monotonic()
        which = None  # the batch reported late
        while True:
            if self.inline:
                ms = 0
            else:
                elapsed = time.monotonic() - start
                limits = [t - elapsed for t in (report_at, deadline) if t is not None]
                if self._placement.auto:
                    limits.append(0.05)
                ms = max(1, int(min(limits) * 1000)) if limits else -1
            got = it.next(stream, with_ticket=True, side_stream=side, timeout_ms=ms)
            waited = time.monotonic() - start
            if got is not False:
                if which is not None and got is not None:
                    _log.info("stoker: %s came after %.1f s", which, waited)
                return got
            if self._draws.drew:  # auto: the threads paused, waiting for the processes
                self._draws_seen()
            if self.inline:
                item = self.handoff.take(20)
                if item is not None:
                    self.run_chunk(item)
                    continue
            if deadline is not None and waited > deadline:
                stuck = past_timeout(  # NOTE [ Stuck workers ] in stuck.py
                    self._placement.workers, self._pending, self._activity, self.pool,
                    self._samples.describe, timeout)
                raise RuntimeError(f"DataLoader timed out after {timeout:g} seconds (stoker: "
                                   f"no batch came within timeout={timeout:g} seconds: " +
                                   ("; ".join(stuck) if stuck else
                                    "a worker is stuck or too slow") + ")")
            if report_at is not None and waited >= report_at:
                again = which is not None
                which, text = self.stall_report(waited, again)
                _log.log(logging.WARNING if again else logging.INFO, "%s", text)
                report_at = waited + _STALL_REPEAT_SECONDS

    def stall_report(self, waited: float, again: bool = False) -> Tuple[str, str]:
        """(which batch, the message): what the consumer's late batch waits for (stall.py)."""
        return stall_report(self._pending, self._activity, self._placement.workers,
                            self._samples.describe, waited, again)
