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
    the requests went out; each thread reads its own (a ticket per request). The tuner's
    count of active threads moves both threads of a worker.
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
    replacing a sample by the next good one in dataset order, in the worker.
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
from typing import Any, Dict, List, Optional, Tuple

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
_HEADER = struct.Struct("<Q")


class WorkerDied(RuntimeError):
    """A Python worker process ended while it held a chunk."""


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


# -- arrays through the arena ------------------------------------------------------------

class _Arena:
    """A shared mapping of a memfd: a worker writes, the loader's process reads."""

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.size = size
        self.map = mmap.mmap(fd, size)
        self.array = np.frombuffer(self.map, np.uint8)

    @classmethod
    def create(cls, size: int) -> "_Arena":
        fd = os.memfd_create("stoker-python-arena", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return cls(fd, size)

    def resident(self) -> int:
        """Bytes of memory the arena holds (its pages that were written)."""
        return os.fstat(self.fd).st_blocks * 512

    def close(self) -> None:
        self.array = None
        try:
            self.map.close()
        except BufferError:  # views still exported: the mapping goes with them
            pass
        os.close(self.fd)


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


def _worker_main(sock: socket.socket, arena: _Arena, stage: Any) -> None:
    """A worker's loop: chunks in, rows out, until EOF or "stop"."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loader's to handle
    stage = stage.worker_copy()
    try:
        import torch

        torch.set_num_threads(1)  # the workers are the parallelism, as DataLoader's
    except Exception:
        pass
    arenas: Dict[int, _Arena] = {0: arena}
    usage = _Usage()
    while True:
        try:
            data, fds = _recv(sock)
        except (EOFError, OSError):
            return
        msg = pickle.loads(data)
        if msg[0] == "stop":
            return
        _, epoch, indices, slot, size = msg
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
            try:
                rows.append(stage.worker_sample(index, epoch,
                                                None if keys is None else keys[pos]))
                continue
            except Exception as e:
                first = e
            rows.append(None)
            if stage.skip:
                alt_row, ok = stage._replacement(index, epoch, stage.worker_sample)
                if ok:
                    rows[-1] = alt_row
                    skipped += 1
                    continue
            errors[pos] = _portable_error(first)
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
            _send(sock, payload, out_fds)
        except OSError:
            return


# -- the loader's side ----------------------------------------------------------------

class _Worker:
    """The loader's side of one worker process: its socket, its arenas (leased to
    requests), and the order of its replies."""

    __slots__ = ("pid", "sock", "arenas", "free", "known", "lock", "send_lock", "turn",
                 "sent", "received", "dead", "leases")

    def __init__(self, pid: int, sock: socket.socket, arena: _Arena):
        self.pid = pid
        self.sock = sock
        self.arenas: List[_Arena] = [arena]  # by slot; the worker maps the same
        self.free: List[int] = [0]
        self.known: List[bool] = [True]  # whether the worker has this slot's arena
        self.lock = threading.Lock()  # new arenas
        self.send_lock = threading.Lock()
        self.turn = threading.Condition(threading.Lock())  # replies, in request order
        self.sent = 0
        self.received = 0
        self.dead: Optional[str] = None
        self.leases = 0

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


class ProcessWorkers:
    """The worker processes of one loader's stage (NOTE [ Python stage processes ])."""

    def __init__(self, count: int):
        import weakref

        self.count = count
        self._workers: List[Optional[_Worker]] = [None] * count
        self._lock = threading.Lock()
        self._pid = -1
        # Dropped without stop(): the workers still end, and are waited for.
        self._all: List[_Worker] = []
        weakref.finalize(self, _end_all, self._all, os.getpid())

    def start(self, stage: Any) -> None:
        """Starts the workers that are not running (all of them in a process forked from
        the one that started them), each with a copy of `stage` (NOTE [ Python stage
        processes ]). Called before the stage's threads start."""
        with self._lock:
            if self._pid != os.getpid():
                self._workers = [None] * self.count  # a child has none of the parent's
                self._pid = os.getpid()
            for i, w in enumerate(self._workers):
                if w is None or w.dead is not None:
                    if w is not None:
                        self._reap(w)
                    self._workers[i] = self._spawn(stage)
                    self._all.append(self._workers[i])

    def _spawn(self, stage: Any) -> _Worker:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        arena = _Arena.create(_ARENA_BYTES)
        sys.stdout.flush()
        sys.stderr.flush()
        # The objects the worker inherits go to the collector's permanent generation in
        # the worker: its collections never walk them, so their pages stay shared with
        # the loader's process instead of being copied as the walk writes to each
        # object's header (the parent takes them back at once). Left alone if the
        # program froze objects itself: unfreezing would undo its own freeze.
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
                parent.close()
                _worker_main(child, arena, stage)
            except BaseException:
                code = 1
                try:
                    traceback.print_exc()
                except Exception:
                    pass
            finally:
                os._exit(code)
        child.close()
        return _Worker(pid, parent, arena)

    def run(self, worker: int, epoch: int, indices: List[int],
            copy: bool = False) -> Tuple[Any, ...]:
        """Maps `indices` on worker `worker`: (rows, errors, skipped, times, lease). The
        top-level arrays of each row are views of an arena that `lease` holds until its
        release() (all arrays copied out with `copy`, and the lease released at once)."""
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
                _send(w.sock, pickle.dumps(("chunk", epoch, indices, slot,
                                            arena.size if new else 0)),
                      (arena.fd,) if new else ())
                w.known[slot] = True
                w.sent += 1
            except OSError:
                self._lost(w)
                with w.turn:
                    w.turn.notify_all()
                raise WorkerDied(self._died_message(w, worker)) from None
        with w.turn:  # the replies come in the order the requests went out
            while w.received != ticket and w.dead is None:
                w.turn.wait()
            try:
                if w.dead is not None:
                    raise EOFError
                data, fds = _recv(w.sock)
            except (EOFError, OSError):
                self._lost(w)
                w.turn.notify_all()
                raise WorkerDied(self._died_message(w, worker)) from None
            w.received += 1
            w.turn.notify_all()
        reply = pickle.loads(data)
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

    def _reap(self, w: _Worker) -> None:
        try:
            w.sock.close()
        except OSError:
            pass
        try:
            os.kill(w.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(w.pid, 0)
        except ChildProcessError:
            pass
        w.close_arenas()

    def stop(self) -> None:
        """Ends every worker (they read "stop", or EOF), waits for them."""
        with self._lock:
            if self._pid != os.getpid():
                return
            workers, self._workers = self._workers, [None] * self.count
            self._all.clear()
        for w in workers:
            if w is None:
                continue
            with w.send_lock:  # after the chunks it may be running
                try:
                    _send(w.sock, pickle.dumps(("stop",)))
                except OSError:
                    pass
                try:
                    w.sock.close()
                except OSError:
                    pass
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    pid, _ = os.waitpid(w.pid, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid:
                    break
                time.sleep(0.005)
            else:
                self._reap(w)
                continue
            w.close_arenas()

    def pids(self) -> List[int]:  # noqa: D102
        return [w.pid for w in self._workers if w is not None and w.dead is None]


def _end_all(workers: List[_Worker], pid: int) -> None:
    """Ends the workers of a dropped pool (their sockets close: they read EOF)."""
    if os.getpid() != pid:
        return
    for w in workers:
        try:
            w.sock.close()
        except OSError:
            pass
    deadline = time.monotonic() + 2
    for w in workers:
        while True:
            try:
                done, _ = os.waitpid(w.pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done:
                break
            if time.monotonic() > deadline:
                try:
                    os.kill(w.pid, signal.SIGKILL)
                    os.waitpid(w.pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
                break
            time.sleep(0.005)
