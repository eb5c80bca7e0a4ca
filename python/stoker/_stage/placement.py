"""Where the Python stage runs the user's code: its threads, or worker processes (NOTE
[ Python stage processes ] in processes.py); and python_workers="auto"'s measure of
whether that code holds the GIL, which moves it from threads to processes."""

from __future__ import annotations

import time
from typing import Any, Optional, Tuple

from .. import _loader_args
from .processes import ProcessWorkers
from .state import PROCESS_THREADS_PER_WORKER
from .taking import SendOrder

__all__ = ["Placement", "gil_bound"]


class Placement:
    """`workers` workers of one stage: "thread", "process", or "auto" (threads, then
    processes once the stage measures that its Python holds the GIL). ``per_worker``:
    stage threads per worker (two per worker process, one when threads run the code
    themselves); ``order``: the requests' order at each worker process; ``workers``: the
    ProcessWorkers, once started."""

    def __init__(self, workers: int, kind: str, runs_code: bool):
        self.count = workers
        # "auto" starts on threads (and may move: moved()); "process" from the start
        self.auto = kind == "auto" and runs_code
        self.processes = kind == "process" and runs_code
        self.per_worker = PROCESS_THREADS_PER_WORKER if self.processes else 1
        self.order: Optional[SendOrder] = SendOrder(workers) if self.processes else None
        self.workers: Optional[ProcessWorkers] = None
        self._delivered = 0  # batches the consumer took (auto: when to measure)
        # auto: (wall, process CPU, the stage's Python, CPU and wait seconds) at the
        # measurement's start
        self._since: Optional[Tuple[float, ...]] = None

    def processes_started(self, samples: Any, epoch: Optional[int] = None) -> None:
        """With processes: the worker processes not running start (each with a copy of
        `samples`, the part of the stage a worker runs: NOTE [ Python stage processes ]),
        at iter() of `epoch`."""
        if not self.processes:
            return
        if self.workers is None:
            self.workers = ProcessWorkers(self.count)
        self.workers.start(samples, epoch)

    def to_processes(self) -> ProcessWorkers:
        """From now on worker processes run the user's code: their ProcessWorkers (not
        started yet)."""
        self.workers = ProcessWorkers(self.count)
        self.processes, self.auto = True, False
        self.per_worker = PROCESS_THREADS_PER_WORKER
        self.order = SendOrder(self.count)
        return self.workers

    def should_move(self, core: Any, active: int) -> bool:
        """python_workers="auto", on threads, after each batch the consumer took: whether
        the user's Python holds the GIL (the verdict's rule, csrc/pipeline/autotuner.cpp
        gil_bound: two or more threads blocked a third of their time or more, at about one
        core between them), measured from the first batch's delivery (the threads' first
        samples carry imports and cold caches: by then they ran them), decided at batch 2
        and every 2 after, over the batches since the first: each batch on GIL-bound
        threads takes about twice a process's time, which a first epoch pays. `core`: the
        loader core, whose stats say the stage's times; `active`: the stage threads
        working now."""
        self._delivered += 1
        if self._delivered % 2 and self._delivered != 1:
            return False
        if active < 2 or _loader_args.available_cores() < 2:
            self.auto = self._delivered < 64  # no second core: threads it is
            return False
        s = core.stats()
        now = (time.monotonic(), time.process_time(), s["python_seconds"],
               s["python_cpu_seconds"], s["python_wait_seconds"])
        if self._since is None:
            self._since = now
            return False
        cores = _loader_args.available_cores()
        d = [a - b for a, b in zip(now, self._since)]
        busy = d[1] / (d[0] * cores) if d[0] > 0 else 0.0
        return gil_bound(d[2], d[3], d[4], active, busy)


def gil_bound(python_s: float, cpu_s: float, wait_s: float, threads: int,
              busy: float = 0.0) -> bool:
    """Whether `threads` stage threads that spent `python_s` in the user's Python, `cpu_s` of
    it on a core and `wait_s` waiting for one, take turns on the GIL: blocked (neither on a
    core nor waiting for one) a third of the time or more, at about one core between them
    (csrc/pipeline/autotuner.cpp gil_bound: threads blocked on sleeps or I/O use much less;
    a machine with no free core shows up as waiting, where processes would not help). Or
    blocked as much while this process keeps the cores it may use busy (`busy`, its CPU
    time over wall time and cores, 0..1): the user's code waits for work of this process
    on other threads (the GIL held by them, or a native thread pool such as OpenCV's),
    not for a sleep or I/O, and worker processes each get their own. With the cores
    that busy, a tenth of the time blocked is enough: it is time lost to the GIL, which
    processes win back (albumentations on OpenCV, bench/bench_python.py (a): threads
    blocked 13-16% at 1.6 cores, processes 1.13-1.2x threads' speed)."""
    if threads < 2 or python_s < 0.05:
        return False
    blocked = python_s - cpu_s - wait_s
    cores = threads * cpu_s / python_s
    if busy >= 0.85:
        # (not when they wait for a core more: the machine has no core to spare)
        return blocked > 0.1 * python_s and wait_s < blocked and cores < 0.9 * threads
    return blocked > 0.3 * python_s and 0.6 < cores < 1.5
