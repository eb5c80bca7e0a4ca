"""What every source is (NOTE [ Sources ] in stoker/_sources/__init__.py): :class:`Source`,
a kind of dataset as the plan holds it (its checks, the part of the plan it makes, its
wiring), and :class:`Running`, what the loader keeps of it (its per-epoch hook, its parts
of the state, its identity and its counters)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple

from .._plan_parts import RecordPlan, Sampling, StagePlan

__all__ = ["Source", "Running", "Planning", "Planned"]


@dataclasses.dataclass(frozen=True)
class Planning:
    """What plan() has checked when a source plans its part: the arguments (with their
    defaults) and the values made of them."""

    a: Mapping[str, Any]  # Loader's arguments, defaults filled in (_plan.DEFAULTS)
    dataset: Any
    sampling: Sampling
    map: Optional[Callable]
    batch_map: Optional[Callable]
    collate_fn: Optional[Callable]
    workers: str  # the stage's workers: "thread", "process" or "auto"
    num_workers: Optional[int]  # DataLoader's
    stage_kw: Mapping[str, Any]  # StagePlan's DataLoader arguments
    on_device: bool  # batches delivered to a CUDA device
    on_error: str
    verify: str
    cache: Any  # _cache.CachePlan or None
    max_pixels: int
    token_options: Mapping[str, Any]  # a TokenDataset's own (field=, ...)


class Planned(NamedTuple):
    """A source's part of the plan."""

    dataset: Any  # what the loader reads (a mixture's token view, a token dataset's own)
    producer: str  # the C++ producer's class, for print(plan)
    records: Optional[RecordPlan] = None
    tokens: Optional[Mapping[str, Any]] = None
    stage: Optional[StagePlan] = None
    nchw: Tuple[str, ...] = ()
    as_tuple: Tuple[str, ...] = ()


class Source:
    """A kind of dataset in a plan (``LoaderPlan.source``): what the rest of the loader
    asks of it, as attributes and methods, so that nothing outside stoker/_sources/
    branches on the kind. Sources hold no state: two are equal when of one class."""

    kind = ""  # for messages: "records", "map-style", "iterable", "tokens", ...
    # its samples are a Python object's (dataset[i], iter(dataset)), not stoker records:
    # no transforms, no remote shards, no read tier
    reads_python = False
    batches_are_tokens = False  # token rows (seq_len=, max_tokens=), not samples
    # its order is its producer's own (token windows, a mixture's rows): no sampler, no
    # generator's permutation
    own_order = False
    # a sampler can order its samples (they have indices); False: a stream's own order
    indexed = True
    # DataLoader's: len(dataset) read again at each len() and iter() (a map-style dataset
    # that grew is planned again)
    follows_len = False
    # a user sampler's items must be indices (stoker's records), not any key
    sampler_indices_only = False
    # len(loader) comes from the dataset's __len__, a promise an epoch can break (DataLoader
    # warns when an IterableDataset yields more than it said)
    len_from_dataset = False
    # the next epoch's order is known before its iter() (prefetch_next_epoch can work)
    order_known_ahead = True
    threads_note: Optional[str] = None  # print(plan)'s threads, where not the core's

    def __eq__(self, other: Any) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __str__(self) -> str:
        return type(self).__name__

    # -- plan() -------------------------------------------------------------------------

    def describe(self, dataset: Any) -> str:
        """The dataset, for print(plan)."""
        return repr(dataset)

    def ranks_note(self, sampling: Sampling) -> Optional[str]:
        """print(plan)'s ranks, where the source decides them; None: the sampling's."""
        return None

    def check_shard_window(self, shard_window: int, shuffle: bool) -> None:
        """shard_window= given: refused where it cannot work."""
        if not shuffle:
            raise ValueError("shard_window needs shuffle=True: it shuffles a window of shards "
                             "at a time (without shuffle the order is sequential, one shard "
                             "after the other)")

    def splits_ranks(self, given: Mapping[str, Any]) -> bool:
        """Whether stoker splits the samples across ranks (else each rank reads them all)."""
        return True

    def check_verify(self, verify: str) -> None:
        """verify= other than "first": refused where there is nothing to verify."""

    def plan(self, ctx: Planning) -> Planned:
        """Its part of the plan: the producer, its options, the Python stage."""
        raise NotImplementedError

    def epoch_shards(self, dataset: Any) -> Any:
        """The sizes of the shards stoker's own order runs over (loader.sampler iterates
        it); a TypeError where the order is not a list of sample indices."""
        raise TypeError(f"the order of a loader over {self.kind} is planned by its C++ "
                        "producer (windows, rows of sources): it has no per-sample index "
                        "list to iterate")

    # -- build() ------------------------------------------------------------------------

    def build(self, p: Any, world_size: int, open_device: Any) -> Any:
        """The running parts of plan `p` (a ``_build.Parts``), its ``source`` a
        :class:`Running`. `world_size`: the world now; `open_device`: stands in for the
        CUDA driver (tests: the host fake)."""
        raise NotImplementedError


class Running:
    """A source as the loader keeps it (``Parts.source``): the hooks of its kind."""

    def __init__(self, dataset: Any, producer: Any):
        self.dataset, self.producer = dataset, producer

    def at_epoch(self, loader: Any, world: int) -> None:
        """At each iter(), before the epoch's iterator: `world` is the world size now."""

    def identity(self) -> Dict[str, Any]:
        """What a state records of the data, checked by a resume."""
        raise NotImplementedError

    def state_parts(self) -> Dict[str, Any]:
        """Its stateful parts, by the key of their state (each with state() and load())."""
        return {}

    def stats(self, s: Dict[str, Any], counts: Any, state: Tuple[int, int, int]) -> None:
        """Adds its counters to `s` (``Loader.stats()``): `counts` are the core's per
        source counts, `state` the core's (epoch, position, world)."""

    def tier(self) -> Optional[str]:
        """Where reads were served from (memory, mmap, remote); None: no stoker reads."""
        return None

    def skipped_report(self, n: int) -> Optional[str]:
        """The warning for `n` samples ``on_error="skip"`` left out, where the source names
        them; None: the loader's (replaced by the next valid sample)."""
        return None


def describe_python(dataset: Any) -> str:
    """A Python dataset (map-style, iterable), for print(plan): its type and length."""
    try:
        return f"{type(dataset).__name__} of {len(dataset)} samples"
    except TypeError:
        return type(dataset).__name__


def dataset_identity(dataset: Any, tokens: bool, epoch_samples: int) -> Dict[str, Any]:
    """What a stoker dataset must still be for a state to apply: its size, schema and,
    for a dataset written with one, the write's id (a rewrite is another dataset)."""
    if tokens:
        ident = {"epoch_samples": epoch_samples, "num_tokens": dataset.num_tokens,
                 "num_docs": dataset.num_docs}
        files = dataset.fingerprint() if hasattr(dataset, "fingerprint") else None
        if files is not None:
            ident["files"] = files  # [size, sampled checksum] per token file
        dataset_id = getattr(getattr(dataset, "dataset", None), "dataset_id", None)
    else:
        ident = {"num_records": len(dataset), "schema_hash": f"{dataset._hash:016x}"}
        dataset_id = getattr(dataset, "dataset_id", None)
    if dataset_id is not None:
        ident["dataset_id"] = dataset_id
    return ident
