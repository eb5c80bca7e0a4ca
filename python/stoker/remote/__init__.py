"""Datasets that live at a URL (``s3://``, ``https://``, any fsspec URL), read through a
local shard cache shared by the processes of a node.

``stoker.Dataset("s3://bucket/train", cache_dir=..., cache_limit="50GB")`` fetches
``index.json``, then the shards into the cache (:class:`ShardCache`, protocol in
NOTE [ Shard cache protocol ] of :mod:`.cache`), and opens them from there. Today the core
maps every shard when a dataset opens, so a remote dataset is opened once all its shards
are local (downloaded in parallel, in shard order) and they stay pinned while it is open;
``cache_limit`` must then hold the whole dataset. The cache itself already serves readers
that fetch shards as they go (:meth:`ShardCache.prefetch`, :meth:`ShardCache.path`,
:meth:`ShardCache.release`) under a limit smaller than the dataset.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import threading
import time
from typing import Any, Dict, Optional, Sequence, Union

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


# No silent warm-up: a download still running after this many seconds is reported on the
# "stoker" logger, then every _REPORT_EVERY seconds until it is done.
_REPORT_AFTER = 2.0
_REPORT_EVERY = 10.0


class _DownloadNotice:
    """While the shards of ``url`` download (the caller blocks), says how far they are once
    it takes longer than ``_REPORT_AFTER`` seconds, from a thread that only waits."""

    def __init__(self, url: str, cache: "ShardCache", total_shards: int, total_bytes: int):
        self.url, self.cache = url, cache
        self.total_shards, self.total_bytes = total_shards, total_bytes
        self.local = 0
        self.reported = False
        self._done = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="stoker-fetch-notice",
                                        daemon=True)

    def __enter__(self) -> "_DownloadNotice":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join()
        if self.reported and exc[0] is None:
            logging.getLogger("stoker").info(
                "stoker: %s: %d shards local after %.1f s", self.url, self.total_shards,
                time.monotonic() - self._t0)

    def _run(self) -> None:
        wait = _REPORT_AFTER
        while not self._done.wait(wait):
            st = self.cache.stats()
            logging.getLogger("stoker").info(
                "stoker: opening %s: %s %d of %d shards local (%.3g of %.3g MB downloaded by "
                "this process) after %.1f s", self.url,
                "still downloading," if self.reported else "downloading the shards into the "
                "cache,", self.local, self.total_shards, st["bytes_downloaded"] / 1e6,
                self.total_bytes / 1e6, time.monotonic() - self._t0)
            self.reported = True
            wait = _REPORT_EVERY


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
        tag = hashlib.sha1(self.url.encode()).hexdigest()[:16]
        ver = hashlib.sha1(self.index_bytes).hexdigest()[:12]
        self.local_dir = os.path.join(self.cache_dir, "datasets", f"{tag}-{ver}")
        self._pinned: Sequence[int] = ()

    def open_all(self, order: Optional[Sequence[int]] = None) -> str:
        """Fetches every shard (in ``order``, default shard order, ``max_inflight`` at a
        time), pins them, and returns a local directory that opens as the dataset."""
        from ..writer import INDEX_NAME

        n = len(self.cache)
        if self.cache_limit is not None and self.total_bytes > self.cache_limit:
            raise ValueError(
                f"{self.url}: the dataset ({self.total_bytes} bytes) is larger than "
                f"cache_limit ({self.cache_limit} bytes); the loader maps every shard at "
                "open, so the cache must hold them all")
        order = list(range(n)) if order is None else list(order)
        self.cache.prefetch(order)
        pinned = []
        try:
            with _DownloadNotice(self.url, self.cache, n, self.total_bytes) as notice:
                for i in order:
                    pinned.append(self.cache.path(i))
                    notice.local = len(pinned)
        except BaseException:
            for i in order[: len(pinned)]:
                self.cache.release(i)
            raise
        self._pinned = order
        os.makedirs(self.local_dir, exist_ok=True)
        for i, target in zip(order, pinned):
            link = os.path.join(self.local_dir, self.index["shards"][i]["path"])
            try:
                if os.readlink(link) == target:
                    continue  # already in place (renames cost on some file systems)
            except OSError:
                pass
            os.makedirs(os.path.dirname(link), exist_ok=True)
            tmp = f"{link}.{os.getpid()}.tmp"
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            os.symlink(target, tmp)
            os.replace(tmp, link)
        index_path = os.path.join(self.local_dir, INDEX_NAME)
        try:
            with open(index_path, "rb") as f:
                same = f.read() == self.index_bytes
        except OSError:
            same = False
        if not same:
            tmp = f"{index_path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(self.index_bytes)
            os.replace(tmp, index_path)
        return self.local_dir

    def stats(self) -> Dict[str, Any]:
        """The cache's counters (:meth:`ShardCache.stats`)."""
        return self.cache.stats()

    def close(self) -> None:
        """Drops the pins (the shards may be evicted) and stops fetching."""
        self.cache.close()

    def __repr__(self) -> str:
        return (f"stoker.remote.RemoteDataset({self.url!r}, {len(self.cache)} shards, "
                f"cache {self.cache_dir!r})")
