"""Parallel work for the converters, safe in any caller.

Work that releases the GIL (HF ``tokenizers``, tiktoken and sentencepiece batches, image
decodes, zlib) runs on threads. Work that holds it (protobuf parsing in Python, a Python
tokenizer) runs in worker processes, and those are started here as fresh interpreters,
``python -m stoker.convert._worker_main``, never by ``multiprocessing``:

* ``spawn`` and ``forkserver`` import the caller's ``__main__`` in every worker, so a
  script without an ``if __name__ == "__main__":`` guard runs again inside each worker,
  which then fails to start, and a ``multiprocessing.Pool`` replaces it forever;
* ``fork`` copies the caller's threads' locks (any process that imported torch has
  threads), which can deadlock the child.

A worker imports stoker and whatever the pickled tasks name, nothing else. One that cannot
start (or cannot load what it is sent) is reported once, as :class:`WorkerError`, with its
reason; nothing is restarted.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
import traceback
from collections import deque
from concurrent.futures import Future
from typing import Any, BinaryIO, Callable, Deque, List, Optional, Tuple

__all__ = ["ProcessPool", "WorkerError", "available_cores"]

_LEN = struct.Struct("<Q")


class WorkerError(RuntimeError):
    """A worker process could not start, or ended without finishing its tasks."""


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), the default worker count."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _pack(msg: Any) -> bytes:
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


def _send(f: BinaryIO, msg: Any) -> None:
    f.write(_pack(msg))
    f.flush()


def _recv(f: BinaryIO) -> Any:
    head = f.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError
    (n,) = _LEN.unpack(head)
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


class _Worker:
    """One worker process: tasks go down its stdin, results come up its stdout, read by a
    thread of ours, in order. `lock` guards `pending` and is never held while writing (a
    worker blocked writing a large result must always find the reader free to take it);
    `write_lock` keeps each task's bytes and its place in `pending` together."""

    def __init__(self, index: int, init: Optional[Tuple[Callable, tuple]]):
        self.index = index
        self.pending: Deque[Future] = deque()
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.dead: Optional[BaseException] = None
        self.reader: Optional[threading.Thread] = None
        # the folder that holds this stoker package first, so that the worker imports the
        # same stoker (a source checkout, an installed wheel) whatever its cwd
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
            __file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stoker.convert._worker_main"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=env, close_fds=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.to, self.frm = self.proc.stdin, self.proc.stdout
        try:
            # the import path first, on its own: the set-up may name modules found there
            _send(self.to, ("path", list(sys.path)))
            _send(self.to, ("init", init))
        except (BrokenPipeError, pickle.PicklingError, TypeError, AttributeError) as e:
            self.kill()
            raise WorkerError(f"worker process {index} could not be sent its set-up: "
                              f"{type(e).__name__}: {e}") from None

    def wait_ready(self) -> None:
        try:
            kind, value = _recv(self.frm)
        except EOFError:
            code = self.proc.wait()
            raise WorkerError(f"worker process {self.index} exited with status "
                              f"{code} before it started (its error is on stderr above)"
                              ) from None
        if kind != "ready":
            self.kill()
            raise WorkerError(f"worker process {self.index} could not start: "
                              f"{value}")
        self.reader = threading.Thread(target=self._read, name=f"stoker-convert-reader-"
                                       f"{self.index}", daemon=True)
        self.reader.start()

    def submit(self, fn: Callable, args: tuple) -> Future:
        fut: Future = Future()
        data = _pack(("task", fn, args))  # what cannot be pickled fails here, sent nothing
        with self.write_lock:
            with self.lock:
                if self.dead is not None:
                    raise self.dead
                self.pending.append(fut)
            try:
                self.to.write(data)
                self.to.flush()
            except (BrokenPipeError, ValueError, OSError):
                with self.lock:
                    if fut in self.pending:
                        self.pending.remove(fut)
                raise self._died() from None
        return fut

    def _died(self) -> WorkerError:
        code = self.proc.wait()
        return WorkerError(f"worker process {self.index} ended (status {code}) "
                           "before finishing its tasks")

    def _read(self) -> None:
        while True:
            try:
                kind, value = _recv(self.frm)
            except (EOFError, OSError, ValueError):  # ended, killed, or closed by us
                err = self._died()
                with self.lock:
                    self.dead = err
                    pending, self.pending = self.pending, deque()
                for fut in pending:
                    fut.set_exception(err)
                return
            with self.lock:
                fut = self.pending.popleft()
            if kind == "ok":
                fut.set_result(value)
            else:
                fut.set_exception(value)

    def load(self) -> int:
        return len(self.pending)

    def close(self) -> None:
        try:
            self.to.close()  # end of tasks: the worker finishes them and exits
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
        if self.reader is not None:
            self.reader.join(30)  # it has read the last result and the end of the pipe
        self.frm.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        try:
            self.to.close()
        except OSError:
            pass
        if self.reader is not None:
            self.reader.join(30)  # the pipe ended with the process
        self.frm.close()


class ProcessPool:
    """``workers`` worker processes; ``submit(fn, *args)`` returns a ``Future``.

    ``fn`` and ``args`` are pickled to a worker (``fn`` by its importable name), the result
    or exception pickled back. ``init=(fn, args)`` runs once in each worker before any
    task. All workers are started, and have run ``init``, when the constructor returns, or
    it raises :class:`WorkerError` naming the first that could not.
    """

    def __init__(self, workers: int, init: Optional[Tuple[Callable, tuple]] = None):
        self._workers: List[_Worker] = []
        try:
            for i in range(workers):
                self._workers.append(_Worker(i, init))
            for w in self._workers:
                w.wait_ready()
        except BaseException:
            self.terminate()
            raise

    def submit(self, fn: Callable, *args: Any) -> Future:
        w = min(self._workers, key=_Worker.load)
        return w.submit(fn, args)

    def close(self) -> None:
        """Lets the workers finish what they were given, then ends them."""
        for w in self._workers:
            w.close()

    def terminate(self) -> None:
        """Ends the workers now; pending tasks are dropped."""
        for w in self._workers:
            w.kill()

    def __enter__(self) -> "ProcessPool":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.terminate()


def _portable(e: BaseException) -> BaseException:
    """`e` if it survives pickling, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def serve() -> None:
    """The worker's loop (``python -m stoker.convert._worker_main``)."""
    import signal

    # Ctrl-C is the parent's to handle: it ends the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The protocol uses the original stdin/stdout; print() and library chatter in tasks go
    # to stderr instead, and nothing reads the terminal.
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    try:
        _, path = _recv(proto_in)
        sys.path[:] = path
        _, init = _recv(proto_in)
    except EOFError:
        return
    except Exception as e:  # the set-up names something this interpreter cannot load
        _send(proto_out, ("error", f"{type(e).__name__}: {e}"))
        return
    try:
        if init is not None:
            init[0](*init[1])
    except Exception as e:
        _send(proto_out, ("error", f"{type(e).__name__}: {e}"))
        return
    _send(proto_out, ("ready", None))
    while True:
        try:
            msg = _recv(proto_in)
        except EOFError:
            return
        except Exception as e:  # a task that cannot be unpickled here: its result is this
            _send(proto_out, ("err", _portable(e)))
            continue
        _, fn, args = msg
        try:
            result = fn(*args)
        except Exception as e:
            e.__traceback__ = None
            _send(proto_out, ("err", _portable(e)))
            continue
        try:
            _send(proto_out, ("ok", result))
        except Exception as e:
            _send(proto_out, ("err", RuntimeError("a worker's result could not be sent back: "
                                                  + "".join(traceback.format_exception_only(
                                                      type(e), e)).strip())))
