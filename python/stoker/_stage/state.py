"""What the Python stage's parts agree on (NOTE [ Python stage ] in
stoker/_stage/__init__.py): the end of an epoch, the stage threads per worker process, the
watch on the first sample's time, and the count of forks this process came out of."""

from __future__ import annotations

import os

__all__ = ["PROCESS_THREADS_PER_WORKER", "PROBE_WAIT_SECONDS", "END", "forks"]

# Stage threads per worker process (NOTE [ Python stage processes ] in processes.py).
PROCESS_THREADS_PER_WORKER = 2
# How long the other stage threads wait for the first sample, watched for draws from the
# global generators (NOTE [ Global random generators ] in workers.py), before they go on.
PROBE_WAIT_SECONDS = 10.0
# The end of an epoch, as PythonStage.next() says it: never a value a hook may return (a
# batch may be None).
END = object()
# Forks (os.fork) this process came out of: a stage compares it with its own count after
# each call of user code, and only then the pid (a syscall: not per sample).
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)


def forks() -> int:
    """Forks (os.fork) this process came out of, as counted at each."""
    return _forks
