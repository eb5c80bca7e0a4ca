"""Native batching of what Python code returns (``map=``, a map-style or iterable
dataset) into one buffer, laid out as stoker lays out the batches of stored fields, in
the structure ``torch.utils.data.default_collate`` gives.

NOTE [ Batching Python outputs ]
A batch of samples becomes one buffer of tensors at 64-byte aligned offsets, the layout
the C++ planner gives stored fields (``csrc/producers/batch_planner.cpp``), so the batch
takes the same road afterwards: the device copy, DLPack, the block pool. Its structure is
default_collate's, so a DataLoader user's loop works unchanged:

  sample                                   batch (as default_collate)
  ------                                   --------------------------
  dict / Mapping                           the same type, each value batched
  namedtuple                               the same namedtuple, each field batched
  tuple / list / other sequence            a list (a tuple too: default_collate's rule),
                                           one entry per position, each batched
  tensor / array, fixed shape S            [B, *S] of its dtype, stacked (views too)
  ... a dict value whose first dimension   [B, L, *S[1:]] padded with zeros to the longest
      varies in the batch (or declared     L, and "<name>_lengths" int64 [B] beside it
      with a leading None)
  number, NumPy scalar, 0-d array          [B] (int -> int64, float -> float64, bool ->
                                           bool, a NumPy scalar its dtype)
  str, bytes, anything else                a Python list of the B values

The leaves (what is not a container) are batched natively, never by a per-sample
``torch.stack``. The structure and each leaf's layout are declared (``map_fields=`` for
the keys of a dict) or inferred from the first sample batched; every sample is checked
against them, and one that disagrees is an error naming that sample, the field and both
shapes or types. A dict value whose first dimension varies within a batch is padded in
that batch, with its lengths (a batch depends on its samples only, whatever the threads
did first; declare it with a leading ``None`` to have its lengths in every batch); a
varying shape elsewhere (inside a tuple, a nested container) is an error, as it is for
default_collate.
"""

from __future__ import annotations

import copy
import math
import threading
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np
import torch

from ..fields import Blob, Field, NDArray, Scalar
from .structure import Structure, key_name, path_str, where_text

__all__ = ["BatchLayout", "FieldLayout", "Specs", "TensorSpec", "is_object_spec"]

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

    __slots__ = ("key", "kind", "dtype", "shape", "source", "name", "path", "can_pad")

    def __init__(self, key: Hashable, kind: str, dtype: Any = None,
                 shape: Tuple[int, ...] = (), source: str = ""):
        self.key = key
        self.name = str(key)  # the tensor's name; a nested leaf's is its path, "meta.boxes"
        self.path: Tuple[Hashable, ...] = (key,)
        self.can_pad = True  # a value of a top dict: "<name>_lengths" has a place
        self.kind = kind
        self.dtype = dtype  # np.dtype, or "bfloat16" (torch tensors only)
        self.shape = shape  # "array": the sample's shape; "var": the shape of one row
        self.source = source  # "declared" or "inferred from sample N", for errors

    def describe(self) -> str:
        if self.kind == "object":
            return "a Python object (batched as a list)"
        if self.kind == "stack":
            return f"a {self.dtype} tensor of shape {_shape_str(self.shape)} (stacked)"
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


class Specs:
    """A batch's tensors laid out one after another in its buffer, each aligned as the
    C++ planner aligns them: ``specs``, and ``offset``, the bytes they take."""

    def __init__(self) -> None:
        self.specs: List[TensorSpec] = []
        self.offset = 0

    def add(self, name: str, dtype: Any, shape: Tuple[int, ...]) -> TensorSpec:
        itemsize = 2 if dtype == _BF16 else np.dtype(dtype).itemsize
        spec = TensorSpec(name, name, dtype, shape, self.offset, itemsize * math.prod(shape))
        self.specs.append(spec)
        self.offset = _align(self.offset + spec.nbytes)
        return spec


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
        raise TypeError(f"map_fields[{key_name(key)}]: {spec!r} cannot describe a Python "
                        "output; use stoker.ndarray(dtype, shape) (a leading None for a "
                        "variable first dimension), stoker.scalar(dtype), stoker.blob(), or "
                        "object for a list")
    raise TypeError(f"map_fields[{key_name(key)}] must be stoker.ndarray(...), "
                    f"stoker.scalar(...), stoker.blob() or object, got {spec!r}")


class _Stacked:
    """A tensor of a dtype the batch buffer does not hold (complex, ...): batched by
    ``torch.stack`` when the batch is assembled, as default_collate does."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


def _as_array(value: Any) -> Any:
    """A sample value as an array (np.ndarray, or a torch tensor for bfloat16), a
    ``("scalar", np.dtype, value)`` tuple, a _Stacked tensor, or None for an object.
    Views (non-contiguous tensors and arrays) are taken as they are: the batch copies
    them. Raises _Mismatch for values that cannot be batched (GPU tensors)."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:  # default_collate's error, in its words
            raise RuntimeError("Batches of nested tensors are not currently supported by the "
                               "default collate_fn; please provide a custom collate_fn to "
                               "handle them appropriately.")
        if value.device.type != "cpu":
            raise _Mismatch(f"is a tensor on {value.device}: return CPU tensors or arrays "
                            "(batch_map receives the batch on the device with device='cuda')")
        if value.dtype == torch.bfloat16:
            return value.detach()
        if value.dtype not in _TORCH_TO_NUMPY:
            return _Stacked(value.detach())
        if value.is_conj() or value.is_neg():
            value = value.resolve_conj().resolve_neg()
        return value.detach().numpy()
    if isinstance(value, np.ndarray):
        if value.dtype.char not in _NATIVE_CHARS:
            if value.dtype.kind in "biufc":  # complex and the like: as default_collate
                return _Stacked(torch.as_tensor(value))
            return None  # str, bytes, object arrays: a list of them
        return value
    if isinstance(value, (bool, np.bool_)):
        return ("scalar", np.dtype("bool"), value)
    if isinstance(value, int):
        return ("scalar", np.dtype("int64"), value)
    if isinstance(value, float):
        return ("scalar", np.dtype("float64"), value)
    if isinstance(value, np.generic):
        if value.dtype.char not in _NATIVE_CHARS:
            if value.dtype.kind in "biufc":
                return _Stacked(torch.as_tensor(value))
            return None
        return ("scalar", value.dtype, value)
    return None


def _infer(key: Hashable, value: Any, where: str) -> FieldLayout:
    source = f"inferred from {where}"
    try:
        v = _as_array(value)
    except _Mismatch as e:
        raise ValueError(f"{where}: field {key_name(key)} {e}") from None
    if v is None:
        return FieldLayout(key, "object", source=source)
    if isinstance(v, _Stacked):
        return FieldLayout(key, "stack", v.tensor.dtype, tuple(v.tensor.shape), source)
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
    """The structure of a stream of samples and how each leaf is batched (NOTE [ Batching
    Python outputs ]). Thread-safe: the first sample batched fixes what ``map_fields``
    leaves open, once.

    Args:
        declared: ``map_fields``, ``{key: stoker.ndarray(...) | stoker.scalar(...) |
            stoker.blob() | object}`` for keys of a dict sample (or positions of a tuple);
            keys not declared are inferred.
        what: what produced the samples, for errors ("map output", "dataset item").
        defaults: layouts for keys the samples may have, used when present and not
            declared (a stoker dataset's variable-length fields and blobs).
    """

    def __init__(self, declared: Optional[Mapping[Hashable, Any]] = None,
                 what: str = "map output",
                 defaults: Optional[Mapping[Hashable, Any]] = None):
        if declared is not None and not isinstance(declared, Mapping):
            raise TypeError(f"map_fields must be a dict {{name: field type}}, got "
                            f"{type(declared).__name__}")
        self.what = what
        self._declared = {k: _declared(k, v) for k, v in (declared or {}).items()}
        # a stoker dataset's variable-length fields and blobs, batched as the loader batches
        # them without map (padded, with lengths)
        self._defaults = {k: _declared(k, v) for k, v in (defaults or {}).items()
                          if k not in self._declared}
        for f in self._defaults.values():
            f.source = "the dataset's field type"
        self._fields: Optional[Dict[str, FieldLayout]] = None
        self._list: List[FieldLayout] = []
        self.structure: Optional[Structure] = None
        self._lock = threading.Lock()

    @property
    def fields(self) -> Optional[Dict[str, FieldLayout]]:
        """Leaf name -> FieldLayout once known (None before the first sample)."""
        return self._fields

    def _establish(self, sample: Any, where: str) -> List[FieldLayout]:
        with self._lock:
            if self._fields is None:
                top = sample if isinstance(sample, Mapping) else None
                if self._declared and top is None and not isinstance(sample, (list, tuple)):
                    raise ValueError(f"{where}: map_fields names keys, but the {self.what} "
                                     f"is a {type(sample).__name__}")
                have = set(sample.keys()) if top is not None else \
                    set(range(len(sample))) if isinstance(sample, (list, tuple)) else set()
                missing = [k for k in self._declared if k not in have]
                if missing:
                    raise ValueError(
                        f"{where}: the {self.what} has no field "
                        f"{', '.join(map(key_name, missing))} that map_fields declares "
                        f"(it has {', '.join(map(key_name, have)) or 'none'})")
                structure = Structure(sample, self._declared, where)
                leaves = structure.flatten(sample, where, self.what)
                fields: Dict[str, FieldLayout] = {}
                layouts = []
                for path, value in zip(structure.paths, leaves):
                    key = path[0] if len(path) == 1 else None
                    name = ".".join(map(str, path)) if path else "0"
                    if len(path) == 1 and key in self._declared:
                        f = self._declared[key]
                    elif len(path) == 1 and key in self._defaults:
                        f = self._defaults[key]
                    else:
                        f = _infer(path[0] if len(path) == 1 else name, value, where)
                    f = copy.copy(f)
                    f.name, f.path = name, path
                    # padding has a place only beside a value of the top dict
                    f.can_pad = len(path) == 1 and top is not None
                    if f.kind == "var" and not f.can_pad:
                        raise ValueError(f"{where}: {path_str(path)} of the {self.what} is "
                                         "declared with a variable first dimension, whose "
                                         "lengths go under '<name>_lengths' in a dict: return "
                                         "a dict (or pass names=)")
                    if name in fields:
                        raise ValueError(f"{where}: keys {fields[name].key!r} and "
                                         f"{f.key!r} of the {self.what} have the same name "
                                         f"{name!r}")
                    fields[name] = f
                    layouts.append(f)
                for f in layouts:
                    if f.can_pad and f"{f.name}_lengths" in fields:
                        raise ValueError(f"{where}: the {self.what} has a field "
                                         f"'{f.name}_lengths', the name of field "
                                         f"{key_name(f.key)}'s lengths in the batch")
                self.structure = structure
                self._list = layouts
                self._fields = fields
            return self._list

    def check(self, sample: Any, where: Any) -> List[Any]:
        """The sample's leaves in layout order, as arrays / ("scalar", dtype, value) /
        objects, checked against the layout (fixing it at the first sample). ValueError
        naming `where` (a str, or a callable that makes it), the field and both shapes
        when the sample disagrees."""
        layouts = self._list if self._fields is not None else \
            self._establish(sample, where_text(where))
        assert self.structure is not None
        leaves = self.structure.flatten(sample, where, self.what)
        out = []
        for i, f in enumerate(layouts):
            value = leaves[i]
            kind = f.kind
            if kind == "object":
                out.append(value)
                continue
            if kind == "stack":
                v = _as_array(value)
                t = v.tensor if isinstance(v, _Stacked) else None
                if t is None or t.dtype != f.dtype or tuple(t.shape) != f.shape:
                    raise ValueError(f"{where_text(where)}: field {key_name(f.key)} is not a "
                                     f"{f.dtype} tensor of shape {_shape_str(f.shape)}, as "
                                     f"the layout ({f.source})")
                out.append(t)
                continue
            # The common case first: an array that fits as it is.
            if type(value) is np.ndarray and kind != "scalar" and value.dtype == f.dtype:
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
                if v is None or isinstance(v, _Stacked):
                    raise _Mismatch(f"is a {type(value).__name__}, not an array or number "
                                    "of a dtype the batch holds")
                out.append(self._fit(i, v))
            except _Mismatch as e:
                f = self._list[i]
                raise ValueError(f"{where_text(where)}: field {key_name(f.key)} {e}; the layout "
                                 f"({f.source}) has {f.describe()}") from None
        return out

    def _fit(self, i: int, v: Any) -> Any:
        f = self._list[i]
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
                if f.can_pad and f.source != "declared" and len(shape) == len(f.shape) and \
                        shape and shape[1:] == f.shape[1:] and dtype == f.dtype:
                    return v  # the first dimension varies: padded in a batch where it does
                hint = ""
                if len(shape) == len(f.shape) and shape and shape[1:] == f.shape[1:]:
                    hint = (" (a varying first dimension is padded in a dict's values: "
                            "return a dict, or declare it: map_fields="
                            f"{{{key_name(f.key)}: stoker.ndarray('{_dtype_name(f.dtype)}', "
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
        if self._fields is None:
            return [], 0
        b = len(rows)
        out = Specs()
        for i, f in enumerate(self._list):
            if f.kind in ("object", "stack"):
                continue
            if f.kind == "scalar":
                out.add(f.name, f.dtype, (b,))
            elif f.kind == "array" and _uniform(rows, i):
                out.add(f.name, f.dtype, (b,) + (tuple(rows[0][i].shape) if rows else f.shape))
            else:  # padded: declared so, or a dict value whose first dimension varies here
                rest = f.shape if f.kind == "var" else f.shape[1:]
                longest = max((len(r[i]) for r in rows), default=0)
                out.add(f.name, f.dtype, (b, longest) + rest)
                out.add(f"{f.name}_lengths", np.dtype("int64"), (b,))
        return out.specs, out.offset

    def write(self, rows: Sequence[List[Any]], specs: Sequence[TensorSpec],
              buffer: np.ndarray, in_place: Optional[Set[int]] = None
              ) -> Dict[str, List[Any]]:
        """Writes the samples into `buffer` (a writable uint8 array of at least the planned
        bytes) at the planned offsets; returns the object leaves as lists, by name.
        `in_place`: leaves whose every row is in the buffer already (NOTE [ Direct rows ]
        in direct.py)."""
        objects: Dict[str, List[Any]] = {}
        if self._fields is None:
            return objects
        by_name = {s.name: s for s in specs}
        for i, f in enumerate(self._list):
            column = [r[i] for r in rows]
            if f.kind == "object":
                objects[f.name] = column
                continue
            if f.kind == "stack":
                objects[f.name] = [torch.stack(column)] if column else []
                continue
            if in_place and i in in_place:
                continue
            spec = by_name[f.name]
            dst = _view(buffer, spec)
            if f.kind == "scalar":
                if not column:
                    continue
                if f.dtype == _BF16:  # only tensors are bfloat16
                    torch.stack(column, out=dst)
                else:
                    dst[:] = [c[2] if isinstance(c, tuple) else c for c in column]
            elif f"{f.name}_lengths" not in by_name:
                if not column:
                    continue
                if f.dtype == _BF16:
                    torch.stack(column, out=dst)
                else:
                    np.stack(column, out=dst)
            else:
                lengths = _view(buffer, by_name[f"{f.name}_lengths"])
                longest = spec.shape[1]
                ns = [len(c) for c in column]
                lengths[:] = ns
                if f.dtype != _BF16 and column and \
                        spec.nbytes <= _SMALL_ROWS * len(column) and \
                        all(c.flags.c_contiguous for c in column):
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

    def assemble(self, tensors: Mapping[str, Any], objects: Mapping[str, List[Any]]) -> Any:
        """The batch in the samples' structure (default_collate's): `tensors` by name (a
        padded leaf's "<name>_lengths" too), `objects` the object leaves' lists."""
        if self.structure is None:
            return {}
        leaves: List[Any] = []
        lengths: Dict[int, Any] = {}
        in_sequence = self.structure.in_sequence
        for i, f in enumerate(self._list):
            if f.kind == "object":
                column = objects.get(f.name, [])
                leaves.append(tuple(column) if in_sequence[i] else column)
                continue
            if f.kind == "stack":
                got = objects.get(f.name)
                leaves.append(got[0] if got else torch.empty((0,) + f.shape, dtype=f.dtype))
                continue
            leaves.append(tensors[f.name])
            lk = f"{f.name}_lengths"
            if lk in tensors:
                lengths[i] = tensors[lk]
        return self.structure.build(leaves, lengths)


def _uniform(rows: Sequence[List[Any]], i: int) -> bool:
    """Whether leaf i has one shape in every row of the batch."""
    if not rows:
        return True
    shape = rows[0][i].shape
    return all(r[i].shape == shape for r in rows)


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
               ) -> Dict[str, torch.Tensor]:
    """The planned tensors of a written buffer as torch tensors (no copy)."""
    out = {}
    for s in specs:
        v = _view(buffer, s)
        out[s.name] = v if isinstance(v, torch.Tensor) else to_tensor(v)
    return out
