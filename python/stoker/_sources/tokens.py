"""The source of a stoker.TokenDataset (or a stoker.Dataset's token field, or token
files) read as token rows: seq_len= windows, packed rows, max_tokens= budgets. Its
checks, its part of the plan (the TokenProducer's arguments), its wiring and its running
half (its identity; pad_fraction and unused_tokens in ``stats()``)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from .. import _build, _core
from ..token_dataset import producer_args
from .base import Planned, Planning, Running, Source, dataset_identity
from .records import tier

__all__ = ["TokensSource", "TokensRunning"]


class TokensSource(Source):
    """Token batches of one token dataset."""

    kind = "tokens"
    batches_are_tokens = True
    own_order = True

    def check_shard_window(self, shard_window: int, shuffle: bool) -> None:
        raise ValueError("shard_window applies to record datasets (stoker.Dataset); token "
                         "batches (seq_len=, packing=, max_tokens=) have their own orders")

    def plan(self, ctx: Planning) -> Planned:
        s = ctx.sampling
        dataset, kw = producer_args(ctx.dataset, batch_size=s.batch_size, shuffle=s.shuffle,
                                    seed=s.seed64, drop_last=s.drop_last,
                                    **token_arguments(ctx))
        return Planned(dataset, "TokenProducer", None, kw)

    def build(self, p: Any, world_size: int, open_device: Any) -> Any:
        producer = _core.TokenProducer(p.dataset._source, **(p.tokens or {}))
        return _build.wire(p, producer, None, TokensRunning(p.dataset, producer),
                           listed=_build.listed_orders(p.sampling), open_device=open_device)


class TokensRunning(Running):
    """A token dataset as a loader reads it."""

    def identity(self) -> Dict[str, Any]:
        return dataset_identity(self.dataset, True, self.producer.epoch_samples())

    def stats(self, s: Dict[str, Any], counts: Any, state: Tuple[int, int, int]) -> None:
        s["pad_fraction"] = self.producer.pad_fraction
        s["unused_tokens"] = self.producer.unused_tokens
        remote = getattr(self.dataset, "remote", None)
        if remote is not None:
            s["network"] = remote.stats()

    def tier(self) -> Optional[str]:
        return tier(self.dataset, tokens=True)


def token_arguments(ctx: Planning) -> Dict[str, Any]:
    """The token producer's keyword arguments (TokenProducer's, stoker/token_dataset.py)."""
    a, s = ctx.a, ctx.sampling
    return dict(seq_len=a["seq_len"], packing=a["packing"], token_dtype=a["token_dtype"],
                max_tokens=a["max_tokens"], labels=a["labels"], even_batches=s.even_batches,
                **ctx.token_options)
