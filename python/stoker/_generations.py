"""How a dataset directory changes safely: generations, the writer lock, reader leases.

NOTE [ Generations ]
A dataset directory holds ``index.json`` and one *generation* directory per write,
``gen-<dataset id>/``, with that write's shards and a ``readers.lock`` file::

    data/train/
      index.json                  -> names the live generation (its dataset id)
      gen-3f0c.../shard-00000.stk    the live generation's shards
      gen-3f0c.../readers.lock       readers hold flock(LOCK_SH) on it while open
      gen-91ab.../...                an older generation, kept while a reader uses it
      writer.lock                    flock(LOCK_EX) by the one writer, while it writes

A write never touches the files of the generation that ``index.json`` names:

    writer                                         reader (Dataset(path))
    ------                                         ----------------------
    lock writer.lock (LOCK_EX|LOCK_NB) or fail
    mkdir gen-NEW/, write shards (tmp + rename)
    fsync gen-NEW/, fsync the directory
    write index.json.tmp, fsync, rename over       read index.json (old or new, whole)
      index.json, fsync the directory               lock gen-X/readers.lock (LOCK_SH|LOCK_NB)
    for each other gen-OLD/:                         check gen-X's shards (header+footer)
      lock its readers.lock (LOCK_EX|LOCK_NB)        keep the lease while the Dataset lives
        held by a reader: keep it for later           (shards are mapped on first use)
        else: delete its files, then the lock file
    unlink writer.lock, unlock

Guarantees: a reader that opens at any moment gets the old or the new dataset whole
(never an error: a generation removed between reading ``index.json`` and taking the
lease shows as a lock file that is gone or busy, and the reader starts over from
``index.json``); a Dataset can read every shard of its generation for as long as it
lives, however many writes happen meanwhile (its lease keeps the generation on disk;
the next write, or ``stoker inspect --clean``, removes it after the reader is gone); a
killed or failed write leaves the previous dataset as it was, and its own partial
generation is removed by the next write or by ``stoker inspect --clean``.

On a filesystem without flock (some network filesystems), the writer warns: a second
writer cannot be kept out, and a write removes only generations older than the one
it replaces, so a reader survives one rewrite, not more.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import socket
import stat
import time
import warnings
from typing import List, Optional, Tuple

from . import _core
from ._index import GENERATION_PREFIX, INDEX_NAME, LEASE_NAME

LOCK_NAME = "writer.lock"
# index.json is read whole; anything this large is not an index (and a path to
# /dev/zero or the like never gets this far: only regular files are read).
MAX_INDEX_BYTES = 256 * 2**20

_GENERATION_RE = re.compile(re.escape(GENERATION_PREFIX) + r"[0-9a-f]{32}")
_V1_SHARD_RE = re.compile(r"shard-\d+\.stk(\.tmp)?")
# flock errors that mean "this filesystem has no locks", not "someone holds it"
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class WriterLockError(BlockingIOError):
    """Another :class:`stoker.ShardWriter` is writing the same dataset directory."""


def is_generation_name(name: str) -> bool:
    return _GENERATION_RE.fullmatch(name) is not None


def fsync_dir(path: str) -> None:
    """Makes the directory's entries (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EROFS):  # filesystems without directory fsync
            raise
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def file_stamp(st: os.stat_result) -> Tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def read_index_file(path: str) -> Tuple[bytes, Tuple[int, int, int, int]]:
    """The bytes of index.json and its stamp (to tell later whether it was replaced).
    Only a regular file of at most MAX_INDEX_BYTES is read; opening never blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _core.DataError(f"{path}: cannot open index: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _core.DataError(f"{path}: is {_kind(st.st_mode)}, not an index file "
                                  "(index.json must be a regular file)")
        if st.st_size > MAX_INDEX_BYTES:
            raise _core.DataError(f"{path}: {st.st_size} bytes is over the "
                                  f"{MAX_INDEX_BYTES // 2**20} MiB limit of an index file")
        chunks = []
        left = MAX_INDEX_BYTES + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        if len(data) > MAX_INDEX_BYTES:
            raise _core.DataError(f"{path}: over the {MAX_INDEX_BYTES // 2**20} MiB limit "
                                  "of an index file")
        return data, file_stamp(st)
    finally:
        os.close(fd)


def index_changed(path: str, stamp) -> bool:
    try:
        return file_stamp(os.stat(path)) != stamp
    except OSError:
        return True


# -- the writer lock ---------------------------------------------------------------------

class WriterLock:
    """``flock(LOCK_EX)`` on ``<directory>/writer.lock`` for a writer's lifetime.

    The file says who holds it (pid, host, start time), for the error the next writer
    gets. Released by unlinking it while still locked, then closing: a writer that
    opened the old file before the unlink sees, after locking it, that it is no longer
    the file at that path and tries again.
    """

    def __init__(self, directory: str, what: str = "ShardWriter"):
        self.path = os.path.join(directory, LOCK_NAME)
        self.fd: Optional[int] = None
        self.enforced = True
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                         0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise WriterLockError(
                    errno.EWOULDBLOCK,
                    f"{directory}: another writer is writing this dataset "
                    f"({holder}; lock file {self.path}). Only one writer at a time: with "
                    "several processes (torchrun ranks), let rank 0 write, or give each "
                    "rank its own directory and merge them (docs/storage.md)") from None
            except OSError as e:
                if e.errno not in _NO_LOCKS:
                    os.close(fd)
                    raise
                self.enforced = False
                warnings.warn(
                    f"{directory}: this filesystem does not support file locks "
                    f"({e.strerror}): stoker cannot keep a second writer out, and a write "
                    "keeps only the generation it replaces for readers still using it",
                    RuntimeWarning, stacklevel=3)
            if self.enforced and not _is_current(fd, self.path):
                os.close(fd)  # a finishing writer unlinked it after we opened it
                continue
            break
        self.fd = fd
        info = (f"pid {os.getpid()} on host {socket.gethostname()}, {what} started "
                f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n").encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, info, 0)
        except OSError as e:
            # A full disk (or a file size limit) right here: no writer may be left
            # holding the lock (every later writer would be told another one writes).
            self.release()
            raise OSError(e.errno, f"{self.path}: cannot write the writer lock file: "
                                   f"{e.strerror}") from None

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if _is_current(self.fd, self.path):
                os.unlink(self.path)
        except OSError:
            pass  # left for the next writer, which locks it as usual
        os.close(self.fd)
        self.fd = None


def _is_current(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read_holder(fd: int) -> str:
    # The holder writes who it is right after it takes the lock: give it a moment.
    deadline = time.monotonic() + 1.0
    while True:
        try:
            text = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
        except OSError:
            text = ""
        if text or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return f"held by {text}" if text else "held by a process that has not said who it is yet"


# -- reader leases -------------------------------------------------------------------------

LEASE_BUSY = "busy"        # being removed right now: read index.json again
LEASE_GONE = "gone"        # removed after we read index.json: read it again
LEASE_MISSING = "missing"  # no lease file (copied without it?): open without a lease
LEASE_NONE = "none"        # the filesystem has no locks: open without a lease


def acquire_lease(generation_dir: str):
    """``flock(LOCK_SH)`` on the generation's readers.lock: an open fd (the lease), or one
    of the LEASE_* states."""
    path = os.path.join(generation_dir, LEASE_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return LEASE_GONE if not os.path.isdir(generation_dir) else LEASE_MISSING
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _core.DataError(f"{path}: is {_kind(st.st_mode)}, not a lock file")
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return LEASE_BUSY
    except OSError as e:
        os.close(fd)
        if e.errno in _NO_LOCKS:
            return LEASE_NONE
        raise
    except BaseException:
        os.close(fd)
        raise
    if os.fstat(fd).st_nlink == 0:  # removed between our open and our lock
        os.close(fd)
        return LEASE_GONE
    return fd


def create_lease_file(generation_dir: str) -> None:
    fd = os.open(os.path.join(generation_dir, LEASE_NAME),
                 os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    os.close(fd)


# -- removing generations ----------------------------------------------------------------

def remove_generation(generation_dir: str, locks: bool = True) -> bool:
    """Removes a generation unless a reader holds its lease: True if removed.

    Holding LOCK_EX while deleting makes a reader that comes now fail its LOCK_SH and
    go back to index.json; the lock file goes last, so a reader that locks it after we
    close sees it unlinked (st_nlink 0).
    """
    lease = os.path.join(generation_dir, LEASE_NAME)
    fd = os.open(lease, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        if locks:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
        with os.scandir(generation_dir) as listing:
            entries = list(listing)
        for entry in entries:
            if entry.name == LEASE_NAME:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        os.unlink(lease)
        os.rmdir(generation_dir)
        return True
    finally:
        os.close(fd)


def clean(root: str, keep: Optional[set], keep_files: set = frozenset(),
          replaced: Optional[str] = None, locks: bool = True) -> Tuple[List[str], List[str]]:
    """Removes what no index.json names: other generations (unless a reader holds
    them), leftover temporary files, and version-1 shard files not in `keep_files`.

    Args:
        keep: generation names to keep; None keeps every generation.
        replaced: the generation just replaced; kept when there are no locks.
    Returns (removed, kept_in_use), names relative to `root`.
    """
    removed, in_use = [], []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return removed, in_use
    for entry in entries:
        name = entry.name
        if is_generation_name(name) and entry.is_dir(follow_symlinks=False):
            if keep is None or name in keep:
                continue
            if not locks and name == replaced:
                in_use.append(name)
                continue
            if remove_generation(entry.path, locks):
                removed.append(name)
            else:
                in_use.append(name)
        elif name == INDEX_NAME + ".tmp" or (_V1_SHARD_RE.fullmatch(name)
                                             and name not in keep_files):
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(name)
    return removed, in_use
