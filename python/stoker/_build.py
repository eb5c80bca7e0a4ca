"""build(plan): a loader's running parts from its plan (NOTE [ Loader plan ] in
stoker/_plan.py). The plan's source builds its producer and its running half
(stoker/_sources/); the wiring they share is here: the C++ producer's RecordOptions, the
core, the Python stage and its hand-off, the device delivery."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import torch

from . import _cache, _core
from . import _loader_args as args
from ._plan_parts import LoaderPlan, Sampling

__all__ = ["Parts", "build", "chunk_samples", "listed_orders", "open_cache", "wire"]


class Parts(NamedTuple):
    """What build() made: the Loader keeps them."""

    producer: Any  # a _core.BatchProducer
    core: Any  # _core.LoaderCore
    stage: Any  # _stage.stage.PythonStage or None
    mix: Any  # a mixture's MixRun (stoker/mix.py), else None
    device: torch.device  # where batches are (cpu for the host fake)
    stream_device: Optional[torch.device]  # the CUDA device whose stream a batch joins
    pin_memory: bool
    listed: Any  # _core.ListedOrders of a user's sampler, else None
    cache: Any = None  # _core.DecodedCache (cache="decoded")
    # the running half of the dataset's source (stoker/_sources/base.py's Running): its
    # per-epoch hook, its identity, its parts of the state and of the stats
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


def listed_orders(s: Sampling) -> Any:
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
    """The running parts of plan `p` (NOTE [ Loader plan ]): its source builds them
    (stoker/_sources/), with the wiring below. `world_size` is the world now (a mixture's
    rows per step until the first iter() says otherwise); `open_device` stands in for the
    CUDA driver (tests: the host fake)."""
    return p.source.build(p, world_size, open_device)


def open_cache(p: LoaderPlan) -> Any:
    """The ``_core.DecodedCache`` of the plan's ``cache=`` (None without one; a service's
    actors keep their own)."""
    records = p.records if p.records is not None else \
        p.stage.records if p.stage is not None else None
    wanted = records.cache if records is not None else None
    if wanted is None or p.service is not None:
        return None
    return _cache.open_cache(wanted, p.dataset, records.verify)


def wire(p: LoaderPlan, producer: Any, reader: Any, running: Any, *, listed: Any = None,
         cache: Any = None, mix: Any = None,
         open_device: Optional[Callable[[int], Any]] = None) -> Parts:
    """The core over `producer`, the Python stage (its samples from `reader`, a
    ``_stage.sources`` reader, or None), the hand-off and the device delivery: the parts
    every source but a stream's has in common. `running` is the source's running half."""
    if p.service is not None:  # NOTE [ Disaggregated loading ] in stoker/service/__init__.py
        from .service.stage import service_parts

        core, stage = service_parts(p, producer, mix)
        return Parts(producer, core, stage, mix, torch.device("cpu"), None, False, listed,
                     source=running)
    s, t = p.sampling, p.settings
    stage = None
    if p.stage is not None:
        from ._stage.stage import PythonStage

        st = p.stage
        workers = t.num_threads if st.num_workers is None else st.num_workers
        stage = PythonStage(reader, map_fn=st.map, batch_map=st.batch_map,
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
    # batch memory that worker processes write rows into (NOTE [ Direct rows ] in
    # _stage/direct.py), unless it is page-locked
    if stage is not None and stage.needs_handoff and not (pin and api is not None) and \
            (getattr(stage, "processes", False) or getattr(stage, "auto", False)):
        options.host_memory = _core.shared_memory()
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
                 stream_device, pin, listed, cache, running)

