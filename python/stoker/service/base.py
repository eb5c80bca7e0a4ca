"""What a Loader asks of a service (``stoker.Loader(ds, ..., service=...)``): the small
base class a pool of remote producers implements (:class:`stoker.RayService` is the one
stoker has). The plan checks a ``service=`` against it; the build asks it for the parts
that fetch batches (NOTE [ Disaggregated loading ] in stoker/service/__init__.py)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

__all__ = ["Service", "Delivery"]


@dataclasses.dataclass
class Delivery:
    """One batch as it arrived: the encoded batch, or its error."""

    index: int
    samples: int
    error: Optional[BaseException]
    payload: Any
    wait_seconds: float  # waiting for the actor (the batch not made yet)
    get_seconds: float  # the object's transfer and mapping (ray.get)


class Service:
    """A pool of producers that compute a loader's batches elsewhere.

    A service never decides which batches a loader gets: the loader's own core does
    (epochs, skip, resume, the rank's share), and names each batch by its segment key
    and number. A service only computes batch k of a key, any number of times, on any
    of its producers, and hands it over; the loader counts it when the loop takes it.
    """

    def _fetcher(self, spec: Any, window: int) -> Any:
        """The object that fetches batches of the pipeline `spec` (stoker/service/
        pipeline.py) for one loader, with at most `window` batches in flight per
        iterator (its ``window`` attribute, which the loader may move):
        ``open(key, first, total, variant)`` gives the batches [first, total) of a segment
        (`variant`: the state of the loader's parts that the replica must share, a
        schedule mixture's rows per step, or None), whose
        ``take(j, deadline)`` returns batch j as a :class:`Delivery` (in order) and whose
        ``close()`` drops the rest (stoker/service/dispatch.py has Ray's)."""
        raise NotImplementedError

    @property
    def threads_per_producer(self) -> int:
        """Threads each producer's pipeline runs (num_threads=None takes it)."""
        raise NotImplementedError

    @property
    def producers(self) -> int:
        """Producers in the pool now (the window's default grows with it)."""
        raise NotImplementedError

    def describe(self) -> str:
        """One line for ``print(loader.plan)``."""
        return type(self).__name__

    def stats(self) -> Dict[str, Any]:
        """The pool's own figures (actors alive, restarts), for ``stats()["service"]``."""
        return {}
