"""What a Loader does as DataLoader does where stoker's own design would not: the
translation of DataLoader's arguments that the plan makes (seeds, worker processes, an
IterableDataset's ranks, a bulk-loading sampler), DataLoader's ``sampler`` and
``batch_sampler`` objects, and functions bound as Loader methods (stoker/loader.py).

NOTE [ Seeds as DataLoader draws them ]
DataLoader draws its randomness from torch's generators: ``RandomSampler`` draws a seed
from torch's default generator at each epoch (or draws its permutation from the
``generator`` given), and each iterator draws its workers' base seed from the same
generator. So ``torch.manual_seed(s)`` selects the order and the augmentations, and an
advanced ``generator`` gives another order. stoker keeps that meaning:

  * ``seed=None`` (the default) and no ``generator``: the loader's seed is drawn from
    torch's default generator when the loader is made (one 63-bit draw), and is the
    seed of everything stoker keys by (seed, epoch, index): the order of every epoch,
    the transforms' draws, map's ``rng``, and the global generators that worker
    processes seed per sample. ``state_dict()`` keeps it; ``load_state_dict()`` on a
    loader whose seed was drawn takes the state's, so a resume in a new process (where
    torch's generator is elsewhere) continues the same order.
  * ``generator=g`` with ``shuffle=True`` (a map-style dataset or a stoker.Dataset):
    each epoch's permutation is ``RandomSampler(dataset, generator=g)``'s, drawn from g
    at that epoch's ``iter()`` after one draw for the workers' base seed, as
    DataLoader's iterator makes them: the same generator state gives DataLoader's order
    exactly (batches, ranks and resume are stoker's own: ``ListedOrders`` permutations
    in csrc/sampler/listed_order.h). The state keeps g's state before the epoch. The
    seed of the rest is ``g.initial_seed()``. For token batches and mixtures, whose
    orders are stoker's, the seed is one draw from g when the loader is made.
  * ``seed=s``: stoker's own, as before: the same s, the same batches.

NOTE [ Worker processes for num_workers ]
DataLoader's ``num_workers=N`` means N worker processes, and code written for it relies on
what processes give: the dataset's draws from ``random``, ``numpy.random`` and torch are
the worker's own (reproducible for a seed), the dataset object is each worker's copy, and
a crash in native code ends a worker, not the training process. So a map-style dataset
given ``num_workers > 0`` (with ``python_workers`` left at its default) runs in N worker
processes from the first batch, each sample's global generators seeded from (seed, epoch,
index) (NOTE [ Global random generators ] in stoker/_stage/workers.py): the same batches
for any worker count and after a resume. The same rule holds for an IterableDataset: its
N workers are processes, each iterating its share, its global generators seeded from
(seed, epoch, worker id) (NOTE [ Iterable datasets in processes ] in
stoker/_stage/iterable_processes.py). Without ``num_workers`` (stoker's own default)
the stage starts on threads and moves to processes when that pays
(``python_workers="auto"``, NOTE [ Python stage processes ]).
"""

from __future__ import annotations

import types
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
import torch.utils.data

__all__ = ["follow_len", "rebuilt_arguments", "DrawnSeed", "base_seed", "worker_kind",
           "splits_ranks", "samplers", "repeating", "Repeating", "adopt_seed", "bulk_sampler",
           "set_attributes", "attach_samplers", "DataLoaderAttributes",
           "refuse_shifted_labels_under_trainer", "check_honoured"]


# -- seeds (NOTE [ Seeds as DataLoader draws them ]) ---------------------------------------

class DrawnSeed(int):
    """A seed drawn from torch's default generator (``seed=None``): a resume state's seed
    replaces it (adopt_seed), where an explicit seed must match the state's."""

    def __repr__(self) -> str:
        return f"{int(self)} (drawn from torch's default generator)"


def _draw(generator: Optional[torch.Generator] = None) -> int:
    """One int64 draw, as DataLoader draws a seed (63 bits: non-negative)."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def base_seed(seed: Any, generator: Any, *, tokens: bool, shuffled_order: bool
              ) -> Tuple[Any, bool]:
    """(the loader's seed, whether each epoch's permutation comes from `generator`).
    `tokens`: token batches or a mixture (orders of stoker's own); `shuffled_order`:
    shuffle=True over stoker's permutation of a map-style dataset or a stoker.Dataset (no
    user sampler). A seed is 64 bits: negative seeds are taken modulo 2**64, larger ones
    refused rather than silently aliased to a smaller one."""
    from ._loader_args import check_int

    if seed is not None:
        checked = check_int("seed", seed, -2**63, 2**64 - 1)
        seed = DrawnSeed(checked) if isinstance(seed, DrawnSeed) else checked
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if generator is None:
        return (DrawnSeed(_draw()) if seed is None else seed), False
    if seed is not None and not isinstance(seed, DrawnSeed) and \
            seed != generator.initial_seed():
        raise ValueError(f"seed={seed} and generator (initial seed "
                         f"{generator.initial_seed()}) disagree: pass one of them")
    if tokens:
        return _draw(generator), False
    return generator.initial_seed(), shuffled_order


def adopt_seed(loader: Any, state: Any) -> None:
    """load_state_dict on a loader whose seed was drawn (seed=None): the state's seed
    becomes the loader's, the loader made again with it (between epochs: nothing runs)."""
    seed = loader.plan.sampling.seed
    if not isinstance(seed, DrawnSeed) or not hasattr(state, "get"):
        return
    theirs = state.get("seed")
    if isinstance(theirs, bool) or not isinstance(theirs, int) or theirs == int(seed):
        return
    _rebuild(loader, seed=DrawnSeed(theirs))


def rebuilt_arguments(loader: Any, **changes: Any) -> Dict[str, Any]:
    """The arguments _rebuild makes the loader again with: its own, the seed it drew if it
    drew one (a drawn seed is not drawn again), and `changes`."""
    arguments = dict(loader.plan.arguments)
    if isinstance(loader.plan.sampling.seed, DrawnSeed):
        arguments["seed"] = loader.plan.sampling.seed
    arguments.update(changes)
    return arguments


def _rebuild(loader: Any, **changes: Any) -> None:
    """The loader made again from rebuilt_arguments(), at the epoch it was at."""
    epoch, arguments = loader.epoch, rebuilt_arguments(loader, **changes)
    loader.close()
    object.__setattr__(loader, "_initialized", False)
    loader.__init__(loader.dataset, **arguments)  # type: ignore[misc]
    if epoch:
        loader.set_epoch(epoch)


# -- worker processes (NOTE [ Worker processes for num_workers ]) --------------------------

def worker_kind(python_workers: str, num_workers: Optional[int], *, map_style: bool) -> str:
    """The Python stage's workers: a torch dataset (map-style or iterable: `map_style`)
    given DataLoader's num_workers > 0, with python_workers left at "auto", runs in worker
    processes from the start."""
    if python_workers == "auto" and map_style and num_workers:
        return "process"
    return python_workers


# -- arguments a loader cannot honour ---------------------------------------------------------

# NOTE [ No argument ignored ]
# An argument either changes what the loader does or is refused with the reason and what to
# use instead; none is accepted and dropped. What DataLoader's worker arguments become:
#   worker_init_fn           called in each worker of the Python stage (thread or process);
#                            a loader with no Python per sample (a stoker.Dataset without
#                            map=/collate_fn=, batch_map= alone, token batches, a mixture)
#                            has no Python workers to call it in: refused
#   persistent_workers       False (DataLoader's default and stoker's): worker_init_fn runs
#                            again in each worker at each epoch's start, as in DataLoader's
#                            new workers; True: once per worker. stoker's workers themselves
#                            persist either way (a worker process's dataset keeps what its
#                            earlier epochs did to it); with no Python per sample nothing of
#                            the user's runs in a worker and the argument changes nothing
#                            there is to see
#   multiprocessing_context  how worker processes start: stoker's processes fork, so
#                            "spawn" or "forkserver" keeps "auto" on threads and is refused
#                            with python_workers="process"; where the workers are threads
#                            (python_workers="thread", an IterableDataset without
#                            num_workers, no Python per sample) no process starts and
#                            nothing forks, which is what "spawn" and "forkserver" are
#                            chosen for: taken, as DataLoader takes it with num_workers > 0
#                            (with num_workers=0 refused, as DataLoader refuses it)
# and with an IterableDataset (its own checks: stoker/_sources/iterable.py): prefetch and
# prefetch_factor bound the batches the core fills ahead (its workers read one row each
# beyond them), stall_warning is the core's, on_error="skip" leaves out rows whose map=
# raised (refused without map=: the dataset's own errors end its iterator, nothing to skip
# to), num_threads and max_memory (the C++ core's decoding threads and memory-bounded
# autotuning) are refused; prefetch_next_epoch does not apply (an epoch's end is known only
# once its stream is read, so the next epoch is a new reading, started with its iterator:
# the plan says False).

def check_honoured(given: Any, *, stage: Any, iterable: bool, context: Optional[str]) -> None:
    """Refuses each argument of `given` (the arguments passed) that this loader, with its
    Python `stage` (a StagePlan or None), could not honour (NOTE [ No argument ignored ])."""
    python_workers = stage is not None and stage.fetch != "batches"
    if given.get("worker_init_fn") is not None and not python_workers:
        raise ValueError(
            "worker_init_fn= runs in each worker of the Python stage, and this loader has "
            "none: its samples are read and batched by C++ threads that run no Python (a "
            "stoker.Dataset without map= or collate_fn=, batch_map= alone, token batches or "
            "a stoker.Mix). Pass map= to run Python per sample (worker_init_fn then runs in "
            "each of its workers), or leave worker_init_fn out")
    # multiprocessing_context: refused with num_workers=0 by DataLoader's own check
    # (_loader_args); with thread workers taken (NOTE [ No argument ignored ])


# -- an IterableDataset's ranks ---------------------------------------------------------------

def splits_ranks(given: Any) -> bool:
    """Whether stoker splits an IterableDataset's stream across ranks: only when asked, by
    ``even_batches=`` or ``rank=``/``world_size=`` (NOTE [ Iterable datasets ] in
    stoker/_stage/iterable.py); by default each rank is given the dataset as it is, as
    DataLoader gives it (the dataset splits itself by rank, or every rank reads it all)."""
    return any(given.get(k) is not None for k in ("even_batches", "rank", "world_size"))


def self_split(dataset: Any) -> Optional[str]:
    """How `dataset` splits itself by rank, where its structure says so (a WebDataset
    pipeline with split_by_node, a HF dataset from split_dataset_by_node), else None."""
    distributed = getattr(dataset, "_distributed", None)
    if distributed is not None and getattr(distributed, "world_size", 1) != 1:
        return "it is a HF dataset from datasets.distributed.split_dataset_by_node"
    stages = getattr(dataset, "pipeline", None)
    if isinstance(stages, (list, tuple)):
        for stage in stages:
            name = getattr(stage, "__name__", "") or type(stage).__name__
            if name == "split_by_node" or getattr(stage, "nodesplitter", None) is not None:
                return "its pipeline splits shards by node (webdataset's split_by_node)"
    if getattr(dataset, "nodesplitter", None) is not None:
        return "it has a nodesplitter (webdataset)"
    return None


def check_rank_split(dataset: Any, sampling: Any) -> None:
    """stoker's rank split asked for over a dataset whose structure says it splits itself:
    refused (each rank would get a share of a share)."""
    how = self_split(dataset) if sampling.split_ranks and sampling.world_size != 1 else None
    if how is not None:
        raise ValueError(f"the IterableDataset splits itself by rank ({how}), and "
                         "even_batches=, rank= or world_size= asks stoker to split it too: "
                         "each rank would get a share of a share. Leave those out (each rank "
                         "is given the dataset as it is, DataLoader's rule)")




# -- a bulk-loading sampler ------------------------------------------------------------------

def bulk_sampler(sampler: Any, batch_size: Any, batch_sampler: Any, records: bool) -> bool:
    """DataLoader's bulk-loading pattern over a stoker.Dataset: a ``BatchSampler`` passed
    as ``sampler=`` with ``batch_size=None``, whose items (lists of indices) DataLoader
    hands to ``__getitem__`` whole: each is a batch of those indices."""
    return (records and batch_size is None and batch_sampler is None and
            isinstance(sampler, torch.utils.data.BatchSampler))


def check_orders(dl: Any, a: Any, bulk: bool, generator_order: bool, shard_window: Any,
                 drop_last: bool, explicit_batch: bool) -> None:
    """A user's sampler (or a bulk one) and a generator's order, checked as DataLoader
    checks them."""
    from ._loader_args import check_samplers

    if not bulk:
        check_samplers(dl, a, shard_window=shard_window, explicit_batch=explicit_batch)
    elif a["shuffle"] or drop_last:
        raise ValueError("sampler option is mutually exclusive with shuffle, and batch_size="
                         "None with drop_last (as DataLoader)")
    if shard_window is not None and generator_order:
        raise ValueError("shard_window orders shards by stoker's seed; a generator= draws "
                         "each epoch's permutation as RandomSampler does: pass one of them")


# -- DataLoader's sampler and batch_sampler ---------------------------------------------------

class _Order(torch.utils.data.Sampler):
    """``loader.sampler`` for stoker's own order: DataLoader's RandomSampler or
    SequentialSampler in type (as frameworks test it: Lightning's
    ``_is_dataloader_shuffled``), iterating this rank's indices of the epoch the next
    iterator runs; ``set_epoch`` is ``loader.set_epoch``; ``len`` this rank's samples."""

    def __init__(self, loader: Any) -> None:
        self._loader = weakref.proxy(loader)
        self.data_source = loader.dataset

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    def __len__(self) -> int:
        return int(self._loader.num_samples)

    def __iter__(self) -> Iterator[int]:
        indices, _ = _epoch_batches(self._loader)
        return iter(indices.tolist())

    def __repr__(self) -> str:
        return "stoker sampler (the loader's order; set_epoch -> Loader.set_epoch)"


class _ShuffledOrder(_Order, torch.utils.data.RandomSampler):
    replacement = False
    generator = None
    _num_samples = None


class _SequentialOrder(_Order, torch.utils.data.SequentialSampler):
    pass


class _StreamOrder(_Order, torch.utils.data.dataloader._InfiniteConstantSampler):
    """An IterableDataset's: DataLoader's _InfiniteConstantSampler, with set_epoch."""

    def __iter__(self) -> Iterator[Any]:
        while True:
            yield None

    def __len__(self) -> int:
        raise TypeError("an IterableDataset's sampler has no length (as DataLoader's)")


class _GeneratorOrder(torch.utils.data.RandomSampler):
    """``shuffle=True`` with a ``generator``: DataLoader's own sampler,
    ``RandomSampler(dataset, generator=generator)``, whose permutation the loader lists
    at each epoch (NOTE [ Seeds as DataLoader draws them ]); ``set_epoch`` is
    ``loader.set_epoch``."""

    def __init__(self, loader: Any, generator: torch.Generator) -> None:
        super().__init__(loader.dataset, generator=generator)
        self._loader = weakref.proxy(loader)

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)


class _Batches(torch.utils.data.BatchSampler):
    """``loader.batch_sampler``: DataLoader's ``BatchSampler(sampler, batch_size,
    drop_last)``; its length is ``len(loader)`` and, over stoker's own order, it iterates
    this rank's batches of the epoch the next iterator runs (other samplers are batched
    as BatchSampler batches them)."""

    def __init__(self, loader: Any, sampler: Any) -> None:
        # BatchSampler's own checks would refuse batch_size=None; the attributes are its
        self.sampler = sampler
        self.batch_size = loader.batch_size
        self.drop_last = loader.drop_last
        self._loader = weakref.proxy(loader)

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    def __len__(self) -> int:
        # the loader's own len(), not a subclass's (YOLO's __len__ is this one's)
        loader = self._loader
        loader._follow_len()
        return int(loader._core.num_batches(*loader._world()))

    def __iter__(self) -> Iterator[List[int]]:
        if not isinstance(self.sampler, _Order):
            yield from torch.utils.data.BatchSampler.__iter__(self)
            return
        indices, ends = _epoch_batches(self._loader)
        start = 0
        for end in ends.tolist():
            yield indices[start:end].tolist()
            start = end


def _epoch_batches(loader: Any) -> Tuple[np.ndarray, np.ndarray]:
    """(indices, batch ends) of this rank's next epoch in stoker's own order."""
    from . import _core

    p = loader.plan
    shards = p.source.epoch_shards(p.dataset)  # a TypeError where the order has no indices
    rank, world = loader._world()
    return _core.epoch_batches(shards, loader._order_options, loader.epoch, rank, world)


def samplers(loader: Any, generator_order: bool) -> Tuple[Any, Any]:
    """(loader.sampler, loader.batch_sampler), DataLoader's objects (DataLoader's
    attributes that subclasses and frameworks use): the user's sampler (or batch sampler)
    as given; else RandomSampler / SequentialSampler in type, over stoker's order, with
    ``set_epoch``. ``batch_sampler`` is None where DataLoader's is (batch_size=None)."""
    p = loader.plan
    s = p.sampling
    if s.bulk:  # DataLoader's: the BatchSampler is its sampler, batch_sampler None
        return s.batch_sampler, None
    if s.batch_sampler is not None:
        return _SequentialOrder(loader), s.batch_sampler
    if s.sampler is not None:
        sampler = s.sampler
    elif generator_order:
        sampler = _GeneratorOrder(loader, loader.generator)
    elif not p.source.indexed:  # a stream's own order
        sampler = _StreamOrder(loader)
    elif s.shuffle:
        sampler = _ShuffledOrder(loader)
    else:
        sampler = _SequentialOrder(loader)
    if s.unbatched:
        return sampler, None
    return sampler, _Batches(loader, sampler)


# -- YOLO's InfiniteDataLoader -----------------------------------------------------------------

def repeating(loader: Any) -> bool:
    """Whether a subclass replaced ``batch_sampler`` after construction by a wrapper that
    repeats it (YOLO's ``InfiniteDataLoader``: ``object.__setattr__(self,
    "batch_sampler", _RepeatSampler(self.batch_sampler))``, whose iteration is the
    original's, epoch after epoch, without end)."""
    now = loader.__dict__.get("batch_sampler")
    own = loader.__dict__.get("_own_batch_sampler")
    if now is own or now is None:
        return False
    if getattr(now, "sampler", None) is own and own is not None:
        return True
    raise ValueError(f"batch_sampler was replaced after the loader was made (by "
                     f"{type(now).__name__}): stoker plans batches from the arguments given "
                     "(as DataLoader refuses to set it): make a new loader with "
                     "batch_sampler=... (a wrapper whose .sampler is the loader's own batch "
                     "sampler repeats its epochs, as YOLO's InfiniteDataLoader)")


class Repeating:
    """The iterator of a loader whose batch sampler repeats (repeating()): epoch after
    epoch of the loader's own iterators, without end, as DataLoader's iterator over
    ``_RepeatSampler`` runs; ``set_epoch`` between them applies to the next."""

    def __init__(self, loader: Any, epoch_iter: Any) -> None:
        self._loader = loader
        self._epoch_iter = epoch_iter
        self._it: Any = None
        self._started = False

    def __iter__(self) -> "Repeating":
        return self

    def __next__(self) -> Any:
        for _ in range(2):
            if self._it is None:
                # one iterator: DataLoader draws its base seed once, at its start
                self._it = self._epoch_iter(base_draw=not self._started)
                self._started = True
            try:
                return next(self._it)
            except StopIteration:
                self._it = None
        raise StopIteration  # an epoch with no batch: nothing to repeat

    @property
    def _workers(self) -> List[Any]:
        return [] if self._it is None else self._it._workers

    def _shutdown_workers(self) -> None:
        self.close()

    def close(self) -> None:
        if self._it is not None:
            self._it.close()
            self._it = None


# -- functions bound as Loader methods ---------------------------------------------------------

def loader_iter(self: Any) -> Any:
    """``iter(loader)``: one epoch's iterator, or epoch after epoch for a batch sampler a
    subclass made repeat (YOLO's InfiniteDataLoader: repeating())."""
    if repeating(self):
        return Repeating(self, self._epoch_iter)
    return self._epoch_iter()


def get_iterator(self: Any) -> Any:
    """DataLoader's name for a new iterator (YOLO's InfiniteDataLoader.reset calls it): the
    loader's own, not a subclass's ``__iter__``."""
    return loader_iter(self)


def follow_len(self: Any) -> None:
    """DataLoader reads len(dataset) at every len() and iter(): a map-style dataset
    that grew or shrank since is planned and built again (between epochs: a running
    epoch keeps its order), at the epoch the loader was at."""
    if not self.plan.source.follows_len or self._user_sampler is not None:
        return
    try:
        n = len(self.dataset)
    except TypeError:
        return
    if n == self._built_len:
        return
    running = self._live_iter() if self._live_iter is not None else None
    if running is not None and len(running) > 0:
        return
    if self._pending_resume() is not None:
        raise ValueError(f"the dataset has {n} samples now, {self._built_len} when this "
                         "loader was made and its state loaded: a resume continues the "
                         "order of the dataset it was saved with")
    _rebuild(self)


# -- DataLoader's attribute protocol ----------------------------------------------------------

_GIVEN = ("worker_init_fn", "generator", "prefetch_factor", "persistent_workers",
          "multiprocessing_context", "pin_memory_device", "in_order")


def set_attributes(loader: Any, p: Any, arguments: Any) -> None:
    """DataLoader's attributes, as DataLoader sets them: frameworks and subclasses (YOLO's
    InfiniteDataLoader, Lightning, accelerate) read them."""
    s = p.sampling
    loader.batch_size = None if s.unbatched else s.batch_size
    loader.timeout = p.timeout
    loader.drop_last = s.drop_last
    workers = arguments["num_workers"]
    loader.num_workers = 0 if workers is None else int(workers)
    for name in _GIVEN:
        setattr(loader, name, arguments[name])
    if arguments["collate_fn"] is not None:
        loader.collate_fn = arguments["collate_fn"]
    elif p.source.reads_python:
        # a torch dataset batched natively answers DataLoader's default, the function whose
        # batches native batching gives (NOTE [ Batching Python outputs ] in
        # stoker/_stage/collate.py): code that calls loader.collate_fn(samples), or makes
        # another loader with it, gets DataLoader's batches (a stoker dataset's batches are
        # stoker's own layout, not default_collate's: None there)
        utils = torch.utils.data
        loader.collate_fn = utils.default_convert if s.unbatched else utils.default_collate
    # what follow_hooks compares the attributes with at each iter()
    loader._hooks = (loader.collate_fn, loader.worker_init_fn)
    loader._user_sampler = s.batch_sampler if s.batch_sampler is not None else s.sampler


def attach_samplers(loader: Any, p: Any, listed: Any) -> Any:
    """Sets ``loader.batch_sampler`` (DataLoader's object) and, where a user's sampler (or
    a generator's permutation) gives the order, ``loader._samplers``, which lists it into
    the C++ order each epoch (stoker/_samplers.py). Returns ``loader.sampler``'s value."""
    from ._samplers import UserSampler
    from ._stage.sources import MapStyleSource

    s = p.sampling
    sampler, batch_sampler = samplers(loader, s.generator is not None)
    loader.batch_sampler = loader._own_batch_sampler = batch_sampler
    if listed is not None:
        # each listing first draws DataLoader's base seed from the generator, as
        # DataLoader's iterator does before its sampler (NOTE [ Seeds as DataLoader draws
        # them ])
        generator = loader.generator
        draw = None if generator is None else (lambda g=generator: _draw(g))
        loader._samplers = UserSampler(
            sampler if s.generator is not None else loader._user_sampler,
            s.batch_sampler is not None, s.batch_size or 1, s.drop_last, len(p.dataset),
            listed, indices_only=p.source.sampler_indices_only, permutation=s.generator is not None,
            draw=draw)
        stage = loader._stage
        if stage is not None and isinstance(getattr(stage, "source", None), MapStyleSource):
            keys = loader._samplers.keys
            loader._samplers.on_keys = lambda: stage.use_keys(keys)
    return sampler


class DataLoaderAttributes:
    """DataLoader's attribute protocol, which Loader keeps: the attributes frameworks read
    by name (Lightning's _is_dataloader_shuffled reads batch_sampler directly once `sampler`
    exists; accelerate and transformers use getattr), answered as DataLoader answers them,
    never by raising. `sampler` and `batch_sampler` are DataLoader's objects (the user's, or
    a RandomSampler / SequentialSampler and a BatchSampler over stoker's order, with
    set_epoch: attach_samplers); the rest are set by set_attributes."""

    batch_sampler: Any = None
    collate_fn: Any = None
    _iterator: Any = None  # DataLoader's persistent iterator: a stoker loader keeps none
    # an IterableDataset's len(loader), once asked: an iterator that yields more warns,
    # as DataLoader's (NOTE [ IterableDataset and __len__ ] in torch/utils/data/dataloader.py)
    _iterable_len: Optional[int] = None
    plan: Any

    # DataLoader is Generic[T_co]: annotations such as ``Loader[List[Tensor]]`` (or
    # ``DataLoader[...]`` where a Loader stands in for DataLoader) are valid, as list[int].
    __class_getitem__ = classmethod(types.GenericAlias)

    # DataLoader reads len(dataset) at every len() and iter()
    _follow_len = follow_len

    # What the loader reads, as DataLoader refuses to change it after __init__ (the plan,
    # the C++ order and the stage were made from it): a new loader takes new values.
    _FIXED = frozenset(("batch_size", "batch_sampler", "sampler", "drop_last", "dataset",
                        "persistent_workers"))
    _initialized = False

    def __setattr__(self, name: str, value: Any) -> None:
        if self._initialized and name in DataLoaderAttributes._FIXED:
            raise ValueError(f"{name} attribute should not be set after "
                             f"{type(self).__name__} is initialized (as DataLoader's): "
                             "make a new loader")
        object.__setattr__(self, name, value)

    @property
    def _auto_collation(self) -> bool:
        """DataLoader's name: samples are batched (False with batch_size=None)."""
        return not self.plan.sampling.unbatched


def refuse_shifted_labels_under_trainer(frame: Any) -> None:
    """A token loader with labels="shifted" iterated by transformers' Trainer (a few frames
    up from `frame`): refused, the model would shift the labels again."""
    for _ in range(6):
        if frame is None:
            return
        if frame.f_globals.get("__name__") == "transformers.trainer":
            raise ValueError(
                "this token loader gives labels shifted by one (labels='shifted', nanoGPT's "
                "x, y), and transformers' Trainer passes them to a model that shifts them "
                "again: it would train on token t+2. Pass labels='unshifted' (HF's "
                "convention: labels = input_ids, -100 where no loss; docs/tokens.md)")
        frame = frame.f_back
