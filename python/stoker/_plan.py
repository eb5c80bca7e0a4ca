"""Declare, then build: a Loader's arguments as a frozen :class:`LoaderPlan`, and
:func:`build`, the one place that wires the C++ core, the Python stage and the hand-off.

NOTE [ Loader plan ]
``stoker.Loader(dataset, **arguments)`` is two steps::

    plan(dataset, **arguments) -> LoaderPlan      every check; no thread, no C++ producer
    build(plan)                -> Parts           the producer, the core, the stage

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

Every argument error a user can make is raised by ``plan``, before anything starts, so a
test checks "these arguments give this plan" without a thread. ``build`` assumes a
checked plan; the Loader keeps iteration, state and stats (stoker/loader.py).
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple

import torch

from . import _cache, _core
from . import _loader_args as args
from ._loader_args import check_int
from .dataset import Dataset
from .fields import Image
from .mix import Mix, MixRun
from .ops import Op, _specs
from .token_dataset import TokenDataset, _producer_args

__all__ = ["LoaderPlan", "plan", "build", "DEFAULTS"]

# Loader's arguments and their defaults: plan() takes exactly these (Loader's signature
# says the same; tests/test_plan.py checks that they agree).
DEFAULTS: Dict[str, Any] = dict(
    batch_size=None, shuffle=False, seed=0, drop_last=False, num_threads=None, prefetch=None,
    device="cpu", pin_memory=None, rank=None, world_size=None, transforms=None,
    on_error="raise", max_image_pixels=args.DEFAULT_MAX_PIXELS, prefetch_next_epoch=True,
    image_layout=None, even_batches=True, seq_len=None, packing=None, token_dtype="int64",
    max_tokens=None, max_memory=None, stall_warning=args.DEFAULT_STALL_WARNING,
    shard_window=None, labels="shifted", batch_transforms=None, pad_values=None, map=None,
    batch_map=None, collate_fn=None, map_fields=None, names=None, python_workers="thread",
    cache=None, cache_max_side=None, cache_size=None, verify="first",
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

    @property
    def seed64(self) -> int:
        return self.seed & _MASK

    def state_keys(self) -> Dict[str, Any]:
        """What a resume state is valid for (stoker/_loader_state.py)."""
        return {"seed": self.seed, "shuffle": self.shuffle, "shard_window": self.shard_window,
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
    batch_mix: Any = None  # _loader_args.BatchMixPlan
    skip_errors: bool = False
    handoff: bool = False  # the batch goes to the Python stage (batch_map) when assembled
    verify: str = "first"  # a record's checksum: on its first read in the process, or "always"
    cache: Optional[_cache.CachePlan] = None  # decoded images kept (stoker/_cache.py)


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """The Python stage (NOTE [ Python stage ] in stoker/_stage/__init__.py)."""

    fetch: str  # "records": C++ fetch per sample; "map-style": obj[i]; "batches": C++-assembled
    map: Optional[Callable] = None
    batch_map: Optional[Callable] = None
    collate_fn: Optional[Callable] = None
    map_fields: Optional[Mapping[Any, Any]] = None
    names: Optional[Tuple[Any, ...]] = None
    workers: str = "thread"  # or "process"
    batch_map_on_consumer: bool = False  # device batches: batch_map after the copy
    records: Optional[RecordPlan] = None  # fetch="records": what the C++ fetch does

    @property
    def processes(self) -> bool:
        return self.workers == "process"


@dataclasses.dataclass(frozen=True)
class DeliveryPlan:
    device: str  # "cpu", "cuda", "cuda:N"
    pin_memory: Optional[bool]  # None: True for a CUDA device
    image_layout: Optional[str]
    nchw_views: Tuple[str, ...] = ()  # HWC images delivered as NCHW views
    hf_lengths: bool = False  # labels="unshifted" + packing: max_length_q/_k as ints


@dataclasses.dataclass(frozen=True)
class LoaderPlan:
    """What a loader is, checked and printable (NOTE [ Loader plan ])."""

    source: str  # "records", "tokens", "mixture", "token mixture", "map-style"
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
    # as given (pickling rebuilds the loader from them); not part of what the plan is
    arguments: Mapping[str, Any] = dataclasses.field(compare=False, repr=False)

    @property
    def is_tokens(self) -> bool:
        return self.source in ("tokens", "token mixture")

    def __str__(self) -> str:
        s = self.sampling
        lines = [f"LoaderPlan: {self.source} ({_describe_dataset(self.dataset)})"]
        order = "shuffled" if s.shuffle else "in order"
        if s.shard_window:
            order += f", shard_window={s.shard_window}"
        world = "torch.distributed's" if s.rank is None and s.world_size is None else \
            f"rank {s.rank}, world_size {s.world_size}"
        lines.append(f"  sampling: batch_size={s.batch_size}, {order}, seed={s.seed}, "
                     f"drop_last={s.drop_last}, even_batches={s.even_batches}; ranks: {world}")
        lines.append(f"  producer: {self.producer}")
        if self.records is not None:
            lines += ["    " + x for x in _describe_records(self.records)]
        if self.tokens is not None:
            keys = ("mode", "seq_len", "max_tokens", "token_dtype", "labels")
            lines.append("    " + ", ".join(f"{k}={self.tokens[k]!r}" for k in keys
                                            if k in self.tokens))
        if self.stage is None:
            lines.append("  stage: none (no Python per batch)")
        else:
            st = self.stage
            hooks = [f"{k}={_name(getattr(st, k))}" for k in ("map", "batch_map", "collate_fn")
                     if getattr(st, k) is not None]
            where = {"records": "samples fetched by C++ (read, decode, ops)",
                     "map-style": "dataset[i]",
                     "batches": "batches assembled by C++"}[st.fetch]
            lines.append(f"  stage: {', '.join(hooks) or 'native batching'}; {where}; "
                         f"{st.workers} workers" +
                         ("; batch_map after the device copy" if st.batch_map_on_consumer
                          else ""))
            if st.records is not None:
                lines += ["    " + x for x in _describe_records(st.records)]
        d = self.delivery
        memory = "pinned" if d.pin_memory else "pageable" if d.pin_memory is not None else \
            ("pinned" if d.device.startswith("cuda") else "pageable")
        layout = d.image_layout or ("NCHW views of HWC decodes" if d.nchw_views else
                                    "as stored")
        lines.append(f"  delivery: {d.device} ({memory} host memory); images {layout}")
        t = self.settings
        threads = f"auto (up to {t.num_threads})" if t.auto_threads else str(t.num_threads)
        window = f"auto (up to {t.prefetch})" if t.auto_prefetch else str(t.prefetch)
        lines.append(f"  settings: threads {threads}, prefetch {window}, max_memory "
                     f"{t.max_memory}, on_error={self.on_error!r}, "
                     f"prefetch_next_epoch={self.prefetch_next_epoch}")
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
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise TypeError("stoker.Loader needs a map-style dataset (__len__ and __getitem__): "
                        "it samples, shards across ranks and resumes by index; an "
                        "IterableDataset has no index")
    map_style = is_map_style(dataset)
    seq_len, packing, max_tokens = a["seq_len"], a["packing"], a["max_tokens"]
    tokens = isinstance(dataset, TokenDataset) or seq_len is not None or \
        max_tokens is not None or packing is not None or bool(token_options) or \
        (isinstance(dataset, Mix) and dataset.tokens)
    if not tokens and not map_style and not isinstance(dataset, (Dataset, Mix)):
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
    workers = _check_stage_args(
        dataset, map_style=map_style, tokens=tokens, map_fn=map_fn, batch_map=batch_map,
        collate_fn=collate_fn, map_fields=a["map_fields"], names=a["names"],
        python_workers=a["python_workers"], transforms=transforms,
        image_layout=image_layout, device=device)

    batch_size = a["batch_size"]
    if tokens and batch_size is None and max_tokens is None:
        batch_size = 1
    if not tokens:
        batch_size = check_int("batch_size", 1 if batch_size is None else batch_size, 1)
    elif batch_size is not None:
        batch_size = check_int("batch_size", batch_size, 1)
    drop_last, even_batches = bool(a["drop_last"]), bool(a["even_batches"])
    if drop_last and not even_batches:
        raise ValueError("even_batches=False does nothing with drop_last=True: drop_last "
                         "already gives every rank the same whole batches, repeating no "
                         "sample; pass one or the other")
    on_error = a["on_error"]
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    # a seed is 64 bits: negative seeds are taken modulo 2**64, larger ones refused rather
    # than silently aliased to a smaller one
    seed = check_int("seed", a["seed"], -2**63, 2**64 - 1)
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
    settings = args.check_settings(a["num_threads"], a["prefetch"], a["max_memory"],
                                   a["stall_warning"])
    verify = _cache.check_verify(a["verify"])
    if map_style and verify != "first":
        raise ValueError("verify= says when the records of a stoker.Dataset are checked; a "
                         "map-style dataset has no records of stoker's to verify")
    cache = _cache.check_cache(a["cache"], a["cache_max_side"], a["cache_size"])
    if cache is not None:
        settings = _check_cache_use(cache, dataset, settings, a["max_memory"], tokens=tokens,
                                    map_style=map_style)
    rank, world_size = args.check_ranks(a["rank"], a["world_size"])
    if image_layout not in (None, "HWC", "CHW"):
        raise ValueError(f"image_layout must be 'HWC', 'CHW' or None, got {image_layout!r}")
    max_pixels = check_int("max_image_pixels", a["max_image_pixels"], 1)
    args.check_device(device)
    sampling = Sampling(batch_size, bool(a["shuffle"]), seed, drop_last, even_batches,
                        shard_window, rank, world_size)
    on_device = device.type == "cuda"

    records: Optional[RecordPlan] = None
    token_kw: Optional[Dict[str, Any]] = None
    stage: Optional[StagePlan] = None
    nchw: Tuple[str, ...] = ()
    hooks = map_fn is not None or collate_fn is not None
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
    elif map_style:
        source, producer = "map-style", "PythonProducer"
        stage = StagePlan("map-style", map_fn, batch_map, collate_fn, a["map_fields"],
                          None if a["names"] is None else tuple(a["names"]), workers,
                          on_device)
    else:
        source = "mixture" if isinstance(dataset, Mix) else "records"
        remote = getattr(dataset, "remote", None)
        if remote is not None:  # a cache smaller than the dataset needs a shard order
            remote.check_window(shard_window, sampling.shuffle)
        checked = args.check_transforms(dataset.fields, transforms or {})
        images, nchw = _images(dataset.fields, image_layout, max_pixels)
        mix = args.check_batch_transforms(dataset.fields, a["batch_transforms"])
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
                                 batch_map is not None, verify)
        elif hooks:
            # Samples are fetched by the stage's threads (the C++ decode, GIL released) as
            # map receives them: images in their decoded layout, alone (a one-channel
            # image decoded as RGB).
            if any(len(k) > 1 for k in (g.fields for g in groups if g.ops)) or mix or pads \
                    or any(isinstance(k, tuple) for k in checked):
                raise ValueError("transform groups (tuple keys of transforms), "
                                 "batch_transforms and pad_values do not work with map= or "
                                 "collate_fn= yet: use batch_map=, which sees the batches "
                                 "they make")
            producer = "PythonProducer"
            fetch = RecordPlan(images, tuple(GroupPlan((k,), tuple(ops))
                                             for k, ops in checked.items() if ops),
                               verify=verify, cache=cache)
            stage = StagePlan("records", map_fn, batch_map, collate_fn, a["map_fields"],
                              None, workers, on_device, fetch)
        else:
            # batch_map alone (or nothing): the C++ workers assemble the batch; with
            # batch_map it goes to the stage (on a device: batch_map runs after the copy,
            # at next()).
            producer = "RecordProducer"
            records = RecordPlan(images, groups, pads, mix, on_error == "skip",
                                 batch_map is not None, verify, cache)
        if batch_map is not None and stage is None:
            stage = StagePlan("batches", None, batch_map, None, a["map_fields"], None,
                              workers, on_device)
    delivery = DeliveryPlan(str(device), a["pin_memory"], image_layout, nchw,
                            tokens and labels == "unshifted" and packing is not None)
    return LoaderPlan(source, dataset, sampling, producer, records, token_kw, stage, delivery,
                      settings, on_error, bool(a["prefetch_next_epoch"]), labels, given)


def _images(fields: Mapping[str, Any], image_layout: Optional[str],
            max_pixels: int) -> Tuple[Tuple[Tuple[str, str, int], ...], Tuple[str, ...]]:
    """Each image field's decoded layout: the one asked for, else the field's own; by
    default delivered as NCHW in shape, an HWC decode viewed with channels_last strides
    (no copy; NOTE in loader._LoaderIter.__next__)."""
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
        out.append(GroupPlan(names, tuple(ops), tuple(args.group_targets(fields, names))))
    grouped = {n for k in transforms for n in (k if isinstance(k, tuple) else (k,))}
    out += [GroupPlan((n,), (), (("mask",),)) for n, f in fields.items()
            if isinstance(f, Image) and f.mode == "L" and n not in grouped]
    return tuple(out)


def _check_cache_use(cache: _cache.CachePlan, dataset: Any, settings: args.Settings,
                     max_memory: Any, *, tokens: bool, map_style: bool) -> args.Settings:
    """Where cache="decoded" applies (the RGB images of one stoker.Dataset), and its place in
    max_memory: given, max_memory covers this rank's share of the cache (cache_size over the
    processes of the job on this machine, which share it) besides the batches in flight."""
    if tokens or map_style or isinstance(dataset, Mix):
        what = "token batches" if tokens else "a map-style dataset" if map_style else \
            "a stoker.Mix (give each source its own loader to cache it)"
        raise ValueError(f"cache='decoded' keeps the decoded images of a stoker.Dataset; it "
                         f"does not apply to {what}")
    if not any(isinstance(f, Image) and f.mode == "RGB" for f in dataset.fields.values()):
        raise ValueError("cache='decoded' keeps decoded RGB images, and this dataset has no "
                         "stoker.image() field of mode 'RGB'")
    slots = len(dataset) * _cache.image_fields(dataset.fields)
    index = _core.DecodedCache.index_bytes(slots, cache.variants)
    if cache.budget <= index:
        raise ValueError(f"cache_size={cache.budget} bytes cannot hold the cache's index alone "
                         f"({index} bytes for {slots} images): give at least "
                         f"{index + 2**20} bytes")
    if max_memory is None:
        return settings
    share = cache.budget // args.local_world_size()
    if share >= settings.max_memory:
        raise ValueError(f"max_memory={settings.max_memory} bytes leaves nothing for batches "
                         f"after this rank's share of the decoded cache ({share} bytes of "
                         f"cache_size={cache.budget}, shared by {args.local_world_size()} "
                         "process(es) on this machine): raise max_memory or lower cache_size")
    return settings._replace(max_memory=settings.max_memory - share)


def _check_stage_args(dataset: Any, *, map_style: bool, tokens: bool, map_fn: Any,
                      batch_map: Any, collate_fn: Any, map_fields: Any, names: Any,
                      python_workers: str, transforms: Any, image_layout: Any,
                      device: Any) -> str:
    """The Loader's arguments of the Python stage, checked together; "thread" or
    "process"."""
    hooks = [n for n, v in (("map", map_fn), ("batch_map", batch_map),
                            ("collate_fn", collate_fn), ("map_fields", map_fields),
                            ("names", names)) if v is not None]
    if tokens and (hooks or map_style):
        raise ValueError(f"{', '.join(hooks) or 'a map-style dataset'}: not for token batches "
                         "(seq_len=, packing=, max_tokens=)")
    if map_style and (transforms or image_layout is not None):
        raise ValueError("transforms and image_layout apply to the image fields of a "
                         "stoker.Dataset; with a map-style dataset, transform in its "
                         "__getitem__ or in map=")
    if names is not None and not map_style:
        raise ValueError("names= names the values of a map-style dataset's tuple items; a "
                         "stoker.Dataset's samples are dicts of its fields")
    if map_fields is not None and map_fn is None and not map_style:
        raise ValueError("map_fields= declares what map= returns: pass map= too")
    if python_workers not in ("thread", "process"):
        raise ValueError(f"python_workers must be 'thread' or 'process', got {python_workers!r}")
    processes = python_workers == "process"
    if processes and not (map_style or map_fn is not None or collate_fn is not None):
        raise ValueError("python_workers='process' runs map= and a map-style dataset's "
                         "__getitem__ in worker processes: pass one of them")
    if processes and not map_style and getattr(dataset, "remote", None) is not None:
        raise ValueError("python_workers='process' reads a local stoker dataset in each "
                         "worker; a dataset at a URL arrives through this process: use "
                         "python_workers='thread'")
    if collate_fn is not None and device.type == "cuda":
        raise ValueError("collate_fn returns Python objects that stoker cannot copy to the "
                         "device: with device='cuda' use batch_map= (it receives the native "
                         "batch on the GPU), or device='cpu' and move the batch yourself")
    return python_workers


def check_picklable(arguments: Mapping[str, Any]) -> None:
    """A loader pickles its hooks by reference, as DataLoader's workers get them under
    spawn; a lambda or a nested function cannot be: say which, and what to do."""
    for name in ("map", "batch_map", "collate_fn"):
        fn = arguments.get(name)
        if fn is None:
            continue
        try:
            pickle.dumps(fn)
        except Exception as e:
            raise TypeError(
                f"this stoker.Loader cannot be pickled: its {name}={fn!r} cannot be ({e}). "
                "Functions are pickled by reference, as DataLoader's under spawn: define it at "
                "the top level of a module (not a lambda or a nested function), or pass a "
                "picklable callable object") from e


# -- building: the one place that wires the parts ---------------------------------------------

class Parts(NamedTuple):
    """What build() made: the Loader keeps them."""

    producer: Any  # a _core.BatchProducer
    core: Any  # _core.LoaderCore
    stage: Any  # _stage.stage.PythonStage or None
    mix: Optional[MixRun]
    device: torch.device  # where batches are (cpu for the host fake)
    stream_device: Optional[torch.device]  # the CUDA device whose stream a batch joins
    pin_memory: bool
    cache: Any = None  # _core.DecodedCache (cache="decoded")


def chunk_samples(batch_size: int, threads: int, processes: bool = False) -> int:
    """Samples per chunk of the Python stage: about four chunks per thread in a batch, so
    that the first batch is ready after about 1/T of its work, while a claim (one C++
    call) stays rare. With process workers, as many chunks in a batch as workers: a chunk
    costs a round trip to its worker (two messages, two thread switches), which a handful
    of samples does not amortise, and the second stage thread of each worker keeps it
    busy meanwhile."""
    per = 1 if processes else 4
    return max(1, -(-int(batch_size) // (per * max(1, int(threads)))))


def record_options(r: RecordPlan, sampling: Sampling, threads_hint: int = 0,
                   cache: Any = None) -> Any:
    """A RecordPlan as the ``_core.RecordOptions`` its producer takes (`cache`: the
    ``_core.DecodedCache`` build() opened for ``r.cache``)."""
    return _core.RecordOptions(
        sampler=sampler_options(sampling),
        skip_errors=r.skip_errors,
        images={name: _core.ImageFieldSpec(layout, pixels) for name, layout, pixels in r.images},
        transforms=[_core.TransformSpec(list(g.fields), _specs(list(g.ops)),
                                        [_core.TargetSpec(*t) for t in g.targets])
                    for g in r.groups],
        threads_hint=threads_hint, handoff=r.handoff, pad_values=dict(r.pad_values),
        mix=None if r.batch_mix is None else r.batch_mix.options(), verify=r.verify,
        cache=cache)


def sampler_options(s: Sampling) -> Any:
    return _core.SamplerOptions(batch_size=s.batch_size or 1, shuffle=s.shuffle,
                                seed=s.seed64, drop_last=s.drop_last,
                                even_batches=s.even_batches, shard_window=s.shard_window or 0)


def build(p: LoaderPlan, world_size: int,
          open_device: Optional[Callable[[int], Any]] = None) -> Parts:
    """The running parts of plan `p` (NOTE [ Loader plan ]). `world_size` is the world
    now (a mixture's rows per step until the first iter() says otherwise); `open_device`
    stands in for the CUDA driver (tests: the host fake)."""
    from ._stage.sources import DatasetSource, MapStyleSource
    from ._stage.stage import PythonStage

    s, t = p.sampling, p.settings
    mix: Optional[MixRun] = None
    stage = None
    wanted = p.records.cache if p.records is not None else \
        p.stage.records.cache if p.stage is not None and p.stage.records is not None else None
    cache = None if wanted is None else _cache.open_cache(wanted, p.dataset)
    if p.source == "token mixture":
        mix = MixRun(p.dataset, tokens=True, record_options=None, batch_size=s.batch_size,
                     shuffle=s.shuffle, seed=s.seed, drop_last=s.drop_last,
                     shard_window=None, world_size=world_size, token_options=dict(
                         {k: v for k, v in (p.tokens or {}).items()}))
        producer = mix.producer
    elif p.source == "tokens":
        producer = _core.TokenProducer(p.dataset._source, **(p.tokens or {}))
    elif p.source == "mixture":
        assert p.records is not None
        mix = MixRun(p.dataset, tokens=False,
                     record_options=record_options(p.records, s, t.num_threads),
                     batch_size=s.batch_size, shuffle=s.shuffle, seed=s.seed,
                     drop_last=s.drop_last, shard_window=s.shard_window,
                     world_size=world_size, token_options={})
        producer = mix.producer
    elif p.source == "map-style":
        producer = _core.PythonProducer(len(p.dataset), s.batch_size, s.shuffle, s.seed64,
                                        s.drop_last, s.even_batches)
    elif p.producer == "PythonProducer":  # records through map / collate_fn
        producer = _core.PythonProducer(p.dataset._core, s.batch_size, s.shuffle, s.seed64,
                                        s.drop_last, s.even_batches, s.shard_window or 0)
    else:
        assert p.records is not None
        producer = _core.RecordProducer(p.dataset._core,
                                        record_options(p.records, s, t.num_threads, cache))
    if p.stage is not None:
        st = p.stage
        if st.fetch == "map-style":
            source: Any = MapStyleSource(p.dataset, st.names)
        elif st.fetch == "records":
            assert st.records is not None
            source = DatasetSource(p.dataset, record_options(st.records, s, cache=cache))
        else:
            source = None
        stage = PythonStage(source, map_fn=st.map, batch_map=st.batch_map,
                            collate_fn=st.collate_fn, map_fields=st.map_fields, seed=s.seed,
                            skip=p.on_error == "skip", threads=t.num_threads,
                            batch_map_on_consumer=st.batch_map_on_consumer,
                            processes=st.processes, nchw_views=p.delivery.nchw_views)

    options = _core.LoaderOptions()
    options.num_threads = t.num_threads
    options.prefetch = t.prefetch
    options.auto_threads = t.auto_threads
    options.auto_prefetch = t.auto_prefetch
    options.max_memory = t.max_memory
    options.stall_warning = t.stall_warning
    options.slow_first_batch_ms = int(args.SLOW_FIRST_BATCH_SECONDS * 1000)
    options.prefetch_next_epoch = p.prefetch_next_epoch
    target, pin, api = args.resolve_device(torch.device(p.delivery.device),
                                           p.delivery.pin_memory, open_device)
    if pin and api is not None:
        options.host_memory = _core.pinned_memory(api)
    if target.type == "cuda":
        ahead = args.AUTO_DEVICE_PREFETCH if t.auto_prefetch else t.prefetch
        options.delivery = _core.device_delivery(api, ahead)
    handoff = None
    if stage is not None and stage.needs_handoff:
        handoff = _core.PythonHandoff(
            chunk_samples(s.batch_size or 1, t.num_threads, stage.processes),
            s.batch_size or 1)
        options.finisher = handoff
    fake = api is not None and api.fake  # the host fake's "device" memory is host memory
    core = _core.LoaderCore(producer, options)
    stream_device = target if target.type == "cuda" and not fake else None
    if handoff is not None:
        handoff.bind(core)
        stage.attach(handoff)
        stage.side_device = stream_device
    return Parts(producer, core, stage, mix, torch.device("cpu") if fake else target,
                 stream_device, pin, cache)

