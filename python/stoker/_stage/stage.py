"""The Python stage of one loader (NOTE [ Python stage ] in stoker/_stage/__init__.py):
chunks of planned batches taken from the C++ hand-off, samples fetched and mapped, the
batch assembled (native batching, collate_fn, batch_map) and completed in its ring slot."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import _core
from .collate import BatchLayout, tensors_of
from .errors import add_note, format_exception_summary, names_itself
from .pool import StagePool
from .processes import ProcessWorkers, WorkerDied
from .rng import batch_rng, rng_from_key, rng_keys
from .sources import DatasetSource, MapStyleSource
from .telemetry import native_times, thread_sched

__all__ = ["PythonStage", "PROCESS_THREADS_PER_WORKER"]

# Stage threads per worker process (NOTE [ Python stage processes ] in processes.py).
PROCESS_THREADS_PER_WORKER = 2

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
        times = native_times.reset()
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
            if not names_itself(e):
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
        if self.pool is not None and not self.pool.running():
            self.pool.start()
        failed: Optional[BaseException] = None
        side = 0
        if consumer_stream is not None and self.batch_map_on_consumer and \
                self.batch_map is not None:
            if self._side is None:
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


def _tensors(value: Any) -> List[Any]:
    """The torch tensors in a batch-like structure (dicts, lists, tuples)."""
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
    from_capsule = getattr(torch._C, "_from_dlpack", None) or torch.from_dlpack
    return from_capsule(cap)


def _dtype_str(dtype: Any) -> str:
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name
