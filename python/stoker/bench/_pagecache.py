"""How much of a dataset is in the page cache, measured with ``mincore(2)``.

A verdict that blames storage must first know whether the reads went to storage at all:
data just written, or read a moment ago, is in memory, and reading it costs memory
bandwidth and checksums, not disk time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from typing import Iterable, Optional, Tuple

__all__ = ["resident", "resident_fraction"]

_libc = None


def _c():
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.POINTER(ctypes.c_ubyte)]
        _libc = libc
    return _libc


def _file_pages(path: str) -> Tuple[int, int]:
    """(pages resident, pages) of one file."""
    page = mmap.PAGESIZE
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return 0, 0
        libc = _c()
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed", path)
        try:
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed", path)
            return sum(b & 1 for b in vec), pages
        finally:
            libc.munmap(addr, size)


def resident(paths: Iterable[str]) -> Tuple[int, int]:
    """(pages in the page cache, pages) over `paths`."""
    have = total = 0
    for p in paths:
        h, t = _file_pages(p)
        have += h
        total += t
    return have, total


def resident_fraction(paths: Iterable[str]) -> Optional[float]:
    """The fraction of the files' pages in the page cache, or None where it cannot be
    measured (no mincore, an unreadable file)."""
    try:
        have, total = resident(paths)
    except (OSError, AttributeError):
        return None
    return have / total if total else 1.0
