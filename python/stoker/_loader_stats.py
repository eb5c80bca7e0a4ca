"""A loader's counters and the warnings at the end of an epoch: :class:`Counters`, the part
of a loader that owns them (``Loader.stats()`` and the end of an epoch's report are its
methods), with the parts it reads.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional

from . import _cache


class Counters:
    """``Loader.stats()`` and the warnings at the end of an epoch, from the parts that
    count: the core, the source's running half (stoker/_sources/), the decoded cache, and
    a service's stage (docs/service.md). It keeps what it has already said."""

    def __init__(self, core: Any, source: Any, cache: Any, service: Optional[Any]):
        self._core, self._source, self._cache, self._service = core, source, cache, service
        self._cache_full_said = self._cache_left_said = False
        self._skipped_reported = 0

    def stats(self) -> Dict[str, Any]:
        """Counters since the loader was made, and where the time goes (docs/tuning.md).

        Progress: batches, samples, bytes_read, skipped (delivered to the loop).

        The training loop: ``data_stall`` is the fraction of iterator wall time the loop
        spent waiting for data in ``next()`` (wait_seconds / run_seconds, with or without a
        device: the wait for the host batch or for its copy to be queued; the copy itself
        is ordered on the GPU, not waited for); run_seconds is the time iterators were open
        (from their first ``next()``); samples_per_second is over run_seconds;
        first_batch_seconds is from ``iter()`` to the first batch of the last epoch
        started, warmup_seconds from the loader's first ``next()`` to its first batch.

        Workers: read_seconds (reading and verifying records), decode_seconds (the codecs
        for images; copying the fields of other records), ops_seconds (image ops after
        decoding), plan_seconds (planning batches), worker_busy/idle_seconds, all summed
        over threads; ``stage_seconds_per_batch`` divides them (and the device copy time)
        by the batches delivered. The Python stage (map, batch_map, collate_fn, a map-style
        dataset: docs/python.md): python_seconds (wall time in your code, over its
        threads), python_cpu_seconds, python_wait_seconds (runnable without a free core),
        and ``stage_seconds_per_batch["python"]``.

        Queue: queue_depth (batches ready now), queue_depth_mean and queue_depth_hist
        (batches ready each time the loop asked for one: counts for 0, 1, ... 7, 8 or
        more; mostly 0 means the loop waits on the loader).

        Verdict: ``bottleneck`` ("loader", "copy" or "consumer"; "unknown" before any
        batch), ``bottleneck_stage`` (read, decode, ops, plan, prefetch or copy; None when
        the loader keeps up) and ``verdict``, one line saying why, the loader's first batch
        left out.

        Settings in force: num_threads (active workers), prefetch (batches in flight per
        iterator), with auto_threads/auto_prefetch (tuned online), settled (the tuner has
        settled), max_threads, max_memory, batch_bytes (the largest batch); live_workers,
        host_blocks/host_bytes (batch memory alive). With a device: copies, copy_bytes,
        copy_seconds (device time), copy_gbps, device_buffers, device_bytes.

        With ``service=`` (docs/service.md), ``stats()["service"]``: per actor (``actors``) its
        batches, samples, parts and rate; the loop's wait for batches not made yet, the
        transport's time (``transport_seconds_per_batch``: taking a batch from Ray's store;
        ``put_seconds_per_batch``: the actors' writes), the window, the work made again
        after failures (``parts_resubmitted``, ``batches_recomputed``) and the pool's
        ``live_actors`` and ``lost``; ``samples`` counts the batches delivered.

        With ``cache="decoded"``, ``stats()["cache"]``: hits and misses (images this process
        took from the cache or decoded), hit_rate, inserts, declined (entries that found no
        room), and the cache's own figures, every process's together: entries, images
        (images held), cached_share (images over the dataset's), bytes (in use), budget,
        full (an entry found no room), shared (in shared memory), path, fallback (why not
        shared)."""
        s = self._core.stats()  # derived numbers included (csrc/pipeline/loader_telemetry.h)
        counts = s.pop("source_counts")
        # the source's own (stoker/_sources/): a mixture's per source, token padding, network
        self._source.stats(s, counts, self._core.state())
        if self._cache is not None:
            s["cache"] = _cache.cache_stats(self._cache)
        if self._service is not None:  # made by a service's actors (docs/service.md)
            s["service"] = self._service.stats(s)
        tier = self._source.tier()  # where reads were served from: memory, mmap or remote
        if tier is not None:
            s["tier"] = tier
        return s

    def report_cache(self) -> None:
        """Says once, at the end of an epoch, that the decoded cache ran out of room, or
        that this process left the shared cache (an entry failed its check)."""
        if self._cache is None:
            return
        left = self._cache.abandoned
        if left and not self._cache_left_said:
            self._cache_left_said = True
            warnings.warn(f"stoker: this loader no longer reads the shared decoded-sample "
                          f"cache: {left}. It keeps a private cache from now on (the images "
                          "are decoded again), and never reads the shared file again "
                          "(docs/cache.md, \"Who can see the cache\")", RuntimeWarning,
                          stacklevel=6)
        if self._cache_full_said:
            return
        s = _cache.cache_stats(self._cache)
        if s["full"]:
            self._cache_full_said = True
            warnings.warn(f"stoker: the decoded-sample cache is full: it holds "
                          f"{s['cached_share']:.0%} of the dataset's images ({s['images']} "
                          f"of {s['slots']}) in cache_size={s['budget']} bytes, and the "
                          "others are decoded every epoch; a larger cache_size, or "
                          "cache_max_side, holds more (stats()['cache'])", RuntimeWarning,
                          stacklevel=6)

    def end_of_epoch(self) -> None:
        """At the end of an epoch (``Loader._report_skipped``, from the iterator's
        ``__next__``: the warnings' stacklevel names the loop's line): the samples
        ``on_error="skip"`` replaced since the last report, and a full decoded cache."""
        self.report_cache()
        skipped = self._core.stats()["skipped"]
        new = skipped - self._skipped_reported
        if new > 0:
            self._skipped_reported = skipped
            named = self._source.skipped_report(new)  # a source that names them
            warnings.warn(named or f"stoker: replaced {new} unreadable sample(s) with the "
                          "next valid one (on_error='skip'); see loader.stats()['skipped']",
                          RuntimeWarning, stacklevel=5)
