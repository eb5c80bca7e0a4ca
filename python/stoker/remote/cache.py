"""A local cache of remote shards, shared by every process of a node.

NOTE [ Shard cache protocol ]

::

    cache_dir/
      objects/<key>.stk        complete, verified shards (key: source URL hash, checksum, size)
      locks/<key>.lock         one download at a time per shard (flock, exclusive)
      tmp/<key>.<pid>.<n>.<size>.part   downloads in progress (flock'd by their writer)
      evict.lock               space accounting and eviction, one process at a time

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
  the ``.part`` names must fit ``cache_limit``; otherwise unpinned objects are evicted.
  Shards this cache prefetched and has not handed out yet are evicted only for a shard a
  reader is waiting for. If pinned shards leave no room, the download waits (up to
  ``timeout``) and then fails naming the limit.

Prefetching follows the order it is given (the loader's own future order), with at most
``max_inflight`` downloads at a time.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import os
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from .transport import PermanentError, Source, TransientError

__all__ = ["ShardCache", "RemoteError", "default_cache_dir"]

_SEQ = itertools.count()

# Exclusive flocks this process holds for a while: download locks, the .part files being
# written, the eviction lock. A fork copies their descriptors into the child, and a flock
# lasts while any copy is open: the child would hold the lock for as long as it lives
# (another process, the parent itself or the child waiting on it forever). Such files are
# opened and closed under _FD_LOCK, which a fork also takes, so the child knows exactly
# which of its descriptors are those copies, and closes them at once.
_HELD_LOCK_FDS: set = set()
_FD_LOCK = threading.Lock()


def _open_locked(path: str, flags: int) -> int:
    """os.open for a file this process will hold an exclusive flock on."""
    with _FD_LOCK:
        fd = os.open(path, flags, 0o644)
        _HELD_LOCK_FDS.add(fd)
        return fd


def _close_locked(fd: int) -> None:
    with _FD_LOCK:
        _HELD_LOCK_FDS.discard(fd)
        os.close(fd)


def _close_inherited_locks() -> None:
    for fd in list(_HELD_LOCK_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_LOCK_FDS.clear()
    _FD_LOCK.release()  # taken by the fork (before=)


os.register_at_fork(before=_FD_LOCK.acquire, after_in_parent=_FD_LOCK.release,
                    after_in_child=_close_inherited_locks)


class RemoteError(OSError):
    """A remote object could not be fetched; the message names its URL and the reason."""


def default_cache_dir() -> str:
    """``$STOKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/stoker``, else ``~/.cache/stoker``."""
    env = os.environ.get("STOKER_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "stoker")


def _flock(fd: int, op: int, timeout: float, what: str) -> None:
    """flock with a deadline (polls a non-blocking lock)."""
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:.0f} s for {what}") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


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
        cache_dir: the local directory; share it between the processes of a node.
        cache_limit: bytes the cache may hold (None: no limit).
        max_inflight: downloads at a time.
        retries: attempts after the first, with exponential backoff from ``backoff`` s.
        timeout: seconds to wait for another process's download or for room in the cache.
        durable: flush each download to disk before publishing it (costs ~30% of a cold
            fetch here); without it, a power failure right after a download can leave a
            short file, which the size check at every pin refetches, or a torn one, which
            the per-record checksums report by shard and record.
    """

    def __init__(self, source: Source, shards: Sequence[Dict[str, Any]], cache_dir: str, *,
                 cache_limit: Optional[int] = None, max_inflight: int = 4, retries: int = 4,
                 backoff: float = 0.25, timeout: float = 600.0, durable: bool = False):
        if max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {max_inflight}")
        self.source = source
        self.cache_dir = os.path.abspath(os.fspath(cache_dir))
        self.cache_limit = cache_limit
        self.retries, self.backoff, self.timeout = retries, backoff, timeout
        self.durable = durable
        for sub in ("objects", "locks", "tmp"):
            os.makedirs(os.path.join(self.cache_dir, sub), exist_ok=True)
        self._shards: List[_Shard] = []
        for i, s in enumerate(shards):
            url = source.object_url(s["path"])
            h = hashlib.sha1(url.encode()).hexdigest()[:20]
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
        self._pool = ThreadPoolExecutor(max_inflight, thread_name_prefix="stoker-fetch")
        self._closed = False
        self._stats = {"downloads": 0, "bytes_downloaded": 0, "cache_hits": 0,
                       "shared_hits": 0, "retries": 0, "evictions": 0,
                       "network_wait_seconds": 0.0, "download_seconds": 0.0}

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

    def release(self, shard: int) -> None:
        """Gives back one pin of ``shard``; with none left it may be evicted."""
        s = self._shards[shard]
        with self._mu:
            if s.refs <= 0:
                raise ValueError(f"shard {shard} is not pinned")
            s.refs -= 1
            if s.refs == 0 and s.fd is not None:
                os.close(s.fd)
                s.fd = None
                s.demanded = False
                self._space.notify_all()

    def stats(self) -> Dict[str, Any]:
        """``downloads``, ``bytes_downloaded``, ``cache_hits`` (shards found local),
        ``shared_hits`` (of those, fetched meanwhile by another process), ``retries``,
        ``evictions``, ``network_wait_seconds`` (readers blocked in :meth:`path`),
        ``download_seconds`` (time spent downloading, all threads)."""
        with self._mu:
            return dict(self._stats)

    def close(self) -> None:
        """Stops prefetching and drops every pin."""
        with self._mu:
            if self._closed:
                return
            self._closed = True
            self._space.notify_all()
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._mu:
            for s in self._shards:
                if s.fd is not None:
                    os.close(s.fd)
                    s.fd = None
                s.refs = 0

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

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the shard cache is closed")

    def _pin(self, s: _Shard) -> bool:
        """Takes a shared lock on the object; False if it is not there (or was evicted
        between open and lock)."""
        path = self._object(s)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            _flock(fd, fcntl.LOCK_SH, self.timeout, f"a lock on {path}")
            st = os.fstat(fd)
            try:
                linked = os.stat(path).st_ino == st.st_ino
            except FileNotFoundError:
                linked = False
            if not linked or st.st_size != s.size:
                os.close(fd)
                return False
            os.utime(fd)  # the eviction order: least recently pinned first
        except BaseException:
            os.close(fd)
            raise
        with self._mu:
            if s.fd is None:
                s.fd = fd
            else:
                os.close(fd)
        return True

    def _fetch(self, s: _Shard) -> None:
        """Makes ``s`` local and pinned (the body of prefetch and of path's own fetch)."""
        if self._closed:
            return
        if self._pin(s):
            with self._mu:
                self._stats["cache_hits"] += 1
                s.fresh = not s.demanded and s.refs == 0
            return
        lock_path = os.path.join(self.cache_dir, "locks", s.key + ".lock")
        lock_fd = _open_locked(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        try:
            try:
                _flock(lock_fd, fcntl.LOCK_EX, self.timeout,
                       f"another process's download of {self.url(s.index)}")
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
                try:
                    os.unlink(part)
                except FileNotFoundError:
                    pass
                _close_locked(part_fd)
                raise
            with self._mu:
                self._stats["download_seconds"] += time.monotonic() - t0
            if not self._publish(s, part, part_fd):
                raise RemoteError(f"{self.url(s.index)}: evicted right after its download; "
                                  "cache_limit is too small for the shards in use")
            with self._mu:
                s.fresh = not s.demanded and s.refs == 0
        finally:
            _close_locked(lock_fd)  # releases the download lock

    def _publish(self, s: _Shard, part: str, part_fd: int) -> bool:
        """Renames a finished download into ``objects/`` and pins it, under the eviction
        lock: eviction runs only under it, so no other download's room-making can take
        the object between its publication and its pin. Closes ``part_fd``."""
        evict_fd = _open_locked(os.path.join(self.cache_dir, "evict.lock"),
                                os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        try:
            try:
                _flock(evict_fd, fcntl.LOCK_EX, self.timeout, "the cache's eviction lock")
            except TimeoutError as e:
                _close_locked(part_fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(part)
                raise RemoteError(f"{self.url(s.index)}: {e}") from None
            try:
                try:
                    os.rename(part, self._object(s))
                except BaseException:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(part)
                    raise
                finally:
                    _close_locked(part_fd)  # its exclusive lock would refuse our pin
                return self._pin(s)
            finally:
                fcntl.flock(evict_fd, fcntl.LOCK_UN)
        finally:
            _close_locked(evict_fd)

    def _download(self, s: _Shard, fd: int) -> None:
        from .. import _core

        url = self.url(s.index)
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                with self._mu:
                    self._stats["retries"] += 1
                delay = self.backoff * (2 ** (attempt - 1))
                time.sleep(delay * (0.5 + random.random() / 2))
                if self._closed:
                    raise RemoteError(f"{url}: cache closed during the download")
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            digest = _core.Checksum32()
            n = 0

            def sink(chunk: bytes, digest=digest) -> None:
                nonlocal n
                digest.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
                n += len(chunk)
                if n > s.size:
                    raise TransientError(f"body longer than the {s.size} bytes index.json "
                                         "gives")

            try:
                self.source.stream(s.name, sink)
            except TransientError as e:
                last = str(e)
                continue
            except PermanentError as e:
                raise RemoteError(f"{url}: {e}") from None
            finally:
                with self._mu:
                    self._stats["bytes_downloaded"] += n
            if n != s.size:
                last = f"got {n} bytes, index.json gives {s.size}"
                continue
            got = digest.digest()
            if s.checksum is not None and got != s.checksum:
                last = (f"checksum {got:08x} differs from index.json's {s.checksum:08x}")
                continue
            if self.durable:
                os.fdatasync(fd)
            with self._mu:
                self._stats["downloads"] += 1
            return
        raise RemoteError(f"{url}: {last} (after {self.retries + 1} attempts)")

    def _reserve(self, s: _Shard):
        """Room for ``s`` under cache_limit; returns (fd, path) of its locked .part file."""
        tmp_dir = os.path.join(self.cache_dir, "tmp")
        part = os.path.join(tmp_dir, f"{s.key}.{os.getpid()}.{next(_SEQ)}.{s.size}.part")
        evict_fd = _open_locked(os.path.join(self.cache_dir, "evict.lock"),
                                os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                _flock(evict_fd, fcntl.LOCK_EX, self.timeout, "the cache's eviction lock")
                try:
                    if self._make_room(s):
                        fd = _open_locked(part, os.O_RDWR | os.O_CREAT | os.O_EXCL |
                                          os.O_CLOEXEC)  # _fetch closes it
                        fcntl.flock(fd, fcntl.LOCK_EX)
                        return fd, part
                finally:
                    fcntl.flock(evict_fd, fcntl.LOCK_UN)
                with self._mu:
                    if self._closed:
                        raise RemoteError(f"{self.url(s.index)}: cache closed")
                    if time.monotonic() > deadline:
                        raise RemoteError(
                            f"{self.url(s.index)}: no room in the cache ({self.cache_dir}, "
                            f"cache_limit {self.cache_limit} bytes) for {s.size} bytes: the "
                            f"rest is held by readers; raise cache_limit")
                    self._space.wait(0.05)
        finally:
            _close_locked(evict_fd)

    def _make_room(self, s: _Shard) -> bool:
        """Under the eviction lock: True once ``s`` fits, evicting what may go. Deletes the
        ``.part`` files of killed downloads on the way."""
        used = 0
        tmp_dir = os.path.join(self.cache_dir, "tmp")
        with os.scandir(tmp_dir) as entries:
            parts = [e for e in entries if e.name.endswith(".part")]
        for e in parts:
            try:
                fd = os.open(e.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # published (renamed into objects/) since the listing
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass  # a download in flight: its size counts below
                else:
                    # Unlocked: either its writer was killed, or it finished and renamed
                    # the file between our open and our lock (then the name is gone).
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(e.path)
                    continue
            finally:
                os.close(fd)
            try:
                used += int(e.name.rsplit(".", 2)[-2])
            except ValueError:
                with contextlib.suppress(FileNotFoundError):
                    used += e.stat().st_size
        if self.cache_limit is None:
            return True
        objects = []
        obj_dir = os.path.join(self.cache_dir, "objects")
        with os.scandir(obj_dir) as listing:
            entries = list(listing)
        for e in entries:
            try:
                st = e.stat()
            except FileNotFoundError:
                continue
            used += st.st_size
            objects.append((st.st_mtime, e.path, st.st_size))
        need = used + s.size - self.cache_limit
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
                        os.close(x.fd)
                        x.fd, x.fresh = None, False
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # pinned by another process
            try:
                os.unlink(path)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    raise
            finally:
                os.close(fd)
            with self._mu:
                self._stats["evictions"] += 1
            need -= size
            if need <= 0:
                return True
        return False
