"""The Python stage: ``map=``, ``batch_map=``, ``collate_fn=`` and map-style datasets.

NOTE [ Python stage ]
User code runs in the loader's own Python threads ("stoker-python-N"), never on a C++
worker: no C++ thread ever calls into Python (csrc/README.md). The stage sits *inside* a
batch's ring slot, between the C++ planning of batch k and its publication to the reader:

  C++ workers (no GIL)                  Python threads (the loader's)
  --------------------                  ------------------------------------------------
  plan batch k: its sample indices      take(): a chunk of the oldest batch handed off
  (sampler: permutation, rank share,      (csrc/producers/python_handoff.h; waits with the
  padding, resume offset, epochs)  -->     GIL released)
  slot k stays claimed: it counts       for each sample j of the chunk, in position order:
  in the prefetch window                  fetch: a stoker Dataset's record read, verified,
                                            decoded and transformed in C++ (GIL released),
                                            or obj[j] for a map-style dataset
                                          map:   fn(sample, rng(seed, epoch, j))
                                        the thread that finishes the batch's last chunk:
                                          collate: native batching into a block of the
                                            loader's pool (_collate.py), or collate_fn
                                          batch_map: gn(batch, rng(seed, epoch, batch))
  ring, in order of k             <--     complete(k): slot k is published
  [device copy] -> consumer next()

Why there, and what it keeps:
  * Order, window, memory: batch k is still slot k of its stream. The reader takes slots
    in order, so the consumer sees batch k whatever thread finished it first; the window
    bounds C++ and Python work in flight together; the block comes from the same pool.
  * Resume: the core counts the batches the consumer received (state_dict), never what
    the stage prepared; a resumed loader hands the stage exactly the remaining batches.
  * Stop, close, break, Ctrl-C, fork, two iterators: each stream hands off only its own
    batches; stop() closes the ring, so take() no longer returns that stream's chunks and
    completing one is a no-op. The consumer still waits in C++ in 20 ms slices (signals
    run), and the stage's threads wait in slices too, so close() joins them promptly.
  * Why the stage fetches samples itself instead of receiving a C++-assembled batch: a
    batch's layout (padding, one image size) is fixed before it is assembled, and map
    exists to change shapes. The C++ decode still runs with the GIL released, so T
    Python threads decode in parallel, and ``map=lambda s, rng: s`` gives the bytes the
    loader gives without map.
  * Determinism: ``rng`` depends only on (seed, epoch, dataset index); a sample's output
    goes to its position, and batches are assembled in position order, so the batches
    are bit-identical for any thread count. Code that draws from Python's global
    ``random``, ``np.random`` or torch's global generator depends on which thread ran
    first and how many samples it ran before: use ``rng``.
  * Errors: the user's exception object travels by ticket; the C++ batch carries only
    the ticket (a C++ thread never holds a Python object) and the consumer re-raises the
    original object, with its traceback and a note naming the sample (shard and record,
    or dataset index). Within a batch the lowest failing position wins, as in C++.
    ``on_error="skip"`` replaces the sample with the next one in dataset order whose
    fetch and map succeed (the C++ rule), counted in ``stats()["skipped"]``.
  * A batch over a stoker dataset with batch_map alone is assembled by the C++ workers
    as usual and handed off whole (one chunk): batch_map runs on it, no Python per
    sample. With a CUDA device, batch_map runs after the copy instead (NOTE [ batch_map
    on the device ]); the stage then only notes which batch it is.
  * Telemetry: each chunk's wall time (minus the C++ decode it called) is the
    ``python`` stage; the kernel's schedstat splits the rest into CPU time, time waiting
    for a core, and time blocked, which for threads running about one core's worth
    between them is the GIL ("GIL-bound" in the verdict; pipeline/autotuner.h).
  * Pure-Python code can run in worker processes instead (NOTE [ Python stage
    processes ] in _process_workers.py): two stage threads per process hand it their
    chunks (as many chunks in a batch as workers); everything above is unchanged.
  * Threads: as many as num_threads, following the tuner's active count (parked
    threads hold neither the pool nor the loader); they end at close(), when the loader
    is dropped, and before the interpreter exits.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from numpy.random.bit_generator import ISeedSequence

__all__ = ["sample_rng", "rng_keys", "batch_rng", "add_note", "MapStyleSource",
           "normalize_item", "StagePool"]

# -- per-sample random generators ------------------------------------------------------

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
# Domains of the keys: a sample's generator and a batch's never coincide.
_SAMPLE_DOMAIN = 0x5354_4B52_4E47_0001  # "STKRNG" 1
_BATCH_DOMAIN = 0x5354_4B52_4E47_0002


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over uint64 arrays (wrapping arithmetic), the mixer the C++
    engine uses for its seeds (csrc/sampler/permutation.h)."""
    with np.errstate(over="ignore"):
        z = z + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MUL1
        z = (z ^ (z >> np.uint64(27))) * _MUL2
    return z ^ (z >> np.uint64(31))


def _u64(value: int) -> np.uint64:
    return np.uint64(int(value) & 0xFFFFFFFFFFFFFFFF)


def rng_keys(seed: int, epoch: int, indices: Any, domain: int = _SAMPLE_DOMAIN) -> np.ndarray:
    """The 256-bit generator states of samples `indices` of `epoch`: uint64 [n, 4], a
    function of (seed, epoch, index) only. Vectorised: a chunk's keys cost one pass."""
    idx = np.asarray(indices, dtype=np.int64).astype(np.uint64)
    base = _mix(np.array([_u64(seed) ^ _u64(domain)], np.uint64))
    base = _mix(base ^ _u64(epoch))
    h = _mix(base ^ idx)
    out = np.empty((idx.shape[0], 4), np.uint64)
    out[:, 0] = h
    for i in range(1, 4):
        out[:, i] = _mix(h ^ np.uint64(i))
    return out


class _Key(ISeedSequence):
    """A precomputed state for a bit generator. NumPy's own SeedSequence costs 10-30 us
    per sample (it hashes, and a generator made without one reads OS entropy first); this
    hands PCG64 the words rng_keys made, which are well mixed already."""

    __slots__ = ("_words",)

    def __init__(self, words: np.ndarray):
        self._words = words

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        words = self._words
        if n_words == 4 and dtype is np.uint64:  # what PCG64 asks for
            return words
        if np.dtype(dtype) == np.uint32:
            words = words.view(np.uint32)
        return np.resize(words, n_words).astype(dtype, copy=False)


def rng_from_key(key: np.ndarray) -> np.random.Generator:
    """A ``numpy.random.Generator`` (PCG64) from one row of rng_keys."""
    return np.random.Generator(np.random.PCG64(_Key(key)))


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator ``map`` receives for dataset sample `index` in `epoch` of a loader
    with `seed`: the same in every run, on every thread, after any resume."""
    return rng_from_key(rng_keys(seed, epoch, [index])[0])


def batch_rng(seed: int, epoch: int, rank: int, world_size: int,
              batch: int) -> np.random.Generator:
    """The generator ``batch_map`` receives for batch `batch` (counted from the start of
    the epoch) of `rank` of `world_size` ranks."""
    lane = (int(rank) << 32) ^ int(world_size)
    keys = rng_keys(seed ^ lane, epoch, [batch], _BATCH_DOMAIN)
    return rng_from_key(keys[0])


# -- errors ----------------------------------------------------------------------------

def add_note(exc: BaseException, note: str) -> BaseException:
    """Adds `note` to `exc` (shown under its traceback from Python 3.11; on 3.9/3.10 it
    is kept in ``exc.__notes__``). The exception stays what it was: ``except
    ValueError`` still catches a ValueError that map raised."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python < 3.11
        notes = getattr(exc, "__notes__", None)
        try:
            if notes is None:
                exc.__notes__ = [note]  # type: ignore[attr-defined]
            else:
                notes.append(note)
        except (AttributeError, TypeError):
            pass
    return exc


def format_exception_summary(exc: BaseException) -> str:
    """One line for a C++-side message: "ValueError: bad box"."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# -- map-style datasets ----------------------------------------------------------------

def normalize_item(item: Any, names: Optional[Sequence[Hashable]], where: Any) -> Dict:
    """A map-style dataset's item as a dict: dicts as they are; a tuple or list as keys
    0, 1, ... (or `names`); any other value (a tensor, an array, a number) as key 0 (or
    ``names[0]``). `where` names the item in errors (a str, or a callable making it)."""
    if type(item) is dict and names is None:
        return item
    if callable(where):
        where = where()
    if isinstance(item, Mapping):
        if names is not None:
            raise TypeError(f"{where}: names= applies to datasets whose items are tuples or "
                            "single values; this item is a dict (its keys are the names)")
        return item if isinstance(item, dict) else dict(item)
    values = list(item) if isinstance(item, (tuple, list)) else [item]
    if names is None:
        return dict(enumerate(values))
    if len(names) != len(values):
        raise ValueError(f"{where}: the item has {len(values)} value(s) but names= gives "
                         f"{len(names)} ({', '.join(map(repr, names))})")
    return dict(zip(names, values))


class MapStyleSource:
    """Samples of any object with ``__len__`` and ``__getitem__`` (a
    ``torch.utils.data.Dataset``): ``obj[j]`` on the stage's threads."""

    def __init__(self, obj: Any, names: Optional[Sequence[Hashable]] = None):
        self.obj = obj
        self.names = None if names is None else list(names)
        if self.names is not None and len(set(self.names)) != len(self.names):
            raise ValueError(f"names= has repeated names: {self.names}")

    def __len__(self) -> int:
        return len(self.obj)

    def describe(self, index: int) -> str:
        return f"dataset index {index}"

    def raw(self, index: int, epoch: int) -> Any:
        """The item as the dataset returns it (what collate_fn receives without map)."""
        return self.obj[index]

    def sample(self, index: int, epoch: int) -> Dict:
        return normalize_item(self.obj[index], self.names, lambda: self.describe(index))


class DatasetSource:
    """Samples of a stoker dataset for the stage, fetched by the C++ path
    (``_core.SampleFetcher``: read, verify, decode, the loader's image ops with the
    loader's draws) with the GIL released: what ``map`` receives."""

    def __init__(self, dataset: Any, options: Any):
        from . import _core
        from .fields import Image, NDArray, Scalar

        self.dataset = dataset
        self._options = options  # _core.RecordOptions: images, transforms, the seed
        self._fetcher = _core.SampleFetcher(dataset._core, options)
        finish: List[Tuple[str, Callable[[Any], Any]]] = []
        for name, f in dataset.fields.items():
            if isinstance(f, Scalar):
                finish.append((name, _first))
            elif isinstance(f, NDArray) and len(f.shape) != 1:
                finish.append((name, _reshaper(tuple(-1 if d is None else d for d in f.shape))))
            elif isinstance(f, Image):
                finish.append((name, _same))
            else:  # 1-D arrays, tokens, blobs (bytes)
                finish.append((name, _same))
        self._finish = finish
        # A stored variable-length field or blob that map passes on is batched as the
        # loader batches it without map: padded, with "<name>_lengths".
        from .fields import Blob, Tokens

        self.default_layout: Dict[str, Any] = {}
        for name, f in dataset.fields.items():
            if isinstance(f, NDArray) and f.variable:
                self.default_layout[name] = f
            elif isinstance(f, Tokens):
                self.default_layout[name] = NDArray(f.dtype, (None,))
            elif isinstance(f, Blob):
                self.default_layout[name] = f

    def reopened(self) -> "DatasetSource":
        """The same source over the dataset opened again (a worker process's own)."""
        import copy
        import pickle

        from . import _core

        other = copy.copy(self)
        other.dataset = pickle.loads(pickle.dumps(self.dataset))  # by path and identity
        other._fetcher = _core.SampleFetcher(other.dataset._core, self._options)
        return other

    def __len__(self) -> int:
        return len(self.dataset)

    def describe(self, index: int) -> str:
        shard, record = self.dataset._core.locate(index)
        return f"sample {index} ({self.dataset._core.shard_path(shard)}: record {record})"

    def sample(self, index: int, epoch: int) -> Dict:
        if self.dataset._core.deferred:
            # A remote dataset: the stage's threads are not the loader's workers, which
            # wait for a shard in C++; the shard is made local and kept while it is read,
            # as ds[i] does (NOTE [ Deferred shards ] in csrc/format/shard_gate.h).
            with self.dataset.remote.holding([self.dataset._core.locate(index)[0]]):
                values, read_ns, decode_ns, ops_ns, nbytes = self._fetcher.fetch(index, epoch)
        else:
            values, read_ns, decode_ns, ops_ns, nbytes = self._fetcher.fetch(index, epoch)
        t = _times
        t.read_ns += read_ns
        t.decode_ns += decode_ns
        t.ops_ns += ops_ns
        t.native_ns += read_ns + decode_ns + ops_ns
        t.bytes += nbytes
        return {name: fin(v) for (name, fin), v in zip(self._finish, values)}

    raw = sample


_fetchers: "weakref.WeakKeyDictionary[Any, Dict[Any, DatasetSource]]" = \
    weakref.WeakKeyDictionary()
_fetchers_lock = threading.Lock()


def fetch_sample(dataset: Any, index: int, transforms: Optional[Mapping[str, Any]], seed: int,
                 image_layout: Optional[str], max_pixels: int) -> Dict:
    """``Dataset.sample``: a source per (transforms, layout, limit), kept while the
    dataset lives; the draws are keyed by (seed, index) through the source's epoch."""
    from . import _core
    from .fields import Image
    from .ops import Op, _specs

    if image_layout not in (None, "HWC", "CHW"):
        raise ValueError(f"image_layout must be 'HWC', 'CHW' or None, got {image_layout!r}")
    transforms = dict(transforms or {})
    for name, ops in transforms.items():
        if name not in dataset.fields or not isinstance(dataset.fields[name], Image):
            raise ValueError(f"transforms: {name!r} is not an image field of the dataset "
                             f"(fields: {', '.join(dataset.fields)})")
        transforms[name] = [ops] if isinstance(ops, Op) else list(ops)
    key = (repr(sorted(transforms.items())), image_layout, int(max_pixels))
    with _fetchers_lock:
        cache = _fetchers.setdefault(dataset, {})
        source = cache.get(key)
    if source is None:
        images = {name: _core.ImageFieldSpec(image_layout or f.layout, int(max_pixels))
                  for name, f in dataset.fields.items() if isinstance(f, Image)}
        groups = [_core.TransformSpec([name], _specs(ops)) for name, ops in transforms.items()
                  if ops]
        options = _core.RecordOptions(sampler=_core.SamplerOptions(batch_size=1),
                                      images=images, transforms=groups)
        source = DatasetSource(dataset, options)
        with _fetchers_lock:
            cache[key] = source
    return source.sample(index, int(seed) & 0xFFFFFFFFFFFFFFFF)


def _first(a: np.ndarray) -> Any:
    return a[0]


def _same(a: Any) -> Any:
    return a


def _reshaper(shape: Tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    return lambda a: a.reshape(shape)


# -- the stage's threads ---------------------------------------------------------------

class StagePool:
    """The Python threads of one loader's stage, named ``stoker-python-<i>``.

    Each thread loops: ``wait(slot)`` waits for a unit of work (with the GIL released,
    for at most a short slice) and returns it or None; a unit goes to the owner's method
    ``handle_name``. Threads whose slot is at or above ``active`` park on an event
    instead (autotuning moves ``active`` as it moves the C++ workers). ``stop()`` ends
    them; the next ``start()`` begins new ones. While waiting a thread holds only `wait`
    (which must not hold the owner), and the owner only while handling a unit, so a
    loader dropped without ``close()`` is still collected, and its threads end within a
    slice.
    """

    def __init__(self, owner: Any, wait: Callable[[int], Any], handle_name: str,
                 threads: int, name: str = "stoker-python"):
        self._owner = weakref.ref(owner)
        self._wait = wait
        self._handle_name = handle_name
        self._name = name
        self._size = max(1, int(threads))
        self._active = self._size
        self._threads: List[threading.Thread] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pid = -1

    @property
    def size(self) -> int:
        return self._size

    @property
    def active(self) -> int:
        return self._active

    def alive(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    def set_active(self, n: int) -> None:
        with self._wake:
            n = max(1, min(self._size, int(n)))
            if n != self._active:
                self._active = n
                self._wake.notify_all()

    def running(self) -> bool:
        """Whether the threads run in this process (cheap: the consumer asks per batch)."""
        import os

        return self._pid == os.getpid() and not self._stop.is_set() and bool(self._threads)

    def start(self) -> None:
        """Starts the threads (again after stop(), or in a process forked from the one
        that started them); a no-op while they run."""
        import os

        pid = os.getpid()
        with self._lock:
            if pid == self._pid and self._threads and not self._stop.is_set() and \
                    all(t.is_alive() for t in self._threads):
                return
            old = self._threads if pid == self._pid else []  # a child has none of them
            self._pid = pid
            self._stop.set()
            self._wake.notify_all()
        me = threading.current_thread()
        for t in old:
            if t is not me:
                t.join()
        with self._lock:
            self._stop = threading.Event()
            self._threads = []
            for i in range(self._size):
                t = threading.Thread(target=_pool_loop,
                                     args=(self._owner, self._wait, self._handle_name, i,
                                           self._stop, weakref.ref(self)),
                                     name=f"{self._name}-{i}", daemon=True)
                self._threads.append(t)
                t.start()

    def stop(self, join: bool = True) -> None:
        with self._wake:
            self._stop.set()
            self._wake.notify_all()
            threads = list(self._threads)
        if join:
            me = threading.current_thread()
            for t in threads:
                if t is not me:
                    t.join()


# Every stage thread alive in this process, with its stop event and its wait: at exit
# they are stopped and joined before the interpreter finalizes. (A daemon thread that
# takes the GIL back after finalization began is ended by an unwind through the C++
# frame that released it, which aborts the process.)
_running: Dict[threading.Thread, Tuple[threading.Event, Callable[[int], Any]]] = {}
_running_lock = threading.Lock()


@atexit.register
def _stop_every_stage_thread() -> None:
    with _running_lock:
        threads = list(_running.items())
    for _, (stop, wait) in threads:
        stop.set()
        wake = getattr(wait, "wake", None)
        if wake is not None:
            wake()
    me = threading.current_thread()
    for t, _ in threads:
        if t is not me:
            t.join()


def _pool_loop(owner_ref: "weakref.ref[Any]", wait: Callable[[int], Any], handle_name: str,
               slot: int, stop: threading.Event, pool_ref: "weakref.ref[StagePool]") -> None:
    me = threading.current_thread()
    with _running_lock:
        _running[me] = (stop, wait)
    try:
        _serve(owner_ref, wait, handle_name, slot, stop, pool_ref)
    finally:
        with _running_lock:
            _running.pop(me, None)


def _serve(owner_ref: "weakref.ref[Any]", wait: Callable[[int], Any], handle_name: str,
           slot: int, stop: threading.Event, pool_ref: "weakref.ref[StagePool]") -> None:
    try:
        from . import _core

        _core.set_thread_name(threading.current_thread().name)
    except Exception:  # only a name
        pass
    while not stop.is_set():
        pool = pool_ref()
        if pool is None or owner_ref() is None:
            return
        if slot >= pool._active:  # parked by the tuner: wait, holding neither pool nor owner
            wake = pool._wake
            del pool
            with wake:
                wake.wait(0.5)
            continue
        del pool
        try:
            item = wait(slot)
        except BaseException:  # the wait itself failed: a bug; report it, keep serving
            _report_internal()
            time.sleep(0.05)
            continue
        owner = owner_ref()
        if owner is None:
            return
        if item is not None and not stop.is_set():
            try:
                getattr(owner, handle_name)(item, slot)
            except BaseException:  # the handler fails its batch itself; this is a bug
                _report_internal()
        del owner, item


def _report_internal() -> None:
    sys.stderr.write(f"stoker: internal error in the Python stage's thread "
                     f"{threading.current_thread().name}:\n{traceback.format_exc()}")


# -- the stage ---------------------------------------------------------------------------

class _Pending:
    """A batch being mapped: each chunk fills its positions (NOTE [ Python stage ])."""

    __slots__ = ("rows", "errors", "skipped", "internal", "leases", "task")

    def __init__(self, task: Any):
        self.rows: List[Any] = [None] * task.samples
        self.errors: Dict[int, BaseException] = {}
        self.skipped = 0
        self.internal: Optional[BaseException] = None
        self.leases: List[Any] = []  # process workers' arenas that rows are views of
        self.task = task

    def release(self) -> None:
        """The rows are no longer read: their arenas may be written again."""
        leases, self.leases = self.leases, []
        for lease in leases:
            lease.release()


class _Delivery:
    """What a batch carries besides its tensors, by ticket: object fields, a whole
    batch (collate_fn, batch_map on the CPU), or an error; and which batch it is."""

    __slots__ = ("objects", "whole", "error", "epoch", "rank", "world_size", "batch", "task",
                 "since")

    def __init__(self, task: Any):
        self.objects: Dict[Hashable, List[Any]] = {}
        self.whole: Any = _UNSET
        self.error: Optional[BaseException] = None
        self.epoch = task.epoch
        self.rank = task.rank
        self.world_size = task.world_size
        self.batch = task.batch
        self.task = task  # holds its stream weakly: stopped() once the stream is gone
        self.since = 0.0


_UNSET = object()  # a delivery that carries no whole batch


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
        threads: Python threads.
        batch_map_on_consumer: batch_map runs when the consumer takes the batch (device
            batches: after the copy), not in the stage.
    """

    def __init__(self, source: Any, *, map_fn: Optional[Callable] = None,
                 batch_map: Optional[Callable] = None, collate_fn: Optional[Callable] = None,
                 map_fields: Optional[Mapping] = None, seed: int = 0, skip: bool = False,
                 threads: int = 1, batch_map_on_consumer: bool = False,
                 processes: bool = False, nchw_views: Sequence[str] = ()):
        from ._collate import BatchLayout

        self.source = source
        self.map_fn = map_fn
        self.batch_map = batch_map
        self.collate_fn = collate_fn
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
        self._names: Dict[str, Hashable] = {}
        # batch_map on a CUDA device: its stream (NOTE [ batch_map on the device ]).
        self.side_device: Any = None
        self._side: Any = None
        self.handoff: Any = None
        self.pool: Optional[StagePool] = None
        self.processes = bool(processes) and self.per_sample
        # Stage threads per Python thread of num_threads: two per worker process (NOTE
        # [ Python stage processes ]), one when the threads run the code themselves.
        self._per_worker = PROCESS_THREADS_PER_WORKER if self.processes else 1
        # Image fields of a C++-assembled batch that the loop gets as NCHW views of their
        # HWC memory (channels_last strides): batch_map sees them as the loop would.
        self.nchw_views = tuple(nchw_views)
        self.workers: Any = None  # ProcessWorkers, with processes

    needs_handoff = True  # every batch goes through the stage's threads

    # -- threads ---------------------------------------------------------------------

    def attach(self, handoff: Any) -> None:
        """Serves `handoff` (``_core.PythonHandoff``: take() gives (task, lo, hi))."""
        self.handoff = handoff
        self.pool = StagePool(self, _Taker(handoff), "run_chunk",
                              self._threads * self._per_worker)

    def start(self) -> None:
        """At iter(): the threads, and the worker processes (a worker that died is
        replaced here, once per iter(); the first ones start before the threads, so
        that the fork copies a process with fewer threads running)."""
        if self.pool is None:
            return
        if self.processes:
            if self.workers is None:
                from ._process_workers import ProcessWorkers

                self.workers = ProcessWorkers(self._threads)
            self.workers.start(self)
        if not self.pool.running():
            self.pool.start()

    def stop(self) -> None:
        """close(): the threads end, and the work they held (every stream stopped)."""
        if self.pool is not None:
            self.pool.stop()
        with self._lock:
            dropped = list(self._pending.values())
            self._pending.clear()
        for p in dropped:
            p.release()
        if self.workers is not None:
            self.workers.stop()

    # -- one chunk of a batch (a stage thread) ---------------------------------------

    def run_chunk(self, item: Tuple[Any, int, int], slot: int = 0) -> None:
        task, lo, hi = item
        dropped: List[_Pending] = []
        with self._lock:
            pending = self._pending.get(task.id)
            if pending is None:
                pending = self._pending[task.id] = _Pending(task)
                dropped = self._drop_stopped()
        for p in dropped:
            p.release()
        wall0 = time.perf_counter_ns()
        cpu0, wait0 = thread_sched()
        times = _times.reset()
        remote: Optional[Tuple[int, ...]] = None
        try:
            if task.stopped or not self.per_sample:
                pass
            elif self.workers is not None:
                remote = self._run_remote(task, pending, lo, hi, slot)
            else:
                indices = task.indices
                keys = rng_keys(self.seed, task.epoch, indices[lo:hi]) \
                    if self.map_fn is not None else None
                for pos in range(lo, hi):
                    self._one(task, pending, pos, int(indices[pos]),
                              None if keys is None else keys[pos - lo])
                    if task.stopped:
                        break
        except BaseException as e:  # a bug of the stage: the batch fails with it
            pending.internal = e
        finally:
            wall = time.perf_counter_ns() - wall0
            cpu1, wait1 = thread_sched()
            cpu, wait = cpu1 - cpu0, wait1 - wait0
            if remote is not None:  # the worker's time in Python (less its C++ fetch)
                # and this thread's CPU on the reply; not this thread's wall time, which
                # includes waiting while the worker maps the other thread's chunk
                task.add_times(remote[0] + cpu, remote[1] + cpu, remote[2], remote[3],
                               remote[4], remote[5], remote[6] + wait)
            else:  # the wait for a core, shared out in proportion to the Python part
                py = max(0, wall - times.native_ns)
                task.add_times(py, max(0, cpu - times.native_ns), times.read_ns,
                               times.decode_ns, times.ops_ns, times.bytes,
                               wait * py // wall if wall > 0 else 0)
            if task.chunk_done():
                self._finish(task, pending)

    def _run_remote(self, task: Any, pending: _Pending, lo: int, hi: int,
                    slot: int) -> Tuple[int, ...]:
        """Samples [lo, hi) mapped by this thread's worker process; checked here."""
        from ._process_workers import WorkerDied

        indices = [int(i) for i in task.indices[lo:hi]]
        try:
            rows, errors, skipped, times, lease = self.workers.run(
                slot // PROCESS_THREADS_PER_WORKER, task.epoch, indices,
                copy=self.collate_fn is not None)
        except WorkerDied as e:
            pending.errors[lo] = e
            return (0, 0, 0, 0, 0, 0, 0, 0)
        pending.leases.append(lease)  # released with the batch (or with pending, dropped)
        objects = self._object_positions()
        for j, row in enumerate(rows):
            pos = lo + j
            if j in errors:
                pending.errors[pos] = errors[j]
            elif self.collate_fn is not None:
                pending.rows[pos] = row
            else:
                try:
                    checked = self.layout.check(row, lambda j=j: self.source.describe(indices[j]))
                    if objects is None:
                        objects = self._object_positions()
                    for i in objects:  # kept as they are in the batch: not arena views
                        checked[i] = _copied(checked[i])
                    pending.rows[pos] = checked
                except Exception as e:
                    pending.errors[pos] = e
        with self._lock:
            pending.skipped += skipped
        return times

    def _object_positions(self) -> Optional[List[int]]:
        """Positions of the layout's object fields in a checked row (None until the
        layout is fixed)."""
        fields = self.layout.fields
        if fields is None:
            return None
        return [i for i, f in enumerate(fields.values()) if f.kind == "object"]

    def _one(self, task: Any, pending: _Pending, pos: int, index: int,
             key: Optional[np.ndarray]) -> None:
        try:
            pending.rows[pos] = self._sample(index, task.epoch, key)
            return
        except Exception as e:
            if not self.skip:
                pending.errors[pos] = e
                return
            first = e
        row, ok = self._replacement(index, task.epoch, self._sample, lambda: task.stopped)
        if ok:
            pending.rows[pos] = row
            with self._lock:  # chunks of one batch count on several threads
                pending.skipped += 1
        elif not task.stopped:
            pending.errors[pos] = add_note(first, "stoker: on_error='skip' found no sample to "
                                           "replace it with: every sample fails")

    def _replacement(self, index: int, epoch: int, make: Callable[[int, int, Any], Any],
                     stopped: Callable[[], bool] = lambda: False) -> Tuple[Any, bool]:
        """on_error="skip": the next sample in dataset order whose fetch and map succeed
        takes the place of a failed one, as the C++ sample writer does for a bad record;
        each with its own generator."""
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

    def _produce(self, index: int, epoch: int, key: Optional[np.ndarray]) -> Any:
        """Sample `index` fetched (and mapped): what map returns, or the dataset's item."""
        source = self.source
        try:
            if self.map_fn is None and self.collate_fn is not None:
                return source.raw(index, epoch)
            sample = source.sample(index, epoch)
        except Exception as e:
            if not _names_itself(e):
                add_note(e, f"stoker: raised while loading {source.describe(index)}")
            raise
        if self.map_fn is not None:
            try:
                sample = self.map_fn(sample, rng_from_key(key))
            except Exception as e:
                add_note(e, f"stoker: raised by map for {source.describe(index)}")
                raise
        return sample

    def _sample(self, index: int, epoch: int, key: Optional[np.ndarray]) -> Any:
        """A batch row: _produce's value, checked against the layout (unless collate_fn
        takes the samples as they are)."""
        sample = self._produce(index, epoch, key)
        if self.collate_fn is not None:
            return sample
        return self.layout.check(sample, lambda: self.source.describe(index))

    def worker_sample(self, index: int, epoch: int, key: Optional[np.ndarray]) -> Any:
        """In a worker process: _produce's value, checked there too (so that on_error=
        "skip" replaces a sample that does not fit), sent as it is."""
        sample = self._produce(index, epoch, key)
        if self.collate_fn is None:
            self.layout.check(sample, lambda: self.source.describe(index))
        return sample

    def worker_copy(self) -> "PythonStage":
        """The stage as a worker process uses it, right after fork(): fresh locks (a
        thread of the loader's process may have held one at the fork), and a stoker
        dataset opened again by path and identity (the same generation), so that none
        of the loader's mutexes is inherited locked."""
        import copy

        w = copy.copy(self)
        w._lock = threading.Lock()
        w.layout = copy.copy(self.layout)
        w.layout._lock = threading.Lock()
        w.pool = None
        w.workers = None
        if isinstance(self.source, DatasetSource):
            w.source = self.source.reopened()
        return w

    # -- the batch, by the thread that finished its last chunk -----------------------

    def _finish(self, task: Any, pending: _Pending) -> None:
        with self._lock:
            self._pending.pop(task.id, None)
        if task.stopped:
            pending.release()
            return
        wall0 = time.perf_counter_ns()
        cpu0, wait0 = thread_sched()
        try:
            self._assemble(task, pending)
        except BaseException as e:  # a bug of the stage: the batch fails with it
            self._fail(task, e)
        finally:
            pending.release()
            wall = time.perf_counter_ns() - wall0
            cpu1, wait1 = thread_sched()
            task.add_times(wall, cpu1 - cpu0, 0, 0, 0, 0, wait1 - wait0)

    def _assemble(self, task: Any, pending: _Pending) -> None:
        if pending.internal is not None:
            raise pending.internal
        if pending.errors:  # the lowest position's error, whatever the timing
            self._fail(task, pending.errors[min(pending.errors)])
            return
        d = _Delivery(task)
        what = f"batch {task.batch} of epoch {task.epoch}"
        specs: List[Any] = []
        nbytes = 0
        if not self.per_sample:  # a batch the C++ workers assembled: batch_map only
            if self.batch_map_on_consumer:  # after the device copy: the ticket says which
                task.keep(self._put(d))
                return
            d.whole = self._viewed({name: _tensor_from_capsule(cap)
                                    for name, cap in task.tensors})
        elif self.collate_fn is not None:
            try:
                d.whole = self.collate_fn(pending.rows)
            except Exception as e:
                self._fail(task, add_note(e, f"stoker: raised by collate_fn for {what}"))
                return
        else:
            specs, nbytes = self.layout.plan(pending.rows)
            buffer = task.allocate(nbytes)
            d.objects = self.layout.write(pending.rows, specs, buffer)
            pending.release()  # the rows are in the batch now
            if self.batch_map is not None and not self.batch_map_on_consumer:
                from ._collate import tensors_of

                d.whole = self._merge(tensors_of(buffer, specs), d.objects)
                specs, nbytes = [], 0
        if self.batch_map is not None and not self.batch_map_on_consumer:
            try:
                d.whole = self.batch_map(d.whole, batch_rng(self.seed, task.epoch, task.rank,
                                                            task.world_size, task.batch))
            except Exception as e:
                self._fail(task, add_note(e, f"stoker: raised by batch_map for {what}"))
                return
        ticket = 0
        if d.objects or d.whole is not _UNSET or self.batch_map_on_consumer:
            ticket = self._put(d)
        task.complete([(s.name, _dtype_str(s.dtype), list(s.shape), s.offset, s.nbytes)
                       for s in specs], nbytes, ticket, pending.skipped)

    def _fail(self, task: Any, exc: BaseException) -> None:
        d = _Delivery(task)
        d.error = exc
        ticket = self._put(d)
        task.fail(ticket, format_exception_summary(exc))

    def _put(self, d: _Delivery) -> int:
        d.since = time.monotonic()
        with self._lock:
            if self._next_ticket % 16 == 0:
                # Deliveries of batches their stream dropped are never taken; a
                # consumer takes its own within moments of the stop its error causes.
                old = d.since - 5.0
                stale = [t for t, x in self._deliveries.items()
                         if x.since < old and x.task.stopped]
                for t in stale:
                    del self._deliveries[t]
            ticket = self._next_ticket
            self._next_ticket += 1
            self._deliveries[ticket] = d
            return ticket

    # -- the consumer ----------------------------------------------------------------

    def _merge(self, tensors: Dict[Hashable, Any], objects: Dict[Hashable, List[Any]]) -> Dict:
        """The batch dict in the layout's key order: tensors (each variable field followed
        by its lengths) and object lists."""
        fields = self.layout.fields or {}
        out: Dict[Hashable, Any] = {}
        for key, f in fields.items():
            if f.kind == "object":
                out[key] = objects.get(key, [])
                continue
            out[key] = tensors[key]
            if f.kind == "var":
                lk = f"{key}_lengths"
                out[lk] = tensors[lk]
        return out

    def _viewed(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        for name in self.nchw_views:
            if name in batch:
                batch[name] = batch[name].permute(0, 3, 1, 2)
        return batch

    def key_of(self, name: str) -> Hashable:
        """The batch key of the tensor a batch names `name` (an int for tuple items)."""
        key = self._names.get(name)
        if key is None:
            for k, f in (self.layout.fields or {}).items():
                self._names[str(k)] = k
                if f.kind == "var":
                    self._names[f"{k}_lengths"] = f"{k}_lengths"
            key = self._names.get(name, name)
        return key

    def take_delivery(self, ticket: int) -> Optional[_Delivery]:
        if not ticket:
            return None
        with self._lock:
            return self._deliveries.pop(ticket, None)

    def deliver(self, tensors: Dict[str, Any], ticket: int) -> Any:
        """The batch the consumer gets, from the tensors the core delivered."""
        d = self.take_delivery(ticket)
        if d is not None and d.whole is not _UNSET:
            return d.whole
        if self.per_sample:
            batch = self._merge({self.key_of(n): t for n, t in tensors.items()},
                                d.objects if d is not None else {})
        else:  # a batch the C++ workers assembled, named by its fields
            batch = self._viewed(dict(tensors))
        if self.batch_map is not None and self.batch_map_on_consumer and d is not None:
            rng = batch_rng(self.seed, d.epoch, d.rank, d.world_size, d.batch)
            try:
                if self._side is None:  # the host fake's "device": host memory, copied
                    return self.batch_map(batch, rng)
                return self._on_side_stream(batch, rng)
            except Exception as e:
                add_note(e, f"stoker: raised by batch_map for batch {d.batch} of epoch {d.epoch}")
                raise
        return batch

    def _on_side_stream(self, batch: Any, rng: np.random.Generator) -> Any:
        """NOTE [ batch_map on the device ]
        The copy of batch k ends with event E_k on stoker's copy stream. At next(), the
        consumer's stream U and the stage's side stream S both wait for E_k (on the
        device: no host wait); batch_map's kernels are queued on S, so they run while U
        still runs the step the loop queued before, and U waits for an event recorded
        on S after them:

          copy stream:  [H2D k] (E_k)
          S (stage):          wait E_k  [batch_map(k) kernels] (B_k)
          U (loop):     [step k-1 kernels ...............]  wait B_k  [step k]

        The batch's own buffer is fenced on U (its last reader: U waits for B_k, after
        S's reads), so stoker reuses it only after step k. Tensors batch_map allocates on
        S are marked as used on U (record_stream), as the caching allocator needs."""
        import torch

        side = self._side
        inputs = {t.untyped_storage().data_ptr() for t in _tensors(batch)}
        with torch.cuda.stream(side):
            out = self.batch_map(batch, rng)
        done = torch.cuda.Event()
        done.record(side)
        consumer = torch.cuda.current_stream(side.device)
        consumer.wait_event(done)
        for t in _tensors(out):  # allocated on S by torch: used on U from now on
            if t.is_cuda and t.untyped_storage().data_ptr() not in inputs:
                t.record_stream(consumer)
        return out

    def next(self, it: Any, consumer_stream: Optional[int], entered: int) -> Any:
        """The consumer's next batch from core iterator `it` (None at the end): the
        user's exception object when the batch failed in the stage. The loop's time in
        next() outside the core's wait (since `entered`, perf_counter_ns) goes to the
        iterator's hand-off time, counted in data_stall as the plain path's."""
        from . import _core

        if self.pool is not None and not self.pool.running():
            self.pool.start()
        failed: Optional[BaseException] = None
        side = 0
        if consumer_stream is not None and self.batch_map_on_consumer and \
                self.batch_map is not None:
            if self._side is None:
                import torch

                self._side = torch.cuda.Stream(self.side_device)
            side = self._side.cuda_stream
        calling = time.perf_counter_ns()
        try:
            got = it.next(consumer_stream or 0, with_ticket=True, side_stream=side)
        except _core.PythonStageError as e:
            failed = self.error(e.ticket)
            if failed is None:
                raise
        self._purge()
        if failed is not None:
            raise failed  # outside the except block: the user's exception, as it was
        if got is None:
            return None
        t0 = time.perf_counter_ns()
        caps, ticket = got
        batch = self.deliver({name: _tensor_from_capsule(cap) for name, cap in caps}, ticket)
        it.note_handoff(calling - entered + time.perf_counter_ns() - t0)
        return batch

    def _purge(self) -> None:
        """Drops the deliveries of batches their stream dropped (stop, close, break): they
        are never taken. The consumer's thread does it, after taking its own, so a batch
        being delivered is never dropped (its stream stops when it carries an error)."""
        self._purge_count += 1
        if self._purge_count % 16 and len(self._deliveries) < 64:
            return
        with self._lock:
            stale = [t for t, d in self._deliveries.items() if d.task.stopped]
            for t in stale:
                del self._deliveries[t]
            dropped = self._drop_stopped()
        for p in dropped:
            p.release()

    def _drop_stopped(self) -> List[_Pending]:
        """Batches whose stream stopped before all their chunks were taken (break,
        close): no thread will finish them, so they leave the table here, at each new
        batch and with the consumer's purge (a thread running one of their chunks keeps
        its own reference). Called with the lock held; the caller releases them."""
        dropped = [p for p in self._pending.values() if p.task.stopped]
        for p in dropped:
            del self._pending[p.task.id]
        return dropped

    def follow(self, active: int) -> None:
        """Keeps `active` of the stage's threads working (the tuner's thread count)."""
        active *= self._per_worker
        if self.pool is not None and active != self.pool.active:
            self.pool.set_active(active)

    def error(self, ticket: int) -> Optional[BaseException]:
        """The exception a failed batch carries (None if it is not known here)."""
        d = self.take_delivery(ticket)
        return None if d is None else d.error


class _Taker:
    """A pool thread's wait: a chunk from the hand-off, within a slice (the GIL is
    released while it waits). Holds the hand-off, never the stage."""

    __slots__ = ("handoff",)
    slice_ms = 100

    def __init__(self, handoff: Any):
        self.handoff = handoff

    def __call__(self, slot: int) -> Any:
        return self.handoff.take(self.slice_ms)

    def wake(self) -> None:
        """Ends the waits now (the process is exiting)."""
        self.handoff.close()


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


_times = _NativeTimes()


def _tensors(value: Any) -> List[Any]:
    """The torch tensors in a batch-like structure (dicts, lists, tuples)."""
    import torch

    out: List[Any] = []
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, Mapping):
            todo.extend(v.values())
        elif isinstance(v, (list, tuple)):
            todo.extend(v)
    return out


def _copied(value: Any) -> Any:
    """An object field's value that may be a view of a process worker's arena, as a
    value of its own (the batch's lists outlive the arena's lease)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if type(value).__module__.startswith("torch") and hasattr(value, "clone"):
        return value.clone()
    return value


def _tensor_from_capsule(cap: Any) -> Any:
    import torch

    from_capsule = getattr(torch._C, "_from_dlpack", None) or torch.from_dlpack
    return from_capsule(cap)


def _dtype_str(dtype: Any) -> str:
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


def _names_itself(exc: BaseException) -> bool:
    """Errors of stoker's own reads already name the shard file and record."""
    from . import _core

    return isinstance(exc, _core.Error)


# -- setting up a loader's stage ---------------------------------------------------------

def is_map_style(obj: Any) -> bool:
    """Any object with ``__len__`` and ``__getitem__`` that is not a stoker dataset or a
    path: a ``torch.utils.data.Dataset``, a list, a HF ``datasets.Dataset``..."""
    from .dataset import Dataset
    from .token_dataset import TokenDataset

    if isinstance(obj, (Dataset, TokenDataset, str, bytes)) or hasattr(obj, "__fspath__"):
        return False
    return hasattr(obj, "__len__") and hasattr(obj, "__getitem__")


def check_hook(name: str, fn: Any) -> Optional[Callable]:
    if fn is not None and not callable(fn):
        raise TypeError(f"{name} must be a function, got {type(fn).__name__}")
    return fn


PROCESS_THREADS_PER_WORKER = 2


def chunk_samples(batch_size: int, threads: int, processes: bool = False) -> int:
    """Samples per chunk: about four chunks per thread in a batch, so that the first batch
    is ready after about 1/T of its work, while a claim (one C++ call) stays rare. With
    process workers, as many chunks in a batch as workers: a chunk costs a round trip to its
    worker (two messages, two thread switches), which a handful of samples does not
    amortise, and the second stage thread of each worker keeps it busy meanwhile."""
    per = 1 if processes else 4
    return max(1, -(-int(batch_size) // (per * max(1, int(threads)))))


def check_picklable(args: Mapping[str, Any]) -> None:
    """A loader pickles its hooks by reference, as DataLoader's workers get them under
    spawn; a lambda or a nested function cannot be: say which, and what to do."""
    import pickle

    for name in ("map", "batch_map", "collate_fn"):
        fn = args.get(name)
        if fn is None:
            continue
        try:
            pickle.dumps(fn)
        except Exception as e:
            raise TypeError(
                f"this stoker.Loader cannot be pickled: its {name}={fn!r} cannot be ({e}). "
                "Functions are pickled by reference, as DataLoader's under spawn: define it at "
                "the top level of a module (not a lambda or a nested function), or pass a "
                "picklable callable object") from e


def check_stage_args(dataset: Any, *, map_style: bool, tokens: bool, map_fn: Any,
                     batch_map: Any, collate_fn: Any, map_fields: Any, names: Any,
                     python_workers: str, transforms: Any, image_layout: Any,
                     device: Any) -> bool:
    """The Loader's arguments of the Python stage, checked together; whether the stage runs
    in worker processes."""
    hooks = [n for n, v in (("map", map_fn), ("batch_map", batch_map),
                            ("collate_fn", collate_fn), ("map_fields", map_fields),
                            ("names", names)) if v is not None]
    if tokens and (hooks or map_style):
        raise ValueError(f"{', '.join(hooks) or 'a map-style dataset'}: not for token batches "
                         "(seq_len=, packing=, max_tokens=)")
    if map_style and (transforms or image_layout is not None):
        raise ValueError("transforms and image_layout apply to the image fields of a "
                         "stoker.Dataset; with a map-style dataset, transform in its "
                         "__getitem__ or in map=")
    if names is not None and not map_style:
        raise ValueError("names= names the values of a map-style dataset's tuple items; a "
                         "stoker.Dataset's samples are dicts of its fields")
    if map_fields is not None and map_fn is None and not map_style:
        raise ValueError("map_fields= declares what map= returns: pass map= too")
    if python_workers not in ("thread", "process"):
        raise ValueError(f"python_workers must be 'thread' or 'process', got {python_workers!r}")
    processes = python_workers == "process"
    if processes and not (map_style or map_fn is not None or collate_fn is not None):
        raise ValueError("python_workers='process' runs map= and a map-style dataset's "
                         "__getitem__ in worker processes: pass one of them")
    if processes and not map_style and getattr(dataset, "remote", None) is not None:
        raise ValueError("python_workers='process' reads a local stoker dataset in each "
                         "worker; a dataset at a URL arrives through this process: use "
                         "python_workers='thread'")
    if collate_fn is not None and device.type == "cuda":
        raise ValueError("collate_fn returns Python objects that stoker cannot copy to the "
                         "device: with device='cuda' use batch_map= (it receives the native "
                         "batch on the GPU), or device='cpu' and move the batch yourself")
    return processes
