"""Rows written by a worker process straight into their batch (NOTE [ Direct rows ]).

NOTE [ Direct rows ]
Without this, a worker process writes a sample's arrays into its arena and the loader's
process copies them from there into the batch: two copies, and the arenas (two chunks in
flight per worker, and those held by batches that wait for their other chunks) hold as
much memory again as the batches themselves. Once the batch's layout is fixed (the first
sample checked), each later chunk of fixed-shape array fields asks for its batch's memory
as it begins, and its worker writes each row there as soon as it is made:

  stage thread of chunk c of batch B              worker process
  ----------------------------------              --------------
  send (indices, "ask", blocks freed since) ----> as c begins: ask (framed as a reply)
  the ask <--------------------------------------
  B planned as the layout gives it, at the first  map the first sample meanwhile
  ask of its chunks: task.allocate(), B's memory,
  a shared block (NOTE [ Shared batch memory ]
  in pipeline/shared_memory.h)
  answer (the block [+ its fd the first time ---> each row made: its fixed array fields
  this worker sees it], where c's rows go)        that have the planned dtype and shape
                                                  written at their rows in the block (the
                                                  rows made before the answer came, when
                                                  it comes); the rest (another shape,
                                                  objects) goes as before, by the arena
  rows: views of the block at their place <----- markers for the rows written
  last chunk: planned again from the rows; the same plan -> the block is the batch, and
  only what is not in place yet is written (scalars, objects, rows that went by the
  arena); another plan (a field's shape changed) -> a new block, every row copied into
  it, and direct rows stop for the loader (its fields' shapes vary)

  * A batch's memory is taken when a worker begins one of its chunks, not when the chunk
    is queued at the worker (each worker has a second chunk queued, usually of the next
    batch), and a worker holds a sample or two, not its chunk: on bench_python's (c)
    the drop-in's peak memory went from 413 to 400 MB (DataLoader's: 406-416 MB).
  * The stage thread that sent a chunk reads the worker's ask and answers it (the
    replies of a worker are read in the order of its requests, so the ask of request t
    comes after the reply of t - 1): while the worker waits for the answer, messages
    that come before it (the next request, a stop) are kept in order for after. The
    answer goes out under the worker's send lock, taken while the reader holds its
    turn: nothing takes the turn while it holds the send lock.
  * A block stays referenced by the thread that sent a chunk into it until that chunk's
    reply came back (or its worker died): a batch dropped meanwhile (break, close) does
    not give the block to another batch while a worker may still write into it.
  * A worker maps each block once (the pool reuses its blocks: a mapping per request
    cost 1.1-1.8 ms of page faults per 5 MB chunk) and unmaps those the loader's process
    freed when its next request names them: a block freed while the worker is idle (the
    user dropped batches it kept) stays mapped in it until then.
  * The arenas the first batches' rows came by give their pages back as those batches
    are assembled (Lease.trim in processes.py): once rows go straight into their
    batches, an arena carries only what the batch's layout does not fix.
  * Not for collate_fn (the rows go to user code as they are), batch_size=None, padded
    fields, or pinned batch memory (not shared): those take the arena path.
"""

from __future__ import annotations

import mmap
import os
import pickle
import select
import threading
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from .. import _core
from .collate import _BF16, Specs, TensorSpec
from .transport import _portable_error, _send, plain_array

__all__ = ["ASK", "ChunkRows", "DirectBatch", "DirectRows", "WorkerBlocks", "answer_ask",
           "direct_rows", "request_part"]

_MISSING = object()


class DirectBatch:
    """Batch B's memory, planned before its chunks went out, and what its workers wrote
    into it. `fields`: (leaf index, path, offset, row bytes, dtype, shape) of each field
    written in place."""

    __slots__ = ("buffer", "specs", "nbytes", "block", "fields", "counts", "_views",
                 "_lock")

    def __init__(self, buffer: np.ndarray, specs: List[TensorSpec], nbytes: int,
                 block: Optional[Tuple[int, int, int, int]], fields: List[Tuple[Any, ...]]):
        self.buffer = buffer
        self.specs = specs
        self.nbytes = nbytes
        self.block = block  # (fd, id, offset, size) of the shared block, or None
        self.fields = fields
        self.counts = [0] * len(fields)
        # field k -> (offset, row bytes, dtype, shape) for row(): parsed once, not per row
        self._views = [(off, row, np.dtype(dtype), shape)
                       for _, _, off, row, dtype, shape in fields]
        self._lock = threading.Lock()

    def request(self, lo: int, known: Set[int]) -> Tuple[Tuple[Any, ...], Optional[int]]:
        """What a request for the chunk at batch position `lo` carries, and the block's
        descriptor when the worker (which has mapped blocks `known`) has not mapped it."""
        assert self.block is not None
        fd, bid, offset, size = self.block
        new = bid not in known
        fields = tuple((path, offset + off, row, dtype, shape)
                       for _, path, off, row, dtype, shape in self.fields)
        return (bid, size if new else 0, lo, fields), fd if new else None

    def row(self, k: int, pos: int) -> np.ndarray:
        """Field k's row at batch position `pos`, written in place by a worker."""
        off, row, dtype, shape = self._views[k]
        with self._lock:  # (the chunks of a batch come back on several threads)
            self.counts[k] += 1
        start = off + pos * row
        return self.buffer[start: start + row].view(dtype).reshape(shape)

    def fits(self, specs: Sequence[TensorSpec], nbytes: int) -> bool:
        """Whether the batch as its rows came is planned as this one was."""
        return nbytes == self.nbytes and len(specs) == len(self.specs) and all(
            a.name == b.name and a.shape == b.shape and a.offset == b.offset
            for a, b in zip(specs, self.specs))

    def in_place(self, rows: int) -> Set[int]:
        """The leaf indices of the fields every one of whose `rows` rows is in place."""
        return {f[0] for f, n in zip(self.fields, self.counts) if n == rows}


class DirectRows:
    """A stage's decision and plans for direct rows (NOTE [ Direct rows ])."""

    def __init__(self, layout: Any, enabled: bool):
        self._layout = layout
        self.enabled = enabled
        self.batches = 0  # batches whose memory was planned before their chunks went out
        self._lock = threading.Lock()

    def ready(self) -> bool:
        """Whether a chunk sent now asks for its batch's memory: direct rows are on, and
        the layout is known (a sample was checked)."""
        return self.enabled and self._layout.fields is not None

    def batch(self, task: Any, pending: Any) -> Optional[DirectBatch]:
        """Batch `task`'s planned memory (made at the first ask of one of its chunks), or
        None when its rows take the arena path."""
        if not self.enabled:
            return None
        with self._lock:
            if pending.direct is None:
                pending.direct = self._plan(task) or False
        return pending.direct or None

    def _plan(self, task: Any) -> Optional[DirectBatch]:
        layout = self._layout
        if layout.fields is None:  # no sample checked yet: this batch goes by the arenas
            return None
        n = task.samples
        if not n:  # (an empty batch: nothing to plan, and nothing learnt about the rest)
            return None
        out = Specs()  # laid out as BatchLayout.plan lays out uniform rows
        fields: List[Tuple[Any, ...]] = []
        for i, f in enumerate(layout._list):
            if f.kind in ("object", "stack"):
                continue
            if f.kind not in ("scalar", "array") or f.dtype == _BF16:
                self.enabled = False  # padded fields: planned only from their rows
                return None
            spec = out.add(f.name, f.dtype,
                           (n,) if f.kind == "scalar" else (n,) + tuple(f.shape))
            if f.kind == "array":
                fields.append((i, tuple(f.path), spec.offset, spec.nbytes // n,
                               np.dtype(f.dtype).str, tuple(f.shape)))
        specs, offset = out.specs, out.offset
        if not fields:
            self.enabled = False
            return None
        try:
            buffer = task.allocate(offset)
        except Exception:  # (its stream stopped meanwhile: nobody reads the batch)
            return None
        block = _core.shared_block(buffer.ctypes.data) if offset else None
        if block is None:  # not shared memory (pinned): the arenas, from now on
            self.enabled = False
            return None
        return DirectBatch(buffer, specs, offset, block, fields)

    def missed(self) -> None:
        """A batch was planned otherwise from its rows (a field's shape changed): the
        fields' shapes vary, so rows go by the arenas from now on."""
        self.enabled = False


def direct_rows(samples: Any, *, unbatched: bool, per_sample: bool) -> DirectRows:
    """The stage's DirectRows: on for batches of rows that the native batching lays out."""
    return DirectRows(samples.layout, samples.collate_fn is None and not unbatched
                      and per_sample)


# -- in the worker process ----------------------------------------------------------------

def _leaf(value: Any, path: Tuple[Any, ...]) -> Any:
    """The value at `path` of a sample, through the containers the arena's encoding walks
    (plain dicts, lists, tuples), else _MISSING."""
    for k in path:
        t = type(value)
        if t is dict:
            value = value.get(k, _MISSING)
            if value is _MISSING:
                return value
        elif (t is list or t is tuple) and type(k) is int and 0 <= k < len(value):
            value = value[k]
        else:
            return _MISSING
    return value


def request_part(ask: bool, known: Set[int]) -> Any:
    """What a request carries about blocks: None, or (whether the worker asks for the
    chunk's block as it begins, ids of the blocks freed since, which it unmaps). `known`,
    the blocks the worker has mapped, is kept up to date (called under the worker's send
    lock)."""
    forget = _core.dead_shared_blocks(list(known)) if known else []
    known.difference_update(forget)
    if not ask and not forget:
        return None
    return ask, forget


def answer_ask(w: Any, plan: Callable[[], Optional[DirectBatch]], ticket: int,
               lo: int) -> Tuple[Optional[DirectBatch], Optional[Exception]]:
    """Answers worker `w`'s ask for the block of request `ticket` (the chunk at batch
    position `lo`): the batch planned by `plan` (None: its rows go by the arena), and
    plan's error, if it failed (raised once the reply is read: the worker stays in step).
    OSError: the worker is gone."""
    try:
        direct, error = plan(), None
    except Exception as e:  # (a bug of the stage: that batch fails, the worker goes on)
        direct, error = None, e
    with w.send_lock:
        spec, fd = None, None
        if direct is not None:
            spec, fd = direct.request(lo, w.blocks)
            w.blocks.add(spec[0])
        _send(w.sock, pickle.dumps(("block", ticket, spec)), () if fd is None else (fd,))
    return direct, error


ASK = pickle.dumps(("block?",))  # a worker's ask, sent framed as a reply to its request


class WorkerBlocks:
    """In the worker: the batch blocks it has mapped, by id. A block is mapped once (the
    loader's pool reuses its blocks) and unmapped when a request names it freed."""

    def __init__(self) -> None:
        self._maps: Dict[int, np.ndarray] = {}

    def request(self, part: Any) -> bool:
        """Whether to ask for the block of a request carrying `part`; the blocks it names
        freed are unmapped."""
        if part is None:
            return False
        ask, forget = part
        for bid in forget:
            self._maps.pop(bid, None)  # (the mapping goes with its last view)
        return ask

    def answer(self, recv: Callable[[], Tuple[Any, List[int]]], ticket: int,
               inbox: Deque[Tuple[Any, List[int]]]) -> Optional["_RowWriter"]:
        """Waits for the answer to the ask of request `ticket`: what writes its rows into
        their block (None: every row by the arena). `recv` reads a message (EOFError once
        the loader hung up); those that come before the answer (the next request, a stop)
        are queued in `inbox`, in order."""
        while True:
            msg, fds = recv()
            if msg[0] == "block" and msg[1] == ticket:
                break
            inbox.append((msg, fds))
            if msg[0] == "stop":
                return None
        spec = msg[2]
        if spec is None:
            for fd in fds:
                os.close(fd)
            return None
        bid, size, lo, fields = spec
        if fds:
            try:
                self._maps[bid] = np.frombuffer(mmap.mmap(fds[0], size), np.uint8)
            finally:
                for fd in fds:
                    os.close(fd)
        block = self._maps.get(bid)
        return None if block is None else _RowWriter(block, lo, fields)


class ChunkRows:
    """A chunk's rows in the worker. With `asked` (the worker asked for the block as the
    chunk began), each row is written into the batch's block as soon as it is made, once
    the loader's answer came (the rows made before it, when it comes): the worker holds a
    sample or two, not the chunk. What is not written there (other leaves, and every row
    without a block) is encoded by `writer` for the arena. flush(rows) is called before
    each sample and, with wait=True, after the last one; rows are encoded in place. A row
    that cannot be encoded fails as its sample (`errors`, by chunk position; `describe`
    names it): the worker goes on."""

    __slots__ = ("blocks", "writer", "recv", "sock", "ticket", "inbox", "asked",
                 "block", "done", "errors", "describe")

    def __init__(self, blocks: WorkerBlocks, writer: Any,
                 recv: Callable[[], Tuple[Any, List[int]]], sock: Any, ticket: int,
                 inbox: Deque[Tuple[Any, List[int]]], asked: bool, errors: Dict[int, Any],
                 describe: Callable[[int], str]):
        self.blocks, self.writer, self.recv, self.sock = blocks, writer, recv, sock
        self.ticket, self.inbox, self.asked, self.errors = ticket, inbox, asked, errors
        self.describe = describe  # row j -> its sample, in words
        self.block: Optional[_RowWriter] = None
        self.done = 0  # rows encoded

    def flush(self, rows: List[Any], wait: bool = False) -> None:
        """Encodes the rows made since the last flush, into the block once it is known;
        without it, only with `wait` (the chunk's end). EOFError: the loader hung up."""
        if self.asked and (wait or select.select([self.sock], [], [], 0)[0]):
            self.asked = False
            self.block = self.blocks.answer(self.recv, self.ticket, self.inbox)
        if self.asked or (self.block is None and not wait):
            return
        block, encode = self.block, self.writer.encode_row
        for j in range(self.done, len(rows)):
            r = rows[j]
            if r is not None:
                try:
                    rows[j] = encode(r, {} if block is None else block.write(r, j))
                except Exception as e:
                    rows[j] = None
                    self.errors[j] = _portable_error(TypeError(
                        f"stoker: {self.describe(j)} cannot leave the worker process: "
                        f"{type(e).__name__}: {e}"))
        self.done = len(rows)


class _RowWriter:
    """Writes a chunk's fixed fields at their rows of a block; what it wrote is a marker
    ("__stoker_direct__", field, position) in the reply."""

    __slots__ = ("block", "lo", "fields", "dtypes")

    def __init__(self, block: np.ndarray, lo: int, fields: Sequence[Tuple[Any, ...]]):
        self.block = block
        self.lo = lo
        self.fields = fields
        self.dtypes = [np.dtype(f[3]) for f in fields]

    def write(self, sample: Any, j: int) -> Dict[Tuple[Any, ...], Any]:
        """Writes row `j` of the chunk; {path: marker} of the leaves it wrote."""
        done: Dict[Tuple[Any, ...], Any] = {}
        pos = self.lo + j
        for k, (path, off, row, _dtype, shape) in enumerate(self.fields):
            a = plain_array(_leaf(sample, path))
            if a is None or a.dtype != self.dtypes[k] or a.shape != shape:
                continue  # by the arena: the loader's process plans the batch again
            start = off + pos * row
            self.block[start: start + row] = a.reshape(-1).view(np.uint8)
            done[path] = ("__stoker_direct__", k, pos)
        return done
