"""The checks of ``service=`` in a Loader's plan (stoker/_plan.py): what a service can
compute elsewhere, refused with the reason before anything starts."""

from __future__ import annotations

from typing import Any, Optional

from .base import Service

__all__ = ["check_service"]


def check_service(service: Any, *, iterable: bool, sampler: Any, batch_sampler: Any,
                  device: Any) -> Optional[Service]:
    """`service` when a loader with these arguments can run on it, else the error."""
    if service is None:
        return None
    if not isinstance(service, Service):
        raise TypeError(f"service must be a stoker.RayService (or another stoker.service."
                        f"Service), got {type(service).__name__}")
    if iterable:
        raise ValueError("service= computes batch k of an epoch anywhere, which needs batch k "
                         "to be a function of k: an IterableDataset's batches depend on the "
                         "stream before them. Use a map-style dataset or a stoker.Dataset")
    if sampler is not None or batch_sampler is not None:
        raise ValueError("service= does not take sampler= or batch_sampler=: a sampler is "
                         "iterated in this process each epoch, and the service's actors could "
                         "not list the same order. Use shuffle=, seed= and the loader's rank "
                         "split (the same orders DistributedSampler gives)")
    if device.type != "cpu":
        raise ValueError(f"service= delivers batches in host memory (device='cpu'), got "
                         f"device={str(device)!r}: move them in the loop "
                         f"(batch['image'].to('{device}', non_blocking=True))")
    return service
