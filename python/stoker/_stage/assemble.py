"""The Python stage's batches (NOTE [ Python stage ] in stoker/_stage/__init__.py): the
stage thread that finished a batch's last chunk assembles it (native batching, collate_fn,
batch_map), completes it in its ring slot or fails it, and keeps what the consumer takes
with it (a delivery, by ticket)."""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from .activity import Activity
from .collate import tensors_of
from .deliveries import UNSET, Deliveries, Delivery, not_none
from .errors import add_note, format_exception_summary, without_locals
from .pending import Pending, PendingBatches
from .pool import exiting
from .rng import batch_rng, batch_torch_seed, call_with_torch_seeded
from .samples import Samples
from .telemetry import thread_sched
from .views import as_nchw, mapped_as_nchw, tensor_from_capsule

__all__ = ["BatchAssembly"]


class BatchAssembly:
    """A batch's assembly, by the thread that finished its last chunk (finish()): from
    the rows `samples` made (its layout and collate_fn), the batch leaves `pending`, is
    batch_mapped (unless `batch_map_on_consumer`: after the device copy), and what it
    carries besides its tensors goes to `deliveries`. `per_sample`: batches of rows (else
    the C++ workers assembled the batch); `unbatched`: batch_size=None, the batch is
    collate_fn's of its one sample; `nchw_views`: image fields the loop gets NCHW."""

    def __init__(self, samples: Samples, pending: PendingBatches, deliveries: Deliveries,
                 activity: Activity, *, batch_map: Optional[Callable],
                 batch_map_on_consumer: bool, unbatched: bool, per_sample: bool,
                 nchw_views: Sequence[str], direct: Any = None):
        self._samples = samples
        self._pending = pending
        self._deliveries = deliveries
        self._activity = activity
        self.batch_map = batch_map
        self.batch_map_on_consumer = batch_map_on_consumer
        self.unbatched = unbatched
        self.per_sample = per_sample
        self.nchw_views = tuple(nchw_views)
        self.direct = direct  # the stage's DirectRows (NOTE [ Direct rows ] in direct.py)

    def finish(self, task: Any, pending: Pending) -> None:
        """Batch `task`, all its chunks done: assembled and completed, or failed."""
        self._pending.pop(task)
        if task.stopped or exiting():  # (a thread left in user code at exit: no C++ call)
            pending.release()
            return
        wall0 = time.perf_counter_ns()
        cpu0, wait0 = thread_sched()
        try:
            self._assemble(task, pending)
        except BaseException as e:  # a bug of the stage: the batch fails with it
            self.fail(task, e)
        finally:
            pending.release()
            wall = time.perf_counter_ns() - wall0
            cpu1, wait1 = thread_sched()
            task.add_times(wall, cpu1 - cpu0, 0, 0, 0, 0, wait1 - wait0)

    def _assemble(self, task: Any, pending: Pending) -> None:
        if pending.internal is not None:
            raise pending.internal
        if pending.errors:  # the lowest position's error, whatever the timing
            self.fail(task, pending.errors[min(pending.errors)])
            return
        samples = self._samples
        d = Delivery(task)
        what = f"batch {task.batch} of epoch {task.epoch}"
        specs: List[Any] = []
        nbytes = 0
        batch_map = None if self.batch_map_on_consumer else self.batch_map
        if not self.per_sample:  # a batch the C++ workers assembled: batch_map only
            if self.batch_map_on_consumer:  # after the device copy: the ticket says which
                task.keep(self._deliveries.put(d))
                return
            d.whole = as_nchw({name: tensor_from_capsule(cap) for name, cap in task.tensors},
                              self.nchw_views)
        elif samples.collate_fn is not None:
            try:
                self._phase("collate_fn", task)
                # None too, as DataLoader yields it; unbatched: the one sample
                d.whole = samples.collate_fn(pending.rows[0] if self.unbatched
                                             else pending.rows)
            except Exception as e:
                self.fail(task, add_note(e, f"stoker: raised by collate_fn for {what}"))
                return
            finally:
                samples.check_fork()
        else:
            layout = samples.layout
            specs, nbytes = layout.plan(pending.rows)
            direct, in_place = pending.direct, None
            if direct and direct.fits(specs, nbytes):  # NOTE [ Direct rows ] in direct.py
                buffer, in_place = direct.buffer, direct.in_place(len(pending.rows))
                self.direct.batches += 1
            else:
                if direct and self.direct is not None:
                    self.direct.missed()
                buffer = task.allocate(nbytes)
            d.objects = layout.write(pending.rows, specs, buffer, in_place)
            pending.release()  # the rows are in the batch now
            if batch_map is not None:
                d.whole = mapped_as_nchw(layout.assemble(tensors_of(buffer, specs), d.objects),
                                         self.nchw_views)
                specs, nbytes = [], 0
        if batch_map is not None:
            try:
                self._phase("batch_map", task)
                key = (samples.seed, task.epoch, task.rank, task.world_size, task.batch)
                d.whole = not_none(call_with_torch_seeded(
                    batch_map, d.whole, batch_rng(*key), batch_torch_seed(*key)), what)
            except Exception as e:
                self.fail(task, add_note(e, f"stoker: raised by batch_map for {what}"))
                return
            finally:
                samples.check_fork()
        ticket = 0
        if d.objects or d.whole is not UNSET or self.batch_map_on_consumer:
            ticket = self._deliveries.put(d)
        task.complete([(s.name, _dtype_str(s.dtype), list(s.shape), s.offset, s.nbytes)
                       for s in specs], nbytes, ticket, pending.skipped)

    def _phase(self, phase: str, task: Any) -> None:
        doing = self._activity.current()
        if doing is not None:
            doing.task = task
            doing.at(-1, phase)

    def fail(self, task: Any, exc: BaseException) -> None:
        """Batch `task` fails with `exc`, raised in the loop when it comes."""
        d = Delivery(task)
        d.error = without_locals(exc)
        ticket = self._deliveries.put(d)
        task.fail(ticket, format_exception_summary(exc))


def _dtype_str(dtype: Any) -> str:
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name
