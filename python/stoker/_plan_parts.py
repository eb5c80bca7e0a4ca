"""The parts of a :class:`LoaderPlan` (NOTE [ Loader plan ] in stoker/_plan.py), as values:
which samples make batch k (:class:`Sampling`), the record producer's options
(:class:`RecordPlan`), the Python stage (:class:`StagePlan`), the delivery, and the plan
itself, which prints them. ``plan()`` makes them; each source (stoker/_sources/) plans its
part and builds from them."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from . import _loader_args as args
from ._media_args import MediaPlan
from .ops import Op

__all__ = ["Sampling", "GroupPlan", "RecordPlan", "StagePlan", "DeliveryPlan", "LoaderPlan"]

_MASK = 0xFFFFFFFFFFFFFFFF


# -- the plan -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Sampling:
    """Which samples make batch k: a function of these and (epoch, rank, world size)."""

    batch_size: Optional[int]
    shuffle: bool
    seed: int  # as given (a negative seed is taken modulo 2**64: seed64)
    drop_last: bool
    even_batches: bool
    shard_window: Optional[int]
    rank: Optional[int]  # None: torch.distributed's at each iter() and len()
    world_size: Optional[int]
    # A user's sampler or batch sampler (NOTE [ User samplers ]): iterated once per epoch,
    # its order replaces shuffle, the rank split and (a batch sampler) batch_size
    sampler: Any = dataclasses.field(default=None, compare=False)
    batch_sampler: Any = dataclasses.field(default=None, compare=False)
    unbatched: bool = False  # batch_size=None: each sample alone, as DataLoader's
    # shuffle=True with a generator: each epoch's permutation is RandomSampler's, drawn
    # from it (NOTE [ Seeds as DataLoader draws them ] in stoker/_dropin.py)
    generator: Any = dataclasses.field(default=None, compare=False)
    # a BatchSampler given as sampler= with batch_size=None over a stoker.Dataset: its
    # lists are batches (DataLoader's bulk loading), listed as a batch sampler's
    bulk: bool = False
    # an IterableDataset's stream split across ranks by stoker (even_batches=, rank= or
    # world_size= given), not given to each rank as it is (DataLoader's rule)
    split_ranks: bool = True

    @property
    def seed64(self) -> int:
        return self.seed & _MASK

    def state_keys(self) -> Dict[str, Any]:
        """What a resume state is valid for (stoker/_loader_state.py)."""
        return {"seed": int(self.seed), "shuffle": self.shuffle,
                "shard_window": self.shard_window,
                "batch_size": self.batch_size, "drop_last": self.drop_last,
                "even_batches": self.even_batches}


@dataclasses.dataclass(frozen=True)
class GroupPlan:
    """Fields that move together under one list of ops, with one set of draws per sample
    (a tuple key of ``transforms``); each field's target kind (image, mask, boxes,
    keypoints, rows) as ``(kind, box format, normalized)``."""

    fields: Tuple[str, ...]
    ops: Tuple[Op, ...]
    targets: Tuple[Tuple[Any, ...], ...] = ()


@dataclasses.dataclass(frozen=True)
class RecordPlan:
    """The one ``_core.RecordOptions`` of a record producer, as values."""

    images: Tuple[Tuple[str, str, int], ...]  # (field, decoded layout, max pixels)
    groups: Tuple[GroupPlan, ...]
    pad_values: Tuple[Tuple[str, bytes], ...] = ()
    batch_mix: Any = None  # _transform_args.BatchMixPlan
    skip_errors: bool = False
    handoff: bool = False  # the batch goes to the Python stage (batch_map) when assembled
    verify: str = "first"  # a record's checksum: "first", "always" or "once" (_cache.check_verify)
    cache: Any = None  # a _cache.CachePlan: decoded images kept (stoker/_cache.py)
    media: MediaPlan = MediaPlan()  # video clips and audio crops (stoker/_media_args.py)


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """The Python stage (NOTE [ Python stage ] in stoker/_stage/__init__.py)."""

    fetch: str  # "records": C++ fetch per sample; "map-style": obj[i]; "batches": C++-assembled;
    #             "iterable": an IterableDataset's stream
    map: Optional[Callable] = None
    batch_map: Optional[Callable] = None
    collate_fn: Optional[Callable] = None
    map_fields: Optional[Mapping[Any, Any]] = None
    names: Optional[Tuple[Any, ...]] = None
    workers: str = "thread"  # "process", or "auto": threads, processes once GIL-bound
    batch_map_on_consumer: bool = False  # device batches: batch_map after the copy
    records: Optional[RecordPlan] = None  # fetch="records": what the C++ fetch does
    num_workers: Optional[int] = None  # DataLoader's: None follows num_threads; 0: inline
    worker_init_fn: Optional[Callable] = None
    unbatched: bool = False
    # DataLoader's: False runs worker_init_fn again at each epoch (NOTE [ No argument
    # ignored ] in stoker/_dropin.py)
    persistent_workers: bool = False  # each sample alone, default_convert'ed (batch_size=None)

    @property
    def processes(self) -> bool:
        return self.workers == "process"

    @property
    def inline(self) -> bool:
        """num_workers=0: the user's code runs in the loop's thread, in next()."""
        return self.num_workers == 0


@dataclasses.dataclass(frozen=True)
class DeliveryPlan:
    device: str  # "cpu", "cuda", "cuda:N"
    pin_memory: Optional[bool]  # None: True for a CUDA device
    image_layout: Optional[str]
    nchw_views: Tuple[str, ...] = ()  # HWC images delivered as NCHW views
    hf_lengths: bool = False  # labels="unshifted" + packing: max_length_q/_k as ints
    pin_device: str = ""  # DataLoader's pin_memory_device: the CUDA device pinning goes through
    # a stoker.Dataset's as_tuple, without collate_fn: batches as lists in that order
    # (default_collate's structure for tuple items)
    as_tuple: Tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class LoaderPlan:
    """What a loader is, checked and printable (NOTE [ Loader plan ])."""

    # the kind of dataset (stoker/_sources/): its class shows here, its .kind in messages
    source: Any
    dataset: Any
    sampling: Sampling
    producer: str  # the C++ producer's class in _core
    records: Optional[RecordPlan]
    tokens: Optional[Mapping[str, Any]]  # the token producer's keyword arguments
    stage: Optional[StagePlan]
    delivery: DeliveryPlan
    settings: args.Settings
    on_error: str
    prefetch_next_epoch: bool
    labels: str
    timeout: float = 0.0  # seconds next() waits for a batch before an error; 0: forever
    # a pool that makes the batches (NOTE [ Disaggregated loading ] in stoker/service/)
    service: Any = None
    # as given (pickling rebuilds the loader from them); not part of what the plan is
    arguments: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False,
                                                     repr=False)

    @property
    def is_tokens(self) -> bool:
        return self.source.batches_are_tokens

    def __str__(self) -> str:
        s = self.sampling
        lines = [f"LoaderPlan: {self.source} ({self.source.describe(self.dataset)})"]
        world = "torch.distributed's" if s.rank is None and s.world_size is None else \
            f"rank {s.rank}, world_size {s.world_size}"
        order = "shuffled" if s.shuffle else "in order"
        if s.shard_window:
            order += f", shard_window={s.shard_window}"
        user = s.batch_sampler if s.batch_sampler is not None else s.sampler
        if s.generator is not None:
            order = "shuffled, each epoch's permutation RandomSampler's from the generator"
        world = self.source.ranks_note(s) or world
        if user is not None:
            what = "batch_sampler" if s.batch_sampler is not None else "sampler"
            order = f"{what} {type(user).__name__}'s order, listed per epoch"
            world = "the sampler's"
        size = "None (unbatched)" if s.unbatched else s.batch_size
        lines.append(f"  sampling: batch_size={size}, {order}, seed={s.seed}, "
                     f"drop_last={s.drop_last}, even_batches={s.even_batches}; ranks: {world}")
        lines.append(f"  producer: {self.producer}")
        if self.records is not None:
            lines += ["    " + x for x in describe_records(self.records)]
        if self.tokens is not None:
            keys = ("mode", "seq_len", "max_tokens", "token_dtype", "labels", "unshifted")
            lines.append("    " + ", ".join(f"{k}={self.tokens[k]!r}" for k in keys
                                            if k in self.tokens))
        if self.stage is None:
            lines.append("  stage: none (no Python per batch)")
        else:
            st = self.stage
            hooks = [f"{k}={_name(getattr(st, k))}" for k in ("map", "batch_map", "collate_fn")
                     if getattr(st, k) is not None]
            where = {"records": "samples fetched by C++ (read, decode, ops)",
                     "map-style": "dataset[i]", "iterable": "iter(dataset) per worker",
                     "batches": "batches assembled by C++"}[st.fetch]
            count = ("1" if st.fetch == "iterable" else "num_threads") \
                if st.num_workers is None else st.num_workers
            if st.inline:
                count = "none: in the loop's thread"
            lines.append(f"  stage: {', '.join(hooks) or 'native batching'}; {where}; "
                         f"{st.workers} workers ({count})" +
                         ("; batch_map after the device copy" if st.batch_map_on_consumer
                          else ""))
            if st.records is not None:
                lines += ["    " + x for x in describe_records(st.records)]
        d = self.delivery
        memory = "pinned" if d.pin_memory else "pageable" if d.pin_memory is not None else \
            ("pinned" if d.device.startswith("cuda") else "pageable")
        layout = d.image_layout or ("NCHW views of HWC decodes" if d.nchw_views else "")
        lines.append(f"  delivery: {d.device} ({memory} host memory)" +
                     (f"; images {layout}" if layout else ""))
        t = self.settings
        threads = f"auto (up to {t.num_threads})" if t.auto_threads else str(t.num_threads)
        window = f"auto (up to {t.prefetch})" if t.auto_prefetch else str(t.prefetch)
        memory = f", max_memory {t.max_memory / 2**20:.0f} MiB"
        if self.source.threads_note is not None:  # its rows read by Python workers
            threads, memory = self.source.threads_note, ""
        lines.append(f"  settings: threads {threads}, prefetch {window}{memory}, "
                     f"on_error={self.on_error!r}, "
                     f"prefetch_next_epoch={self.prefetch_next_epoch}" +
                     (f", timeout={self.timeout:g} s" if self.timeout else ""))
        if self.service is not None:
            lines.append(f"  service: {self.service.describe()} makes the batches; this "
                         "process counts and takes them")
        return "\n".join(lines)


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def describe_records(r: RecordPlan) -> list:
    out = []
    if r.images:
        out.append("images: " + ", ".join(f"{n} ({layout})" for n, layout, _ in r.images))
    for g in r.groups:
        ops = ", ".join(repr(op) for op in g.ops) or "no ops"
        out.append(f"transforms[{', '.join(g.fields)}]: {ops}")
    if r.pad_values:
        out.append("pad_values: " + ", ".join(n for n, _ in r.pad_values))
    if r.batch_mix is not None:
        out.append(f"batch_transforms: {r.batch_mix}")
    if r.skip_errors:
        out.append("on_error='skip'")
    if r.verify != "first":
        out.append(f"verify={r.verify!r}")
    if r.cache is not None:
        out.append(r.cache.describe())
    return out


