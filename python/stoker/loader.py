"""The loader: :class:`Loader`.

The work happens in the C++ loader core (``csrc/pipeline/loader_core.h``): it owns the
stream of epochs, the worker threads, the batch ring, the batch memory and the device copy.
A Loader is planned and built by ``_plan`` (NOTE [ Loader plan ]: every argument check,
then the one place that wires the parts); this module keeps iteration and wraps batches as
tensors. Its resume state is a part of its own, ``_loader_state.Resume`` (with the state's
format and checks), and so are its counters, ``_loader_stats.Counters``.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import torch

from . import _build, _core, _dropin, _follow, _plan
from . import _loader_args as args
from . import _loader_state as state_mod
from ._iterator import LoaderIter
from ._loader_args import check_int
from ._loader_stats import Counters
from ._samplers import UserSampler
from ._sources.record_plan import sampler_options
from .mix import MixRun
from .ops import Op

__all__ = ["Loader"]

# Loaders that may have threads running, stopped before interpreter teardown.
_live_loaders: "weakref.WeakSet[Loader]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for loader in list(_live_loaders):
        loader.close()


class Loader(_dropin.DataLoaderAttributes):
    """Batches of a :class:`stoker.Dataset` as dicts of ``torch.Tensor``.

    A drop-in for ``torch.utils.data.DataLoader`` over stoker datasets: C++ worker threads
    read, verify, decode and transform samples straight into batch buffers, and each batch
    reaches Python without a copy (DLPack). Example::

        ds = stoker.Dataset("out/train")
        loader = stoker.Loader(ds, batch_size=256, shuffle=True, seed=0,
                               transforms={"image": [stoker.ops.RandomResizedCrop(224),
                                                     stoker.ops.RandomHorizontalFlip()]})
        for epoch in range(10):
            loader.set_epoch(epoch)
            for batch in loader:   # {"image": uint8[256, 3, 224, 224], "label": int64[256]}
                ...

    Guarantees:
      * ``len(loader)`` batches per epoch, always: ``ceil(n / batch_size)`` (``floor`` with
        ``drop_last``) where n is this rank's share; never dependent on ``num_threads``.
      * The same (data, seed, shard_window, epoch, rank, world_size, batch_size, drop_last)
        gives the same batches, bit for bit, for any ``num_threads`` and ``prefetch``.
      * ``state_dict()`` mid-epoch, then ``load_state_dict()`` on a new loader (any thread
        count, any rank, any world size): the next iteration yields exactly the samples not
        yet yielded by the job.
      * A bad sample raises :class:`stoker.DataError` naming the shard file and record in
        the iterating thread, when its batch is reached (or, with ``on_error="skip"``, is
        replaced by the next valid sample, counted in ``stats()`` and reported by a warning).

    Args:
        dataset: a :class:`stoker.Dataset` or a path to one; or any map-style dataset
            (a ``torch.utils.data.Dataset``, any object with ``__len__`` and
            ``__getitem__``), whose items the loader's Python stage fetches and batches
            (docs/python.md).
        batch_size: samples per batch (1 by default, as DataLoader's); None: each sample
            alone, unbatched (DataLoader's ``default_convert``).
        shuffle: a new permutation each epoch, from (seed, epoch); sequential if False
            (the default). The permutation is stoker's (a keyed Feistel permutation: the
            same for any worker count, resumable), not the order of DataLoader's
            ``RandomSampler`` unless ``generator`` is given.
        sampler: as DataLoader's: any ``torch.utils.data.Sampler`` (``WeightedRandomSampler``,
            ``SubsetRandomSampler``, ``DistributedSampler``, your own), iterated once per
            epoch at ``iter()`` (``set_epoch`` is passed on to it), its indices read ahead
            in its order; items that are not indices go to a map-style dataset's
            ``__getitem__`` as they are. Exclusive with ``shuffle``; the sampler decides
            what each rank reads (no ``rank``/``world_size``). ``state_dict()`` resumes
            exactly when the sampler has ``state_dict()`` or draws only from random
            generators, and says why not otherwise (docs/python.md).
        batch_sampler: as DataLoader's: lists of indices, one batch each (any size:
            bucketing); exclusive with ``batch_size``, ``shuffle``, ``sampler`` and
            ``drop_last``.
        num_workers: as DataLoader's, the workers that run your Python per sample (a
            map-style dataset's ``__getitem__``, ``map``, ``collate_fn``): threads, or
            processes (``python_workers``); 0 runs that code in the loop's thread, inside
            ``next()``. Given, it is the count, never tuned down; a map-style dataset's
            workers are then processes from the first batch, as DataLoader's (each
            sample's ``random``/``numpy``/torch generators seeded from (seed, epoch,
            index)), unless ``python_workers`` says otherwise, and so are an
            ``IterableDataset``'s. None (the default): as many as the cores this rank may
            use, tuned online. With no Python per sample, it sets the C++ worker threads
            (``num_threads``). More than the cores available warns, as DataLoader does.
        timeout: as DataLoader's: seconds ``next()`` waits for a batch before it raises;
            0 (the default) waits as long as it takes.
        worker_init_fn: as DataLoader's: called with the worker's id in each worker of the
            Python stage (thread or process) when it starts, where
            ``torch.utils.data.get_worker_info()`` answers (again at each epoch unless
            ``persistent_workers``). A loader with no Python per sample (a stoker dataset
            without ``map``/``collate_fn``, ``batch_map`` alone, token batches, a mixture)
            has no such workers: it is refused there, with what to use.
        multiprocessing_context: as DataLoader's, how worker processes start: None or
            ``"fork"`` (stoker's worker processes fork: the dataset is inherited, never
            pickled). ``"spawn"`` and ``"forkserver"`` are refused with
            ``python_workers="process"`` and keep ``"auto"`` on threads. Where the workers
            are threads (``python_workers="thread"``, no Python per sample) nothing
            forks; with ``num_workers=0``, refused as by DataLoader.
        generator: as DataLoader's: a ``torch.Generator``. With ``shuffle=True`` each
            epoch's permutation is ``RandomSampler(dataset, generator=generator)``'s, drawn
            from it as DataLoader's iterator draws it (the same generator state, DataLoader's
            batches); the loader's seed for the transforms is its ``initial_seed()``.
        prefetch_factor: as DataLoader's: batches in flight are ``prefetch_factor *
            num_workers`` (needs ``num_workers`` > 0). None (the default): with
            ``num_workers`` given and Python per sample, twice ``num_workers``
            (DataLoader's factor of 2); otherwise ``prefetch`` decides, which also sets the
            count directly.
        persistent_workers: as DataLoader's: False (the default) runs ``worker_init_fn``
            again in each worker at each epoch's start, where DataLoader makes its workers
            again; True runs it once per worker (True with ``num_workers=0`` is an error,
            as in DataLoader). stoker's worker threads and processes themselves persist
            either way (a worker process's copy of the dataset keeps what earlier epochs
            did to it).
        pin_memory_device: as DataLoader's, with ``pin_memory``: the CUDA device whose
            context pins host batches (``""``, the default: the current device).
        in_order: accepted, as DataLoader's: stoker always delivers batches in order.
        seed: the shuffling and augmentation seed: the same seed, the same batches. None
            (default): drawn from torch's default generator when the loader is made, so
            ``torch.manual_seed(s)`` selects the order and the draws, as it does
            DataLoader's; kept in ``state_dict()``, and a loader made with ``seed=None``
            takes the seed of the state it loads (NOTE [ Seeds as DataLoader draws them ]
            in ``stoker/_dropin.py``).
        shard_window: with ``shuffle=True``, shuffle N shards at a time instead of the
            whole dataset (None, the default: a global shuffle). Each epoch puts the shards
            in a random order, cuts it into windows of N shards, and yields each window's
            samples in a random order, window after window: any stretch of the epoch reads
            from N shards (two near a window boundary), so a remote dataset read through a
            cache of a few shards does not fetch every shard for every batch. Ranks,
            padding, ``len(loader)`` and resuming are as for the global shuffle. Example::

                ds = stoker.Dataset("s3://bucket/train", cache_limit="20GB")
                loader = stoker.Loader(ds, batch_size=256, shuffle=True, shard_window=8)

            A larger window mixes better and needs more shards at once. Needs
            ``shuffle=True`` (without shuffle the order is sequential, one shard at a
            time already); not for token batches.
        drop_last: drop the last incomplete batch (and the remainder of the rank split).
        num_threads: worker threads. None (default) = tuned online: a pool of as many
            threads as this rank may use (the cores available to this process divided by
            the processes of the job on this machine, ``LOCAL_WORLD_SIZE``), of which the
            loader keeps as many working as the training loop needs (docs/tuning.md).
        prefetch: batches in flight per iterator (at most 1024). None (default) = tuned
            online between 2 and 64 within ``max_memory``. ``stats()["num_threads"]`` and
            ``stats()["prefetch"]`` show the values in force; explicit values are never
            changed.
        max_memory: bytes (or a size such as ``"2GB"``) that the batches in flight of one
            iterator may take when ``prefetch`` is automatic; None = 1/16 of the machine's
            RAM divided by ``LOCAL_WORLD_SIZE``. At least one batch is always in flight.
            With an ``IterableDataset`` (read by ``num_workers`` Python workers, not the
            C++ core's), ``num_threads`` and ``max_memory`` are refused; ``prefetch``
            (or ``prefetch_factor``) bounds the batches filled ahead, and its workers read
            one row a worker beyond them (neither given: each worker reads up to 64 rows,
            or two batches, ahead).
        stall_warning: log a warning (logger ``"stoker"``) once, after warm-up, when the
            training loop waits for data more than this fraction of its time, naming the
            stage to fix; None or 0 = never. Default 0.2.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``: where batches are delivered.
        pin_memory: page-lock the batch buffers (through the current CUDA device); None =
            True when device is CUDA.
        rank, world_size: this process's share; None = from torch.distributed at each
            ``iter()`` and ``len()`` (so a loader made before ``init_process_group`` shards
            correctly), else 0 and 1. Every rank gets the same number of batches (the order
            wraps around to pad, as DistributedSampler does, unless drop_last). An
            ``IterableDataset`` is given to each rank as it is (DataLoader's rule: it splits
            itself by rank, as webdataset's ``split_by_node`` does), unless ``rank``,
            ``world_size`` or ``even_batches`` is given: stoker then splits its stream.
        transforms: ``{field: [op, ...]}`` with ops from :mod:`stoker.ops` (image fields).
            A key may be a tuple of fields that move together, with one set of random draws
            per sample: ``{("image", "mask", "boxes", "classes"): [...]}``; masks, boxes,
            keypoints and per-box rows follow the image's geometry (docs/augment.md).
        batch_transforms: ``[stoker.ops.MixUp(...), stoker.ops.CutMix(...)]``, run by the
            workers on each assembled batch; the integer label field comes as float32 soft
            labels ``(batch, num_classes)``.
        pad_values: ``{field: value}``: what pads a variable-length field's batches in
            place of 0 (``{"classes": -1}``, as 0 is a valid class id).
        box_rows: variable-length fields outside the transform group with boxes that are
            rows of its boxes: dropped with them, as in the group's key.
        as_stored: fields delivered as stored that a transform group would otherwise
            refuse to leave out: a variable-length field that is not per box, or a mask,
            boxes or keypoints field left unmoved knowingly (a detection dataset read for
            classification). Any other such field is a ``ValueError`` (docs/augment.md,
            "Whole groups").
        on_error: ``"raise"`` (default) or ``"skip"`` (with an ``IterableDataset``: rows
            whose ``map`` raised are left out; refused without ``map``).
        max_image_pixels: images whose header declares more pixels are refused.
        prefetch_next_epoch: start loading the next epoch's first batches while this
            epoch's last ones are handed out (NOTE [ Next-epoch prefetch ] in
            ``csrc/pipeline/loader_core.h``).
        image_layout: how image fields are delivered. None (default): in PyTorch's
            ``[N, C, H, W]`` shape; a field decoded ``"HWC"`` (``stoker.image()``'s default,
            what libjpeg-turbo writes) comes as that memory viewed with ``channels_last``
            strides, no copy, which channels-last training takes as is (``.contiguous()``
            makes a plain NCHW copy); a field of ``stoker.image(layout="CHW")`` comes
            contiguous. ``"CHW"``: decoded planar, contiguous ``[N, C, H, W]``. ``"HWC"``:
            ``[N, H, W, C]`` (the default of stoker 0.1.0).
        labels: token batches: ``"shifted"`` (default; ``labels[i]`` is the next token,
            nanoGPT's x, y) or ``"unshifted"`` (HuggingFace's: ``labels`` is ``input_ids``
            with -100 where no loss is taken, the model shifts; packed batches carry
            ``DataCollatorWithFlattening``'s keys), docs/tokens.md.
        seq_len: token batches (docs/tokens.md): rows of ``seq_len`` tokens,
            ``input_ids`` and ``labels`` ``[batch_size, seq_len]``.
        packing: with ``seq_len``: None (the default) for windows of the token stream;
            ``"concat"`` cuts the stream into rows; ``"document"`` places whole documents
            into rows where they fit. Both add ``position_ids``, ``cu_seqlens``,
            ``max_seqlen`` and ``loss_mask`` (FlashAttention's varlen layout).
        token_dtype: the dtype of ``input_ids`` and ``labels`` (``"int32"`` halves
            them).
        max_tokens: token batches of whole documents by length, as many rows as fit
            ``rows * width <= max_tokens`` (fairseq's ``batch_by_size``); ``batch_size``
            then caps the rows if given.
        even_batches: without ``drop_last``, pad every rank to the same number of samples
            by wrapping around (True, as DistributedSampler). False, for evaluation: no
            sample is repeated across ranks; every rank still yields ``len(loader)``
            batches, so a rank's last batch may be shorter (or empty), and gathering the
            results of all ranks gives exactly the dataset (windows or packed rows for
            token batches, a mixture's rows for a ``stoker.Mix``). False with
            ``drop_last=True`` is an error (drop_last already repeats nothing), and so is
            False with ``max_tokens=`` (budget batches are whole). None (default): True;
            given (True or False) with an ``IterableDataset``, stoker splits its stream
            across ranks (see ``rank``).
        map: ``fn(sample, rng) -> dict`` per sample, after the C++ read, decode and
            ``transforms``; ``rng`` is a ``numpy.random.Generator`` keyed by (seed, epoch,
            dataset index). The outputs are batched natively (docs/python.md).
        batch_map: ``fn(batch, rng) -> batch`` per batch, ahead of the loop; with a CUDA
            device it receives the batch on the device, after the copy.
        collate_fn: as ``DataLoader``'s: the list of samples (after ``map``) to any batch.
        num_workers: as ``DataLoader``'s: a map-style dataset's ``__getitem__`` runs in this
            many worker processes (their global random generators seeded per sample, so
            the same seed gives the same batches; a crash there fails the batch, not the
            loop), 0 in the loop's thread; over a stoker.Dataset without Python per sample,
            the C++ worker threads. None (default): stoker's choice (threads tuned online,
            processes when the Python is GIL-bound: ``python_workers``).
        generator: as ``DataLoader``'s: with ``shuffle=True``, each epoch's permutation is
            ``RandomSampler(dataset, generator=generator)``'s, drawn at that epoch's
            ``iter()`` (DataLoader's order for the same generator state; the state keeps
            it for an exact resume); ``generator.initial_seed()`` is the seed of the rest.
        map_fields: ``{key: stoker.ndarray(dtype, shape) | stoker.scalar(dtype) |
            stoker.blob() | object}``: how map's (or a map-style dataset's) outputs are
            batched; a leading ``None`` pads a variable first dimension. Keys not named
            follow the first sample.
        names: keys for a map-style dataset's tuple items (default 0, 1, ...).
        python_workers: where the Python stage's workers run ``map``, ``collate_fn`` and
            a map-style dataset's ``__getitem__``: ``"auto"`` (the default) starts on
            threads and moves the work to processes, at a batch boundary, once the threads
            are measured GIL-bound; ``"thread"`` or ``"process"`` fixes the choice
            (docs/python.md, "Threads or processes").
        cache: ``"decoded"``: decode each RGB image once per run. The first time a worker
            decodes an image its pixels are kept; later epochs crop, resize and augment from
            them and never decode it again (docs/cache.md). The cache lives in shared memory
            (``/dev/shm``, or ``STOKER_CACHE_DIR``, in a folder only this user can open),
            one copy for every process of the user on the node that reads the same dataset
            with the same cache arguments (ranks of a job), and goes when the last of them
            exits. Without ``cache_max_side`` every batch is
            bit-identical to the uncached loader's. ``stats()["cache"]`` counts hits,
            misses, bytes and the share of the dataset held. None (default): no cache.
        cache_max_side: keep each image reduced to this longer side (DCT-scaled while
            decoding, then resized): a smaller cache, and crops are resampled from the
            reduced copy, so batches differ from the uncached loader's (the same draws,
            sizes and target geometry; softer pixels where a crop needed more resolution
            than the copy has). None (default): pixels as decoded.
        cache_size: the cache's budget, honoured exactly (images that do not fit are
            decoded as without a cache): bytes, a size such as ``"8GB"``, or a share of the
            machine's RAM in (0, 1]; None = 1/4 of the RAM. Shared by the node's processes;
            with an explicit ``max_memory``, this process's share (cache_size over
            ``LOCAL_WORLD_SIZE``) counts in it.
        verify: ``"first"`` (default): a record's checksum is checked the first time this
            process reads it (a bit per record beside the shard's mapping), later reads skip
            the hash until the shard's file changes (it is stat'ed each epoch, and each
            second while batches are planned); shards of format version 1 are checked on
            every read. ``"always"``: on every read. ``"once"``: ``"first"`` for version-1
            shards too. Corruption is reported with the shard's path and the record either
            way (docs/storage.md, "What verify catches"). The decoded cache's entries are
            checked the same way.
        service: a :class:`stoker.RayService`: the pipeline (read, decode, transforms,
            map, collate) runs on its Ray actors, on any nodes, and this process takes
            the batches: the same batches as without it, each exactly once per epoch
            whatever actors die or join, and the same ``state_dict()`` (docs/service.md).
            ``num_threads`` is then each actor's (default: its ``cpus_per_actor``),
            ``prefetch`` the batches in flight for this loop (default: two parts per
            actor, within ``max_memory``); ``stats()["service"]`` has each actor's
            throughput, the transport time and the loop's wait.
        **options: token batches' further options, as docs/tokens.md describes them:
            ``stride``, ``pad_id``, ``ignore_index``, ``pack_fit``, ``pack_window``,
            ``overlong``, ``max_length``, ``pad_to_multiple_of``, ``attention_mask``,
            ``field``. Any other name is a ``TypeError``.

    Epochs: each iterator runs one epoch, fixed when it yields its first batch: the epoch
    given by ``set_epoch`` (or ``loader.sampler.set_epoch``), else the one after the last
    epoch run, so an ``iter()`` that yields nothing uses no epoch. An iterator started
    while another runs an epoch runs that same epoch, on its own, and ``set_epoch`` while
    an iterator runs applies to the next iterator (calling it with the running epoch, as
    frameworks do at the start of an epoch, changes nothing).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: Optional[int] = args.DEFAULT_BATCH_SIZE,
        shuffle: bool = False,
        # DataLoader's arguments, in DataLoader's order (NOTE [ DataLoader's arguments ])
        sampler: Optional[Any] = None,
        batch_sampler: Optional[Any] = None,
        num_workers: Optional[int] = None,
        collate_fn: Optional[Any] = None,
        pin_memory: Optional[bool] = None,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Any] = None,
        multiprocessing_context: Optional[Any] = None,
        generator: Optional[Any] = None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        # stoker's own
        seed: Optional[int] = None,
        num_threads: Optional[int] = None,
        prefetch: Optional[int] = None,
        device: Union[str, torch.device] = "cpu",
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        transforms: Optional[Mapping[Any, Sequence[Op]]] = None,
        on_error: str = "raise",
        max_image_pixels: int = args.DEFAULT_MAX_PIXELS,
        prefetch_next_epoch: bool = True,
        image_layout: Optional[str] = None,
        even_batches: Optional[bool] = None,
        seq_len: Optional[int] = None,
        packing: Optional[str] = None,
        token_dtype: str = "int64",
        max_tokens: Optional[int] = None,
        max_memory: Optional[Union[int, str]] = None,
        stall_warning: Optional[float] = args.DEFAULT_STALL_WARNING,
        shard_window: Optional[int] = None,
        labels: str = "shifted",
        batch_transforms: Optional[Sequence[Any]] = None,
        pad_values: Optional[Mapping[str, Any]] = None,
        map: Optional[Any] = None,
        batch_map: Optional[Any] = None,
        map_fields: Optional[Mapping[Any, Any]] = None,
        names: Optional[Sequence[Any]] = None,
        python_workers: str = "auto",
        box_rows: Optional[Sequence[str]] = None,
        as_stored: Optional[Sequence[str]] = None,
        cache: Optional[str] = None,
        cache_max_side: Optional[int] = None,
        cache_size: Optional[Union[int, float, str]] = None,
        verify: str = "first",
        service: Optional[Any] = None,
        **options: Any,
    ):
        # Declare, then build (NOTE [ Loader plan ] in stoker/_plan.py): every check first.
        arguments = {k: v for k, v in locals().items()
                     if k not in ("self", "dataset", "options", "__class__")}
        self.plan = _plan.plan(dataset, **arguments, **options)
        p = self.plan
        s = p.sampling
        self.dataset = p.dataset
        _dropin.set_attributes(self, p, arguments)  # DataLoader's, as DataLoader sets them
        self.shuffle = s.shuffle
        self.seed = int(s.seed)
        self.even_batches = s.even_batches
        self.shard_window: Optional[int] = s.shard_window
        self._rank, self._world_size = s.rank, s.world_size
        self.on_error = p.on_error
        self.prefetch_next_epoch = p.prefetch_next_epoch
        t = p.settings
        self.num_threads, self.auto_threads = t.num_threads, t.auto_threads
        self.prefetch, self.auto_prefetch = t.prefetch, t.auto_prefetch
        self.max_memory, self.stall_warning = t.max_memory, t.stall_warning
        self.image_layout = p.delivery.image_layout
        self.labels = p.labels
        self.transforms = {} if p.records is None and (p.stage is None or
                                                       p.stage.records is None) else \
            {g.fields if len(g.fields) > 1 else g.fields[0]: list(g.ops)
             for g in ((p.records or p.stage.records).groups) if g.ops}
        self._tokens = p.is_tokens
        self._nchw_views = p.delivery.nchw_views
        self._hf_lengths = p.delivery.hf_lengths
        # a subclass's _open_device stands in for the CUDA driver (tests: the host fake)
        opener = None if type(self)._open_device is Loader._open_device else self._open_device
        parts = _build.build(p, self._world()[1], opener)
        self._producer, self._core, self._stage = parts.producer, parts.core, parts.stage
        if self._stage is not None:  # (NOTE [ Stuck workers ] in stoker/_stage/stuck.py)
            weakref.finalize(self, self._stage.dropped)
        self._mix: Optional[MixRun] = parts.mix
        self.device, self._stream_device = parts.device, parts.stream_device
        self.pin_memory = parts.pin_memory
        # DataLoader's sampler and batch_sampler objects, a user's sampler listed per epoch
        self._order_options = sampler_options(s)  # loader.sampler iterates it
        self._samplers: Optional[UserSampler] = None
        sampler = _dropin.attach_samplers(self, p, parts.listed)
        self._cache = parts.cache
        self._source = parts.source  # its source's running half (stoker/_sources/base.py)
        # the parts owning the resume state and the counters (_loader_state, _loader_stats);
        # the world through a weak reference (a bound method would make a cycle, and a
        # dropped loader must end its workers at once, not at a collection)
        me = weakref.ref(self)
        self._resume = state_mod.Resume(self._core, self._producer, self._source, s,
                                        self._samplers, lambda: me()._world())
        self._counters = Counters(self._core, self._source, self._cache,
                                  self._stage if p.service is not None else None)
        self._pid = os.getpid()
        self._failed_iter: Optional[Any] = None  # NOTE [ After a failed batch ]
        self._live_iter: Optional[Any] = None  # the last iterator (weakly)
        self._built_len = len(p.dataset) if p.source.follows_len else None
        self._following: Any = None  # the remote fetcher following this loader
        self.sampler = sampler
        _live_loaders.add(self)
        self._initialized = True  # the attributes of _FIXED are set (__setattr__)

    # -- devices and ranks ------------------------------------------------------

    def _open_device(self, index: int) -> Any:
        """The device API for CUDA device `index` (tests substitute the host fake)."""
        return _core.cuda_device(index)

    def _world(self) -> Tuple[int, int]:
        """(rank, world_size) now: the explicit ones, else torch.distributed's, else 0/1."""
        return args.world(self._rank, self._world_size)

    @property
    def rank(self) -> int:
        return self._world()[0]

    @property
    def world_size(self) -> int:
        return self._world()[1]

    # -- epochs and length ----------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        self._follow_len()
        n = self._core.num_batches(*self._world())
        if self.plan.source.len_from_dataset:  # DataLoader's check of it (_LoaderIter)
            self._iterable_len = n
        return n

    @property
    def num_samples(self) -> int:
        """Samples per epoch for this rank (including wrap-around padding): a mixture's
        rows, token windows or packed rows for token batches."""
        return self._producer.rank_samples(*self._world())

    def skip(self, num_batches: int) -> "Loader":
        """The next iterator starts at batch ``num_batches`` of its epoch (the one
        ``set_epoch`` gave, else the next, or one ``set_epoch`` names after this call),
        without reading the batches before it, on every rank alike. Returns the loader, so
        it reads like accelerate's ``skip_first_batches``, which calls it for a stoker
        loader (NOTE [ skip_first_batches ] in ``stoker/_accelerate.py``)::

            for batch in loader.skip(resume_step):   # this epoch, from resume_step
                ...
            for batch in loader:                     # the next epoch, whole
                ...
        """
        num_batches = check_int("num_batches", num_batches, 0)
        self._core.skip(num_batches, *self._world())
        return self

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch the next iterator runs (its permutation and augmentations); the
        same as ``loader.sampler.set_epoch(epoch)``. Called with the epoch an iterator is
        running, it confirms it: the next iterator runs the one after. A pending resume
        from ``load_state_dict`` is kept when it is for this epoch; a pending ``skip(n)``
        applies to this epoch."""
        self._core.set_epoch(check_int("epoch", epoch, 0))
        if self._samplers is not None:  # a DistributedSampler's set_epoch, as frameworks call
            self._samplers.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next iterator will run. After a ``break`` out of epoch e this is
        e + 1, while ``state_dict()`` still says epoch e and the samples consumed: the
        rest of e is what a resume from that state continues; this loader starts e + 1."""
        return self._core.epoch

    # one epoch, or epoch after epoch (YOLO's InfiniteDataLoader): stoker/_dropin.py
    __iter__ = _dropin.loader_iter
    _get_iterator = _dropin.get_iterator

    def _epoch_iter(self, base_draw: bool = True) -> LoaderIter:
        if os.getpid() != self._pid:
            raise RuntimeError("this Loader was created in another process (before os.fork()); "
                               "create a new Loader in this process")
        if self._tokens and self.labels == "shifted":
            _dropin.refuse_shifted_labels_under_trainer(sys._getframe(1))
        self._follow_len()
        _follow.follow_hooks(self)
        rank, world = self._world()
        self._source.at_epoch(self, world)  # the source's per-epoch hook
        if self._samplers is not None:  # the sampler's order for the epoch, once
            self._samplers.list_epoch(self._core.epoch, base_draw)
        # NOTE [ After a failed batch ]: a batch that raised is consumed, and its iterator
        # goes on with the next one when asked, as DataLoader's does. A loop that leaves
        # on the error and starts a new iterator starts the next epoch, as after a break:
        # the failed iterator is closed here (the exception's traceback may keep it alive,
        # and a live unfinished iterator would make this one a second reader of its epoch).
        failed = self._failed_iter() if self._failed_iter is not None else None
        self._failed_iter = None
        if failed is not None:
            failed.close()
        if self._stage is not None and self._stage.start(self._core.epoch):
            self._core.drop_prefetch()  # it waits on stuck work (NOTE [ Stuck workers ])
        it = LoaderIter(self, self._core.iter(rank, world), (rank, world))
        self._live_iter = weakref.ref(it)
        return it

    # -- resume ---------------------------------------------------------------

    def state(self) -> state_mod.LoaderState:
        """``state_dict()`` as a typed :class:`LoaderState` (stoker/_loader_state.py)."""
        return self._resume.state()

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader stands, the same on every rank in lockstep: the epoch and the
        samples of it the whole job has consumed. ``load_state_dict`` on any rank, at any
        world size and thread count, continues with exactly the samples not yet yielded."""
        return self.state().to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from ``state_dict()`` (of any rank): the next iterator continues that
        epoch. The thread count, prefetch, rank and world size may differ; the data and
        sampling settings may not. Every field of the state is checked first."""
        _dropin.adopt_seed(self, state)  # a drawn seed (seed=None) takes the state's
        self._resume.load(state, sys._getframe(1))

    def _pending_resume(self) -> Optional[Tuple[int, int]]:
        """For a resume loaded and not started yet: (the world size that saved it, the
        batches the next iterator of this rank yields); else None. stoker.lightning
        reconciles Lightning's batch counter with it (NOTE [ Elastic resume under
        Lightning ] in stoker/lightning.py)."""
        return self._resume.pending()

    # -- lifetime: threads, with, pickling --------------------------------------

    def close(self) -> None:
        """Stops every worker thread of this loader now, ends its iterators, and drops a
        next-epoch prefetch. Batches already yielded stay valid, and the loader stays
        usable: the next ``iter()`` starts its workers again. ``with stoker.Loader(...)
        as loader:`` closes it at the end of the block. Returns within a few seconds
        whatever ``map`` is doing: worker processes are ended (SIGTERM, then SIGKILL), a
        thread stuck in your code is left behind (docs/python.md, "When your code
        fails")."""
        if os.getpid() == self._pid:
            self._core.close()
            if self._stage is not None:
                self._stage.stop()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> Dict[str, Any]:
        arguments = _follow.picklable_arguments(self)  # (a collate_fn assigned since too)
        return {"dataset": self.dataset, "args": arguments,
                "state": self.state_dict()}

    def __setstate__(self, d: Dict[str, Any]) -> None:
        self.__init__(d["dataset"], **d["args"])  # type: ignore[misc]
        self.load_state_dict(d["state"])

    # -- introspection --------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        return self._counters.stats()
    stats.__doc__ = Counters.stats.__doc__  # (stoker/_loader_stats.py)

    def _report_skipped(self) -> None:
        self._counters.end_of_epoch()  # skipped samples, a full cache

    def __repr__(self) -> str:
        window = "" if self.shard_window is None else f"shard_window={self.shard_window}, "
        return (f"stoker.Loader({self._producer.epoch_samples()} samples, "
                f"batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, {window}num_threads={self.num_threads}, "
                f"device={str(self.device)!r})")
