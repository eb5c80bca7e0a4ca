"""PyTorch Lightning and stoker: resuming a mid-epoch checkpoint at another world size.

stoker's loader state is the epoch and the samples the whole job has consumed, so a
loader resumed on more or fewer processes yields exactly the rows not yet consumed (a
plain loop needs nothing more). Lightning, though, decides where an epoch ends from its
own batch counter: it restores that counter from the checkpoint (batches of the old world
size) and fixes the epoch's length from ``len(loader)`` (batches of the new one) before it
loads the loader's state. Resumed from 1 process onto 2, it would stop the epoch while the
loader still had rows to give, and those rows would never be trained on.

:class:`ElasticResume` corrects the counter. Lightning adds it to every ``Trainer`` by
itself, through the ``lightning.pytorch.callbacks_factory`` entry point stoker's package
declares (``pytorch_lightning.callbacks_factory`` for the ``pytorch_lightning`` package);
it does nothing unless a stoker train loader resumes a state saved at another world size.
Passing it in ``callbacks=`` by hand is harmless (one instance acts).

NOTE [ Elastic resume under Lightning ]
At ``on_train_start`` the fit loop has loaded the loaders' states (in ``setup_data``) and
worked out how it restarts, but its epoch loop has not yet reset its counters. Lightning
ends the epoch when its batch counter ``batch_progress.current.ready`` reaches
``trainer.num_training_batches`` (L, from ``len(loader)`` at the new world size), and the
epoch loop's reset sets ``ready`` to ``completed`` (plus one when the checkpoint was saved
at ``on_train_batch_end``). With R the batches the resumed loader yields on this rank (the
same on every rank), the callback shifts the counters so that ``ready`` starts at L - R:
the epoch ends exactly when the loader runs out, and ``batch_idx`` (and with it
``val_check_interval``) counts batches of the new world size. ``global_step`` and the
epoch counters are left alone.

Where that cannot hold, it refuses: a stoker loader among several train loaders (their
epochs end together and cannot all be matched). With ``limit_train_batches`` below
``len(loader)`` the epoch is the limit's number of batches by request, and is left so.
If Lightning calls ``load_state_dict`` of a stoker loader with a state from another world
size and this callback is not active (stoker used without its package metadata, say),
``Loader.load_state_dict`` raises and says to add it.
"""

from __future__ import annotations

from typing import Any, List

__all__ = ["ElasticResume"]

# Fits running in this process with the callback set up (the loader's guard reads it).
_active = 0


class _ElasticResumeLogic:
    """The hooks, for lightning.pytorch's and pytorch_lightning's Callback alike."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        global _active
        if self._is_first(trainer):
            _active += 1
            self._set_up = True

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        global _active
        if getattr(self, "_set_up", False):
            _active -= 1
            self._set_up = False

    def _is_first(self, trainer: Any) -> bool:
        for cb in trainer.callbacks:
            if isinstance(cb, _ElasticResumeLogic):
                return cb is self
        return False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not self._is_first(trainer):
            return
        from .loader import Loader

        fit_loop = trainer.fit_loop
        combined = getattr(fit_loop, "_combined_loader", None)
        if combined is None:
            return
        loaders = list(combined.flattened)
        pending = [(dl, dl._pending_resume()) for dl in loaders if isinstance(dl, Loader)]
        elastic = [(dl, p) for dl, p in pending if p is not None and p[0] not in (0, dl.world_size)]
        if not elastic:
            return
        loader, (saved_world, remaining) = elastic[0]
        if len(loaders) > 1:
            raise RuntimeError(
                f"cannot resume exactly: this checkpoint was saved at world size {saved_world} "
                f"and the job now has {loader.world_size} processes, with several train "
                f"loaders ({len(loaders)}); Lightning ends their epoch together, so the "
                f"stoker loader's rest of the epoch ({remaining} batches) cannot be matched. "
                f"Resume on {saved_world} processes, or from an end-of-epoch checkpoint")
        length = trainer.num_training_batches
        if length != len(loader):  # limit_train_batches: the epoch is the limit, by request
            return
        epoch_loop = fit_loop.epoch_loop
        progress = epoch_loop.batch_progress.current
        # the epoch loop's reset counts the batch a checkpoint at on_train_batch_end saved
        counted = 1 if getattr(epoch_loop, "restarted_on_train_batch_end", False) else 0
        shift = (length - remaining - counted) - progress.completed
        for name in ("ready", "started", "processed", "completed"):
            setattr(progress, name, getattr(progress, name) + shift)


def _callback_class(base: type) -> type:
    return type("ElasticResume", (_ElasticResumeLogic, base), {
        "__module__": __name__,
        "__doc__": "Keeps Lightning's batch counter in step with a stoker loader resumed at "
                   "another world size (NOTE [ Elastic resume under Lightning ]).",
    })


try:
    from lightning.pytorch import Callback as _LightningCallback
except ImportError:  # pragma: no cover - the pytorch_lightning package only
    _LightningCallback = None

ElasticResume: Any = _callback_class(_LightningCallback) if _LightningCallback else None


def _callbacks() -> List[Any]:
    """Entry point ``lightning.pytorch.callbacks_factory``: Lightning calls it for every
    Trainer."""
    return [ElasticResume()] if ElasticResume is not None else []


def _pl_callbacks() -> List[Any]:
    """Entry point ``pytorch_lightning.callbacks_factory`` (the ``pytorch_lightning``
    package's own Callback class)."""
    global _PLElasticResume
    if _PLElasticResume is None:
        from pytorch_lightning import Callback

        _PLElasticResume = _callback_class(Callback)
    return [_PLElasticResume()]


_PLElasticResume: Any = None
