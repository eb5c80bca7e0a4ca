"""``accelerate.skip_first_batches`` for stoker loaders.

NOTE [ skip_first_batches ]
accelerate's ``skip_first_batches(dataloader, n)`` rebuilds a ``torch.utils.data.DataLoader``
around a ``SkipBatchSampler`` over ``dataloader.batch_sampler``, and has no hook for any other
loader; transformers' ``Trainer`` calls it, through the name it imports from accelerate, on
every resume from a mid-epoch checkpoint (``trainer.train(resume_from_checkpoint=...)``). A
stoker.Loader has no batch sampler to wrap (it plans batches in C++) and needs none: it
starts an epoch at batch n in O(1) with ``loader.skip(n)``.

There is no registry or protocol to plug into, so stoker wraps that one function: the
wrapper returns ``loader.skip(n)`` for a stoker.Loader and calls accelerate's function
unchanged for anything else. It replaces the name in the modules that hold it
(``accelerate.data_loader``, where it is defined, ``accelerate``, ``accelerate.accelerator``
and ``transformers.trainer``, which import it by name):

  * at ``import stoker``, in those of them already imported;
  * for an accelerate imported later, once ``accelerate.data_loader`` has run, by a one-shot
    finder on ``sys.meta_path``; every module that imports the name afterwards (accelerate's
    own, transformers', the user's ``from accelerate import skip_first_batches``) gets the
    wrapper.

The one case left out is a ``from accelerate import skip_first_batches`` run before stoker
is imported: that module keeps accelerate's function, which cannot take a stoker.Loader
(``loader.skip(n)`` does the same). Nothing else of accelerate or transformers is changed.

NOTE [ Trainer resume at another world size ]
The Trainer keeps no loader state: it derives the epoch and the batches to skip from its
optimizer step and ``len(loader)``, both of which mean other samples at another world size
(resumed from 1 process onto 2, the step of epoch 0 can read as a step of epoch 1). That
cannot be made exact, so the wrapper refuses it, called from the Trainer's resume, when the
checkpoint's RNG files (``rng_state.pth`` from one process, ``rng_state_{rank}.pth`` from
each of several) show another number of processes than this run's.
"""

from __future__ import annotations

import functools
import importlib.abc
import os
import re
import sys
from typing import Any, Callable, Optional

_DEFINED_IN = "accelerate.data_loader"
_HOLDERS = (_DEFINED_IN, "accelerate.accelerator", "accelerate", "transformers.trainer")
_NAME = "skip_first_batches"


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
        from .loader import Loader

        if isinstance(dataloader, Loader):
            _check_trainer_world(sys._getframe(1))
            return dataloader.skip(num_batches)
        return original(dataloader, num_batches=num_batches)

    skip_first_batches.__stoker_original__ = original  # type: ignore[attr-defined]
    return skip_first_batches


def _saved_world(checkpoint: str, process_index: int, world: int) -> Any:
    """The number of processes that saved `checkpoint`, where its RNG files tell it for
    sure, else None (NOTE [ Trainer resume at another world size ])."""
    try:
        names = os.listdir(checkpoint)
    except OSError:
        return None
    ranks = {int(m.group(1)) for m in map(re.compile(r"rng_state_(\d+)\.pth$").match, names)
             if m}
    if "rng_state.pth" in names and not ranks:
        return 1
    if not ranks:
        return None  # saved without RNG state: nothing to tell by
    if world == 1 or max(ranks) >= world:
        return max(ranks) + 1
    if process_index not in ranks:  # another rank's files are here, not this one's
        return max(ranks) + 1
    return None


def _trainer_resume(frame: Any) -> Any:
    """(checkpoint, TrainingArguments) of the Trainer's resume that called
    skip_first_batches, or None. The call comes from a method of ``transformers.trainer``
    (``_inner_training_loop`` up to transformers 4.x; ``get_resumed_dataloader``, called by
    the epoch's loop that holds the checkpoint, in 5.x), so the first few frames up that
    belong to that module are searched for the one holding ``resume_from_checkpoint``."""
    for _ in range(8):
        if frame is None:
            return None
        if frame.f_globals.get("__name__") == "transformers.trainer":
            checkpoint = frame.f_locals.get("resume_from_checkpoint")
            targs = getattr(frame.f_locals.get("self"), "args", None)
            if isinstance(checkpoint, (str, os.PathLike)) and targs is not None:
                return os.fspath(checkpoint), targs
        frame = frame.f_back
    return None


def _check_trainer_world(caller: Any) -> None:
    found = _trainer_resume(caller)
    if found is None:
        return
    checkpoint, targs = found
    world = int(getattr(targs, "world_size", 1))
    saved = _saved_world(checkpoint, int(getattr(targs, "process_index", 0)), world)
    if saved is not None and saved != world:
        raise RuntimeError(
            f"cannot resume exactly: {checkpoint} was saved by {saved} "
            f"process(es) and this run has {world}. transformers' Trainer finds its place "
            f"from the optimizer step and len(loader), which mean other samples at another "
            f"world size, and keeps no loader state; resume on {saved} process(es), or "
            f"train with a loop that saves loader.state_dict() (exact at any world size: "
            f"docs/frameworks.md)")


def _patch_loaded() -> None:
    """Puts the wrapper in place of accelerate's function in the modules already imported."""
    defining = sys.modules.get(_DEFINED_IN)
    current = getattr(defining, _NAME, None)
    if current is None:
        return
    original = getattr(current, "__stoker_original__", current)
    wrapper = current if original is not current else _wrap(original)
    for name in _HOLDERS:
        module = sys.modules.get(name)
        if module is not None and getattr(module, _NAME, None) is original:
            setattr(module, _NAME, wrapper)


class _PatchAfterExec(importlib.abc.Loader):
    """accelerate.data_loader's own loader, with the wrapper put in place once it has run.
    Every other attribute is the original loader's (source, data, resources)."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _patch_loaded()
        _uninstall()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds accelerate.data_loader through the other finders and wraps its loader, which
    takes the finder off sys.meta_path once the module has run (a find_spec alone, as
    importlib.util.find_spec makes, leaves it in place)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Optional[Any]:
        if fullname != _DEFINED_IN:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(fullname, path, target) if find_spec is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchAfterExec(spec.loader)
        return spec


_finder = _Finder()


def _uninstall() -> None:
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass


def install() -> None:
    """NOTE [ skip_first_batches ]: idempotent."""
    if _DEFINED_IN in sys.modules:
        _patch_loaded()
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
