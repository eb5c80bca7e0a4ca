"""A loader's resume state: what ``Loader.state_dict()`` holds, its versions, and the
checks ``load_state_dict`` makes before the core resumes (the same data, the same
sampling settings, a position inside the epoch); and :class:`Resume`, the part of a loader
that owns them (``Loader.state()`` and ``load_state_dict`` are its methods).

The state is the epoch and the global samples of it the whole job has consumed, the same
on every rank; the world size that saved it only decides where wrap-around padding
restarts (``EpochKey::pad_from`` in csrc/pipeline/batch_producer.h).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from ._loader_args import check_int

VERSION = 2
# Settings a state is only valid for (Sampling.state_keys in stoker/_plan.py): each must be
# in the state and equal to the loader's.
SAMPLING_KEYS = ("seed", "shuffle", "shard_window", "batch_size", "drop_last", "even_batches")


@dataclasses.dataclass(frozen=True)
class LoaderState:
    """Where a loader stands, the same on every rank in lockstep: the epoch and the global
    samples of it the job has consumed (the core's: ``LoaderCore::state``), the world size
    that consumed them, what the state is valid for (sampling settings, the dataset's
    identity), and each stateful part's own state under its key (``"mix"``: a schedule's
    rows per step), as torchdata.nodes nests ``get_state()``. ``state_dict()`` is its
    ``to_dict()``; ``load_state_dict`` reads it back with :meth:`from_dict`, which checks
    every field (type, range, presence)."""

    epoch: int
    position: int
    world_size: int
    sampling: Mapping[str, Any]
    dataset: Mapping[str, Any]
    parts: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return {"version": VERSION, "epoch": self.epoch, "position": self.position,
                "world_size": self.world_size, **self.sampling, "dataset": dict(self.dataset),
                **{k: dict(v) for k, v in self.parts.items()}}

    @classmethod
    def from_dict(cls, state: Any, sampling: Mapping[str, Any], identity: Mapping[str, Any],
                  epoch_samples: int, parts: Sequence[str] = ()) -> "LoaderState":
        """The state a loader with these `sampling` settings over a dataset of this
        `identity` can resume, else the error that says why not. `parts`: the keys of
        the stateful parts this loader has (each must be in the state)."""
        if not isinstance(state, Mapping):
            raise TypeError(f"load_state_dict takes the dict of state_dict(), got "
                            f"{type(state).__name__}")
        version = state.get("version")
        if version == 1:
            state = upgrade_v1(state)
        elif version != VERSION:
            raise ValueError(f"unsupported loader state version {version!r}")
        for key in SAMPLING_KEYS:
            if key not in state:
                raise ValueError(f"cannot resume: the state has no {key!r} (a loader state "
                                 f"holds {', '.join(SAMPLING_KEYS)})")
            if state[key] != sampling[key] or type(state[key]) is not type(sampling[key]):
                raise ValueError(f"cannot resume: state has {key}={state[key]!r} but this "
                                 f"loader has {key}={sampling[key]!r}")
        theirs = state.get("dataset")
        if not isinstance(theirs, Mapping):
            raise ValueError("cannot resume: the state names no dataset")
        for key, value in identity.items():
            if key in ("dataset_id", "files") and key not in theirs:
                continue  # a state saved before datasets had ids
            if theirs.get(key) != value:
                raise ValueError(f"cannot resume: the state is for another dataset ({key} "
                                 f"{theirs.get(key)!r}, this loader's dataset has {value!r})")
        for key in ("epoch", "position", "world_size"):
            if key not in state:
                raise ValueError(f"cannot resume: the state has no {key!r}")
        epoch = check_int("state's epoch", state["epoch"], 0)
        position = check_int("state's position", state["position"], 0)
        if position > epoch_samples:
            raise ValueError(f"cannot resume: position {position} is past the epoch's "
                             f"{epoch_samples} samples")
        world = check_int("state's world_size", state["world_size"], 1)
        got: Dict[str, Mapping[str, Any]] = {}
        for key in parts:
            part = state.get(key)
            if not isinstance(part, Mapping):
                raise ValueError(f"cannot resume: the state has no {key!r} part (this "
                                 f"loader's {key} keeps state), got {part!r}")
            got[key] = part
        return cls(epoch, position, world, {k: state[k] for k in SAMPLING_KEYS},
                   dict(theirs), got)


def upgrade_v1(state: Mapping[str, Any]) -> Dict[str, Any]:
    """A version-1 state (a rank's batches_yielded) as version 2 (global position)."""
    done = check_int("state's batches_yielded", state.get("batches_yielded"), 0)
    world = check_int("state's world_size", state.get("world_size"), 1)
    batch = check_int("state's batch_size", state.get("batch_size"), 1)
    n = check_int("state's num_records", state.get("num_records"), 0)
    out = dict(state)
    out["version"] = VERSION
    out["position"] = min(n, done * batch * world)
    out["dataset"] = {"num_records": n}
    out.setdefault("shard_window", None)  # version 1 had neither
    out.setdefault("even_batches", True)
    return out


def check_lightning_resume(world_now: int, saved_world: int, position: int,
                           epoch_samples: int, caller: Any) -> None:
    """NOTE [ Elastic resume under Lightning ] in stoker/lightning.py: Lightning loading a
    mid-epoch state of another world size, without stoker.lightning.ElasticResume to
    correct its batch counter, would end the epoch before the loader's rows run out.
    `caller` is the frame that called ``load_state_dict``."""
    name = caller.f_globals.get("__name__", "")
    if not (name.startswith(("lightning.pytorch.", "pytorch_lightning."))
            and name.endswith(".combined_loader")):
        return
    if saved_world in (0, world_now) or not 0 < position < epoch_samples:
        return
    lightning = sys.modules.get("stoker.lightning")
    if lightning is not None and lightning._active > 0:
        return
    raise RuntimeError(
        f"cannot resume exactly: Lightning restores a mid-epoch checkpoint saved at world size "
        f"{saved_world} onto {world_now} processes, and without stoker.lightning.ElasticResume "
        f"its batch counter (batches of the old world size) would end the epoch before the "
        f"loader's rows run out. stoker's package adds that callback to every Trainer through "
        f"an entry point, which this installation lacks: import stoker.lightning and pass "
        f"callbacks=[stoker.lightning.ElasticResume()] to the Trainer, or resume on "
        f"{saved_world} processes")


# -- the stateful parts of a loader, each under its own key ------------------------------

class SamplerPart:
    """A user sampler as a part of the loader state: the epoch of the core's state."""

    def __init__(self, samplers: Any, core: Any):
        self._samplers, self._core = samplers, core

    def state(self) -> Dict[str, Any]:
        return self._samplers.state(self._core.state()[0])

    def load(self, part: Mapping[str, Any]) -> None:
        self._samplers.load(dict(part), int(part.get("epoch", -1)))


# -- a loader's resume state: Loader.state() and load_state_dict() ------------------------

class Resume:
    """A loader's resume state, owned here with the parts it reads: the core (epoch,
    position, world size), the sampling settings it is valid for, the source's running
    half (the dataset's identity and its stateful parts, stoker/_sources/) and a user
    sampler. ``Loader.state()``, ``load_state_dict`` and ``_pending_resume`` are its
    methods; `world` gives (rank, world_size) now."""

    def __init__(self, core: Any, producer: Any, source: Any, sampling: Any,
                 samplers: Any, world: Callable[[], Tuple[int, int]]):
        self._core, self._producer, self._source = core, producer, source
        self._sampling, self._samplers, self._world = sampling, samplers, world
        # fixed for the loader's life (its dataset may be closed later)
        self._identity: Dict[str, Any] = source.identity()
        self._loaded: Optional[Tuple[int, int, int]] = None  # the last load()

    def identity(self) -> Dict[str, Any]:
        """What a state records of the loader's data: its source's identity."""
        return self._identity

    def parts(self) -> Dict[str, Any]:
        """The stateful parts, by the key of their state."""
        parts: Dict[str, Any] = dict(self._source.state_parts())
        if self._samplers is not None:
            parts["sampler"] = SamplerPart(self._samplers, self._core)
        return parts

    def state(self) -> LoaderState:
        """The core's epoch and position, with what they are valid for and each stateful
        part's state."""
        epoch, position, world = self._core.state()
        return LoaderState(epoch, position, world or self._world()[1],
                           self._sampling.state_keys(), self._identity,
                           {k: part.state() for k, part in self.parts().items()})

    def load(self, state: Mapping[str, Any], caller: Any) -> None:
        """Every field of `state` checked, then the parts and the core resumed. `caller`
        is the frame that called ``load_state_dict``."""
        epoch_samples = self._producer.epoch_samples()
        parts = self.parts()
        s = LoaderState.from_dict(state, self._sampling.state_keys(), self._identity,
                                  epoch_samples, tuple(parts))
        check_lightning_resume(self._world()[1], s.world_size, s.position, epoch_samples,
                               caller)
        if "sampler" in s.parts and s.parts["sampler"].get("epoch") != s.epoch:
            raise ValueError(f"cannot resume: the state's sampler part is for epoch "
                             f"{s.parts['sampler'].get('epoch')!r}, the state's epoch is "
                             f"{s.epoch}")
        for key, part in parts.items():
            part.load(s.parts[key])
        self._core.load_state(s.epoch, s.position, s.world_size)
        self._loaded = tuple(self._core.state())

    def pending(self) -> Optional[Tuple[int, int]]:
        """For a resume loaded and not started yet: (the world size that saved it, the
        batches the next iterator of this rank yields); else None."""
        if self._loaded is None or tuple(self._core.state()) != self._loaded:
            return None
        return self._loaded[2], self._core.next_batches(*self._world())
