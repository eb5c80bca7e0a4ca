"""What an IterableDataset's stream measures: its part of ``Loader.stats()`` and its
``stall_warning`` (NOTE [ Iterable datasets ] in iterable.py), in the core's names and
meanings (csrc/pipeline/loader_telemetry.h)."""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, Iterable, Optional, Tuple

__all__ = ["StreamTelemetry"]

_STALL_STRETCH_NS = 1_000_000_000  # the stall is judged over stretches of at least this
_STALL_BATCHES = 8  # ... and of at least this many batches


class StreamTelemetry:
    """Counters of one stream, over the loader's life."""

    def __init__(self, stall_warning: float):
        self.stall_warning = stall_warning
        self.batches = self.samples = self.skipped = 0
        self.wait_ns = self.run_ns = self.python_ns = 0  # python: map's, in the workers
        self.first_batch_ns: Optional[int] = None
        self._since: Optional[Tuple[int, int, int]] = None  # (ns, wait_ns, batches)
        self._warned = False

    def next_done(self, it: Any, entered: int) -> None:
        """A next() of iterator `it` that began at `entered` returned (or raised): its
        time is the loop's wait (the rows are merged and batched in it)."""
        now = time.perf_counter_ns()
        self.wait_ns += now - entered
        if it.claimed and self.first_batch_ns is None and it.batch:
            self.first_batch_ns = now - it.started_ns
        self._watch_stall(now, it.batch)

    def stats(self, iters: Iterable[Any], *, threads: int, prefetch: int,
              auto_prefetch: bool, batch_size: int) -> Dict[str, Any]:
        """The counters, with the open iterators `iters` (their run time so far, queues
        and workers)."""
        iters = list(iters)
        now = time.perf_counter_ns()
        run = (self.run_ns + sum(now - it.started_ns for it in iters
                                 if it.claimed and not it.finished)) / 1e9
        wait = self.wait_ns / 1e9
        workers = [w for it in iters for w in it.workers if w is not None]
        return {"batches": self.batches, "samples": self.samples, "skipped": self.skipped,
                "source_counts": [], "num_threads": threads, "max_threads": threads,
                "auto_threads": False, "prefetch": prefetch, "auto_prefetch": auto_prefetch,
                "tier": "python", "data_stall": min(1.0, wait / run) if run > 0 else 0.0,
                "wait_seconds": wait, "run_seconds": run,
                "samples_per_second": self.samples / run if run > 0 else 0.0,
                "first_batch_seconds": (self.first_batch_ns or 0) / 1e9,
                "python_seconds": self.python_ns / 1e9,
                "queue_depth": sum(w.q.qsize() for w in workers) // batch_size,
                "live_workers": sum(w.is_alive() for w in workers)}

    def _watch_stall(self, now: int, batch: int) -> None:
        """stall_warning: the "stoker" logger warns once when, after warm-up (an epoch's
        first batch), the loop waited for rows more than that fraction of a stretch."""
        if self.stall_warning <= 0 or self._warned:
            return
        if self._since is None or batch <= 1:
            self._since = (now, self.wait_ns, self.batches)
            return
        t0, w0, b0 = self._since
        if now - t0 < _STALL_STRETCH_NS or self.batches - b0 < _STALL_BATCHES:
            return
        stall = (self.wait_ns - w0) / (now - t0)
        self._since = (now, self.wait_ns, self.batches)
        if stall > self.stall_warning:
            self._warned = True
            logging.getLogger("stoker").warning(
                "stoker: the training loop waited for data %.0f%% of the last %.1f s "
                "(stall_warning=%.2g): the IterableDataset's stream (its iteration, map, "
                "collate_fn) is the bottleneck; more num_workers read it in parallel",
                100 * stall, (now - t0) / 1e9, self.stall_warning)
