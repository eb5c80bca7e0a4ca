"""What a Loader does as DataLoader does where stoker's own design would not: functions
bound as Loader methods (stoker/loader.py)."""

from __future__ import annotations

from typing import Any

__all__ = ["follow_len"]


def follow_len(self: Any) -> None:
    """DataLoader reads len(dataset) at every len() and iter(): a map-style dataset
    that grew or shrank since is planned and built again (between epochs: a running
    epoch keeps its order), at the epoch the loader was at."""
    if self.plan.source != "map-style" or self._user_sampler is not None:
        return
    try:
        n = len(self.dataset)
    except TypeError:
        return
    if n == self._built_len:
        return
    running = self._live_iter() if self._live_iter is not None else None
    if running is not None and len(running) > 0:
        return
    if self._pending_resume() is not None:
        raise ValueError(f"the dataset has {n} samples now, {self._built_len} when this "
                         "loader was made and its state loaded: a resume continues the "
                         "order of the dataset it was saved with")
    epoch, arguments = self.epoch, dict(self.plan.arguments)
    self.close()
    object.__setattr__(self, "_initialized", False)
    self.__init__(self.dataset, **arguments)  # type: ignore[misc]
    if epoch:
        self.set_epoch(epoch)
