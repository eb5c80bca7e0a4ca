"""The source of an ``IterableDataset`` (NOTE [ Iterable datasets ] in
stoker/_stage/iterable.py): the plan's checks of its arguments and its wiring; its running
half, :class:`IterableStream`, stands in for the core and the Python stage and owns its
epochs, state, identity and stats."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Tuple

import torch

from .. import _loader_args as args
from .._stage.iterable import IterableStream

__all__ = ["IterableSource"]


class IterableSource:
    """An IterableDataset: DataLoader's rules for it, stoker's, and its stream."""

    kind = "iterable"

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
        if a["python_workers"] == "process":
            raise ValueError("an IterableDataset runs on the loader's worker threads (NOTE "
                             "[ Iterable datasets ]): python_workers='process' is for "
                             "map-style datasets")
        if torch.device(a["device"]).type == "cuda":
            raise ValueError("an IterableDataset's batches are made in Python: use "
                             "device='cpu' (with pin_memory=True) and move them in the loop")
        for name in ("transforms", "batch_transforms", "pad_values", "names", "shard_window",
                     "image_layout"):
            if a[name] is not None:
                raise ValueError(f"{name}= applies to a stoker.Dataset (or a map-style "
                                 "dataset), not to an IterableDataset")
        for name, what in (("num_threads", "num_workers= sets its worker threads"),
                           ("max_memory", "prefetch= bounds the batches read ahead")):
            if given.get(name) is not None:
                raise ValueError(
                    f"{name}= applies to the C++ core's workers (a stoker.Dataset, a "
                    f"map-style dataset), and an IterableDataset is read by Python worker "
                    f"threads: {what}")
        if given.get("on_error") == "skip" and given.get("map") is None:
            raise ValueError(
                "on_error='skip' leaves out rows whose map= raised, and there is no map=: "
                "an IterableDataset's own error ends its iterator, with nothing after it to "
                "skip to. Handle the error inside the dataset's __iter__, or pass map=")

    @staticmethod
    def build(p: Any, open_device: Optional[Callable[[int], Any]]) -> Tuple[IterableStream,
                                                                              bool]:
        """The stream of plan `p` (a LoaderPlan) and whether its batches are pinned."""
        s, st = p.sampling, p.stage
        assert st is not None
        # one reader by default: the stream of num_workers=0, read ahead of the loop; more
        # workers shard the dataset by get_worker_info(), which changes the stream's order
        workers = 1 if st.num_workers is None else st.num_workers
        dataset = p.dataset
        if s.shuffle and isinstance(dataset, torch.utils.data.IterDataPipe):
            # DataLoader's: shuffle=True turns the DataPipe's shufflers on
            dataset = torch.utils.data.graph_settings.apply_shuffle_settings(dataset,
                                                                             shuffle=True)
        stream = IterableStream(
            dataset, batch_size=s.batch_size or 1, drop_last=s.drop_last,
            even_batches=s.even_batches, seed=s.seed, workers=workers,
            worker_init_fn=st.worker_init_fn, persistent_workers=st.persistent_workers,
            map_fn=st.map, batch_map=st.batch_map, collate_fn=st.collate_fn,
            map_fields=st.map_fields, unbatched=st.unbatched, timeout=p.timeout,
            generator=p.arguments.get("generator"), split_ranks=s.split_ranks,
            prefetch=None if p.settings.auto_prefetch else p.settings.prefetch,
            skip_errors=p.on_error == "skip", stall_warning=p.settings.stall_warning)
        _, pin, api = args.resolve_device(torch.device("cpu"), p.delivery.pin_memory,
                                          open_device, p.delivery.pin_device)
        stream.pin = pin and api is not None and not getattr(api, "fake", False)
        return stream, pin
