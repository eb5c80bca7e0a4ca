"""Image ops, run by the C++ workers on ``stoker.image()`` fields.

Use them in ``Loader(transforms={"image": [...]})``; they apply in order to each image
after decoding, and their random draws depend only on (seed, epoch, sample index), so a
batch is bit-identical whatever the number of threads::

    transforms = {"image": [stoker.ops.RandomResizedCrop(224),
                            stoker.ops.RandomHorizontalFlip()]}

Semantics follow torchvision on PIL images: the crop rules, the rounding of sizes, and an
antialiased bilinear (triangle) resize like PIL's ``BILINEAR``. Images come out RGB
``uint8`` (grayscale, CMYK, palette and 16-bit inputs are converted; alpha is dropped),
in the field's layout (HWC or CHW). Keep them ``uint8`` through the host-to-device copy
(4x fewer bytes than float32) and normalise on the GPU; :class:`Normalize` is here for
CPU training.

For JPEGs, ``RandomResizedCrop`` decodes only the rows and columns its crop needs, at a
reduced DCT scale (1/2, 1/4, 1/8) when the crop is at least 2.5x, 5x, 10x the output
size; this is why it is cheaper than a full decode.
"""

from __future__ import annotations

import math
from typing import Any, List, Sequence, Tuple, Union

__all__ = ["Op", "RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip",
           "Normalize"]

_Size = Union[int, Sequence[int]]


def _pair(size: _Size, what: str) -> Tuple[int, int]:
    if isinstance(size, bool):
        raise ValueError(f"{what}: size must be an int or (h, w), got {size!r}")
    if isinstance(size, int):
        size = (size, size)
    try:
        size = tuple(size)
    except TypeError:
        raise ValueError(f"{what}: size must be a positive int or (h, w), got {size!r}") from None
    if len(size) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0
                                 for s in size):
        raise ValueError(f"{what}: size must be a positive int or (h, w), got {size!r}")
    return size


def _range(value: Any, what: str) -> Tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a pair of numbers, got {value!r}") from None
    return lo, hi


class Op:
    """Base class of image ops: the contract between Python and the C++ pipeline.

    A subclass sets ``kind`` (the C++ op name, see ``csrc/decode/image_ops.h``) and
    ``num_args``, validates its parameters in ``__init__`` (raising ``ValueError``), and
    implements ``args()``. The base checks the rest: subclasses must define ``kind`` and
    ``args`` (at class creation), and :meth:`spec` checks that ``args()`` gives exactly
    ``num_args`` finite numbers. The repr lists the public attributes.

    Example::

        >>> stoker.ops.CenterCrop(224).spec()
        ('center_crop', [224.0, 224.0])
    """

    kind: str = ""
    num_args: int = -1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(cls.__dict__.get("kind"), str) or not cls.kind:
            raise TypeError(f"{cls.__name__}: an Op subclass must set a non-empty `kind`")
        if not isinstance(cls.num_args, int) or cls.num_args < 0:
            raise TypeError(f"{cls.__name__}: an Op subclass must set `num_args`")
        if cls.args is Op.args:
            raise TypeError(f"{cls.__name__}: an Op subclass must implement args()")

    def args(self) -> List[float]:
        """The op's numeric arguments, in the order the C++ op reads them."""
        raise NotImplementedError

    def spec(self) -> Tuple[str, List[float]]:
        """``(kind, args)`` as the C++ pipeline takes it, after checking the contract."""
        args = self.args()
        if not isinstance(args, (list, tuple)) or len(args) != self.num_args:
            raise ValueError(f"{self!r}: args() must give {self.num_args} numbers, got {args!r}")
        try:
            args = [float(a) for a in args]
        except (TypeError, ValueError):
            raise ValueError(f"{self!r}: args() must give numbers, got {args!r}") from None
        if not all(math.isfinite(a) for a in args):
            raise ValueError(f"{self!r}: args() must be finite, got {args!r}")
        return self.kind, args

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), tuple(self.spec()[1])))


class RandomResizedCrop(Op):
    """A random crop of area fraction ``scale`` and aspect ratio ``ratio``, resized to
    ``size`` (an int for a square, or ``(h, w)``).

    The crop is drawn with torchvision's rule (10 tries of area uniform in ``scale`` and
    log-aspect uniform in ``log(ratio)``, then a central crop with the ratio clamped), and
    resized with an antialiased triangle filter (PIL's ``BILINEAR``).

    Example::

        stoker.ops.RandomResizedCrop(224)
        stoker.ops.RandomResizedCrop((160, 192), scale=(0.35, 1.0))
    """

    kind = "random_resized_crop"
    num_args = 6

    def __init__(self, size: _Size, scale: Tuple[float, float] = (0.08, 1.0),
                 ratio: Tuple[float, float] = (3 / 4, 4 / 3)):
        self.size = _pair(size, "RandomResizedCrop")
        scale = _range(scale, "RandomResizedCrop: scale")
        ratio = _range(ratio, "RandomResizedCrop: ratio")
        if not (0 < scale[0] <= scale[1]):
            raise ValueError(f"RandomResizedCrop: scale must satisfy 0 < lo <= hi, got {scale}")
        if not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"RandomResizedCrop: ratio must satisfy 0 < lo <= hi, got {ratio}")
        self.scale = scale
        self.ratio = ratio

    def args(self) -> List[float]:
        # The C++ side samples the log-ratio uniformly, as torchvision does.
        return [*self.size, *self.scale, math.log(self.ratio[0]), math.log(self.ratio[1])]


class Resize(Op):
    """Resizes the shorter side to ``size`` keeping the aspect ratio (the longer side
    becomes ``int(size * long / short)``, as torchvision), or to exactly ``(h, w)``.
    Antialiased triangle filter (PIL's ``BILINEAR``).

    Example::

        [stoker.ops.Resize(256), stoker.ops.CenterCrop(224)]   # the usual evaluation pair
    """

    kind = "resize"
    num_args = 2

    def __init__(self, size: _Size):
        self.size: Union[int, Tuple[int, int]]
        if isinstance(size, int) and not isinstance(size, bool):
            if size <= 0:
                raise ValueError(f"Resize: size must be positive, got {size}")
            self.size = size
        else:
            self.size = _pair(size, "Resize")

    def args(self) -> List[float]:
        return [self.size, -1] if isinstance(self.size, int) else list(self.size)


class CenterCrop(Op):
    """The central ``size`` region (an int for a square, or ``(h, w)``), with
    torchvision's rounding; an image smaller than the crop is padded with zeros.

    Example::

        stoker.ops.CenterCrop(224)
    """

    kind = "center_crop"
    num_args = 2

    def __init__(self, size: _Size):
        self.size = _pair(size, "CenterCrop")

    def args(self) -> List[float]:
        return list(self.size)


class RandomHorizontalFlip(Op):
    """Mirrors the image left-right with probability ``p``.

    Example::

        stoker.ops.RandomHorizontalFlip()        # p = 0.5
    """

    kind = "random_horizontal_flip"
    num_args = 1

    def __init__(self, p: float = 0.5):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueError(f"RandomHorizontalFlip: p must be a number in [0, 1], got {p!r}")
        self.p = float(p)

    def args(self) -> List[float]:
        return [self.p]


class Normalize(Op):
    """``(x / 255 - mean) / std`` per RGB channel, giving ``float32`` or ``float16``.
    Must be the last op.

    Example::

        stoker.ops.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    """

    kind = "normalize"
    num_args = 7

    def __init__(self, mean: Sequence[float], std: Sequence[float], dtype: str = "float32"):
        try:
            mean = tuple(float(m) for m in mean)
            std = tuple(float(s) for s in std)
        except (TypeError, ValueError):
            raise ValueError("Normalize: mean and std must be 3 numbers each") from None
        if len(mean) != 3 or len(std) != 3:
            raise ValueError("Normalize: mean and std need 3 values (RGB)")
        if any(s == 0 for s in std):
            raise ValueError("Normalize: std must be non-zero")
        if dtype not in ("float32", "float16"):
            raise ValueError(f"Normalize: dtype must be 'float32' or 'float16', got {dtype!r}")
        self.mean = mean
        self.std = std
        self.dtype = dtype

    def args(self) -> List[float]:
        return [*self.mean, *self.std, 1.0 if self.dtype == "float16" else 0.0]


def _specs(ops: Sequence[Op]) -> List[Tuple[str, List[float]]]:
    """The op list as the C++ pipeline takes it: ``[(kind, args), ...]``.

    Accepts a single op too. Checks that Normalize, if present, is last (the C++ side
    checks again, but this error names the Python objects).
    """
    if isinstance(ops, Op):
        ops = [ops]
    ops = list(ops)
    for op in ops:
        if not isinstance(op, Op):
            raise TypeError(f"image transforms must be stoker.ops.Op instances, got {op!r}")
    for op in ops[:-1]:
        if isinstance(op, Normalize):
            raise ValueError(f"{op!r} must be the last op, got {ops!r}")
    return [op.spec() for op in ops]
