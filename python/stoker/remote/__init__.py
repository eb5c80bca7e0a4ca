"""Datasets that live at a URL (``s3://``, ``https://``, any fsspec URL), read through a
local shard cache shared by the processes of a node.

``stoker.Dataset("s3://bucket/train", cache_dir=..., cache_limit="50GB")`` fetches
``index.json`` and returns: the shards download into the cache (:class:`ShardCache`,
protocol in NOTE [ Shard cache protocol ] of :mod:`.cache`) while the dataset is in use.
The C++ dataset is opened with deferred shards (NOTE [ Deferred shards ] in
``csrc/format/shard_gate.h``): a read waits until its shard is local. :class:`RemoteDataset`'s
fetcher thread downloads the shards that readers wait for first (a loader's workers read
``prefetch`` batches ahead, so that is the sampler's own future order), then the rest,
``max_inflight`` at a time.

NOTE [ Bounded cache ]

When ``cache_limit`` holds the whole dataset, every shard is downloaded once (in the order
the loaders reading it will need them) and stays pinned while the dataset is open. When it
does not, the dataset is *bounded*: its C++ dataset is opened releasable (NOTE [ Released
shards ]), and at every turn the fetcher plans which shards to keep::

    wanted = shards in use: readers wait for them (demands), read them now (a pin in
             the C++ dataset), or hold them for ds[i] and friends;
             then each following loader's schedule (the shards the rest of its epoch
             reads, in order: RecordProducer.shard_schedule), merged,
             cut where their bytes would pass cache_limit

No reader holds one shard while it waits for another, so the shards in use are at most
the readers' count plus their demands, and a shard given back is soon evictable.

It downloads the wanted shards in that order, and gives back every provided shard that is
not wanted: unmapped (``try_release``, which a reader's pin refuses) and unpinned in the
cache, so that the cache may evict it for the next ones. A loader reads a bounded dataset
with ``shuffle=False`` or with ``shard_window``: a global shuffle reads every shard in every
batch, which no cache smaller than the dataset can serve (the Loader says so when made).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Union

from .cache import RemoteError, ShardCache, default_cache_dir
from .transport import PermanentError, Source, TransientError, is_url, open_source

__all__ = ["RemoteDataset", "ShardCache", "RemoteError", "is_url", "open_source",
           "default_cache_dir", "fetch_bytes"]


def fetch_bytes(source: Source, name: str, *, retries: int = 4, backoff: float = 0.25) -> bytes:
    """A whole (small) object, with the cache's retry policy."""
    url = source.object_url(name)
    last = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * (2 ** (attempt - 1)) * (0.5 + random.random() / 2))
        try:
            return source.read(name)
        except TransientError as e:
            last = str(e)
        except PermanentError as e:
            raise RemoteError(f"{url}: {e}") from None
    raise RemoteError(f"{url}: {last} (after {retries + 1} attempts)")


def _safe_relpath(p: Any) -> bool:
    return (isinstance(p, str) and bool(p) and not os.path.isabs(p)
            and ".." not in p.replace("\\", "/").split("/"))


class RemoteDataset:
    """``index.json`` and shard cache of one dataset URL (what ``stoker.Dataset(url)``
    holds as ``ds.remote``).

    Args:
        url: the dataset's URL (its directory, or its ``index.json``).
        cache_dir: local cache directory (default :func:`default_cache_dir`).
        cache_limit: bytes or a size string (``"50GB"``); None: no limit.
        storage_options: passed to the transport (``endpoint_url``, credentials, headers).
        max_inflight, retries, timeout: see :class:`ShardCache`.
    """

    def __init__(self, url: str, *, cache_dir: Optional[Union[str, os.PathLike]] = None,
                 cache_limit: Union[int, str, None] = None,
                 storage_options: Optional[Dict[str, Any]] = None, max_inflight: int = 4,
                 retries: int = 4, timeout: float = 600.0):
        from ..writer import INDEX_NAME, parse_size

        self.max_inflight = max_inflight
        root = url[: -len(INDEX_NAME)] if url.endswith("/" + INDEX_NAME) else url
        self.url = root.rstrip("/")
        self.cache_dir = os.path.abspath(os.fspath(cache_dir or default_cache_dir()))
        self.cache_limit = None if cache_limit is None else parse_size(cache_limit)
        self.source = open_source(self.url, storage_options=storage_options)
        self.index_bytes = fetch_bytes(self.source, INDEX_NAME, retries=retries)
        index_url = self.source.object_url(INDEX_NAME)
        try:
            index = json.loads(self.index_bytes.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RemoteError(f"{index_url}: not a stoker index (invalid JSON: {e})") from None
        shards = index.get("shards") if isinstance(index, dict) else None
        if not isinstance(shards, list):
            raise RemoteError(f"{index_url}: not a stoker index (no 'shards' list)")
        for i, s in enumerate(shards):
            ok = (isinstance(s, dict) and _safe_relpath(s.get("path"))
                  and type(s.get("bytes")) is int and s["bytes"] >= 0
                  and (s.get("checksum") is None or type(s["checksum"]) is int))
            if not ok:
                raise RemoteError(f"{index_url}: shard entry {i} is malformed: {s!r}")
        self.index = index
        self.total_bytes = sum(s["bytes"] for s in shards)
        self.cache = ShardCache(self.source, shards, self.cache_dir,
                                cache_limit=self.cache_limit, max_inflight=max_inflight,
                                retries=retries, timeout=timeout)
        self._lock = threading.Lock()
        self._fetcher: Optional[_Fetcher] = None
        self._core: Any = None

    @property
    def bounded(self) -> bool:
        """Whether ``cache_limit`` is smaller than the dataset (NOTE [ Bounded cache ])."""
        return self.cache_limit is not None and self.total_bytes > self.cache_limit

    def check_window(self, shard_window: Optional[int], shuffle: bool) -> None:
        """Raises ValueError if a loader with these settings cannot read this dataset
        through its cache: a global shuffle of a bounded dataset, or a window whose largest
        shards do not fit ``cache_limit``."""
        if not self.bounded:
            return
        assert self.cache_limit is not None
        sizes = sorted((s["bytes"] for s in self.index["shards"]), reverse=True)
        if shuffle and shard_window is None:
            fit, total = 0, 0
            for b in sizes:
                if total + b > self.cache_limit // 2:
                    break
                total += b
                fit += 1
            hint = (f"shard_window={fit} (two windows of the largest shards fit the cache)"
                    if fit else "a larger cache_limit")
            raise ValueError(
                f"{self.url}: the dataset ({self.total_bytes} bytes) is larger than cache_limit "
                f"({self.cache_limit} bytes), and shuffle=True without shard_window reads "
                f"every shard in every batch; shuffle a window of shards at a time with {hint}, "
                "or read it with shuffle=False")
        need = sum(sizes[: shard_window or 1])
        if need > self.cache_limit:
            raise ValueError(
                f"{self.url}: shard_window={shard_window} may need {need} bytes of shards at "
                f"once (its largest shards), more than cache_limit ({self.cache_limit} bytes); "
                "use a smaller shard_window or a larger cache_limit")

    def follow(self, schedule: Callable[[int], Sequence[int]]) -> None:
        """Downloads ahead of ``schedule(max_shards)``, the shards a reader (a loader's live
        iterator) will read next, in order, for as long as the callable is alive (held
        weakly: a bound method of the loader)."""
        self.serve_here()
        fetcher = self._fetcher
        if fetcher is not None:
            fetcher.follow(schedule)

    @contextlib.contextmanager
    def holding(self, shards: Iterable[int]) -> Iterator[None]:
        """Makes ``shards`` local and keeps them so (not given back: NOTE [ Bounded cache ])
        while the block runs: for reads outside a loader."""
        shards = [int(s) for s in shards]
        self.serve_here()
        fetcher = self._fetcher
        if fetcher is None:
            raise RuntimeError("this remote dataset is not open")
        fetcher.hold(shards, +1)
        try:
            for s in shards:
                fetcher.ensure(s)
            yield
        finally:
            fetcher.hold(shards, -1)

    def start(self, core: Any, schema_hash: int) -> None:
        """Starts feeding ``core``, a ``_core.Dataset`` opened with deferred shards whose
        paths are :meth:`ShardCache.object_path`: the fetcher thread (:class:`_Fetcher`).
        ``schema_hash`` is the dataset's (it checks tables fetched by range)."""
        with self._lock:
            if self._fetcher is not None:
                raise RuntimeError("this remote dataset is already being fetched")
            self._core = core
            self.schema_hash = schema_hash
            self._fetcher = _Fetcher(self, core)

    def serve_here(self) -> None:
        """In a forked child (a DataLoader worker, say), starts this process's own fetcher:
        the parent's threads did not come along, and its locks may have been held at the
        fork. Its cache object is new too (same directory: the parent's downloads are found
        there). A no-op in the process that opened the dataset."""
        fetcher = self._fetcher
        if fetcher is None or fetcher.pid == os.getpid():
            return
        with self._lock:
            if self._fetcher is not fetcher:
                return
            old = self.cache
            self.cache = ShardCache(self.source, self.index["shards"], self.cache_dir,
                                    cache_limit=self.cache_limit,
                                    max_inflight=self.max_inflight, retries=old.retries,
                                    timeout=old.timeout)
            self._fetcher = _Fetcher(self, self._core)

    def ensure(self, shards: Iterable[int]) -> None:
        """Makes ``shards`` local now, in the calling thread, for reads outside a loader
        (``ds[i]``, :meth:`stoker.Dataset.verify`). Raises :class:`RemoteError`."""
        self.serve_here()
        fetcher = self._fetcher
        if fetcher is None:
            raise RuntimeError("this remote dataset is not open")
        for s in shards:
            fetcher.ensure(int(s))

    def stats(self) -> Dict[str, Any]:
        """The cache's counters (:meth:`ShardCache.stats`), with ``network_wait_seconds``
        the time readers spent waiting for shards to download (a loader's workers, and
        :meth:`ensure`), and ``range_records``/``range_bytes`` the records (and their
        bytes) fetched by range ahead of their shards (NOTE [ Records by range ])."""
        st = self.cache.stats()
        fetcher = self._fetcher
        if fetcher is not None:
            st["network_wait_seconds"] = fetcher.ensure_wait + fetcher.core.gate_wait_seconds
            with fetcher._mu:
                st["range_records"] = fetcher.range_records
                st["range_bytes"] = fetcher.range_bytes
        return st

    def close(self) -> None:
        """Stops fetching and drops the pins (the shards may be evicted); readers still
        waiting for a shard get a :class:`RemoteError`."""
        fetcher = self._fetcher
        if fetcher is not None:
            fetcher.close()
        self.cache.close()

    def __repr__(self) -> str:
        return (f"stoker.remote.RemoteDataset({self.url!r}, {len(self.cache)} shards, "
                f"cache {self.cache_dir!r})")


class _Fetcher:
    """The thread that feeds a deferred ``_core.Dataset`` (NOTE [ Deferred shards ] in
    ``csrc/format/shard_gate.h``).

    It sleeps on the core's gate event. Shards that readers wait for (``core.demands()``,
    and :meth:`ensure`) start ahead of the others, with ``max_inflight`` pool threads
    beyond those the others use; otherwise it keeps ``max_inflight`` downloads going, in
    the order the loaders it follows will read the shards (then shard order). Each
    download is :meth:`ShardCache.path` in a pool thread (one download per shard per node,
    pinned once local); when it finishes, the shard is provided to the core, or failed
    with the :class:`RemoteError`'s message, which the reader raises in the iterating
    thread. A bounded dataset's fetcher also gives shards back (NOTE [ Bounded cache ])."""

    # How often a fetcher that follows loaders looks at their schedules again.
    TURN = 0.05
    # Records by range: the largest gap between two records read in one request.
    RANGE_GAP = 1 << 20
    # ... and how long a record waits for its whole shard before it is fetched by range:
    # on a fast link the shard comes first (the ranges would only compete with it, for a
    # slower first batch on loopback: bench/RESULTS.md); on a slow one, or with large
    # shards, the records come seconds before their shards.
    RANGE_AFTER = 0.25

    def __init__(self, remote: RemoteDataset, core: Any):
        self.remote, self.cache, self.core = remote, remote.cache, core
        self.n = len(remote.cache)
        self.bounded = remote.bounded
        self.sizes = [int(s["bytes"]) for s in remote.index["shards"]]
        self.ensure_wait = 0.0
        self.released = 0  # shards given back (bounded)
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
        self._holds: Dict[int, int] = {}  # shard -> holds for reads outside loaders
        self._followers: List[Any] = []  # weak references to schedule callables
        self._closed = False
        # Shards already in the cache (a warm cache, another rank's downloads) are pinned
        # and provided now: a few system calls each, so that no read waits for them.
        for s in range(self.n):
            if self.cache.pin_if_local(s):
                self._settled[s] = None
                core.provide(s)
        # demands may start beyond max_inflight: a reader never queues behind prefetches
        self._pool = ThreadPoolExecutor(2 * remote.max_inflight,
                                        thread_name_prefix="stoker-fetch")
        # records by range: their own threads, so that they never wait behind shards
        self._range_pool = ThreadPoolExecutor(2,
                                              thread_name_prefix="stoker-range")
        self._thread = threading.Thread(target=self._run, name="stoker-fetcher", daemon=True)
        self._thread.start()

    def follow(self, schedule: Callable[[int], Sequence[int]]) -> None:
        ref = weakref.WeakMethod(schedule) if hasattr(schedule, "__self__") \
            else weakref.ref(schedule)
        with self._mu:
            self._followers.append(ref)
        self.core.gate_notify()

    def hold(self, shards: Sequence[int], delta: int) -> None:
        with self._mu:
            for s in shards:
                n = self._holds.get(s, 0) + delta
                if n > 0:
                    self._holds[s] = n
                else:
                    self._holds.pop(s, None)

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
        exc = fut.exception()
        with self._mu:
            if self._inflight.get(s) is fut:
                del self._inflight[s]
            if s in self._settled:
                return
            self._settled[s] = exc
        if exc is None:
            self.core.provide(s)
        else:
            why = str(exc) if isinstance(exc, RemoteError) else \
                f"{self.cache.url(s)}: {type(exc).__name__}: {exc}"
            self.core.fail(s, why)
        self.core.gate_notify()  # the fetcher may start the next one

    def _schedule(self, max_shards: int) -> List[int]:
        """The followed loaders' schedules, merged turn by turn (each one's next shard,
        then each one's second...), without repeats."""
        lists = []
        with self._mu:
            refs = list(self._followers)
        alive = []
        for ref in refs:
            fn = ref()
            if fn is None:
                continue
            alive.append(ref)
            try:
                lists.append(list(fn(max_shards)))
            except Exception:  # a loader being torn down: no schedule this turn
                continue
        with self._mu:
            self._followers = [r for r in self._followers if r in alive or r not in refs]
        out: List[int] = []
        seen = set()
        for k in range(max(map(len, lists), default=0)):
            for lst in lists:
                if k < len(lst) and lst[k] not in seen:
                    seen.add(lst[k])
                    out.append(lst[k])
        return out

    def _serve_records(self) -> None:
        """NOTE [ Records by range ] in csrc/format/record_ranges.h: the records an epoch's first
        batch asks for, of shards not local yet, fetched by range (per shard: its table
        once, then the records, coalesced) while the shards themselves download: whichever
        comes first serves the readers (on a fast link the whole shards may; on a slow one,
        or with large shards, the records do). A shard whose table or records cannot be had
        by range is declined: its readers wait for the whole shard, whose download reports
        its own errors."""
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
        from .ranges import fetch_ranges, shard_identity

        with self._mu:
            fut = self._tables.get(s)
            mine = fut is None
            if mine:
                fut = self._tables[s] = Future()
        assert fut is not None
        if not mine:
            return fut.result()
        try:
            entry = self.remote.index["shards"][s]
            name, size, n = entry["path"], int(entry["bytes"]), int(entry["num_records"])
            url = self.cache.url(s)
            head_len, tail_len = min(64, size), min(_core.shard_tail_bytes(n), size)
            head, tail = fetch_ranges(self.cache.source, name,
                                      [(0, head_len), (size - tail_len, tail_len)],
                                      max_parallel=2, retries=self.cache.retries)
            self.core.provide_table(s, url, head, tail)  # the readers' copy, checked
            table = _core.parse_shard_table(url, head, tail, size, self.remote.schema_hash, n,
                                            shard_identity(self.remote.index, s))
        except BaseException as e:
            fut.set_exception(e)
            raise
        fut.set_result(table)
        return table

    def _fetch_records(self, s: int, records: List[int]) -> None:
        from .ranges import fetch_records

        try:
            table = self._table(s)
            name = self.remote.index["shards"][s]["path"]
            # Gaps under RANGE_GAP are read rather than skipped: on a link where a request
            # costs a round trip, reading 1 MiB more costs less than a second request
            # (S3: ~30 ms at ~100 MB/s), and on loopback it is the requests that cost.
            data = fetch_records(self.cache.source, name, table, records,
                                 max_gap=self.RANGE_GAP, max_parallel=4,
                                 retries=self.cache.retries)
            for r, d in zip(records, data):
                self.core.provide_record(s, r, d)
            with self._mu:
                self.range_records += len(records)
                self.range_bytes += sum(map(len, data))
        except Exception:  # no ranges here (or a bad table): the whole shard serves
            with self._mu:
                self._declined.add(s)
            self.core.no_ranges(s)

    def _busy(self) -> int:
        with self._mu:
            return len(self._inflight)

    def _turn_unbounded(self, background: Iterator[int]) -> None:
        for s in self.core.demands():
            self._start(s)
        order = self._schedule(self.n)
        for s in order:
            if self._busy() >= self.remote.max_inflight:
                return
            self._start(s)
        while self._busy() < self.remote.max_inflight:
            s = next(background, None)
            if s is None:
                break
            self._start(s)

    def _turn_bounded(self) -> None:
        """NOTE [ Bounded cache ]: plan the shards to keep, give back the rest, download."""
        limit = self.remote.cache_limit
        assert limit is not None
        demands = self.core.demands()
        with self._mu:
            held = list(self._holds)
            provided = [s for s, e in self._settled.items() if e is None]
        # In use now: shards readers wait for, or hold (a pin: being read), or that
        # reads outside loaders hold. They stay whatever the schedule says, and come
        # first: the schedule starts at the consumer, and workers read ahead of it.
        reading = [s for s in provided if self.core.pins(s) > 0]
        must = set(demands) | set(held) | set(reading)
        wanted: List[int] = []
        seen = set()
        total = 0
        for s in [*demands, *reading, *held, *self._schedule(self.n)]:
            if s in seen:
                continue
            if s not in must and total + self.sizes[s] > limit:
                break  # in order: what comes later waits for room
            seen.add(s)
            wanted.append(s)
            total += self.sizes[s]
        for s in provided:
            if s in seen:
                continue
            with self._mu:  # a hold() now waits, then finds the shard settled or not
                if s in self._holds or not self.core.try_release(s):  # (a reader's pin)
                    continue
                del self._settled[s]
                self.released += 1
            self.cache.release(s)
        for s in demands:
            self._start(s)
        for s in wanted:
            if self._busy() >= self.remote.max_inflight:
                break
            self._start(s)

    def _run(self) -> None:
        background = iter(range(self.n))
        while True:
            seen = self.core.gate_prepare()  # before looking: a change after it wakes us
            with self._mu:
                if self._closed:
                    return
                if not self.bounded and len(self._settled) >= self.n:
                    return  # every shard local or failed
                following = bool(self._followers)
            try:
                self._serve_records()
                if self.bounded:
                    self._turn_bounded()
                else:
                    self._turn_unbounded(background)
            except RemoteError:  # closed meanwhile
                pass
            # Woken by a demand, a settled download or close(); a fetcher that follows
            # loaders also looks again every TURN, as they move on, and so does one with
            # records waiting for RANGE_AFTER.
            busy = following or self.bounded or bool(self._range_wait)
            self.core.gate_wait(seen, self.TURN if busy else 5.0)

    def ensure(self, s: int) -> None:
        t0 = time.monotonic()
        try:
            fut = self._start(s)
            if fut is not None:
                fut.exception()  # waits; the callback settles it
                self._settle(s, fut)  # (in case the callback has not run yet)
        finally:
            with self._mu:
                self.ensure_wait += time.monotonic() - t0
        with self._mu:
            exc = self._settled.get(s)
        if exc is not None:
            if isinstance(exc, RemoteError):
                raise RemoteError(str(exc))
            raise RemoteError(f"{self.cache.url(s)}: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        with self._mu:
            if self._closed:
                return
            self._closed = True
        self.core.gate_notify()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._range_pool.shutdown(wait=False, cancel_futures=True)
        for s in range(self.n):  # a reader still waiting must not wait forever
            self.core.fail(s, f"{self.cache.url(s)}: the dataset was closed")
