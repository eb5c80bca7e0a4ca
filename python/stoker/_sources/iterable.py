"""The source of an ``IterableDataset`` (NOTE [ Iterable datasets ] in
stoker/_stage/iterable.py): the plan's checks of its arguments, its part of the plan and
its wiring; its running half, :class:`IterableRunning`, is the dataset's
:class:`IterableRows` (which reads it for the Python stage and owns its identity and its
part of the state); the core owns its epochs, iterators, position and stats."""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch

from .. import _core, _dropin
from .. import _loader_args as args
from .._build import Parts
from .._plan_parts import Sampling, StagePlan
from .._stage.iterable import IterableRows
from .._stage.iterable_stage import IterableStage
from .base import Planned, Planning, Running, Source, describe_python

__all__ = ["IterableSource", "IterableCore", "IterableRunning"]


class IterableSource(Source):
    """An IterableDataset: DataLoader's rules for it, stoker's, and its stream."""

    kind = "iterable"
    reads_python = True
    indexed = False  # the stream's order: no sampler, no shuffle of indices
    len_from_dataset = True
    order_known_ahead = False  # a stream's end is known only once read
    threads_note = "1 (the rows' numbers; the workers read them)"

    def describe(self, dataset: Any) -> str:
        return describe_python(dataset)

    def ranks_note(self, sampling: Sampling) -> Optional[str]:
        return None if sampling.split_ranks else "none (each rank is given the dataset as it is)"

    def splits_ranks(self, given: Mapping[str, Any]) -> bool:
        return _dropin.splits_ranks(given)

    def plan(self, ctx: Planning) -> Planned:
        _dropin.check_rank_split(ctx.dataset, ctx.sampling)
        # its workers: threads, or processes (NOTE [ Iterable datasets in processes ])
        stage = StagePlan("iterable", ctx.map, ctx.batch_map, ctx.collate_fn,
                          ctx.a["map_fields"], None,
                          "process" if ctx.workers == "process" else "thread", False,
                          **ctx.stage_kw)
        return Planned(ctx.dataset, "IterableProducer (rows of iter(dataset) per worker)",
                       None, None, stage)

    @staticmethod
    def check(a: Mapping[str, Any], dataset: Any, given: Mapping[str, Any]) -> None:
        """The arguments `a` (`given`: those passed) that cannot work with `dataset`,
        refused with the reason (NOTE [ No argument ignored ] in stoker/_dropin.py)."""
        for name in ("sampler", "batch_sampler"):
            if a[name] is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                 f"{name} option, but got {name}={a[name]!r} (as DataLoader)")
        # an IterDataPipe takes shuffle=True into its shufflers (NOTE [ Iterable datasets ])
        if a["shuffle"] and not isinstance(dataset, torch.utils.data.IterDataPipe):
            raise ValueError("DataLoader with IterableDataset: expected unspecified shuffle "
                             f"option, but got shuffle={a['shuffle']!r} (as DataLoader): "
                             "shuffle in the dataset")
        if torch.device(a["device"]).type == "cuda":
            raise ValueError("an IterableDataset's batches are made in Python: use "
                             "device='cpu' (with pin_memory=True) and move them in the loop")
        for name in ("transforms", "batch_transforms", "pad_values", "names", "shard_window",
                     "image_layout"):
            if a[name] is not None:
                raise ValueError(f"{name}= applies to a stoker.Dataset (or a map-style "
                                 "dataset), not to an IterableDataset")
        for name, what in (("num_threads", "num_workers= sets its workers"),
                           ("max_memory", "prefetch= bounds the batches read ahead")):
            if given.get(name) is not None:
                raise ValueError(
                    f"{name}= applies to the C++ core's workers (a stoker.Dataset, a "
                    f"map-style dataset), and an IterableDataset is read by Python workers "
                    f"(processes or threads): {what}")
        if given.get("on_error") == "skip" and given.get("map") is None:
            raise ValueError(
                "on_error='skip' leaves out rows whose map= raised, and there is no map=: "
                "an IterableDataset's own error ends its iterator, with nothing after it to "
                "skip to. Handle the error inside the dataset's __iter__, or pass map=")

    def build(self, p: Any, world_size: int,
              open_device: Optional[Callable[[int], Any]]) -> Parts:
        """The parts of plan `p` (a LoaderPlan): the core over an IterableProducer, the
        stage filling its batches from the rows' readings."""
        s, st, t = p.sampling, p.stage, p.settings
        assert st is not None
        # one reader by default: the stream of num_workers=0, read ahead of the loop; more
        # workers shard the dataset by get_worker_info(), which changes the stream's order
        workers = 1 if st.num_workers is None else st.num_workers
        dataset = p.dataset
        given_window = any(p.arguments.get(k) is not None
                           for k in ("prefetch", "prefetch_factor"))
        if s.shuffle and isinstance(dataset, torch.utils.data.IterDataPipe):
            # DataLoader's: shuffle=True turns the DataPipe's shufflers on
            dataset = torch.utils.data.graph_settings.apply_shuffle_settings(dataset,
                                                                             shuffle=True)
        batch_size = 1 if st.unbatched else (s.batch_size or 1)
        rows = IterableRows(
            dataset, batch_size=batch_size, drop_last=s.drop_last,
            even_batches=s.even_batches, seed=s.seed, workers=workers,
            worker_init_fn=st.worker_init_fn, persistent_workers=st.persistent_workers,
            map_fn=st.map, timeout=p.timeout, generator=p.arguments.get("generator"),
            split_ranks=s.split_ranks,
            # the rows read ahead are bounded by a window the user set (prefetch= or
            # prefetch_factor=), not by the one num_workers implies: DataLoader's workers
            # each read their prefetch_factor batches ahead
            prefetch=t.prefetch if not t.auto_prefetch and given_window else None,
            skip_errors=p.on_error == "skip", processes=st.processes and workers > 0)
        stage = IterableStage(rows, batch_map=st.batch_map, collate_fn=st.collate_fn,
                              map_fields=st.map_fields, seed=s.seed, threads=1,
                              inline=workers == 0, unbatched=st.unbatched)
        producer = _core.IterableProducer(batch_size)
        options = _core.LoaderOptions()
        # the C++ side only numbers the rows of each batch, one thread per reading worker:
        # the stats and the stall verdict count the stream's workers (their map time is
        # the stage's busy time)
        options.num_threads = max(1, workers)
        options.auto_threads = False
        options.prefetch = t.prefetch
        options.auto_prefetch = t.auto_prefetch
        options.stall_warning = t.stall_warning
        options.slow_first_batch_ms = int(args.SLOW_FIRST_BATCH_SECONDS * 1000)
        options.prefetch_next_epoch = False  # a stream's end is known only once read
        _, pin, api = args.resolve_device(torch.device("cpu"), p.delivery.pin_memory,
                                          open_device, p.delivery.pin_device)
        if pin and api is not None:
            options.host_memory = _core.pinned_memory(api)
        handoff = _core.PythonHandoff(batch_size, batch_size)
        options.finisher = handoff
        stage.batch_size = batch_size
        core = _core.LoaderCore(producer, options)
        handoff.bind(core)
        stage.attach(handoff)
        rows.core = core
        return Parts(producer, IterableCore(core, rows), stage, None, torch.device("cpu"),
                     None, pin, None, source=IterableRunning(rows))


class IterableRunning(Running):
    """An IterableDataset as a loader reads it: its rows (``IterableRows``), which name
    the rows ``on_error="skip"`` left out."""

    def __init__(self, rows: IterableRows):
        super().__init__(rows.dataset, None)
        self.rows = rows

    def identity(self) -> Dict[str, Any]:
        return self.rows.identity()

    def state_parts(self) -> Dict[str, Any]:
        return self.rows.state_parts()

    def skipped_report(self, n: int) -> str:
        return self.rows.skipped_report(n)


class IterableCore:
    """The loader core of an IterableDataset, with the counts only its dataset knows:
    len() from its ``__len__`` (none: a TypeError, as DataLoader's), and each rank given
    the whole stream unless stoker splits it (NOTE [ Iterable datasets ])."""

    def __init__(self, core: Any, rows: IterableRows):
        self._c, self._rows = core, rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)

    def _world(self, rank: int, world: int) -> Tuple[int, int]:
        return (rank, world) if self._rows.split_ranks else (0, 1)

    def num_batches(self, rank: int, world: int) -> int:
        return self._rows.batches_from(0, self._world(rank, world)[1])

    def next_batches(self, rank: int, world: int) -> int:
        return self._rows.batches_from(self._c.state()[1], self._world(rank, world)[1])

    def iter(self, rank: int, world: int) -> "IterableIterator":
        return IterableIterator(self._c.iter(*self._world(rank, world)), self._rows)

    def skip(self, batches: int, rank: int, world: int) -> None:
        self._c.skip(batches, *self._world(rank, world))


class IterableIterator:
    """A core iterator whose batches left come from the dataset's length."""

    def __init__(self, it: Any, rows: IterableRows):
        self._it, self._rows = it, rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)

    @property
    def remaining(self) -> int:
        epoch, rank, world, offset, _ = self._it.key
        total = self._rows.batches_from(offset, world)
        if not self._it.claimed:
            return total
        yielded = _core.UNKNOWN_BATCHES - self._it.remaining
        return max(0, total - yielded)
