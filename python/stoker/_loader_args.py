"""The checks of single Loader arguments that the plan makes (stoker/_plan.py, NOTE
[ Loader plan ]), the defaults this machine gives them (threads, memory), the rank and
world size, and the device batches go to. The checks of ``transforms=`` and
``batch_transforms=`` are in stoker/_transform_args.py (``check_transforms`` and
``group_targets`` are importable from here too, as stoker/_stage takes them).

Each check raises the error a user should see (a ``ValueError`` naming the argument, a
``TypeError`` for a DataLoader argument stoker replaces, saying what to use instead).
"""

from __future__ import annotations

import multiprocessing.context
import operator
import os
import pickle
import warnings
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple, Union

import numpy as np
import torch
import torch.distributed

from . import _core
from ._transform_args import check_transforms as check_transforms
from ._transform_args import group_targets as group_targets
from .fields import Field, NDArray

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
      num_workers              the Python stage's workers: worker processes for a
                               map-style dataset (NOTE [ Worker processes for
                               num_workers ] in stoker/_dropin.py), else threads or
                               processes (python_workers=); 0: the user's code runs in
                               the loop's thread, in next(); without a Python stage,
                               num_threads. More than the cores available: DataLoader's
                               warning
      worker_init_fn           called in each worker thread or process of the Python
                               stage, where torch.utils.data.get_worker_info() answers;
                               refused without one (NOTE [ No argument ignored ] in
                               stoker/_dropin.py)
      generator                with shuffle, each epoch's permutation is RandomSampler's,
                               drawn from it at iter() (NOTE [ Seeds as DataLoader draws
                               them ] in stoker/_dropin.py)
      timeout                  next() raises after waiting that many seconds for a batch
      prefetch_factor          batches in flight: prefetch_factor * num_workers
      persistent_workers       False: worker_init_fn runs again at each epoch's start;
                               True: once per worker
      pin_memory_device        with pin_memory: the CUDA device whose memory is pinned
      multiprocessing_context  "fork" (or None): how process workers start; stoker's fork
                               (the dataset is inherited, never pickled), so "spawn" and
                               "forkserver" are refused with python_workers="process";
                               refused where the workers are threads for certain
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
        if shard_window is not None or a["even_batches"] is False:
            raise ValueError("shard_window and even_batches apply to stoker's own sampling, "
                             "not to a user's sampler")


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
