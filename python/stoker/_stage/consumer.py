"""The Python stage's batch as the loop gets it (NOTE [ Python stage ] in
stoker/_stage/__init__.py): the tensors the core delivered, with what the batch's delivery
carries (object fields, a whole batch, an error), and batch_map run when the consumer takes
the batch, on the device's side stream after the copy."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch

from .deliveries import UNSET, Deliveries, not_none
from .errors import add_note
from .rng import batch_rng, batch_torch_seed, call_with_torch_seeded
from .samples import Samples
from .views import as_nchw, mapped_as_nchw

__all__ = ["Consumer"]


class Consumer:
    """Batches for the loop: `samples`' layout merges a batch's tensors with its object
    fields (``per_sample``; else the C++ workers assembled it), `batch_map` runs here when
    `batch_map_on_consumer` (after the device copy: on a side stream of ``side_device``,
    or on the host fake's memory). The deliveries are taken from `deliveries`."""

    def __init__(self, samples: Samples, deliveries: Deliveries, *,
                 batch_map: Optional[Callable], batch_map_on_consumer: bool,
                 per_sample: bool, nchw_views: Sequence[str]):
        self._samples = samples
        self._deliveries = deliveries
        self.batch_map = batch_map
        self.batch_map_on_consumer = batch_map_on_consumer
        self.per_sample = per_sample
        self.nchw_views = tuple(nchw_views)
        # batch_map on a CUDA device: its stream (NOTE [ batch_map on the device ])
        self.side_device: Any = None
        self._side: Any = None

    def side_stream(self, consumer_stream: Optional[int]) -> int:
        """The side stream (its handle) the core's copy of the next batch is also fenced
        on: batch_map's, where it runs on the device; else 0."""
        if consumer_stream is None or not self.batch_map_on_consumer or \
                self.batch_map is None:
            return 0
        if self._side is None:
            self._side = torch.cuda.Stream(self.side_device)
        return self._side.cuda_stream

    def deliver(self, tensors: Dict[str, Any], ticket: int) -> Any:
        """The batch the consumer gets, from the tensors the core delivered."""
        d = self._deliveries.take(ticket)
        if d is not None and d.whole is not UNSET:
            return d.whole
        if ticket and d is None:  # a stage bug: say so, not a KeyError of the merge below
            raise RuntimeError(f"stoker: internal error: the Python stage lost the objects "
                               f"of a batch (ticket {ticket}); please report it")
        samples = self._samples
        if self.per_sample:
            batch = mapped_as_nchw(samples.layout.assemble(
                tensors, d.objects if d is not None else {}), self.nchw_views)
        else:  # a batch the C++ workers assembled, named by its fields
            batch = as_nchw(dict(tensors), self.nchw_views)
        if self.batch_map is not None and self.batch_map_on_consumer and d is not None:
            key = (samples.seed, d.epoch, d.rank, d.world_size, d.batch)
            rng, torch_seed = batch_rng(*key), batch_torch_seed(*key)
            what = f"batch {d.batch} of epoch {d.epoch}"
            try:
                if self._side is None:  # the host fake's "device": host memory, copied
                    return not_none(call_with_torch_seeded(self.batch_map, batch, rng,
                                                           torch_seed), what)
                return not_none(self._on_side_stream(batch, rng, torch_seed), what)
            except Exception as e:
                add_note(e, f"stoker: raised by batch_map for {what}")
                raise
            finally:
                samples.check_fork()
        return batch

    def _on_side_stream(self, batch: Any, rng: np.random.Generator, torch_seed: int) -> Any:
        """NOTE [ batch_map on the device ]
        The copy of batch k ends with event E_k on stoker's copy stream. At next(), the
        consumer's stream U and the stage's side stream S both wait for E_k (on the
        device: no host wait); batch_map's kernels are queued on S, so they run while U
        still runs the step the loop queued before, and U waits for an event recorded
        on S after them:

          copy stream:  [H2D k] (E_k)
          S (stage):          wait E_k  [batch_map(k) kernels] (B_k)
          U (loop):     [step k-1 kernels ...............]  wait B_k  [step k]

        The batch's own buffer is fenced on U (its last reader: U waits for B_k, after
        S's reads), so stoker reuses it only after step k. Tensors batch_map allocates on
        S are marked as used on U (record_stream), as the caching allocator needs."""
        side = self._side
        inputs = {t.untyped_storage().data_ptr() for t in _tensors(batch)}
        with torch.cuda.stream(side):
            out = call_with_torch_seeded(self.batch_map, batch, rng, torch_seed, side.device)
        done = torch.cuda.Event()
        done.record(side)
        consumer = torch.cuda.current_stream(side.device)
        consumer.wait_event(done)
        for t in _tensors(out):  # allocated on S by torch: used on U from now on
            if t.is_cuda and t.untyped_storage().data_ptr() not in inputs:
                t.record_stream(consumer)
        return out


def _tensors(value: Any) -> List[Any]:
    """The torch tensors in a batch-like structure (dicts, lists, tuples)."""
    out: List[Any] = []
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, Mapping):
            todo.extend(v.values())
        elif isinstance(v, (list, tuple)):
            todo.extend(v)
    return out
