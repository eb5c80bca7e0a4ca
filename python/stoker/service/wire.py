"""A batch on its way from a producer to the trainer (NOTE [ Batch transport ]).

NOTE [ Batch transport ]
A batch crosses Ray's object store as NumPy arrays: Ray writes each array's buffer out of
band (pickle protocol 5) into the store, once, and the trainer's ``ray.get`` maps it with
no copy (on another node Ray first moves the object, then the same). The batches of a
part travel as one object, so that Ray's fixed costs per object and per task (the
raylet's bookkeeping, the call itself) are paid once for them; what stays is about a
millisecond of CPU per MB between the actor's copy into the store and the raylet
(bench/bench_service.py: 4-5 ms per 4.8 MB batch, against 18 ms to make it with
RandomResizedCrop and a flip). The object is freed once the loop has dropped the last of
its batches. A tensor is sent as
the contiguous array its strides walk (an image delivered as an NCHW view of HWC memory
travels as HWC and is viewed again), so the loop gets the local loader's shapes, strides
and dtypes. Dtypes NumPy lacks (bfloat16) travel as same-sized integers. Anything else in
a batch (a collate_fn's strings, lists) is pickled as it is.

The trainer's tensors are views of the object store's memory: no copy on the trainer
either. Ray marks such arrays read-only, and torch has no read-only tensors (it warns, once,
when given one): the memory is the trainer's own copy of the object, which nobody else
reads, so writing to it in place is as safe as writing to a local batch; the object is
freed when the last tensor viewing it is.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, Tuple

import numpy as np
import torch

__all__ = ["encode", "decode", "WireTensor"]

# dtypes NumPy has no type for, and the integer type of the same size they travel as
_VIEWED = {torch.bfloat16: torch.int16}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _VIEWED[getattr(torch, _name)] = torch.uint8


class WireTensor:
    """A tensor as sent: `array` (contiguous), the permutation that gives the tensor's
    dimension order back, and the torch dtype when NumPy has none for it."""

    __slots__ = ("array", "order", "dtype")

    def __init__(self, array: np.ndarray, order: Optional[Tuple[int, ...]],
                 dtype: Optional[str]):
        self.array, self.order, self.dtype = array, order, dtype

    def __reduce__(self) -> Any:
        return (WireTensor, (self.array, self.order, self.dtype))


def _wire(t: torch.Tensor) -> WireTensor:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    order: Optional[Tuple[int, ...]] = None
    if not t.is_contiguous():
        # the dimensions by decreasing stride: a dense tensor in any dimension order (an
        # NCHW view of HWC memory) is a contiguous one permuted
        dims = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))
        base = t.permute(dims)
        if base.is_contiguous():
            order = tuple(dims.index(d) for d in range(t.dim()))
            t = base
        else:
            t = t.contiguous()  # overlapping or sparse strides: the values, laid out anew
    dtype = None
    if t.dtype in _VIEWED:
        dtype = str(t.dtype).replace("torch.", "")
        t = t.view(_VIEWED[t.dtype])
    return WireTensor(t.numpy(), order, dtype)


def _tensor(w: WireTensor) -> torch.Tensor:
    a = w.array
    if a.flags.writeable:
        t = torch.from_numpy(a)
    else:
        with warnings.catch_warnings():  # the object store's memory (NOTE [ Batch transport ])
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(a)
    if w.dtype is not None:
        t = t.view(getattr(torch, w.dtype))
    if w.order is not None:
        t = t.permute(w.order)
    return t


def encode(batch: Any) -> Any:
    """A batch (dict, list, tuple, namedtuple of tensors and other values) with each
    tensor as a :class:`WireTensor`."""
    if isinstance(batch, torch.Tensor):
        return _wire(batch)
    if isinstance(batch, dict):
        return type(batch)((k, encode(v)) for k, v in batch.items()) \
            if type(batch) is not dict else {k: encode(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(encode(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(encode(v) for v in batch)
    return batch


def decode(obj: Any) -> Any:
    """:func:`encode`'s batch again, each tensor a view of the array it came in."""
    if isinstance(obj, WireTensor):
        return _tensor(obj)
    if isinstance(obj, dict):
        return {k: decode(v) for k, v in obj.items()} if type(obj) is dict else \
            type(obj)((k, decode(v)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(decode(v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(decode(v) for v in obj)
    return obj
