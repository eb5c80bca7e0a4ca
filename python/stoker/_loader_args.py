"""The checks of single Loader arguments that the plan makes (stoker/_plan.py, NOTE
[ Loader plan ]), the defaults this machine gives them (threads, memory), the rank and
world size, and the device batches go to.

Each check raises the error a user should see (a ``ValueError`` naming the argument, a
``TypeError`` for a DataLoader argument stoker replaces, saying what to use instead).
"""

from __future__ import annotations

import dataclasses
import multiprocessing.context
import operator
import os
import pickle
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



class DefaultBatchSize(int):
    """``batch_size``'s default: 1, as DataLoader's, told apart from an explicit 1 (token
    batches with ``max_tokens=`` then cap no rows) and from an explicit None (unbatched)."""

    def __repr__(self) -> str:
        return "1"


DEFAULT_BATCH_SIZE = DefaultBatchSize(1)


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
    is a TypeError."""
    out = {}
    for name, value in options.items():
        if name in TOKEN_OPTIONS:
            out[name] = value
            continue
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


def check_transforms(fields: Mapping[str, Field], transforms: Mapping[Any, Sequence[Op]],
                     box_rows: Any = None, as_stored: Any = None) -> Dict[Any, list]:
    """``{field: [op, ...]}`` over image fields, a single op taken as a list of one. A key
    may be a tuple of fields that move together (a transform group): images, masks, boxes,
    keypoints and per-box rows (:func:`group_targets`). The groups must be whole
    (:func:`complete_groups`): the keys come back with the per-box rows ``box_rows`` adds."""
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
    return complete_groups(fields, out, box_rows, as_stored)


_GEOMETRY = {"mask": "a mask", "boxes": "boxes", "keypoints": "keypoints"}


def _geometry_kind(f: Field) -> Optional[str]:
    """"mask", "boxes" or "keypoints" for a field whose values sit on an image's pixels."""
    if isinstance(f, Boxes):
        return "boxes"
    if isinstance(f, KeyPoints):
        return "keypoints"
    if isinstance(f, Image) and f.mode == "L":
        return "mask"
    return None


def _names(value: Any, what: str, fields: Mapping[str, Field]) -> Tuple[str, ...]:
    """A field name or a sequence of them, each a field of the dataset."""
    if value is None:
        return ()
    names = (value,) if isinstance(value, str) else tuple(value)
    for n in names:
        if not isinstance(n, str) or n not in fields:
            raise ValueError(f"{what}: no field {n!r} in the dataset (fields: "
                             f"{', '.join(fields)})")
    return names


def complete_groups(fields: Mapping[str, Field], transforms: Dict[Any, list],
                    box_rows: Any = None, as_stored: Any = None) -> Dict[Any, list]:
    """Transform groups that cannot be half-declared (NOTE [ Whole groups ]); the keys come
    back with the fields ``box_rows`` names added to the group with boxes.

    NOTE [ Whole groups ]
    A group keeps its targets on its image only for the fields it holds, so:

    * a group with boxes drops the boxes nothing is left of, and with them the rows of its
      other variable-length fields (class ids); a variable-length field of the dataset
      outside every group may be such rows, left whole while boxes go (class ids would
      move onto other boxes). Each must be in the group's key, or named in ``box_rows``
      (rows of the boxes: dropped with them, as in the key) or in ``as_stored`` (not per
      box: delivered as stored);
    * a mask, boxes or keypoints field must be in the group of the RGB image whose pixels
      move: outside every group it would stay where it was, in a group of its own it
      would move by draws of its own; or named in ``as_stored``, left as stored knowingly
      (a detection dataset read for classification). Only ops that move pixels
      (``Op.moves_pixels``) make this an error: colour ops leave targets where they are.
    """
    box_rows = _names(box_rows, "box_rows", fields)
    as_stored = _names(as_stored, "as_stored", fields)
    keys = {n: key for key in transforms for n in (key if isinstance(key, tuple) else (key,))}
    for name in box_rows:
        f = fields[name]
        if not isinstance(f, NDArray) or not f.variable or isinstance(f, (Boxes, KeyPoints)):
            raise ValueError(f"box_rows: {name!r} is not a variable-length ndarray field (boxes "
                             "and keypoints move with their group: put them in its key)")
    for what, names in (("box_rows", box_rows), ("as_stored", as_stored)):
        for name in names:
            if name in keys:
                raise ValueError(f"{what}: {name!r} is in the transforms key {keys[name]!r} "
                                 "already: a field of a group moves with it")
    for name in set(box_rows) & set(as_stored):
        raise ValueError(f"{name!r} is in box_rows and in as_stored: rows of the boxes, or "
                         "delivered as stored?")
    box_groups = [k for k in transforms if isinstance(k, tuple)
                  and any(isinstance(fields[n], Boxes) for n in k)]
    if box_rows and not box_groups:
        raise ValueError(f"box_rows: no transform group has boxes for {box_rows[0]!r} to be "
                         "rows of")
    if box_rows and len(box_groups) > 1:
        raise ValueError(f"box_rows: {box_rows[0]!r} could be rows of the boxes of "
                         f"{' or '.join(repr(g) for g in box_groups)}: put it in its group's "
                         "key")
    out = dict(transforms)
    for name, f in fields.items():
        if name in keys or name in as_stored or not isinstance(f, NDArray) or \
                not f.variable or isinstance(f, (Boxes, KeyPoints)) or not box_groups:
            continue
        group = box_groups[0]
        if name not in box_rows:
            raise ValueError(
                f"transforms: the group {group!r} drops the boxes nothing is left of, with the "
                f"rows of its per-box fields; {name!r} is a variable-length field outside it, "
                "which would keep every row (class ids would move onto other boxes). If it has "
                f"a row per box, add it to the group's key ({(*group, name)!r}) or name it in "
                f"box_rows=[{name!r}]; if not, in as_stored=[{name!r}]")
        out = {((*k, name) if k == group else k): v for k, v in out.items()}
    # targets outside the group of the image that moves
    rgb = [n for n, f in fields.items() if isinstance(f, Image) and f.mode != "L"]
    moving = {k for k, ops in transforms.items() if any(op.moves_pixels for op in ops)}
    image_moves = [k for k in moving
                   if any(n in rgb for n in (k if isinstance(k, tuple) else (k,)))]
    for name, f in fields.items():
        kind = _geometry_kind(f)
        key = keys.get(name)
        if kind is None or not rgb or name in as_stored:
            continue
        names = () if key is None else (key if isinstance(key, tuple) else (key,))
        if any(n in rgb for n in names):
            continue  # in the group of an image
        if key in moving or image_moves:
            image = next((n for k in image_moves
                          for n in (k if isinstance(k, tuple) else (k,)) if n in rgb), rgb[0])
            how = "stays where it was" if key is None else "moves by draws of its own"
            raise ValueError(
                f"transforms: {name!r} ({_GEOMETRY[kind]}) is not in the group of {image!r}, "
                f"whose ops move pixels: it {how} while the image moves. Put them in one "
                f"group: transforms={{({image!r}, {name!r}, ...): [...]}}, or, to have it as "
                f"stored knowingly, as_stored=[{name!r}]")
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
                   open_device: Optional[Callable[[int], Any]],
                   pin_device: str = "") -> Tuple[torch.device, bool, Any]:
    """(where batches go, whether slots are page-locked, the device API or None).
    `open_device` opens the API of a device index in place of the CUDA driver's (tests
    substitute the host fake); None: the driver's, after checking CUDA is usable.
    `pin_device` (DataLoader's pin_memory_device): for host batches, the CUDA device whose
    context pins them (default: the current one)."""
    if device.type == "cpu" and pin_device:
        index = torch.device(pin_device).index
        device = torch.device("cpu") if index is None else device
        pin_index: Optional[int] = index
    else:
        pin_index = None
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
        index = device.index if is_cuda else pin_index
        if index is None:  # the current device, as torch's pin_memory uses
            index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        if index >= count:
            raise RuntimeError(f"device={str(device)!r}: only {count} CUDA device(s)")
        if is_cuda:
            device = torch.device("cuda", index)
        return device, pin, _core.cuda_device(index)
    return device, pin, open_device((device.index if is_cuda else pin_index) or 0)


# -- the Python stage, DataLoader's arguments, samplers (the plan calls them) ----------------

def dataloader_args(a: Mapping[str, Any], *, tokens: bool, mix: bool) -> Dict[str, Any]:
    """NOTE [ DataLoader's arguments ]
    DataLoader's arguments, with DataLoader's meanings where the idea carries over:

      sampler, batch_sampler   any torch Sampler (NOTE [ User samplers ]): its indices, in
                               its order, iterated once per epoch ahead of the workers
      num_workers              the Python stage's workers (threads or processes,
                               python_workers=); 0: the user's code runs in the loop's
                               thread, in next(); without a Python stage, num_threads.
                               More than the cores available: DataLoader's warning
      worker_init_fn           called once in each worker thread or process, where
                               torch.utils.data.get_worker_info() answers
      generator                the order's seed (generator.initial_seed())
      timeout                  next() raises after waiting that many seconds for a batch
      prefetch_factor          batches in flight: prefetch_factor * num_workers
      persistent_workers       accepted: stoker's workers always persist across epochs
      pin_memory_device        with pin_memory: the CUDA device whose memory is pinned
      multiprocessing_context  "fork" (or None): how process workers start; stoker's fork
                               (the dataset is inherited, never pickled), so "spawn" and
                               "forkserver" are refused with python_workers="process"
      in_order                 accepted: stoker always delivers in order

    Each is checked as DataLoader checks it (the same combinations refused)."""
    out: Dict[str, Any] = {}
    num_workers = a["num_workers"]
    if isinstance(num_workers, int) and not isinstance(num_workers, bool) and num_workers < 0:
        raise ValueError(f"num_workers option should be non-negative (as DataLoader): 0 runs "
                         f"the dataset in the loop's thread, got num_workers={num_workers}")
    if num_workers is not None:
        num_workers = check_int("num_workers", num_workers, 0, 4096,
                                "a non-negative int (0: in the loop's thread) or None")
    out["num_workers"] = num_workers
    pf = a["prefetch_factor"]
    if pf is not None:
        if not num_workers:
            raise ValueError("prefetch_factor option could only be specified with num_workers "
                             "> 0 (as DataLoader): batches in flight are prefetch_factor * "
                             "num_workers; or pass prefetch=N")
        pf = check_int("prefetch_factor", pf, 1)
    out["prefetch_factor"] = pf
    if a["persistent_workers"] and num_workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0 (as DataLoader)")
    timeout = a["timeout"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"timeout option should be non-negative, got {timeout!r}")
    out["timeout"] = float(timeout)
    gen = a["generator"]
    out["seed"] = None
    if gen is not None:
        if not isinstance(gen, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(gen).__name__}")
        if a["seed"] not in (0, gen.initial_seed()):
            raise ValueError(f"seed={a['seed']} and generator (initial seed "
                             f"{gen.initial_seed()}) disagree: pass one of them")
        out["seed"] = gen.initial_seed()
    ctx = a["multiprocessing_context"]
    if ctx is not None and num_workers == 0:
        raise ValueError("multiprocessing_context can only be used with multi-process loading "
                         "(num_workers > 0), but got num_workers=0 (as DataLoader)")
    if ctx is not None and not isinstance(ctx, str):
        if not isinstance(ctx, multiprocessing.context.BaseContext):
            raise TypeError("multiprocessing_context option should be a valid context object "
                            "or a string specifying the start method, but got "
                            f"multiprocessing_context={ctx!r} (as DataLoader)")
        ctx = ctx.get_start_method()
    if ctx not in (None, "fork", "spawn", "forkserver"):
        raise ValueError(f"multiprocessing_context option should specify a valid start "
                         f"method in ['fork', 'spawn', 'forkserver'], got {ctx!r}")
    out["context"] = ctx
    device = a["pin_memory_device"]
    if not isinstance(device, str) or (device and torch.device(device).type != "cuda"):
        raise ValueError(f"pin_memory_device must be '' or a CUDA device, got {device!r}")
    if not isinstance(a["in_order"], bool):
        raise ValueError(f"in_order must be a bool, got {a['in_order']!r}")
    out["sampler"], out["batch_sampler"] = a["sampler"], a["batch_sampler"]
    if (out["sampler"] is not None or out["batch_sampler"] is not None) and (tokens or mix):
        raise ValueError("sampler= and batch_sampler= give the indices of a map-style dataset "
                         "or a stoker.Dataset; token batches and mixtures have their own "
                         "orders")
    return out


def check_worker_number(num_workers: int) -> None:
    """DataLoader's warning (check_worker_number_rationality) when the Python stage gets
    more workers than the cores this process may use: its workers are threads that
    contend for those cores, or processes (python_workers=) as DataLoader's are. C++
    workers (num_workers without a Python stage) are not Python's: no warning."""
    cores = available_cores()
    if num_workers > cores:
        warnings.warn(
            f"This stoker.Loader will create {num_workers} workers in total (threads, or "
            f"processes with python_workers=), and this process may use {cores} cores. As "
            "DataLoader warns: please be aware that excessive worker creation might get "
            "DataLoader running slow or even freeze, lower the worker number to avoid "
            "potential slowness/freeze if necessary.", UserWarning, stacklevel=4)


def check_samplers(dl: Mapping[str, Any], a: Mapping[str, Any], *,
                    shard_window: Optional[int], explicit_batch: bool) -> None:
    """NOTE [ User samplers ]
    A sampler (or batch sampler) is iterated once per epoch, at iter() (after set_epoch,
    which stoker passes on to the sampler's own set_epoch, as DistributedSampler needs),
    and its indices, in its order, become the epoch's order in C++ (ListedOrders in
    csrc/sampler/listed_order.h): the workers read ahead of the loop as usual, the batch
    count is the sampler's, and resume state is the samples consumed in that order. The
    sampler decides what a rank reads, so stoker does not split it again. A resume is
    exact when the epoch's order can be made again: a sampler with state_dict() (torchdata's
    protocol), one drawing from its own torch.Generator (its state is kept), or one that
    draws nothing (SequentialSampler, DistributedSampler after set_epoch); otherwise
    state_dict() says why not, rather than replaying another order."""
    sampler, batch_sampler = dl["sampler"], dl["batch_sampler"]
    if sampler is not None and a["shuffle"]:  # DataLoader's first check of the two
        raise ValueError("sampler option is mutually exclusive with shuffle (as DataLoader)")
    if batch_sampler is not None:
        if explicit_batch or a["shuffle"] or sampler is not None or a["drop_last"]:
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                             "shuffle, sampler, and drop_last (as DataLoader)")
        _iterable("batch_sampler", batch_sampler)
    if sampler is not None:
        _iterable("sampler", sampler)
    if sampler is not None or batch_sampler is not None:
        if a["rank"] is not None or a["world_size"] is not None:
            raise ValueError("a sampler decides what each rank reads (DistributedSampler): "
                             "rank= and world_size= apply to stoker's own sampling")
        if shard_window is not None or not a["even_batches"]:
            raise ValueError("shard_window and even_batches apply to stoker's own sampling, "
                             "not to a user's sampler")


def check_iterable(a: Mapping[str, Any]) -> None:
    """DataLoader's rules for an IterableDataset, and stoker's."""
    for name in ("sampler", "batch_sampler"):
        if a[name] is not None:
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified {name} "
                             f"option, but got {name}={a[name]!r} (as DataLoader)")
    if a["shuffle"]:
        raise ValueError("DataLoader with IterableDataset: expected unspecified shuffle "
                         f"option, but got shuffle={a['shuffle']!r} (as DataLoader): shuffle in "
                         "the dataset")
    if a["python_workers"] == "process":
        raise ValueError("an IterableDataset runs on the loader's worker threads (NOTE "
                         "[ Iterable datasets ]): python_workers='process' is for map-style "
                         "datasets")
    if torch.device(a["device"]).type == "cuda":
        raise ValueError("an IterableDataset's batches are made in Python: use device='cpu' "
                         "(with pin_memory=True) and move them in the loop")
    for name in ("transforms", "batch_transforms", "pad_values", "names", "shard_window",
                 "image_layout"):
        if a[name] is not None:
            raise ValueError(f"{name}= applies to a stoker.Dataset (or a map-style dataset), "
                             "not to an IterableDataset")


def _iterable(name: str, obj: Any) -> None:
    if not hasattr(obj, "__iter__"):
        raise TypeError(f"{name} must be an iterable of indices (a torch Sampler), got "
                        f"{type(obj).__name__}")

def check_stage_args(dataset: Any, *, map_style: bool, tokens: bool, map_fn: Any,
                      batch_map: Any, collate_fn: Any, map_fields: Any, names: Any,
                      python_workers: str, transforms: Any, image_layout: Any,
                      device: Any, context: Optional[str] = None) -> str:
    """The Loader's arguments of the Python stage, checked together; "thread", "process"
    or "auto" (threads, switching to processes when the stage measures that its Python
    holds the GIL: NOTE [ Python stage processes ])."""
    hooks = [n for n, v in (("map", map_fn), ("batch_map", batch_map),
                            ("collate_fn", collate_fn), ("map_fields", map_fields),
                            ("names", names)) if v is not None]
    if tokens and (hooks or map_style):
        raise ValueError(f"{', '.join(hooks) or 'a map-style dataset'}: not for token batches "
                         "(seq_len=, packing=, max_tokens=)")
    if map_style and (transforms or image_layout is not None):
        raise ValueError("transforms and image_layout apply to the image fields of a "
                         "stoker.Dataset; with a map-style dataset, transform in its "
                         "__getitem__ or in map=")
    if names is not None and not map_style:
        raise ValueError("names= names the values of a map-style dataset's tuple items; a "
                         "stoker.Dataset's samples are dicts of its fields")
    if map_fields is not None and map_fn is None and not map_style:
        raise ValueError("map_fields= declares what map= returns: pass map= too")
    if python_workers not in ("auto", "thread", "process"):
        raise ValueError(f"python_workers must be 'auto', 'thread' or 'process', got "
                         f"{python_workers!r}")
    processes = python_workers == "process"
    if processes and context in ("spawn", "forkserver"):
        raise ValueError(f"multiprocessing_context={context!r}: stoker's worker processes "
                         "start by fork (the dataset and your functions are inherited, never "
                         "pickled); use the default (fork), or python_workers='thread'")
    if python_workers == "auto" and (context in ("spawn", "forkserver") or (
            not map_style and getattr(dataset, "remote", None) is not None)):
        python_workers = "thread"  # processes are not an option here
    if processes and not (map_style or map_fn is not None or collate_fn is not None):
        raise ValueError("python_workers='process' runs map= and a map-style dataset's "
                         "__getitem__ in worker processes: pass one of them")
    if processes and not map_style and getattr(dataset, "remote", None) is not None:
        raise ValueError("python_workers='process' reads a local stoker dataset in each "
                         "worker; a dataset at a URL arrives through this process: use "
                         "python_workers='thread'")
    if collate_fn is not None and device.type == "cuda":
        raise ValueError("collate_fn returns Python objects that stoker cannot copy to the "
                         "device: with device='cuda' use batch_map= (it receives the native "
                         "batch on the GPU), or device='cpu' and move the batch yourself")
    return python_workers


def check_picklable(arguments: Mapping[str, Any]) -> None:
    """A loader pickles its hooks by reference, as DataLoader's workers get them under
    spawn; a lambda or a nested function cannot be: say which, and what to do."""
    for name in ("map", "batch_map", "collate_fn"):
        fn = arguments.get(name)
        if fn is None:
            continue
        try:
            pickle.dumps(fn)
        except Exception as e:
            raise TypeError(
                f"this stoker.Loader cannot be pickled: its {name}={fn!r} cannot be ({e}). "
                "Functions are pickled by reference, as DataLoader's under spawn: define it at "
                "the top level of a module (not a lambda or a nested function), or pass a "
                "picklable callable object") from e
