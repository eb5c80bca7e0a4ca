"""Declare, then build: a Loader's arguments as a frozen :class:`LoaderPlan`; ``build``
(stoker/_build.py) is the one place that wires the C++ core, the Python stage and the
hand-off from it.

NOTE [ Loader plan ]
``stoker.Loader(dataset, **arguments)`` is two steps::

    plan(dataset, **arguments) -> LoaderPlan      every check (here and in the checks of
                                                  single arguments, _loader_args.py and
                                                  _transform_args.py); no thread, no
                                                  C++ producer
    build(plan)                -> Parts           _build.py: the producer, the core, the
                                                  stage

A plan says what a loader is, in five parts, and prints them (``print(loader.plan)``):

  source     records | tokens | mixture | token mixture | map-style   (+ the dataset)
  sampling   batch size, shuffle, the seed (reduced to 64 bits once), drop_last,
             even_batches, shard_window, explicit rank / world size
  producer   which C++ producer plans batch k, and its one RecordPlan (images, transform
             groups, pads, batch mixing) or token options
  stage      the Python stage, if any: map / batch_map / collate_fn, where samples come
             from, threads or processes
  delivery   host (pageable or pinned) or device, image layout
  settings   threads, prefetch, memory, warnings, errors
  service    where batches are made when not here (stoker/service/): None, or a pool

Every argument error a user can make is raised by ``plan``, before anything starts, so a
test checks "these arguments give this plan" without a thread. ``build`` assumes a
checked plan; the Loader keeps iteration, state and stats (stoker/loader.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch

from . import _cache, _core, _dropin
from . import _loader_args as args
from ._loader_args import check_int
from ._media_args import MediaPlan, split_media
from ._sources import records as _records_source
from ._sources.iterable import IterableSource
from ._transform_args import check_batch_transforms, check_transforms, group_targets
from .dataset import Dataset
from .fields import Image
from .mix import Mix, MixRun
from .ops import Op, _specs
from .service.checks import check_service
from .token_dataset import TokenDataset, _producer_args

__all__ = ["LoaderPlan", "plan", "DEFAULTS"]

# Loader's arguments and their defaults: plan() takes exactly these (Loader's signature
# says the same; tests/test_plan.py checks that they agree).
DEFAULTS: Dict[str, Any] = dict(
    batch_size=args.DEFAULT_BATCH_SIZE, shuffle=False, seed=None, drop_last=False,
    num_threads=None, prefetch=None,
    device="cpu", pin_memory=None, rank=None, world_size=None, transforms=None,
    on_error="raise", max_image_pixels=args.DEFAULT_MAX_PIXELS, prefetch_next_epoch=True,
    image_layout=None, even_batches=None, seq_len=None, packing=None, token_dtype="int64",
    max_tokens=None, max_memory=None, stall_warning=args.DEFAULT_STALL_WARNING,
    shard_window=None, labels="shifted", batch_transforms=None, pad_values=None, map=None,
    batch_map=None, collate_fn=None, map_fields=None, names=None, python_workers="auto",
    box_rows=None, as_stored=None, cache=None, cache_max_side=None, cache_size=None,
    verify="first", service=None,
    # DataLoader's, with its meanings (NOTE [ DataLoader's arguments ])
    sampler=None, batch_sampler=None, num_workers=None, worker_init_fn=None, generator=None,
    timeout=0, prefetch_factor=None, persistent_workers=False, pin_memory_device="",
    multiprocessing_context=None, in_order=True,
)

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
    cache: Optional[_cache.CachePlan] = None  # decoded images kept (stoker/_cache.py)
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

    source: str  # "records", "tokens", "mixture", "token mixture", "map-style", "iterable"
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
        return self.source in ("tokens", "token mixture")

    def __str__(self) -> str:
        s = self.sampling
        lines = [f"LoaderPlan: {self.source} ({_describe_dataset(self.dataset)})"]
        world = "torch.distributed's" if s.rank is None and s.world_size is None else \
            f"rank {s.rank}, world_size {s.world_size}"
        order = "shuffled" if s.shuffle else "in order"
        if s.shard_window:
            order += f", shard_window={s.shard_window}"
        user = s.batch_sampler if s.batch_sampler is not None else s.sampler
        if s.generator is not None:
            order = "shuffled, each epoch's permutation RandomSampler's from the generator"
        if self.source == "iterable" and not s.split_ranks:
            world = "none (each rank is given the dataset as it is)"
        if user is not None:
            what = "batch_sampler" if s.batch_sampler is not None else "sampler"
            order = f"{what} {type(user).__name__}'s order, listed per epoch"
            world = "the sampler's"
        size = "None (unbatched)" if s.unbatched else s.batch_size
        lines.append(f"  sampling: batch_size={size}, {order}, seed={s.seed}, "
                     f"drop_last={s.drop_last}, even_batches={s.even_batches}; ranks: {world}")
        lines.append(f"  producer: {self.producer}")
        if self.records is not None:
            lines += ["    " + x for x in _describe_records(self.records)]
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
                lines += ["    " + x for x in _describe_records(st.records)]
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
        if self.source == "iterable":  # the rows are read by Python workers
            threads, memory = "1 (the rows' numbers; the workers read them)", ""
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


def _describe_dataset(ds: Any) -> str:
    if isinstance(ds, (Dataset, TokenDataset, Mix)):
        return repr(ds)
    try:
        return f"{type(ds).__name__} of {len(ds)} samples"
    except TypeError:
        return type(ds).__name__


def _describe_records(r: RecordPlan) -> list:
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


# -- planning: every check ------------------------------------------------------------------

def is_map_style(obj: Any) -> bool:
    """Any object with ``__len__`` and ``__getitem__`` that is not a stoker dataset or a
    path: a ``torch.utils.data.Dataset``, a list, a HF ``datasets.Dataset``..."""
    if isinstance(obj, (Dataset, TokenDataset, Mix, str, bytes)) or hasattr(obj, "__fspath__"):
        return False
    return hasattr(obj, "__len__") and hasattr(obj, "__getitem__")


def _hook(name: str, fn: Any) -> Optional[Callable]:
    if fn is not None and not callable(fn):
        raise TypeError(f"{name} must be a function, got {type(fn).__name__}")
    return fn


def plan(dataset: Any, **arguments: Any) -> LoaderPlan:
    """The plan of ``stoker.Loader(dataset, **arguments)`` (NOTE [ Loader plan ]): raises
    the error a user should see for any argument that cannot work, starts nothing."""
    given = dict(arguments)
    token_options = args.token_options({k: v for k, v in arguments.items()
                                        if k not in DEFAULTS})
    a = {**DEFAULTS, **{k: v for k, v in arguments.items() if k in DEFAULTS}}
    map_fn = _hook("map", a["map"])
    batch_map = _hook("batch_map", a["batch_map"])
    collate_fn = _hook("collate_fn", a["collate_fn"])
    worker_init_fn = _hook("worker_init_fn", a["worker_init_fn"])
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    if iterable:
        IterableSource.check(a, dataset, given)
    map_style = not iterable and is_map_style(dataset)
    seq_len, packing, max_tokens = a["seq_len"], a["packing"], a["max_tokens"]
    tokens = isinstance(dataset, TokenDataset) or seq_len is not None or \
        max_tokens is not None or packing is not None or bool(token_options) or \
        (isinstance(dataset, Mix) and dataset.tokens)
    if iterable and tokens:
        raise ValueError("token batches (seq_len=, packing=, max_tokens=) read a stoker "
                         "TokenDataset; an IterableDataset yields its own samples")
    if not tokens and not map_style and not iterable and \
            not isinstance(dataset, (Dataset, Mix)):
        dataset = Dataset(dataset)
    if getattr(dataset, "closed", False):
        raise ValueError(f"{dataset.path}: the stoker.Dataset is closed")
    labels = a["labels"]
    if not tokens and labels != "shifted":
        raise ValueError("labels= applies to token batches (seq_len=, packing=, max_tokens=)")
    transforms, image_layout = a["transforms"], a["image_layout"]
    if tokens and (transforms or image_layout is not None or a["batch_transforms"] or
                   a["pad_values"]):
        raise ValueError("transforms, batch_transforms, pad_values and image_layout apply to "
                         "record datasets, not to token batches (seq_len=, packing=, "
                         "max_tokens=)")
    device = torch.device(a["device"])
    dl = args.dataloader_args(a, tokens=tokens, mix=isinstance(dataset, Mix))
    workers = args.check_stage_args(
        dataset, map_style=map_style or iterable, tokens=tokens, map_fn=map_fn,
        batch_map=batch_map,
        collate_fn=collate_fn, map_fields=a["map_fields"], names=a["names"],
        python_workers=a["python_workers"], transforms=transforms,
        image_layout=image_layout, device=device, context=dl["context"])
    # NOTE [ Worker processes for num_workers ] in stoker/_dropin.py
    workers = _dropin.worker_kind(workers, dl["num_workers"], map_style=map_style or iterable)
    records = not (tokens or map_style or iterable or isinstance(dataset, Mix))
    bulk = _dropin.bulk_sampler(dl["sampler"], a["batch_size"], dl["batch_sampler"], records)
    if bulk:  # its lists are batches, listed as a batch sampler's
        dl = {**dl, "batch_sampler": dl["sampler"], "sampler": None}

    batch_size = a["batch_size"]
    default_batch = type(batch_size) is args.DefaultBatchSize
    unbatched = batch_size is None and not tokens and dl["batch_sampler"] is None
    if tokens:  # None (or the default): one row, or a budget's rows without a cap
        batch_size = None if default_batch else batch_size
        if batch_size is None and max_tokens is None:
            batch_size = 1
        elif batch_size is not None:
            batch_size = check_int("batch_size", batch_size, 1)
    elif dl["batch_sampler"] is not None or unbatched:
        batch_size = None  # the batch sampler's batches; or each sample alone
    else:
        batch_size = check_int("batch_size", batch_size, 1, what="a positive int or None")
    drop_last = bool(a["drop_last"])
    even_batches = True if a["even_batches"] is None else bool(a["even_batches"])
    if unbatched and drop_last:
        raise ValueError("batch_size=None option disables auto-batching and is mutually "
                         "exclusive with drop_last (as DataLoader)")
    if drop_last and not even_batches:
        raise ValueError("even_batches=False does nothing with drop_last=True: drop_last "
                         "already gives every rank the same whole batches, repeating no "
                         "sample; pass one or the other")
    on_error = a["on_error"]
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    # a seed is 64 bits: negative seeds are taken modulo 2**64, larger ones refused rather
    # than silently aliased to a smaller one
    # NOTE [ Seeds as DataLoader draws them ] in stoker/_dropin.py
    seed, generator_order = _dropin.base_seed(
        a["seed"], a["generator"], tokens=tokens or isinstance(dataset, Mix),
        shuffled_order=bool(a["shuffle"]) and not iterable and dl["sampler"] is None and
        dl["batch_sampler"] is None)
    shard_window = a["shard_window"]
    if shard_window is not None:
        shard_window = check_int("shard_window", shard_window, 1, 2**63 - 1,
                                 "a positive int (shards per window) or None")
        if tokens:
            raise ValueError("shard_window applies to record datasets (stoker.Dataset); token "
                             "batches (seq_len=, packing=, max_tokens=) have their own orders")
        if not a["shuffle"]:
            raise ValueError("shard_window needs shuffle=True: it shuffles a window of shards "
                             "at a time (without shuffle the order is sequential, one shard "
                             "after the other)")
        if map_style:
            raise ValueError("shard_window shuffles the shards of a stoker.Dataset; a "
                             "map-style dataset has none (shuffle=True shuffles it whole)")
    _dropin.check_orders(dl, a, bulk, generator_order, shard_window, drop_last,
                         explicit_batch=not default_batch)
    num_threads, prefetch = a["num_threads"], a["prefetch"]
    per_sample = map_style or iterable or map_fn is not None or collate_fn is not None
    if num_threads is None and dl["num_workers"]:
        num_threads = dl["num_workers"]  # DataLoader's count, never tuned down
    if prefetch is None and dl["prefetch_factor"] is not None:
        prefetch = min(dl["prefetch_factor"] * max(1, dl["num_workers"] or 1), _core.MAX_PREFETCH)
    elif prefetch is None and per_sample and dl["num_workers"]:
        # DataLoader's default prefetch_factor (2): every worker has a batch to work on
        # while the loop takes another (a dataset may need all of them at once)
        prefetch = min(2 * dl["num_workers"], _core.MAX_PREFETCH)
    settings = args.check_settings(num_threads, prefetch, a["max_memory"], a["stall_warning"])
    verify = _cache.check_verify(a["verify"])
    if map_style and verify != "first":
        raise ValueError("verify= says when the records of a stoker.Dataset are checked; a "
                         "map-style dataset has no records of stoker's to verify")
    cache = _cache.check_cache(a["cache"], a["cache_max_side"], a["cache_size"])
    if cache is not None:
        settings = _cache.check_use(cache, dataset, settings, a["max_memory"], tokens=tokens,
                                    map_style=map_style or iterable)
    rank, world_size = args.check_ranks(a["rank"], a["world_size"])
    if image_layout not in (None, "HWC", "CHW"):
        raise ValueError(f"image_layout must be 'HWC', 'CHW' or None, got {image_layout!r}")
    max_pixels = check_int("max_image_pixels", a["max_image_pixels"], 1)
    args.check_device(device)
    service = check_service(a["service"], iterable=iterable, sampler=dl["sampler"],
                            batch_sampler=dl["batch_sampler"], device=device)
    sampling = Sampling(batch_size if not unbatched else 1, bool(a["shuffle"]), seed,
                        drop_last, even_batches, shard_window, rank, world_size,
                        dl["sampler"], dl["batch_sampler"], unbatched,
                        a["generator"] if generator_order else None, bulk,
                        _dropin.splits_ranks(given) if iterable else True)
    on_device = device.type == "cuda"
    prefetch_next = bool(a["prefetch_next_epoch"])
    if sampling.sampler is not None or sampling.batch_sampler is not None or generator_order \
            or iterable:  # the next epoch's order is the sampler's (or stream's), at iter()
        prefetch_next = False

    records: Optional[RecordPlan] = None
    token_kw: Optional[Dict[str, Any]] = None
    stage: Optional[StagePlan] = None
    nchw: Tuple[str, ...] = ()
    hooks = map_fn is not None or collate_fn is not None
    stage_kw = dict(num_workers=dl["num_workers"], worker_init_fn=worker_init_fn,
                    persistent_workers=bool(a["persistent_workers"]),
                    unbatched=unbatched)
    if tokens:
        token_kw = dict(seq_len=seq_len, packing=packing, token_dtype=a["token_dtype"],
                        max_tokens=max_tokens, labels=labels, even_batches=even_batches,
                        **token_options)
        if isinstance(dataset, Mix):
            source, producer = "token mixture", "MixTokenProducer"
            dataset = dataset.as_tokens(token_options.get("field"))
            MixRun.check(dataset, tokens=True, shard_window=None, shuffle=sampling.shuffle)
            for name in dataset.names:  # each source's token arguments, checked now
                _producer_args(dataset.datasets[name], batch_size=batch_size,
                               shuffle=sampling.shuffle, seed=0, drop_last=drop_last,
                               **token_kw)
        else:
            source, producer = "tokens", "TokenProducer"
            ds, kw = _producer_args(dataset, batch_size=batch_size, shuffle=sampling.shuffle,
                                    seed=sampling.seed64, drop_last=drop_last, **token_kw)
            dataset, token_kw = ds, kw
    elif iterable:  # NOTE [ Iterable datasets ] in stoker/_stage/iterable.py
        source, producer = "iterable", "IterableProducer (rows of iter(dataset) per worker)"
        _dropin.check_rank_split(dataset, sampling)
        # its workers: threads, or processes (NOTE [ Iterable datasets in processes ])
        stage = StagePlan("iterable", map_fn, batch_map, collate_fn, a["map_fields"], None,
                          "process" if workers == "process" else "thread", False, **stage_kw)
    elif map_style:
        source, producer = "map-style", "PythonProducer"
        stage = StagePlan("map-style", map_fn, batch_map, collate_fn, a["map_fields"],
                          None if a["names"] is None else tuple(a["names"]), workers,
                          on_device, **stage_kw)
    else:
        source = "mixture" if isinstance(dataset, Mix) else "records"
        remote = getattr(dataset, "remote", None)
        if remote is not None:  # a cache smaller than the dataset needs a shard order
            remote.check_window(shard_window, sampling.shuffle)
        media, transforms = split_media(dataset.fields, transforms, image_layout, max_pixels)
        checked = check_transforms(dataset.fields, transforms or {}, a["box_rows"],
                                   a["as_stored"])
        images, nchw = _images(dataset.fields, image_layout, max_pixels)
        mix = check_batch_transforms(dataset.fields, a["batch_transforms"])
        pads = tuple(args.check_pad_values(dataset.fields, a["pad_values"]).items())
        groups = _groups(dataset.fields, checked)
        if isinstance(dataset, Mix):
            if hooks:
                raise ValueError("map= and collate_fn= take samples of one stoker.Dataset, not "
                                 "of a stoker.Mix; batch_map= takes a mixture's batches (with "
                                 "their 'source')")
            MixRun.check(dataset, tokens=False, shard_window=shard_window,
                         shuffle=sampling.shuffle)
            producer = "MixRecordProducer"
            records = RecordPlan(images, groups, pads, mix, on_error == "skip",
                                 batch_map is not None, verify, media=media)
        elif hooks:
            # Samples are fetched by the stage's threads (the C++ decode, GIL released) as
            # map receives them: images in their decoded layout, alone (a one-channel
            # image decoded as RGB); a transform group's fields as ds.sample gives them.
            if mix or pads:
                raise ValueError("batch_transforms and pad_values do not work with map= or "
                                 "collate_fn= yet: use batch_map=, which sees the batches "
                                 "they make")
            producer = "PythonProducer"
            fetch = RecordPlan(images, tuple(GroupPlan((k,), tuple(ops))
                                             for k, ops in checked.items()
                                             if ops and not isinstance(k, tuple)) +
                               tuple(g for g in groups if len(g.fields) > 1),
                               verify=verify, cache=cache, media=media)
            stage = StagePlan("records", map_fn, batch_map, collate_fn, a["map_fields"],
                              None, workers, on_device, fetch, **stage_kw)
        else:
            # batch_map alone (or nothing): the C++ workers assemble the batch; with
            # batch_map it goes to the stage (on a device: batch_map runs after the copy,
            # at next()).
            producer = "RecordProducer"
            records = RecordPlan(images, groups, pads, mix, on_error == "skip",
                                 batch_map is not None, verify, cache, media)
        if batch_map is not None and stage is None:
            stage = StagePlan("batches", None, batch_map, None, a["map_fields"], None,
                              "thread", on_device, num_workers=dl["num_workers"])
    # NOTE [ No argument ignored ] in stoker/_dropin.py
    _dropin.check_honoured(given, stage=stage, iterable=iterable, context=dl["context"])
    if stage is not None and stage.num_workers is not None:
        args.check_worker_number(stage.num_workers)
    as_tuple = _records_source.as_tuple(dataset, collate_fn, map_fn) if source == "records" else ()
    delivery = DeliveryPlan(str(device), a["pin_memory"], image_layout, nchw,
                            tokens and labels == "unshifted" and packing is not None,
                            a["pin_memory_device"], as_tuple)
    return LoaderPlan(source, dataset, sampling, producer, records, token_kw, stage, delivery,
                      settings, on_error, prefetch_next, labels, dl["timeout"], service, given)


def _images(fields: Mapping[str, Any], image_layout: Optional[str],
            max_pixels: int) -> Tuple[Tuple[Tuple[str, str, int], ...], Tuple[str, ...]]:
    """Each image field's decoded layout: the one asked for, else the field's own; by
    default delivered as NCHW in shape, an HWC decode viewed with channels_last strides
    (no copy; NOTE in _iterator.LoaderIter.__next__)."""
    images, nchw = [], []
    for name, f in fields.items():
        if isinstance(f, Image):
            layout = image_layout or f.layout
            if image_layout is None and layout == "HWC":
                nchw.append(name)
            images.append((name, layout, max_pixels))
    return tuple(images), tuple(nchw)


def _groups(fields: Mapping[str, Any], transforms: Mapping[Any, list]) -> Tuple[GroupPlan, ...]:
    """Transform groups, checked (the C++ op list too). A one-channel image
    (``stoker.image(mode="L")``) is a mask wherever it is: one channel, nearest-neighbour,
    no colour ops; alone, a group of one."""
    out = []
    for key, ops in transforms.items():
        names = key if isinstance(key, tuple) else (key,)
        is_mask = any(getattr(fields[n], "mode", "") == "L" for n in names)
        if not ops and not is_mask:
            continue
        _specs(ops)  # the C++ op list's own checks (Normalize last, ...)
        out.append(GroupPlan(names, tuple(ops), tuple(group_targets(fields, names))))
    grouped = {n for k in transforms for n in (k if isinstance(k, tuple) else (k,))}
    out += [GroupPlan((n,), (), (("mask",),)) for n, f in fields.items()
            if isinstance(f, Image) and f.mode == "L" and n not in grouped]
    return tuple(out)

