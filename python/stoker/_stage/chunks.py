"""The Python stage's chunks (NOTE [ Python stage ] in stoker/_stage/__init__.py): a stage
thread fetches and maps the samples of one chunk of a batch into the batch's rows, or has
its worker process map them (NOTE [ Python stage processes ] in processes.py); and what a
worker process runs of the stage."""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

import numpy as np

from .errors import add_note, names_itself
from .processes import WorkerDied
from .rng import rng_from_key, rng_keys
from .sources import DatasetSource
from .state import PROBE_WAIT_SECONDS, PROCESS_THREADS_PER_WORKER, _Doing, _Pending, forks
from .telemetry import native_times, thread_sched
from .workers import seed_globals, seeded_call, set_process_worker_info

if TYPE_CHECKING:
    from .stage import PythonStage

__all__ = ["ChunkRunner"]


class ChunkRunner:
    """PythonStage's work on one chunk of a batch, in a stage thread (run_chunk), and in
    a worker process (worker_started, worker_sample, worker_copy). A part of PythonStage:
    the attributes are those its __init__ sets."""

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
                if self._hold_ahead and task.epoch > self._open_epoch:
                    self._wait_for_epoch(task)  # NOTE [ Global random generators ]
                self.epoch_started(slot, task.epoch)
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

    def _wait_for_epoch(self, task: Any) -> None:
        """Thread workers whose samples draw from the global generators run none of an epoch
        the loop has not started (the next epoch's prefetch): the user's process is left
        alone between epochs (NOTE [ Global random generators ] in workers.py)."""
        with self._epoch_opened:
            while task.epoch > self._open_epoch and not task.stopped:
                self._epoch_opened.wait(0.1)

    def open_epoch(self, epoch: int) -> None:
        """The loop asks for a batch of `epoch` (consumer.next): thread workers held back
        by _wait_for_epoch may run it."""
        with self._epoch_opened:
            if epoch > self._open_epoch:
                self._open_epoch = epoch
                self._epoch_opened.notify_all()

    def _run_remote(self, task: Any, pending: _Pending, lo: int, hi: int, slot: int,
                    turn: Any = None) -> Tuple[int, ...]:
        """Samples [lo, hi) mapped by this thread's worker process; checked here. The
        request goes out in the order the worker's threads claimed their chunks
        (SendOrder)."""
        indices = [int(i) for i in task.indices[lo:hi]]
        worker = slot // PROCESS_THREADS_PER_WORKER
        order = self._order
        listed = getattr(self.source, "keys", None)  # a sampler's items, not indices
        try:
            rows, errors, skipped, times, lease = self.workers.run(
                worker, task.epoch, indices, copy=self.collate_fn is not None,
                turn=None if turn is None or order is None else
                (lambda: order.wait(worker, turn, lambda: task.stopped)),
                sent=None if turn is None or order is None else
                (lambda: order.done(worker, turn)), stopped=lambda: task.stopped,
                keys=None if listed is None else [listed[task.epoch][i] for i in indices])
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
                    # (run as a worker process runs it: its draws are a worker's)
                    produced: List[Any] = []  # the sample as a worker process would send it
                    try:
                        drew, row = seeded_call(self.seed, task.epoch, index,
                                                lambda: self._sample(index, task.epoch, key,
                                                                     produced))
                        if drew and self.auto and not self._leaves_processes(produced):
                            self.auto = False  # its samples cannot come back from a process
                        if drew:
                            # auto: the threads run what they hold seeded, as the processes
                            # will; else they stay on threads, within the loop's epochs
                            self._seed_on_threads = self.auto
                            self._hold_ahead = not self.auto
                            self._open_epoch = task.epoch
                    finally:
                        self._probe_done.set()
                    pending.rows[pos] = row
                    if drew:
                        self._global_draws = True
                        if self.auto and self.pool is not None:
                            self.pool.paused = True  # no more on threads: the consumer forks
                    return True
                if not self._probe_done.wait(PROBE_WAIT_SECONDS):
                    # a slow first sample (or one that waits for others: a barrier across
                    # workers) does not hold the rest back for good; said if it drew
                    self._probe_overran = PROBE_WAIT_SECONDS
            if self._seed_on_threads:
                pending.rows[pos] = seeded_call(self.seed, task.epoch, index,
                                                lambda: self._sample(index, task.epoch, key))[1]
            else:
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
        if forks() != self._forks and os.getpid() != self._pid:
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
        """In a worker process: _produce's value, sent as it is; the loader's process
        checks it against the layout (once: NOTE [ Python stage processes ]), except with
        on_error="skip", where it is checked here too, so that a sample that does not fit
        is replaced in the worker. Python's, NumPy's and torch's global generators are
        seeded for the sample first (NOTE [ Global random generators ] in workers.py)."""
        seed_globals(self.seed, epoch, index)
        sample = self._produce(index, epoch, key)
        if self.collate_fn is None and self.skip:
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
        w._epoch_opened = threading.Condition(threading.Lock())
        w.layout = copy.copy(self.layout)
        w.layout._lock = threading.Lock()
        w.pool = None
        w.workers = None
        w._pid = os.getpid()
        w._forks = forks()
        w._here = threading.local()
        w._doing = {}
        if isinstance(self.source, DatasetSource):
            w.source = self.source.reopened()
        return w


def _copied(value: Any) -> Any:
    """An object field's value that may be a view of a process worker's arena, as a
    value of its own (the batch's lists outlive the arena's lease)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if type(value).__module__.startswith("torch") and hasattr(value, "clone"):
        return value.clone()
    return value
