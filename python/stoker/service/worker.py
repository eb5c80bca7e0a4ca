"""A service's producer: the class of a Ray actor that computes parts of loaders' epochs
(NOTE [ Disaggregated loading ] in stoker/service/__init__.py).

An actor keeps a replica of each pipeline it has been asked for (``Loader(dataset,
**arguments)`` from the pipeline's spec, stoker/service/pipeline.py), built the first
time and kept for the next parts, the few most recent ones. A part (key, first, count) is
``run_part`` on the replica's core (NOTE [ Parts ] in csrc/pipeline/loader_core.h): its
threads (and Python stage) run the part as one stream, and its batches go to the caller
as one object once they are all out (Ray's fixed cost per object, a few milliseconds of
the actor's and the raylet's CPU, is paid once for them: NOTE [ Batch transport ] in
wire.py).
"""

from __future__ import annotations

import collections
import os
import time
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

__all__ = ["ServiceWorker", "MAX_REPLICAS"]

# Pipelines an actor keeps built at once (several loaders, or a train and an eval loader,
# sharing a pool); the least recently used one is closed past that.
MAX_REPLICAS = 4


def _portable(e: BaseException, where: str) -> BaseException:
    """`e` as it can travel to the trainer: itself when it pickles, else a RuntimeError
    with its type and message; noted with where it was raised."""
    import ray.cloudpickle as cloudpickle

    try:
        cloudpickle.loads(cloudpickle.dumps(e))
    except Exception:
        e = RuntimeError(f"{type(e).__name__}: {e}")
    if hasattr(e, "add_note"):
        e.add_note(f"stoker: raised on {where}")
    return e


def _samples(batch: Any) -> int:
    """Rows of a batch: the first dimension of its first tensor."""
    import torch

    values = batch.values() if isinstance(batch, dict) else \
        batch if isinstance(batch, (list, tuple)) else (batch,)
    for v in values:
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            return int(v.shape[0])
    return 0


class ServiceWorker:
    """What runs in each actor of a :class:`stoker.RayService`."""

    def __init__(self, label: str):
        import ray

        self._label = label
        self._replicas: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
        ctx = ray.get_runtime_context()
        self._node = ctx.get_node_id()
        self._where = f"service actor {label} (node {self._node[:8]}, pid {os.getpid()})"
        self._put_seconds = 0.0  # in the store's writes of this actor's parts, so far
        self._put_batches = 0

    def hello(self) -> Tuple[str, str, int]:
        """(label, node id, pid): the actor is up."""
        return self._label, self._node, os.getpid()

    def _replica(self, pipeline: Sequence[Any], variant: Optional[Dict[str, Any]]) -> Any:
        import ray
        import ray.cloudpickle as cloudpickle

        from ..loader import Loader

        pid = pipeline[0] if not variant else f"{pipeline[0]} {sorted(variant.items())}"
        loader = self._replicas.get(pid)
        if loader is None:
            try:
                spec = cloudpickle.loads(ray.get(pipeline[1]))
                loader = Loader(spec.dataset, **spec.arguments)
                if variant and "mix" in variant:  # a schedule's rows per step, as the loader's
                    loader._mix.load(variant["mix"])
            except Exception as e:
                e.add_note(f"stoker: raised on {self._where} while it made the loader's "
                           "replica (from the dataset and arguments pickled by the trainer: "
                           "the dataset's files and the modules of map and the dataset class "
                           "must be there too; a function of the main script travels by "
                           "value, one of another module by reference: Ray's runtime_env="
                           "{'py_modules': [...]} brings a module)")
                raise
            self._replicas[pid] = loader
            while len(self._replicas) > MAX_REPLICAS:
                _, old = self._replicas.popitem(last=False)
                old.close()
        self._replicas.move_to_end(pid)
        return loader

    def run(self, pipeline: Sequence[Any], key: Tuple[int, ...], first: int, count: int,
            variant: Optional[Dict[str, Any]] = None) -> Iterator[Tuple[Any, ...]]:
        """Batches [first, first + count) of segment `key` of `pipeline` ([id, ObjectRef
        of its pickled spec]; `variant`: the states of the loader's parts the replica
        takes, a schedule mixture's rows per step), yielded together as one object (NOTE
        [ Batch transport ] in wire.py): (the actor's label, its node, the seconds its puts
        took so far and the batches they held, then per batch: its number, samples, the
        seconds it took here, its error or None, the encoded batch)."""
        from .wire import encode

        loader = self._replica(pipeline, variant)
        # The part's rank and world: the replica is one loader for every rank (a part
        # names its own), and its iterator takes them from these.
        loader._rank, loader._world_size = int(key[1]), int(key[2])
        loader._core.run_part(tuple(key), first, count)
        it = iter(loader)
        batches = []
        try:
            for k in range(first, first + count):
                t0 = time.perf_counter()
                error: Optional[BaseException] = None
                batch: Any = None
                try:
                    batch = next(it)
                except StopIteration:
                    raise RuntimeError(f"stoker: internal error: the part [{first}, "
                                       f"{first + count}) of {key} ended at batch {k}") from None
                except Exception as e:  # the batch's own error: it travels as the batch
                    error = _portable(e, self._where)
                batches.append((k, 0 if error else _samples(batch),
                                time.perf_counter() - t0, error,
                                None if error is not None else encode(batch)))
                del batch
        finally:
            it.close()
        t = time.perf_counter()
        yield (self._label, self._node, self._put_seconds, self._put_batches, batches)
        # Ray wrote the object into the store during the yield
        self._put_seconds += time.perf_counter() - t
        self._put_batches += count

    def close(self) -> None:
        """Closes every replica (their threads stop); the actor stays usable."""
        for loader in self._replicas.values():
            loader.close()
        self._replicas.clear()

