"""The bases of stoker.ops: :class:`Op` (an image op, built into a C++ op of
``csrc/geometry/image_ops.h``), :class:`BatchOp` (an op on whole batches), the argument
helpers the families share, and :func:`op_specs` (an op list as the C++ pipeline takes it)."""

from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple, Union

from .. import _core

_Size = Union[int, Sequence[int]]


def _pair(size: _Size, what: str) -> Tuple[int, int]:
    """An int or an (h, w) pair of ints as (h, w); the C++ op checks the values."""
    if isinstance(size, bool):
        raise ValueError(f"{what}: size must be an int or (h, w), got {size!r}")
    if isinstance(size, int):
        size = (size, size)
    try:
        size = tuple(size)
    except TypeError:
        raise ValueError(f"{what}: size must be a positive int or (h, w), got {size!r}") from None
    if len(size) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) for s in size):
        raise ValueError(f"{what}: size must be a positive int or (h, w), got {size!r}")
    return size


def _range(value: Any, what: str) -> Tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a pair of numbers, got {value!r}") from None
    return lo, hi


def _floats(value: Any) -> Any:
    """A sequence of numbers as a tuple of floats, anything else as _values() gives it."""
    try:
        return tuple(float(v) for v in value)
    except (TypeError, ValueError):
        return _values(value)


def _values(value: Any) -> Any:
    """A sequence as a tuple (a parameter of several values), anything else unchanged."""
    if isinstance(value, (str, bytes)):
        return value
    try:
        return tuple(value)
    except TypeError:
        return value


class Op:
    """Base class of image ops: each builds one op of the C++ pipeline.

    A subclass sets ``kind``, the C++ op it builds (one of
    ``stoker._core.IMAGE_OPS``: the ops of ``csrc/geometry/image_ops.h``), and
    ``num_args``, and implements ``args()``: that op's parameters in its order (a
    parameter of several values, such as Normalize's mean, as one sequence). The C++ op
    checks the values, once, when it is built (``ValueError`` naming the op and the
    parameter): the ops here build theirs in ``__init__``, so a bad value fails at
    construction; any op is built again, and checked, when a ``Loader`` is made. The
    base checks the rest: subclasses must define ``kind`` and ``args`` (at class
    creation), and :meth:`spec` checks that ``args()`` gives ``num_args`` finite values.
    The repr lists the public attributes.

    Example::

        >>> stoker.ops.CenterCrop(224).spec()
        ('center_crop', [224, 224])
        >>> stoker.ops.CenterCrop(224).build()
        CenterCrop(h=224, w=224)
    """

    kind: str = ""
    num_args: int = -1
    #: whether the op moves pixels (crops, resizes, flips, padding, warps, and the
    #: auto-augment policies' shears): a mask, boxes or keypoints field outside its group
    #: would be left behind, so the Loader refuses that
    moves_pixels: bool = False
    #: fewer values args() may give: parameters added later, left out at their defaults
    #: (the C++ op's own defaults), so that spec() reads as it did before them
    min_args: Optional[int] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(cls.__dict__.get("kind"), str) or not cls.kind:
            raise TypeError(f"{cls.__name__}: an Op subclass must set a non-empty `kind`")
        if not isinstance(cls.num_args, int) or cls.num_args < 0:
            raise TypeError(f"{cls.__name__}: an Op subclass must set `num_args`")
        if cls.args is Op.args:
            raise TypeError(f"{cls.__name__}: an Op subclass must implement args()")

    def args(self) -> List[Any]:
        """The C++ op's parameters, in its order."""
        raise NotImplementedError

    def spec(self) -> Tuple[str, List[Any]]:
        """``(kind, args)``, after checking the contract: ``num_args`` values, the numbers
        among them finite (the C++ op checks the rest when it is built)."""
        args = self.args()
        least = self.num_args if self.min_args is None else self.min_args
        if not isinstance(args, (list, tuple)) or not least <= len(args) <= self.num_args:
            raise ValueError(f"{self!r}: args() must give {self.num_args} numbers, got {args!r}")
        args = [_values(a) for a in args]
        numbers = [x for a in args for x in (a if isinstance(a, tuple) else (a,))
                   if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if not all(math.isfinite(x) for x in numbers):
            raise ValueError(f"{self!r}: args() must be finite, got {args!r}")
        return self.kind, args

    def build(self) -> _core.ImageOp:
        """The C++ op (a ``stoker._core`` op object), checked there: ValueError
        naming the op and the parameter when a value is out of range."""
        kind, args = self.spec()
        op = _core.IMAGE_OPS.get(kind)
        if op is None:
            raise ValueError(f"{self!r}: no C++ image op of kind {kind!r} (there are: "
                             f"{', '.join(sorted(_core.IMAGE_OPS))})")
        return op(*args)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), repr(self.spec()[1])))


class BatchOp:
    """Base of the ops on whole batches (``Loader(batch_transforms=[...])``), run by the C++
    workers on each assembled batch, before it reaches Python: :class:`MixUp` and
    :class:`CutMix`. ``labels`` and ``image`` name the fields (by default "label" or
    "labels", and the dataset's one RGB image).

    Example::

        stoker.Loader(ds, batch_size=256, batch_transforms=[
            stoker.ops.MixUp(0.8, num_classes=1000, labels="target")])
    """

    _name = ""

    def __init__(self, alpha: float = 1.0, num_classes: Optional[int] = None, *,
                 p: float = 1.0, label_smoothing: float = 0.0,
                 switch_prob: Optional[float] = None, labels: Optional[str] = None,
                 image: Optional[str] = None):
        name = type(self).__name__
        if num_classes is None or isinstance(num_classes, bool) or \
                not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"{name}: num_classes must be a positive int (the soft labels' "
                             f"width), got {num_classes!r}")
        for what, v in (("alpha", alpha), ("p", p), ("label_smoothing", label_smoothing)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name}: {what} must be a number, got {v!r}")
        self.alpha, self.num_classes = float(alpha), num_classes
        self.p, self.label_smoothing = float(p), float(label_smoothing)
        self.switch_prob = switch_prob
        self.labels, self.image = labels, image
        # the C++ check, now rather than at Loader(...)
        params = self.params()
        _core.BatchMixOptions(image="", labels="", num_classes=num_classes,
                              mixup=params if self._name == "mixup" else None,
                              cutmix=params if self._name == "cutmix" else None)

    def params(self) -> Tuple[float, float, float]:
        """(alpha, p, label_smoothing), as the C++ batch mix takes them."""
        return (self.alpha, self.p, self.label_smoothing)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if v is not None)
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), repr(self)))


def op_specs(ops: Union[Op, Sequence[Op]]) -> List[_core.ImageOp]:
    """The op list as the C++ pipeline takes it: the C++ ops (``Op.build()``), checked
    as a list (Normalize last). Accepts a single op too."""
    if isinstance(ops, Op):
        ops = [ops]
    ops = list(ops)
    for op in ops:
        if not isinstance(op, Op):
            raise TypeError(f"image transforms must be stoker.ops.Op instances, got {op!r}")
    built = [op.build() for op in ops]
    _core.check_image_ops(built)
    return built
