"""A loader's pipeline as a service's producers run it: the dataset and the Loader
arguments of a replica that computes any batch of the loader exactly as the loader itself
would (NOTE [ Disaggregated loading ] in stoker/service/__init__.py)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping

__all__ = ["PipelineSpec", "pipeline_spec"]

# Settings of the loader that a replica does not take: the trainer keeps them (its device
# and memory, its ranks, its window and its waits) or they are resolved already (the seed
# a generator gave).
_TRAINER_ONLY = ("service", "generator", "pin_memory", "pin_memory_device", "prefetch_factor",
                 "max_memory")


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """What a producer needs to build the loader's replica: ``Loader(dataset,
    **arguments)`` with the seed resolved, one rank of one (each part names its own),
    host delivery, no next-epoch prefetch (a part ends its stream: NOTE [ Parts ] in
    csrc/pipeline/loader_core.h), no stall warning (its loop is the transport)."""

    dataset: Any
    arguments: Mapping[str, Any]

    def describe(self) -> str:
        a = self.arguments
        return f"{type(self.dataset).__name__}, batch_size={a.get('batch_size')}"


def pipeline_spec(plan: Any, threads: int) -> PipelineSpec:
    """The replica of the loader planned as `plan` (a checked LoaderPlan, stoker/_plan.py),
    its workers `threads` threads unless the loader named num_threads."""
    a: Dict[str, Any] = {k: v for k, v in plan.arguments.items() if k not in _TRAINER_ONLY}
    a.update(seed=plan.sampling.seed, rank=0, world_size=1, device="cpu",
             prefetch_next_epoch=False, stall_warning=None, timeout=0, prefetch=None)
    if a.get("num_threads") is None:
        a["num_threads"] = threads
    return PipelineSpec(plan.dataset, a)
