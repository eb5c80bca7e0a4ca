"""A cache directory's space and locks: the byte budget its users share, and the file
locks that must never outlive their owner (a close, or a fork).

NOTE [ Cache budget ]

The budget belongs to the directory, not to one dataset: every dataset open on it (in any
process of the node) records itself in ``holders/``::

    cache_dir/holders/<pid>.<n>.json    one per open dataset: flock'd (exclusive) by its
                                        process while it lives; says its URL, its
                                        cache_limit, and, at every fetcher turn, what it
                                        needs, pins and would like

- The directory's budget is the smallest ``cache_limit`` among the datasets open on it now
  (a dataset opened with ``cache_limit=None`` adds no limit); with none, there is no
  budget. Objects count once, however many processes pin them: the space check before a
  download counts the files in ``objects/`` and the downloads in ``tmp/``.
- Each holder's share (:func:`shares`): first what it *needs* (its loaders' windows: the
  largest ``shard_window`` shards of each, or what its readers use now if that is more),
  then the rest split evenly among the holders that *want* more (a dataset followed by a
  loader wants up to its whole size; an idle one only what it uses), a holder taking no
  more than it wants; what nobody wants is split evenly (a dataset alone on the directory
  may keep the whole budget). A fetcher keeps at most its share (NOTE [ Fetch plan ] in
  ``csrc/sampler/fetch_plan.h``) and gives the rest back, so that another holder's
  download finds room by evicting it.
- A holder whose download waits for room says so (``starved``). If the needs of all
  holders together exceed the budget, no sharing can help: after a grace period the
  waiting download fails with :class:`NoRoomError`, naming the directory, the budget,
  what each holder pins and needs, and the smallest budget that would work (the sum of
  the needs). A holder whose process died is found by its lock and its file removed.

NOTE [ Locks across fork ] (Python side)

A flock lives while any copy of its descriptor is open, and ``fork()`` copies every
descriptor: a child would hold its parent's download locks, eviction lock and pins (shared
locks that keep shards unevictable) for as long as it lives. So every descriptor that
carries a lock is opened through :func:`open_locked` and registered; ``os.register_at_fork``
takes the registry's lock across the fork and the child closes every registered
descriptor at once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from .private import open_own
from .retry import Cancelled, CancelToken
from .transport import RemoteError

__all__ = ["open_locked", "close_locked", "flock", "CacheDirectory", "Holder", "NoRoomError",
           "shares", "format_bytes"]

_SEQ = itertools.count()

# Descriptors of this process that carry a flock (NOTE [ Locks across fork ]).
_HELD_LOCK_FDS: set = set()
_FD_LOCK = threading.Lock()


def open_locked(path: str, flags: int) -> int:
    """os.open for a file this process will hold a flock on (exclusive or shared): the
    descriptor is closed in a forked child. Made owner-only; a file there that is not this
    user's own is never used (open_own: NOTE [ Private cache directory ] in private.py)."""
    with _FD_LOCK:
        fd = open_own(path, flags)
        _HELD_LOCK_FDS.add(fd)
        return fd


def close_locked(fd: int) -> None:
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


def flock(fd: int, op: int, timeout: float, what: str,
          cancel: Optional[CancelToken] = None) -> None:
    """flock with a deadline (polls a non-blocking lock): TimeoutError naming ``what``,
    :class:`Cancelled` once ``cancel`` is."""
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        if cancel is not None and cancel.wait(delay):
            raise Cancelled()
        if cancel is None:
            time.sleep(delay)
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:.0f} s for {what}") from None
            delay = min(delay * 2, 0.05)


def format_bytes(n: Optional[int]) -> str:
    if n is None:
        return "no limit"
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"


class NoRoomError(RemoteError):
    """The datasets sharing a cache directory need more than its budget."""


class Holder:
    """One open dataset's record in ``holders/`` (NOTE [ Cache budget ]). Closed in a
    forked child (its lock is not the child's); the child records itself anew."""

    RECORD = 1024  # bytes: rewritten in place with one pwrite

    def __init__(self, directory: "CacheDirectory", url: str, limit: Optional[int]):
        self.directory = directory
        self.pid = os.getpid()
        self.path = os.path.join(directory.holders_dir, f"{self.pid}.{next(_SEQ)}.json")
        # need, must, want: bytes, from its fetcher ("managed"); held: bytes it pins
        self.info: Dict[str, Any] = {"pid": self.pid, "url": url, "limit": limit, "need": 0,
                                     "must": 0, "held": 0, "want": 0, "starved": False,
                                     "managed": False}
        self._mu = threading.Lock()
        self._fd: Optional[int] = open_locked(self.path, os.O_RDWR | os.O_CREAT)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self._write()

    def _write(self) -> None:
        data = json.dumps(self.info).encode()
        if len(data) > self.RECORD:  # a very long URL: keep the numbers
            self.info["url"] = self.info["url"][:200] + "..."
            data = json.dumps(self.info).encode()
        if self._fd is not None:
            os.pwrite(self._fd, data.ljust(self.RECORD), 0)

    def update(self, **kw: Any) -> None:
        """Records new values (need, must, held, want: bytes; starved: bool)."""
        with self._mu:
            if self._fd is None or os.getpid() != self.pid:
                return
            if all(self.info.get(k) == v for k, v in kw.items()):
                return
            self.info.update(kw)
            self._write()

    def close(self) -> None:
        with self._mu:
            if self._fd is None or os.getpid() != self.pid:
                return
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            close_locked(self._fd)
            self._fd = None


def shares(holders: List[Dict[str, Any]], budget: int) -> List[int]:
    """Each holder's share of ``budget`` (NOTE [ Cache budget ]): its need first, then
    the rest split evenly among those that want more, none past what it wants. A pure
    function of its arguments."""
    alloc = [max(int(h.get("need", 0)), int(h.get("must", 0))) for h in holders]
    want = [max(a, int(h.get("want", 0))) for a, h in zip(alloc, holders)]
    extra = budget - sum(alloc)
    while extra > 0:
        hungry = [i for i in range(len(holders)) if want[i] > alloc[i]]
        if not hungry:
            break
        each = max(1, extra // len(hungry))
        for i in hungry:
            give = min(each, want[i] - alloc[i], extra)
            alloc[i] += give
            extra -= give
            if extra <= 0:
                break
    if extra > 0 and holders:  # room nobody wants: everyone may keep what it has
        for i in range(len(holders)):
            alloc[i] += extra // len(holders) + (1 if i < extra % len(holders) else 0)
    return alloc


class CacheDirectory:
    """The shared parts of a cache directory: its layout, its holders and their budget,
    and the scan that counts its space (NOTE [ Shard cache protocol ] in :mod:`.cache`)."""

    #: How long the holders' records are reused before they are read again.
    REFRESH = 0.2
    #: How long the needs may exceed the budget, with a download waiting, before it
    #: fails (a transient excess: a window boundary, a holder just closing).
    GRACE = 3.0

    def __init__(self, path: str):
        """`path`: a directory private_dir() accepted (NOTE [ Private cache directory ])."""
        self.path = os.path.abspath(os.fspath(path))
        for sub in ("objects", "locks", "tmp", "holders"):
            with contextlib.suppress(FileExistsError):
                os.mkdir(os.path.join(self.path, sub), 0o700)
        self.holders_dir = os.path.join(self.path, "holders")
        self._mu = threading.Lock()
        self._seen: Tuple[float, List[Dict[str, Any]]] = (0.0, [])

    def holders(self, fresh: bool = False) -> List[Dict[str, Any]]:
        """The live holders' records (dead ones are removed on the way)."""
        with self._mu:
            at, recs = self._seen
            if not fresh and time.monotonic() - at < self.REFRESH:
                return recs
        out = []
        try:
            names = os.listdir(self.holders_dir)
        except FileNotFoundError:
            names = []
        for name in sorted(names):
            if not name.endswith(".json"):
                continue
            path = os.path.join(self.holders_dir, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass  # held: alive
                else:
                    # Nobody holds it: its process is gone (or it is being created: the
                    # creator locks right after opening, so look again next time).
                    if time.time() - os.fstat(fd).st_mtime > 5:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(path)
                    continue
                raw = os.pread(fd, Holder.RECORD, 0)
            finally:
                os.close(fd)
            try:
                rec = json.loads(raw.decode("utf-8").strip() or "null")
            except (UnicodeDecodeError, ValueError):
                continue
            if isinstance(rec, dict):
                rec["file"] = name
                out.append(rec)
        with self._mu:
            self._seen = (time.monotonic(), out)
        return out

    def budget(self, holders: Optional[List[Dict[str, Any]]] = None) -> Optional[int]:
        """The smallest cache_limit among the live holders, or None."""
        limits = [h["limit"] for h in (holders if holders is not None else self.holders())
                  if isinstance(h.get("limit"), int) and h["limit"] > 0]
        return min(limits) if limits else None

    def share(self, holder: Holder) -> Optional[int]:
        """``holder``'s share of the budget now, or None without a budget."""
        recs = self.holders()
        budget = self.budget(recs)
        if budget is None:
            return None
        mine = os.path.basename(holder.path)
        recs = [dict(holder.info, file=mine) if r.get("file") == mine else r for r in recs]
        if not any(r.get("file") == mine for r in recs):
            recs.append(dict(holder.info, file=mine))
        got = shares(recs, budget)
        return next(g for r, g in zip(recs, got) if r.get("file") == mine)

    def infeasible(self, holders: List[Dict[str, Any]]) -> bool:
        """Whether the holders' needs together exceed the budget (their fetchers cannot
        give back enough for everyone to go on)."""
        budget = self.budget(holders)
        return budget is not None and sum(max(int(h.get("need", 0)), int(h.get("must", 0)))
                                          for h in holders if h.get("managed")) > budget

    def no_room(self, what: str, size: int, mine: Holder, waited: Optional[float] = None,
                holders: Optional[List[Dict[str, Any]]] = None) -> NoRoomError:
        """The error for a download of ``size`` bytes that found no room (after ``waited``
        seconds, or because the needs exceed the budget), with the numbers of NOTE
        [ Cache budget ]."""
        recs = holders if holders is not None else self.holders(fresh=True)
        budget = self.budget(recs)
        lines = []
        total = 0
        for h in recs:
            need = max(int(h.get("need", 0)), int(h.get("must", 0)))
            # Pins of a cache no fetcher manages are never given back.
            total += need if h.get("managed") else int(h.get("held", 0))
            if h.get("file") == os.path.basename(mine.path) and not h.get("managed"):
                total += size  # this download, for a cache no fetcher manages
            lines.append(f"  pid {h.get('pid')} {h.get('url')}: pins "
                         f"{format_bytes(int(h.get('held', 0)))}, needs {format_bytes(need)} "
                         f"(cache_limit {format_bytes(h.get('limit'))})")
        why = (f"no room within {waited:.0f} s" if waited is not None
               else "no room (the datasets using it need more than its budget together)")
        return NoRoomError(
            f"{what}: {why} in the cache directory {self.path} for {size} bytes: its budget "
            f"is {format_bytes(budget)} (the smallest cache_limit of the {len(recs)} "
            "dataset(s) using it); held by:\n" + "\n".join(lines) +
            f"\na budget of at least {format_bytes(max(total, size))} would work: raise "
            "cache_limit (for every dataset on this directory), use smaller shard windows, "
            "or give datasets their own cache_dir")

    def scan(self, clean: bool = True) -> Tuple[int, List[Tuple[float, str, int]]]:
        """(bytes used, [(mtime, path, size) of each object]): the objects, plus the sizes
        that downloads in flight announce in their ``.part`` names; with ``clean``, the
        ``.part`` files of killed downloads are deleted on the way, which needs the eviction
        lock (a download creates its ``.part`` and then locks it, under that lock).
        ``clean=False`` only looks (it may count a killed download's ``.part``), and does
        not count a ``.part`` twice when it is published between the two listings."""
        used = 0
        tmp_dir = os.path.join(self.path, "tmp")
        with os.scandir(tmp_dir) as entries:
            parts = [e for e in entries if e.name.endswith(".part")]
        unlocked: Dict[str, int] = {}  # clean=False: object name -> bytes its .part announces
        for e in parts:
            if not clean:
                with contextlib.suppress(ValueError):
                    unlocked[e.name.split(".", 1)[0] + ".stk"] = int(e.name.rsplit(".", 2)[-2])
                continue
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
        objects = []
        with os.scandir(os.path.join(self.path, "objects")) as listing:
            entries = list(listing)
        for e in entries:
            try:
                st = e.stat()
            except FileNotFoundError:
                continue
            used += st.st_size
            objects.append((st.st_mtime, e.path, st.st_size))
            unlocked.pop(e.name, None)
        return used + sum(unlocked.values()), objects

    @staticmethod
    def try_evict(path: str) -> bool:
        """Deletes object ``path`` unless someone pins it (an exclusive, non-blocking lock
        decides); whether it did."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False  # pinned
        try:
            os.unlink(path)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
        finally:
            os.close(fd)
        return True
