"""A local cache of remote shards, shared by every process of a node.

NOTE [ Shard cache protocol ]

::

    cache_dir/
      objects/<key>.stk        complete, verified shards (key: source URL hash, checksum, size)
      locks/<key>.lock         one download at a time per shard (flock, exclusive)
      tmp/<key>.<pid>.<n>.<size>.part   downloads in progress (flock'd by their writer)
      evict.lock               space accounting and eviction, one process at a time
      holders/<pid>.<n>.json   the datasets using the directory (NOTE [ Cache budget ] in
                               :mod:`.space`)

- A download goes to ``tmp/``, is checked against the size and checksum of ``index.json``
  (low 32 bits of XXH3-64 over the whole file, computed as the bytes arrive), and only
  then renamed into ``objects/`` (flushed first with ``durable=True``) and pinned by its
  downloader, both under ``evict.lock``, so that no other download's room-making can evict
  it in between. A file in
  ``objects/`` is therefore always complete; a killed download leaves a ``.part`` file
  that nobody reads and that the next space scan deletes (its writer's flock is gone).
- Per shard, the first process to take ``locks/<key>.lock`` downloads; the others wait on
  the lock and then find the object: one download per shard per node.
- A reader pins a shard by holding a shared flock on its object while it uses it.
  Eviction (least recently pinned first) takes an exclusive, non-blocking flock before
  unlinking, so a pinned shard is never removed. A pin checks that the file it locked is
  still linked; if eviction won the race, the shard is fetched again.
- Space: before a download, under ``evict.lock``, the objects plus the sizes announced by
  the ``.part`` names must fit the directory's budget (the smallest ``cache_limit`` of the
  datasets using it: NOTE [ Cache budget ]); otherwise unpinned objects are evicted.
  Shards this cache prefetched and has not handed out yet are evicted only for a shard a
  reader is waiting for. If pinned shards leave no room, the download waits for the other
  holders to give back what is beyond their share, and fails with the numbers when their
  needs together exceed the budget (or after ``timeout``).
- Every descriptor that carries a lock (pins included) is closed in a forked child
  (NOTE [ Locks across fork ] in :mod:`.space`); a cache inherited by a child is closed
  there (its owner opens a new one: RemoteDataset.serve_here).
- ``close()`` cancels the downloads in flight (their sockets are shut down), waits for
  them at most :attr:`ShardCache.CLOSE_WAIT` seconds, and leaves no pin and no ``.part``
  file of its own behind.

Prefetching follows the order it is given (the loader's own future order), with at most
``max_inflight`` downloads at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import os
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from ._threads import DaemonPool
from .private import check_dir, fallback_dir
from .retry import Cancelled, CancelToken, Retry
from .space import CacheDirectory, Holder, close_locked, flock, open_locked
from .transport import PermanentError, RemoteError, Source, TransientError, download_to_fd

__all__ = ["ShardCache", "RemoteError", "default_cache_dir"]

_SEQ = itertools.count()
_CACHES: "weakref.WeakSet[ShardCache]" = weakref.WeakSet()


def _forked() -> None:
    for cache in list(_CACHES):
        cache._inherited()


os.register_at_fork(after_in_child=_forked)


def default_cache_dir() -> str:
    """``$STOKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/stoker``, else ``~/.cache/stoker``."""
    env = os.environ.get("STOKER_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "stoker")


class _Shard:
    __slots__ = ("index", "name", "size", "checksum", "key", "future", "demanded", "refs",
                 "fd", "fresh")

    def __init__(self, index: int, name: str, size: int, checksum: Optional[int], key: str):
        self.index, self.name, self.size, self.checksum, self.key = (index, name, size,
                                                                     checksum, key)
        self.future: Optional[Future] = None
        self.demanded = False   # a reader waits for it: may evict prefetched shards
        self.refs = 0           # pins handed out by path()
        self.fd: Optional[int] = None
        self.fresh = False      # prefetched by this cache, not handed out yet


class ShardCache:
    """Shards of one remote dataset, fetched into a local directory on demand or ahead.

    Example::

        cache = ShardCache(source, index["shards"], "/local/cache", cache_limit=50 * 10**9)
        cache.prefetch([3, 0, 7])          # shard ids in the order they will be read
        path = cache.path(3)               # blocks until shard 3 is local; pins it
        ...                                # read it (mmap)
        cache.release(3)                   # may now be evicted
        cache.stats()

    Args:
        source: where the shards are (:func:`stoker.remote.transport.open_source`).
        shards: the ``index.json`` shard entries (``path``, ``bytes``, ``checksum``).
        cache_dir: the local directory; share it between the processes of a node (one
            user's: NOTE [ Private cache directory ] in :mod:`.private`).
        cache_limit: bytes this dataset allows the directory to hold (None: no limit of
            its own); the directory's budget is the smallest of its users' (NOTE
            [ Cache budget ]).
        max_inflight: downloads at a time.
        retries, backoff: shorthands for ``retry``'s fields.
        retry: the retry budget (:class:`stoker.remote.Retry`).
        timeout: seconds to wait for another process's download or for room in the cache.
        durable: flush each download to disk before publishing it (costs ~30% of a cold
            fetch here); without it, a power failure right after a download can leave a
            short file, which the size check at every pin refetches, or a torn one, which
            the per-record checksums report by shard and record.
        url: the dataset's URL, for the directory's record of its users.
    """

    #: Seconds close() waits for downloads in flight to end once cancelled.
    CLOSE_WAIT = 1.0

    def __init__(self, source: Source, shards: Sequence[Dict[str, Any]], cache_dir: str, *,
                 cache_limit: Optional[int] = None, max_inflight: int = 4,
                 retries: Optional[int] = None, backoff: Optional[float] = None,
                 timeout: float = 600.0, durable: bool = False, retry: Optional[Retry] = None,
                 url: Optional[str] = None):
        if max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {max_inflight}")
        self.source = source
        self.cache_dir = os.path.abspath(os.fspath(cache_dir))
        why = check_dir(self.cache_dir)  # NOTE [ Private cache directory ] in private.py
        if why is not None:
            self.cache_dir = fallback_dir(self.cache_dir, why)
        self.cache_limit = cache_limit
        self.retry = Retry.of(retry).replace(retries=retries, backoff=backoff)
        self.timeout = timeout
        self.durable = durable
        self.directory = CacheDirectory(self.cache_dir)
        self._shards: List[_Shard] = []
        for i, s in enumerate(shards):
            url_i = source.object_url(s["path"])
            h = hashlib.sha1(url_i.encode()).hexdigest()[:20]
            crc = s.get("checksum")
            key = f"{h}-{'x' if crc is None else f'{crc:08x}'}-{s['bytes']}"
            self._shards.append(_Shard(i, s["path"], int(s["bytes"]), crc, key))
        counts = [s.get("num_records") for s in shards]
        self._starts = (np.cumsum([0] + counts) if all(type(c) is int for c in counts)
                        else None)
        if cache_limit is not None:
            big = max((s.size for s in self._shards), default=0)
            if big > cache_limit:
                raise ValueError(f"cache_limit {cache_limit} bytes is smaller than the largest "
                                 f"shard ({big} bytes)")
        self._mu = threading.Lock()
        self._space = threading.Condition(self._mu)
        self.cancel = CancelToken()
        self._pool = DaemonPool(max_inflight, "stoker-prefetch")
        self._parts: set = set()  # .part files this cache is writing
        self._held = 0  # bytes pinned
        self._closed = False
        self._pid = os.getpid()
        self._stats = {"downloads": 0, "bytes_downloaded": 0, "cache_hits": 0,
                       "shared_hits": 0, "retries": 0, "evictions": 0,
                       "network_wait_seconds": 0.0, "download_seconds": 0.0}
        self.holder = Holder(self.directory, url or source.url, cache_limit)
        _CACHES.add(self)

    @property
    def retries(self) -> int:
        return self.retry.retries

    @retries.setter
    def retries(self, value: int) -> None:
        self.retry = self.retry.replace(retries=value)

    @property
    def backoff(self) -> float:
        return self.retry.backoff

    @backoff.setter
    def backoff(self, value: float) -> None:
        self.retry = self.retry.replace(backoff=value)

    # -- paths ---------------------------------------------------------------------------

    def _object(self, s: _Shard) -> str:
        return os.path.join(self.cache_dir, "objects", s.key + ".stk")

    def shards_for(self, indices: Iterable[int]) -> List[int]:
        """The shards holding global sample ``indices``, each once, in order of first need:
        what a loader passes to :meth:`prefetch` for its upcoming batches."""
        if self._starts is None:
            raise ValueError("the shard entries have no num_records")
        idx = np.asarray(list(indices), dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self._starts[-1]):
            raise IndexError(f"sample index out of range for {self._starts[-1]} samples")
        ids = np.searchsorted(self._starts, idx, side="right") - 1
        return list(dict.fromkeys(ids.tolist()))

    def object_path(self, shard: int) -> str:
        """Where ``shard`` is once local (it may not be yet; :meth:`path` waits and pins)."""
        return self._object(self._shards[shard])

    def url(self, shard: int) -> str:
        return self.source.object_url(self._shards[shard].name)

    def size(self, shard: int) -> int:
        return self._shards[shard].size

    def __len__(self) -> int:
        return len(self._shards)

    # -- public API ----------------------------------------------------------------------

    def prefetch(self, shards: Iterable[int]) -> None:
        """Starts fetching ``shards`` in this order (at most ``max_inflight`` at a time);
        returns at once. Shards already local or on their way are passed over."""
        with self._mu:
            self._check_open()
            for i in shards:
                s = self._shards[i]
                if s.future is None and s.fd is None:
                    s.future = self._pool.submit(self._fetch, s)

    def path(self, shard: int) -> str:
        """Blocks until ``shard`` is local, pins it (eviction passes it over until the
        matching :meth:`release`) and returns its local path. Raises :class:`RemoteError`
        naming the URL after the retries."""
        s = self._shards[shard]
        t0 = time.monotonic()
        waited = False
        while True:
            with self._mu:
                self._check_open()
                if s.fd is not None:
                    s.refs += 1
                    s.fresh = False
                    if waited:
                        self._stats["network_wait_seconds"] += time.monotonic() - t0
                    return self._object(s)
                s.demanded = True
                self._space.notify_all()
                fut = s.future
                if fut is None or fut.cancel():
                    fut = None  # not started: fetch here rather than queue behind prefetches
            waited = True
            if fut is None:
                try:
                    self._fetch(s)
                finally:
                    with self._mu:
                        s.future = None
            else:
                try:
                    fut.result()
                finally:
                    with self._mu:
                        if s.future is fut:
                            s.future = None

    def pin_if_local(self, shard: int) -> bool:
        """Pins ``shard`` as :meth:`path` does if it is in the cache already (a cache hit)
        and returns True; returns False, doing nothing, if it is not. Never downloads."""
        s = self._shards[shard]
        with self._mu:
            self._check_open()
            if s.fd is not None:
                s.refs += 1
                s.fresh = False
                return True
        if not self._pin(s):
            return False
        with self._mu:
            self._stats["cache_hits"] += 1
            s.refs += 1
            s.fresh = False
        return True

    def pinned(self, shard: int) -> int:
        """Pins of ``shard`` handed out by :meth:`path` and not released."""
        with self._mu:
            return self._shards[shard].refs

    def release(self, shard: int) -> None:
        """Gives back one pin of ``shard``; with none left it may be evicted."""
        s = self._shards[shard]
        with self._mu:
            if s.refs <= 0:
                raise ValueError(f"shard {shard} is not pinned")
            s.refs -= 1
            if s.refs == 0 and s.fd is not None:
                self._unpin_locked(s)
                s.demanded = False
                self._space.notify_all()
            held = self._held
        self.holder.update(held=held)

    def stats(self) -> Dict[str, Any]:
        """``downloads``, ``bytes_downloaded``, ``cache_hits`` (shards found local),
        ``shared_hits`` (of those, fetched meanwhile by another process), ``retries``,
        ``evictions``, ``network_wait_seconds`` (readers blocked in :meth:`path`),
        ``download_seconds`` (time spent downloading, all threads), and
        ``downloads_in_flight`` (downloads that have their room in the directory's budget
        now: the ``.part`` files this cache is writing)."""
        with self._mu:
            return dict(self._stats, downloads_in_flight=len(self._parts))

    def close(self) -> None:
        """Cancels the downloads in flight (waiting for them at most :attr:`CLOSE_WAIT`
        seconds) and drops every pin: afterwards the directory holds no pin and no
        ``.part`` file of this cache."""
        if os.getpid() != self._pid:
            return  # inherited by a fork: not ours to close (_inherited)
        with self._mu:
            if self._closed:
                return
            self._closed = True
            self._space.notify_all()
        self.cancel.cancel()
        self._pool.shutdown()
        self._pool.join(self.CLOSE_WAIT)
        with self._mu:
            for s in self._shards:
                if s.fd is not None:
                    self._unpin_locked(s)
                s.refs = 0
            parts, self._parts = list(self._parts), set()
        for part in parts:  # a download that did not end in time: its file goes anyway
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
        self.holder.close()

    def _inherited(self) -> None:
        """In a forked child: the parent's pins and locks were closed with their
        descriptors (:mod:`.space`); this cache is closed here, without touching them."""
        self._mu = threading.Lock()
        self._space = threading.Condition(self._mu)
        for s in self._shards:
            s.fd, s.refs, s.future = None, 0, None
        self._parts = set()
        self._held = 0
        self._closed = True

    def __enter__(self) -> "ShardCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- internals -----------------------------------------------------------------------

    def _unpin_locked(self, s: _Shard) -> None:
        assert s.fd is not None
        close_locked(s.fd)
        s.fd = None
        self._held -= s.size

    def _check_open(self) -> None:
        if self._closed:
            raise RemoteError(f"{self.source.url}: the shard cache is closed")

    def _pin(self, s: _Shard) -> bool:
        """Takes a shared lock on the object; False if it is not there (or was evicted
        between open and lock)."""
        path = self._object(s)
        try:
            fd = open_locked(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            flock(fd, fcntl.LOCK_SH, self.timeout, f"a lock on {path}", self.cancel)
            st = os.fstat(fd)
            try:
                linked = os.stat(path).st_ino == st.st_ino
            except FileNotFoundError:
                linked = False
            if not linked or st.st_size != s.size:
                close_locked(fd)
                return False
            os.utime(fd)  # the eviction order: least recently pinned first
        except BaseException:
            close_locked(fd)
            raise
        with self._mu:
            if s.fd is None and not self._closed:
                s.fd = fd
                self._held += s.size
                held = self._held
            else:
                close_locked(fd)
                if self._closed:
                    raise Cancelled()
                return True
        self.holder.update(held=held)
        return True

    def _fetch(self, s: _Shard) -> None:
        """Makes ``s`` local and pinned (the body of prefetch and of path's own fetch)."""
        self.cancel.check()
        if self._pin(s):
            with self._mu:
                self._stats["cache_hits"] += 1
                s.fresh = not s.demanded and s.refs == 0
            return
        lock_path = os.path.join(self.cache_dir, "locks", s.key + ".lock")
        lock_fd = open_locked(lock_path, os.O_RDWR | os.O_CREAT)
        try:
            try:
                flock(lock_fd, fcntl.LOCK_EX, self.timeout,
                      f"another process's download of {self.url(s.index)}", self.cancel)
            except TimeoutError as e:
                raise RemoteError(f"{self.url(s.index)}: {e}") from None
            if self._pin(s):  # another process fetched it while we waited
                with self._mu:
                    self._stats["cache_hits"] += 1
                    self._stats["shared_hits"] += 1
                    s.fresh = not s.demanded and s.refs == 0
                return
            part_fd, part = self._reserve(s)
            t0 = time.monotonic()
            try:
                self._download(s, part_fd)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(part)
                with self._mu:
                    self._parts.discard(part)
                close_locked(part_fd)
                raise
            with self._mu:
                self._stats["download_seconds"] += time.monotonic() - t0
            if not self._publish(s, part, part_fd):
                raise RemoteError(f"{self.url(s.index)}: evicted right after its download; "
                                  "cache_limit is too small for the shards in use")
            with self._mu:
                s.fresh = not s.demanded and s.refs == 0
        finally:
            close_locked(lock_fd)  # releases the download lock

    def _publish(self, s: _Shard, part: str, part_fd: int) -> bool:
        """Renames a finished download into ``objects/`` and pins it, under the eviction
        lock: eviction runs only under it, so no other download's room-making can take
        the object between its publication and its pin. Closes ``part_fd``."""
        evict_fd = open_locked(os.path.join(self.cache_dir, "evict.lock"),
                               os.O_RDWR | os.O_CREAT)
        try:
            try:
                flock(evict_fd, fcntl.LOCK_EX, self.timeout, "the cache's eviction lock",
                      self.cancel)
            except BaseException as e:
                close_locked(part_fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(part)
                with self._mu:
                    self._parts.discard(part)
                if isinstance(e, TimeoutError):
                    raise RemoteError(f"{self.url(s.index)}: {e}") from None
                raise
            try:
                try:
                    os.rename(part, self._object(s))
                except BaseException:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(part)
                    raise
                finally:
                    with self._mu:
                        self._parts.discard(part)
                    close_locked(part_fd)  # its exclusive lock would refuse our pin
                return self._pin(s)
            finally:
                fcntl.flock(evict_fd, fcntl.LOCK_UN)
        finally:
            close_locked(evict_fd)

    def _download(self, s: _Shard, fd: int) -> None:
        from .. import _core  # deferred: the cache is imported without the extension
        url = self.url(s.index)

        def attempt() -> None:
            def counted(n: int) -> None:
                with self._mu:
                    self._stats["bytes_downloaded"] += n

            download_to_fd(self.source, s.name, fd, s.size, s.checksum, self.cancel,
                           _core.Checksum32(), counted)

        def counted() -> None:
            with self._mu:
                self._stats["retries"] += 1

        self.retry.run(attempt, url, transient=TransientError, permanent=PermanentError,
                       error=RemoteError, cancel=self.cancel, on_retry=counted)
        if self.durable:
            os.fdatasync(fd)
        with self._mu:
            self._stats["downloads"] += 1

    def _reserve(self, s: _Shard):
        """Room for ``s`` under the directory's budget; returns (fd, path) of its locked
        .part file."""
        tmp_dir = os.path.join(self.cache_dir, "tmp")
        part = os.path.join(tmp_dir, f"{s.key}.{os.getpid()}.{next(_SEQ)}.{s.size}.part")
        evict_fd = open_locked(os.path.join(self.cache_dir, "evict.lock"),
                               os.O_RDWR | os.O_CREAT)
        deadline = time.monotonic() + self.timeout
        stuck_since: Optional[float] = None
        try:
            while True:
                flock(evict_fd, fcntl.LOCK_EX, self.timeout, "the cache's eviction lock",
                      self.cancel)
                try:
                    if self._make_room(s):
                        fd = open_locked(part, os.O_RDWR | os.O_CREAT | os.O_EXCL)
                        fcntl.flock(fd, fcntl.LOCK_EX)
                        with self._mu:
                            self._parts.add(part)
                        self.holder.update(starved=False)
                        return fd, part
                finally:
                    fcntl.flock(evict_fd, fcntl.LOCK_UN)
                self.holder.update(starved=True)  # the others give back beyond their share
                now = time.monotonic()
                holders = self.directory.holders()
                if self.directory.infeasible(holders):
                    stuck_since = stuck_since or now
                else:
                    stuck_since = None
                if (stuck_since is not None and now - stuck_since > self.directory.GRACE) or \
                        now > deadline:
                    self.holder.update(starved=False)
                    raise self.directory.no_room(
                        self.url(s.index), s.size, self.holder,
                        waited=None if stuck_since is not None else self.timeout)
                with self._mu:
                    if self._closed:
                        raise Cancelled()
                    self._space.wait(0.05)
        finally:
            close_locked(evict_fd)

    def _make_room(self, s: _Shard) -> bool:
        """Under the eviction lock: True once ``s`` fits the directory's budget, evicting
        what may go. Deletes the ``.part`` files of killed downloads on the way."""
        used, objects = self.directory.scan()
        budget = self.directory.budget()
        if budget is None:
            return True
        need = used + s.size - budget
        if need <= 0:
            return True
        with self._mu:
            demanded = s.demanded
            mine = {self._object(x): x for x in self._shards}
        for _, path, size in sorted(objects):
            x = mine.get(path)
            if x is not None:
                with self._mu:
                    if x.refs > 0:
                        continue  # a reader of this process holds it
                    if x.fd is not None:
                        # prefetched, not handed out yet: only a waiting reader may take it
                        if not (x.fresh and demanded):
                            continue
                        self._unpin_locked(x)
                        x.fresh = False
            if not self.directory.try_evict(path):
                continue  # pinned by another holder
            with self._mu:
                self._stats["evictions"] += 1
            need -= size
            if need <= 0:
                return True
        return False
