"""A user's sampler or batch sampler (NOTE [ User samplers ] in stoker/_plan.py): listed
once per epoch into the C++ order (``_core.ListedOrders``), and kept resumable.

What makes an epoch's order again, for a resume:
  * a sampler with ``state_dict()``/``load_state_dict()`` (torchdata's protocol): its
    state before the epoch was listed;
  * otherwise the random generators it draws from: its own (torch.Generator, NumPy
    Generator, random.Random, found among its attributes and those of the sampler it
    wraps) and the global ones (torch's default generator, numpy.random, random), taken
    before the epoch was listed and given back after listing it again. The first epoch
    listed is listed twice to check that this makes the same order; a sampler with other
    state (a counter, a file) fails the check, and then ``state_dict()`` says so.
"""

from __future__ import annotations

import operator
import random
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

__all__ = ["UserSampler"]


def _same(a: Optional[List[Any]], b: Optional[List[Any]]) -> bool:
    """Two listings' items (None: indices) alike?"""
    if a is None or b is None:
        return a is b
    try:
        return len(a) == len(b) and all(bool(x == y) for x, y in zip(a, b))
    except Exception:  # items that do not compare (arrays of several values...)
        return False


def _inner(obj: Any) -> List[Any]:
    """The sampler and those it wraps (a BatchSampler's sampler, ...)."""
    out, seen = [], set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        out.append(obj)
        obj = getattr(obj, "sampler", None)
    return out


def _generators(sampler: Any) -> List[Any]:
    gens = []
    for s in _inner(sampler):
        for v in list(getattr(s, "__dict__", {}).values()):
            if isinstance(v, (torch.Generator, np.random.Generator, random.Random)):
                gens.append(v)
    return gens


def _get(g: Any) -> Any:
    if isinstance(g, torch.Generator):
        return g.get_state()
    if isinstance(g, np.random.Generator):
        return g.bit_generator.state
    return g.getstate()


def _set(g: Any, state: Any) -> None:
    if isinstance(g, torch.Generator):
        g.set_state(state)
    elif isinstance(g, np.random.Generator):
        g.bit_generator.state = state
    else:
        g.setstate(state)


class UserSampler:
    """A loader's user sampler: lists epochs, keeps what makes them again."""

    def __init__(self, sampler: Any, batched: bool, batch_size: int, drop_last: bool,
                 num_records: int, listed: Any, indices_only: bool = False,
                 permutation: bool = False, draw: Any = None):
        self.sampler = sampler
        self.batched = batched  # a batch sampler (its items are lists of indices)
        # a dataset read by index in C++ (a stoker.Dataset): an item that is not an index
        # is refused, never read as a position (a map-style dataset's __getitem__ takes
        # any key: _stream)
        self.indices_only = indices_only
        # the epoch's permutation of the dataset, batched and split by rank as stoker's own
        # order (shuffle=True with a generator: NOTE [ Seeds as DataLoader draws them ] in
        # stoker/_dropin.py), not the sampler's batches
        self.permutation = permutation
        self.draw = draw  # called first at each listing (DataLoader's base-seed draw)
        self.draw_now = True  # (not for the later epochs of one repeating iterator)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_records = num_records
        self.listed = listed  # _core.ListedOrders
        self.stateful = callable(getattr(sampler, "state_dict", None)) and \
            callable(getattr(sampler, "load_state_dict", None))
        self.gens = [] if self.stateful else _generators(sampler)
        self.kept: Dict[int, Any] = {}  # epoch -> what makes its order again
        # epoch -> the sampler's items, where they are not indices (_indices); the stage's
        # source reads them (MapStyleSource.keys), and on_keys is told first
        self.keys: Dict[int, List[Any]] = {}
        self.on_keys: Optional[Any] = None
        self.checked: Optional[bool] = None  # the first listing, made twice, agreed

    def set_epoch(self, epoch: int) -> None:
        if self.permutation:  # the loader's own sampler: its set_epoch is the loader's
            return
        for s in _inner(self.sampler):
            fn = getattr(s, "set_epoch", None)
            if callable(fn):
                fn(epoch)
                return

    # -- listing ------------------------------------------------------------------------

    def _snapshot(self) -> Any:
        if self.stateful:
            return ("state_dict", self.sampler.state_dict())
        return ("generators", [_get(g) for g in self.gens],
                (torch.random.get_rng_state(), np.random.get_state(), random.getstate()))

    def _restore(self, snap: Any) -> None:
        if snap[0] == "state_dict":
            self.sampler.load_state_dict(snap[1])
            return
        for g, state in zip(self.gens, snap[1]):
            _set(g, state)
        torch.random.set_rng_state(snap[2][0])
        np.random.set_state(snap[2][1])
        random.setstate(snap[2][2])

    def _stream(self, items: Any, where: Any = None
                ) -> Tuple[np.ndarray, Optional[List[Any]]]:
        """Items of the sampler (an iterable) as the C++ order's indices, with no Python
        list of them (a sampler of millions). Items that are not integers (a list of
        indices for a dataset that loads in bulk, a key) are passed to ``__getitem__`` as
        they are, as DataLoader passes them: the order then holds their positions, and
        the items go with the epoch (``keys``; those before the first non-integer as
        ints). Over a dataset read by index (``indices_only``) such an item is an error
        naming it and its position (`where(position)` says it in the sampler's terms)."""
        other: List[Any] = []

        def ints() -> Any:
            for pos, i in enumerate(items):
                try:
                    if self.indices_only and isinstance(i, (bool, np.bool_)):
                        raise TypeError
                    yield operator.index(i)
                except TypeError:
                    if self.indices_only:
                        self._refuse(i, pos if where is None else where(pos))
                    other.append(i)
                    return

        indices = np.fromiter(ints(), np.int64)
        if not other:
            return indices, None
        keys = [int(i) for i in indices] + other + list(items)
        return np.arange(len(keys), dtype=np.int64), keys

    def _refuse(self, item: Any, where: Any) -> None:
        what = "batch_sampler" if self.batched else "sampler"
        hint = ""
        if isinstance(item, (list, tuple)) or (hasattr(item, "__len__") and
                                                not isinstance(item, (str, bytes))):
            hint = (": a sampler whose items are lists of indices (a BatchSampler) is a "
                    "batch_sampler= (or, as DataLoader's bulk-loading pattern, sampler= "
                    "with batch_size=None)")
        raise ValueError(f"the {what} gave {item!r} at {where}: a stoker.Dataset is read "
                         f"by integer index (0 <= index < {self.num_records}), and an item "
                         f"that is not one is refused rather than read as a position{hint}")

    def _list(self) -> Tuple[np.ndarray, np.ndarray, Optional[List[Any]]]:
        """The sampler's epoch: (indices, where each batch ends, the items when they are
        not indices). A permutation's ends are empty: stoker batches it."""
        if self.draw is not None and self.draw_now:
            self.draw()
        if self.batched:
            batches = [list(b) for b in self.sampler]
            starts = np.cumsum([0] + [len(b) for b in batches])

            def where(pos: int) -> str:
                k = int(np.searchsorted(starts, pos, side="right")) - 1
                return f"batch {k}, position {pos - int(starts[k])}"

            indices, keys = self._stream((i for b in batches for i in b), where)
            ends = np.cumsum([len(b) for b in batches], dtype=np.int64)
            if any(len(b) == 0 for b in batches):
                raise ValueError("the batch_sampler gave an empty batch")
        elif self.permutation:
            indices, keys = self._stream(iter(self.sampler), lambda pos: f"position {pos}")
            ends = np.zeros(0, np.int64)
        else:
            indices, keys = self._stream(iter(self.sampler), lambda pos: f"position {pos}")
            n, b = len(indices), self.batch_size
            full = n // b
            ends = np.arange(1, full + 1, dtype=np.int64) * b
            if n % b and not self.drop_last:
                ends = np.append(ends, n)
            elif self.drop_last:
                indices = indices[: full * b]
        return indices, ends, keys

    def list_epoch(self, epoch: int, base_draw: bool = True) -> None:
        """Lists `epoch` (once: a later iter() of the same epoch runs the same order);
        `base_draw`: DataLoader's draw of a new iterator's base seed comes first."""
        if epoch in self.kept:
            return
        self.draw_now = base_draw
        snap = self._snapshot()
        indices, ends, keys = self._list()
        if self.checked is None and not self.stateful:
            # listed again from the same generators: the same order?
            after = self._snapshot()
            self._restore(snap)
            again, again_ends, again_keys = self._list()
            self._restore(after)
            self.checked = np.array_equal(indices, again) and \
                np.array_equal(ends, again_ends) and _same(keys, again_keys)
        if keys is not None:
            if self.on_keys is not None:
                self.on_keys()
            self.keys[epoch] = keys
        if self.permutation:
            self.listed.set_permutation(epoch, indices, self.num_records)
        else:
            # a map-style dataset's __getitem__ answers an index past its len() itself (as
            # with DataLoader); a stoker.Dataset's records stop at its len()
            bound = self.num_records if self.indices_only else \
                max(self.num_records, len(indices))
            self.listed.set(epoch, indices, ends, bound)
        self.kept[epoch] = snap
        for old in sorted(self.kept)[:-4]:
            del self.kept[old]
            self.keys.pop(old, None)

    # -- resume -------------------------------------------------------------------------

    def state(self, epoch: int) -> Dict[str, Any]:
        """The loader state's "sampler" part for a state in `epoch`."""
        name = type(self.sampler).__name__
        if not self.stateful and self.checked is False:
            raise RuntimeError(
                f"stoker cannot save an exact resume state: the {name} gives another order "
                "when listed again from the same random generators (it keeps other state). "
                "Give it state_dict()/load_state_dict() (torchdata's protocol), or draw from "
                "a torch.Generator it holds")
        snap = self.kept.get(epoch)
        if snap is None:  # an epoch not listed yet: the sampler as it is now
            snap = self._snapshot()
        return {"epoch": epoch, "snapshot": snap}

    def load(self, part: Any, epoch: int) -> None:
        """Makes `epoch`'s order again from a state's "sampler" part."""
        if not isinstance(part, dict) or part.get("epoch") != epoch or \
                not isinstance(part.get("snapshot"), tuple):
            raise ValueError(f"cannot resume: the state's sampler part is {part!r}, not "
                             f"the order of epoch {epoch}")
        snap = part["snapshot"]
        if snap[0] != ("state_dict" if self.stateful else "generators"):
            raise ValueError("cannot resume: the state's sampler part is of another sampler")
        now = None if self.stateful else self._snapshot()
        self._restore(snap)
        self.kept.pop(epoch, None)
        self.set_epoch(epoch)
        self.list_epoch(epoch)
        if now is not None:  # the global generators go on as they were
            torch.random.set_rng_state(now[2][0])
            np.random.set_state(now[2][1])
            random.setstate(now[2][2])
