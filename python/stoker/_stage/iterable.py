"""An ``IterableDataset`` (HF streaming, WebDataset pipelines, a generator over files),
read as DataLoader reads it and with what stoker adds.

NOTE [ Iterable datasets ]
An IterableDataset has no index: stoker cannot plan batch k ahead in C++, so the stream
runs in Python, on the loader's own worker threads, and this object stands in for both the
C++ core and the Python stage of a map-style loader (the same methods, so the Loader's
iteration, state and stats code is the same):

  workers (num_workers threads, default 1;         the loop's thread (next())
  0: the loop's own)
  --------------------------------------------     --------------------------------------
  worker w of N: get_worker_info() says (w, N),    rows taken round-robin from the workers'
  worker_init_fn(w), then iter(dataset): each      queues, worker 0, 1, ..., skipping those
  sample through map (its draws keyed by its       that ended: the stream (the same for a
  place j * N + w in the merged stream), into      given N); this rank's rows of it, batched
  its queue, bounded by prefetch batches in all    natively (collate.py) or by collate_fn

  * Epochs and iterators keep the core's rules (NOTE [ Epochs and iterators ] in
    csrc/pipeline/loader_core.h): an iterator claims its epoch at its first next() and
    starts its workers then (iter() alone uses no epoch); set_epoch(e) while e runs
    confirms it; an iterator started while another runs reads that epoch whole, with
    workers of its own, and the state follows the first; len(iter(loader)) is the
    batches left (a dataset without __len__: a TypeError, as len(loader)).
  * A row whose map raises is raised by next() once the rest of its batch is read (the
    batch is consumed, NOTE [ After a failed batch ]), or left out with on_error="skip"
    (counted in stats()["skipped"]); an error of the dataset's own iterator ends that
    worker's share of the stream after it is raised.
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
  * Resume: state_dict() holds the epoch, the rows the job consumed, and the dataset's
    own state_dict() taken when the epoch started; load_state_dict() gives the dataset
    that state and the next iterator skips the rows consumed (read again, not yielded).
    Without a dataset state_dict(), a mid-epoch state_dict() is an error that says so.
  * set_epoch(e) is passed on to the dataset's own set_epoch (WebDataset, HF datasets).
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np
import torch

from .collate import BatchLayout, tensors_of
from .errors import add_note
from .iterable_stats import StreamTelemetry
from .iterable_workers import (
    DONE,
    MIN_QUEUE_ROWS,
    SKIPPED,
    Failed,
    StreamWorker,
    datapipes,
    live_workers,
)
from .rng import batch_rng, rng_from_key, rng_keys
from .stage import END

__all__ = ["IterableStream"]


class _Iter:
    """One iterator of the stream (the core iterator's part): it claims its epoch at its
    first next() (NOTE [ Epochs and iterators ] in csrc/pipeline/loader_core.h), and only
    then starts its workers."""

    def __init__(self, stream: "IterableStream", rank: int, world: int):
        self.stream, self.rank, self.world = stream, rank, world
        self.claimed = False
        self.main = False  # claimed while no other iterator ran: the state follows it
        self._epoch: Optional[int] = None
        self.batch = 0  # batches yielded
        self.rows = 0  # rows of the merged stream consumed
        self.start_rows = 0  # rows a resume (or skip) reads again without yielding them
        self.first: List[Any] = []  # the epoch's first rows (padding wraps onto them)
        self.workers: List[Optional[StreamWorker]] = []
        self._inline: Optional[Iterator[Any]] = None
        self._turn = 0
        self._ended = False  # no more rows to read: its epoch's end, or closed
        self.exhausted = False  # its epoch's end reached (a break leaves it False)
        self._closed = False
        self.started_ns = 0  # the claim (run time counts from it)

    @property
    def epoch(self) -> int:
        """The epoch, once claimed (else the one it would claim now)."""
        return self._epoch if self._epoch is not None else self.stream.epoch

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def finished(self) -> bool:
        """Its run time is counted (the epoch ended, or it closed)."""
        return self._closed

    @property
    def remaining(self) -> int:
        """Batches left (len(iter(loader))): of the epoch it would claim now, before its
        first next(); a TypeError for a dataset without __len__, as len(loader)."""
        if self._ended:
            return 0
        s = self.stream
        if not self.claimed:
            return s.next_batches(self.rank, self.world)
        return max(0, s.batches_from(self.start_rows, self.world) - self.batch)

    def claim(self) -> None:
        s = self.stream
        self._epoch, self.start_rows, self.main = s.claim(self)
        self.claimed = True
        self.started_ns = time.perf_counter_ns()
        n = s.workers
        pipes = datapipes(s, n)
        skip = self.start_rows
        if n == 0:
            self._inline = iter(pipes[0] if pipes else s.dataset)
        else:
            self.workers = [StreamWorker(self, w, n, pipes[w] if pipes else None) for w in range(n)]
            for w in self.workers:
                assert w is not None
                w.start()
                live_workers.add(w)
        # a resume: the rows consumed are read again (through map, as in the workers: the
        # epoch's first rows pad its end), not yielded
        for _ in range(skip):
            if self._row() is DONE:
                break

    def mapped(self, item: Any, row: int) -> Any:
        """`item` through map (in a worker, or the loop's thread with num_workers=0)."""
        s = self.stream
        if s.map_fn is None:
            return item
        t0 = time.perf_counter_ns()
        try:
            return s.map_fn(item, rng_from_key(rng_keys(s.seed, self.epoch, [row])[0]))
        except Exception as e:
            if s.skip_errors:
                return SKIPPED
            return Failed(add_note(e, f"stoker: raised by map for row {row} of the "
                                       f"IterableDataset's stream, epoch {self.epoch}"))
        finally:
            s.telemetry.python_ns += time.perf_counter_ns() - t0  # (a race may lose one)

    def _row(self) -> Any:
        """The next row of the merged stream (a Failed, SKIPPED), or DONE."""
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

    def _get(self, w: StreamWorker) -> Any:
        deadline = None if self.stream.timeout <= 0 else time.monotonic() + self.stream.timeout
        while True:
            try:
                return w.q.get(timeout=0.1)
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
        if self.rows < s.batch_size * self.world and s.even_batches and not s.drop_last and \
                not isinstance(item, Failed) and item is not SKIPPED:
            self.first.append(item)
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
            if r is SKIPPED:
                s.telemetry.skipped += 1
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
        """The epoch ended, or the iterator closed: its time counted, its workers told."""
        if self.started_ns and not self._closed:
            self.stream.telemetry.run_ns += time.perf_counter_ns() - self.started_ns
        self._closed = True
        self._ended = True
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


class IterableStream:
    """An IterableDataset's stream: the core's and the stage's parts for the Loader
    (NOTE [ Iterable datasets ])."""

    def __init__(self, dataset: Any, *, batch_size: int, drop_last: bool, even_batches: bool,
                 seed: int, workers: int, worker_init_fn: Optional[Callable],
                 persistent_workers: bool = False,
                 map_fn: Optional[Callable], batch_map: Optional[Callable],
                 collate_fn: Optional[Callable], map_fields: Any, unbatched: bool,
                 timeout: float, generator: Optional[torch.Generator] = None,
                 split_ranks: bool = False, prefetch: Optional[int] = None,
                 skip_errors: bool = False, stall_warning: float = 0.0):
        self.dataset = dataset
        # stoker splits the stream across ranks (asked for); else each rank reads it as
        # the dataset gives it (NOTE [ Iterable datasets ])
        self.split_ranks = split_ranks
        self.warned_self_split = False
        self.generator = generator  # DataLoader's: an IterDataPipe's seed is drawn from it
        self.batch_size = 1 if unbatched else batch_size
        self.drop_last, self.even_batches = drop_last, even_batches
        self.seed, self.workers = seed, workers
        self.worker_init_fn, self.map_fn, self.batch_map = worker_init_fn, map_fn, batch_map
        # each iterator starts workers of its own; with persistent_workers, worker_init_fn
        # runs once per worker id over the loader's life (as in DataLoader's kept workers)
        self.persistent_workers = persistent_workers
        self._inited: set = set()
        self.unbatched = unbatched
        self.collate_fn = collate_fn
        if unbatched and collate_fn is None:
            self.collate_fn = torch.utils.data.default_convert
        self.layout = BatchLayout(map_fields, what="map output" if map_fn is not None
                                  else "dataset item")
        self.timeout = timeout
        self.skip_errors = skip_errors  # on_error="skip": a row whose map raised is left out
        # batches in flight: the rows the workers may hold ahead of the loop, in batches
        self.auto_prefetch = prefetch is None
        self.prefetch = prefetch if prefetch is not None else \
            max(1, self.queue_rows(workers) * max(1, workers) // self.batch_size)
        self.pin = False  # pin_memory=True with CUDA: batches page-locked (build() sets it)
        self.pending_dataset_state: Any = None  # load_state_dict's, for load_state
        self._lock = threading.Lock()
        self._next_epoch = 0  # the epoch after the last one claimed
        self._pending: Optional[int] = None  # set_epoch's, for the next iterator
        self._resume: Optional[Tuple[int, int, int]] = None  # (epoch, rows, world)
        self._skip: Optional[Tuple[int, int]] = None  # skip()'s (batches, world), not taken
        self._main: Optional[_Iter] = None  # the iterator the state follows
        self._start_state: Dict[int, Any] = {}  # epoch -> the dataset's state at its start
        self.telemetry = StreamTelemetry(stall_warning)  # stats()
        self.active_threads = max(1, workers)

    def first_start(self, wid: int) -> bool:
        """Whether worker `wid` runs worker_init_fn: every time it starts, or only the
        first time with persistent_workers."""
        with self._lock:
            first = wid not in self._inited
            self._inited.add(wid)
        return first or not self.persistent_workers

    def queue_rows(self, n: int) -> int:
        """Rows each of `n` workers may hold ahead of the loop: prefetch batches in all."""
        want = getattr(self, "prefetch", None)
        if want is None or getattr(self, "auto_prefetch", True):
            return max(MIN_QUEUE_ROWS, 2 * self.batch_size)
        return max(1, -(-want * self.batch_size // max(1, n)))

    # -- the core's part ----------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the next iterator runs."""
        if self._resume is not None:
            return self._resume[0]
        return self._pending if self._pending is not None else self._next_epoch

    def _main_running(self) -> bool:
        m = self._main
        return m is not None and m.claimed and not m.ended

    def set_epoch(self, epoch: int) -> None:
        with self._lock:
            m = self._main
            if self._main_running() and m is not None and m.epoch == epoch:
                self._pending = None  # the running epoch: the next iterator runs the next
                self._next_epoch = epoch + 1
            else:
                self._pending = epoch
                if self._resume is not None and self._resume[0] != epoch:
                    self._resume = None
                if not self._main_running():
                    self._main = None  # the state moves on to `epoch`
            if self._skip is not None:  # a skip not taken moves to the epoch set
                batches, world = self._skip
                self._resume = (epoch, batches * self.batch_size * world, world)

    def claim(self, it: _Iter) -> Tuple[int, int, bool]:
        """(epoch, rows to skip, main) for iterator `it`'s first next()."""
        with self._lock:
            if self._main_running() and self._main is not it:
                assert self._main is not None
                return self._main.epoch, 0, False  # a second iterator: the same epoch, whole
            epoch, rows = self.epoch, 0
            if self._resume is not None:
                rows = self._resume[1]
            self._resume = self._skip = self._pending = None
            self._next_epoch = epoch + 1
            self._main = it
        fn = getattr(self.dataset, "set_epoch", None)
        if callable(fn):
            fn(epoch)
        if callable(getattr(self.dataset, "state_dict", None)) and epoch not in \
                self._start_state:
            self._start_state = {epoch: self.dataset.state_dict()}
        return epoch, rows, True

    def _length(self) -> int:
        try:
            return len(self.dataset)
        except TypeError:
            raise TypeError("len() of a stoker.Loader over an IterableDataset without "
                            "__len__: its batches are known only when the stream ends") from None

    def batches_from(self, rows: int, world: int) -> int:
        """Batches of this rank in an epoch read from row `rows` of the stream."""
        left = max(0, self._length() - rows)
        full, rem = divmod(left, self.batch_size * world)
        return full if self.drop_last or rem == 0 else full + 1

    def num_batches(self, rank: int, world: int) -> int:
        if not self.split_ranks:
            world = 1
        return self.batches_from(0, world)

    def next_batches(self, rank: int, world: int) -> int:
        """Batches the next iterator of this rank yields (a pending resume or skip)."""
        if not self.split_ranks:
            world = 1
        if self._main_running():
            return self.batches_from(0, world)
        return self.batches_from(self._resume[1] if self._resume else 0, world)

    def iter(self, rank: int, world: int) -> _Iter:
        if not self.split_ranks:  # the dataset as it is, on every rank
            rank, world = 0, 1
        return _Iter(self, rank, world)

    def state(self) -> Tuple[int, int, int]:
        if self._resume is not None:
            return self._resume
        m = self._main  # after a break too: the rest of its epoch is what a resume reads
        if m is not None and m.claimed and not m.exhausted:
            return (m.epoch, m.rows, m.world)
        return (self.epoch, 0, 0)

    def dataset_state(self, epoch: int) -> Any:
        return self._start_state.get(epoch)

    def identity(self) -> Dict[str, Any]:
        """What a state records of the data: the IterableDataset's type."""
        return {"iterable": type(self.dataset).__qualname__}

    def state_parts(self) -> Dict[str, Any]:
        """This source's parts of the loader's state, by key: the dataset's own state."""
        return {"stream": DatasetStatePart(self)}

    # the producer's part (len, num_samples, the state's bounds)
    def epoch_samples(self) -> int:
        return 2**62  # unknown: a stream

    def rank_samples(self, rank: int, world: int) -> int:
        return self.num_batches(rank, world) * self.batch_size

    def load_state(self, epoch: int, position: int, world: int) -> None:
        dataset_state, self.pending_dataset_state = self.pending_dataset_state, None
        if dataset_state is not None:
            self.dataset.load_state_dict(dataset_state)
            self._start_state = {epoch: dataset_state}
        with self._lock:
            self._skip = None
            self._resume = (epoch, position, world)

    def skip(self, batches: int, rank: int, world: int) -> None:
        if not self.split_ranks:
            world = 1
        with self._lock:
            self._skip = (batches, world)
            self._resume = (self.epoch, batches * self.batch_size * world, world)

    def close(self) -> None:
        m = self._main
        if m is not None:
            m.close()
        for it in list(_open_iters.get(self, ())):
            it.close()

    def stats(self) -> Dict[str, Any]:
        return self.telemetry.stats(_open_iters.get(self, ()), threads=self.active_threads,
                                    prefetch=self.prefetch, auto_prefetch=self.auto_prefetch,
                                    batch_size=self.batch_size)

    # -- the stage's part ---------------------------------------------------------------

    def start(self, epoch: Optional[int] = None) -> bool:
        return False  # (nothing is left of an earlier epoch: PythonStage.start)

    def stop(self) -> None:
        self.close()

    def dropped(self) -> None:
        pass  # its threads end with the iterators that hold them (PythonStage.dropped)

    def follow(self, active: int) -> None:
        pass

    def next(self, it: _Iter, consumer_stream: Any, entered: int, timeout: float = 0.0,
             core: Any = None) -> Any:
        try:
            return self._next(it)
        finally:
            self.telemetry.next_done(it, entered)

    def _next(self, it: _Iter) -> Any:
        if it._closed:
            return END
        if not it.claimed:
            _open_iters.setdefault(self, weakref.WeakSet()).add(it)
            it.claim()
        try:
            rows = it.next_rows()
        except BaseException:
            it.batch += 1  # consumed (NOTE [ After a failed batch ])
            if it.ended:
                it.finish()
            raise
        if rows is None:
            it.finish()
            return END
        k = it.batch
        it.batch += 1
        self.telemetry.batches += 1
        self.telemetry.samples += len(rows)
        if self.collate_fn is not None:
            try:
                batch = self.collate_fn(rows[0] if self.unbatched else rows)
            except Exception as e:
                add_note(e, f"stoker: raised by collate_fn for batch {k} of epoch {it.epoch}")
                raise
        else:
            checked = [self.layout.check(r, f"batch {k}, row {j}") for j, r in enumerate(rows)]
            specs, nbytes = self.layout.plan(checked)
            buf = np.empty(nbytes, np.uint8)
            objects = self.layout.write(checked, specs, buf)
            batch = self.layout.assemble(tensors_of(buf, specs), objects)
        if self.batch_map is not None:
            batch = self.batch_map(batch, batch_rng(self.seed, it.epoch, it.rank, it.world, k))
        if self.pin:
            from torch.utils.data._utils.pin_memory import pin_memory

            batch = pin_memory(batch)
        return batch


class DatasetStatePart:
    """An IterableDataset's own state when the epoch started, a part of the loader's
    state (NOTE [ Iterable datasets ])."""

    def __init__(self, stream: IterableStream):
        self._stream = stream

    def state(self) -> Dict[str, Any]:
        epoch, position, _ = self._stream.state()
        saved = self._stream.dataset_state(epoch)
        if saved is None and position > 0:
            name = type(self._stream.dataset).__name__
            raise RuntimeError(
                f"stoker cannot save an exact mid-epoch state of the IterableDataset {name}: "
                "it has no state_dict()/load_state_dict() to make the epoch's stream again. "
                "Give it those (torchdata's protocol), or save the state between epochs")
        return {"state": saved}

    def load(self, part: Mapping[str, Any]) -> None:
        self._stream.pending_dataset_state = part.get("state")


# The iterators of each stream that claimed an epoch (stats() and close() reach them).
_open_iters: "weakref.WeakKeyDictionary[IterableStream, weakref.WeakSet[_Iter]]" = \
    weakref.WeakKeyDictionary()
