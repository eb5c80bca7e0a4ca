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
  worker_init_fn(w), then iter(dataset): its       queues, worker 0, 1, ..., skipping those
  samples (and map's) into its queue, bounded      that ended: the stream (the same for a
                                                   given N); this rank's rows of it, batched
                                                   natively (collate.py) or by collate_fn

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

import atexit
import copy
import queue
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from .collate import BatchLayout, tensors_of
from .errors import add_note
from .rng import batch_rng, rng_from_key, rng_keys
from .stage import END
from .workers import set_thread_worker_info

__all__ = ["IterableStream"]

_QUEUE = 64  # samples a worker may hold ahead of the loop
_DONE = object()
_EXIT_JOIN_SECONDS = 2.0

# Worker threads alive (an epoch left with a break keeps them until its iterator goes): at
# exit they are told to stop and joined before the interpreter finalizes, as the stage's
# threads are (stoker/_stage/pool.py): a daemon thread that takes the GIL back from a
# native call (torch's) once finalization began is unwound through that C++ frame, which
# aborts the process ("terminate called without an active exception").
_live_workers: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()


@atexit.register
def _stop_workers_at_exit() -> None:
    workers = list(_live_workers)
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


def _watch_rank_calls(stream: "IterableStream") -> None:
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
                    warnings.warn(
                        "stoker: the IterableDataset asks torch.distributed for its rank "
                        "(it splits itself by rank) while stoker splits its stream across "
                        "ranks too (even_batches=, rank= or world_size= given): each rank "
                        "would get a 1/world_size share of a share. Leave those out (each "
                        "rank is then given the dataset as it is, DataLoader's rule) or "
                        "stop the dataset's own split", RuntimeWarning, stacklevel=2)
                return _original(*args, **kwargs)

            setattr(dist, name, watched)


class _Worker(threading.Thread):
    """Worker `wid` of `n`: its iterator of the dataset, into its queue."""

    def __init__(self, stream: "IterableStream", wid: int, n: int, epoch: int,
                 pipe: Any = None, world: int = 1):
        super().__init__(name=f"stoker-iterable-{wid}", daemon=True)
        self.epoch_world = world
        self.pipe = pipe  # an IterDataPipe's copy for this worker (_datapipes), else None
        self.q: "queue.Queue[Any]" = queue.Queue(_QUEUE)
        self.stream, self.wid, self.n, self.epoch = stream, wid, n, epoch
        self.stop = threading.Event()

    def put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run(self) -> None:
        s = self.stream
        try:
            set_thread_worker_info(self.wid, self.n, s.seed, s.dataset)
            if s.split_ranks and self.epoch_world > 1:
                _watch_rank_calls(s)
            if s.worker_init_fn is not None:
                s.worker_init_fn(self.wid)
            for item in (s.dataset if self.pipe is None else self.pipe):
                if not self.put(("item", item)):
                    return
        except BaseException as e:  # the loop raises it at this worker's place
            self.put(("error", add_note(e, f"stoker: raised by the IterableDataset in "
                                           f"worker {self.wid}")))
        self.put(_DONE)


def _datapipes(stream: "IterableStream", n: int) -> List[Any]:
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


class _Iter:
    """One epoch of the stream (the core iterator's part)."""

    def __init__(self, stream: "IterableStream", epoch: int, rank: int, world: int,
                 skip_rows: int):
        self.stream, self.epoch, self.rank, self.world = stream, epoch, rank, world
        self.claimed = False
        self.batch = 0  # batches yielded
        self.rows = 0  # rows of the merged stream taken
        self.first: List[Any] = []  # the epoch's first rows (padding wraps onto them)
        n = stream.workers
        pipes = _datapipes(stream, n)
        if n == 0:
            self._inline: Optional[Any] = iter(pipes[0] if pipes else stream.dataset)
            self.workers: List[_Worker] = []
        else:
            self._inline = None
            self.workers = [_Worker(stream, w, n, epoch, pipes[w] if pipes else None, world)
                            for w in range(n)]
            for w in self.workers:
                w.start()
                _live_workers.add(w)
        self._turn = 0
        self._ended = False
        for _ in range(skip_rows):  # a resume: the rows consumed are read, not yielded
            if self._row() is _DONE:
                break

    @property
    def remaining(self) -> int:
        return 0 if self._ended else 1  # unknown: an iterable has no length

    def _row(self) -> Any:
        """The next row of the merged stream, or _DONE."""
        if self._inline is not None:
            try:
                item = next(self._inline)
            except StopIteration:
                return _DONE
            return self._keep(item)
        live = [w for w in self.workers if w is not None]
        while live:
            w = self.workers[self._turn % len(self.workers)]
            self._turn += 1
            if w is None:
                continue
            got = self._get(w)
            if got is _DONE:
                self.workers[self.workers.index(w)] = None  # type: ignore[call-overload]
                live = [x for x in self.workers if x is not None]
                continue
            kind, value = got
            if kind == "error":
                raise value
            return self._keep(value)
        return _DONE

    def _get(self, w: _Worker) -> Any:
        deadline = None if self.stream.timeout <= 0 else time.monotonic() + self.stream.timeout
        while True:
            try:
                return w.q.get(timeout=0.1)
            except queue.Empty:
                if deadline is not None and time.monotonic() > deadline:
                    t = self.stream.timeout
                    raise RuntimeError(f"DataLoader timed out after {t:g} seconds (stoker: no "
                                       f"sample came from worker {w.wid} within timeout={t:g} "
                                       "seconds)") from None

    def _keep(self, item: Any) -> Any:
        s = self.stream
        if s.map_fn is not None:
            key = rng_keys(s.seed, self.epoch, [self.rows])[0]
            item = s.map_fn(item, rng_from_key(key))
        if self.rows < s.batch_size * self.world and s.even_batches and not s.drop_last:
            self.first.append(item)
        self.rows += 1
        return item

    def next_rows(self) -> Optional[List[Any]]:
        """This rank's rows of the next batch, or None at the end of the epoch."""
        if self._ended:
            return None
        s, b, w = self.stream, self.stream.batch_size, self.world
        step = []
        for _ in range(b * w):
            r = self._row()
            if r is _DONE:
                break
            step.append(r)
        if len(step) == b * w:
            return step[self.rank * b:(self.rank + 1) * b]
        self._ended = True
        if not step or s.drop_last:
            return None
        if s.even_batches:  # every rank ceil(L / w) rows, wrapping onto the epoch's start
            per = -(-len(step) // w)
            pad = (self.first * (per * w))[: per * w - len(step)] if self.first else []
            step = step + pad
            return step[self.rank * per:(self.rank + 1) * per]
        per = -(-len(step) // w)
        return step[self.rank * per:(self.rank + 1) * per]

    def close(self) -> None:
        self._ended = True
        for w in self.workers:
            if w is not None:
                w.stop.set()

    def __del__(self) -> None:
        self.close()


class IterableStream:
    """An IterableDataset's stream: the core's and the stage's parts for the Loader
    (NOTE [ Iterable datasets ])."""

    def __init__(self, dataset: Any, *, batch_size: int, drop_last: bool, even_batches: bool,
                 seed: int, workers: int, worker_init_fn: Optional[Callable],
                 map_fn: Optional[Callable], batch_map: Optional[Callable],
                 collate_fn: Optional[Callable], map_fields: Any, unbatched: bool,
                 timeout: float, generator: Optional[torch.Generator] = None,
                 split_ranks: bool = False):
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
        self.unbatched = unbatched
        self.collate_fn = collate_fn
        if unbatched and collate_fn is None:
            self.collate_fn = torch.utils.data.default_convert
        self.layout = BatchLayout(map_fields, what="map output" if map_fn is not None
                                  else "dataset item")
        self.timeout = timeout
        self.pin = False  # pin_memory=True with CUDA: batches page-locked (build() sets it)
        self.pending_dataset_state: Any = None  # load_state_dict's, for load_state
        self._epoch = 0  # the epoch the next iterator runs
        self._resume: Optional[Tuple[int, int, int]] = None  # (epoch, rows, world)
        self._running: Optional[_Iter] = None
        self._start_state: Dict[int, Any] = {}  # epoch -> the dataset's state at its start
        self._batches = self._samples = 0
        self.active_threads = max(1, workers)

    # -- the core's part ----------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._resume[0] if self._resume else self._epoch

    def set_epoch(self, epoch: int) -> None:
        if self._resume and self._resume[0] != epoch:
            self._resume = None
        self._epoch = epoch

    def num_batches(self, rank: int, world: int) -> int:
        if not self.split_ranks:
            world = 1
        try:
            n = len(self.dataset)
        except TypeError:
            raise TypeError("len() of a stoker.Loader over an IterableDataset without "
                            "__len__: its batches are known only when the stream ends") from None
        per_step = self.batch_size * world
        full, rem = divmod(n, per_step)
        return full if self.drop_last or rem == 0 else full + 1

    next_batches = num_batches

    def iter(self, rank: int, world: int) -> _Iter:
        if not self.split_ranks:  # the dataset as it is, on every rank
            rank, world = 0, 1
        epoch = self.epoch
        skip = 0
        if self._resume is not None:
            skip = self._resume[1]
            self._resume = None
        self._epoch = epoch + 1
        fn = getattr(self.dataset, "set_epoch", None)
        if callable(fn):
            fn(epoch)
        if callable(getattr(self.dataset, "state_dict", None)) and epoch not in \
                self._start_state:
            self._start_state = {epoch: self.dataset.state_dict()}
        it = _Iter(self, epoch, rank, world, skip)
        it.claimed = True
        it.base_rows = skip  # type: ignore[attr-defined]
        self._running = it
        return it

    def state(self) -> Tuple[int, int, int]:
        it = self._running
        if self._resume is not None:
            return self._resume
        if it is None or it._ended:
            return (self.epoch, 0, 0)
        return (it.epoch, it.base_rows + it.batch * self.batch_size * it.world,  # type: ignore
                it.world)

    def dataset_state(self, epoch: int) -> Any:
        return self._start_state.get(epoch)

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
        self._resume = (epoch, position, world)

    def skip(self, batches: int, rank: int, world: int) -> None:
        if not self.split_ranks:
            world = 1
        self._resume = (self.epoch, batches * self.batch_size * world, world)

    def close(self) -> None:
        if self._running is not None:
            self._running.close()

    def stats(self) -> Dict[str, Any]:
        return {"batches": self._batches, "samples": self._samples, "skipped": 0,
                "source_counts": [], "num_threads": self.active_threads, "prefetch": _QUEUE,
                "tier": "python", "data_stall": None}

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
        rows = it.next_rows()
        if rows is None:
            return END
        k = it.batch
        it.batch += 1
        self._batches += 1
        self._samples += len(rows)
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
