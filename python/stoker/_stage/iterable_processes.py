"""An IterableDataset's worker processes (NOTE [ Iterable datasets in processes ]): each
iterates its share of the dataset and maps its rows in a process of its own, and the
reading merges them as it merges its worker threads' (iterable.py).

NOTE [ Iterable datasets in processes ]
An IterableDataset's iterator and map= are Python, and on worker threads they share one
GIL: two threads of a JPEG stream made 0.86x of DataLoader's two processes. So, by the
rule of a map-style dataset (NOTE [ Worker processes for num_workers ] in
stoker/_dropin.py), its num_workers > 0 workers are processes when python_workers is left
at "auto" (or is "process"), threads with python_workers="thread":

  reading (loader's process, the stage thread)      worker process w of N
  --------------------------------------------      ---------------------
  at its start: the N workers (forked at the        get_worker_info() says (w, N);
  first, kept for the next ones) are told its  -->  at each start: the state loaded,
  epoch, a state loaded into the dataset, and       set_epoch(epoch), random/numpy/
  whether worker_init_fn runs                       torch seeded from (seed, epoch, w),
                                                    worker_init_fn, iter(dataset)
  asks worker w for up to C rows, requests     --> next() and map (its draws keyed by
  in flight, each with an arena of its own          the row's place in the merged
                                                    stream, as on threads), arrays into
  rows as views of the arena, taken             <-- the request's arena, the rest
  round-robin (0, 1, ..., skipping ended ones),     pickled; "ended" after its last row
  the arena leased until their batch is made

  * The same sharding, merge, keys, skip, resume and epoch rules as the threads
    (NOTE [ Iterable datasets ]): a reading of the same seed and worker count gives the
    same batches either way. The loader's process never runs the dataset's iterator.
  * Replies are small (C = 8 rows at most) and many are asked for at once, as many as
    make what a worker may read ahead (IterableRows.queue_rows): a row reaches the loop
    once its reply's few rows are made, and a worker never waits for a request. With an
    explicit prefetch: one row, one request in flight.
  * Rows are views of the arena they arrived in, not copies (as the map-style stage's,
    NOTE [ Python stage processes ] in processes.py): the batch is made from them, with
    one copy, and a reply's arena goes back to the worker once every row it brought is
    in a batch or dropped (ReplyLease, counted per row; a step's leases are held by its
    batch: StepHold). A worker whose arenas are all leased is given a new one. Rows
    kept beyond their batch are copied: object fields (the batch holds them as they
    are), the epoch's first rows kept to pad its end; with a collate_fn (which may keep
    what it is given) every row is copied out.
  * Errors: an exception of map or of the dataset's iterator comes back as itself (its
    traceback's text in a note: transport._portable_error) at its row's place; after
    the iterator's own error that worker's share ends, as on threads. A worker that
    dies (a signal, a crash in native code) raises at its place in the stream, in
    DataLoader's words (lifecycle.died_message), and ends the iterator (NOTE [ After a
    failed batch ] in stoker/_iterator.py); the next iter() forks new workers.
  * The workers persist across readings, as the map-style stage's do (NOTE [ Worker
    processes for num_workers ] in stoker/_dropin.py): forked once, they keep what they
    imported and built (a worker that re-imported albumentations at every epoch ran
    3x the CPU of one that kept it). The dataset's set_epoch and a state that
    load_state_dict() gave reach their copies; other changes made to the dataset object
    in the training process after their fork do not (as with DataLoader's
    persistent_workers=True); worker_init_fn runs again at each epoch unless
    persistent_workers. A reading that stops before its stream's end (a break, a
    resume, close()) ends its workers, as does a worker's death; the next reading forks
    new ones. So does an IterDataPipe's (each reading its own sharded copies).
  * Workers are ended within the bounded time of NOTE [ Worker faults ] in
    processes.py (close(), a dropped loader, interpreter exit), whose other rules hold
    here too (tied to the loader's process, rid of the other workers' sockets and
    arenas).
"""

from __future__ import annotations

import os
import pickle
import queue
import select
import signal
import socket
import threading
import time
import weakref
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Tuple

from . import lifecycle
from .errors import add_note
from .iterable_workers import DONE, Failed, Skipped, warn_self_split, watch_rank_calls
from .lifecycle import died_message
from .processes import _ARENA_BYTES, WorkerDied, _send_reply, _Worker, fork_worker
from .telemetry import thread_sched
from .transport import (
    _Arena,
    _BadReply,
    _decode,
    _portable_error,
    _recv,
    _recv_reply,
    _send,
    _Writer,
)
from .workers import seed_globals, set_process_worker_info, set_thread_worker_info

__all__ = ["StreamProcesses", "ReplyLease", "StepHold"]


# -- the worker process -------------------------------------------------------------------


def _readable(sock: socket.socket, timeout: float) -> bool:
    """Whether `sock` has data (or its end) within `timeout` seconds. poll, not select:
    a training process often holds over 1024 files, and select takes no fd past that."""
    p = select.poll()
    p.register(sock, select.POLLIN)
    return bool(p.poll(int(max(0.0, timeout) * 1000 + 0.999)))

def _stream_main(sock: socket.socket, arena: _Arena, reading: Any, wid: int, n: int,
                 pipe: Any) -> None:
    """Worker `wid` of `n`'s loop: a reading's start, then requests for rows in and its
    share of the stream out; again for each reading it serves, until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loader's to handle
    s = reading.stream
    rows: Any = None
    error: Optional[BaseException] = None
    setup_error: Optional[BaseException] = None
    try:
        import torch

        torch.set_num_threads(1)  # the workers are the parallelism, as DataLoader's
        set_process_worker_info(wid, n, s.seed, s.dataset)
        set_thread_worker_info(wid, n, s.seed, s.dataset)
    except BaseException as e:
        setup_error = e
    arenas: Dict[int, _Arena] = {0: arena}
    j = 0
    ended = True
    while True:
        try:
            data, fds = _recv(sock)
        except (EOFError, OSError):
            return
        msg = pickle.loads(data)
        if msg[0] == "start":  # a reading: its epoch, the dataset's state, worker_init_fn
            _, epoch, world, state, init = msg
            reading.epoch, reading.world = epoch, world
            j, ended, error = 0, False, setup_error
            if error is None:
                try:
                    if state is not None:
                        s.dataset.load_state_dict(state)
                    fn = getattr(s.dataset, "set_epoch", None)
                    if callable(fn):
                        fn(epoch)
                    seed_globals(s.seed, epoch, wid)  # workers draw apart, as DataLoader's
                    if s.split_ranks and world > 1:
                        watch_rank_calls(s, quiet=True)
                    if s.worker_init_fn is not None and init:
                        s.worker_init_fn(wid)
                    rows = iter(s.dataset if pipe is None else pipe)
                except BaseException as e:
                    error = e
            continue
        _, ticket, want, slot, size = msg
        if fds:  # a new arena for this slot, made by the loader's process
            if slot in arenas:
                arenas[slot].close()
            arenas[slot] = _Arena(fds[0], size)
        got: List[Any] = []
        wall0, cpu0, (_, wait0) = time.perf_counter_ns(), time.thread_time_ns(), thread_sched()
        while not ended and len(got) < want:
            if error is None:
                try:
                    item = next(rows)
                except StopIteration:
                    ended = True
                    break
                except BaseException as e:
                    error = e
            if error is not None:
                got.append(Failed(add_note(error, f"stoker: raised by the IterableDataset "
                                                  f"in worker {wid}")))
                ended = True
                break
            # keyed by the row's place in the merged stream while every worker runs
            try:
                got.append(reading.mapped(item, j * n + wid))
            except BaseException as e:  # SystemExit, KeyboardInterrupt: raised, never skipped
                got.append(Failed(add_note(e, f"stoker: raised by map in worker {wid}")))
            j += 1
        writer = _Writer()
        out: List[Tuple[str, Any]] = []
        for x in got:
            if isinstance(x, Skipped):
                out.append(("skipped", x.what))
            elif isinstance(x, Failed):
                out.append(("failed", _portable_error(x.error)))
            else:
                try:
                    out.append(("row", writer.encode(x)))
                except Exception as e:  # (plain_array refuses what it cannot carry)
                    out.append(("failed", _portable_error(TypeError(
                        f"stoker: a row cannot leave worker {wid}: {type(e).__name__}: {e}"))))
        a = arenas[slot]
        new_size = 0
        if writer.total > a.size:
            a.close()
            a = arenas[slot] = _Arena.create(max(writer.total, 2 * a.size))
            new_size = a.size
        offsets = writer.write(a)
        # the reply's time in Python (the dataset's iterator, map, the rows into the arena):
        # wall, CPU (exact: the schedstat's is as of the last switch), waiting for a core
        wall, cpu, (_, wait) = time.perf_counter_ns() - wall0, time.thread_time_ns(), \
            thread_sched()
        times = (wall, max(0, cpu - cpu0), max(0, wait - wait0))
        reply = (out, offsets, ended, new_size, times, s.warned_self_split)
        try:
            payload = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # an unpicklable row: it fails, and the share ends
            ended = True
            payload = pickle.dumps(([("failed", _portable_error(TypeError(
                f"the IterableDataset (or map) gave a value that cannot leave the worker "
                f"process: {e}")))], [], True, new_size, (0, 0, 0), s.warned_self_split))
        try:
            _send_reply(sock, ticket, payload, (a.fd,) if new_size else ())
        except OSError:
            return


# -- the loader's side --------------------------------------------------------------------

class StreamProcess:
    """The reading's side of worker process `wid`: its requests in flight and the rows
    they brought, taken one at a time (the interface of a StreamWorker thread)."""

    def __init__(self, stream: Any, worker: _Worker, wid: int, chunk: int, in_flight: int,
                 ahead: int):
        self.stream = stream
        self.w, self.wid = worker, wid
        self.chunk, self.in_flight = chunk, in_flight
        self.ahead = ahead  # rows it may hold beyond those taken: buffered or asked for
        self.rows: Deque[Any] = deque()
        # each row's ReplyLease (None: a copy, an error, a skip), in step with `rows`
        self.leases: Deque[Optional[ReplyLease]] = deque()
        self.pending: Deque[Tuple[int, int]] = deque()  # (ticket, slot), in order
        self.free = list(range(in_flight))
        self.known = [True] + [False] * (in_flight - 1)  # slot 0: the fork's arena
        # (closed with the worker; a memfd's pages are taken only as they are written)
        self.arenas = worker.arenas
        self.arenas += [_Arena.create(_ARENA_BYTES) for _ in range(in_flight - 1)]
        self.ended = True  # the worker said its share ended (or serves no reading)
        self.gone = True  # nothing more to take: ended and emptied, or the worker died

    def begin(self, epoch: int, world: int, state: Any, init: bool) -> None:
        """The worker starts its share of a reading of `epoch` (the dataset given `state`
        first, where one was loaded; worker_init_fn run if `init`)."""
        _send(self.w.sock, pickle.dumps(("start", epoch, world, state, init)))
        self._drop_rows()
        self.ended = self.gone = False

    def idle(self) -> bool:
        """Whether the worker can serve another reading: alive, its share's end read
        (replies still owed for it come at once, and are read here)."""
        if self.w.dead is not None or not self.ended:
            return False
        try:
            while self.pending:
                if not _readable(self.w.sock, _DRAIN_SECONDS):
                    return False
                self._receive()
        except (EOFError, OSError, _BadReply):
            return False
        self._drop_rows()
        return True

    def _drop_rows(self) -> None:
        """The rows buffered here are dropped, and their arenas given back."""
        self.rows.clear()
        leases, self.leases = self.leases, deque()
        for lease in leases:
            if lease is not None:
                lease.release(1)

    def _slot(self) -> int:
        """A free arena for a request: one given back, else a new one (the others are
        leased to rows not yet batched)."""
        try:
            return self.free.pop()
        except IndexError:
            pass
        self.arenas.append(_Arena.create(_ARENA_BYTES))
        self.known.append(False)
        return len(self.arenas) - 1

    def _ask(self) -> None:
        """Asks the worker for rows while it may read ahead (`ahead` rows, buffered here or
        asked for), until its share ended."""
        while not self.ended and len(self.pending) < self.in_flight and \
                len(self.rows) + (len(self.pending) + 1) * self.chunk <= self.ahead:
            slot = self._slot()
            a = self.arenas[slot]
            new = not self.known[slot]
            ticket = self.w.sent
            _send(self.w.sock, pickle.dumps(("rows", ticket, self.chunk, slot,
                                             a.size if new else 0)),
                  (a.fd,) if new else ())
            self.known[slot] = True
            self.w.sent += 1
            self.pending.append((ticket, slot))

    def take(self, timeout: float, held: Dict[Any, int]) -> Any:
        """The next row (a Failed, a Skipped), or DONE; queue.Empty after `timeout` seconds.
        A row that is a view of an arena counts its lease in `held` (StepHold)."""
        deadline = time.monotonic() + timeout
        while not self.rows:
            if self.gone:
                return DONE
            try:
                self._ask()
                if not self.pending:  # its share ended, every reply read
                    self.gone = True
                    return DONE
                if not _readable(self.w.sock, deadline - time.monotonic()):
                    raise queue.Empty
                self._receive()
            except (EOFError, OSError, _BadReply) as e:
                self.gone = True
                self.pending.clear()
                if self.w.dead is None:
                    self.w.dead = str(e) if isinstance(e, _BadReply) else _exit_status(self.w)
                if isinstance(e, _BadReply):
                    self.w.hang_up()
                    try:
                        os.kill(self.w.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return Failed(WorkerDied(
                    f"{died_message(self.w, self.wid)}; its share of the IterableDataset's "
                    "stream ends, and so does the iterator (as DataLoader's). The next "
                    "iter() starts new workers"))
        row = self.rows.popleft()
        lease = self.leases.popleft()
        if lease is not None:
            held[lease] = held.get(lease, 0) + 1
        try:  # the worker goes on with the next rows while this one is used
            self._ask()
        except OSError:  # it died: the next take() says so
            pass
        return row

    def _receive(self) -> None:
        ticket, slot = self.pending.popleft()
        answers, pid, data, fds = _recv_reply(self.w.sock)
        if pid != self.w.pid or answers != ticket:
            for fd in fds:
                os.close(fd)
            raise _BadReply(f"sent a reply that answers request {answers} of process {pid}, "
                            f"not request {ticket}: its replies can no longer be trusted, it "
                            "was stopped")
        out, offsets, ended, new_size, (ns, cpu, wait), asked_rank = pickle.loads(data)
        if asked_rank and not self.stream.warned_self_split:
            self.stream.warned_self_split = True
            warn_self_split()
        if fds:  # the worker needed a larger arena for this slot
            old, self.arenas[slot] = self.arenas[slot], _Arena(fds[0], new_size)
            old.close()
        arena = self.arenas[slot]
        views = self.stream.views and offsets
        lease = ReplyLease(self.free, slot, sum(kind == "row" for kind, _ in out)) \
            if views else None
        for kind, value in out:
            if kind == "row":
                if lease is not None:
                    self.rows.append(_viewed(value, arena, offsets))
                else:
                    self.rows.append(_decode(value, arena, offsets))  # copied out
                self.leases.append(lease)
                continue
            self.rows.append(Skipped(value) if kind == "skipped" else Failed(value))
            self.leases.append(None)
        if lease is None:
            self.free.append(slot)
        s = self.stream  # the worker's time in Python
        s.python_ns, s.python_cpu_ns, s.python_wait_ns = \
            s.python_ns + ns, s.python_cpu_ns + cpu, s.python_wait_ns + wait
        self.ended = self.ended or ended


def _viewed(value: Any, arena: _Arena, offsets: List[int]) -> Any:
    """A row out of the arena: the arrays that are its own fields (a dict's values, a
    tuple's or list's items, the row itself) views of it, deeper ones copied."""
    if type(value) is dict:
        return _decode(value, arena, offsets, True)
    if type(value) is tuple and not (len(value) == 2 and value[0] in _LEAVES):
        return tuple(_decode(v, arena, offsets, type(v) is tuple) for v in value)
    if type(value) is list:
        return [_decode(v, arena, offsets, type(v) is tuple) for v in value]
    return _decode(value, arena, offsets, True)


_LEAVES = ("__stoker_array__", "__stoker_tensor__")


class ReplyLease:
    """A reply's arena, leased to the rows it brought (views of it): given back to its
    worker (`free`) once each of them is released, in a batch made or dropped."""

    __slots__ = ("_free", "_slot", "_left", "_lock")

    def __init__(self, free: List[int], slot: int, rows: int):
        self._free, self._slot, self._left = free, slot, rows
        self._lock = threading.Lock()

    def release(self, rows: int) -> None:
        with self._lock:
            self._left -= rows
            done = self._left == 0
        if done:
            self._free.append(self._slot)  # atomic: a stage thread may be asking


class StepHold:
    """The leases of a step's rows (ReplyLease -> rows), held by its batch until it is
    made or dropped (_Pending.release), or by nothing (released when it goes)."""

    __slots__ = ("_held",)

    def __init__(self, held: Dict[ReplyLease, int]):
        self._held: Optional[Dict[ReplyLease, int]] = held

    def release(self) -> None:
        held, self._held = self._held, None
        if held:
            for lease, rows in held.items():
                lease.release(rows)

    def __del__(self) -> None:
        self.release()


def _exit_status(w: _Worker) -> str:
    return lifecycle.exit_status(w)


_CHUNK_ROWS = 8  # rows a reply holds at most
_MAX_IN_FLIGHT = 16  # requests at a worker at most (each with its arena)
_DRAIN_SECONDS = 1.0  # a reply owed after a share's end (it comes at once)


class StreamProcesses:
    """The worker processes of a reading (NOTE [ Iterable datasets in processes ]): forked
    at its start from the loader's process as it is then; with persistent_workers kept
    for the next reading once this one read its stream to the end; ended otherwise (or
    dropped, or at exit)."""

    def __init__(self, reading: Any, n: int, pipes: List[Any]):
        s = reading.stream
        self.n = n
        self.pipes = bool(pipes)
        ahead = s.queue_rows(n)
        # small replies, many in flight: a row reaches the loop once its reply's few rows
        # are made, and the worker always holds a request to fill
        chunk = max(1, min(_CHUNK_ROWS, ahead // 2))
        in_flight = max(1, min(_MAX_IN_FLIGHT, ahead // chunk))
        ahead = max(ahead, chunk)
        self.workers: List[StreamProcess] = []
        self._all: List[_Worker] = []
        self._pid = os.getpid()
        weakref.finalize(self, _end, self._all, self._pid)
        for wid in range(n):
            pipe = pipes[wid] if pipes else None
            w = fork_worker(lambda sock, arena, status, wid=wid, pipe=pipe:
                            _stream_main(sock, arena, reading, wid, n, pipe))
            self._all.append(w)
            self.workers.append(StreamProcess(s, w, wid, chunk, in_flight, ahead))

    def begin(self, reading: Any, state: Any) -> List[StreamProcess]:
        """Its workers start their shares of `reading` (`state`: the dataset's, loaded
        into the loader's copy at this start, for theirs)."""
        s = reading.stream
        for p in self.workers:
            init = s.worker_init_fn is not None and s.first_start(p.wid)
            p.begin(reading.epoch, reading.world, state, init)
        return list(self.workers)

    def reusable(self) -> bool:
        """Whether every worker can serve another reading (NOTE [ Iterable datasets in
        processes ])."""
        return bool(self._all) and all(p.idle() for p in self.workers)

    def pids(self) -> List[int]:
        return [w.pid for w in self._all if w.dead is None]

    def close(self) -> None:
        """Ends the workers within a few seconds, whatever they run (NOTE [ Worker
        faults ]), and reaps them."""
        workers, self._all[:] = list(self._all), []
        _end(workers, self._pid)


def _end(workers: List[_Worker], pid: int) -> None:
    if workers and os.getpid() == pid:
        lifecycle._end_workers(workers)

