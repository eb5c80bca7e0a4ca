"""The thread that feeds a remote dataset's deferred ``_core.Dataset`` (NOTE [ Deferred
shards ] in ``csrc/format/shard_gate.h``): it runs transfers; which shards to fetch and
which to give back is the C++ fetch plan's (NOTE [ Fetch plan ] in
``csrc/sampler/fetch_plan.h``).

NOTE [ Fetcher turns ]

The thread sleeps on the dataset's gate event, woken by a reader's demand, a finished
download, ``close()``; while a loader follows the dataset (or records by range wait, or a
failed shard cools down, or the directory has a budget to share) it also looks again every
:attr:`Fetcher.TURN`. A turn:

1. resets the failed shards whose cool-down is over (``Retry.cooldown``): their next read
   fetches them again;
2. asks the plan for this turn, within the dataset's share of its cache directory (NOTE
   [ Cache budget ] in :mod:`.space`): the shards to download (demanded and held ones
   first, started beyond ``max_inflight``; then up to ``max_inflight`` downloads in
   flight), and the shards it gave back (unmapped: their cache pins are dropped here);
3. records the dataset's needs in the directory, for the other holders' shares.

A download runs :meth:`ShardCache.path` on a pool thread; when it ends, the shard is
provided (pinned once local), or failed with the :class:`RemoteError`'s message, which its
waiting readers raise, and cools down. Each download is settled exactly once (by its
callback or by :meth:`Fetcher.ensure`, whichever comes first), under the fetcher's lock, so
a shard is provided only while this process pins it in the cache. Any exception of the
thread itself fails every shard not yet provided with that exception: the readers raise it
instead of waiting forever, and :meth:`Fetcher.ensure` raises it too.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any, Dict, List, Optional

from ._threads import DaemonPool
from .retry import Cancelled
from .transport import RemoteError

__all__ = ["Fetcher"]


class Fetcher:
    """See NOTE [ Fetcher turns ]."""

    # How often a fetcher with something to follow looks again.
    TURN = 0.05
    # ... and one that only shares a directory's budget.
    IDLE_TURN = 0.25
    # Records by range: the largest gap between two records read in one request.
    RANGE_GAP = 1 << 20
    # ... and how long a record waits for its whole shard before it is fetched by range:
    # on a fast link the shard comes first (the ranges would only compete with it, for a
    # slower first batch on loopback: bench/RESULTS.md); on a slow one, or with large
    # shards, the records come seconds before their shards.
    RANGE_AFTER = 0.25
    # Seconds close() waits for transfers in flight once they are cancelled.
    CLOSE_WAIT = 1.0

    def __init__(self, core: Any, cache: Any, index: Dict[str, Any], retry: Any,
                 max_inflight: int, schema_hash: int):
        """Feeds `core` (the deferred ``_core.Dataset``) from `cache` (its ShardCache), of
        the dataset whose ``index.json`` is `index` and schema hash `schema_hash` (which
        checks tables fetched by range), `retry` its policy, at most `max_inflight`
        downloads ahead of the readers."""
        from .. import _core

        self.cache, self.core, self.index = cache, core, index
        self.max_inflight = max_inflight
        self.schema_hash = schema_hash
        self.n = len(cache)
        self.sizes = [int(s["bytes"]) for s in index["shards"]]
        self.total_bytes = sum(self.sizes)
        self.retry = retry
        self.plan = _core.FetchPlan(core, self.sizes)
        self.ensure_wait = 0.0
        self.released = 0  # shards given back
        self.failures = 0  # downloads that failed (each after its retries)
        self.turns = 0
        self.cpu_seconds = 0.0  # the thread's CPU time in its turns
        self.range_records = 0  # records fetched by range (NOTE [ Records by range ])
        self.range_bytes = 0
        self._tables: Dict[int, Future] = {}  # shard -> its record table, fetched by range
        self._declined: set = set()  # shards not served by range
        # shard -> (when its first record was asked for, the records): waiting RANGE_AFTER
        self._range_wait: Dict[int, Any] = {}

        self.pid = os.getpid()  # its threads live in this process (RemoteDataset.serve_here)
        self._mu = threading.Lock()
        self._inflight: Dict[int, Future] = {}
        self._settled: Dict[int, Optional[BaseException]] = {}  # shard -> its error or None
        self._streak: Dict[int, int] = {}  # shard -> failed downloads in a row
        self._cooling: Dict[int, float] = {}  # failed shard -> when it may be fetched again
        self._holds: Dict[int, int] = {}  # shard -> holds for reads outside loaders
        self._needs: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
        self._closed = False
        self.error: Optional[BaseException] = None  # what stopped the thread, if anything
        # Shards already in the cache (a warm cache, another rank's downloads) are pinned
        # and provided now: a few system calls each, so that no read waits for them. In a
        # forked child, shards the parent provided and that are gone from the cache are
        # given back (the child holds no pin on them).
        for s in range(self.n):
            if self.cache.pin_if_local(s):
                self._settled[s] = None
                core.provide(s)
            elif core.state(s) == "ready":
                core.try_release(s)
        # demands may start beyond max_inflight: a reader never queues behind prefetches
        self._pool = DaemonPool(2 * max_inflight, "stoker-fetch")
        # records by range: their own threads, so that they never wait behind shards
        self._range_pool = DaemonPool(2, "stoker-range")
        self._thread = threading.Thread(target=self._run, name="stoker-fetcher", daemon=True)
        self._thread.start()

    def stats(self) -> Dict[str, Any]:
        """Its counters (RemoteDataset.stats): ``network_wait_seconds`` (readers' waits for
        shards, waits in progress included), ``range_records``/``range_bytes``,
        ``failed_downloads``, ``released``, ``fetcher_turns``, ``fetcher_cpu_seconds``."""
        with self._mu:
            records, nbytes, failures, released = (self.range_records, self.range_bytes,
                                                   self.failures, self.released)
        return {"network_wait_seconds": self.ensure_wait + self.core.gate_wait_seconds,
                "range_records": records, "range_bytes": nbytes,
                "failed_downloads": failures, "released": released,
                "fetcher_turns": self.turns, "fetcher_cpu_seconds": self.cpu_seconds}

    # -- what readers ask ------------------------------------------------------------------

    def follow(self, core: Any, producer: Any, world_size: int, need: int,
               source: Optional[int] = None) -> None:
        """Follows a loader (its core and record producer) for as long as it lives;
        ``need``: the bytes of its working set (its window's shards). ``source``: this
        dataset is that source of the loader's record mixture (``producer``)."""
        if source is None:
            self.plan.follow(core, producer, world_size)
        else:
            self.plan.follow(core, producer, source=source)
        with self._mu:
            self._needs[core] = int(need)
        self.core.gate_notify()

    def hold(self, shards: List[int], delta: int) -> None:
        with self._mu:
            for s in shards:
                n = self._holds.get(s, 0) + delta
                if n > 0:
                    self._holds[s] = n
                else:
                    self._holds.pop(s, None)

    def ensure(self, s: int) -> None:
        """Makes shard ``s`` local and provided, in the calling thread (the caller holds
        it: RemoteDataset.holding). Raises :class:`RemoteError`."""
        t0 = time.monotonic()
        try:
            while self.core.state(s) != "ready":
                with self._mu:
                    if self.error is not None:
                        raise RemoteError(f"{self.cache.url(s)}: the fetcher stopped: "
                                          f"{type(self.error).__name__}: {self.error}")
                    exc = self._settled.get(s)
                if exc is not None:
                    raise RemoteError(_reason(exc, self.cache.url(s)))
                fut = self._start(s)
                if fut is None:  # provided per our books: the gate catches up
                    time.sleep(0.001)
                    continue
                fut.exception()  # waits (a close() ends it)
                self._settle(s, fut)
        finally:
            with self._mu:
                self.ensure_wait += time.monotonic() - t0

    # -- downloads -------------------------------------------------------------------------

    def _start(self, s: int) -> Optional[Future]:
        """The download of ``s``, started if it is not under way (None once settled)."""
        with self._mu:
            if s in self._settled:
                return None
            fut = self._inflight.get(s)
            if fut is not None:
                return fut
            if self._closed:
                raise RemoteError(f"{self.cache.url(s)}: the dataset was closed")
            fut = self._pool.submit(self.cache.path, s)  # pins it once local
            self._inflight[s] = fut
        # Outside the lock: a future already done runs the callback right here.
        fut.add_done_callback(lambda f, s=s: self._settle(s, f))
        return fut

    def _settle(self, s: int, fut: Future) -> None:
        """Provides or fails ``s`` with the outcome of ``fut``, once per download."""
        try:
            exc = None if fut.cancelled() else fut.exception()
            with self._mu:
                if self._inflight.get(s) is not fut:
                    return  # settled already (by the callback or by ensure)
                del self._inflight[s]
                if fut.cancelled() or isinstance(exc, Cancelled) or self._closed:
                    if exc is None and not fut.cancelled():
                        with contextlib.suppress(ValueError):  # (the cache closed first)
                            self.cache.release(s)  # came as we closed: not kept
                    return
                if exc is None:
                    self._settled[s] = None
                    self._streak.pop(s, None)
                    self.core.provide(s)
                else:
                    self.failures += 1
                    streak = self._streak[s] = self._streak.get(s, 0) + 1
                    self._settled[s] = exc
                    self._cooling[s] = time.monotonic() + self.retry.cooldown(streak)
                    self.core.fail(s, _reason(exc, self.cache.url(s)))
            self.core.gate_notify()  # the fetcher may start the next one
        except BaseException as e:  # a bug here must not leave readers waiting
            self._die(e)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                seen = self.core.gate_prepare()  # before looking: a change after it wakes us
                with self._mu:
                    if self._closed:
                        return
                c0 = time.thread_time()
                following = self._turn()
                self.serve_records()
                self.cpu_seconds += time.thread_time() - c0
                self.turns += 1
                with self._mu:
                    busy = following or bool(self._cooling) or bool(self._range_wait)
                if busy:
                    wait = self.TURN
                elif self.cache.directory.budget() is not None:
                    wait = self.IDLE_TURN
                else:
                    wait = 5.0
                self.core.gate_wait(seen, wait)
        except BaseException as e:
            self._die(e)

    def _turn(self) -> bool:
        """NOTE [ Fetcher turns ]; whether a loader follows the dataset."""
        now = time.monotonic()
        with self._mu:
            for s, when in list(self._cooling.items()):
                if now >= when:
                    del self._cooling[s]
                    if self._settled.get(s) is not None:
                        del self._settled[s]
                    self.core.reset(s)  # its next read fetches it again
            holder = self.cache.holder
            share = self.cache.directory.share(holder)
            budget = -1 if share is None else share
            holds = list(self._holds)
            inflight = list(self._inflight)
            t = self.plan.turn(budget, holds, inflight, self.max_inflight)
            for s in t["released"]:  # unmapped by the plan: the cache pin goes now
                if self._settled.get(s, 1) is None:
                    del self._settled[s]
                    self.released += 1
                    self.cache.release(s)
            need = sum(self._needs.values())
        fetch, urgent = t["fetch"], t["urgent"]
        for s in fetch[:urgent]:
            self._start(s)
        for s in fetch[urgent:]:
            with self._mu:
                if len(self._inflight) >= self.max_inflight:
                    break
            self._start(s)
        following = bool(t["following"])
        holds_bytes = sum(self.sizes[s] for s in holds)
        holder.update(need=need + holds_bytes, must=int(t["must_bytes"]), managed=True,
                      want=self.total_bytes if following else int(t["must_bytes"]))
        return following

    def _die(self, e: BaseException) -> None:
        """The thread (or a settle) failed: every shard not provided fails with ``e``, so
        that no reader waits forever."""
        with self._mu:
            if self.error is None:
                self.error = e
            self._closed = True
        why = f"the remote dataset's fetcher stopped: {type(e).__name__}: {e}"
        for s in range(self.n):
            try:
                self.core.fail(s, f"{self.cache.url(s)}: {why}")
            except Exception:
                pass

    # -- records by range (NOTE [ Records by range ] in csrc/format/record_ranges.h) --------

    def serve_records(self) -> None:
        """The records an epoch's first batch asks for, of shards not local yet, fetched
        by range (per shard: its table once, then the records, coalesced) while the
        shards themselves download: whichever comes first serves the readers. A shard
        whose table or records cannot be had by range is declined: its readers wait for
        the whole shard, whose download reports its own errors."""
        if not self.core.record_ranges:
            return
        now = time.monotonic()
        for s, r in self.core.take_record_demands():
            self._range_wait.setdefault(s, (now, []))[1].append(r)
        for s, (since, records) in list(self._range_wait.items()):
            with self._mu:
                if self._closed:
                    return
                done = s in self._declined or (s in self._settled and self._settled[s] is None)
            if not done and now < since + self.RANGE_AFTER:
                continue  # the whole shard may come first: ranges would only compete
            del self._range_wait[s]
            if done:
                continue
            try:
                self._range_pool.submit(self._fetch_records, s, records)
            except RuntimeError:  # closed meanwhile
                return

    def _table(self, s: int) -> Any:
        from .. import _core
        from .._index import shard_identity
        from .ranges import fetch_ranges

        with self._mu:
            fut = self._tables.get(s)
            mine = fut is None
            if mine:
                fut = self._tables[s] = Future()
        assert fut is not None
        if not mine:
            return fut.result()
        try:
            entry = self.index["shards"][s]
            name, size, n = entry["path"], int(entry["bytes"]), int(entry["num_records"])
            url = self.cache.url(s)
            head_len, tail_len = min(64, size), min(_core.shard_tail_bytes(n), size)
            head, tail = fetch_ranges(self.cache.source, name,
                                      [(0, head_len), (size - tail_len, tail_len)],
                                      max_parallel=2, retry=self.retry,
                                      cancel=self.cache.cancel)
            self.core.provide_table(s, url, head, tail)  # the readers' copy, checked
            table = _core.parse_shard_table(url, head, tail, size, self.schema_hash, n,
                                            shard_identity(self.index, s))
        except BaseException as e:
            fut.set_exception(e)
            raise
        fut.set_result(table)
        return table

    def _fetch_records(self, s: int, records: List[int]) -> None:
        from .ranges import fetch_records

        try:
            table = self._table(s)
            name = self.index["shards"][s]["path"]
            # Gaps under RANGE_GAP are read rather than skipped: on a link where a request
            # costs a round trip, reading 1 MiB more costs less than a second request
            # (S3: ~30 ms at ~100 MB/s), and on loopback it is the requests that cost.
            data = fetch_records(self.cache.source, name, table, records,
                                 max_gap=self.RANGE_GAP, max_parallel=4, retry=self.retry,
                                 cancel=self.cache.cancel)
            for r, d in zip(records, data):
                self.core.provide_record(s, r, d)
            with self._mu:
                self.range_records += len(records)
                self.range_bytes += sum(map(len, data))
        except Cancelled:
            return
        except Exception:  # no ranges here (or a bad table): the whole shard serves
            with self._mu:
                self._declined.add(s)
            self.core.no_ranges(s)

    # -- close -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stops the thread, cancels every transfer (waiting for them at most
        :attr:`CLOSE_WAIT` seconds) and fails every shard not provided, so that no reader
        waits for a download that will not come."""
        with self._mu:
            if self._closed and self.error is None and not self._thread.is_alive() and \
                    self._pool.closed:
                return
            self._closed = True
        self.core.gate_notify()
        self.cache.cancel.cancel()
        if self._thread is not threading.current_thread():
            self._thread.join(self.CLOSE_WAIT)
        self._pool.shutdown()
        self._range_pool.shutdown()
        deadline = time.monotonic() + self.CLOSE_WAIT
        self._pool.join(max(0.0, deadline - time.monotonic()))
        self._range_pool.join(max(0.0, deadline - time.monotonic()))
        for s in range(self.n):  # a reader still waiting must not wait forever
            self.core.fail(s, f"{self.cache.url(s)}: the dataset was closed")


def _reason(exc: BaseException, url: str) -> str:
    """The message a reader raises for a failed download."""
    if isinstance(exc, RemoteError):
        return str(exc)
    return f"{url}: {type(exc).__name__}: {exc}"
