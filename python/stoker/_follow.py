"""DataLoader reads ``collate_fn`` and ``worker_init_fn`` from the loader at each iter():
a Loader follows an assignment to either from the next epoch (follow_hooks), as it follows
the dataset's length (follow_len in _dropin.py)."""

from __future__ import annotations

from typing import Any, Dict

from ._dropin import _rebuild, rebuilt_arguments
from ._loader_args import check_picklable
from ._plan import plan

__all__ = ["follow_hooks", "picklable_arguments"]


def _assigned(self: Any) -> Dict[str, Any]:
    """{name: value} of collate_fn and worker_init_fn assigned since the loader was made
    and not followed yet (follow_hooks says which count)."""
    collate_fn, worker_init_fn = self._hooks
    changes: Dict[str, Any] = {}
    if self.collate_fn is not collate_fn:
        changes["collate_fn"] = self.collate_fn
    stage = self.plan.stage
    python_workers = (stage is not None and stage.fetch != "batches") or \
        changes.get("collate_fn") is not None
    if self.worker_init_fn is not worker_init_fn and python_workers:
        changes["worker_init_fn"] = self.worker_init_fn
    return changes


def picklable_arguments(self: Any) -> Dict[str, Any]:
    """The loader's arguments as a pickled copy makes it again: with a collate_fn or
    worker_init_fn assigned since (followed by the copy from its first iter()); refused
    where one cannot be pickled, naming it."""
    arguments = dict(self.plan.arguments)
    arguments.update(_assigned(self))
    check_picklable(arguments)
    return arguments


def follow_hooks(self: Any) -> None:
    """DataLoader reads ``collate_fn`` and ``worker_init_fn`` from the loader at each
    iter(): one assigned since the loader was made (or last followed) is used from the next
    epoch's iter(), the loader made again with it at the epoch it was at (between epochs: a
    running epoch keeps its own, as DataLoader's iterator does; a resume loaded and not
    started yet is kept). Never ignored: except a worker_init_fn where no Python runs per
    sample (a stoker.Dataset without map=, token batches, a Mix), which has no worker to
    run in, as Lightning assigns one to every loader under PL_SEED_WORKERS=1 (the
    constructor refuses it there: docs/python.md)."""
    changes = _assigned(self)
    if not changes:
        return
    running = self._live_iter() if self._live_iter is not None else None
    if running is not None and len(running) > 0:
        return
    # one the loader cannot take raises here, before anything stops: the loader as it was
    plan(self.dataset, **rebuilt_arguments(self, **changes))  # (0.1 ms; starts nothing)
    state = self.state_dict() if self._pending_resume() is not None else None
    _rebuild(self, **changes)
    if state is not None:
        self.load_state_dict(state)
