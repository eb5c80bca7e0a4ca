"""The Python stage of an IterableDataset (NOTE [ Iterable datasets ] in iterable.py): a
batch handed off by the core is step k of its stream's reading, batched as the stage
batches any rows (assemble.py), or the epoch's end."""

from __future__ import annotations

import time
from typing import Any, Tuple

from .chunks import _copied, _object_positions
from .errors import without_locals
from .iterable import IterableRows
from .pending import Pending as _Pending
from .stage import PythonStage
from .telemetry import thread_sched

__all__ = ["IterableStage"]


class IterableStage(PythonStage):
    """PythonStage whose rows come from `rows`' readings, mapped by their workers: a batch
    is one chunk (the handoff's chunk is the batch), and the stage threads only merge,
    batch and complete (or end) it."""

    def __init__(self, rows: IterableRows, **kwargs: Any):
        super().__init__(rows, **kwargs)
        self.rows = rows
        self.per_sample = True  # every batch is made of rows here
        # NOTE [ Iterable datasets ]: a stream iter() starts ahead is not read before an
        # iterator asks for a batch of its epoch (its workers start at the first next())
        self._draws.hold_ahead = True
        self._draws.open_epoch = -1
        # rows from worker processes may be views of their arenas: batched natively (one
        # copy), a collate_fn is given copies (NOTE [ Iterable datasets in processes ])
        rows.views = self.collate_fn is None

    def run_chunk(self, item: Tuple[Any, ...], slot: int = 0) -> None:
        task = item[0]
        wall0 = time.perf_counter_ns()
        cpu0, wait0 = thread_sched()
        rows = self.rows
        py0, pcpu0, pwait0 = rows.python_ns, rows.python_cpu_ns, rows.python_wait_ns
        pending = _Pending(task)
        reading = None
        got: Any = None
        hold = None
        try:
            if not task.stopped:
                self._draws.wait_for_epoch(task)
                reading = self.rows.reading(task)
                # batch number from the start of the stream's reading (its segment)
                per_step = max(1, self.rows.batch_size * (task.world_size or 1))
                got, hold = reading.step(task.batch - task.offset // per_step)
        except BaseException as e:  # a bug of the stage: the batch fails with it
            pending.internal = without_locals(e)
        if hold is not None:  # released once the batch is made (or dropped)
            pending.leases.append(hold)
        if task.stopped:
            pending.release()
            task.chunk_done()
            return
        if got is None and pending.internal is None:
            pending.release()
            task.chunk_done()
            task.end()  # no row left for this batch: the epoch ends before it
            return
        if isinstance(got, BaseException):
            pending.errors[0] = got
        elif got is not None:
            if len(got) < task.samples:
                task.set_samples(len(got))
            if self.collate_fn is not None:
                pending.rows = list(got)
            else:
                pending.rows = [None] * len(got)
                objects = _object_positions(self.layout) if hold is not None else []
                for j, row in enumerate(got):
                    try:
                        checked = self.layout.check(
                            row, lambda j=j: self.rows.describe(int(task.indices[j])))
                        if objects is None:  # the layout was fixed by this row
                            objects = _object_positions(self.layout)
                        for i in objects or ():  # kept as they are in the batch: not views
                            checked[i] = _copied(checked[i])
                        pending.rows[j] = checked
                    except Exception as e:
                        pending.errors[j] = e
        if reading is not None:
            pending.skipped = reading.take_skipped()
        wall = time.perf_counter_ns() - wall0
        cpu1, wait1 = thread_sched()
        cpu, wait = cpu1 - cpu0, wait1 - wait0
        if rows.workers == 0:  # map ran here: this thread's time is the Python stage's
            task.add_times(wall, cpu, 0, 0, 0, 0, wait)
        else:  # the workers' time in the dataset and map, and this thread's CPU merging and
            # checking (not its wall time, most of it waiting for the workers' rows)
            mapped = max(0, rows.python_ns - py0)
            task.add_times(mapped + cpu, max(0, rows.python_cpu_ns - pcpu0) + cpu, 0, 0, 0,
                           0, max(0, rows.python_wait_ns - pwait0) + wait)
        if task.chunk_done():
            self._assembly.finish(task, pending)

    def stop(self) -> None:
        super().stop()
        self.rows.close()

    def dropped(self) -> None:
        super().dropped()
        self.rows.close()
