"""The Python stage of one loader (NOTE [ Python stage ] in stoker/_stage/__init__.py):
chunks of planned batches taken from the C++ hand-off, samples fetched and mapped, the
batch assembled (native batching, collate_fn, batch_map) and completed in its ring slot."""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
import warnings
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import _core, _loader_args
from .collate import BatchLayout, tensors_of
from .errors import add_note, format_exception_summary, names_itself
from .pool import StagePool, exiting
from .processes import ProcessWorkers, SendOrder, WorkerDied
from .rng import batch_rng, batch_torch_seed, call_with_torch_seeded, rng_from_key, rng_keys
from .sources import DatasetSource, MapStyleSource
from .telemetry import native_times, thread_sched
from .workers import (
    draws_globals,
    seed_globals,
    set_process_worker_info,
    set_thread_worker_info,
    worker_info_wanted,
)

__all__ = ["PythonStage", "PROCESS_THREADS_PER_WORKER", "END"]

# Stage threads per worker process (NOTE [ Python stage processes ] in processes.py).
PROCESS_THREADS_PER_WORKER = 2
# The end of an epoch, as PythonStage.next() says it: never a value a hook may return.
END = object()
# A stall is reported again this often (as the C++ core reports a slow first batch).
_STALL_REPEAT_SECONDS = 10.0
_log = logging.getLogger("stoker")
# Forks (os.fork) this process came out of: a stage compares it with its own count after
# each call of user code, and only then the pid (a syscall: not per sample).
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)


class _Doing:
    """What one stage thread is doing, for the stall report: the phase ("dataset", "map",
    "collate_fn", "batch_map", "worker": a chunk at a worker process; None: idle), the
    batch, the sample's dataset index, since when (time.monotonic())."""

    __slots__ = ("thread", "name", "phase", "task", "index", "since", "worker")

    def __init__(self, thread: threading.Thread):
        self.thread = thread
        self.name = thread.name
        self.phase: Optional[str] = None
        self.task: Any = None
        self.index = -1
        self.since = 0.0
        self.worker = -1

    def at(self, index: int, phase: str) -> None:
        self.index = index
        self.phase = phase
        self.since = time.monotonic()

    def idle(self) -> None:
        self.phase = None

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
END = _END = object()  # PythonStage.next(): the epoch is over (a batch may be None)


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
        worker_init_fn: DataLoader's, called once in each worker thread or process.
        unbatched: batch_size=None: a batch is one sample, as default_convert makes it
            (or as collate_fn makes it from that one sample).
    """

    def __init__(self, source: Any, *, map_fn: Optional[Callable] = None,
                 batch_map: Optional[Callable] = None, collate_fn: Optional[Callable] = None,
                 map_fields: Optional[Mapping] = None, seed: int = 0, skip: bool = False,
                 threads: int = 1, batch_map_on_consumer: bool = False,
                 workers: str = "thread", nchw_views: Sequence[str] = (),
                 inline: bool = False, worker_init_fn: Optional[Callable] = None,
                 unbatched: bool = False):
        self.source = source
        self.map_fn = map_fn
        self.batch_map = batch_map
        self.unbatched = bool(unbatched)
        if unbatched and collate_fn is None:
            collate_fn = torch.utils.data.default_convert  # DataLoader's, for batch_size=None
        self.collate_fn = collate_fn
        self.inline = bool(inline)
        self.worker_init_fn = worker_init_fn
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
        # batch_map on a CUDA device: its stream (NOTE [ batch_map on the device ]).
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
        self.batch_size = 1  # samples in a batch (build() sets it): chunk sizes
        self._init_error: Optional[BaseException] = None  # worker_init_fn's, raised in next()
        self._probed = False  # the global generators watched over one sample
        self._probe_done = threading.Event()  # ... and its answer known
        self._global_draws = False  # ... and it drew from them
        self._unpicklable: Optional[str] = None  # ... and could not be pickled: why
        # Image fields of a C++-assembled batch that the loop gets as NCHW views of their
        # HWC memory (channels_last strides): batch_map sees them as the loop would.
        self.nchw_views = tuple(nchw_views)
        self.workers: Any = None  # ProcessWorkers, with processes
        self._order: Optional[SendOrder] = None  # with processes: the requests' order
        # A process forked inside user code that returns from it ends there (NOTE
        # [ Worker faults ] in processes.py): the pid the stage runs in.
        self._pid = os.getpid()
        self._forks = _forks
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
        try:
            if self.worker_init_fn is not None or worker_info_wanted(self.source):
                set_thread_worker_info(slot, self._threads, self.seed,
                                       getattr(self.source, "obj", self.source))
            if self.worker_init_fn is not None:
                self.worker_init_fn(slot)
        except BaseException as e:
            add_note(e, f"stoker: raised by worker_init_fn in worker thread {slot}")
            self._init_error = e

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
            if self._order is not None:
                self._order.reset()
            self.pool.start()

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
        if self._delivered < 4 or self._delivered % 4:
            return
        if self.pool is None or self.pool.active < 2 or _loader_args.available_cores() < 2:
            self.auto = self._delivered < 64  # no second core: threads it is
            return
        s = core.stats()
        if gil_bound(s["python_seconds"], s["python_cpu_seconds"], s["python_wait_seconds"],
                     self.pool.active):
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

    # -- one chunk of a batch (a stage thread) ---------------------------------------

    def run_chunk(self, item: Tuple[Any, ...], slot: int = 0) -> None:
        task, lo, hi = item[:3]
        turn = item[3] if len(item) > 3 else None  # process workers: SendOrder's
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
        doing = self._doing_of(slot)
        doing.task = task
        try:
            if task.stopped or not self.per_sample:
                pass
            elif self.workers is not None:
                doing.worker = slot // PROCESS_THREADS_PER_WORKER
                doing.at(int(task.indices[lo]), "worker")
                remote = self._run_remote(task, pending, lo, hi, slot, turn)
                turn = None  # (said done when its request went out)
            else:
                indices = task.indices
                keys = rng_keys(self.seed, task.epoch, indices[lo:hi]) \
                    if self.map_fn is not None else None
                for pos in range(lo, hi):
                    if not self._one(task, pending, pos, int(indices[pos]),
                                     None if keys is None else keys[pos - lo]) or task.stopped:
                        break
        except BaseException as e:  # a bug of the stage: the batch fails with it
            pending.internal = e
        finally:
            doing.idle()
            if turn is not None and self._order is not None:  # a chunk never sent
                self._order.done(slot // PROCESS_THREADS_PER_WORKER, turn)
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
                doing.idle()  # (collate_fn, batch_map)

    def _run_remote(self, task: Any, pending: _Pending, lo: int, hi: int, slot: int,
                    turn: Any = None) -> Tuple[int, ...]:
        """Samples [lo, hi) mapped by this thread's worker process; checked here. The
        request goes out in the order the worker's threads claimed their chunks
        (SendOrder)."""
        indices = [int(i) for i in task.indices[lo:hi]]
        worker = slot // PROCESS_THREADS_PER_WORKER
        order = self._order
        try:
            rows, errors, skipped, times, lease = self.workers.run(
                worker, task.epoch, indices, copy=self.collate_fn is not None,
                turn=None if turn is None or order is None else
                (lambda: order.wait(worker, turn, lambda: task.stopped)),
                sent=None if turn is None or order is None else
                (lambda: order.done(worker, turn)))
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
             key: Optional[np.ndarray]) -> bool:
        """Sample `pos` of the batch into its row (or its error); False when the chunk
        stops there (a BaseException of user code: SystemExit, KeyboardInterrupt...)."""
        try:
            if not self._probe_done.is_set():
                if self._claim_probe():
                    # NOTE [ Global random generators ] in workers.py: the first sample run
                    # on a thread is watched, the other threads waiting for the answer
                    produced: List[Any] = []  # the sample as a worker process would send it
                    try:
                        drew, row = draws_globals(lambda: self._sample(index, task.epoch, key,
                                                                       produced))
                        if drew and self.auto and not self._leaves_processes(produced):
                            self.auto = False  # its samples cannot come back from a process
                    finally:
                        self._probe_done.set()
                    pending.rows[pos] = row
                    if drew:
                        self._global_draws = True
                        if self.auto and self.pool is not None:
                            self.pool.paused = True  # no more on threads: the consumer forks
                    return True
                self._probe_done.wait(60)
            pending.rows[pos] = self._sample(index, task.epoch, key)
            return True
        except Exception as e:
            if not self.skip:
                pending.errors[pos] = e
                return True
            first = e
        except BaseException as e:  # the user's, as raised: never skipped
            pending.errors[pos] = e
            return False
        row, ok = self._replacement(index, task.epoch, self._sample, lambda: task.stopped)
        if ok:
            pending.rows[pos] = row
            with self._lock:  # chunks of one batch count on several threads
                pending.skipped += 1
        elif not task.stopped:
            pending.errors[pos] = add_note(first, "stoker: on_error='skip' found no sample to "
                                           "replace it with: every sample fails")
        return True

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
            self._check_fork()
        if self.map_fn is not None:
            try:
                if doing is not None:
                    doing.at(index, "map")
                sample = self.map_fn(sample, rng_from_key(key))
            except BaseException as e:
                add_note(e, f"stoker: raised by map for {source.describe(index)}")
                raise
            finally:
                self._check_fork()
        return sample

    def _check_fork(self) -> None:
        """After user code: a process it forked (os.fork) that returned from it ends here,
        before it could write to a worker's socket or complete a batch of the loader's
        (NOTE [ Worker faults ] in processes.py); its result is ignored."""
        if _forks != self._forks and os.getpid() != self._pid:
            os._exit(0)

    def _doing_of(self, slot: int) -> _Doing:
        """The calling stage thread's record of what it is doing (made at its first chunk;
        a thread left behind by close() keeps its own)."""
        doing = getattr(self._here, "doing", None)
        if doing is None:
            me = threading.current_thread()
            doing = self._here.doing = _Doing(me)
            with self._lock:
                for t in [t for t in self._doing if not t.is_alive()]:
                    del self._doing[t]
                self._doing[me] = doing
        return doing

    def set_status(self, status: Any) -> None:
        """In a worker process: where _produce says what it is doing (shared memory the
        loader's process reads for its stall report)."""
        self._here.doing = status

    def _sample(self, index: int, epoch: int, key: Optional[np.ndarray],
                produced: Optional[List[Any]] = None) -> Any:
        """A batch row: _produce's value, checked against the layout (unless collate_fn
        takes the samples as they are); `produced` gets the value itself."""
        sample = self._produce(index, epoch, key)
        if produced is not None:
            produced.append(sample)
        if self.collate_fn is not None:
            return sample
        return self.layout.check(sample, lambda: self.source.describe(index))

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
        """In a worker process: _produce's value, checked there too (so that on_error=
        "skip" replaces a sample that does not fit), sent as it is. Python's, NumPy's and
        torch's global generators are seeded for the sample first (NOTE [ Global random
        generators ] in workers.py)."""
        seed_globals(self.seed, epoch, index)
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
        w._pid = os.getpid()
        w._forks = _forks
        w._here = threading.local()
        w._doing = {}
        if isinstance(self.source, DatasetSource):
            w.source = self.source.reopened()
        return w

    # -- the batch, by the thread that finished its last chunk -----------------------

    def _finish(self, task: Any, pending: _Pending) -> None:
        with self._lock:
            self._pending.pop(task.id, None)
        if task.stopped or exiting():  # (a thread left in user code at exit: no C++ call)
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
                self._hook_phase("collate_fn", task)
                # None too, as DataLoader yields it; unbatched: the one sample
                d.whole = self.collate_fn(pending.rows[0] if self.unbatched else pending.rows)
            except Exception as e:
                self._fail(task, add_note(e, f"stoker: raised by collate_fn for {what}"))
                return
            finally:
                self._check_fork()
        else:
            specs, nbytes = self.layout.plan(pending.rows)
            buffer = task.allocate(nbytes)
            d.objects = self.layout.write(pending.rows, specs, buffer)
            pending.release()  # the rows are in the batch now
            if self.batch_map is not None and not self.batch_map_on_consumer:
                d.whole = self._map_images(self.layout.assemble(tensors_of(buffer, specs),
                                                                d.objects))
                specs, nbytes = [], 0
        if self.batch_map is not None and not self.batch_map_on_consumer:
            try:
                self._hook_phase("batch_map", task)
                key = (self.seed, task.epoch, task.rank, task.world_size, task.batch)
                d.whole = _not_none(call_with_torch_seeded(
                    self.batch_map, d.whole, batch_rng(*key), batch_torch_seed(*key)), what)
            except Exception as e:
                self._fail(task, add_note(e, f"stoker: raised by batch_map for {what}"))
                return
            finally:
                self._check_fork()
        ticket = 0
        if d.objects or d.whole is not _UNSET or self.batch_map_on_consumer:
            ticket = self._put(d)
        task.complete([(s.name, _dtype_str(s.dtype), list(s.shape), s.offset, s.nbytes)
                       for s in specs], nbytes, ticket, pending.skipped)

    def _hook_phase(self, phase: str, task: Any) -> None:
        doing = getattr(self._here, "doing", None)
        if doing is not None:
            doing.task = task
            doing.at(-1, phase)

    def _fail(self, task: Any, exc: BaseException) -> None:
        d = _Delivery(task)
        d.error = exc
        ticket = self._put(d)
        task.fail(ticket, format_exception_summary(exc))

    def _put(self, d: _Delivery) -> int:
        d.since = time.monotonic()
        with self._lock:
            if self._next_ticket % 16 == 0 and not self._in_next:
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

    def _map_images(self, batch: Any) -> Any:
        """An image field map passes on as decoded, (h, w, 3) (a mask: (h, w, 1)), batches
        as the loader's own images do: an NCHW view of the HWC batch (docs/python.md)."""
        if isinstance(batch, dict):
            for name in self.nchw_views:
                t = batch.get(name)
                if isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[3] in (1, 3):
                    batch[name] = t.permute(0, 3, 1, 2)
        return batch

    def _viewed(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        for name in self.nchw_views:
            if name in batch:
                batch[name] = batch[name].permute(0, 3, 1, 2)
        return batch

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
        if ticket and d is None:  # a stage bug: say so, not a KeyError of the merge below
            raise RuntimeError(f"stoker: internal error: the Python stage lost the objects "
                               f"of a batch (ticket {ticket}); please report it")
        if self.per_sample:
            batch = self._map_images(self.layout.assemble(
                tensors, d.objects if d is not None else {}))
        else:  # a batch the C++ workers assembled, named by its fields
            batch = self._viewed(dict(tensors))
        if self.batch_map is not None and self.batch_map_on_consumer and d is not None:
            key = (self.seed, d.epoch, d.rank, d.world_size, d.batch)
            rng, torch_seed = batch_rng(*key), batch_torch_seed(*key)
            what = f"batch {d.batch} of epoch {d.epoch}"
            try:
                if self._side is None:  # the host fake's "device": host memory, copied
                    return _not_none(call_with_torch_seeded(self.batch_map, batch, rng,
                                                            torch_seed), what)
                return _not_none(self._on_side_stream(batch, rng, torch_seed), what)
            except Exception as e:
                add_note(e, f"stoker: raised by batch_map for {what}")
                raise
            finally:
                self._check_fork()
        return batch

    def _on_side_stream(self, batch: Any, rng: np.random.Generator, torch_seed: int) -> Any:
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
            out = call_with_torch_seeded(self.batch_map, batch, rng, torch_seed, side.device)
        done = torch.cuda.Event()
        done.record(side)
        consumer = torch.cuda.current_stream(side.device)
        consumer.wait_event(done)
        for t in _tensors(out):  # allocated on S by torch: used on U from now on
            if t.is_cuda and t.untyped_storage().data_ptr() not in inputs:
                t.record_stream(consumer)
        return out

    def next(self, it: Any, consumer_stream: Optional[int], entered: int,
             timeout: float = 0.0, core: Any = None) -> Any:
        """The consumer's next batch from core iterator `it` (END at the end of the epoch:
        any value, None included, is a batch): the user's exception object when the
        batch failed in the stage. The loop's time in next() outside the core's wait
        (since `entered`, perf_counter_ns) goes to the iterator's hand-off time, counted
        in data_stall as the plain path's. `timeout`: DataLoader's (0: none); `core`: the
        loader core, whose stats auto reads."""
        if self.pool is not None and not self.pool.running():
            if self._order is not None:
                self._order.reset()
            self.pool.start()
        if self._init_error is not None:  # a worker thread's worker_init_fn raised
            e, self._init_error = self._init_error, None
            raise e
        if self._global_draws:
            self._global_draws_seen()
        side = 0
        if consumer_stream is not None and self.batch_map_on_consumer and \
                self.batch_map is not None:
            if self._side is None:
                self._side = torch.cuda.Stream(self.side_device)
            side = self._side.cuda_stream
        with self._lock:  # until its delivery is taken, no purge drops it
            self._in_next += 1
        try:
            calling = time.perf_counter_ns()
            failed: Optional[BaseException] = None
            try:
                got = self._wait(it, consumer_stream or 0, side, timeout)
            except _core.PythonStageError as e:
                failed = self.error(e.ticket)
                if failed is None:
                    raise
            if failed is not None:
                raise failed  # outside the except block: the user's exception, as it was
            if got is None:
                return END
            t0 = time.perf_counter_ns()
            caps, ticket = got
            batch = self.deliver({name: _tensor_from_capsule(cap) for name, cap in caps},
                                 ticket)
            it.note_handoff(calling - entered + time.perf_counter_ns() - t0)
            if self.auto and core is not None:
                self._maybe_switch(core)
            return batch
        finally:
            with self._lock:
                self._in_next -= 1
            self._purge()

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
        if report_at is None and deadline is None and not self.inline and not self.auto:
            return it.next(stream, with_ticket=True, side_stream=side)
        start = time.monotonic()
        which = None  # the batch reported late
        while True:
            if self.inline:
                ms = 0
            else:
                elapsed = time.monotonic() - start
                limits = [t - elapsed for t in (report_at, deadline) if t is not None]
                if self.auto:
                    limits.append(0.05)
                ms = max(1, int(min(limits) * 1000)) if limits else -1
            got = it.next(stream, with_ticket=True, side_stream=side, timeout_ms=ms)
            waited = time.monotonic() - start
            if got is not False:
                if which is not None and got is not None:
                    _log.info("stoker: %s came after %.1f s", which, waited)
                return got
            if self._global_draws:  # auto: the threads paused, waiting for the processes
                self._global_draws_seen()
            if self.inline:
                item = self.handoff.take(20)
                if item is not None:
                    self.run_chunk(item)
                    continue
            if deadline is not None and waited > deadline:
                raise RuntimeError(f"DataLoader timed out after {timeout:g} seconds (stoker: "
                                   f"no batch came within timeout={timeout:g} seconds: a worker "
                                   "is stuck or too slow)")
            if report_at is not None and waited >= report_at:
                again = which is not None
                which, text = self.stall_report(waited, again)
                _log.log(logging.WARNING if again else logging.INFO, "%s", text)
                report_at = waited + _STALL_REPEAT_SECONDS

    def stall_report(self, waited: float, again: bool = False) -> Tuple[str, str]:
        """(which batch, the message): what the consumer's late batch waits for, the
        oldest batch in the stage, and what each stage thread (or worker process) is
        doing and since when."""
        now = time.monotonic()
        with self._lock:
            tasks = [p.task for p in self._pending.values()]
            doing = list(self._doing.values())
        oldest = min(tasks, key=lambda t: (t.epoch, t.batch), default=None)
        which = "the next batch" if oldest is None else \
            f"batch {oldest.batch} of epoch {oldest.epoch}"
        parts: List[str] = []
        seen_workers = set()
        for d in sorted(doing, key=lambda d: d.name):
            phase, task, index, since = d.phase, d.task, d.index, d.since
            if phase is None or not d.thread.is_alive() or (task is not None and task.stopped):
                continue  # idle, or left behind in a batch nobody reads
            if phase == "worker":
                if d.worker in seen_workers:
                    continue
                seen_workers.add(d.worker)
                parts.append(self._describe_worker(d.worker, task, index, since, now))
                continue
            where = f"batch {task.batch} of epoch {task.epoch}" if task is not None else \
                "a batch"
            what = f"in {phase} for {where}" if index < 0 else \
                f"{_activity(phase, self._describe(index))} ({where})"
            parts.append(f"thread {d.name} has been {what} for {now - since:.1f} s")
        if not parts:
            parts.append("no stage thread is busy (the batch is not handed off yet: the C++ "
                         "workers plan it)")
        return which, (f"stoker: {which} is {'still ' if again else ''}not ready after "
                       f"{waited:.1f} s: " + "; ".join(parts))

    def _describe(self, index: int) -> str:
        try:
            return self.source.describe(index)
        except Exception:
            return f"dataset index {index}"

    def _describe_worker(self, worker: int, task: Any, index: int, since: float,
                         now: float) -> str:
        doing = self.workers.doing(worker) if self.workers is not None else None
        if doing is None:
            return f"Python worker process {worker} is not running"
        pid, w_index, phase, w_since, stopped = doing
        who = f"Python worker process {worker} (pid {pid})"
        if stopped:
            who += " (the process is stopped: SIGSTOP, a debugger?)"
        if phase is None:  # between chunks: the reply on its way, or the request
            return (f"{who} has been given sample {index} and more for {now - since:.1f} s "
                    "and is not running them")
        where = "" if task is None else f" (batch {task.batch} of epoch {task.epoch})"
        return (f"{who} has been {_activity(phase, self._describe(w_index))}{where} for "
                f"{now - w_since:.1f} s")

    def _purge(self) -> None:
        """Drops the deliveries of batches their stream dropped (stop, close, break): they
        are never taken. Never while a consumer is in next(): a batch it was handed may
        belong to a stream that stopped since (the last of an epoch), its delivery not
        taken yet."""
        self._purge_count += 1
        if self._purge_count % 16 and len(self._deliveries) < 64:
            return
        with self._lock:
            if self._in_next:
                return
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


def gil_bound(python_s: float, cpu_s: float, wait_s: float, threads: int) -> bool:
    """Whether `threads` stage threads that spent `python_s` in the user's Python, `cpu_s` of
    it on a core and `wait_s` waiting for one, take turns on the GIL: blocked (neither on a
    core nor waiting for one) a third of the time or more, at about one core between them
    (csrc/pipeline/autotuner.cpp gil_bound: threads blocked on sleeps or I/O use much less;
    a machine with no free core shows up as waiting, where processes would not help)."""
    if threads < 2 or python_s < 0.05:
        return False
    blocked = python_s - cpu_s - wait_s
    cores = threads * cpu_s / python_s
    return blocked > 0.3 * python_s and 0.6 < cores < 1.5


class _Taker:
    """A pool thread's wait: a chunk from the hand-off, within a slice (the GIL is
    released while it waits). Holds the hand-off, never the stage."""

    __slots__ = ("handoff", "order")
    slice_ms = 100

    def __init__(self, handoff: Any, order: Optional[SendOrder] = None):
        self.handoff = handoff
        self.order = order  # process workers: each chunk numbered for its worker

    def __call__(self, slot: int) -> Any:
        if self.order is None:
            return self.handoff.take(self.slice_ms)
        return self.order.claim(slot // PROCESS_THREADS_PER_WORKER,
                                lambda: self.handoff.take(self.slice_ms))

    def wake(self) -> None:
        """Ends the waits now (the process is exiting)."""
        self.handoff.close()


def _not_none(batch: Any, what: str) -> Any:
    """batch_map's value: None is an error, never a batch (nor the end of the epoch)."""
    if batch is None:
        raise TypeError(f"batch_map returned None for {what}: did it modify the batch in "
                        "place without returning it? End it with `return batch`")
    return batch


def _activity(phase: str, sample: str) -> str:
    """What a stall report says a thread or worker does with `sample`."""
    if phase == "dataset":
        return f"loading {sample} (the dataset's read or __getitem__)"
    return f"in {phase} for {sample}"


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
