"""The Python stage's batches (NOTE [ Python stage ] in stoker/_stage/__init__.py): the
stage thread that finished a batch's last chunk assembles it (native batching, collate_fn,
batch_map), completes it in its ring slot or fails it, and keeps what the consumer takes
with it (a delivery, by ticket)."""

from __future__ import annotations

import time
from typing import Any, List

import numpy as np

from .collate import tensors_of
from .errors import add_note, format_exception_summary
from .pool import exiting
from .rng import batch_rng, batch_torch_seed, call_with_torch_seeded
from .state import _UNSET, _Delivery, _not_none, _Pending, _tensor_from_capsule
from .telemetry import thread_sched

__all__ = ["BatchAssembly"]


class BatchAssembly:
    """PythonStage's assembly of a batch, by the thread that finished its last chunk. A
    part of PythonStage: the attributes are those its __init__ sets."""

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


def _dtype_str(dtype: Any) -> str:
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name
