"""Process workers for the Python stage: ``Loader(..., python_workers="process")``.

NOTE [ Python stage processes ]
Pure-Python code (loops over boxes, dicts, string handling) holds the GIL, so the stage's
threads take turns and a loader gets one core's worth of it. With process workers, each
of num_threads worker processes serves two stage threads (NOTE [ Python stage ]), which
hand it the chunks they take; everything else stays in the loader's process:

  stage threads 2i, 2i+1 (loader's process)     worker process i
  -----------------------------------------     ----------------
  take() a chunk (GIL released)
  send (epoch, indices, arena a)   ------>      fetch + map each sample (its own GIL)
                                                arrays -> arena a (shared memfd),
                                                the rest (numbers, str, structure) pickled
  rows <- views of arena a         <------      reply: where each array is
  checked; arena a stays leased to the batch
  the batch's last chunk: native batching (the one copy out of the arenas), collate_fn,
  batch_map, complete(); the batch's arenas are free again

  * Two stage threads per worker keep a second chunk queued at it: while one thread
    checks its reply (and perhaps assembles a batch), the worker already maps the other
    thread's chunk, so it never idles between chunks. Replies come back in the order
    the requests went out; each thread reads its own (a ticket per request). Requests go
    out in the order the two threads claimed their chunks (SendOrder), so a chunk of an
    earlier batch never waits at the worker behind a later one. The tuner's count of
    active threads moves both threads of a worker.
  * Rows are views of the arena they arrived in, not copies: each request names a free
    arena of its worker, which stays leased until the batch that holds the rows is
    assembled (or dropped), so one chunk never overwrites another's rows. A chunk's
    arrays are copied once, from the arena into the batch. Values under a collate_fn,
    nested arrays and object fields are copied out at once (user code may keep them).

  * Started once per loader, by fork() from the loader's process at the first iter(), so
    the map function, the dataset object and everything they refer to are there without
    pickling, from a script, a notebook or a module alike: nothing depends on the user's
    ``if __name__ == "__main__"`` guard, and nothing re-imports the script. What a worker
    inherits is frozen for its garbage collector (gc.freeze), whose walk would otherwise
    write to every object's header and so copy the pages it shares with the loader. The workers
    live until close() (or the loader is dropped, or its process exits: a worker reads
    EOF and ends). A worker that dies (killed, a crash in native code) fails the batch of
    its chunk with its exit status; the next iter() starts one in its place, once: it is
    never restarted in a loop.
  * Array data never goes through pickle or a file: a worker writes every array leaf of
    what it returns into an anonymous shared mapping (memfd_create: no /dev/shm file to
    fill up or vanish under a reader), which the loader's process maps too; arenas are
    made by the loader's process as leases need them, and a chunk that does not fit
    gets a larger one from the worker; descriptors travel over the socket (SCM_RIGHTS).
    An arena holds only the pages written into it, and when written gives back those
    that the worker's last 64 chunks did not need in it, once that frees 16 MB and half
    of what it holds (madvise(MADV_REMOVE)): a few outsized samples do not keep their
    memory for the loader's life. Leases take the arena given back last (its pages are
    still in the caches: round-robin leases ran 8-18% slower on bench_python's (a)),
    and every 16th the one idle longest, so that each is written now and then.
  * A stoker dataset is reopened in the worker by path and identity (the same
    generation): a mutex that one of the loader's threads held at fork() time is not
    inherited in a locked state by the worker's reads. A remote dataset is refused (its
    shards arrive through the loader's process).
  * Randomness, errors and skips are those of the threads: rng from (seed, epoch, index),
    the user's exception re-raised with its traceback's text in a note, on_error="skip"
    replacing a sample by the next good one in dataset order, in the worker. SystemExit,
    KeyboardInterrupt and other BaseExceptions that map raises come back as themselves
    too (never skipped); the worker goes on.

NOTE [ Worker faults ]
What user code in a worker may do, and what the loader's process does about it:

  * Replies belong to requests. A request carries a ticket (the worker's count of
    requests); a reply starts with stoker's magic, the ticket it answers and the pid of
    the process that wrote it. A reply for another ticket, from another process, or
    unreadable, is never taken for the rows of the awaited request: the worker is ended
    (it is no longer known which rows are whose), the batches it held fail with a
    WorkerDied that says so, and the next iter() starts a new worker.
  * A process forked inside map (or the dataset's __getitem__) that returns from it
    ends there, os._exit(0), before it could read a request or write a reply (the
    stage's pid check after each call of user code: stage.py); its result is ignored.
    The same holds in the loader's process for the stage's threads.
  * Nothing waits forever: close() (and a dropped loader, and interpreter exit) hangs up
    each worker's socket (shutdown: the stage threads waiting for replies wake with
    EOF), gives the workers _STOP_SECONDS to end, then sends SIGTERM, then after
    _TERM_SECONDS SIGKILL: 3 s at most whatever map is doing (one when it ends at SIGTERM).
  * Workers die with the loader's process, however it dies: PR_SET_PDEATHSIG(SIGKILL)
    when the worker is forked from the main thread (the signal follows the thread that
    forked, and the main thread ends with the process), else a watchdog thread in the
    worker that polls its parent. A worker holds no other worker's socket or arena:
    right after the fork it replaces each inherited loader-side socket and arena
    descriptor by /dev/null and each inherited arena mapping by an empty reservation,
    so a worker that ends leaves no other worker without its EOF, and an arena the
    loader frees is freed.
  * A loader dropped without close() (or collected in a cycle) ends its workers and
    closes its arenas in a finalizer (_end_all), the same bounded way.
"""

from __future__ import annotations

import gc
import math
import mmap
import os
import pickle
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import numpy as np

from .errors import add_note
from .rng import rng_keys
from .telemetry import native_times, thread_sched

__all__ = ["Lease", "ProcessWorkers"]

_ARENA_BYTES = 64 << 20  # a worker's first arena; a larger chunk gets a larger one
# An arena gives back the pages that the worker's last _SHRINK_AFTER chunks did not need
# in it, when that frees _SHRINK_BYTES and half of what it holds (_Usage).
_SHRINK_AFTER = 64
_SHRINK_BYTES = 16 << 20
_ROUND_EVERY = 16  # every this many leases take the arena idle longest (_Worker.lease)
_HEADER = struct.Struct("<Q")  # a request: its length
# A reply: stoker's magic, the ticket of the request it answers, the pid of the process
# that wrote it, its length (NOTE [ Worker faults ]).
_REPLY = struct.Struct("<4sQqQ")
_MAGIC = b"STKR"
_MAX_REPLY = 1 << 40
# Ending workers (NOTE [ Worker faults ]): after the hang-up, after SIGTERM, after SIGKILL.
_STOP_SECONDS = 1.0
_TERM_SECONDS = 1.0
_KILL_SECONDS = 1.0
_ARENA_NAME = "stoker-python-arena"
# What a worker is doing, in memory it shares with the loader's process: the sample's
# dataset index, the phase (PHASES), since when (time.monotonic(), the same clock in
# every process).
_STATUS = struct.Struct("<qqd")
PHASES = (None, "dataset", "map")


class WorkerDied(RuntimeError):
    """A Python worker process ended while it held a chunk (or sent a reply that answers
    no awaited request: NOTE [ Worker faults ])."""


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


def _reply_header(ticket: int, pid: int) -> Tuple[int, int]:
    """What a reply says it answers: (the request's ticket, the pid of the process that
    writes it). A function of its own: a test makes a worker answer another request."""
    return ticket, pid


def _send_reply(sock: socket.socket, ticket: int, payload: bytes,
                fds: Tuple[int, ...] = ()) -> None:
    t, pid = _reply_header(ticket, os.getpid())
    header = _REPLY.pack(_MAGIC, t, pid, len(payload))
    if fds:
        socket.send_fds(sock, [header], list(fds))
    else:
        sock.sendall(header)
    sock.sendall(payload)


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
# (NOTE [ Worker faults ]).
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

    def used(self, arena: _Arena, slot: int, nbytes: int) -> None:
        page = mmap.PAGESIZE
        self.tick += 1
        nbytes = min(arena.size, (nbytes + page - 1) // page * page)
        uses = self.uses.setdefault(slot, [])
        uses.append((self.tick, nbytes))
        while uses[0][0] <= self.tick - _SHRINK_AFTER:
            del uses[0]
        held = max(self.held.get(slot, 0), nbytes)
        keep = max(n for _, n in uses)
        if held - keep >= max(_SHRINK_BYTES, keep):
            try:
                arena.map.madvise(mmap.MADV_REMOVE, keep, held - keep)
                held = keep
            except (AttributeError, OSError):  # no MADV_REMOVE here: keep the pages
                pass
        self.held[slot] = held


class _Writer:
    """Replaces the array leaves of a value by places in the arena (in the worker)."""

    def __init__(self) -> None:
        self.arrays: List[np.ndarray] = []
        self.total = 0

    def encode(self, value: Any) -> Any:
        import torch

        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and \
                value.dtype != torch.bfloat16 and value.is_contiguous() and \
                not value.requires_grad:
            return ("__stoker_tensor__", self._put(value.numpy()))
        if isinstance(value, np.ndarray) and value.dtype != object and \
                value.flags.c_contiguous and value.dtype.isnative:
            return ("__stoker_array__", self._put(value))
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


def _decode(value: Any, arena: _Arena, offsets: List[int], view: bool = False) -> Any:
    """The value with its array leaves out of the arena (in the loader's process): if
    `view` and it is a dict, its own arrays as views of the arena (the caller holds its
    lease); every other array leaf copied."""
    if type(value) is tuple and len(value) == 2 and value[0] in ("__stoker_array__",
                                                                  "__stoker_tensor__"):
        i, dtype, shape = value[1]
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
            return {k: _decode(v, arena, offsets, type(v) is tuple) for k, v in value.items()}
        return {k: _decode(v, arena, offsets) for k, v in value.items()}
    if type(value) is list:
        return [_decode(v, arena, offsets) for v in value]
    if type(value) is tuple:
        return tuple(_decode(v, arena, offsets) for v in value)
    return value


# -- the worker process -------------------------------------------------------------------

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


def _worker_main(sock: socket.socket, arena: _Arena, stage: Any,
                 status: Optional[_SharedStatus] = None, worker_id: int = 0,
                 num_workers: int = 1) -> None:
    """A worker's loop: chunks in, rows out, until EOF or "stop"."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loader's to handle
    stage = stage.worker_copy()
    stage.set_status(status)
    # DataLoader's worker protocol: get_worker_info(), then worker_init_fn; an error of it
    # fails every sample this worker is given, in the loop
    init_error = stage.worker_started(worker_id, num_workers)
    try:
        import torch

        torch.set_num_threads(1)  # the workers are the parallelism, as DataLoader's
    except Exception:
        pass
    arenas: Dict[int, _Arena] = {0: arena}
    usage = _Usage()
    while True:
        if status is not None:
            status.idle()
        try:
            data, fds = _recv(sock)
        except (EOFError, OSError):
            return
        msg = pickle.loads(data)
        if msg[0] == "stop":
            return
        _, ticket, epoch, indices, slot, size = msg
        if fds:  # a new arena for this slot, made by the loader's process
            if slot in arenas:
                arenas[slot].close()
            arenas[slot] = _Arena(fds[0], size)
            usage.reset(slot)
        arena = arenas[slot]
        wall0 = time.perf_counter_ns()
        cpu0, wait0 = thread_sched()
        times = native_times.reset()
        keys = rng_keys(stage.seed, epoch, indices) if stage.map_fn is not None else None
        rows: List[Any] = []
        errors: Dict[int, Any] = {}
        skipped = 0
        for pos, index in enumerate(indices):
            if init_error is not None:
                rows.append(None)
                errors[pos] = _portable_error(init_error)
                continue
            try:
                rows.append(stage.worker_sample(index, epoch,
                                                None if keys is None else keys[pos]))
                continue
            except Exception as e:
                first = e
            except BaseException as e:  # SystemExit, KeyboardInterrupt...: never skipped,
                errors[pos] = _portable_error(e)  # the chunk ends (as with threads)
                break
            rows.append(None)
            if stage.skip:
                alt_row, ok = stage._replacement(index, epoch, stage.worker_sample)
                if ok:
                    rows[-1] = alt_row
                    skipped += 1
                    continue
            errors[pos] = _portable_error(first)
        rows += [None] * (len(indices) - len(rows))
        writer = _Writer()
        encoded = [None if r is None else writer.encode(r) for r in rows]
        out_fds: Tuple[int, ...] = ()
        if writer.total > arena.size:
            old = arena
            arena = arenas[slot] = _Arena.create(max(writer.total, 2 * old.size))
            old.close()
            usage.reset(slot)
            out_fds = (arena.fd,)
        offsets = writer.write(arena)
        usage.used(arena, slot, writer.total)
        wall = time.perf_counter_ns() - wall0
        cpu1, wait1 = thread_sched()
        cpu = cpu1 - cpu0
        py = max(0, wall - times.native_ns)
        wait = (wait1 - wait0) * py // wall if wall > 0 else 0  # the Python part's share
        reply = ("rows", encoded, offsets, errors, skipped, arena.size if out_fds else 0,
                 (py, max(0, cpu - times.native_ns), times.read_ns, times.decode_ns,
                  times.ops_ns, times.bytes, wait, times.native_ns))
        try:
            payload = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # an unpicklable output: the chunk's first sample fails
            payload = pickle.dumps(("rows", [None] * len(rows), [], {0: _portable_error(
                TypeError(f"map returned a value that cannot leave the worker process: {e}"))},
                0, arena.size if out_fds else 0, (wall, cpu, 0, 0, 0, 0, 0, 0)))
        try:
            _send_reply(sock, ticket, payload, out_fds)
        except OSError:
            return


# -- the loader's side ----------------------------------------------------------------

class _Worker:
    """The loader's side of one worker process: its socket, its arenas (leased to
    requests), what it is doing (its status), and the order of its replies."""

    __slots__ = ("pid", "sock", "arenas", "free", "known", "lock", "send_lock", "turn",
                 "sent", "received", "dead", "leases", "status", "__weakref__")

    def __init__(self, pid: int, sock: socket.socket, arena: _Arena, status: _SharedStatus):
        self.pid = pid
        self.sock = sock
        self.arenas: List[_Arena] = [arena]  # by slot; the worker maps the same
        self.free: List[int] = [0]
        self.known: List[bool] = [True]  # whether the worker has this slot's arena
        self.lock = threading.Lock()  # new arenas
        self.send_lock = threading.Lock()
        self.turn = threading.Condition(threading.Lock())  # replies, in request order
        self.sent = 0  # the ticket of the next request
        self.received = 0
        self.dead: Optional[str] = None
        self.leases = 0
        self.status = status

    def lease(self) -> int:
        try:
            # The arena given back last (still in the caches), except every
            # _ROUND_EVERY-th lease, which takes the one idle longest, so that each
            # arena is written now and then and gives back what it holds and no longer
            # needs (_Usage). Atomic: give_back may run in a finalizer, any time.
            self.leases += 1
            return self.free.pop(0 if self.leases % _ROUND_EVERY == 0 else -1)
        except IndexError:
            pass
        with self.lock:
            self.arenas.append(_Arena.create(_ARENA_BYTES))
            self.known.append(False)
            return len(self.arenas) - 1

    def give_back(self, slot: int) -> None:
        self.free.append(slot)  # no lock: Lease.__del__ may call it from a collection

    def close_arenas(self) -> None:
        with self.lock:
            arenas, self.arenas = self.arenas, []
            self.free = []
        for a in arenas:  # views still alive (rows of a dropped batch) keep their mapping
            a.close()

    def hang_up(self) -> None:
        """Shuts the socket down both ways: the worker reads EOF, and a stage thread
        waiting for a reply wakes (closing the descriptor alone would not wake it)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close_socket(self) -> None:
        _loader_ends.pop(self.sock.fileno(), None)  # atomic: a finalizer may call it
        try:
            self.sock.close()
        except OSError:
            pass


class Lease:
    """Rows that are views of a worker's arena: release() lets the worker write into it
    again. Released when the batch holding the rows is assembled or dropped (also when
    this object goes away)."""

    __slots__ = ("_worker", "_slot", "__weakref__")

    def __init__(self, worker: _Worker, slot: int):
        self._worker: Optional[_Worker] = worker
        self._slot = slot

    def release(self) -> None:
        w, self._worker = self._worker, None
        if w is not None:
            w.give_back(self._slot)

    def __del__(self) -> None:
        self.release()


class SendOrder:
    """The order a worker's stage threads claimed their chunks in, which their requests
    keep: a chunk of an earlier batch never waits at a worker behind a later batch's (a
    map stuck on a sample holds up its own batch and later ones, never an earlier one).
    claim() numbers a chunk as it is taken; a request waits for its turn(); done() after
    it went out, or for a chunk never sent. Numbers of an earlier generation (threads of
    a pool since stopped) count for nothing."""

    _TURN_SECONDS = 5.0  # a safety net: an earlier request that never says done()

    def __init__(self, workers: int):
        self._take = [threading.Lock() for _ in range(workers)]
        self._cv = threading.Condition()
        self._gen = 0
        self._claimed = [0] * workers
        self._next = [0] * workers
        self._done: List[Set[int]] = [set() for _ in range(workers)]

    def reset(self) -> None:
        """A new generation of stage threads (the pool starts again)."""
        with self._cv:
            self._gen += 1
            n = len(self._claimed)
            self._claimed, self._next = [0] * n, [0] * n
            self._done = [set() for _ in range(n)]
            self._cv.notify_all()

    def claim(self, worker: int, take: Any) -> Any:
        """take()'s chunk (task, lo, hi) numbered for `worker`: (task, lo, hi, turn)."""
        with self._take[worker]:
            item = take()
            if item is None:
                return None
            with self._cv:
                turn = (self._gen, self._claimed[worker])
                self._claimed[worker] += 1
        return (*item, turn)

    def wait(self, worker: int, turn: Tuple[int, int], stopped: Any) -> None:
        deadline = time.monotonic() + self._TURN_SECONDS
        with self._cv:
            while turn[0] == self._gen and self._next[worker] < turn[1] and not stopped() \
                    and time.monotonic() < deadline:
                self._cv.wait(0.05)

    def done(self, worker: int, turn: Tuple[int, int]) -> None:
        with self._cv:
            if turn[0] != self._gen:
                return
            done = self._done[worker]
            done.add(turn[1])
            while self._next[worker] in done:
                done.discard(self._next[worker])
                self._next[worker] += 1
            self._cv.notify_all()


# Forks of worker processes, one at a time in the process: a worker never inherits the
# worker end of another worker's socket, made for a fork running at the same moment.
_SPAWN_LOCK = threading.Lock()
# The loader ends of every worker socket in this process (descriptor -> inode): a worker
# forked from it lets go of the others' (NOTE [ Worker faults ]).
_loader_ends: Dict[int, int] = {}


class ProcessWorkers:
    """The worker processes of one loader's stage (NOTE [ Python stage processes ])."""

    def __init__(self, count: int):
        self.count = count
        self._workers: List[Optional[_Worker]] = [None] * count
        self._lock = threading.Lock()
        self._pid = -1
        # Dropped without stop(): the workers still end, and are waited for; the arenas
        # are closed (NOTE [ Worker faults ]).
        self._all: List[_Worker] = []
        weakref.finalize(self, _end_all, self._all, os.getpid())

    def start(self, stage: Any) -> None:
        """Starts the workers that are not running (all of them in a process forked from
        the one that started them), each with a copy of `stage` (NOTE [ Python stage
        processes ]). Called before the stage's threads start."""
        with self._lock:
            if self._pid != os.getpid():
                self._workers = [None] * self.count  # a child has none of the parent's
                self._all.clear()
                self._pid = os.getpid()
            for i, w in enumerate(self._workers):
                if w is None or w.dead is not None:
                    if w is not None:
                        _end_workers([w])
                        self._all.remove(w)
                    self._workers[i] = self._spawn(stage, i)
                    self._all.append(self._workers[i])

    def _spawn(self, stage: Any, worker_id: int = 0) -> _Worker:
        from_main = threading.current_thread() is threading.main_thread()
        loader_pid = os.getpid()
        status = _SharedStatus(mmap.mmap(-1, _STATUS.size))  # shared with the worker
        status.idle()
        with _SPAWN_LOCK:
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            fd = _Arena.new_fd(_ARENA_BYTES)
            sys.stdout.flush()
            sys.stderr.flush()
            # The objects the worker inherits go to the collector's permanent generation
            # in the worker: its collections never walk them, so their pages stay shared
            # with the loader's process instead of being copied as the walk writes to
            # each object's header (the parent takes them back at once). Left alone if
            # the program froze objects itself: unfreezing would undo its own freeze.
            pid = -1
            freeze = gc.get_freeze_count() == 0
            if freeze:
                gc.freeze()
            try:
                pid = os.fork()
            finally:
                if pid != 0 and freeze:
                    gc.unfreeze()
            if pid == 0:  # the worker: never returns into the loader's code
                code = 0
                try:
                    _become_worker(loader_pid, from_main, child, fd)
                    parent.close()
                    _worker_main(child, _Arena(fd, _ARENA_BYTES), stage, status, worker_id,
                                 self.count)
                except BaseException:
                    code = 1
                    try:
                        traceback.print_exc()
                    except Exception:
                        pass
                finally:
                    os._exit(code)
            child.close()
            _loader_ends[parent.fileno()] = os.fstat(parent.fileno()).st_ino
        return _Worker(pid, parent, _Arena(fd, _ARENA_BYTES), status)

    def run(self, worker: int, epoch: int, indices: List[int], copy: bool = False,
            turn: Optional[Callable[[], None]] = None,
            sent: Optional[Callable[[], None]] = None) -> Tuple[Any, ...]:
        """Maps `indices` on worker `worker`: (rows, errors, skipped, times, lease). The
        top-level arrays of each row are views of an arena that `lease` holds until its
        release() (all arrays copied out with `copy`, and the lease released at once).
        `turn` waits for this request's turn to go out (SendOrder), `sent` says it went
        (or never will)."""
        try:
            if turn is not None:
                turn()
            w = self._workers[worker]
            if w is None or w.dead is not None:
                raise WorkerDied(self._died_message(w, worker))
            slot = w.lease()
            lease = Lease(w, slot)
            with w.send_lock:
                new = not w.known[slot]
                arena = w.arenas[slot]
                ticket = w.sent
                try:
                    _send(w.sock, pickle.dumps(("chunk", ticket, epoch, indices, slot,
                                                arena.size if new else 0)),
                          (arena.fd,) if new else ())
                    w.known[slot] = True
                    w.sent += 1
                except OSError:
                    self._lost(w)
                    with w.turn:
                        w.turn.notify_all()
                    raise WorkerDied(self._died_message(w, worker)) from None
        finally:
            if sent is not None:
                sent()
        fds: List[int] = []
        with w.turn:  # the replies come in the order the requests went out
            while w.received != ticket and w.dead is None:
                w.turn.wait(0.5)  # (a notify a stop could miss: see w.dead again)
            try:
                if w.dead is not None:
                    raise EOFError
                answers, pid, data, fds = _recv_reply(w.sock)
                if pid != w.pid:
                    raise _BadReply(f"a reply that answers process {pid}, not the worker (a "
                                    "process forked inside map writing to its socket?)")
                if answers != ticket:
                    raise _BadReply(f"a reply that answers request {answers}, while request "
                                    f"{ticket} was awaited")
                reply = pickle.loads(data)
            except (EOFError, OSError):
                self._lost(w)
                w.turn.notify_all()
                raise WorkerDied(self._died_message(w, worker)) from None
            except Exception as e:  # _BadReply, or a payload that does not unpickle
                for fd in fds:
                    os.close(fd)
                why = str(e) if isinstance(e, _BadReply) else \
                    f"a reply that cannot be read ({type(e).__name__}: {e})"
                self._fault(w, why)
                w.turn.notify_all()
                raise WorkerDied(self._died_message(w, worker)) from None
            w.received += 1
            w.turn.notify_all()
        _, encoded, offsets, errors, skipped, new_size, times = reply
        if fds:  # the worker needed a larger arena for this slot
            with w.lock:
                old, w.arenas[slot] = w.arenas[slot], _Arena(fds[0], new_size)
            old.close()
        arena = w.arenas[slot]
        view = not copy
        rows = [None if r is None else _decode(r, arena, offsets, view) for r in encoded]
        if copy:
            lease.release()
        return rows, errors, skipped, times, lease

    def _lost(self, w: _Worker) -> None:
        if w.dead is None:
            w.dead = self._exit_status(w)

    @staticmethod
    def _fault(w: _Worker, why: str) -> None:
        """The worker's replies can no longer be told apart: it is ended (NOTE [ Worker
        faults ]); start() reaps it and starts another."""
        if w.dead is None:
            w.dead = f"sent {why}: its replies can no longer be trusted, it was stopped"
        w.hang_up()
        try:
            os.kill(w.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _died_message(self, w: Optional[_Worker], slot: int) -> str:
        what = w.dead if w is not None and w.dead else "is not running"
        pid = w.pid if w is not None else "-"
        return (f"stoker: Python worker process {slot} (pid {pid}) {what}; the batch it held "
                "fails. The next iter() starts a new worker in its place")

    @staticmethod
    def _exit_status(w: _Worker) -> str:
        for _ in range(50):
            try:
                pid, status = os.waitpid(w.pid, os.WNOHANG)
            except ChildProcessError:
                return "ended"
            if pid:
                if os.WIFSIGNALED(status):
                    sig = os.WTERMSIG(status)
                    name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ \
                        else str(sig)
                    hint = " (killed: out of memory?)" if sig == signal.SIGKILL else ""
                    return f"was killed by signal {name}{hint}"
                return f"exited with status {os.WEXITSTATUS(status)}"
            time.sleep(0.01)
        return "stopped answering"

    def stop(self) -> None:
        """Ends every worker within a few seconds, whatever it is doing (NOTE [ Worker
        faults ]), and waits for them."""
        with self._lock:
            if self._pid != os.getpid():
                return
            workers = [w for w in self._workers if w is not None]
            self._workers = [None] * self.count
            self._all.clear()
        _end_workers(workers)

    def pids(self) -> List[int]:  # noqa: D102
        return [w.pid for w in self._workers if w is not None and w.dead is None]

    def doing(self, worker: int) -> Optional[Tuple[int, int, Optional[str], float, bool]]:
        """(pid, dataset index, phase, since, stopped) of worker `worker`, what its status
        says (the phase None while it waits for a chunk); None if it is not running."""
        w = self._workers[worker] if 0 <= worker < len(self._workers) else None
        if w is None or w.dead is not None:
            return None
        index, phase, since = w.status.read()
        return w.pid, index, phase, since, _stopped(w.pid)


def _stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP, a debugger)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _end_workers(workers: List[_Worker]) -> None:
    """Ends `workers` within _STOP_SECONDS + _TERM_SECONDS + _KILL_SECONDS whatever they
    run (NOTE [ Worker faults ]): a hang-up (they read EOF and end), then SIGTERM, then
    SIGKILL; reaped; their sockets and arenas closed."""
    for w in workers:
        if w.dead is None:
            w.dead = "was stopped (the loader closed)"
        w.hang_up()
        if w.turn.acquire(timeout=0.1):  # threads waiting for their turn: it never comes
            try:
                w.turn.notify_all()
            finally:
                w.turn.release()
    left = {w.pid for w in workers}
    for sig, seconds in ((0, _STOP_SECONDS), (signal.SIGTERM, _TERM_SECONDS),
                         (signal.SIGKILL, _KILL_SECONDS)):
        for pid in left if sig else ():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + seconds
        while left:
            for pid in list(left):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    left.discard(pid)
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.005)
        if not left:
            break
    for w in workers:
        w.close_socket()
        w.close_arenas()


def _end_all(workers: List[_Worker], pid: int) -> None:
    """Ends the workers of a dropped pool and closes their arenas."""
    if os.getpid() == pid:
        _end_workers(list(workers))


# -- right after the fork, in the worker ------------------------------------------------------

def _become_worker(loader_pid: int, from_main: bool, sock: socket.socket, arena_fd: int) -> None:
    """Ties the new worker's life to the loader's process, and lets go of every socket
    end and arena of the loader's that it inherited (NOTE [ Worker faults ])."""
    global _SPAWN_LOCK
    _SPAWN_LOCK = threading.Lock()  # held by the thread that forked: not in this process
    if from_main:
        # The signal follows the thread that forked; the main thread ends only with the
        # process. From another thread (which may end before the loader) the watchdog.
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            arg = ctypes.c_ulong
            if libc.prctl(ctypes.c_int(1), arg(int(signal.SIGKILL)), arg(0), arg(0),
                          arg(0)) != 0:  # PR_SET_PDEATHSIG
                from_main = False
        except (OSError, AttributeError):
            from_main = False
    if os.getppid() != loader_pid:  # the loader's process ended before that
        os._exit(0)
    if not from_main:
        threading.Thread(target=_watch_parent, args=(loader_pid,), name="stoker-watchdog",
                         daemon=True).start()
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        own = sock.fileno()
        for fd, ino in list(_loader_ends.items()):
            try:
                if fd != own and os.fstat(fd).st_ino == ino:
                    os.dup2(devnull, fd, inheritable=False)
            except OSError:
                pass
        _loader_ends.clear()
        for a in list(_arenas):
            _reserve(a)
        _arenas.clear()
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd in (arena_fd, devnull, own):
                continue
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith(f"/memfd:{_ARENA_NAME}"):
                os.dup2(devnull, fd, inheritable=False)
    finally:
        os.close(devnull)


def _reserve(arena: _Arena) -> None:
    """Replaces an inherited arena's shared mapping by a reservation of the same
    addresses that holds no memory (the Python objects that point there are the loader's,
    never used in the worker; a later munmap of them is harmless)."""
    import ctypes

    try:
        buf = (ctypes.c_char * arena.size).from_buffer(arena.map)
    except (TypeError, ValueError, BufferError):  # closed
        return
    addr = ctypes.addressof(buf)
    del buf
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    prot_none, private, fixed, anonymous, noreserve = 0, 0x02, 0x10, 0x20, 0x4000
    libc.mmap(addr, arena.size, prot_none, private | fixed | anonymous | noreserve, -1, 0)


def _watch_parent(loader_pid: int) -> None:
    """A worker forked from a thread other than the main one: ends when its parent does."""
    while os.getppid() == loader_pid:
        time.sleep(0.25)
    os.kill(os.getpid(), signal.SIGKILL)
