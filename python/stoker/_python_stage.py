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
  * Telemetry: each chunk's wall time (minus the C++ decode it called) is the
    ``python`` stage; its thread CPU time tells whether the threads ran in parallel or
    took turns on the GIL ("GIL-bound" in the verdict).
"""

from __future__ import annotations

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
    return "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]


# -- map-style datasets ----------------------------------------------------------------

def normalize_item(item: Any, names: Optional[Sequence[Hashable]], where: str) -> Dict:
    """A map-style dataset's item as a dict: dicts as they are; a tuple or list as keys
    0, 1, ... (or `names`); any other value (a tensor, an array, a number) as key 0 (or
    ``names[0]``)."""
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

    def raw(self, index: int) -> Any:
        """The item as the dataset returns it (what collate_fn receives without map)."""
        return self.obj[index]

    def sample(self, index: int) -> Dict:
        return normalize_item(self.obj[index], self.names, self.describe(index))


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

    def _park(self, slot: int, stop: threading.Event) -> bool:
        """Waits while `slot` is not active; False when stopping."""
        with self._wake:
            while slot >= self._active and not stop.is_set():
                self._wake.wait(0.5)
            return not stop.is_set()


def _pool_loop(owner_ref: "weakref.ref[Any]", wait: Callable[[int], Any], handle_name: str,
               slot: int, stop: threading.Event, pool_ref: "weakref.ref[StagePool]") -> None:
    while not stop.is_set():
        pool = pool_ref()
        if pool is None or (slot >= pool._active and not pool._park(slot, stop)):
            return
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
                getattr(owner, handle_name)(item)
            except BaseException:  # the handler fails its batch itself; this is a bug
                _report_internal()
        del owner, item


def _report_internal() -> None:
    sys.stderr.write(f"stoker: internal error in the Python stage's thread "
                     f"{threading.current_thread().name}:\n{traceback.format_exc()}")
