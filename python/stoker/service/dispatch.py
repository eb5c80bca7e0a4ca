"""The trainer's side of a Ray service: which actor computes which part of a segment, the
batches in flight, and computing again what an actor lost (NOTE [ Exactly once ]).

NOTE [ Exactly once ]
The loader's core names the segment an iterator runs (its key: epoch, rank, world size,
offset, pad_from) and counts the batches the loop takes (NOTE [ Placeholder batches ] in
csrc/pipeline/placeholder_producer.h). Here a segment's batches are cut into parts of a
few consecutive batches; each part is one call of an actor's generator (stoker/service/
worker.py), submitted in batch order to the actor with the least work in flight from this
trainer, as long as the batches submitted and not yet taken stay within the window:

  batches   0 1 2 3 | 4 5 6 7 | 8 9 10 11 | 12 ...      taken: 0 1 2   window: 12
  parts     actor A | actor B | actor C   | (not yet: window full)

Each part comes back as one object holding its batches (Ray's cost per object paid once
for them); the loop takes batch j from the part that holds it, in order, whatever order
the actors finish in. When an actor dies (ray.kill, a lost node, a crash) or an object is lost, the
part's batches not yet taken, and every other part that actor held, are submitted again to
the others: a batch is a pure function of (key, j) (NOTE [ Parts ]), so the one computed
again is the same, bit for bit, and the first copy of batch j that arrives is the one
taken; the core counts it once. Nothing is dropped (tf.data service's at-most-once) and
nothing is taken twice. An actor that joins the pool gets the next part submitted. An
error of the batch itself (a corrupt record, an exception in map) is the batch: it is
raised at its place, as the local loader raises it, never computed again. A part that
kills every actor it is given (a crash in the pipeline itself) fails after MAX_ATTEMPTS.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import ray
import ray.exceptions as rex

from .base import Delivery

__all__ = ["Member", "RayFetcher", "SegmentFetch", "Delivery", "MAX_ATTEMPTS"]

_log = logging.getLogger("stoker")

# Actors a part may be given before its batches are reported as lost.
MAX_ATTEMPTS = 4
# Failures that lose a part's batches, as opposed to the batch's own error, which comes
# back as the batch: the actor gone (killed, crashed, out of memory, its node lost), which
# loses every part it holds, or one object lost, which loses the rest of its part.
_ACTOR_GONE = (rex.RayActorError, rex.WorkerCrashedError, rex.NodeDiedError,
               rex.OutOfMemoryError)
_LOST = _ACTOR_GONE + (rex.ObjectLostError, rex.TaskCancelledError)
# A wait is cut into slices so that Ctrl-C and DataLoader's timeout are seen.
_SLICE = 0.05
# With no live actor (all lost, none joined yet: replacements start), how long a part
# waits for one before the loop gets an error.
NO_ACTOR_SECONDS = 120.0
# A batch awaited this long is reported (INFO), then every 10 s (WARNING).
_SLOW_SECONDS = 10.0


@dataclasses.dataclass(eq=False)
class Member:
    """An actor of the pool, as a trainer sees it."""

    handle: Any
    label: str
    node: Optional[str] = None  # learnt from its first batch
    dead: bool = False
    removed: bool = False  # stopped on purpose (RayService.remove): not replaced


@dataclasses.dataclass(eq=False)
class _Part:
    first: int  # the next batch of the part the loop has not taken
    end: int
    member: Member
    gen: Any  # ray.ObjectRefGenerator: the part's one object
    attempts: int = 1
    ref: Any = None  # the object's ref, once taken from the generator
    here: Deque[Any] = dataclasses.field(default_factory=collections.deque)  # its batches


@dataclasses.dataclass
class _ActorStats:
    label: str
    node: Optional[str] = None
    batches: int = 0
    samples: int = 0
    compute_seconds: float = 0.0
    put_seconds: float = 0.0  # the actor's store writes so far (all its loaders) ...
    put_batches: int = 0  # ... for these batches
    parts: int = 0
    lost: bool = False


class RayFetcher:
    """Fetches batches of one pipeline for one loader from a pool's actors.

    Args:
        members: gives the pool's live members now (RayService._live).
        lost: tells the pool a member failed (RayService._lost).
        pipeline: [id, ObjectRef of the pickled PipelineSpec].
        window: batches in flight per segment (submitted, not taken).
        part: batches per part.
    """

    def __init__(self, members: Callable[[], Sequence[Member]],
                 lost: Callable[[Member, BaseException], None], pipeline: List[Any],
                 window: int, part: int):
        self._members, self._report_lost = members, lost
        self.pipeline = pipeline
        self.window, self.part = max(1, int(window)), max(1, int(part))
        self.load: Dict[int, int] = collections.defaultdict(int)  # id(member) -> batches
        self.actors: Dict[str, _ActorStats] = {}
        self.resubmitted_parts = 0
        self.recomputed_batches = 0
        self._segments: "List[SegmentFetch]" = []
        self._local_node = ray.get_runtime_context().get_node_id()

    def open(self, key: Tuple[int, ...], first: int, total: int,
             variant: Optional[Dict[str, Any]] = None) -> "SegmentFetch":
        """Batches [first, total) of segment `key`, taken in order (`variant`: the
        replica's part states, stoker/service/base.py)."""
        seg = SegmentFetch(self, tuple(int(x) for x in key), first, total, variant)
        self._segments.append(seg)
        return seg

    def _pick(self, deadline: Optional[float]) -> Member:
        """The live member with the fewest batches in flight from this loader (waiting,
        within `deadline` and NO_ACTOR_SECONDS, for one to join when none is live)."""
        said = False
        limit = time.monotonic() + NO_ACTOR_SECONDS
        deadline = limit if deadline is None else min(deadline, limit)
        while True:
            live = [m for m in self._members() if not m.dead]
            if live:
                return min(live, key=lambda m: self.load[id(m)])
            if not said:
                _log.warning("stoker: the service has no live actor; waiting for one to join "
                             "(RayService.add)")
                said = True
            if time.monotonic() >= deadline:
                raise RuntimeError("stoker: the service has no live actor left (every actor "
                                   "died or was removed): add actors with RayService.add(n)")
            time.sleep(_SLICE)

    def _submit(self, first: int, end: int, seg: "SegmentFetch",
                deadline: Optional[float]) -> _Part:
        m = self._pick(deadline)
        gen = m.handle.run.remote(self.pipeline, seg.key, first, end - first, seg.variant)
        self.load[id(m)] += end - first
        self._stats(m).parts += 1
        return _Part(first, end, m, gen)

    def _stats(self, m: Member) -> _ActorStats:
        s = self.actors.get(m.label)
        if s is None:
            s = self.actors[m.label] = _ActorStats(m.label)
        return s

    def _lose(self, m: Member, error: BaseException) -> None:
        """`m` failed: every part it holds, in every open segment, goes to the others."""
        if not m.dead:
            m.dead = True
            self._stats(m).lost = True
            self._report_lost(m, error)
            _log.warning("stoker: service actor %s failed (%s); its batches are computed "
                         "again by the others", m.label, type(error).__name__)
        for seg in self._segments:
            seg._resubmit_from(m, error)

    def close(self, seg: "SegmentFetch") -> None:
        if seg in self._segments:
            self._segments.remove(seg)


class SegmentFetch:
    """The batches of one segment for one iterator (NOTE [ Exactly once ])."""

    def __init__(self, fetcher: RayFetcher, key: Tuple[int, ...], first: int, total: int,
                 variant: Optional[Dict[str, Any]] = None):
        self.f = fetcher
        self.key = key
        self.variant = variant
        self.total = total
        self.taken = first  # the next batch the loop takes
        self.submitted = first  # the first batch in no part yet
        self.parts: Deque[_Part] = collections.deque()

    # -- submitting ----------------------------------------------------------------------

    def _fill(self, deadline: Optional[float]) -> None:
        f = self.f
        while self.submitted < self.total and self.submitted - self.taken < f.window:
            end = min(self.total, self.submitted + f.part, self.taken + f.window)
            self.parts.append(f._submit(self.submitted, end, self, deadline))
            self.submitted = end

    def _resubmit_from(self, m: Member, error: BaseException) -> None:
        for i, p in enumerate(self.parts):
            if p.member is m and not p.here:  # a part already here lost nothing
                self._resubmit(i, error)

    def _resubmit(self, i: int, error: BaseException) -> None:
        """Part `i`'s batches not taken yet, submitted again to another actor."""
        p = self.parts[i]
        if p.attempts >= MAX_ATTEMPTS:
            raise RuntimeError(
                f"stoker: batches [{p.first}, {p.end}) of epoch {self.key[0]} (rank "
                f"{self.key[1]} of {self.key[2]}) were lost with {p.attempts} service actors "
                f"in turn; the last failure: {type(error).__name__}: {error}") from error
        f = self.f
        f.load[id(p.member)] -= p.end - p.first
        _cancel(p.gen)
        q = f._submit(p.first, p.end, self, None)
        q.attempts = p.attempts + 1
        self.parts[i] = q
        f.resubmitted_parts += 1
        f.recomputed_batches += p.end - p.first

    # -- taking ----------------------------------------------------------------------------

    def take(self, j: int, deadline: Optional[float]) -> Delivery:
        """Batch `j` (the next one), waiting until `deadline` (time.monotonic(); None:
        forever) for it: TimeoutError after that."""
        if j != self.taken:
            raise RuntimeError(f"stoker: internal error: batch {j} asked, {self.taken} due")
        f = self.f
        t0 = time.perf_counter()
        get = 0.0
        next_report = time.monotonic() + _SLOW_SECONDS
        while True:
            self._fill(deadline)
            p = self.parts[0]
            if p.here:
                break
            try:
                ref = p.ref if p.ref is not None else \
                    self._next_ref(p, deadline, t0, next_report)
                if ref is None:
                    next_report = time.monotonic() + _SLOW_SECONDS
                    continue
                t1 = time.perf_counter()
                label, node, put, put_batches, batches = ray.get(ref)
                get = time.perf_counter() - t1
            except _LOST as e:
                if isinstance(e, _ACTOR_GONE):
                    f._lose(p.member, e)
                else:
                    self._resubmit(0, e)
                continue
            except rex.RayTaskError as e:  # the pipeline itself failed on the actor
                cause = e.cause if isinstance(e.cause, BaseException) else e
                raise cause from None
            if batches[0][0] != p.first:
                raise RuntimeError(f"stoker: internal error: batch {batches[0][0]} came for "
                                   f"{p.first}")
            p.ref = None
            p.here.extend(batches)
            m = p.member
            m.node = node
            st = f._stats(m)
            st.node = node
            st.put_seconds, st.put_batches = put, put_batches
        k, samples, compute, error, payload = p.here.popleft()
        st = f._stats(p.member)
        st.batches += 1
        st.samples += samples
        st.compute_seconds += compute
        f.load[id(p.member)] -= 1
        p.first += 1
        if p.first == p.end:
            self.parts.popleft()
        self.taken += 1
        self._fill(deadline)
        self._pull_ahead()
        return Delivery(j, samples, error, payload, time.perf_counter() - t0 - get, get)

    def _next_ref(self, p: _Part, deadline: Optional[float], t0: float,
                  next_report: float) -> Any:
        """The ref of part `p`'s object; None when it is time to report a slow batch (the
        caller goes on waiting)."""
        while True:
            ready, _ = ray.wait([p.gen], timeout=_SLICE)
            if ready:
                try:
                    return next(p.gen)
                except StopIteration:  # the task ended before its batches: it failed
                    raise rex.WorkerCrashedError() from None
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError(f"no batch came from the service within the timeout "
                                   f"(batch {p.first} of epoch {self.key[0]}, actor "
                                   f"{p.member.label})")
            if now >= next_report:
                level = logging.INFO if now - t0 < 2 * _SLOW_SECONDS else logging.WARNING
                _log.log(level, "stoker: waiting %.0f s for batch %d of epoch %d from service "
                         "actor %s (node %s)", time.perf_counter() - t0, p.first, self.key[0],
                         p.member.label, (p.member.node or "not known yet")[:8])
                return None

    def _pull_ahead(self) -> None:
        """Parts made on another node start moving here before the loop asks for them:
        the refs of finished parts are taken from their generators and fetched."""
        refs = []
        for p in self.parts:
            if p.here or p.member.node is None or p.member.node == self.f._local_node:
                continue
            if p.ref is None and ray.wait([p.gen], timeout=0)[0]:
                try:
                    p.ref = next(p.gen)
                except StopIteration:
                    continue
            if p.ref is not None:
                refs.append(p.ref)
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)

    def close(self) -> None:
        """The loop left the segment: the parts in flight are cancelled."""
        f = self.f
        for p in self.parts:
            f.load[id(p.member)] -= p.end - p.first
            _cancel(p.gen)
        self.parts.clear()
        f.close(self)


def _cancel(gen: Any) -> None:
    try:
        ray.cancel(gen)
    except Exception:  # the task is done, or the actor gone: nothing to stop
        pass
