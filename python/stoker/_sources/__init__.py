"""One class per kind of dataset: its checks, its part of the plan, its wiring, and a
running half that owns its per-epoch hook, its parts of the loader's state, its identity
and its counters.

NOTE [ Sources ]
``LoaderPlan.source`` (stoker/_plan_parts.py) is a :class:`Source`, one class per kind of
dataset, each in its own module:

  base.py        Source, Running     what every source is and what the loader asks of it
  records.py     RecordsSource       a stoker.Dataset (or a path to one)
  map_style.py   MapDatasetSource    a map-style dataset (``__len__``, ``__getitem__``);
                                     its items are read by _stage.sources.MapStyleSource
  iterable.py    IterableSource      a torch IterableDataset (or an IterDataPipe)
  tokens.py      TokensSource        token rows of a TokenDataset
  mixture.py     MixtureSource       a stoker.Mix of Datasets, and
                 TokenMixtureSource  a stoker.Mix of TokenDatasets (one module: they share
                                     the mixture's rule, state and counters, MixRun)
  record_plan.py                     a stoker.Dataset's record options, planned and built
                                     (records, mixtures, and ``Dataset.sample``)

``plan()`` asks :func:`source_of` which one a dataset is, then the source for its checks
(``check_shard_window``, ``check_verify``, an IterableDataset's ``check``) and its part of
the plan (``plan()``: the producer, its options, the Python stage). ``build()`` is the
source's (``build()``: the producer, and the shared wiring of stoker/_build.py), and its
result's ``source`` is the source's :class:`Running` half, which the Loader keeps: its
per-epoch hook (``at_epoch``), ``identity()``, ``state_parts()`` and ``stats()``.

Nothing outside this package branches on the kind: what another part needs to know is an
attribute or a method of the source (``reads_python``, ``batches_are_tokens``,
``indexed``, ``follows_len``, ``epoch_shards()``...); ``kind`` is for messages
(tests/test_structure.py checks that no module outside compares it). A new kind of dataset
is one module here, a line in :func:`source_of`, and its tests.
"""

from __future__ import annotations

from typing import Any, Mapping, Tuple

import torch.utils.data

from .base import Running, Source
from .iterable import IterableSource
from .map_style import MapDatasetSource, is_map_style
from .mixture import MixtureSource, TokenMixtureSource
from .records import RecordsSource
from .tokens import TokensSource

__all__ = ["Source", "Running", "source_of", "RecordsSource", "MapDatasetSource",
           "IterableSource", "TokensSource", "MixtureSource", "TokenMixtureSource"]


def source_of(dataset: Any, a: Mapping[str, Any], given: Mapping[str, Any],
              token_options: Mapping[str, Any]) -> Tuple[Source, Any]:
    """(the source, the dataset) of ``Loader(dataset, **given)`` (`a`: the arguments with
    their defaults; `token_options`: a TokenDataset's own, field= ...): a path (or what
    stoker.Dataset opens) is opened as a stoker.Dataset."""
    from ..dataset import Dataset
    from ..mix import Mix
    from ..token_dataset import TokenDataset

    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    if iterable:
        IterableSource.check(a, dataset, given)
    tokens = isinstance(dataset, TokenDataset) or a["seq_len"] is not None or \
        a["max_tokens"] is not None or a["packing"] is not None or bool(token_options) or \
        (isinstance(dataset, Mix) and dataset.tokens)
    if iterable:
        if tokens:
            raise ValueError("token batches (seq_len=, packing=, max_tokens=) read a stoker "
                             "TokenDataset; an IterableDataset yields its own samples")
        return IterableSource(), dataset
    if is_map_style(dataset):
        if tokens:
            raise ValueError("a map-style dataset: not for token batches (seq_len=, "
                             "packing=, max_tokens=)")
        return MapDatasetSource(), dataset
    if isinstance(dataset, Mix):
        return (TokenMixtureSource() if tokens else MixtureSource()), dataset
    if tokens:
        return TokensSource(), dataset
    return RecordsSource(), dataset if isinstance(dataset, Dataset) else Dataset(dataset)
