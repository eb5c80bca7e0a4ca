"""The source of a map-style dataset (any object with ``__len__`` and ``__getitem__``
that is not a stoker dataset: a ``torch.utils.data.Dataset``, a list, a HF
``datasets.Dataset``): ``dataset[i]`` read by the Python stage's workers in the C++
core's order. Its checks, its part of the plan, its wiring and its running half (its
identity: its length)."""

from __future__ import annotations

from typing import Any, Dict

from .. import _build, _core
from .._plan_parts import Sampling, StagePlan
from .base import Planned, Planning, Running, Source, describe_python

__all__ = ["MapDatasetSource", "MapDatasetRunning", "is_map_style"]


def is_map_style(obj: Any) -> bool:
    """Any object with ``__len__`` and ``__getitem__`` that is not a stoker dataset or a
    path: a ``torch.utils.data.Dataset``, a list, a HF ``datasets.Dataset``..."""
    from ..dataset import Dataset
    from ..mix import Mix
    from ..token_dataset import TokenDataset

    if isinstance(obj, (Dataset, TokenDataset, Mix, str, bytes)) or hasattr(obj, "__fspath__"):
        return False
    return hasattr(obj, "__len__") and hasattr(obj, "__getitem__")


class MapDatasetSource(Source):
    """A map-style dataset (``kind`` "map-style"); the stage's reader of its items is
    ``_stage.sources.MapStyleSource``."""

    kind = "map-style"
    reads_python = True
    follows_len = True

    def describe(self, dataset: Any) -> str:
        return describe_python(dataset)

    def check_shard_window(self, shard_window: int, shuffle: bool) -> None:
        super().check_shard_window(shard_window, shuffle)
        raise ValueError("shard_window shuffles the shards of a stoker.Dataset; a "
                         "map-style dataset has none (shuffle=True shuffles it whole)")

    def check_verify(self, verify: str) -> None:
        if verify != "first":
            raise ValueError("verify= says when the records of a stoker.Dataset are checked; "
                             "a map-style dataset has no records of stoker's to verify")

    def epoch_shards(self, dataset: Any) -> Any:
        return [len(dataset)]

    def plan(self, ctx: Planning) -> Planned:
        names = ctx.a["names"]
        stage = StagePlan("map-style", ctx.map, ctx.batch_map, ctx.collate_fn,
                          ctx.a["map_fields"], None if names is None else tuple(names),
                          ctx.workers, ctx.on_device, **ctx.stage_kw)
        return Planned(ctx.dataset, "PythonProducer", None, None, stage)

    def build(self, p: Any, world_size: int, open_device: Any) -> Any:
        from .._stage.sources import MapStyleSource

        s: Sampling = p.sampling
        listed = _build.listed_orders(s)
        producer = _core.PythonProducer(len(p.dataset), s.batch_size or 1, s.shuffle,
                                        s.seed64, s.drop_last, s.even_batches, listed=listed)
        reader = None if p.service is not None else MapStyleSource(p.dataset, p.stage.names)
        return _build.wire(p, producer, reader, MapDatasetRunning(p.dataset, producer),
                           listed=listed, open_device=open_device)


class MapDatasetRunning(Running):
    """A map-style dataset as a loader reads it."""

    def identity(self) -> Dict[str, Any]:
        return {"num_records": len(self.dataset)}  # its size (docs/python.md)
