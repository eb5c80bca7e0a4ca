"""Declare, then build: a Loader's arguments as a frozen :class:`LoaderPlan`
(stoker/_plan_parts.py); ``build`` (stoker/_build.py) wires the C++ core, the Python stage
and the hand-off from it.

NOTE [ Loader plan ]
``stoker.Loader(dataset, **arguments)`` is two steps::

    plan(dataset, **arguments) -> LoaderPlan      every check (here, in the plan's source,
                                                  and in the checks of single arguments,
                                                  _loader_args.py and _transform_args.py);
                                                  no thread, no C++ producer
    build(plan)                -> Parts           the plan's source builds its producer
                                                  and its running half; _build.py wires
                                                  the core, the stage, the delivery

A plan says what a loader is, in these parts, and prints them (``print(loader.plan)``):

  source     the kind of dataset, a class of stoker/_sources/ (NOTE [ Sources ]):
             RecordsSource, MapDatasetSource, IterableSource, TokensSource,
             MixtureSource, TokenMixtureSource (+ the dataset)
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
checked plan; the Loader keeps iteration, and asks the source's running half for its
per-epoch hook, state and stats (stoker/loader.py).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

from . import _cache, _core, _dropin
from . import _loader_args as args
from ._loader_args import check_int
from ._plan_parts import DeliveryPlan, GroupPlan, LoaderPlan, RecordPlan, Sampling, StagePlan
from ._sources import source_of
from ._sources.base import Planning
from .service.checks import check_service

__all__ = ["LoaderPlan", "plan", "DEFAULTS", "Sampling", "GroupPlan", "RecordPlan", "StagePlan",
           "DeliveryPlan"]

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

# -- planning: every check ------------------------------------------------------------------

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
    # the kind of dataset (stoker/_sources/): a path opens as a stoker.Dataset
    source, dataset = source_of(dataset, a, given, token_options)
    python = source.reads_python  # samples from a Python object, not stoker's records
    tokens = source.batches_are_tokens
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
    dl = args.dataloader_args(a, tokens=tokens, mix=source.own_order)
    workers = args.check_stage_args(
        dataset, map_style=python, tokens=tokens, map_fn=map_fn,
        batch_map=batch_map,
        collate_fn=collate_fn, map_fields=a["map_fields"], names=a["names"],
        python_workers=a["python_workers"], transforms=transforms,
        image_layout=image_layout, device=device, context=dl["context"])
    # NOTE [ Worker processes for num_workers ] in stoker/_dropin.py
    workers = _dropin.worker_kind(workers, dl["num_workers"], map_style=python)
    bulk = _dropin.bulk_sampler(dl["sampler"], a["batch_size"], dl["batch_sampler"],
                                source.sampler_indices_only)
    if bulk:  # its lists are batches, listed as a batch sampler's
        dl = {**dl, "batch_sampler": dl["sampler"], "sampler": None}

    batch_size = a["batch_size"]
    default_batch = type(batch_size) is args.DefaultBatchSize
    unbatched = batch_size is None and not tokens and dl["batch_sampler"] is None
    if tokens:  # None (or the default): one row, or a budget's rows without a cap
        batch_size = None if default_batch else batch_size
        if batch_size is None and a["max_tokens"] is None:
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
        a["seed"], a["generator"], tokens=source.own_order,
        shuffled_order=bool(a["shuffle"]) and source.indexed and dl["sampler"] is None and
        dl["batch_sampler"] is None)
    shard_window = a["shard_window"]
    if shard_window is not None:
        shard_window = check_int("shard_window", shard_window, 1, 2**63 - 1,
                                 "a positive int (shards per window) or None")
        source.check_shard_window(shard_window, bool(a["shuffle"]))
    _dropin.check_orders(dl, a, bulk, generator_order, shard_window, drop_last,
                         explicit_batch=not default_batch)
    num_threads, prefetch = a["num_threads"], a["prefetch"]
    per_sample = python or map_fn is not None or collate_fn is not None
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
    source.check_verify(verify)
    cache = _cache.check_cache(a["cache"], a["cache_max_side"], a["cache_size"])
    if cache is not None:
        settings = _cache.check_use(cache, dataset, settings, a["max_memory"], tokens=tokens,
                                    map_style=python)
    rank, world_size = args.check_ranks(a["rank"], a["world_size"])
    if image_layout not in (None, "HWC", "CHW"):
        raise ValueError(f"image_layout must be 'HWC', 'CHW' or None, got {image_layout!r}")
    max_pixels = check_int("max_image_pixels", a["max_image_pixels"], 1)
    args.check_device(device)
    service = check_service(a["service"], iterable=not source.indexed, sampler=dl["sampler"],
                            batch_sampler=dl["batch_sampler"], device=device)
    sampling = Sampling(batch_size if not unbatched else 1, bool(a["shuffle"]), seed,
                        drop_last, even_batches, shard_window, rank, world_size,
                        dl["sampler"], dl["batch_sampler"], unbatched,
                        a["generator"] if generator_order else None, bulk,
                        source.splits_ranks(given))
    prefetch_next = bool(a["prefetch_next_epoch"])
    if sampling.sampler is not None or sampling.batch_sampler is not None or generator_order \
            or not source.order_known_ahead:  # the sampler's (or stream's), at iter()
        prefetch_next = False

    stage_kw = dict(num_workers=dl["num_workers"], worker_init_fn=worker_init_fn,
                    persistent_workers=bool(a["persistent_workers"]),
                    unbatched=unbatched)
    part = source.plan(Planning(a, dataset, sampling, map_fn, batch_map, collate_fn, workers,
                                dl["num_workers"], stage_kw, device.type == "cuda", on_error,
                                verify, cache, max_pixels, token_options))
    stage = part.stage
    # NOTE [ No argument ignored ] in stoker/_dropin.py
    _dropin.check_honoured(given, stage=stage, iterable=not source.indexed,
                           context=dl["context"])
    if stage is not None and stage.num_workers is not None:
        args.check_worker_number(stage.num_workers)
    delivery = DeliveryPlan(str(device), a["pin_memory"], image_layout, part.nchw,
                            tokens and labels == "unshifted" and a["packing"] is not None,
                            a["pin_memory_device"], part.as_tuple)
    return LoaderPlan(source, part.dataset, sampling, part.producer, part.records,
                      part.tokens, stage, delivery, settings, on_error, prefetch_next, labels,
                      dl["timeout"], service, given)
