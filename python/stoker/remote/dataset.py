"""A dataset at a URL: its ``index.json``, its shard cache and its fetcher
(:class:`RemoteDataset`, what ``stoker.Dataset(url)`` holds as ``ds.remote``).

NOTE [ Bounded cache ]

Every remote dataset's C++ dataset is opened releasable (NOTE [ Released shards ] in
``csrc/format/shard_gate.h``): it keeps what its share of the cache directory allows
(NOTE [ Cache budget ] in :mod:`.space`) and gives the rest back, in the order the fetch
plan walks (NOTE [ Fetch plan ] in ``csrc/sampler/fetch_plan.h``): shards in use, then the
schedules of the loaders that follow it, cut where their bytes would pass the share. A
dataset alone on a directory without a ``cache_limit`` has no budget: every shard is
downloaded once and kept while it is open. One whose ``cache_limit`` is smaller than the
dataset is *bounded*: a loader reads it with ``shuffle=False`` or with ``shard_window``,
since a global shuffle reads every shard in every batch, which no cache smaller than the
dataset can serve (the Loader says so when made).

NOTE [ Remote datasets across fork ]

A forked child (a ``DataLoader`` worker, say) inherits the dataset but not its threads,
and its copies of the parent's lock descriptors are closed at once (NOTE [ Locks across
fork ] in :mod:`.space`). After the fork, in the child: the dataset's lock is new, the
parent's fetcher and cache are dropped (never used, never closed), and the C++ gate holds
no pin and no demand (NOTE [ Gate across fork ]). The child's first read starts its own
cache (a new holder of the same directory: the parent's downloads are found there) and
fetcher (:meth:`RemoteDataset.serve_here`), which pins what is local and gives back what
is not.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import weakref
from typing import Any, Dict, Iterable, Iterator, List, Optional, Union

from .._index import INDEX_NAME, parse_index, parse_size
from .cache import ShardCache, default_cache_dir
from .fetcher import Fetcher
from .retry import CancelToken, Retry
from .transport import PermanentError, RemoteError, Source, TransientError, open_source

__all__ = ["RemoteDataset", "fetch_bytes"]

_REMOTES: "weakref.WeakSet[RemoteDataset]" = weakref.WeakSet()


def _forked() -> None:
    for remote in list(_REMOTES):
        remote._inherited()


def _close_all() -> None:
    """At exit: nothing waits on the network (transfers are cancelled, then waited for
    at most a second each)."""
    for remote in list(_REMOTES):
        try:
            remote.close()
        except Exception:
            pass


os.register_at_fork(after_in_child=_forked)
atexit.register(_close_all)


def fetch_bytes(source: Source, name: str, *, retries: Optional[int] = None,
                backoff: Optional[float] = None, retry: Optional[Retry] = None,
                cancel: Optional[CancelToken] = None) -> bytes:
    """A whole (small) object, under the retry budget ``retry``."""
    policy = Retry.of(retry).replace(retries=retries, backoff=backoff)
    return policy.run(lambda: source.read(name, cancel=cancel), source.object_url(name),
                      transient=TransientError, permanent=PermanentError, error=RemoteError,
                      cancel=cancel)


class RemoteDataset:
    """``index.json`` and shard cache of one dataset URL (what ``stoker.Dataset(url)``
    holds as ``ds.remote``).

    Args:
        url: the dataset's URL (its directory, or its ``index.json``).
        cache_dir: local cache directory (default :func:`default_cache_dir`), shared by
            every dataset and process that names it.
        cache_limit: bytes or a size string (``"50GB"``); None: no limit of its own. The
            directory's budget is the smallest cache_limit of the datasets open on it
            (NOTE [ Cache budget ]).
        storage_options: passed to the transport (``endpoint_url``, credentials, headers).
        max_inflight: downloads at a time (reads waiting for a shard start beyond it).
        retry: the retry budget (:class:`Retry`, a dict of its arguments, or an int:
            retries); ``retries`` overrides its count.
        timeout: seconds to wait for another process's download or for room in the cache.
        stall_timeout: seconds a transfer may receive nothing before it counts as stalled
            (and is retried, then reported with the URL and the bytes received).
    """

    def __init__(self, url: str, *, cache_dir: Optional[Union[str, os.PathLike]] = None,
                 cache_limit: Union[int, str, None] = None,
                 storage_options: Optional[Dict[str, Any]] = None, max_inflight: int = 4,
                 retries: Optional[int] = None, timeout: float = 600.0,
                 retry: Union[None, int, Dict[str, Any], Retry] = None,
                 stall_timeout: float = 30.0):
        if not isinstance(stall_timeout, (int, float)) or isinstance(stall_timeout, bool) or \
                stall_timeout <= 0:
            raise ValueError(f"stall_timeout must be a positive number of seconds, got "
                             f"{stall_timeout!r}")
        self.max_inflight = max_inflight
        self.retry = Retry.of(retry).replace(retries=retries)
        self.timeout = timeout
        self.stall_timeout = float(stall_timeout)
        root = url[: -len(INDEX_NAME)] if url.endswith("/" + INDEX_NAME) else url
        self.url = root.rstrip("/")
        self.cache_dir = os.path.abspath(os.fspath(cache_dir or default_cache_dir()))
        self.cache_limit = None if cache_limit is None else parse_size(cache_limit)
        self.source = open_source(self.url, timeout=self.stall_timeout,
                                  storage_options=storage_options)
        self.index_bytes = fetch_bytes(self.source, INDEX_NAME, retry=self.retry)
        index_url = self.source.object_url(INDEX_NAME)
        self.parsed = parse_index(self.index_bytes, index_url)
        self.index = self.parsed.raw
        shards = self.index["shards"]
        self.total_bytes = sum(s["bytes"] for s in shards)
        self.cache = self._new_cache()
        self._lock = threading.Lock()
        self._fetcher: Optional[Fetcher] = None
        self._core: Any = None
        self._pid = os.getpid()
        _REMOTES.add(self)

    def _new_cache(self) -> ShardCache:
        return ShardCache(self.source, self.index["shards"], self.cache_dir,
                          cache_limit=self.cache_limit, max_inflight=self.max_inflight,
                          retry=self.retry, timeout=self.timeout, url=self.url)

    @property
    def bounded(self) -> bool:
        """Whether ``cache_limit`` is smaller than the dataset (NOTE [ Bounded cache ])."""
        return self.cache_limit is not None and self.total_bytes > self.cache_limit

    def window_need(self, shard_window: Optional[int]) -> int:
        """Bytes a loader with this shard window may need at once: its window's largest
        shards (one shard without a window)."""
        sizes = sorted((s["bytes"] for s in self.index["shards"]), reverse=True)
        return sum(sizes[: shard_window or 1])

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
        need = self.window_need(shard_window)
        if need > self.cache_limit:
            raise ValueError(
                f"{self.url}: shard_window={shard_window} may need {need} bytes of shards at "
                f"once (its largest shards), more than cache_limit ({self.cache_limit} bytes); "
                "use a smaller shard_window or a larger cache_limit")

    def follow(self, core: Any, producer: Any, world_size: int,
               shard_window: Optional[int] = None, source: Optional[int] = None) -> Fetcher:
        """Downloads ahead of a loader (its core and record producer: the shards the rest
        of its epoch reads, then the next one's), for as long as it lives; returns the
        fetcher that follows it. ``source``: this dataset is that source of the loader's
        record mixture (``producer``), whose stream of passes is followed."""
        self.serve_here()
        fetcher = self._fetcher
        if fetcher is None:
            raise RemoteError(f"{self.url}: this remote dataset is not open")
        fetcher.follow(core, producer, world_size, self.window_need(shard_window), source)
        return fetcher

    @contextlib.contextmanager
    def holding(self, shards: Iterable[int]) -> Iterator[None]:
        """Makes ``shards`` local and keeps them so (not given back) while the block runs:
        for reads outside a loader."""
        shards = [int(s) for s in shards]
        self.serve_here()
        fetcher = self._fetcher
        if fetcher is None:
            raise RemoteError(f"{self.url}: this remote dataset is not open")
        fetcher.hold(shards, +1)
        held = []
        try:
            for s in shards:
                self._core.hold(s)  # no release from here on: then make it local
                held.append(s)
                fetcher.ensure(s)
            yield
        finally:
            for s in held:
                self._core.unhold(s)
            fetcher.hold(shards, -1)

    def start(self, core: Any, schema_hash: int) -> None:
        """Starts feeding ``core``, a ``_core.Dataset`` opened with deferred shards whose
        paths are :meth:`ShardCache.object_path`: the fetcher thread (:class:`Fetcher`).
        ``schema_hash`` is the dataset's (it checks tables fetched by range)."""
        with self._lock:
            if self._fetcher is not None:
                raise RuntimeError("this remote dataset is already being fetched")
            self._core = core
            self.schema_hash = schema_hash
            self._fetcher = self._new_fetcher(core)

    def _new_fetcher(self, core: Any) -> Fetcher:
        return Fetcher(core, self.cache, self.index, self.retry, self.max_inflight,
                       self.schema_hash)

    def serve_here(self) -> None:
        """In a forked child, starts this process's own cache and fetcher (NOTE [ Remote
        datasets across fork ]). A no-op in the process that opened the dataset, and
        once done."""
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            self.cache = self._new_cache()
            if self._core is not None:
                self._fetcher = self._new_fetcher(self._core)
            self._pid = os.getpid()

    def _inherited(self) -> None:
        """Right after a fork, in the child (its only thread): NOTE [ Remote datasets
        across fork ]."""
        self._lock = threading.Lock()
        self._fetcher = None  # the parent's: its threads are not here

    def keep(self, shards: Iterable[int]) -> None:
        """Makes ``shards`` local and keeps them so for as long as the dataset is open
        (never given back): for readers outside the loaders that read any shard at any
        time (a TokenDataset's documents). Raises :class:`RemoteError`."""
        shards = [int(s) for s in shards]
        self.serve_here()
        fetcher = self._fetcher
        if fetcher is None:
            raise RemoteError(f"{self.url}: this remote dataset is not open")
        fetcher.hold(shards, +1)
        for s in shards:
            self._core.hold(s)
        for s in shards:
            fetcher.ensure(s)

    def ensure(self, shards: Iterable[int]) -> None:
        """Makes ``shards`` local now, in the calling thread, for reads outside a loader
        (``ds[i]``, :meth:`stoker.Dataset.verify`). Raises :class:`RemoteError`."""
        with self.holding(shards):
            pass

    def fetch_all(self) -> List[str]:
        """Makes every shard local, each pinned in the cache until :meth:`release_all`,
        and returns their paths (a dataset read whole into memory:
        ``stoker.Dataset(url, preload=True)``). Raises :class:`RemoteError`."""
        return [self.cache.path(s) for s in range(len(self.cache))]

    def release_all(self) -> None:
        """Gives back every pin :meth:`fetch_all` took."""
        for s in range(len(self.cache)):
            while self.cache.pinned(s):
                self.cache.release(s)

    def stats(self) -> Dict[str, Any]:
        """The cache's counters (:meth:`ShardCache.stats`), with ``network_wait_seconds``
        the time readers spent waiting for shards to download, waits in progress included
        (a loader's workers, and :meth:`ensure`), ``range_records``/``range_bytes`` the
        records (and their bytes) fetched by range ahead of their shards (NOTE [ Records
        by range ]),
        ``failed_downloads`` (each after its retries), ``released`` (shards given back),
        and the fetcher thread's ``fetcher_turns`` and ``fetcher_cpu_seconds``."""
        st = self.cache.stats()
        fetcher = self._fetcher
        if fetcher is not None:
            st.update(fetcher.stats())
        return st

    def close(self) -> None:
        """Stops fetching and drops the pins (the shards may be evicted): transfers in
        flight are cancelled and waited for at most a second; readers still waiting for a
        shard get a :class:`RemoteError`. Afterwards the cache directory holds no pin and
        no partial file of this dataset."""
        if self._pid != os.getpid():
            return  # inherited from the parent, never served here: nothing of ours
        fetcher = self._fetcher
        if fetcher is not None:
            fetcher.close()
        self.cache.close()

    def __repr__(self) -> str:
        return (f"stoker.remote.RemoteDataset({self.url!r}, {len(self.cache)} shards, "
                f"cache {self.cache_dir!r})")
