"""Datasets that live at a URL (``s3://``, ``https://``, any fsspec URL), read through a
local shard cache shared by the processes of a node.

``stoker.Dataset("s3://bucket/train", cache_dir=..., cache_limit="50GB")`` fetches
``index.json`` and returns: the shards download into the cache (:class:`ShardCache`,
protocol in NOTE [ Shard cache protocol ] of :mod:`.cache`) while the dataset is in use.
The C++ dataset is opened with deferred shards (NOTE [ Deferred shards ] in
``csrc/format/dataset.h``): a read waits until its shard is local. :class:`RemoteDataset`'s
fetcher thread downloads the shards that readers wait for first (a loader's workers read
``prefetch`` batches ahead, so that is the sampler's own future order), and the rest in
shard order in the background, ``max_inflight`` at a time. Shards stay pinned while the
dataset is open, so ``cache_limit`` must hold the dataset; the cache itself serves readers
that release shards as they go (:meth:`ShardCache.path`, :meth:`ShardCache.release`)
under a smaller limit.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, Iterable, Optional, Union

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

    def check_fits(self) -> None:
        """Raises ValueError if the dataset is larger than ``cache_limit``: a dataset keeps
        the shards it has read pinned while it is open."""
        if self.cache_limit is not None and self.total_bytes > self.cache_limit:
            raise ValueError(
                f"{self.url}: the dataset ({self.total_bytes} bytes) is larger than "
                f"cache_limit ({self.cache_limit} bytes); an open dataset keeps the shards "
                "it has read pinned, so the cache must hold them all")

    def start(self, core: Any) -> None:
        """Starts feeding ``core``, a ``_core.Dataset`` opened with deferred shards whose
        paths are :meth:`ShardCache.object_path`: the fetcher thread (:class:`_Fetcher`)."""
        with self._lock:
            if self._fetcher is not None:
                raise RuntimeError("this remote dataset is already being fetched")
            self._core = core
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
        :meth:`ensure`)."""
        st = self.cache.stats()
        fetcher = self._fetcher
        if fetcher is not None:
            st["network_wait_seconds"] = fetcher.ensure_wait + fetcher.core.gate_wait_seconds
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
    ``csrc/format/dataset.h``).

    It sleeps on the core's gate event. Shards that readers wait for (``core.demands()``,
    and :meth:`ensure`) start ahead of the background ones, with ``max_inflight`` pool
    threads beyond those the background uses; otherwise it keeps ``max_inflight``
    background downloads going, in shard order. Each download is
    :meth:`ShardCache.path` in a pool thread (one download per shard per node, pinned once
    local); when it finishes, the shard is provided to the core, or failed with the
    :class:`RemoteError`'s message, which the reader raises in the iterating thread."""

    def __init__(self, remote: RemoteDataset, core: Any):
        self.remote, self.cache, self.core = remote, remote.cache, core
        self.n = len(remote.cache)
        self.ensure_wait = 0.0
        self.pid = os.getpid()  # its threads live in this process (RemoteDataset.serve_here)
        self._mu = threading.Lock()
        self._inflight: Dict[int, Future] = {}
        self._settled: Dict[int, Optional[BaseException]] = {}  # shard -> its error or None
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
        self._thread = threading.Thread(target=self._run, name="stoker-fetcher", daemon=True)
        self._thread.start()

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

    def _run(self) -> None:
        background = iter(range(self.n))
        while True:
            seen = self.core.gate_prepare()  # before looking: a change after it wakes us
            with self._mu:
                if self._closed or len(self._settled) >= self.n:
                    return  # closed, or every shard local or failed
            for s in self.core.demands():
                self._start(s)
            while True:
                with self._mu:
                    busy = len(self._inflight)
                if busy >= self.remote.max_inflight:
                    break
                s = next(background, None)
                if s is None:
                    break
                self._start(s)
            # Woken by a demand, a settled download or close(); the timeout only bounds
            # a missed wake-up.
            self.core.gate_wait(seen, 5.0)

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
        for s in range(self.n):  # a reader still waiting must not wait forever
            self.core.fail(s, f"{self.cache.url(s)}: the dataset was closed")
