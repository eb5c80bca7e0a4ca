"""A shard cache directory only its user can use, and the files in it.

NOTE [ Private cache directory ]
A node's shard cache (``$STOKER_CACHE_DIR``, else ``~/.cache/stoker``) is shared by the
processes of one user, never with other users: what they could do with it otherwise is read
the downloaded shards, hold its locks (downloads wait), or plant files in it. So, as the
decoded cache's folder is (NOTE [ Cache trust ] in csrc/cache/decoded_cache.cpp):

  * The directory is made with mode 0700 and checked on its open descriptor (O_NOFOLLOW:
    no window between the check and the use): a folder, of this user, that no other user
    can write to. One of the user's own that others could only read (a folder made before,
    with the umask's 0755) is made 0700; one that another user owns, or can write to
    (group or other write bits), or a link, is never used: the process keeps a private
    directory of its own (tempfile.mkdtemp, mode 0700, removed at exit), and says why once.
  * Its subfolders are made 0700, and every file stoker makes there (locks, the holders'
    records, downloads) with mode 0600 and O_NOFOLLOW. A file met there that is not this
    user's own, or that others may write, or a link, is removed and made anew (open_own),
    never used.
  * The shards' bytes are checked as always: the size on every pin, the file's checksum as
    a download arrives, each record's checksum when read, and a format-2 shard's identity
    (header and record table against index.json) when opened.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import stat
import tempfile
import warnings
from typing import Optional

__all__ = ["check_dir", "open_own", "fallback_dir"]

_said: set = set()


def check_dir(path: str) -> Optional[str]:
    """Makes `path` (and its parents) if missing, with mode 0700; None if it is this user's
    folder that no other user can write to (made 0700 if others could read it), else why it
    is not used (NOTE [ Private cache directory ])."""
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        return f"{path} is not a folder (a link, or a file: {e.strerror})"
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            return (f"{path} belongs to uid {st.st_uid}, not to this user (uid "
                    f"{os.geteuid()}): another user could read its shards or hold its locks")
        if st.st_mode & 0o022:
            return (f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: other users may "
                    "have put files in it; make it 0700 (after checking what it holds), "
                    "or give the dataset another cache_dir")
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o700)  # others could only read it: nobody else put anything there
        return None
    finally:
        os.close(fd)


def open_own(path: str, flags: int) -> int:
    """os.open of a file in a private cache directory: made with mode 0600, never through
    a link; a file there that is not this user's own regular file, or that others may
    write, is removed and (with O_CREAT) made anew, else FileNotFoundError."""
    excl = 0  # O_EXCL of ours (the caller's own is kept)
    for _ in range(3):
        try:
            fd = os.open(path, flags | excl | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            if e.errno == errno.EEXIST and excl:  # made meanwhile by another of this
                excl = 0  # user's processes
                continue
            if e.errno != errno.ELOOP:  # (a link: removed below)
                raise
        else:
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and stat.S_ISREG(st.st_mode) and \
                    not st.st_mode & 0o022:
                return fd
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        if not flags & os.O_CREAT:
            break
        excl = os.O_EXCL
    raise FileNotFoundError(errno.ENOENT, "no file of this user's there", path)


def fallback_dir(path: str, why: str) -> str:
    """A directory of this process's own (mode 0700, removed at exit) in place of `path`,
    which cannot be used (`why`); said once per reason."""
    own = tempfile.mkdtemp(prefix="stoker-cache-")
    atexit.register(shutil.rmtree, own, True)
    if why not in _said:
        _said.add(why)
        warnings.warn(f"stoker: the shard cache {path} is not used ({why}); this process "
                      f"keeps its shards in {own}, its own, removed at exit (the node's other "
                      "processes do not share it)", RuntimeWarning, stacklevel=4)
    return own
