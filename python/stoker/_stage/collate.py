"""Native batching of what Python code returns (``map=``, a map-style dataset) into one
buffer, laid out as stoker lays out the batches of stored fields.

NOTE [ Batching Python outputs ]
A batch of samples (dicts) becomes one buffer of tensors at 64-byte aligned offsets, the
layout the C++ planner gives stored fields (``csrc/producers/batch_planner.cpp``), so the
batch takes the same road afterwards: the device copy, DLPack, the block pool.

  value of a sample                        in the batch
  -----------------                        ------------
  array / CPU tensor, fixed shape S        [B, *S] of its dtype, stacked
  ... declared with a leading None         [B, L, *S[1:]] padded with zeros to the longest
                                           L of the batch, and "<name>_lengths" int64 [B]
  number, NumPy scalar, 0-d array          [B] (Python int -> int64, float -> float64,
                                           bool -> bool, as torch's default_collate)
  str, bytes, anything else                a Python list of the B values, under its key

The layout is declared (``map_fields={name: stoker.ndarray(dtype, (None, 4)), ...}``) or
inferred from the first sample batched; every sample is checked against it, and a sample
that disagrees is an error naming that sample, the field, and both shapes or types. A
shape is never widened silently: a field whose first dimension varies must say so with
a leading ``None``, so that every batch of an epoch has the same keys and ranks.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from ..fields import Blob, Field, NDArray, Scalar

__all__ = ["BatchLayout", "FieldLayout", "TensorSpec", "is_object_spec"]

_ALIGN = 64  # as kTensorAlign in csrc/producers/batch_planner.cpp

# dtypes the batch buffer holds (csrc/common/dtype.h), by NumPy name
_NATIVE = {"bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
           "float16", "float32", "float64"}
_TORCH_TO_NUMPY = {
    torch.bool: np.dtype("bool"), torch.uint8: np.dtype("uint8"), torch.int8: np.dtype("int8"),
    torch.int16: np.dtype("int16"), torch.int32: np.dtype("int32"),
    torch.int64: np.dtype("int64"), torch.float16: np.dtype("float16"),
    torch.float32: np.dtype("float32"), torch.float64: np.dtype("float64"),
    torch.uint16: np.dtype("uint16"), torch.uint32: np.dtype("uint32"),
    torch.uint64: np.dtype("uint64"),
}
_BF16 = "bfloat16"


# the same, by dtype character (dtype.name is slow: a NumPy call per value)
_NATIVE_CHARS = frozenset(np.dtype(n).char for n in _NATIVE) | {"l", "L", "q", "Q"}


def _where(where: Any) -> str:
    """Errors name the sample; the name is made only for an error (a callable)."""
    return where() if callable(where) else where


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def is_object_spec(spec: Any) -> bool:
    """Whether a ``map_fields`` value asks for a Python list (``object``, ``str``,
    ``bytes``, ``list``)."""
    return spec in (object, str, bytes, list)


class _Mismatch(ValueError):
    """A sample's value does not fit the layout (the caller adds which sample)."""


class FieldLayout:
    """How one key of the samples is batched: ``kind`` is "array" (fixed shape), "var"
    (leading dimension padded, with lengths), "scalar" or "object"."""

    __slots__ = ("key", "kind", "dtype", "shape", "source")

    def __init__(self, key: Hashable, kind: str, dtype: Any = None,
                 shape: Tuple[int, ...] = (), source: str = ""):
        self.key = key
        self.kind = kind
        self.dtype = dtype  # np.dtype, or "bfloat16" (torch tensors only)
        self.shape = shape  # "array": the sample's shape; "var": the shape of one row
        self.source = source  # "declared" or "inferred from sample N", for errors

    def describe(self) -> str:
        if self.kind == "object":
            return "a Python object (batched as a list)"
        if self.kind == "scalar":
            return f"a {_dtype_name(self.dtype)} scalar"
        if self.kind == "var":
            return f"{_dtype_name(self.dtype)} of shape {_shape_str((None,) + self.shape)}"
        return f"{_dtype_name(self.dtype)} of shape {_shape_str(self.shape)}"

    def __repr__(self) -> str:
        return f"FieldLayout({self.key!r}: {self.describe()})"


def _dtype_name(dtype: Any) -> str:
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


def _shape_str(shape: Sequence[Any]) -> str:
    """(None, 4) as written in Python; (5,) with its comma."""
    inner = ", ".join("None" if d is None else str(d) for d in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


def _key_name(key: Hashable) -> str:
    return repr(key) if not isinstance(key, str) else f"'{key}'"


class TensorSpec:
    """One tensor of a planned batch: where it lies in the buffer."""

    __slots__ = ("key", "name", "dtype", "shape", "offset", "nbytes")

    def __init__(self, key: Hashable, name: str, dtype: Any, shape: Tuple[int, ...],
                 offset: int, nbytes: int):
        self.key = key        # the key in the batch dict (a tuple sample's int, "x_lengths")
        self.name = name      # its name as a string (the C++ tensor name)
        self.dtype = dtype    # np.dtype or "bfloat16"
        self.shape = shape
        self.offset = offset
        self.nbytes = nbytes

    def __repr__(self) -> str:
        return (f"TensorSpec({self.name!r}, {_dtype_name(self.dtype)}, {self.shape}, "
                f"offset={self.offset})")


def _declared(key: Hashable, spec: Any) -> FieldLayout:
    """A ``map_fields`` entry as a FieldLayout."""
    if is_object_spec(spec):
        return FieldLayout(key, "object", source="declared")
    if isinstance(spec, Scalar):
        return FieldLayout(key, "scalar", spec.dtype.newbyteorder("="), (), "declared")
    if isinstance(spec, NDArray):
        dtype = spec.dtype.newbyteorder("=")
        if spec.variable:
            return FieldLayout(key, "var", dtype, tuple(spec.shape[1:]), "declared")
        return FieldLayout(key, "array", dtype, tuple(spec.shape), "declared")
    if isinstance(spec, Blob):
        return FieldLayout(key, "var", np.dtype("uint8"), (), "declared")
    if isinstance(spec, Field):
        raise TypeError(f"map_fields[{_key_name(key)}]: {spec!r} cannot describe a Python "
                        "output; use stoker.ndarray(dtype, shape) (a leading None for a "
                        "variable first dimension), stoker.scalar(dtype), stoker.blob(), or "
                        "object for a list")
    raise TypeError(f"map_fields[{_key_name(key)}] must be stoker.ndarray(...), "
                    f"stoker.scalar(...), stoker.blob() or object, got {spec!r}")


def _as_array(value: Any) -> Any:
    """A sample value as an array (np.ndarray, or a torch tensor for bfloat16), a
    ``("scalar", np.dtype, value)`` tuple, or None for an object. Raises _Mismatch for
    values that cannot be batched as they are (GPU tensors, object or strided arrays)."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise _Mismatch(f"is a tensor on {value.device}: return CPU tensors or arrays "
                            "(batch_map receives the batch on the device with device='cuda')")
        if value.dtype == torch.bfloat16:
            if not value.is_contiguous():
                raise _Mismatch(f"is a non-contiguous tensor (strides {value.stride()}): "
                                "return tensor.contiguous()")
            return value.detach()
        if value.dtype not in _TORCH_TO_NUMPY:
            raise _Mismatch(f"is a tensor of {value.dtype}, which stoker does not batch: "
                            "convert it, or return it inside a list to pass it through")
        if not value.is_contiguous():
            raise _Mismatch(f"is a non-contiguous tensor (strides {value.stride()}): return "
                            "tensor.contiguous()")
        if value.is_conj() or value.is_neg():
            value = value.resolve_conj().resolve_neg()
        return value.detach().numpy()
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise _Mismatch("is an object array: return an array of numbers, or a list to "
                            "batch it as a list")
        if value.dtype.char not in _NATIVE_CHARS:
            raise _Mismatch(f"is an array of {value.dtype}, which stoker does not batch "
                            f"(supported: {', '.join(sorted(_NATIVE))})")
        if not value.flags.c_contiguous:
            raise _Mismatch(f"is a non-contiguous array (shape {value.shape}, strides "
                            f"{value.strides}): return np.ascontiguousarray(x)")
        return value
    if isinstance(value, (bool, np.bool_)):
        return ("scalar", np.dtype("bool"), value)
    if isinstance(value, int):
        return ("scalar", np.dtype("int64"), value)
    if isinstance(value, float):
        return ("scalar", np.dtype("float64"), value)
    if isinstance(value, np.generic):
        if value.dtype.char not in _NATIVE_CHARS:
            raise _Mismatch(f"is a NumPy {value.dtype} scalar, which stoker does not batch")
        return ("scalar", value.dtype, value)
    return None


def _infer(key: Hashable, value: Any, where: str) -> FieldLayout:
    source = f"inferred from {where}"
    try:
        v = _as_array(value)
    except _Mismatch as e:
        raise ValueError(f"{where}: field {_key_name(key)} {e}") from None
    if v is None:
        return FieldLayout(key, "object", source=source)
    if isinstance(v, tuple):
        return FieldLayout(key, "scalar", v[1].newbyteorder("="), (), source)
    if isinstance(v, torch.Tensor):  # bfloat16
        if v.dim() == 0:
            return FieldLayout(key, "scalar", _BF16, (), source)
        return FieldLayout(key, "array", _BF16, tuple(v.shape), source)
    if v.ndim == 0:
        return FieldLayout(key, "scalar", v.dtype.newbyteorder("="), (), source)
    return FieldLayout(key, "array", v.dtype.newbyteorder("="), tuple(v.shape), source)


class BatchLayout:
    """The keys of a stream of samples and how each is batched (NOTE [ Batching Python
    outputs ]). Thread-safe: the first sample batched fixes what ``map_fields`` leaves
    open, once.

    Args:
        declared: ``map_fields``, ``{key: stoker.ndarray(...) | stoker.scalar(...) |
            stoker.blob() | object}``; keys not declared are inferred.
        what: what produced the samples, for errors ("map output", "dataset item").
    """

    def __init__(self, declared: Optional[Mapping[Hashable, Any]] = None,
                 what: str = "map output",
                 defaults: Optional[Mapping[Hashable, Any]] = None):
        if declared is not None and not isinstance(declared, Mapping):
            raise TypeError(f"map_fields must be a dict {{name: field type}}, got "
                            f"{type(declared).__name__}")
        self.what = what
        self._declared = {k: _declared(k, v) for k, v in (declared or {}).items()}
        # Layouts for keys the samples may have, used when present and not declared:
        # a stoker dataset's variable-length fields and blobs, batched as the loader
        # batches them without map (padded, with lengths).
        self._defaults = {k: _declared(k, v) for k, v in (defaults or {}).items()
                          if k not in self._declared}
        for f in self._defaults.values():
            f.source = "the dataset's field type"
        self._fields: Optional[Dict[Hashable, FieldLayout]] = None
        self._lock = threading.Lock()

    @property
    def fields(self) -> Optional[Dict[Hashable, FieldLayout]]:
        """Key -> FieldLayout once known (None before the first sample)."""
        return self._fields

    def _establish(self, sample: Mapping[Hashable, Any], where: str) -> Dict[Hashable,
                                                                              FieldLayout]:
        with self._lock:
            if self._fields is None:
                missing = [k for k in self._declared if k not in sample]
                if missing:
                    raise ValueError(
                        f"{where}: the {self.what} has no field "
                        f"{', '.join(map(_key_name, missing))} that map_fields declares "
                        f"(it has {', '.join(map(_key_name, sample)) or 'none'})")
                fields = {}
                for k, v in sample.items():
                    if k in self._declared:
                        fields[k] = self._declared[k]
                    elif k in self._defaults:
                        fields[k] = self._defaults[k]
                    else:
                        fields[k] = _infer(k, v, where)
                names = {}
                for k in fields:
                    n = str(k)
                    if n in names:
                        raise ValueError(f"{where}: keys {names[n]!r} and {k!r} of the "
                                         f"{self.what} have the same name {n!r}")
                    names[n] = k
                for k, f in fields.items():
                    if f.kind == "var" and f"{k}_lengths" in names:
                        raise ValueError(f"{where}: the {self.what} has a field "
                                         f"'{k}_lengths', the name of field {_key_name(k)}'s "
                                         "lengths in the batch")
                self._fields = fields
            return self._fields

    def check(self, sample: Any, where: Any) -> List[Any]:
        """The sample's values in layout order, as arrays / ("scalar", dtype, value) /
        objects, checked against the layout (fixing it at the first sample). ValueError
        naming `where` (a str, or a callable that makes it), the field and both shapes
        when the sample disagrees; TypeError when the sample is not a dict."""
        if type(sample) is not dict and not isinstance(sample, Mapping):
            raise TypeError(f"{_where(where)}: the {self.what} must be a dict of field "
                            f"values, got {type(sample).__name__}")
        fields = self._fields or self._establish(sample, _where(where))
        if len(sample) != len(fields) or any(k not in sample for k in fields):
            where = _where(where)
            extra = [k for k in sample if k not in fields]
            missing = [k for k in fields if k not in sample]
            parts = []
            if extra:
                parts.append(f"has field(s) {', '.join(map(_key_name, extra))} that the "
                             "layout does not")
            if missing:
                parts.append(f"lacks field(s) {', '.join(map(_key_name, missing))}")
            first = next(iter(fields.values())).source if fields else "the first sample"
            raise ValueError(f"{where}: the {self.what} {' and '.join(parts)} (keys "
                             f"{first}: {', '.join(map(_key_name, fields))}); every sample "
                             "must return the same keys")
        out = []
        for k, f in fields.items():
            value = sample[k]
            kind = f.kind
            if kind == "object":
                out.append(value)
                continue
            # The common case first: an array that fits as it is.
            if type(value) is np.ndarray and kind != "scalar" and value.dtype == f.dtype \
                    and value.flags.c_contiguous:
                shape = value.shape
                if shape == f.shape if kind == "array" else \
                        (len(shape) == len(f.shape) + 1 and shape[1:] == f.shape):
                    out.append(value)
                    continue
            try:
                v = _as_array(value)
                if f.dtype == "uint8" and f.kind == "var" and isinstance(value, (bytes,
                                                                                 bytearray)):
                    v = np.frombuffer(value, np.uint8)  # a blob: padded bytes + lengths
                if v is None:
                    raise _Mismatch(f"is a {type(value).__name__}, not an array or number")
                out.append(self._fit(f, v))
            except _Mismatch as e:
                raise ValueError(f"{_where(where)}: field {_key_name(k)} {e}; the layout "
                                 f"({f.source}) has {f.describe()}") from None
        return out

    @staticmethod
    def _fit(f: FieldLayout, v: Any) -> Any:
        if isinstance(v, tuple):  # a scalar
            if f.kind != "scalar":
                raise _Mismatch(f"is a scalar ({v[1].name})")
            if v[1] != f.dtype and not _python_fits(v[2], f.dtype):
                raise _Mismatch(f"is a {v[1].name} scalar")
            return v
        dtype = _BF16 if isinstance(v, torch.Tensor) else v.dtype.newbyteorder("=")
        shape = tuple(v.shape)
        if f.kind == "scalar":
            if shape != ():
                raise _Mismatch(f"has shape {_shape_str(shape)}")
        elif f.kind == "array":
            if shape != f.shape:
                hint = ""
                if len(shape) == len(f.shape) and shape and shape[1:] == f.shape[1:]:
                    hint = (f" (for a variable first dimension declare map_fields="
                            f"{{{_key_name(f.key)}: stoker.ndarray('{_dtype_name(f.dtype)}', "
                            f"{_shape_str((None,) + f.shape[1:])})}})")
                raise _Mismatch(f"has shape {_shape_str(shape)}{hint}")
        else:  # var
            if len(shape) != len(f.shape) + 1 or shape[1:] != f.shape:
                raise _Mismatch(f"has shape {_shape_str(shape)}")
        if dtype != f.dtype:
            raise _Mismatch(f"has dtype {_dtype_name(dtype)}")
        return v

    # -- planning and writing --------------------------------------------------------

    def plan(self, rows: Sequence[List[Any]]) -> Tuple[List[TensorSpec], int]:
        """The tensors of a batch of checked samples (``check``'s lists) and the bytes of
        the buffer that holds them."""
        fields = self._fields
        if fields is None:
            return [], 0
        b = len(rows)
        specs: List[TensorSpec] = []
        offset = 0

        def add(key: Hashable, dtype: Any, shape: Tuple[int, ...]) -> None:
            nonlocal offset
            itemsize = 2 if dtype == _BF16 else np.dtype(dtype).itemsize
            nbytes = itemsize * math.prod(shape)
            specs.append(TensorSpec(key, str(key), dtype, shape, offset, nbytes))
            offset = _align(offset + nbytes)

        for i, f in enumerate(fields.values()):
            if f.kind == "object":
                continue
            if f.kind == "scalar":
                add(f.key, f.dtype, (b,))
            elif f.kind == "array":
                add(f.key, f.dtype, (b,) + f.shape)
            else:
                longest = max((len(r[i]) for r in rows), default=0)
                add(f.key, f.dtype, (b, longest) + f.shape)
                lengths_key = f"{f.key}_lengths"
                add(lengths_key, np.dtype("int64"), (b,))
        return specs, offset

    def write(self, rows: Sequence[List[Any]], specs: Sequence[TensorSpec],
              buffer: np.ndarray) -> Dict[Hashable, List[Any]]:
        """Writes the samples into `buffer` (a writable uint8 array of at least the planned
        bytes) at the planned offsets; returns the object fields as lists."""
        fields = self._fields
        objects: Dict[Hashable, List[Any]] = {}
        if fields is None:
            return objects
        by_key = {s.key: s for s in specs}
        for i, f in enumerate(fields.values()):
            column = [r[i] for r in rows]
            if f.kind == "object":
                objects[f.key] = column
                continue
            spec = by_key[f.key]
            dst = _view(buffer, spec)
            if f.kind == "scalar":
                if not column:
                    continue
                if f.dtype == _BF16:  # only tensors are bfloat16
                    torch.stack(column, out=dst)
                else:
                    dst[:] = [c[2] if isinstance(c, tuple) else c for c in column]
            elif f.kind == "array":
                if not column:
                    continue
                if f.dtype == _BF16:
                    torch.stack(column, out=dst)
                else:
                    np.stack(column, out=dst)
            else:
                lengths = _view(buffer, by_key[f"{f.key}_lengths"])
                longest = spec.shape[1]
                ns = [len(c) for c in column]
                lengths[:] = ns
                if f.dtype != _BF16 and column and \
                        spec.nbytes <= _SMALL_ROWS * len(column):
                    _write_padded(dst, column, ns, lengths, longest)
                    continue
                for j, c in enumerate(column):
                    n = ns[j]
                    if f.dtype == _BF16:
                        dst[j, :n].copy_(c)
                        dst[j, n:].zero_()
                    else:
                        dst[j, :n] = c
                        if n < longest:
                            dst[j, n:] = 0
        return objects


# Padded rows of at most this many bytes on average are written by one masked copy for the
# batch; larger ones row by row (a few array operations per row, but no concatenated
# copy of the whole field first).
_SMALL_ROWS = 16384


def _write_padded(dst: np.ndarray, column: Sequence[np.ndarray], ns: Sequence[int],
                  lengths: np.ndarray, longest: int) -> None:
    """Rows of a variable leading dimension into `dst` [B, longest, ...], zero padded: a
    handful of array operations for the batch, not a few per row (boxes, labels and
    short token lists are rows of a few hundred bytes)."""
    total = sum(ns)
    if total == len(column) * longest:  # no padding: the rows are the field
        np.concatenate(column, out=dst.reshape((total,) + dst.shape[2:]))
        return
    if total == 0:
        dst[...] = 0
        return
    mask = np.arange(longest) < lengths[:, None]
    dst[~mask] = 0
    dst[mask] = np.concatenate(column)


def _python_fits(value: Any, dtype: Any) -> bool:
    """Whether a Python number goes into a scalar field of `dtype` without changing
    kind: a bool into bool or integers, an int into integers (in range) or floats, a
    float into floats. NumPy scalars must have the field's dtype."""
    if dtype == _BF16 or isinstance(value, np.generic):
        return False
    kind = np.dtype(dtype).kind
    if isinstance(value, bool):
        return kind in "biu"
    if isinstance(value, int):
        if kind == "f":
            return True
        if kind in "iu":
            info = np.iinfo(dtype)
            return info.min <= value <= info.max
        return False
    return isinstance(value, float) and kind == "f"


def _view(buffer: Any, spec: TensorSpec) -> Any:
    """The tensor `spec` over `buffer` (NumPy; torch for bfloat16)."""
    raw = buffer[spec.offset: spec.offset + spec.nbytes]
    if spec.dtype == _BF16:
        return torch.from_numpy(raw).view(torch.bfloat16).view(spec.shape)
    return raw.view(spec.dtype).reshape(spec.shape)


def tensors_of(buffer: np.ndarray, specs: Sequence[TensorSpec],
               to_tensor: Callable[[np.ndarray], torch.Tensor] = torch.from_numpy
               ) -> Dict[Hashable, torch.Tensor]:
    """The planned tensors of a written buffer as torch tensors (no copy)."""
    out = {}
    for s in specs:
        v = _view(buffer, s)
        out[s.key] = v if isinstance(v, torch.Tensor) else to_tensor(v)
    return out
