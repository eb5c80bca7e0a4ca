"""The source of a stoker.Dataset's records, in part: its ``as_tuple`` check and its
per-epoch hook (a remote dataset's fetcher follows the loader's order). Its other checks
are in stoker/_plan.py and its wiring in stoker/_build.py (``LoaderPlan.source``)."""

from __future__ import annotations

from typing import Any, Tuple

__all__ = ["as_tuple", "follow"]


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


def follow(loader: Any, world: int) -> None:
    """At iter(): downloads go ahead of the loader's own order (NOTE [ Fetch plan ] in
    csrc/sampler/fetch_plan.h); a dataset opened before a fork starts this process's
    fetcher here. A mixture's remote sources each follow their own stream. A service's
    actors fetch for themselves."""
    if loader.plan.service is not None:
        if loader._mix is not None:
            loader._mix.at_world(world)
        return
    remote = None if loader._map_style else getattr(loader.dataset, "remote", None)
    if remote is not None and not loader._tokens and loader.dataset._core.deferred:
        loader._following = remote.follow(loader._core, loader._producer, world,
                                          loader.shard_window)
    if loader._mix is not None:
        # a schedule's steps are batches of the whole job: the world known now
        loader._mix.at_world(world)
        loader._mix.follow(loader)
