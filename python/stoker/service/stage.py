"""A loader's stage when a service makes its batches (``service=``): the loader's core
runs over placeholders (NOTE [ Placeholder batches ] in csrc/pipeline/
placeholder_producer.h), and each next() fetches the batch the core names from the
service, then takes the placeholder, which counts it (NOTE [ Disaggregated loading ] in
stoker/service/__init__.py). Here that next(), the service's share of ``stats()``, and
``service_parts``, which _build calls to make the core and this stage."""

from __future__ import annotations

import time
from typing import Any, Dict, Optional, Tuple

import torch

from .. import _core
from .._stage.state import END
from .pipeline import pipeline_spec
from .wire import decode

__all__ = ["ServiceStage", "service_parts", "END"]

# Batches in flight per actor when prefetch is automatic: two parts, so that an actor
# starts its next part as it finishes one.
_PARTS_AHEAD = 2


def service_parts(plan: Any, producer: Any, mix: Any = None) -> Tuple[Any, "ServiceStage"]:
    """The loader core over placeholders of `producer` (the loader's own, which counts
    its epochs), and the stage that fetches the batches from ``plan.service``; `mix`: the
    loader's MixRun (a schedule's rows per step go with each part)."""
    t = plan.settings
    options = _core.LoaderOptions()
    options.num_threads = 1  # placeholders take no work
    options.prefetch = 2
    options.auto_threads = options.auto_prefetch = False
    options.max_memory = t.max_memory
    options.stall_warning = 0.0  # the core's waits are not the loop's (stats()["data_stall"])
    options.prefetch_next_epoch = plan.prefetch_next_epoch
    core = _core.LoaderCore(_core.PlaceholderProducer(producer), options)
    service = plan.service
    spec = pipeline_spec(plan, service.threads_per_producer)
    window = None if t.auto_prefetch else t.prefetch
    return core, ServiceStage(service, spec, window, t.max_memory, mix)


class ServiceStage:
    """The stage of a loader with ``service=``: what Loader and LoaderIter call on a
    stage (start, stop, next, follow), with the batches from the service."""

    needs_handoff = False
    source = None  # no dataset source of its own (the replicas have theirs)

    def __init__(self, service: Any, spec: Any, window: Optional[int], max_memory: int,
                 mix: Any = None):
        self.service = service
        self.mix = mix
        self.spec = spec
        self._window = window  # None: automatic
        self._max_memory = max_memory
        self._fetcher: Any = None  # made at the first batch (it puts the spec in the store)
        # id(core iterator) -> (it, the segment's fetch, its batches)
        self._segments: Dict[int, Tuple[Any, Any, int]] = {}
        self._batch_bytes = 0
        self.batches = self.samples = 0
        self.wait_seconds = self.get_seconds = self.decode_seconds = 0.0

    # -- what the Loader calls ---------------------------------------------------------------

    def start(self, epoch: Optional[int] = None) -> bool:
        """A new iterator: the segments of iterators closed since are dropped (their parts
        in flight cancelled). False: no stuck worker of this process to replace (the
        actors' own stages replace theirs)."""
        for key, (it, seg, _) in list(self._segments.items()):
            if it.closed:
                seg.close()
                del self._segments[key]
        return False

    def stop(self) -> None:
        """Loader.close(): every segment's parts cancelled."""
        for _, seg, _ in self._segments.values():
            seg.close()
        self._segments.clear()

    def dropped(self) -> None:
        """The loader was dropped without close(): its segments' parts are cancelled, so
        the actors do not go on making batches nobody takes."""
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - Ray may be shutting down at the process's end
            pass

    def follow(self, active_threads: int) -> None:
        """Nothing: the actors' threads are their own."""

    def window(self) -> int:
        """Batches in flight per iterator now: the loader's prefetch, else two parts per
        live actor, within max_memory once a batch's size is known."""
        if self._window is not None:
            return self._window
        part = getattr(self._fetcher, "part", 1)
        w = _PARTS_AHEAD * part * max(1, self.service.producers)
        if self._batch_bytes:
            w = min(w, max(1, self._max_memory // self._batch_bytes))
        return max(1, min(w, _core.MAX_PREFETCH))

    def _segment(self, it: Any) -> Tuple[Any, Any, int]:
        got = self._segments.get(id(it))
        if got is not None and got[0] is it:
            return got
        if self._fetcher is None:
            self._fetcher = self.service._fetcher(self.spec, 1)
        self._fetcher.window = self.window()
        key = tuple(it.key)
        remaining = it.remaining
        # batch numbers count from the segment's start; a new segment starts at 0
        # A schedule's weights follow the rows of a step, which the loader fixed for this
        # segment (MixRun.at_world, or a resumed state's): the replica takes the same.
        variant = {"mix": self.mix.state()} if self.mix is not None and \
            self.mix.mix.is_schedule else None
        got = (it, self._fetcher.open(key, 0, remaining, variant), remaining)
        self._segments[id(it)] = got
        return got

    def next(self, it: Any, consumer_stream: Optional[int], entered: int,
             timeout: float = 0.0, core: Any = None) -> Any:
        """The loop's next batch of core iterator `it` (END at the end of its epoch)."""
        it.claim()
        remaining = it.remaining
        if remaining == 0:
            caps = it.next(0)  # the end: the core closes the epoch
            got = self._segments.pop(id(it), None)
            if got is not None:
                got[1].close()
            if caps is not None:
                raise RuntimeError("stoker: internal error: a batch after the segment's end")
            return END
        _, seg, total = self._segment(it)
        self._fetcher.window = self.window()
        j = total - remaining
        deadline = time.monotonic() + timeout if timeout > 0 else None
        try:
            d = seg.take(j, deadline)
        except TimeoutError as e:
            raise RuntimeError(f"DataLoader timed out after {timeout:g} seconds (stoker: "
                               f"{e})") from None
        t0 = time.perf_counter_ns()
        caps = it.next(0)  # the placeholder: the core counts batch j now
        t1 = time.perf_counter_ns()
        if caps is None:
            raise RuntimeError("stoker: internal error: the core's epoch ended before the "
                               "service's")
        if remaining == 1:  # the segment's last batch: nothing more to fetch for it
            self._segments.pop(id(it), None)
            seg.close()
        self.wait_seconds += d.wait_seconds
        self.get_seconds += d.get_seconds
        if d.error is not None:
            it.note_handoff(t0 - entered)
            raise d.error
        batch = decode(d.payload)
        t2 = time.perf_counter_ns()
        self.decode_seconds += (t2 - t1) / 1e9
        self.batches += 1
        self.samples += d.samples
        if not self._batch_bytes:
            self._batch_bytes = _nbytes(batch)
        # the loop's time in next() outside the core's (placeholder) wait: data_stall
        it.note_handoff(t0 - entered + t2 - t1)
        return batch

    # -- stats ------------------------------------------------------------------------------

    def stats(self, s: Dict[str, Any]) -> Dict[str, Any]:
        """``stats()["service"]``, and the loader's sample counts (the placeholders carry
        none) from the batches delivered."""
        s["samples"] = self.samples
        run = s.get("run_seconds") or 0.0
        s["samples_per_second"] = self.samples / run if run > 0 else 0.0
        f = self._fetcher
        actors: Dict[str, Dict[str, Any]] = {}
        put_per_batch = [a.put_seconds / a.put_batches
                         for a in (f.actors.values() if f is not None else ()) if a.put_batches]
        for label, a in (f.actors.items() if f is not None else ()):
            put = a.put_seconds / a.put_batches if a.put_batches else 0.0
            busy = a.compute_seconds + put * a.batches
            actors[label] = {
                "node": a.node, "batches": a.batches, "samples": a.samples, "parts": a.parts,
                "compute_seconds": a.compute_seconds, "put_seconds_per_batch": put,
                "batches_per_second": a.batches / busy if busy > 0 else 0.0, "lost": a.lost}
        n = max(1, self.batches)
        transport = self.get_seconds + self.decode_seconds
        return {
            **self.service.stats(),
            "actors": actors,
            "window": self.window(), "part_batches": getattr(f, "part", None),
            "batches": self.batches,
            "wait_seconds": self.wait_seconds,  # for batches not made yet
            "transport_seconds": transport,  # ray.get and the tensors' views
            "transport_seconds_per_batch": transport / n,
            "put_seconds_per_batch": sum(put_per_batch) / len(put_per_batch)
            if put_per_batch else 0.0,
            "parts_resubmitted": getattr(f, "resubmitted_parts", 0),
            "batches_recomputed": getattr(f, "recomputed_batches", 0),
        }


def _nbytes(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.untyped_storage().nbytes()
    if isinstance(batch, dict):
        return sum(_nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(_nbytes(v) for v in batch)
    return 0
