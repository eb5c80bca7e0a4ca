"""What crosses between the loader's process and its Python worker processes (NOTE
[ Python stage processes ] in processes.py): messages framed over a stream socket, with
descriptors; arrays through shared arenas (memfds); what a worker is doing, in memory both
read; the user's exceptions, as the loader's process can have them."""

from __future__ import annotations

import math
import mmap
import os
import pickle
import socket
import struct
import time
import traceback
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .errors import add_note

__all__ = ["PHASES"]

# An arena gives back the pages that the worker's last _SHRINK_AFTER chunks did not need
# in it, when that frees _SHRINK_BYTES and half of what it holds (_Usage).
_SHRINK_AFTER = 64
_SHRINK_BYTES = 16 << 20
_SHRINK_DIRECT = 1 << 20  # ... and at once, when the rows go straight into their batch
_HEADER = struct.Struct("<Q")  # a request: its length
# A reply: stoker's magic, the ticket of the request it answers, the pid of the process
# that wrote it, its length (NOTE [ Worker faults ] in lifecycle.py).
_REPLY = struct.Struct("<4sQqQ")
_MAGIC = b"STKR"
_MAX_REPLY = 1 << 40
_ARENA_NAME = "stoker-python-arena"
# What a worker is doing, in memory it shares with the loader's process: the sample's
# dataset index, the phase (PHASES), since when (time.monotonic(), the same clock in
# every process).
_STATUS = struct.Struct("<qqd")
# ... and after it, written by the loader's process: the last request whose samples the
# worker may leave undone (their epoch ended: NOTE [ Stuck workers ] in stuck.py).
_DROP = struct.Struct("<q")
_STATUS_BYTES = _STATUS.size + _DROP.size
PHASES = (None, "dataset", "map")


# -- framing over a stream socket ---------------------------------------------------------

def _send(sock: socket.socket, payload: bytes, fds: Tuple[int, ...] = ()) -> None:
    header = _HEADER.pack(len(payload))
    if fds:
        socket.send_fds(sock, [header], list(fds))
    else:
        sock.sendall(header)
    sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError
        got += k
    return bytes(buf)


def _recv(sock: socket.socket) -> Tuple[bytes, List[int]]:
    """One message and the descriptors that came with it."""
    data, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, 4)
    if not data:
        raise EOFError
    if len(data) < _HEADER.size:
        data += _recv_exact(sock, _HEADER.size - len(data))
    (n,) = _HEADER.unpack(data)
    return _recv_exact(sock, n), list(fds)


class _BadReply(Exception):
    """What came back is not a reply of stoker's framing."""


def _recv_reply(sock: socket.socket) -> Tuple[int, int, bytes, List[int]]:
    """(ticket, pid, payload, descriptors) of one reply; _BadReply if it is not one."""
    data, fds, _flags, _addr = socket.recv_fds(sock, _REPLY.size, 4)
    if not data:
        raise EOFError
    if len(data) < _REPLY.size:
        data += _recv_exact(sock, _REPLY.size - len(data))
    magic, ticket, pid, n = _REPLY.unpack(data)
    if magic != _MAGIC or n > _MAX_REPLY:
        for fd in fds:
            os.close(fd)
        raise _BadReply("an unreadable reply (not stoker's framing: something else wrote to "
                        "the worker's socket)")
    return ticket, pid, _recv_exact(sock, n), list(fds)


# -- arrays through the arena ------------------------------------------------------------

class _Arena:
    """A shared mapping of a memfd: a worker writes, the loader's process reads."""

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.size = size
        self.map = mmap.mmap(fd, size)
        self.array = np.frombuffer(self.map, np.uint8)
        _arenas.add(self)

    @staticmethod
    def new_fd(size: int) -> int:
        fd = os.memfd_create(_ARENA_NAME, os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return fd

    @classmethod
    def create(cls, size: int) -> "_Arena":
        return cls(cls.new_fd(size), size)

    def resident(self) -> int:
        """Bytes of memory the arena holds (its pages that were written)."""
        return os.fstat(self.fd).st_blocks * 512

    def give_back(self) -> None:
        """Its pages go back to the system (it reads as zeros after): an arena that no
        lease holds, whose rows went into their batch."""
        try:
            if self.resident() >= _SHRINK_DIRECT:
                self.map.madvise(mmap.MADV_REMOVE, 0, self.size)
        except (AttributeError, OSError, ValueError):  # closed, or no MADV_REMOVE here
            pass

    def close(self) -> None:
        _arenas.discard(self)
        self.array = None
        try:
            self.map.close()
        except BufferError:  # views still exported: the mapping goes with them
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# The arenas mapped in this process: a worker forked from it lets go of all but its own
# (NOTE [ Worker faults ] in lifecycle.py).
_arenas: "weakref.WeakSet[_Arena]" = weakref.WeakSet()


class _Usage:
    """What a worker's arenas hold and what its recent chunks used. The arena a chunk is
    written into (leased to it: no rows live there) gives the pages above what it needed
    in the worker's last _SHRINK_AFTER chunks (the current one at least) back to the
    system, once that frees at least _SHRINK_BYTES and half of what it holds; a later
    chunk that writes there again gets fresh zero pages. An arena that is seldom leased
    (_Worker.lease) keeps only what its current chunk needs."""

    def __init__(self) -> None:
        self.tick = 0
        self.uses: Dict[int, List[Tuple[int, int]]] = {}  # slot -> (tick, bytes), recent
        self.held: Dict[int, int] = {}  # slot -> bytes written since pages were given back

    def reset(self, slot: int) -> None:  # a new arena for the slot
        self.uses.pop(slot, None)
        self.held.pop(slot, None)

    def used(self, arena: _Arena, slot: int, nbytes: int, now_only: bool = False) -> None:
        """`now_only`: the chunk's rows went into their batch (NOTE [ Direct rows ] in
        direct.py), as the next chunks' will: the arena keeps what this one needs."""
        page = mmap.PAGESIZE
        self.tick += 1
        nbytes = min(arena.size, (nbytes + page - 1) // page * page)
        uses = self.uses.setdefault(slot, [])
        if now_only:
            uses.clear()
        uses.append((self.tick, nbytes))
        while uses[0][0] <= self.tick - _SHRINK_AFTER:
            del uses[0]
        held = max(self.held.get(slot, 0), nbytes)
        keep = max(n for _, n in uses)
        if held - keep >= max(_SHRINK_DIRECT if now_only else _SHRINK_BYTES, keep):
            try:
                arena.map.madvise(mmap.MADV_REMOVE, keep, held - keep)
                held = keep
            except (AttributeError, OSError):  # no MADV_REMOVE here: keep the pages
                pass
        self.held[slot] = held


def _plain_tensor(value: Any) -> bool:
    """Whether `value` is a torch.Tensor (not a subclass: a nested or jagged tensor, a
    tensor wrapper) whose memory is its value as it is: strided, on the CPU, contiguous,
    without autograd and without a conjugate or negative bit."""
    import torch

    return type(value) is torch.Tensor and value.layout == torch.strided and \
        not value.is_nested and value.device.type == "cpu" and not value.requires_grad \
        and not value.is_conj() and not value.is_neg() and value.is_contiguous()


def plain_array(value: Any) -> Optional[np.ndarray]:
    """`value`'s memory as an arena (or a batch's block: NOTE [ Direct rows ] in
    direct.py) carries it: a C-contiguous NumPy array of a native dtype (the value itself,
    or a plain tensor's .numpy()), else None: the value goes as _tensor_bytes() has it, or
    is pickled as it is (an object array, any other tensor)."""
    if isinstance(value, np.ndarray):
        ok = value.dtype != object and value.flags.c_contiguous and value.dtype.isnative
        return value if ok else None
    if not _plain_tensor(value):
        return None
    try:
        return value.numpy()
    except (TypeError, RuntimeError):  # a dtype NumPy has no counterpart for
        return None


def _tensor_bytes(value: Any) -> Optional[np.ndarray]:
    """A plain tensor of a dtype NumPy lacks (bfloat16, float8: torch cannot unpickle a
    float8 tensor) as its bytes, else None (a quantized tensor: its scale is not in them,
    it is pickled)."""
    if not _plain_tensor(value) or value.is_quantized:
        return None
    import torch

    try:
        return value.reshape(-1).view(torch.uint8).numpy()
    except (TypeError, RuntimeError):
        return None


class _Writer:
    """Replaces the array leaves of a value by places in the arena (in the worker)."""

    def __init__(self) -> None:
        self.arrays: List[np.ndarray] = []
        self.total = 0
        self.done: Dict[Any, Any] = {}  # leaves written in place, by path (direct.py)

    def encode_row(self, value: Any, done: Dict[Any, Any]) -> Any:
        """encode(), the leaves at the paths of `done` replaced by its markers."""
        if not done:
            return self.encode(value)
        self.done = done
        try:
            return self.encode(value, ())
        finally:
            self.done = {}

    def encode(self, value: Any, path: Optional[Tuple[Any, ...]] = None) -> Any:
        if path is not None:
            got = self.done.get(path)
            if got is not None:
                return got
        a = plain_array(value)
        if a is not None:
            return ("__stoker_array__" if a is value else "__stoker_tensor__", self._put(a))
        raw = _tensor_bytes(value)
        if raw is not None:  # its dtype by name: ("torch.bfloat16", the tensor's shape)
            return ("__stoker_tensor__", (self._put(raw)[0], str(value.dtype),
                                          tuple(value.shape)))
        if path is not None:  # a row with leaves in place: the paths followed
            if type(value) is dict:
                return {k: self.encode(v, path + (k,)) for k, v in value.items()}
            if type(value) is list:
                return [self.encode(v, path + (i,)) for i, v in enumerate(value)]
            if type(value) is tuple:
                return tuple(self.encode(v, path + (i,)) for i, v in enumerate(value))
            return value
        if type(value) is dict:
            return {k: self.encode(v) for k, v in value.items()}
        if type(value) is list:
            return [self.encode(v) for v in value]
        if type(value) is tuple:
            return tuple(self.encode(v) for v in value)
        return value  # numbers, strings, anything else: pickled as it is

    def _put(self, a: np.ndarray) -> Tuple[int, str, Tuple[int, ...]]:
        i = len(self.arrays)
        self.arrays.append(a)
        self.total = (self.total + 63) // 64 * 64 + a.nbytes
        return (i, a.dtype.str, a.shape)

    def write(self, arena: _Arena) -> List[int]:
        """Copies the arrays into the arena; their offsets."""
        offsets, pos = [], 0
        for a in self.arrays:
            pos = (pos + 63) // 64 * 64
            if a.nbytes:
                arena.array[pos: pos + a.nbytes] = a.reshape(-1).view(np.uint8)
            offsets.append(pos)
            pos += a.nbytes
        return offsets


_DTYPES: Dict[str, np.dtype] = {}


def _dtype(code: str) -> np.dtype:
    dt = _DTYPES.get(code)
    if dt is None:
        dt = _DTYPES[code] = np.dtype(code)
    return dt


def _decode(value: Any, arena: _Arena, offsets: List[int], view: bool = False,
            direct: Any = None) -> Any:
    """The value with its array leaves out of the arena (in the loader's process): if
    `view` and it is a dict, its own arrays as views of the arena (the caller holds its
    lease); every other array leaf copied. Leaves a worker wrote into their batch
    (`direct`, a DirectBatch: NOTE [ Direct rows ] in direct.py) are views of it."""
    if direct is not None and type(value) is tuple and len(value) == 3 and \
            value[0] == "__stoker_direct__":
        return direct.row(value[1], value[2])
    if type(value) is tuple and len(value) == 2 and value[0] in ("__stoker_array__",
                                                                  "__stoker_tensor__"):
        i, dtype, shape = value[1]
        if dtype.startswith("torch."):  # a dtype NumPy lacks: the tensor's bytes
            import torch

            tdt = getattr(torch, dtype[6:])
            raw = arena.array[offsets[i]: offsets[i] + tdt.itemsize * math.prod(shape)]
            return torch.from_numpy(raw if view else raw.copy()).view(tdt).reshape(shape)
        dt = _dtype(dtype)
        n = dt.itemsize * math.prod(shape)
        a = arena.array[offsets[i]: offsets[i] + n].view(dt).reshape(shape)
        if not view:
            a = a.copy()
        if value[0] == "__stoker_tensor__":
            import torch

            return torch.from_numpy(a)
        return a
    if type(value) is dict:
        if view:
            return {k: _decode(v, arena, offsets, type(v) is tuple, direct)
                    for k, v in value.items()}
        return {k: _decode(v, arena, offsets, False, direct) for k, v in value.items()}
    if type(value) is list:
        return [_decode(v, arena, offsets, False, direct) for v in value]
    if type(value) is tuple:
        return tuple(_decode(v, arena, offsets, False, direct) for v in value)
    return value


# -- what a worker is doing, and its errors ----------------------------------------------

def _portable_error(exc: BaseException) -> Any:
    """The exception as the loader's process can have it: itself if it pickles (its
    traceback's text in a note), else a RuntimeError with that text."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    add_note(exc, f"stoker: raised in Python worker process {os.getpid()}:\n{text.rstrip()}")
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__} (not picklable) in Python worker process "
                            f"{os.getpid()}:\n{text.rstrip()}")


class _SharedStatus:
    """What a worker is doing (_STATUS), written where the loader's process reads it: the
    stall report names the sample (NOTE [ Python stage ] in __init__.py)."""

    __slots__ = ("mem",)

    def __init__(self, mem: mmap.mmap):
        self.mem = mem

    def at(self, index: int, phase: str) -> None:
        _STATUS.pack_into(self.mem, 0, index, PHASES.index(phase), time.monotonic())

    def idle(self) -> None:
        _STATUS.pack_into(self.mem, 0, -1, 0, time.monotonic())

    def read(self) -> Tuple[int, Optional[str], float]:
        index, phase, since = _STATUS.unpack_from(self.mem)
        return index, PHASES[phase] if 0 <= phase < len(PHASES) else None, since

    def drop_through(self, ticket: int) -> None:
        """The worker may leave the samples of requests up to `ticket` undone."""
        _DROP.pack_into(self.mem, _STATUS.size, ticket)

    def dropped(self, ticket: int) -> bool:
        """Whether request `ticket`'s remaining samples may be left undone."""
        return _DROP.unpack_from(self.mem, _STATUS.size)[0] >= ticket
