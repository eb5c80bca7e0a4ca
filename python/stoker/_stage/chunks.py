"""The Python stage's chunks (NOTE [ Python stage ] in stoker/_stage/__init__.py): a stage
thread fetches and maps the samples of one chunk of a batch into the batch's rows, or has
its worker process map them (NOTE [ Python stage processes ] in processes.py); the thread
that finishes a batch's last chunk hands it to the assembly (assemble.py)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .activity import Activity
from .direct import DirectRows
from .errors import add_note, without_locals
from .pending import Pending, PendingBatches
from .placement import Placement
from .probe import GlobalDraws
from .processes import WorkerDied
from .rng import rng_keys
from .samples import Samples
from .state import PROBE_WAIT_SECONDS, PROCESS_THREADS_PER_WORKER
from .telemetry import native_times, thread_sched
from .workers import seeded_call

__all__ = ["ChunkRunner"]


class ChunkRunner:
    """A stage thread's work on one chunk of a batch (run()). Its parts: `samples` (one
    sample), `pending` (the batches being mapped), `activity` (what each thread does),
    `draws` (the watched first sample), `placement` (threads or worker processes);
    `finish(task, pending)` assembles a batch whose last chunk is done, `epoch_started(slot,
    epoch)` is told each chunk's epoch on threads; `per_sample`: batches of sample
    indices (else the C++ workers assembled the batch: nothing to run). ``pool``: the
    stage's threads, once they exist (the watched sample pauses them)."""

    def __init__(self, samples: Samples, pending: PendingBatches, activity: Activity,
                 draws: GlobalDraws, placement: Placement,
                 finish: Callable[[Any, Pending], None],
                 epoch_started: Callable[[int, int], None], *, per_sample: bool,
                 inline: bool, direct: Optional[DirectRows] = None):
        self._samples = samples
        self._row = samples.row  # (bound once: per sample)
        self._pending = pending
        self._activity = activity
        self._draws = draws
        self._probe_done = draws.done
        self._placement = placement
        self._finish = finish
        self._epoch_started = epoch_started
        self._per_sample = per_sample
        self._inline = inline
        self._direct = direct  # NOTE [ Direct rows ] in direct.py
        self._lock = threading.Lock()  # skips counted by the chunks of one batch
        # the watched sample drew, and auto goes to processes: until then the threads run
        # each sample seeded, as a worker process does (NOTE [ Global random generators ])
        self._seed_on_threads = False
        self.pool: Any = None

    def run(self, item: Tuple[Any, ...], slot: int = 0) -> None:
        """Runs chunk `item` (task, lo, hi[, turn]) of stage thread `slot`."""
        task, lo, hi = item[:3]
        turn = item[3] if len(item) > 3 else None  # process workers: SendOrder's
        pending = self._pending.of(task)
        wall0 = time.perf_counter_ns()
        cpu0, wait0 = thread_sched()
        times = native_times.reset()
        remote: Optional[Tuple[int, ...]] = None
        doing = self._activity.mine()
        doing.task = task
        placement = self._placement
        try:
            if task.stopped or not self._per_sample:
                pass
            elif placement.workers is not None:
                doing.worker = slot // PROCESS_THREADS_PER_WORKER
                doing.at(int(task.indices[lo]), "worker")
                remote = self._run_remote(task, pending, lo, hi, slot, turn)
                turn = None  # (said done when its request went out)
            else:
                draws = self._draws
                if draws.hold_ahead and task.epoch > draws.open_epoch:
                    draws.wait_for_epoch(task)  # NOTE [ Global random generators ]
                self._epoch_started(slot, task.epoch)
                indices = task.indices
                keys = rng_keys(self._samples.seed, task.epoch, indices[lo:hi]) \
                    if self._samples.map_fn is not None else None
                for pos in range(lo, hi):
                    if not self._one(task, pending, pos, int(indices[pos]),
                                     None if keys is None else keys[pos - lo]) or task.stopped:
                        break
        except BaseException as e:  # a bug of the stage: the batch fails with it
            pending.internal = without_locals(e)
        finally:
            doing.idle()
            order = placement.order
            if turn is not None and order is not None:  # a chunk never sent
                order.done(slot // PROCESS_THREADS_PER_WORKER, turn)
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

    def _run_remote(self, task: Any, pending: Pending, lo: int, hi: int, slot: int,
                    turn: Any = None) -> Tuple[int, ...]:
        """Samples [lo, hi) mapped by this thread's worker process; checked here. The
        request goes out in the order the worker's threads claimed their chunks
        (SendOrder)."""
        samples = self._samples
        indices = [int(i) for i in task.indices[lo:hi]]
        worker = slot // PROCESS_THREADS_PER_WORKER
        order = self._placement.order
        workers = self._placement.workers
        assert workers is not None
        listed = getattr(samples.source, "keys", None)  # a sampler's items, not indices
        # the rows straight into the batch's memory, planned when the worker asks for it
        # (as it begins the chunk): held until the reply
        d = self._direct
        plan = (lambda: d.batch(task, pending)) if d is not None and d.ready() else None
        try:
            rows, errors, skipped, times, lease = workers.run(
                worker, task.epoch, indices, copy=samples.collate_fn is not None,
                turn=None if turn is None or order is None else
                (lambda: order.wait(worker, turn, lambda: task.stopped)),
                sent=None if turn is None or order is None else
                (lambda: order.done(worker, turn)), stopped=lambda: task.stopped,
                keys=None if listed is None else [listed[task.epoch][i] for i in indices],
                plan=plan, lo=lo)
        except WorkerDied as e:
            pending.errors[lo] = without_locals(e)
            return (0, 0, 0, 0, 0, 0, 0, 0)
        if d is not None:
            lease.trim = d.ready
        pending.leases.append(lease)  # released with the batch (or with pending, dropped)
        layout = samples.layout
        objects = _object_positions(layout)
        for j, row in enumerate(rows):
            pos = lo + j
            if j in errors:
                pending.errors[pos] = errors[j]
            elif samples.collate_fn is not None:
                pending.rows[pos] = row
            else:
                try:
                    checked = layout.check(row, lambda j=j: samples.source.describe(indices[j]))
                    if objects is None:
                        objects = _object_positions(layout)
                    for i in objects:  # kept as they are in the batch: not arena views
                        checked[i] = _copied(checked[i])
                    pending.rows[pos] = checked
                except Exception as e:
                    pending.errors[pos] = e
        with self._lock:
            pending.skipped += skipped
        return times

    def _one(self, task: Any, pending: Pending, pos: int, index: int,
             key: Optional[np.ndarray]) -> bool:
        """Sample `pos` of the batch into its row (or its error); False when the chunk
        stops there (a BaseException of user code: SystemExit, KeyboardInterrupt...)."""
        try:
            if not self._probe_done.is_set():
                if self._watch(task, pending, pos, index, key):
                    return True
            if self._seed_on_threads:
                pending.rows[pos] = seeded_call(self._samples.seed, task.epoch, index,
                                                lambda: self._row(index, task.epoch, key))[1]
            else:
                pending.rows[pos] = self._row(index, task.epoch, key)
            return True
        except Exception as e:
            if not self._samples.skip:
                pending.errors[pos] = e
                return True
            first = e
        except BaseException as e:  # the user's, as raised: never skipped
            pending.errors[pos] = e
            return False
        row, ok = self._samples.replacement(index, task.epoch, self._row,
                                            lambda: task.stopped)
        if ok:
            pending.rows[pos] = row
            with self._lock:  # chunks of one batch count on several threads
                pending.skipped += 1
        elif not task.stopped:
            pending.errors[pos] = add_note(first, "stoker: on_error='skip' found no sample to "
                                           "replace it with: every sample fails")
        return True

    def _watch(self, task: Any, pending: Pending, pos: int, index: int,
               key: Optional[np.ndarray]) -> bool:
        """Before the first sample's answer is known: True if this thread ran the watched
        sample into its row (NOTE [ Global random generators ] in workers.py: the first
        sample run on a thread is watched, the other threads waiting for the answer; run
        as a worker process runs it: its draws are a worker's); else False, once the
        answer is known or the wait overran (a slow first sample, or one that waits for
        others: a barrier across workers, does not hold the rest back for good)."""
        draws, placement = self._draws, self._placement
        if not draws.claim(not placement.processes and not self._inline):
            if not self._probe_done.wait(PROBE_WAIT_SECONDS):
                draws.overran = PROBE_WAIT_SECONDS  # (said if it drew)
            return False
        produced: List[Any] = []  # the sample as a worker process would send it
        try:
            drew, row = seeded_call(self._samples.seed, task.epoch, index,
                                    lambda: self._row(index, task.epoch, key, produced))
            if drew and placement.auto and not draws.leaves_processes(produced):
                placement.auto = False  # its samples cannot come back from a process
            if drew:
                # auto: the threads run what they hold seeded, as the processes will;
                # else they stay on threads, within the loop's epochs
                self._seed_on_threads = placement.auto
                draws.hold_ahead = not placement.auto
                draws.open_epoch = task.epoch
        finally:
            self._probe_done.set()
        pending.rows[pos] = row
        if drew:
            draws.drew = True
            if placement.auto and self.pool is not None:
                self.pool.paused = True  # no more on threads: the consumer forks
        return True


def _object_positions(layout: Any) -> Optional[List[int]]:
    """Positions of the layout's object fields in a checked row (None until the layout
    is fixed)."""
    fields = layout.fields
    if fields is None:
        return None
    return [i for i, f in enumerate(fields.values()) if f.kind == "object"]


def _copied(value: Any) -> Any:
    """An object field's value that may be a view of a process worker's arena, as a
    value of its own (the batch's lists outlive the arena's lease)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if type(value).__module__.startswith("torch") and hasattr(value, "clone"):
        return value.clone()
    return value
