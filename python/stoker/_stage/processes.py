"""Process workers for the Python stage: ``Loader(..., python_workers="process")``: the
loader's side and the worker's loop; what crosses between them is in transport.py, a
worker's start and end in lifecycle.py, the order of the requests (SendOrder) in taking.py.

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
  rows <- views of arena a,        <------      reply: where each array is (a sample
  checked; arena a leased to the batch          checked here too with on_error="skip")
  the batch's last chunk: native batching (the one copy out of the arenas), collate_fn,
  batch_map, complete(); the batch's arenas are free again. Once the layout is known, a
  worker writes fixed-shape arrays straight into their batch instead (NOTE [ Direct rows ]
  in direct.py): nothing of them is copied in the loader's process

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
    too (never skipped); the worker goes on. Faults: NOTE [ Worker faults ] in lifecycle.py.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from .. import _core
from . import lifecycle
from .direct import ASK, ChunkRows, WorkerBlocks, answer_ask, request_part
from .lifecycle import (
    _become_worker,
    _end_all,
    _end_workers,
    _loader_ends,
    died_message,
    exit_status,
    process_stopped,
)
from .rng import rng_keys
from .taking import SendOrder
from .telemetry import native_times, thread_sched
from .transport import (
    _MAGIC,
    _REPLY,
    _STATUS_BYTES,
    _Arena,
    _BadReply,
    _decode,
    _portable_error,
    _recv,
    _recv_reply,
    _send,
    _SharedStatus,
    _Usage,
    _Writer,
)
from .workers import prepare_chunk

__all__ = ["Lease", "ProcessWorkers", "SendOrder", "WorkerDied", "fork_worker"]

_ARENA_BYTES = 64 << 20  # a worker's first arena; a larger chunk gets a larger one
_ROUND_EVERY = 16  # every this many leases take the arena idle longest (_Worker.lease)


class WorkerDied(RuntimeError):
    """A Python worker process ended while it held a chunk (or sent a reply that answers
    no awaited request: NOTE [ Worker faults ] in lifecycle.py)."""


def _never() -> bool:
    return False


# A sample left undone as its epoch ended: never raised (its batch's stream stopped).
_DROPPED = RuntimeError("stoker: left undone: the epoch of its batch had ended")


# -- the worker process -------------------------------------------------------------------

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


def _worker_main(sock: socket.socket, arena: _Arena, stage: Any,
                 status: Optional[_SharedStatus] = None, worker_id: int = 0,
                 num_workers: int = 1, start_epoch: Optional[int] = None) -> None:
    """A worker's loop: chunks in, rows out, until EOF or "stop". Its first init is for
    `start_epoch` (the iter() that started it; None: a move to processes mid-epoch)."""
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
    blocks = WorkerBlocks()  # batches the rows go straight into (NOTE [ Direct rows ])
    inbox: Deque[Tuple[Any, List[int]]] = deque()  # came while a block was awaited

    def recv() -> Tuple[Any, List[int]]:
        data, fds = _recv(sock)
        return pickle.loads(data), fds

    last_epoch, init_epoch = None, start_epoch
    while True:
        if status is not None:
            status.idle()
        try:
            msg, fds = inbox.popleft() if inbox else recv()
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        _, ticket, epoch, indices, slot, size = msg[:6]
        if epoch != last_epoch:  # shards checked again (NOTE [ Verified once ]); init
            # before anything of each epoch is read (its first init was for init_epoch)
            if not stage.persistent_workers and (last_epoch is not None or (
                    init_epoch is not None and epoch != init_epoch)):
                init_error = stage.worker_started(worker_id, num_workers)
            last_epoch = init_epoch = epoch
            _core.new_file_check_round()
        listed, part = (msg + (None, None))[6:8]
        if hasattr(stage.source, "keys"):  # a sampler's items that are not indices
            stage.source.keys = None if listed is None else {epoch: dict(zip(indices, listed))}
        if size:  # a new arena for this slot, made by the loader's process
            if slot in arenas:
                arenas[slot].close()
            arenas[slot] = _Arena(fds.pop(0), size)
            usage.reset(slot)
        arena = arenas[slot]
        ask = blocks.request(part)
        wall0 = time.perf_counter_ns()
        cpu0, wait0 = thread_sched()
        times = native_times.reset()
        keys = rng_keys(stage.seed, epoch, indices) if stage.map_fn is not None else None
        prepare_chunk(stage.seed, epoch, indices)  # keys of the global generators
        rows: List[Any] = []
        errors: Dict[int, Any] = {}
        skipped = 0
        if ask and indices:  # answered while the first sample is made
            with contextlib.suppress(OSError):  # (then EOF at the answer)
                _send_reply(sock, ticket, ASK)
        writer = _Writer()
        chunk = ChunkRows(blocks, writer, recv, sock, ticket, inbox, ask and bool(indices),
                          errors, lambda j, ix=indices: stage.describe(ix[j]))
        for pos, index in enumerate(indices):
            try:
                chunk.flush(rows)
            except (EOFError, OSError):
                return
            if init_error is not None:
                rows.append(None)
                errors[pos] = _portable_error(init_error)
                continue
            if status is not None and status.dropped(ticket):  # its epoch ended (NOTE
                rows.append(None)  # [ Stuck workers ] in stuck.py): nobody reads them
                errors[pos] = _DROPPED
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
        try:
            chunk.flush(rows, wait=True)
        except (EOFError, OSError):
            return
        encoded = rows
        out_fds: Tuple[int, ...] = ()
        if writer.total > arena.size:
            old = arena
            arena = arenas[slot] = _Arena.create(max(writer.total, 2 * old.size))
            old.close()
            usage.reset(slot)
            out_fds = (arena.fd,)
        offsets = writer.write(arena)
        usage.used(arena, slot, writer.total, chunk.block is not None)
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
                 "sent", "received", "dead", "leases", "status", "stopped", "blocks",
                 "__weakref__")

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
        self.blocks: Set[int] = set()  # batch blocks it has mapped (NOTE [ Direct rows ])
        # Per request not answered yet (by ticket): its epoch, and whether its batch's
        # stream stopped (NOTE [ Stuck workers ] in stuck.py).
        self.stopped: Dict[int, Tuple[int, Callable[[], bool]]] = {}

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
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close_socket(self) -> None:
        _loader_ends.pop(self.sock.fileno(), None)  # atomic: a finalizer may call it
        with contextlib.suppress(OSError):
            self.sock.close()


class Lease:
    """Rows that are views of a worker's arena: release() lets the worker write into it
    again. Released when the batch holding the rows is assembled or dropped (also when
    this object goes away)."""

    __slots__ = ("_worker", "_slot", "trim", "__weakref__")

    def __init__(self, worker: _Worker, slot: int):
        self._worker: Optional[_Worker] = worker
        self._slot = slot
        # True once rows go straight into their batches: the arena gives its pages back
        # when released (the first batches' rows came by it: NOTE [ Direct rows ])
        self.trim: Optional[Callable[[], bool]] = None

    def release(self) -> None:
        w, self._worker = self._worker, None
        if w is not None:
            if self.trim is not None and self.trim():
                with contextlib.suppress(IndexError):  # (its arenas closed: stopped)
                    w.arenas[self._slot].give_back()
            w.give_back(self._slot)

    def __del__(self) -> None:
        self.release()


def fork_worker(main: Callable[[socket.socket, _Arena, _SharedStatus], None]) -> _Worker:
    """A worker process forked from this one, running `main(sock, arena, status)` (its
    socket, its first arena, its status) until it returns; the loader's side of it (NOTE
    [ Python stage processes ], NOTE [ Worker faults ] in lifecycle.py)."""
    from_main = threading.current_thread() is threading.main_thread()
    loader_pid = os.getpid()
    status = _SharedStatus(mmap.mmap(-1, _STATUS_BYTES))  # shared with the worker
    status.idle()
    status.drop_through(-1)
    with lifecycle._SPAWN_LOCK:  # read at each fork: _become_worker replaces it
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fd = _Arena.new_fd(_ARENA_BYTES)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = lifecycle.fork_frozen()
        if pid == 0:  # the worker: never returns into the loader's code
            code = 0
            try:
                _become_worker(loader_pid, from_main, child, fd)
                parent.close()
                main(child, _Arena(fd, _ARENA_BYTES), status)
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


class ProcessWorkers:
    """The worker processes of one loader's stage (NOTE [ Python stage processes ])."""

    def __init__(self, count: int):
        self.count = count
        self._workers: List[Optional[_Worker]] = [None] * count
        self._lock = threading.Lock()
        self._pid = -1
        # Dropped without stop(): the workers still end, and are waited for; the arenas
        # are closed (NOTE [ Worker faults ] in lifecycle.py).
        self._all: List[_Worker] = []
        weakref.finalize(self, _end_all, self._all, os.getpid())

    def start(self, stage: Any, epoch: Optional[int] = None) -> None:
        """Starts the workers that are not running (all of them in a process forked from
        the one that started them), each with a copy of `stage` (NOTE [ Python stage
        processes ]), at iter() of `epoch`. Called before the stage's threads start."""
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
                    self._workers[i] = self._spawn(stage, i, epoch)
                    self._all.append(self._workers[i])

    def _spawn(self, stage: Any, worker_id: int = 0, epoch: Optional[int] = None) -> _Worker:
        count = self.count
        return fork_worker(lambda sock, arena, status: _worker_main(
            sock, arena, stage, status, worker_id, count, epoch))

    def run(self, worker: int, epoch: int, indices: List[int], copy: bool = False,
            turn: Optional[Callable[[], None]] = None,
            sent: Optional[Callable[[], None]] = None,
            stopped: Optional[Callable[[], bool]] = None, keys: Optional[List[Any]] = None,
            plan: Optional[Callable[[], Any]] = None, lo: int = 0) -> Tuple[Any, ...]:
        """Maps `indices` on worker `worker`: (rows, errors, skipped, times, lease). The
        top-level arrays of each row are views of an arena that `lease` holds until its
        release() (all arrays copied out with `copy`, and the lease released at once).
        `turn` waits for this request's turn to go out (SendOrder), `sent` says it went
        (or never will); `stopped` says whether the request's batch is no longer wanted
        (NOTE [ Stuck workers ] in stuck.py). `keys`: a sampler's items at those positions,
        where they are not indices (passed to __getitem__ as they are). `plan`, called as
        the worker asks: the DirectBatch the rows go into at position `lo`, or None
        (NOTE [ Direct rows ] in direct.py)."""
        try:
            if turn is not None:
                turn()
            w = self._workers[worker]
            if w is None or w.dead is not None:
                raise WorkerDied(self._died_message(w, worker))
            slot = w.lease()
            lease = Lease(w, slot)
            lost = False
            with w.send_lock:
                new = not w.known[slot]
                arena = w.arenas[slot]
                ticket = w.sent
                try:
                    part = request_part(plan is not None, w.blocks)
                    msg = ("chunk", ticket, epoch, indices, slot, arena.size if new else 0,
                           keys, part)
                    _send(w.sock, pickle.dumps(msg), (arena.fd,) if new else ())
                    w.known[slot] = True
                    w.stopped[ticket] = (epoch, stopped or _never)
                    w.sent += 1
                except OSError:
                    lost = True
            if lost:  # (w.turn, never under send_lock: a reader answers asks under turn)
                self._lost(w)
                with w.turn:
                    w.turn.notify_all()
                raise WorkerDied(self._died_message(w, worker)) from None
        finally:
            if sent is not None:
                sent()
        fds: List[int] = []
        direct = plan_error = None  # the DirectBatch its rows go into, once asked
        with w.turn:  # the replies come in the order the requests went out
            while w.received != ticket and w.dead is None:
                w.turn.wait(0.5)  # (a notify a stop could miss: see w.dead again)
            try:
                if w.dead is not None:
                    raise EOFError
                while True:  # its ask for the block (NOTE [ Direct rows ]), then the rows
                    answers, pid, data, fds = _recv_reply(w.sock)
                    if pid != w.pid:
                        raise _BadReply(f"a reply that answers process {pid}, not the worker "
                                        "(a process forked inside map writing to its socket?)")
                    if answers != ticket:
                        raise _BadReply(f"a reply that answers request {answers}, while "
                                        f"request {ticket} was awaited")
                    reply = pickle.loads(data)
                    if reply[0] != "block?" or plan is None:
                        break
                    direct, plan_error = answer_ask(w, plan, ticket, lo)
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
            w.stopped.pop(ticket, None)
            w.received += 1
            w.turn.notify_all()
        _, encoded, offsets, errors, skipped, new_size, times = reply
        if fds:  # the worker needed a larger arena for this slot
            with w.lock:
                old, w.arenas[slot] = w.arenas[slot], _Arena(fds[0], new_size)
            old.close()
        if plan_error is not None:
            raise plan_error
        arena = w.arenas[slot]
        view = not copy
        rows = [None if r is None else _decode(r, arena, offsets, view, direct)
                for r in encoded]
        if copy:
            lease.release()
        return rows, errors, skipped, times, lease

    def _lost(self, w: _Worker) -> None:
        if w.dead is None:
            w.dead = exit_status(w)

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
        return (f"{died_message(w, slot)}; the batch it held fails. The next iter() starts a "
                "new worker in its place")

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
        return w.pid, index, phase, since, process_stopped(w.pid)

