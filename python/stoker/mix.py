"""Mixtures: several datasets read as one, each by its weight (:class:`Mix`).

The rows of a mixture come from its sources by a deterministic rule that keeps every
source's count within one row of its share after every batch (NOTE [ Mixtures ] in
``csrc/sampler/mixture.h``); each source is read in its own keyed order, pass after pass.
See ``docs/mixing.md``.
"""

from __future__ import annotations

import math
import numbers
import os
from fractions import Fraction
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _core
from ._mix_weights import _weights, rational_counts
from .dataset import Dataset
from .fields import Tokens
from .token_dataset import TokenDataset

__all__ = ["Mix"]

#: values of ``Mix(interpolation=...)``
INTERPOLATIONS = ("constant", "linear")
#: values of ``Mix(weights_unit=...)``
WEIGHT_UNITS = (None, "samples", "tokens")
# The last row (and step) a schedule can address: int64 with room for sums over sources.
MAX_ROW = 1 << 62

Weights = Mapping[str, Any]
Schedule = Sequence[Tuple[int, Weights]]


class Mix:
    """Several datasets read as one: each batch takes every source's share by weight.

    Example::

        web = stoker.TokenDataset("data/web")
        code = stoker.TokenDataset("data/code")
        mix = stoker.Mix({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3})
        loader = stoker.Loader(mix, batch_size=8, seq_len=2048, packing="document",
                               shuffle=True, seed=0)
        for batch in loader:
            batch["source"]          # int64 [8]: 0 for a row of web, 1 for code
        loader.stats()["sources"]   # rows and tokens delivered per source, realised ratios

    A ``Mix`` goes wherever a dataset goes in :class:`stoker.Loader`. Its sources are
    record datasets with the same fields (:class:`stoker.Dataset`, or paths and URLs to
    them) or token datasets (:class:`stoker.TokenDataset`, or record datasets with a
    ``stoker.tokens`` field when the loader makes token batches), local or remote.

    Guarantees (``docs/mixing.md``):
      * **Exact ratios.** After any number of batches, every source's count is within one
        row of ``rows * weight`` (for constant weights; the rows of the whole job, whatever
        its batch size and world size). For token data the weights are in tokens by
        default: a source's share of rows is its weight over its tokens per row, so packed
        rows with different padding keep the token ratio.
      * **Own orders.** Each source is read in its own shuffled order (the keyed
        permutation of a plain loader, or its ``shard_window`` order), pass after pass: a
        small source repeats, each pass in a fresh order, before any sample comes twice;
        a large one is read partly, and goes on where it stopped in the next epoch.
      * **Resume.** The state is the epoch and the rows consumed, the same on every rank;
        a resume, at any world size, computes where every source stands without reading
        or replaying anything.

    Args:
        sources: ``{name: dataset}``, in the order of their ``batch["source"]`` index.
        weights: ``{name: weight}`` (positive numbers, normalised here; None: all equal),
            or a schedule ``[(step, {name: weight}), ...]`` (steps increasing from 0; a
            weight may be 0 at a breakpoint): from each step on, those weights, held
            (``interpolation="constant"``) or moving linearly to the next breakpoint's
            (``"linear"``). A step is one batch of every rank.
        interpolation: ``"constant"`` (default) or ``"linear"``, for schedules.
        weights_unit: ``"samples"`` (rows) or ``"tokens"``; None = tokens for token data,
            samples for records.
        samples_per_epoch: rows of the mixture per epoch (all ranks together).
        tokens_per_epoch: the same in tokens (token data), rounded to whole rows.
            Neither: an epoch ends once the source with the largest ``len / weight`` has
            been read once (with a schedule, by the weights at step 0).
    """

    def __init__(self, sources: Mapping[str, Any], weights: Union[None, Weights, Schedule] = None,
                 *, interpolation: str = "constant", weights_unit: Optional[str] = None,
                 samples_per_epoch: Optional[int] = None,
                 tokens_per_epoch: Optional[int] = None):
        if not isinstance(sources, Mapping) or not sources:
            raise ValueError(f"sources must be a non-empty dict {{name: dataset}}, got "
                             f"{sources!r}")
        names = list(sources)
        for n in names:
            if not isinstance(n, str) or not n:
                raise ValueError(f"source names must be non-empty strings, got {n!r}")
        if len(names) > 4096:
            raise ValueError(f"a mixture holds at most 4096 sources, got {len(names)}")
        datasets: Dict[str, Any] = {}
        for n in names:
            ds = sources[n]
            if isinstance(ds, (str, os.PathLike)):
                ds = Dataset(ds)
            if not isinstance(ds, (Dataset, TokenDataset)):
                raise ValueError(f"source {n!r}: expected a stoker.Dataset, a "
                                 f"stoker.TokenDataset or a path, got {type(ds).__name__}")
            empty = ds.num_tokens == 0 if isinstance(ds, TokenDataset) else len(ds) == 0
            if empty:
                raise ValueError(f"source {n!r} ({_where(ds)}) has no samples: a mixture draws "
                                 "from each of its sources; leave it out of the mixture")
            datasets[n] = ds
        kinds = {isinstance(ds, TokenDataset) for ds in datasets.values()}
        if len(kinds) > 1:
            tok = [n for n in names if isinstance(datasets[n], TokenDataset)]
            rec = [n for n in names if not isinstance(datasets[n], TokenDataset)]
            raise ValueError(f"a mixture is of record datasets or of token datasets, not both "
                             f"({tok[0]!r} is a TokenDataset, {rec[0]!r} a Dataset); wrap "
                             f"token sources in stoker.TokenDataset")
        self.tokens = kinds == {True}
        first = names[0]
        if self.tokens:
            vocab = {n: datasets[n].vocab_size for n in names if datasets[n].vocab_size}
            if len(set(vocab.values())) > 1:
                a, b = list(vocab)[:2]
                raise ValueError(f"sources {a!r} and {b!r} have different vocab_size "
                                 f"({vocab[a]} and {vocab[b]}): token ids of different "
                                 "tokenizers do not mix")
        else:
            for n in names[1:]:
                if datasets[n]._hash != datasets[first]._hash:
                    raise ValueError(
                        f"source {n!r} has other fields than {first!r}: a mixture's record "
                        f"datasets need the same fields ({_describe(datasets[first])} vs "
                        f"{_describe(datasets[n])})"
                        + _media_reason(datasets[first], datasets[n]))
        self.names: List[str] = names
        self.datasets: Dict[str, Any] = datasets

        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be 'constant' or 'linear', got "
                             f"{interpolation!r}")
        self.interpolation = interpolation
        if weights_unit not in WEIGHT_UNITS:
            raise ValueError(f"weights_unit must be 'samples', 'tokens' or None, got "
                             f"{weights_unit!r}")
        if weights_unit == "tokens" and not (self.tokens or self._token_fields()):
            raise ValueError("weights_unit='tokens' applies to token datasets; a record "
                             "mixture's weights are in samples")
        self._unit_given = weights_unit  # a mixture read as tokens takes tokens by default
        self.weights_unit = weights_unit or ("tokens" if self.tokens else "samples")

        # weights: constant (one breakpoint) or a schedule
        if weights is None:
            weights = {n: 1 for n in names}
        if isinstance(weights, Mapping):
            self._breakpoints = [(0, _weights("weights", names, weights, zero_ok=False))]
        elif isinstance(weights, (list, tuple)) and weights:
            points: List[Tuple[int, List[Fraction]]] = []
            for i, item in enumerate(weights):
                if not (isinstance(item, (list, tuple)) and len(item) == 2):
                    raise ValueError(f"weights[{i}]: a schedule is a list of (step, "
                                     f"{{name: weight}}) pairs, got {item!r}")
                step, w = item
                if isinstance(step, bool) or not isinstance(step, numbers.Integral) or \
                        not 0 <= step <= MAX_ROW:
                    raise ValueError(f"weights[{i}]: the step must be an int >= 0 and at most "
                                     f"2**62 ({MAX_ROW}), got {step!r}")
                step = int(step)
                if i == 0 and step != 0:
                    raise ValueError(f"weights[0]: a schedule starts at step 0, got {step}")
                if points and step <= points[-1][0]:
                    raise ValueError(f"weights[{i}]: schedule steps must increase, got step "
                                     f"{step} after step {points[-1][0]}")
                points.append((step, _weights(f"weights[{i}]", names, w, zero_ok=True)))
            for s, n in enumerate(names):
                if all(p[1][s] == 0 for p in points):
                    raise ValueError(f"source {n!r} has weight 0 at every step of the "
                                     "schedule")
            if all(p[1] == points[0][1] for p in points):
                points = points[:1]  # one weight vector: constant weights
            if len(points) == 1 and any(w == 0 for w in points[0][1]):
                n = names[points[0][1].index(0)]
                raise ValueError(f"source {n!r} has weight 0 throughout")
            self._breakpoints = points
        else:
            raise ValueError(f"weights must be a dict {{name: weight}}, a schedule "
                             f"[(step, {{name: weight}}), ...] or None, got {weights!r}")

        if samples_per_epoch is not None and tokens_per_epoch is not None:
            raise ValueError("give samples_per_epoch or tokens_per_epoch, not both")
        for arg, value in (("samples_per_epoch", samples_per_epoch),
                           ("tokens_per_epoch", tokens_per_epoch)):
            if value is not None and (isinstance(value, bool) or
                                      not isinstance(value, numbers.Integral) or value < 1):
                raise ValueError(f"{arg} must be a positive int, got {value!r}")
        if tokens_per_epoch is not None and not (self.tokens or self._token_fields()):
            raise ValueError("tokens_per_epoch applies to token datasets; use "
                             "samples_per_epoch for records")
        self.samples_per_epoch = None if samples_per_epoch is None else int(samples_per_epoch)
        self.tokens_per_epoch = None if tokens_per_epoch is None else int(tokens_per_epoch)

    def _token_fields(self) -> bool:
        """Every source is a record dataset with a ``stoker.tokens`` field: the mixture can
        also be read as token documents (:meth:`as_tokens`)."""
        return not self.tokens and all(
            any(isinstance(f, Tokens) for f in ds.fields.values())
            for ds in self.datasets.values())

    def as_tokens(self, field: Optional[str] = None) -> "Mix":
        """This mixture with every record source read as token documents
        (``stoker.TokenDataset(source, field=field)``), the same weights and epoch: what
        ``Loader(mix, seq_len=...)`` (or ``max_tokens=``) reads from a mixture of datasets
        with token fields. Weights are then in tokens unless ``weights_unit`` said
        otherwise."""
        if self.tokens:
            return self
        datasets: Dict[str, Any] = {}
        for n in self.names:
            try:
                datasets[n] = TokenDataset(self.datasets[n], field=field)
            except ValueError as e:
                raise ValueError(f"token batches (seq_len=, packing=, max_tokens=) need token "
                                 f"sources: source {n!r}: {e}") from None
        kwargs = self._kwargs()
        kwargs["weights_unit"] = self._unit_given
        return Mix(datasets, self._exact_weights(), **kwargs)

    # -- weights ----------------------------------------------------------------

    @property
    def fields(self) -> Dict[str, Any]:
        """The fields every record source has (record mixtures)."""
        if self.tokens:
            raise AttributeError("a mixture of token datasets has no record fields")
        return self.datasets[self.names[0]].fields

    @property
    def is_schedule(self) -> bool:
        return len(self._breakpoints) > 1

    @property
    def weights(self) -> Union[Dict[str, float], List[Tuple[int, Dict[str, float]]]]:
        """The normalised weights: ``{name: weight}``, or the schedule
        ``[(step, {name: weight}), ...]``."""
        if not self.is_schedule:
            return self._as_dict(self._breakpoints[0][1])
        return [(step, self._as_dict(w)) for step, w in self._breakpoints]

    def _as_dict(self, w: Sequence[Fraction]) -> Dict[str, float]:
        return {n: float(x) for n, x in zip(self.names, w)}

    def _exact_weights(self) -> Any:
        """The weights as fractions, in the form ``weights=`` takes them."""
        exact = [(step, dict(zip(self.names, w))) for step, w in self._breakpoints]
        return exact[0][1] if not self.is_schedule else exact

    def _kwargs(self) -> Dict[str, Any]:
        return {"interpolation": self.interpolation, "weights_unit": self.weights_unit,
                "samples_per_epoch": self.samples_per_epoch,
                "tokens_per_epoch": self.tokens_per_epoch}

    def __reduce__(self):
        return (_rebuild, (self.datasets, self._exact_weights(), self._kwargs()))

    def __repr__(self) -> str:
        if self.is_schedule:
            w = f"{len(self._breakpoints)}-step {self.interpolation} schedule"
        else:
            w = ", ".join(f"{n}: {float(x):.4g}" for n, x in
                          zip(self.names, self._breakpoints[0][1]))
        kind = "tokens" if self.tokens else "records"
        return f"stoker.Mix({kind}; {w})"


def _rebuild(datasets, weights, kwargs) -> Mix:
    return Mix(datasets, weights, **kwargs)


def _where(ds: Any) -> str:
    """A source's files, for messages."""
    paths = getattr(ds, "paths", None)
    return str(paths[0] if paths else getattr(ds, "path", ds))


def _media_reason(a: Dataset, b: Dataset) -> str:
    """Why video (or audio) and image sources do not mix, where that is the difference."""
    from ._media_fields import Audio, Video
    from .fields import Image

    def kinds(ds):
        return {("video" if isinstance(f, Video) else "audio" if isinstance(f, Audio)
                 else "image") for f in ds.fields.values()
                if isinstance(f, (Video, Audio, Image))}

    ka, kb = kinds(a), kinds(b)
    if ka == kb or not ({"video", "audio"} & (ka | kb)):
        return ""
    return ("; a batch holds one tensor per field, and a video clip ([T, C, H, W]), an "
            "image ([C, H, W]) and audio ([C, N]) are not rows of one tensor: give each kind "
            "its own Loader and alternate their batches in the training loop (docs/video.md, "
            "'Video with images')")


def _describe(ds: Dataset) -> str:
    return "{" + ", ".join(f"{n}: {f!r}" for n, f in ds.fields.items()) + "}"


# --- a Mix bound to a Loader ----------------------------------------------------------

_MASK = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser (csrc/sampler/permutation.h), for the sources' keys."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def source_key(seed: int, source: int) -> int:
    """The key of source `source`'s stream: its passes are ordered by (key, pass)."""
    return _mix64((seed & _MASK) ^ _mix64(0x6D69782D736F7572 + source))  # "mix-sour"


class MixRun:
    """A :class:`Mix` as one loader reads it: its sequence of sources and what the loader's
    state, stats and remote fetchers need. Its producers are built by the mixture's source
    (stoker/_sources/mixture.py): ``sources``, a token mixture's TokenProducer per source,
    before; ``producer``, the C++ mixture producer over the sequence, after
    (:meth:`attach`)."""

    def __init__(self, mix: Mix, *, tokens: bool, sources: Optional[List[Any]],
                 batch_size: Optional[int], seed: int, shard_window: Optional[int],
                 world_size: int, token_options: Dict[str, Any], budget: bool = False):
        self.mix = mix
        names = mix.names
        self.keys = self.source_keys(seed, len(names))
        self.tokens = tokens
        self.shard_window = shard_window
        self.followed: Dict[int, Any] = {}  # source -> the fetcher following it
        self.producer: Any = None
        if tokens:
            assert sources is not None
            self.budget = budget
            sizes = [p.num_samples for p in sources]
            for n, size in zip(names, sizes):
                if size == 0:
                    ds = mix.datasets[n]
                    given = ", ".join(f"{k}={v!r}" for k, v in token_options.items()
                                      if v is not None)
                    raise ValueError(f"source {n!r} ({_where(ds)}) makes no row of these "
                                     f"settings ({given}): it holds {ds.num_tokens} tokens; "
                                     "leave it out of the mixture or ask for shorter rows")
            per_unit = [Fraction(p.real_tokens, p.num_samples) for p in sources]
            self.sources = sources
        else:
            self.budget = False
            sizes = [len(mix.datasets[n]) for n in names]
            per_unit = [Fraction(1)] * len(names)
        self.sizes = sizes
        self.tokens_per_unit = per_unit
        # a step is one batch of every rank: batch_size rows (one budget batch) per rank;
        # the world is known for sure at iter() (at_world) or from a resumed state (load)
        self.rows_per_rank = 1 if self.budget else int(batch_size or 1)
        self.rows_per_step = self.rows_per_rank * world_size
        self.pinned = False  # rows_per_step from a resumed state: kept
        self.sequence = self._sequence(self.rows_per_step)
        self.epoch_rows = self._epoch_rows()

    @staticmethod
    def source_keys(seed: int, n: int) -> List[int]:
        """The seed of each of `n` sources' own orders."""
        return [source_key(seed & _MASK, s) for s in range(n)]

    def attach(self, producer: Any) -> None:
        """The C++ producer over ``sequence`` (a MixTokenProducer or MixRecordProducer)."""
        self.producer = producer

    @staticmethod
    def check(mix: Mix, *, tokens: bool, shard_window: Optional[int], shuffle: bool) -> None:
        """The loader's arguments against the mixture (the plan's check, stoker/_plan.py)."""
        if tokens and not mix.tokens:
            raise ValueError("token batches (seq_len=, packing=, max_tokens=) need a mixture of "
                             "stoker.TokenDataset sources")
        if not tokens and mix.tokens:
            raise ValueError("a mixture of token datasets makes token batches: pass seq_len= "
                             "(rows of that many tokens) or max_tokens=")
        if not tokens and (mix.weights_unit == "tokens" or mix.tokens_per_epoch is not None):
            raise ValueError("weights_unit='tokens' and tokens_per_epoch apply to token "
                             "batches: pass seq_len= or max_tokens=")
        if tokens and shard_window is not None:
            raise ValueError("shard_window applies to record datasets; token sources have "
                             "their own orders")
        if not tokens:
            for n in mix.names:
                remote = getattr(mix.datasets[n], "remote", None)
                if remote is not None:
                    remote.check_window(shard_window, shuffle)

    # -- the rule ------------------------------------------------------------------

    def _row_weights(self, w: Sequence[Fraction]) -> List[Fraction]:
        """Weights of rows: the mixture's weights, or in tokens each over its tokens per
        row (per budget batch)."""
        if self.mix.weights_unit == "tokens":
            if sum(w) == 0:
                return list(w)
            v = [x / t for x, t in zip(w, self.tokens_per_unit)]
            total = sum(v)
            return [x / total for x in v]
        return list(w)

    def _sequence(self, rows_per_step: int) -> Any:
        points = self.mix._breakpoints
        if len(points) == 1:
            return _core.MixSequence.constant(rational_counts(self._row_weights(points[0][1])))
        for i, (step, _) in enumerate(points):
            if step * rows_per_step > MAX_ROW:
                raise ValueError(
                    f"weights[{i}]: step {step} starts at row {step * rows_per_step} "
                    f"({rows_per_step} rows per step: batch_size x world_size), past the "
                    f"last row a schedule can address (2**62): steps count batches of the "
                    "whole job; give a smaller step")
        starts = [step * rows_per_step for step, _ in points]
        weights = [[float(x) for x in self._row_weights(w)] for _, w in points]
        return _core.MixSequence.schedule(starts, weights, self.mix.interpolation == "linear")

    def _epoch_rows(self) -> int:
        mix = self.mix
        if mix.samples_per_epoch is not None:
            return mix.samples_per_epoch
        w0 = self._row_weights(mix._breakpoints[0][1])
        if mix.tokens_per_epoch is not None:
            per_row = sum(v * t for v, t in zip(w0, self.tokens_per_unit))
            return max(1, math.ceil(mix.tokens_per_epoch / per_row))
        if not mix.is_schedule:  # the row that reads the last of them once
            return max(self.sequence.rows_until(s, n) for s, n in enumerate(self.sizes))
        return max(math.ceil(n / v) for n, v in zip(self.sizes, w0) if v > 0)

    # -- the loader's state ---------------------------------------------------------

    def identity(self) -> Dict[str, Any]:
        """What a state records of the mixture, by value (a resume checks it)."""
        mix = self.mix
        ident: Dict[str, Any] = {
            "mix": list(mix.names), "weights_unit": mix.weights_unit,
            "epoch_samples": self.epoch_rows,
            "weights": [[step, [str(x) for x in w]] for step, w in mix._breakpoints],
            "sizes": list(self.sizes)}
        if mix.is_schedule:
            ident["interpolation"] = mix.interpolation
        ids = [getattr(mix.datasets[n], "dataset_id", None) or
               getattr(getattr(mix.datasets[n], "dataset", None), "dataset_id", None)
               for n in mix.names]
        if any(ids):
            ident["dataset_ids"] = ids
        return ident

    def state(self) -> Dict[str, Any]:
        return {"rows_per_step": self.rows_per_step}

    def at_world(self, world_size: int) -> None:
        """At iter(): a schedule's step is one batch of every rank of the world now (a
        loader built before ``init_process_group`` saw one rank), unless a resumed state
        fixed the rows of a step of the run that saved it."""
        rows = self.rows_per_rank * world_size
        if self.pinned or rows == self.rows_per_step:
            return
        if self.mix.is_schedule:
            self.producer.set_sequence(self._sequence(rows))
            self.sequence = self.producer.sequence()
        self.rows_per_step = rows

    def load(self, state: Mapping[str, Any]) -> None:
        """Its part of a loader state (``state()``'s). A schedule keeps the rows of a step
        of the run that saved the state: a resume at another world size goes on with the
        weights where they were in the stream."""
        if not self.mix.is_schedule:
            return
        rows = state.get("rows_per_step")
        if rows is None:
            raise ValueError("cannot resume: the state of a scheduled mixture has no mix "
                             "rows_per_step (where the schedule stood)")
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"cannot resume: the state's mix rows_per_step is {rows!r}")
        self.pinned = True
        if rows == self.rows_per_step:
            return
        self.producer.set_sequence(self._sequence(rows))
        self.sequence = self.producer.sequence()
        self.rows_per_step = rows

    def stats(self, counts: Sequence[int], state: Tuple[int, int, int]) -> Dict[str, Any]:
        """``stats()["sources"]``: rows and real tokens delivered per source (this rank), the
        share of each in the weights' unit, and the weights in force where the job stands
        (the loader's ``state()``: epoch, position); for token data the share of padding in
        each source's packed rows, for a source read from a URL its cache and network
        counters."""
        names = self.mix.names
        k = len(names)
        counts = list(counts) + [0] * (2 * k - len(counts))
        rows = counts[0::2][:k]
        toks = counts[1::2][:k]
        by = toks if self.mix.weights_unit == "tokens" else rows
        total = sum(by)
        epoch, position = state[0], state[1]
        weights = self.weights_at(epoch * self.epoch_rows + position)
        out = {}
        for s, n in enumerate(names):
            entry: Dict[str, Any] = {"samples": rows[s]}
            if self.tokens:
                entry["tokens"] = toks[s]
            entry["ratio"] = by[s] / total if total else 0.0
            entry["weight"] = weights[s]
            if self.tokens:
                entry["pad_fraction"] = self.sources[s].pad_fraction
            remote = self.remote(n)
            if remote is not None:
                entry["network"] = remote.stats()
            out[n] = entry
        return out

    def remote(self, name: str) -> Any:
        """The remote dataset behind source `name` (a URL), else None."""
        ds = self.mix.datasets[name]
        remote = getattr(ds, "remote", None)
        if remote is None and getattr(ds, "dataset", None) is not None:  # a TokenDataset
            remote = getattr(ds.dataset, "remote", None)
        return remote

    def weights_at(self, row: int) -> List[float]:
        """The mixture's weights (in its unit) in force at `row` of its stream."""
        points = self.mix._breakpoints
        if len(points) == 1:
            return [float(x) for x in points[0][1]]
        step = row / self.rows_per_step
        i = max(j for j, (st, _) in enumerate(points) if st <= step)
        w = [float(x) for x in points[i][1]]
        if self.mix.interpolation == "linear" and i + 1 < len(points):
            (s0, _), (s1, w1) = points[i], points[i + 1]
            t = (step - s0) / (s1 - s0)
            w = [a + (float(b) - a) * t for a, b in zip(w, w1)]
        return w

    def follow(self, loader: Any) -> None:
        """Remote sources download ahead of their own streams (NOTE [ Fetch plan ] in
        csrc/sampler/fetch_plan.h: each source's fetcher follows that source's passes)."""
        if self.tokens:
            return
        for s, n in enumerate(self.mix.names):
            remote = getattr(self.mix.datasets[n], "remote", None)
            if remote is not None and self.mix.datasets[n]._core.deferred:
                if self.followed.get(s) is not remote._fetcher:  # once per fetcher
                    self.followed[s] = remote.follow(loader._core, self.producer, 1,
                                                     self.shard_window, source=s)
