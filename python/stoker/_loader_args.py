"""The checks of single Loader arguments that the plan makes (stoker/_plan.py, NOTE
[ Loader plan ]), the defaults this machine gives them (threads, memory), the rank and
world size, and the device batches go to.

Each check raises the error a user should see (a ``ValueError`` naming the argument, a
``TypeError`` for a DataLoader argument stoker replaces, saying what to use instead).
"""

from __future__ import annotations

import dataclasses
import operator
import os
import warnings
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.distributed

from . import _core
from .fields import Boxes, Field, Image, KeyPoints, NDArray
from .ops import BatchOp, Op

DEFAULT_MAX_PIXELS = 100_000_000
# prefetch=None: the ring's capacity, the largest window the tuner may choose (within
# max_memory); batches copied ahead to the device (device="cuda").
AUTO_MAX_PREFETCH = 64
AUTO_DEVICE_PREFETCH = 2
# max_memory=None: this share of the machine's RAM, divided among the local ranks.
DEFAULT_MEMORY_SHARE = 1 / 16
DEFAULT_STALL_WARNING = 0.2
# A first batch slower than this is reported on the "stoker" logger (NOTE [ Slow first
# batch ] in csrc/pipeline/loader_core.h).
SLOW_FIRST_BATCH_SECONDS = 2.0

# Options of token batches beyond DESIGN's four (seq_len, packing, token_dtype, max_tokens),
# passed to stoker.token_dataset._make_producer; see docs/tokens.md.
TOKEN_OPTIONS = ("stride", "pad_id", "ignore_index", "pack_fit", "pack_window", "overlong",
                 "max_length", "pad_to_multiple_of", "attention_mask", "field")

# torch.utils.data.DataLoader arguments that stoker replaces, with what to do instead.
DATALOADER_ONLY = {
    "num_workers": "stoker uses C++ worker threads, not processes: pass num_threads=N "
                   "(None, the default, tunes it online within the cores available to this "
                   "rank)",
    "sampler": "stoker samples itself (shuffle, seed, rank/world_size); for a custom order, "
               "write the dataset in that order and use shuffle=False",
    "batch_sampler": "stoker batches itself: use batch_size (and drop_last)",
    "worker_init_fn": "stoker runs your code (map=, batch_map=, a dataset's __getitem__) in "
                      "its own threads of this process: set up shared state before the loop",
    "persistent_workers": "stoker's workers persist across epochs by design",
    "prefetch_factor": "use prefetch=N: batches in flight (None = automatic)",
    "pin_memory_device": "use device='cuda:N' (batches arrive on the GPU) or pin_memory=True",
    "multiprocessing_context": "stoker uses threads, not processes",
    "timeout": "stoker never hangs: a worker error surfaces in your loop at its batch",
    "generator": "use seed=N: the order is a function of (seed, epoch)",
}


# -- this machine -------------------------------------------------------------------------

def available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def local_world_size() -> int:
    """Processes of this job on this machine: torchrun and accelerate set LOCAL_WORLD_SIZE,
    SLURM sets SLURM_NTASKS_PER_NODE."""
    for var in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        try:
            n = int(os.environ.get(var, ""))
        except ValueError:
            continue
        if n >= 1:
            return n
    return 1


def default_threads() -> int:
    return max(1, available_cores() // local_world_size())


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 8 << 30  # unknown: assume a small machine


def default_max_memory() -> int:
    """Bytes of batches in flight per iterator for prefetch=None: 1/16 of the machine's
    RAM, shared by the processes of the job on this machine (LOCAL_WORLD_SIZE)."""
    return max(1, int(physical_memory() * DEFAULT_MEMORY_SHARE) // local_world_size())


def dist_world() -> Optional[Tuple[int, int]]:
    """(rank, world_size) of the default process group, if one is initialised.
    Called at every batch of an iterator that follows torch.distributed: two calls."""
    dist = torch.distributed
    try:
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return None


# -- arguments ----------------------------------------------------------------------------

def check_int(name: str, value: Any, low: int, high: int = 2**63 - 1,
              what: Optional[str] = None) -> int:
    """`value` as an int in [low, high], else a ValueError naming `name`. Integer types
    (NumPy's, a 0-d integer tensor) are taken; bools and floats are not."""
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < low:
        if what is None:
            what = "a positive int" if low == 1 else "a non-negative int" if low == 0 else "an int"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    if number > high:
        raise ValueError(f"{name} must be at most {high}, got {value!r}")
    return number


def token_options(options: Mapping[str, Any]) -> Dict[str, Any]:
    """The token options among the keyword arguments beyond the named ones; any other name
    is a TypeError (saying what to use instead of a DataLoader argument)."""
    out = {}
    for name, value in options.items():
        if name in TOKEN_OPTIONS:
            out[name] = value
            continue
        hint = DATALOADER_ONLY.get(name)
        if hint is not None:
            raise TypeError(f"stoker.Loader has no argument {name!r}: {hint}")
        raise TypeError(f"stoker.Loader got an unexpected keyword argument {name!r}")
    return out


class Settings(NamedTuple):
    """Threads, prefetch and memory, explicit or automatic (tuned online by the core)."""

    num_threads: int
    auto_threads: bool
    prefetch: int
    auto_prefetch: bool
    max_memory: int
    stall_warning: float


def check_settings(num_threads: Optional[int], prefetch: Optional[int],
                   max_memory: Optional[Union[int, str]],
                   stall_warning: Optional[float]) -> Settings:
    """None: tuned online by the core (NOTE [ Autotuning ] in csrc/pipeline/autotuner.h):
    the pool has the most threads this rank may use, the ring the largest window."""
    threads = check_int("num_threads", default_threads() if num_threads is None else num_threads,
                        1, 4096, "a positive int or None")
    window = check_int("prefetch", AUTO_MAX_PREFETCH if prefetch is None else prefetch, 1,
                       _core.MAX_PREFETCH, "a positive int or None")
    if max_memory is None:
        max_memory = default_max_memory()
    elif isinstance(max_memory, str):
        from ._index import parse_size

        max_memory = parse_size(max_memory)
    memory = check_int("max_memory", max_memory, 1, 2**63 - 1,
                       "a positive number of bytes, a size such as '2GB', or None")
    if stall_warning is None:
        stall_warning = 0.0
    if isinstance(stall_warning, bool) or not isinstance(stall_warning, (int, float)) or \
            not 0 <= stall_warning <= 1:
        raise ValueError(f"stall_warning must be a fraction in [0, 1] or None, got "
                         f"{stall_warning!r}")
    return Settings(threads, num_threads is None, window, prefetch is None, memory,
                    float(stall_warning))


def check_ranks(rank: Optional[int],
                world_size: Optional[int]) -> Tuple[Optional[int], Optional[int]]:
    """Explicit rank and world size (None: torch.distributed's, read when used)."""
    rank = None if rank is None else check_int("rank", rank, 0)
    world_size = None if world_size is None else check_int("world_size", world_size, 1)
    if rank is not None and world_size is not None and rank >= world_size:
        raise ValueError(f"rank {rank} is outside [0, world_size={world_size})")
    return rank, world_size


def world(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """(rank, world_size) now: the explicit ones, else torch.distributed's, else 0/1."""
    dist = None
    if rank is None or world_size is None:
        dist = dist_world()
    r = rank if rank is not None else (dist[0] if dist else 0)
    w = world_size if world_size is not None else (dist[1] if dist else 1)
    if r >= w:
        raise ValueError(f"rank {r} is outside [0, world_size={w})")
    return r, w


def check_transforms(fields: Mapping[str, Field],
                     transforms: Mapping[Any, Sequence[Op]]) -> Dict[Any, list]:
    """``{field: [op, ...]}`` over image fields, a single op taken as a list of one. A key
    may be a tuple of fields that move together (a transform group): images, masks, boxes,
    keypoints and per-box rows (:func:`group_targets`)."""
    if not isinstance(transforms, Mapping):
        raise TypeError(f"transforms must be a dict {{field name: [ops]}}, got "
                        f"{type(transforms).__name__}")
    out: Dict[Any, list] = {}
    for key, ops in transforms.items():
        names = key if isinstance(key, tuple) else (key,)
        if not names:
            raise ValueError("transforms: an empty tuple of fields")
        for name in names:
            if not isinstance(name, str) or name not in fields:
                raise ValueError(f"transforms: no field {name!r} in the dataset "
                                 f"(fields: {', '.join(fields)})")
        if not isinstance(key, tuple) and not isinstance(fields[key], Image):
            raise ValueError(f"transforms: field {key!r} is not an image field; ops apply "
                             "to stoker.image() fields (put masks, boxes and keypoints in a "
                             "tuple key with their image)")
        if isinstance(key, tuple):
            group_targets(fields, key)  # a field that cannot follow the geometry: now
        if isinstance(ops, Op):
            ops = [ops]
        ops = list(ops)
        for op in ops:
            if not isinstance(op, Op):
                raise ValueError(f"transforms[{key!r}]: expected stoker.ops objects, got "
                                 f"{type(op).__name__}")
        out[key] = ops
    return out


def group_targets(fields: Mapping[str, Field], names: Sequence[str]) -> list:
    """What each field of a transform group is, as the arguments of ``_core.TargetSpec``:
    an RGB image, a mask (``stoker.image(mode="L")`` or an integer ndarray of fixed shape
    (h, w) or (h, w, 1)), boxes, keypoints, or per-box rows (any other variable-length
    field)."""
    out: list = []
    for name in names:
        f = fields[name]
        if isinstance(f, Image):
            out.append(("mask" if f.mode == "L" else "image",))
        elif isinstance(f, Boxes):
            out.append(("boxes", f.format, f.normalized))
        elif isinstance(f, KeyPoints):
            out.append(("keypoints", "xyxy", f.normalized))
        elif isinstance(f, NDArray) and f.variable:
            out.append(("rows",))
        elif isinstance(f, NDArray) and f.dtype.kind in "iu" and (
                len(f.shape) == 2 or (len(f.shape) == 3 and f.shape[2] == 1)):
            out.append(("mask",))
        else:
            raise ValueError(f"transforms: field {name!r} ({f!r}) has no geometry to follow: "
                             "a group takes images, masks (stoker.image(mode='L') or an "
                             "integer ndarray (h, w)), stoker.boxes(), stoker.keypoints() and "
                             "variable-length per-box rows such as class ids")
    return out


def check_pad_values(fields: Mapping[str, Field], pad_values: Optional[Mapping[str, Any]]
                     ) -> Dict[str, bytes]:
    """``{field: value}`` for variable-length ndarray fields: one element of the field's
    dtype that pads its batches in place of 0, as bytes."""
    if pad_values is None:
        return {}
    if not isinstance(pad_values, Mapping):
        raise TypeError(f"pad_values must be a dict {{field name: value}}, got "
                        f"{type(pad_values).__name__}")
    out = {}
    for name, value in pad_values.items():
        f = fields.get(name)
        if not isinstance(f, NDArray) or not f.variable:
            raise ValueError(f"pad_values: {name!r} is not a variable-length ndarray field of "
                             f"the dataset (only those are padded)")
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise ValueError(f"pad_values[{name!r}]: expected a number, got {value!r}")
        cast = np.array(value).astype(f.dtype)
        if cast.item() != value:
            raise ValueError(f"pad_values[{name!r}]: {value!r} does not fit the field's dtype "
                             f"{f.dtype.name}")
        out[name] = cast.astype(f.dtype.newbyteorder("<")).tobytes()
    return out


@dataclasses.dataclass(frozen=True)
class BatchMixPlan:
    """MixUp and CutMix of a loader, resolved: which image and labels, the classes."""

    image: str
    labels: str
    num_classes: Optional[int]
    mixup: Optional[BatchOp]
    cutmix: Optional[BatchOp]
    switch_prob: float

    def options(self) -> Any:
        return _core.BatchMixOptions(image=self.image, labels=self.labels,
                                     num_classes=self.num_classes,
                                     mixup=self.mixup.params() if self.mixup else None,
                                     cutmix=self.cutmix.params() if self.cutmix else None,
                                     switch_prob=self.switch_prob)


def check_batch_transforms(fields: Mapping[str, Field], batch_transforms: Any
                           ) -> Optional[BatchMixPlan]:
    """``[MixUp(...), CutMix(...)]`` (one of each at most) as a :class:`BatchMixPlan`,
    or None. The image is the one RGB image field unless an op names it; the labels,
    "label" or "labels" unless an op names them."""
    if not batch_transforms:
        return None
    if isinstance(batch_transforms, BatchOp):
        batch_transforms = [batch_transforms]
    ops = list(batch_transforms)
    by_kind: Dict[str, BatchOp] = {}
    for op in ops:
        if not isinstance(op, BatchOp):
            raise ValueError(f"batch_transforms: expected stoker.ops.MixUp or CutMix, got "
                             f"{type(op).__name__}")
        if op._name in by_kind:
            raise ValueError(f"batch_transforms: two {type(op).__name__} ops")
        by_kind[op._name] = op

    def agreed(what: str, default: Any) -> Any:
        given = {getattr(op, what) for op in ops if getattr(op, what) is not None}
        if len(given) > 1:
            raise ValueError(f"batch_transforms: MixUp and CutMix disagree on {what} "
                             f"({sorted(map(repr, given))})")
        return given.pop() if given else default

    num_classes = agreed("num_classes", None)
    switch_prob = agreed("switch_prob", 0.5)
    image = agreed("image", None)
    if image is None:
        rgb = [n for n, f in fields.items() if isinstance(f, Image) and f.mode == "RGB"]
        if len(rgb) != 1:
            raise ValueError(f"batch_transforms: say which image to mix (image=...): the "
                             f"dataset has {len(rgb)} RGB image fields")
        image = rgb[0]
    labels = agreed("labels", None)
    if labels is None:
        found = [n for n in ("label", "labels") if n in fields]
        if not found:
            raise ValueError("batch_transforms: say which field holds the class ids "
                             "(labels=...): the dataset has no 'label' or 'labels' field")
        labels = found[0]
    for what, name in (("image", image), ("labels", labels)):
        if name not in fields:
            raise ValueError(f"batch_transforms: {what}={name!r} is no field of the dataset "
                             f"(fields: {', '.join(fields)})")
    return BatchMixPlan(image, labels, num_classes, by_kind.get("mixup"),
                        by_kind.get("cutmix"), float(switch_prob))


# -- the device -----------------------------------------------------------------------------

def check_device(device: torch.device) -> None:
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {str(device)!r}")


def resolve_device(device: torch.device, pin_memory: Optional[bool],
                   open_device: Optional[Callable[[int], Any]]) -> Tuple[torch.device, bool, Any]:
    """(where batches go, whether slots are page-locked, the device API or None).
    `open_device` opens the API of a device index in place of the CUDA driver's (tests
    substitute the host fake); None: the driver's, after checking CUDA is usable."""
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {str(device)!r}")
    is_cuda = device.type == "cuda"
    pin = is_cuda if pin_memory is None else bool(pin_memory)
    if not is_cuda and not pin:
        return device, False, None
    if open_device is None:
        available, count, reason = _core.cuda_status()
        if not available:
            if is_cuda:
                raise RuntimeError(f"device={str(device)!r} requested but CUDA is not "
                                   f"usable here: {reason}")
            warnings.warn("pin_memory=True but no CUDA device is available; batches use "
                          "pageable memory", RuntimeWarning, stacklevel=3)
            return device, False, None
        index = device.index
        if index is None:  # the current device, as torch's pin_memory uses
            index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        if index >= count:
            raise RuntimeError(f"device={str(device)!r}: only {count} CUDA device(s)")
        if is_cuda:
            device = torch.device("cuda", index)
        return device, pin, _core.cuda_device(index)
    return device, pin, open_device(device.index or 0)
