"""Stage workers stuck in user code: ended (a process) or left behind (a thread), and
replaced, so that the next epoch runs at full strength.

NOTE [ Stuck workers ]
A ``map`` or ``__getitem__`` that never returns holds its worker. Two moments tell that it
is stuck rather than slow, and at each the worker is replaced:

  * ``timeout`` (DataLoader's): when no batch came within it, every worker process in
    user code for the late batch (the oldest the stage has), or on one sample that long,
    is ended (SIGKILL), and every such stage thread is left behind (a thread cannot be
    ended: it is told to stop, and ends when that code returns) with a new thread in its
    slot. The RuntimeError (DataLoader's) names each sample, the worker and for how long.
    The batches the ended processes held fail; the next ``iter()`` forks their successors.
  * The epoch it belonged to is over: at the next ``iter()`` (PythonStage.start), a worker
    process still on requests of an earlier epoch, or of a stream that stopped (a loop
    that left its epoch, by a break or an error), is told (in the memory it shares with
    the loader) to leave the rest of them undone, and given _PAST_EPOCH_GRACE to answer:
    the sample it is on when told is all it still runs. One that has not answered by then
    is stuck in that sample: it is ended and replaced at once (the batches it held fail:
    nobody reads them). A stage thread still in user code for an earlier epoch stops after
    the sample it is on (its batch's stream stopped) and is left behind, with a new
    thread in its slot. The stream the core kept for the new iterator (NOTE [ Next-epoch
    prefetch ] in csrc/pipeline/loader_core.h) is dropped whenever there was such work:
    its first batches are the old epoch's, which stuck work would never let pass, and its
    next-epoch requests may be queued behind the old ones; the new iterator starts a
    stream of its own.

Either way a loop that meets a hang in every epoch loses that epoch's batch (or the time
until ``timeout``), never the epochs after it. What a dropped loader's stuck workers hold
(processes, sockets, memfd arenas) is freed by the loader's finalizer (PythonStage.dropped),
even while a stage thread waits on them.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional

from .activity import USER_PHASES, Activity, Doing
from .pending import PendingBatches
from .stall import doing_words

if TYPE_CHECKING:
    from .pool import StagePool
    from .processes import ProcessWorkers, _Worker

__all__ = ["past_their_epoch", "past_timeout"]

# How long a worker process on a request of an ended epoch has to answer, at iter(),
# before it is ended: it leaves the rest of the request undone, so this is the time its
# current sample may still take.
_PAST_EPOCH_GRACE = 1.0


def _running(workers: ProcessWorkers, i: int) -> Optional[_Worker]:
    """The loader's side of worker process `i`, if it runs."""
    w = workers._workers[i] if 0 <= i < len(workers._workers) else None
    return None if w is None or w.dead is not None else w


def _end(workers: ProcessWorkers, i: int, why: str) -> None:
    """Ends worker process `i` (SIGKILL: it is stuck in user code), which `why` says; the
    next start() replaces it."""
    w = _running(workers, i)
    if w is None:
        return
    w.dead = why
    w.hang_up()
    try:
        os.kill(w.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _drop_stale(workers: ProcessWorkers, i: int, epoch: Optional[int]) -> int:
    """Lets worker process `i` leave undone the samples of the requests it has not
    answered that belong to an epoch before `epoch` or to a stopped stream (those first in
    its queue); the last such request's ticket, or -1 if there is none."""
    w = _running(workers, i)
    if w is None:
        return -1
    last = -1
    for ticket in range(w.received, w.sent):
        request = w.stopped.get(ticket)
        if request is None:
            break
        of, stopped = request
        if not ((epoch is not None and of < epoch) or stopped()):
            break
        last = ticket
    if last >= 0:
        w.status.drop_through(last)
    return last


def _answered(workers: ProcessWorkers, i: int) -> int:
    """Requests worker process `i` answered so far (-1 if it is not running)."""
    w = _running(workers, i)
    return -1 if w is None else w.received


def past_their_epoch(workers: Optional[ProcessWorkers], activity: Activity,
                     pool: Optional[StagePool], describe: Callable[[int], str],
                     epoch: Optional[int] = None) -> bool:
    """At iter() of `epoch`: the worker processes (`workers`) and stage threads (`pool`,
    what they do in `activity`) still in user code for a stream that stopped, or for an
    earlier epoch, leave that work; those stuck in it are replaced (NOTE [ Stuck
    workers ]); `describe` names a sample. Whether there was any such work (the streams
    it belongs to are dropped)."""
    found = False
    if workers is not None:
        stale = {}
        for i in range(workers.count):
            last = _drop_stale(workers, i, epoch)
            if last >= 0:
                stale[i] = last
        found = bool(stale)
        deadline = time.monotonic() + _PAST_EPOCH_GRACE
        while stale and time.monotonic() < deadline:
            time.sleep(0.005)
            stale = {i: last for i, last in stale.items()  # (-1: it died meanwhile)
                     if 0 <= _answered(workers, i) <= last}
        for i in stale:
            doing = workers.doing(i)
            if doing is None:
                continue
            _, index, phase, since, _ = doing
            _end(workers, i, f"was still {doing_words(phase, index, describe)} for "
                             f"{time.monotonic() - since:.1f} s when the next epoch began, in "
                             "an epoch that had ended: it was ended and replaced")
    threads = _replace_threads(activity, pool, lambda d: _past(d.task, epoch))
    return found or bool(threads)


def past_timeout(workers: Optional[ProcessWorkers], pending: PendingBatches,
                 activity: Activity, pool: Optional[StagePool],
                 describe: Callable[[int], str], seconds: float) -> List[str]:
    """When no batch came within `seconds` (DataLoader's timeout): the worker processes
    (`workers`) and stage threads (`pool`, what they do in `activity`) that hold the late
    batch (the oldest one in `pending`) in user code, or that have been on one sample that
    long, are replaced (NOTE [ Stuck workers ]); what each was doing, for the error
    (`describe` names a sample)."""
    now = time.monotonic()
    late = pending.oldest()
    holding = {d.worker for d in activity.threads(lambda d: d.phase == "worker")
               if d.task is late}
    said: List[str] = []
    if workers is not None:
        for i in range(workers.count):
            state = workers.doing(i)
            if state is None:
                continue
            pid, index, phase, since, _ = state
            if phase is None or (i not in holding and now - since < seconds):
                continue
            what = f"{doing_words(phase, index, describe)} for {now - since:.1f} s"
            _end(workers, i, f"was {what} when no batch had come within timeout={seconds:g} "
                             "s: it was ended")
            said.append(f"Python worker process {i} (pid {pid}) had been {what}: it was "
                        "ended, and the next iter() starts another in its place")
    for d, held in _replace_threads(
            activity, pool, lambda d: d.task is late or now - d.since >= seconds):
        said.append(f"thread {d.name} had been {doing_words(d.phase, d.index, describe)} for "
                    f"{held:.1f} s: it is left to return on its own (a thread cannot be "
                    "ended), and a new thread took its place")
    return said


def _past(task: Any, epoch: Optional[int]) -> bool:
    """Whether a thread's batch (`task`, read once from its record: the thread going idle
    sets it to None meanwhile) is one nobody reads, or of an epoch before `epoch`."""
    return task is not None and (task.stopped or (epoch is not None and task.epoch < epoch))


def _replace_threads(activity: Activity, pool: Optional[StagePool],
                     stuck: Callable[[Doing], bool]) -> List[Any]:
    """Stage threads in user code for which `stuck(doing)` holds: each left behind, a new
    thread in its slot. [(its Doing, seconds in that code)]."""
    if pool is None:
        return []
    now = time.monotonic()
    doing = activity.threads(lambda d: d.phase in USER_PHASES and stuck(d))
    return [(d, now - d.since) for d in doing if pool.replace(d.thread)]
