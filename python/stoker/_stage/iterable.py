"""An ``IterableDataset`` (HF streaming, WebDataset pipelines, a generator over files),
read as DataLoader reads it and with what stoker adds.

NOTE [ Iterable datasets ]
An IterableDataset has no index, and its length is known only when its stream ends: the
C++ core plans its batches as rows of the stream (csrc/stage/iterable_producer.h) and the
Python stage fills them from the dataset's iterators, ending the epoch at the first batch
with no row left (NOTE [ Open-ended epochs ] in csrc/pipeline/batch_producer.h). So the
core owns its epochs, iterators, skip, resume state and stats, as for every other source:

  core (C++ workers, no GIL)           stage thread (IterableStage)    reading workers
  --------------------------           ----------------------------    ---------------
  batch k of a stream: rows            the stream's reading (one per   worker w of N:
  (k * W + r) * B ... of it,     -->   core stream: an iterator        get_worker_info()
  handed off (python_handoff.h)        that claimed its epoch, two     says (w, N),
                                       live iterators read twice),     worker_init_fn(w),
                                       step k of it: B * W rows        iter(dataset), each
  ring, in order of k            <--   taken round-robin from the      row through map (its
  (the first batch ended: the          workers (0, 1, ..., skipping    draws keyed by its
  epoch's end)                         those that ended), this rank's  place in the merged
                                       rows batched natively or by     stream), into its
                                       collate_fn; none: end()         queue

  * The reading workers are threads of this process (iterable_workers.py), or processes
    (num_workers > 0 with python_workers "auto" or "process": NOTE [ Iterable datasets in
    processes ] in iterable_processes.py), merged the same way: the same batches either
    way for a seed and worker count.
  * The core's rules (NOTE [ Epochs and iterators ] in csrc/pipeline/loader_core.h): an
    iterator claims its epoch at its first next(), and the stage reads a stream's rows
    only once an iterator asked for a batch of its epoch (a stream iter() starts ahead
    waits: workers start at the first next()); set_epoch(e) while e runs confirms it; an
    iterator started while another runs reads that epoch whole, on a stream and reading
    of its own; len(iter(loader)) is the batches left, from the dataset's __len__ (none:
    a TypeError, as len(loader)).
  * A row whose map raises is raised by next() once the rest of its batch is read (the
    batch is consumed, NOTE [ After a failed batch ]), or left out with on_error="skip"
    (counted in stats()["skipped"], named in the warning at the epoch's end); an error
    of the dataset's own iterator ends that worker's share of the stream after it is
    raised.
  * What stoker adds: the batch count does not depend on the workers (rows are batched
    from the merged stream, not per worker, so a dataset that shards by get_worker_info()
    gives ceil(n / batch_size) batches for any N).
  * Ranks, by DataLoader's rule: each rank is given the dataset as it is, and the dataset
    splits itself by rank (webdataset's split_by_node, HF's split_dataset_by_node, its own
    torch.distributed calls) or every rank reads it all. Only when asked (even_batches=,
    rank= or world_size= given: Sampling.split_ranks) does stoker split it, with equal
    batches on every rank: every rank reads the whole stream and takes its rows of each
    step of batch_size * world_size rows, the last step split evenly, padded from the
    epoch's first rows (even_batches=True) or not. Both splitting at once would lose most
    of the data: a dataset whose structure says it splits itself is refused then, and one
    that asks torch.distributed for its rank while stoker splits is warned about.
  * Resume: state_dict() holds the epoch and the rows the job consumed (the core's), and
    the dataset's own state_dict() taken when the epoch started; load_state_dict() gives
    the dataset that state and the resumed stream's reading reads the rows consumed again
    (through map: the epoch's first rows pad its end), without batching them. Without a
    dataset state_dict(), a mid-epoch state_dict() is an error that says so.
  * stats() count the reading workers as the loader's workers (num_threads, the stall
    verdict), and their Python time is theirs in the dataset's iterator and map (wall,
    CPU, waiting for a core), with the stage thread's CPU merging and batching.
  * set_epoch(e) is passed on to the dataset's own set_epoch (WebDataset, HF datasets)
    when a reading of epoch e starts.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch

from .errors import add_note
from .iterable_processes import StepHold, StreamProcesses
from .iterable_workers import (
    DONE,
    MIN_QUEUE_ROWS,
    MIN_WORKER_ROWS,
    Failed,
    Skipped,
    StreamWorker,
    datapipes,
    live_workers,
)
from .rng import key_words, rng_from_key

__all__ = ["IterableRows", "StreamReading", "DatasetStatePart"]

_NAMED_SKIPS = 5  # rows the warning names at an epoch's end (the rest counted)


class StreamReading:
    """One reading of the dataset: the rows of one core stream (an iterator's epoch, or
    its rest after a resume), from num_workers workers merged round-robin; step k is the
    k-th run of batch_size * world_size rows (NOTE [ Iterable datasets ])."""

    def __init__(self, stream: "IterableRows", epoch: int, rank: int, world: int,
                 offset: int, task: Any):
        self.stream, self.rank, self.world = stream, rank, world
        self.epoch = epoch
        self.offset = offset  # rows read again, not batched (a resume, a skip)
        self.task = task  # its latest batch: stopped once the stream is
        self.lock = threading.Lock()  # one step at a time, in order
        self.rows = 0  # rows of the merged stream read
        self.skipped = 0  # rows left out (on_error="skip"), not yet counted in a batch
        self.first: List[Any] = []  # the epoch's first rows (padding wraps onto them)
        self.workers: List[Any] = []  # StreamWorker threads, or StreamProcess
        self._processes: Optional[StreamProcesses] = None
        self._inline: Optional[Any] = None
        self._turn = 0
        self._started = False
        self._ended = False  # no more rows to read: its epoch's end, or closed
        self.exhausted = False
        self._closed = False
        self._steps: Dict[int, Tuple[Union[List[Any], BaseException, None],
                                     Optional[StepHold]]] = {}
        self._made = 0  # steps read
        # the leases of the rows read since the last step was made (rows that are views of
        # a worker process's arena: NOTE [ Iterable datasets in processes ])
        self.held: Dict[Any, int] = {}

    def step(self, k: int) -> Tuple[Union[List[Any], BaseException, None],
                                    Optional[StepHold]]:
        """This rank's rows of step `k` (fewer in the last), the error that step raised, or
        None past the stream's end; and what holds its rows' arenas (None: nothing), to
        be released once its batch is made. Steps are read in order, whichever thread
        asks."""
        with self.lock:
            if not self._started:
                self._started = True
                self._start()
            while self._made <= k:
                try:
                    got: Union[List[Any], BaseException, None] = self.next_rows()
                except Exception as e:
                    got = e
                self._steps[self._made] = (got, self._hold())
                self._made += 1
            return self._steps.pop(k, (None, None))

    def _hold(self) -> Optional[StepHold]:
        """The leases of the rows read since the last call, as one hold."""
        if not self.held:
            return None
        held, self.held = self.held, {}
        return StepHold(held)

    def take_skipped(self) -> int:
        with self.lock:
            n, self.skipped = self.skipped, 0
            return n

    def _start(self) -> None:
        s = self.stream
        state = s.starting(self.epoch, self.offset)
        n = s.workers
        pipes = datapipes(s, n)
        if n == 0:
            self._inline = iter(pipes[0] if pipes else s.dataset)
        elif s.processes:  # NOTE [ Iterable datasets in processes ]
            procs = None if pipes else s.idle_processes(n)
            if procs is None:
                procs = StreamProcesses(self, n, pipes)
            self._processes = procs
            self.workers = procs.begin(self, state)
        else:
            self.workers = [StreamWorker(self, w, n, pipes[w] if pipes else None)
                            for w in range(n)]
            for w in self.workers:
                assert w is not None
                w.start()
                live_workers.add(w)
        # a resume: the rows consumed are read again (through map, as in the workers: the
        # epoch's first rows pad its end), not batched
        for _ in range(self.offset):
            if self._row() is DONE:
                break
        hold = self._hold()
        if hold is not None:
            hold.release()

    def mapped(self, item: Any, row: int) -> Any:
        """`item` through map (in a worker, or the loop's thread with num_workers=0)."""
        s = self.stream
        if s.map_fn is None:
            return item
        try:
            # (key_words: rng_keys' key of one row without NumPy's per-call cost)
            key = np.array(key_words(s.seed, self.epoch, row), np.uint64)
            return s.map_fn(item, rng_from_key(key))
        except Exception as e:
            if s.skip_errors:
                return Skipped(f"row {row} ({type(e).__name__}: {e})")
            return Failed(add_note(e, f"stoker: raised by map for row {row} of the "
                                       f"IterableDataset's stream, epoch {self.epoch}"))

    def _row(self) -> Any:
        """The next row of the merged stream (a Failed, a Skipped), or DONE."""
        if self._inline is not None:
            try:
                item = next(self._inline)
            except StopIteration:
                return DONE
            except Exception as e:
                self._inline = None
                self.workers = []
                return self._keep(Failed(add_note(e, "stoker: raised by the "
                                                      "IterableDataset")))
            return self._keep(self.mapped(item, self.rows))
        live = [w for w in self.workers if w is not None]
        while live:
            w = self.workers[self._turn % len(self.workers)]
            self._turn += 1
            if w is None:
                continue
            got = self._get(w)
            if got is DONE:
                self.workers[self.workers.index(w)] = None
                live = [x for x in self.workers if x is not None]
                continue
            return self._keep(got)
        return DONE

    def _get(self, w: Any) -> Any:
        deadline = None if self.stream.timeout <= 0 else time.monotonic() + self.stream.timeout
        while True:
            try:
                return w.take(0.1, self.held)
            except queue.Empty:
                if self._closed:
                    return DONE
                if deadline is not None and time.monotonic() > deadline:
                    t = self.stream.timeout
                    raise RuntimeError(f"DataLoader timed out after {t:g} seconds (stoker: no "
                                       f"sample came from worker {w.wid} within timeout={t:g} "
                                       "seconds)") from None

    def _keep(self, item: Any) -> Any:
        s = self.stream
        # (only a split across ranks pads the last step)
        if self.world > 1 and self.rows < s.batch_size * self.world and s.even_batches and \
                not s.drop_last and not isinstance(item, (Failed, Skipped)):
            self.first.append(_owned(item) if self._processes is not None else item)
        self.rows += 1
        return item

    def next_rows(self) -> Optional[List[Any]]:
        """This rank's rows of the next batch, or None at the end of the epoch. A row
        whose map (or the dataset) raised raises here once the rest of its batch is read:
        the batch is consumed (NOTE [ After a failed batch ] in stoker/_iterator.py)."""
        if self._ended:
            return None
        s, b, w = self.stream, self.stream.batch_size, self.world
        step: List[Any] = []
        failed: Optional[BaseException] = None
        while len(step) < b * w:
            r = self._row()
            if r is DONE:
                break
            if isinstance(r, Skipped):
                self.skipped += 1
                s.note_skipped(r.what)
                continue
            if isinstance(r, Failed):
                failed = failed or r.error
                step.append(None)
                continue
            step.append(r)
        if len(step) < b * w:
            self._ended = self.exhausted = True
        if failed is not None:
            raise failed
        if len(step) == b * w:
            return step[self.rank * b:(self.rank + 1) * b]
        if not step or s.drop_last:
            return None
        per = -(-len(step) // w)
        if s.even_batches:  # every rank ceil(L / w) rows, wrapping onto the epoch's start
            pad = (self.first * (per * w))[: per * w - len(step)] if self.first else []
            step = step + pad
        return step[self.rank * per:(self.rank + 1) * per]

    def finish(self) -> None:
        """The stream stopped (or the loader closed): its workers are told."""
        self._closed = True
        self._ended = True
        procs, self._processes = self._processes, None
        if procs is not None:
            # kept for the next reading if no step reads from them now (a close() from
            # another thread while the stage reads: ended, which wakes that read)
            if self.lock.acquire(blocking=False):
                try:
                    self.stream.processes_done(procs)
                finally:
                    self.lock.release()
            else:
                procs.close()
            return
        for w in self.workers:
            if w is not None:
                w.stop.set()

    def close(self) -> None:
        self.finish()

    def __del__(self) -> None:
        try:
            self.finish()
        except Exception:
            pass


def _owned(row: Any) -> Any:
    """A row whose own arrays may be views of a worker process's arena, with copies of
    them (kept beyond its batch)."""
    def own(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return v.copy()
        if isinstance(v, torch.Tensor):
            return v.clone()
        return v

    if type(row) is dict:
        return {k: own(v) for k, v in row.items()}
    if type(row) in (tuple, list):
        return type(row)(own(v) for v in row)
    return own(row)


class IterableRows:
    """An IterableDataset's rows for the Python stage: how it is read (the Loader's
    arguments), a reading per core stream, and the dataset's own state at each epoch's
    start (NOTE [ Iterable datasets ])."""

    def __init__(self, dataset: Any, *, batch_size: int, drop_last: bool, even_batches: bool,
                 seed: int, workers: int, worker_init_fn: Optional[Callable],
                 persistent_workers: bool = False, map_fn: Optional[Callable],
                 timeout: float, generator: Optional[torch.Generator] = None,
                 split_ranks: bool = False, prefetch: Optional[int] = None,
                 skip_errors: bool = False, processes: bool = False):
        self.dataset = dataset
        # the workers are processes (NOTE [ Iterable datasets in processes ]), else threads
        self.processes = processes
        # stoker splits the stream across ranks (asked for); else each rank reads it as
        # the dataset gives it (NOTE [ Iterable datasets ])
        self.split_ranks = split_ranks
        self.warned_self_split = False
        self.generator = generator  # DataLoader's: an IterDataPipe's seed is drawn from it
        self.batch_size = batch_size
        self.drop_last, self.even_batches = drop_last, even_batches
        self.seed, self.workers = seed, workers
        self.worker_init_fn, self.map_fn = worker_init_fn, map_fn
        # each reading starts workers of its own; with persistent_workers, worker_init_fn
        # runs once per worker id over the loader's life (as in DataLoader's kept workers)
        self.persistent_workers = persistent_workers
        self._inited: set = set()
        self.timeout = timeout
        self.skip_errors = skip_errors  # on_error="skip": a row whose map raised is left out
        # rows from worker processes are views of their arenas, batched by the stage (else
        # a collate_fn is given them: copies), NOTE [ Iterable datasets in processes ]
        self.views = False
        self.prefetch = prefetch  # batches the workers may hold ahead (None: automatic)
        # the workers' time in the dataset's iterator and map: wall, CPU, and waiting for a
        # core (processes only) (threads: a race may lose one)
        self.python_ns = self.python_cpu_ns = self.python_wait_ns = 0
        self._skipped: List[str] = []  # the first rows left out since the last report
        self._skipped_more = 0  # and how many more
        self.pending_dataset_state: Any = None  # load_state_dict's, for the next reading
        self.core: Any = None  # the loader core (the state part reads its position)
        self._lock = threading.Lock()
        self._readings: Dict[int, StreamReading] = {}
        self._idle: List[StreamProcesses] = []  # worker processes kept between readings
        self._closed = False
        self._start_state: Dict[int, Any] = {}  # epoch -> the dataset's state at its start

    def note_skipped(self, what: str) -> None:
        """A row left out (on_error="skip"), for the warning at the epoch's end."""
        with self._lock:
            if len(self._skipped) < _NAMED_SKIPS:
                self._skipped.append(what)
            else:
                self._skipped_more += 1

    def skipped_report(self, n: int) -> str:
        """The warning for `n` rows left out since the last one: which, and why."""
        with self._lock:
            named, more = self._skipped, self._skipped_more
            self._skipped, self._skipped_more = [], 0
        listed = ", ".join(named) + (f" and {more} more" if more else "")
        return (f"stoker: left out {n} row(s) of the IterableDataset whose map= raised "
                f"(on_error='skip'): {listed}; see loader.stats()['skipped']")

    def describe(self, index: int) -> str:
        return f"row {index} of the IterableDataset's stream"

    def first_start(self, wid: int) -> bool:
        """Whether worker `wid` runs worker_init_fn: every time it starts, or only the
        first time with persistent_workers."""
        with self._lock:
            first = wid not in self._inited
            self._inited.add(wid)
        return first or not self.persistent_workers

    def queue_rows(self, n: int) -> int:
        """Rows each of `n` workers may read ahead of the stage. The core's window bounds
        the batches filled ahead (prefetch); an explicit one bounds the rows read too, so
        a worker holds one row beyond it; an automatic one lets the workers run ahead of
        the batches too (the window starts small): a batch of rows between them (64 at
        least), as DataLoader's workers hold a batch each as they build it, and 16 each
        at least, so that one worker's slow row is made while the others fill theirs.
        (A batch each, from worker processes, held 10 MB more of their arenas on
        bench/bench_python.py's (d), 150 KB rows, at the same speed; two batches each,
        19 MB more again.)"""
        if self.prefetch is None:
            return max(MIN_WORKER_ROWS,
                       -(-max(MIN_QUEUE_ROWS, self.batch_size) // max(1, n)))
        return 1

    # -- readings -----------------------------------------------------------------------

    def reading(self, task: Any) -> StreamReading:
        """The reading of `task`'s stream (made at its first batch); readings of streams
        that stopped end here."""
        stale: List[StreamReading] = []
        with self._lock:
            r = self._readings.get(task.stream)
            if r is None:
                gone = [k for k, x in self._readings.items() if x.task.stopped]
                stale = [self._readings.pop(k) for k in gone]
                r = self._readings[task.stream] = StreamReading(
                    self, task.epoch, task.rank, task.world_size, task.offset, task)
            else:
                r.task = task
        for x in stale:
            x.finish()
        return r

    def starting(self, epoch: int, offset: int) -> Any:
        """A reading of `epoch` starts (at row `offset`): the dataset is told the epoch,
        given a loaded state, or its state at the epoch's start is kept. The state
        loaded, or None (worker processes load it into their copies)."""
        dataset_state, self.pending_dataset_state = self.pending_dataset_state, None
        if dataset_state is not None:
            self.dataset.load_state_dict(dataset_state)
            self._start_state = {epoch: dataset_state}
        fn = getattr(self.dataset, "set_epoch", None)
        if callable(fn):
            fn(epoch)
        if offset == 0 and callable(getattr(self.dataset, "state_dict", None)) and \
                epoch not in self._start_state:
            self._start_state = {epoch: self.dataset.state_dict()}
        return dataset_state

    def idle_processes(self, n: int) -> Optional[StreamProcesses]:
        """Worker processes that served an earlier reading to its end, for the next one
        (NOTE [ Iterable datasets in processes ]); None: fork new ones."""
        with self._lock:
            while self._idle:
                procs = self._idle.pop()
                if procs.n == n:
                    return procs
                procs.close()
        return None

    def processes_done(self, procs: StreamProcesses) -> None:
        """A reading's worker processes are kept for the next one if they can serve it
        (one set at most), else ended."""
        if not self._closed and not procs.pipes and procs.reusable():
            with self._lock:
                if not self._idle:
                    self._idle.append(procs)
                    return
        procs.close()

    def close(self) -> None:
        """Every reading ends (the loader closed, or its stage stopped)."""
        with self._lock:
            readings, self._readings = list(self._readings.values()), {}
            self._closed = True
        for r in readings:
            r.finish()
        with self._lock:
            idle, self._idle = self._idle, []
            self._closed = False  # a later iter() reads again
        for procs in idle:
            procs.close()

    # -- counts and state -------------------------------------------------------------

    def _length(self) -> int:
        try:
            return len(self.dataset)
        except TypeError:
            raise TypeError("len() of a stoker.Loader over an IterableDataset without "
                            "__len__: its batches are known only when the stream ends") from None

    def batches_from(self, rows: int, world: int) -> int:
        """Batches of a rank in an epoch read from row `rows` of the stream."""
        if not self.split_ranks:
            world = 1
        left = max(0, self._length() - rows)
        full, rem = divmod(left, self.batch_size * world)
        return full if self.drop_last or rem == 0 else full + 1

    def dataset_state(self, epoch: int) -> Any:
        return self._start_state.get(epoch)

    def identity(self) -> Dict[str, Any]:
        """What a state records of the data: the IterableDataset's type."""
        return {"iterable": type(self.dataset).__qualname__}

    def state_parts(self) -> Dict[str, Any]:
        """This source's parts of the loader's state, by key: the dataset's own state."""
        return {"stream": DatasetStatePart(self)}



class DatasetStatePart:
    """An IterableDataset's own state when the epoch started, a part of the loader's
    state (NOTE [ Iterable datasets ])."""

    def __init__(self, rows: IterableRows):
        self._rows = rows

    def state(self) -> Dict[str, Any]:
        epoch, position, _ = self._rows.core.state()
        saved = self._rows.dataset_state(epoch)
        if saved is None and position > 0:
            name = type(self._rows.dataset).__name__
            raise RuntimeError(
                f"stoker cannot save an exact mid-epoch state of the IterableDataset {name}: "
                "it has no state_dict()/load_state_dict() to make the epoch's stream again. "
                "Give it those (torchdata's protocol), or save the state between epochs")
        return {"state": saved}

    def load(self, part: Mapping[str, Any]) -> None:
        self._rows.pending_dataset_state = part.get("state")
