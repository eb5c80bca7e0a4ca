"""The source of a stoker.Dataset's records: its checks and its part of the plan (the
RecordProducer with its one RecordOptions; or, with map= or collate_fn=, samples fetched
by C++ for the Python stage), its wiring, and its running half (a remote dataset's
downloads follow the loader's order; its identity; its network counters and read tier).
The record planning (record_plan.py, and record_parts here) is a mixture's too
(mixture.py)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from .. import _build, _core
from .. import _loader_args as args
from .._media_args import split_media
from .._plan_parts import RecordPlan, StagePlan
from .._transform_args import check_batch_transforms, check_transforms
from .base import Planned, Planning, Running, Source, dataset_identity
from .record_plan import fetch_plan, image_layouts, record_options, transform_groups

__all__ = ["RecordsSource", "RecordsRunning", "as_tuple", "record_parts", "batches_stage",
           "tier"]


class RecordsSource(Source):
    """A stoker.Dataset (or a path to one)."""

    kind = "records"
    sampler_indices_only = True

    def epoch_shards(self, dataset: Any) -> Any:
        return [s["num_records"] for s in dataset.shards]

    def plan(self, ctx: Planning) -> Planned:
        a, dataset = ctx.a, ctx.dataset
        media, checked, images, nchw, mix, pads, groups = record_parts(ctx)
        stage: Optional[StagePlan] = None
        records: Optional[RecordPlan] = None
        if ctx.map is not None or ctx.collate_fn is not None:
            # Samples are fetched by the stage's threads (the C++ decode, GIL released) as
            # map receives them: images in their decoded layout, alone (a one-channel
            # image decoded as RGB); a transform group's fields as ds.sample gives them.
            if mix or pads:
                raise ValueError("batch_transforms and pad_values do not work with map= or "
                                 "collate_fn= yet: use batch_map=, which sees the batches "
                                 "they make")
            producer = "PythonProducer"
            fetch = fetch_plan(images, checked, groups, ctx.verify, ctx.cache, media)
            stage = StagePlan("records", ctx.map, ctx.batch_map, ctx.collate_fn,
                              a["map_fields"], None, ctx.workers, ctx.on_device, fetch,
                              **ctx.stage_kw)
        else:
            # batch_map alone (or nothing): the C++ workers assemble the batch; with
            # batch_map it goes to the stage (on a device: batch_map runs after the copy,
            # at next()).
            producer = "RecordProducer"
            records = RecordPlan(images, groups, pads, mix, ctx.on_error == "skip",
                                 ctx.batch_map is not None, ctx.verify, ctx.cache, media)
            stage = batches_stage(ctx)
        return Planned(dataset, producer, records, None, stage, nchw,
                       as_tuple(dataset, ctx.collate_fn, ctx.map))

    def build(self, p: Any, world_size: int, open_device: Any) -> Any:
        from .._stage.sources import DatasetSource

        s, t = p.sampling, p.settings
        listed = _build.listed_orders(s)
        cache = _build.open_cache(p)
        if p.stage is not None and p.stage.records is not None:  # records through map=
            producer = _core.PythonProducer(p.dataset._core, s.batch_size or 1, s.shuffle,
                                            s.seed64, s.drop_last, s.even_batches,
                                            s.shard_window or 0, listed=listed)
        else:
            assert p.records is not None
            producer = _core.RecordProducer(
                p.dataset._core,
                record_options(p.records, s, t.num_threads, listed, cache))
        reader = None
        if p.service is None and p.stage is not None and p.stage.records is not None:
            reader = DatasetSource(p.dataset, record_options(p.stage.records, s,
                                                                    cache=cache))
        return _build.wire(p, producer, reader, RecordsRunning(p.dataset, producer),
                           listed=listed, cache=cache, open_device=open_device)


class RecordsRunning(Running):
    """A stoker.Dataset as a loader reads it."""

    def at_epoch(self, loader: Any, world: int) -> None:
        """Downloads go ahead of the loader's own order (NOTE [ Fetch plan ] in
        csrc/sampler/fetch_plan.h); a dataset opened before a fork starts this process's
        fetcher here. A service's actors fetch for themselves."""
        remote = getattr(self.dataset, "remote", None)
        if loader.plan.service is None and remote is not None and self.dataset._core.deferred:
            loader._following = remote.follow(loader._core, self.producer, world,
                                              loader.shard_window)

    def identity(self) -> Dict[str, Any]:
        return dataset_identity(self.dataset, False, self.producer.epoch_samples())

    def stats(self, s: Dict[str, Any], counts: Any, state: Tuple[int, int, int]) -> None:
        remote = getattr(self.dataset, "remote", None)
        if remote is not None:  # a URL
            s["network"] = remote.stats()

    def tier(self) -> Optional[str]:
        return tier(self.dataset, tokens=False)


def tier(dataset: Any, tokens: bool) -> str:
    """Where a stoker dataset's reads were served from: memory, mmap or remote."""
    t = getattr(dataset, "tier", None)
    if t is None and tokens:
        t = getattr(getattr(dataset, "dataset", None), "tier", "mmap")
    return t or "mmap"


def batches_stage(ctx: Planning) -> Optional[StagePlan]:
    """batch_map= over batches the C++ workers assemble (a stoker.Dataset's, a mixture's)."""
    if ctx.batch_map is None:
        return None
    return StagePlan("batches", None, ctx.batch_map, None, ctx.a["map_fields"], None,
                     "thread", ctx.on_device, num_workers=ctx.num_workers)


def record_parts(ctx: Planning) -> Tuple[Any, ...]:
    """(media, transforms, images, nchw views, batch transforms, pads, groups): the record
    options of ``ctx.dataset`` (a stoker.Dataset or a mixture of them), checked."""
    a, dataset = ctx.a, ctx.dataset
    remote = getattr(dataset, "remote", None)
    if remote is not None:  # a cache smaller than the dataset needs a shard order
        remote.check_window(ctx.sampling.shard_window, ctx.sampling.shuffle)
    image_layout = a["image_layout"]
    media, transforms = split_media(dataset.fields, a["transforms"], image_layout,
                                    ctx.max_pixels)
    checked = check_transforms(dataset.fields, transforms or {}, a["box_rows"], a["as_stored"])
    images, nchw = image_layouts(dataset.fields, image_layout, ctx.max_pixels)
    mix = check_batch_transforms(dataset.fields, a["batch_transforms"])
    pads = tuple(args.check_pad_values(dataset.fields, a["pad_values"]).items())
    groups = transform_groups(dataset.fields, checked)
    return media, checked, images, nchw, mix, pads, groups


def as_tuple(dataset: Any, collate_fn: Any, map_fn: Any) -> Tuple[str, ...]:
    """A stoker.Dataset's as_tuple, for batches made without collate_fn (lists in its
    order, as default_collate batches tuple items): each named field must batch to one
    tensor (a variable-length one comes padded with its lengths, which a list would
    lose)."""
    names = getattr(dataset, "as_tuple", None)
    if names is None or collate_fn is not None:
        return ()
    for n in names:
        f = dataset.fields[n]
        if map_fn is None and (getattr(f, "variable", False) or f.kind == "tokens"):
            raise ValueError(f"as_tuple names {n!r}, a variable-length field: its batches are "
                             f"padded, with their lengths as '{n}_lengths', which batches in "
                             "as_tuple's order would lose. Pass collate_fn= (it receives the "
                             "tuples), or read dict batches (no as_tuple)")
    return tuple(names)
