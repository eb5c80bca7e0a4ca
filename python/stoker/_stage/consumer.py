"""The Python stage's consumer side (NOTE [ Python stage ] in stoker/_stage/__init__.py):
next() waits for the core's next batch (and runs the chunks itself with num_workers=0),
says what a late batch waits for, and gives the loop the batch with what its delivery
carries (object fields, a whole batch, an error), batch_map run on the side stream when
it runs on the device."""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from .. import _core, _loader_args
from .errors import add_note
from .rng import batch_rng, batch_torch_seed, call_with_torch_seeded
from .state import _UNSET, END, _Delivery, _not_none, _Pending, _tensor_from_capsule
from .stuck import past_timeout

__all__ = ["Consumer"]


# A stall is reported again this often (as the C++ core reports a slow first batch).
_STALL_REPEAT_SECONDS = 10.0
_log = logging.getLogger("stoker")


class Consumer:
    """PythonStage's consumer side: next(), the stall report, deliveries. A part of
    PythonStage: the attributes are those its __init__ sets."""

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
        if self._hold_ahead:  # threads that draw from the globals: this epoch may run
            self.open_epoch(it.epoch)
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
                stuck = past_timeout(self, timeout)  # NOTE [ Stuck workers ] in stuck.py
                raise RuntimeError(f"DataLoader timed out after {timeout:g} seconds (stoker: "
                                   f"no batch came within timeout={timeout:g} seconds: " +
                                   ("; ".join(stuck) if stuck else
                                    "a worker is stuck or too slow") + ")")
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

    def activity(self, phase: str, index: int) -> str:
        """What a thread or worker in `phase` on dataset index `index` does, in words."""
        return f"in {phase}" if index < 0 else _activity(phase, self._describe(index))

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

    def error(self, ticket: int) -> Optional[BaseException]:
        """The exception a failed batch carries (None if it is not known here)."""
        d = self.take_delivery(ticket)
        return None if d is None else d.error


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
