"""build(plan): the one place that wires a loader's running parts from its plan (NOTE
[ Loader plan ] in stoker/_plan.py): the C++ producer with its one RecordOptions or token
options, the core, the Python stage and its hand-off, the device delivery."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import torch

from . import _cache, _core
from . import _loader_args as args
from ._plan import LoaderPlan, RecordPlan, Sampling
from .mix import MixRun
from .ops import _specs

__all__ = ["Parts", "build", "chunk_samples", "record_options"]


class Parts(NamedTuple):
    """What build() made: the Loader keeps them."""

    producer: Any  # a _core.BatchProducer
    core: Any  # _core.LoaderCore
    stage: Any  # _stage.stage.PythonStage or None
    mix: Optional[MixRun]
    device: torch.device  # where batches are (cpu for the host fake)
    stream_device: Optional[torch.device]  # the CUDA device whose stream a batch joins
    pin_memory: bool
    listed: Any  # _core.ListedOrders of a user's sampler, else None
    cache: Any = None  # _core.DecodedCache (cache="decoded")
    # the running half of the dataset's source (stoker/_sources/): its identity and its
    # parts of the state; None for the kinds not yet behind a source class
    source: Any = None


def chunk_samples(batch_size: int, threads: int, processes: bool = False) -> int:
    """Samples per chunk of the Python stage: about four chunks per thread in a batch, so
    that the first batch is ready after about 1/T of its work, while a claim (one C++
    call) stays rare. With process workers, as many chunks in a batch as workers: a chunk
    costs a round trip to its worker (two messages, two thread switches), which a handful
    of samples does not amortise, and the second stage thread of each worker keeps it
    busy meanwhile."""
    per = 1 if processes else 4
    return max(1, -(-int(batch_size) // (per * max(1, int(threads)))))


def record_options(r: RecordPlan, sampling: Sampling, threads_hint: int = 0,
                   listed: Any = None, cache: Any = None) -> Any:
    """A RecordPlan as the ``_core.RecordOptions`` its producer takes (`cache`: the
    ``_core.DecodedCache`` build() opened for ``r.cache``)."""
    return _core.RecordOptions(
        sampler=sampler_options(sampling, listed),
        skip_errors=r.skip_errors,
        images={name: _core.ImageFieldSpec(layout, pixels) for name, layout, pixels in r.images},
        transforms=[_core.TransformSpec(list(g.fields), _specs(list(g.ops)),
                                        [_core.TargetSpec(*t) for t in g.targets])
                    for g in r.groups],
        threads_hint=threads_hint, handoff=r.handoff, pad_values=dict(r.pad_values),
        mix=None if r.batch_mix is None else r.batch_mix.options(), verify=r.verify,
        cache=cache, **r.media.options())


def sampler_options(s: Sampling, listed: Any = None) -> Any:
    return _core.SamplerOptions(batch_size=s.batch_size or 1, shuffle=s.shuffle,
                                seed=s.seed64, drop_last=s.drop_last,
                                even_batches=s.even_batches, shard_window=s.shard_window or 0,
                                listed=listed)


def _listed(s: Sampling) -> Any:
    """The C++ side of a user's sampler (NOTE [ User samplers ]), with its len() as the
    length of an epoch until the first is listed; None without one."""
    if s.generator is not None:  # a permutation per epoch, batched and split by the loader
        return _core.ListedOrders(permutations=True)
    user = s.batch_sampler if s.batch_sampler is not None else s.sampler
    if user is None:
        return None
    listed = _core.ListedOrders()
    try:
        n = len(user)
    except TypeError:
        n = 0
    if s.batch_sampler is not None:
        listed.set_hint(n, n * int(getattr(user, "batch_size", 1) or 1))
    else:
        b = s.batch_size or 1
        listed.set_hint(n // b if s.drop_last else -(-n // b), n)
    return listed


def build(p: LoaderPlan, world_size: int,
          open_device: Optional[Callable[[int], Any]] = None) -> Parts:
    """The running parts of plan `p` (NOTE [ Loader plan ]). `world_size` is the world
    now (a mixture's rows per step until the first iter() says otherwise); `open_device`
    stands in for the CUDA driver (tests: the host fake)."""
    from ._stage.sources import DatasetSource, MapStyleSource
    from ._stage.stage import PythonStage

    s, t = p.sampling, p.settings
    mix: Optional[MixRun] = None
    stage = None
    listed = _listed(s)
    if p.source == "iterable":  # NOTE [ Iterable datasets ]: rows through the core
        from ._sources.iterable import IterableSource

        producer, core, stage, rows, pin = IterableSource.build(p, open_device)
        return Parts(producer, core, stage, None, torch.device("cpu"), None, pin, None,
                     source=rows)
    records = p.records if p.records is not None else \
        p.stage.records if p.stage is not None else None
    wanted = records.cache if records is not None else None
    if p.service is not None:
        wanted = None  # the service's actors read and decode: their nodes keep the cache
    cache = None if wanted is None else _cache.open_cache(wanted, p.dataset, records.verify)
    if p.source == "token mixture":
        mix = MixRun(p.dataset, tokens=True, record_options=None, batch_size=s.batch_size,
                     shuffle=s.shuffle, seed=s.seed, drop_last=s.drop_last,
                     shard_window=None, world_size=world_size, token_options=dict(
                         {k: v for k, v in (p.tokens or {}).items()}))
        producer = mix.producer
    elif p.source == "tokens":
        producer = _core.TokenProducer(p.dataset._source, **(p.tokens or {}))
    elif p.source == "mixture":
        assert p.records is not None
        mix = MixRun(p.dataset, tokens=False,
                     record_options=record_options(p.records, s, t.num_threads),
                     batch_size=s.batch_size, shuffle=s.shuffle, seed=s.seed,
                     drop_last=s.drop_last, shard_window=s.shard_window,
                     world_size=world_size, token_options={})
        producer = mix.producer
    elif p.source == "map-style":
        producer = _core.PythonProducer(len(p.dataset), s.batch_size or 1, s.shuffle,
                                        s.seed64, s.drop_last, s.even_batches, listed=listed)
    elif p.producer == "PythonProducer":  # records through map / collate_fn
        producer = _core.PythonProducer(p.dataset._core, s.batch_size or 1, s.shuffle,
                                        s.seed64, s.drop_last, s.even_batches,
                                        s.shard_window or 0, listed=listed)
    else:
        assert p.records is not None
        producer = _core.RecordProducer(p.dataset._core,
                                        record_options(p.records, s, t.num_threads, listed,
                                                       cache))
    if p.service is not None:  # NOTE [ Disaggregated loading ] in stoker/service/__init__.py
        from .service.stage import service_parts

        core, stage = service_parts(p, producer, mix)
        return Parts(producer, core, stage, mix, torch.device("cpu"), None, False, listed)
    if p.stage is not None:
        st = p.stage
        if st.fetch == "map-style":
            source: Any = MapStyleSource(p.dataset, st.names)
        elif st.fetch == "records":
            assert st.records is not None
            source = DatasetSource(p.dataset, record_options(st.records, s, cache=cache))
        else:
            source = None
        workers = t.num_threads if st.num_workers is None else st.num_workers
        stage = PythonStage(source, map_fn=st.map, batch_map=st.batch_map,
                            collate_fn=st.collate_fn, map_fields=st.map_fields, seed=s.seed,
                            skip=p.on_error == "skip", threads=max(1, workers),
                            batch_map_on_consumer=st.batch_map_on_consumer,
                            workers=st.workers, nchw_views=p.delivery.nchw_views,
                            inline=workers == 0, worker_init_fn=st.worker_init_fn,
                            persistent_workers=st.persistent_workers,
                            unbatched=st.unbatched)

    options = _core.LoaderOptions()
    options.num_threads = t.num_threads
    options.prefetch = t.prefetch
    options.auto_threads = t.auto_threads
    options.auto_prefetch = t.auto_prefetch
    options.max_memory = t.max_memory
    options.stall_warning = t.stall_warning
    options.slow_first_batch_ms = int(args.SLOW_FIRST_BATCH_SECONDS * 1000)
    options.prefetch_next_epoch = p.prefetch_next_epoch
    target, pin, api = args.resolve_device(torch.device(p.delivery.device),
                                           p.delivery.pin_memory, open_device,
                                           p.delivery.pin_device)
    if pin and api is not None:
        options.host_memory = _core.pinned_memory(api)
    if target.type == "cuda":
        ahead = args.AUTO_DEVICE_PREFETCH if t.auto_prefetch else t.prefetch
        options.delivery = _core.device_delivery(api, ahead)
    handoff = None
    if stage is not None and stage.needs_handoff:
        per_batch = s.batch_size or int(getattr(s.batch_sampler, "batch_size", 1) or 1)
        handoff = _core.PythonHandoff(
            chunk_samples(per_batch, stage.threads, stage.processes), per_batch)
        options.finisher = handoff
        stage.batch_size = per_batch
    fake = api is not None and api.fake  # the host fake's "device" memory is host memory
    core = _core.LoaderCore(producer, options)
    stream_device = target if target.type == "cuda" and not fake else None
    if handoff is not None:
        handoff.bind(core)
        stage.attach(handoff)
        stage.side_device = stream_device
    return Parts(producer, core, stage, mix, torch.device("cpu") if fake else target,
                 stream_device, pin, listed, cache)

