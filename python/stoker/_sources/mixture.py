"""The sources of a :class:`stoker.Mix`: :class:`MixtureSource` (a mixture of
stoker.Datasets: record batches, each row with its 'source') and
:class:`TokenMixtureSource` (a mixture of TokenDatasets: token rows), in one module, as
they share the mixture's rule, state and counters (``MixRun`` in stoker/mix.py): their
checks, their part of the plan, the producers (a TokenProducer per source, then the
mixture's producer over the sequence) and the running half (a schedule's rows per step
fixed at iter(), its part of the state, ``stats()["sources"]``)."""

from __future__ import annotations

from typing import Any, Dict, Tuple

from .. import _build, _core
from .._plan_parts import RecordPlan
from ..mix import MixRun
from ..token_dataset import producer_args
from .base import Planned, Planning, Running, Source
from .record_plan import record_options
from .records import batches_stage, record_parts, tier
from .tokens import TokensSource, token_arguments

__all__ = ["MixtureSource", "TokenMixtureSource", "MixtureRunning"]


class MixtureSource(Source):
    """A mixture of stoker.Datasets: batches of records from each in the mixture's
    proportions."""

    kind = "mixture"
    own_order = True

    def plan(self, ctx: Planning) -> Planned:
        a, dataset = ctx.a, ctx.dataset
        media, _, images, nchw, mix, pads, groups = record_parts(ctx)
        if ctx.map is not None or ctx.collate_fn is not None:
            raise ValueError("map= and collate_fn= take samples of one stoker.Dataset, not "
                             "of a stoker.Mix; batch_map= takes a mixture's batches (with "
                             "their 'source')")
        MixRun.check(dataset, tokens=False, shard_window=a["shard_window"],
                     shuffle=ctx.sampling.shuffle)
        records = RecordPlan(images, groups, pads, mix, ctx.on_error == "skip",
                             ctx.batch_map is not None, ctx.verify, media=media)
        return Planned(dataset, "MixRecordProducer", records, None, batches_stage(ctx), nchw)

    def build(self, p: Any, world_size: int, open_device: Any) -> Any:
        s = p.sampling
        assert p.records is not None
        run = MixRun(p.dataset, tokens=False, sources=None, batch_size=s.batch_size,
                     seed=s.seed, shard_window=s.shard_window, world_size=world_size,
                     token_options={})
        options = record_options(p.records, s, p.settings.num_threads)
        run.attach(_core.MixRecordProducer([p.dataset.datasets[n]._core for n in run.mix.names],
                                           run.sequence, run.epoch_rows, run.keys, options))
        return _build.wire(p, run.producer, None, MixtureRunning(run),
                           listed=_build.listed_orders(s), cache=_build.open_cache(p), mix=run,
                           open_device=open_device)


class TokenMixtureSource(MixtureSource):
    """A mixture of TokenDatasets: token rows from each in the mixture's proportions
    (weights in rows or in tokens)."""

    kind = "token mixture"
    batches_are_tokens = True

    check_shard_window = TokensSource.check_shard_window  # refused, as for one

    def plan(self, ctx: Planning) -> Planned:
        s = ctx.sampling
        token_kw = token_arguments(ctx)
        dataset = ctx.dataset.as_tokens(ctx.token_options.get("field"))
        MixRun.check(dataset, tokens=True, shard_window=None, shuffle=s.shuffle)
        for name in dataset.names:  # each source's token arguments, checked now
            producer_args(dataset.datasets[name], batch_size=s.batch_size, shuffle=s.shuffle,
                          seed=0, drop_last=s.drop_last, **token_kw)
        return Planned(dataset, "MixTokenProducer", None, token_kw)

    def build(self, p: Any, world_size: int, open_device: Any) -> Any:
        s = p.sampling
        mix = p.dataset
        options = dict(p.tokens or {})
        keys = MixRun.source_keys(s.seed, len(mix.names))
        sources, budget = [], False
        for key, n in zip(keys, mix.names):
            ds, kw = producer_args(mix.datasets[n], batch_size=s.batch_size, shuffle=s.shuffle,
                                   seed=key, drop_last=s.drop_last, **options)
            sources.append(_core.TokenProducer(ds._source, **kw))
            budget = kw["mode"] == "budget"
        run = MixRun(mix, tokens=True, sources=sources, batch_size=s.batch_size, seed=s.seed,
                     shard_window=None, world_size=world_size, token_options=options,
                     budget=budget)
        run.attach(_core.MixTokenProducer(run.sources, run.sequence, run.epoch_rows, run.keys))
        return _build.wire(p, run.producer, None, MixtureRunning(run),
                           listed=_build.listed_orders(s), mix=run, open_device=open_device)


class MixtureRunning(Running):
    """A mixture as a loader reads it (``MixRun``)."""

    def __init__(self, run: MixRun):
        super().__init__(run.mix, run.producer)
        self.run = run

    def at_epoch(self, loader: Any, world: int) -> None:
        # a schedule's steps are batches of the whole job: the world known now; remote
        # sources download ahead of their own streams (a service's actors: their own)
        self.run.at_world(world)
        if loader.plan.service is None:
            self.run.follow(loader)

    def identity(self) -> Dict[str, Any]:
        return self.run.identity()

    def state_parts(self) -> Dict[str, Any]:
        return {"mix": self.run} if self.run.mix.is_schedule else {}

    def stats(self, s: Dict[str, Any], counts: Any, state: Tuple[int, int, int]) -> None:
        s["sources"] = self.run.stats(counts, state)
        remote = getattr(self.dataset, "remote", None)
        if remote is not None:
            s["network"] = remote.stats()

    def tier(self) -> str:
        return tier(self.dataset, tokens=self.run.tokens)
