"""What a late batch of the Python stage waits for, in words (NOTE [ Python stage ] in
stoker/_stage/__init__.py): while the consumer waits longer than the slow first batch's
time, next() logs the oldest batch in the stage and what each stage thread or worker
process is doing, on which sample and since when."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Set, Tuple

from .activity import Activity
from .pending import PendingBatches

if TYPE_CHECKING:
    from .processes import ProcessWorkers

__all__ = ["stall_report", "doing_words"]


def doing_words(phase: Optional[str], index: int, describe: Callable[[int], str]) -> str:
    """What a thread or worker in `phase` on dataset index `index` does, in words."""
    if phase is None:
        return "between samples"
    if index < 0:
        return f"in {phase}"
    return _with(phase, describe(index))


def _with(phase: str, sample: str) -> str:
    if phase == "dataset":
        return f"loading {sample} (the dataset's read or __getitem__)"
    return f"in {phase} for {sample}"


def stall_report(pending: PendingBatches, activity: Activity,
                 workers: Optional[ProcessWorkers], describe: Callable[[int], str],
                 waited: float, again: bool = False) -> Tuple[str, str]:
    """(which batch, the message): what the consumer's late batch waits for, the
    oldest batch in `pending`, and what each stage thread (`activity`) or worker process
    (`workers`) is doing and since when; `describe` names a sample."""
    now = time.monotonic()
    oldest = pending.oldest()
    which = "the next batch" if oldest is None else \
        f"batch {oldest.batch} of epoch {oldest.epoch}"
    parts: List[str] = []
    seen_workers: Set[int] = set()
    for d in sorted(activity.threads(), key=lambda d: d.name):
        phase, task, index, since = d.phase, d.task, d.index, d.since
        if phase is None or (task is not None and task.stopped):
            continue  # idle, or left behind in a batch nobody reads
        if phase == "worker":
            if d.worker in seen_workers:
                continue
            seen_workers.add(d.worker)
            parts.append(_worker(workers, d.worker, task, index, since, now, describe))
            continue
        where = f"batch {task.batch} of epoch {task.epoch}" if task is not None else \
            "a batch"
        what = f"in {phase} for {where}" if index < 0 else \
            f"{_with(phase, describe(index))} ({where})"
        parts.append(f"thread {d.name} has been {what} for {now - since:.1f} s")
    if not parts:
        parts.append("no stage thread is busy (the batch is not handed off yet: the C++ "
                     "workers plan it)")
    return which, (f"stoker: {which} is {'still ' if again else ''}not ready after "
                   f"{waited:.1f} s: " + "; ".join(parts))


def _worker(workers: Optional[ProcessWorkers], worker: int, task: Any, index: int,
            since: float, now: float, describe: Callable[[int], str]) -> str:
    doing = workers.doing(worker) if workers is not None else None
    if doing is None:
        return f"Python worker process {worker} is not running"
    pid, w_index, phase, w_since, stopped = doing
    who = f"Python worker process {worker} (pid {pid})"
    if stopped:
        who += " (the process is stopped: SIGSTOP, a debugger?)"
    if phase is None:  # between chunks: the reply on its way, or the request
        return (f"{who} has been given sample {index} and more for {now - since:.1f} s "
                "and is not running them")
    where = "" if task is None else f" (batch {task.batch} of epoch {task.epoch})"
    return (f"{who} has been {_with(phase, describe(w_index))}{where} for "
            f"{now - w_since:.1f} s")
