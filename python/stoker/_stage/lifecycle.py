"""A Python worker process's life (NOTE [ Worker faults ]): right after the fork, tied to
the loader's process and rid of what it inherited of the loader's (the other workers'
sockets and arenas); at its end, stopped within a bounded time whatever it runs, and
reaped. The workers themselves are in processes.py (NOTE [ Python stage processes ]).

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
    stage's pid check after each call of user code: chunks.py); its result is ignored.
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
import os
import signal
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Protocol

from .. import _core
from .transport import _ARENA_NAME, _Arena, _arenas

# Ending workers (NOTE [ Worker faults ]): after the hang-up, after SIGTERM, after SIGKILL.
_STOP_SECONDS = 1.0
_TERM_SECONDS = 1.0
_KILL_SECONDS = 1.0
# Forks of worker processes, one at a time in the process: a worker never inherits the
# worker end of another worker's socket, made for a fork running at the same moment.
_SPAWN_LOCK = threading.Lock()
# The loader ends of every worker socket in this process (descriptor -> inode): a worker
# forked from it lets go of the others' (NOTE [ Worker faults ]).
_loader_ends: Dict[int, int] = {}
# The thread inside fork_worker's os.fork(): its child is a worker, which lets go of the
# shared batch blocks it inherits. Any other fork's child (the user's os.fork(), a fork
# start method's process) keeps them mapped, so the parent marks them: none is handed
# to a later batch while the child may read it (NOTE [ Shared batch memory ] in
# csrc/pipeline/shared_memory.h), before the fork and after it: a block given back in
# between is freed, and one made in between is marked too. A fork and exec (subprocess)
# does not run these hooks.
_worker_fork_thread: Optional[int] = None


def _mark_at_fork() -> None:
    if _worker_fork_thread != threading.get_ident():
        _core.mark_shared_blocks_forked()


os.register_at_fork(before=_mark_at_fork, after_in_parent=_mark_at_fork)


def fork_frozen() -> int:
    """os.fork() for a worker (under _SPAWN_LOCK). The objects the worker inherits go to
    the collector's permanent generation in the worker: its collections never walk them,
    so their pages stay shared with the loader's process instead of being copied as the
    walk writes to each object's header (the parent takes them back at once). Left alone
    if the program froze objects itself: unfreezing would undo its own freeze."""
    global _worker_fork_thread
    pid = -1
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    _worker_fork_thread = threading.get_ident()
    try:
        pid = os.fork()
    finally:
        _worker_fork_thread = None
        if pid != 0 and freeze:
            gc.unfreeze()
    return pid


# -- the end of workers, in the loader's process ------------------------------------------

class WorkerHandle(Protocol):
    """What ending a worker process takes of the loader's side of it (processes.py)."""

    pid: int
    dead: Optional[str]
    turn: threading.Condition

    def hang_up(self) -> None: ...

    def close_socket(self) -> None: ...

    def close_arenas(self) -> None: ...


def _end_workers(workers: List[WorkerHandle]) -> None:
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


def _end_all(workers: List[WorkerHandle], pid: int) -> None:
    """Ends the workers of a dropped pool and closes their arenas."""
    if os.getpid() == pid:
        _end_workers(list(workers))


def died_message(w: Optional[WorkerHandle], slot: int) -> str:
    """Why worker `slot` (`w`, None if it never started) can give nothing, in DataLoader's
    words first where a signal ended it."""
    what = w.dead if w is not None and w.dead else "is not running"
    pid = w.pid if w is not None else "-"
    # DataLoader's words first, for a worker a signal ended (a segfault in the
    # dataset's native code): code that matches them finds them
    lead = ""
    killed = what.split("was killed by signal ", 1)[1].split()[0] \
        if "was killed by signal " in what else ""
    if killed in signal.Signals.__members__:
        lead = (f"DataLoader worker (pid {pid}) is killed by signal: "
                f"{signal.strsignal(signal.Signals[killed])}. ")
    return f"{lead}stoker: Python worker process {slot} (pid {pid}) {what}"


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
        _core.forget_shared_blocks_after_fork()  # NOTE [ Shared batch memory ]
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


def exit_status(w: Any) -> str:
    """How worker `w` ended, from its exit status."""
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


def process_stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP, a debugger)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False
