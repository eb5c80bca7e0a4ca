"""Image ops, run by the C++ workers on ``stoker.image()`` fields.

Use them in ``Loader(transforms={"image": [...]})``; they apply in order to each image
after decoding, and their random draws depend only on (seed, epoch, sample index), so a
batch is bit-identical whatever the number of threads::

    transforms = {"image": [stoker.ops.RandomResizedCrop(224),
                            stoker.ops.RandomHorizontalFlip()]}

Keep images ``uint8`` through the host-to-device copy (4x fewer bytes than float32) and
normalise on the GPU; :class:`Normalize` is here for CPU training.
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple, Union

__all__ = ["Op", "RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip",
           "Normalize"]

Size = Union[int, Sequence[int]]


def _pair(size: Size, what: str) -> Tuple[int, int]:
    if isinstance(size, bool):
        raise ValueError(f"{what}: size must be an int or (h, w), got {size!r}")
    if isinstance(size, int):
        size = (size, size)
    size = tuple(size)
    if len(size) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0
                                 for s in size):
        raise ValueError(f"{what}: size must be a positive int or (h, w), got {size!r}")
    return size


class Op:
    """Base class of image ops. A subclass sets ``kind`` (the C++ op name) and
    implements ``args()``; the base checks the contract (numbers only)."""

    kind: str = ""

    def args(self) -> List[float]:
        raise NotImplementedError

    def spec(self) -> Tuple[str, List[float]]:
        args = [float(a) for a in self.args()]
        if not self.kind or not all(math.isfinite(a) for a in args):
            raise ValueError(f"{self!r}: invalid op specification")
        return self.kind, args

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"stoker.ops.{type(self).__name__}({fields})"


class RandomResizedCrop(Op):
    """A random crop of area ``scale`` and aspect ratio ``ratio`` (torchvision's sampling
    rule, 10 tries then a central fallback), resized to ``size`` with an antialiased
    bilinear filter.

    Example: ``stoker.ops.RandomResizedCrop(224)``.
    """

    kind = "random_resized_crop"

    def __init__(self, size: Size, scale: Tuple[float, float] = (0.08, 1.0),
                 ratio: Tuple[float, float] = (3 / 4, 4 / 3)):
        self.size = _pair(size, "RandomResizedCrop")
        if not (0 < scale[0] <= scale[1] <= 1):
            raise ValueError(f"RandomResizedCrop: scale must satisfy 0 < lo <= hi <= 1, "
                             f"got {scale}")
        if not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"RandomResizedCrop: ratio must satisfy 0 < lo <= hi, got {ratio}")
        self.scale = tuple(scale)
        self.ratio = tuple(ratio)

    def args(self) -> List[float]:
        return [*self.size, *self.scale, math.log(self.ratio[0]), math.log(self.ratio[1])]


class Resize(Op):
    """Resizes the shorter side to ``size`` (aspect kept, torchvision's rounding), or to
    exactly ``(h, w)``. Antialiased bilinear.

    Example: ``stoker.ops.Resize(256)``.
    """

    kind = "resize"

    def __init__(self, size: Size):
        if isinstance(size, int) and not isinstance(size, bool):
            if size <= 0:
                raise ValueError(f"Resize: size must be positive, got {size}")
            self.size = size
        else:
            self.size = _pair(size, "Resize")

    def args(self) -> List[float]:
        return [self.size, -1] if isinstance(self.size, int) else list(self.size)


class CenterCrop(Op):
    """The central ``size`` region (zero-padded when the image is smaller), as torchvision.

    Example: ``stoker.ops.CenterCrop(224)``.
    """

    kind = "center_crop"

    def __init__(self, size: Size):
        self.size = _pair(size, "CenterCrop")

    def args(self) -> List[float]:
        return list(self.size)


class RandomHorizontalFlip(Op):
    """Mirrors the image left-right with probability ``p``.

    Example: ``stoker.ops.RandomHorizontalFlip()``.
    """

    kind = "random_horizontal_flip"

    def __init__(self, p: float = 0.5):
        if not 0 <= p <= 1:
            raise ValueError(f"RandomHorizontalFlip: p must be in [0, 1], got {p}")
        self.p = p

    def args(self) -> List[float]:
        return [self.p]


class Normalize(Op):
    """``(x / 255 - mean) / std`` per channel, to ``float32`` or ``float16``. Must be last.

    Example: ``stoker.ops.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))``.
    """

    kind = "normalize"

    def __init__(self, mean: Sequence[float], std: Sequence[float], dtype: str = "float32"):
        if len(mean) != 3 or len(std) != 3:
            raise ValueError("Normalize: mean and std need 3 values (RGB)")
        if any(s == 0 for s in std):
            raise ValueError("Normalize: std must be non-zero")
        if dtype not in ("float32", "float16"):
            raise ValueError(f"Normalize: dtype must be 'float32' or 'float16', got {dtype!r}")
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.dtype = dtype

    def args(self) -> List[float]:
        return [*self.mean, *self.std, 1.0 if self.dtype == "float16" else 0.0]


def _specs(ops: Sequence[Op]) -> List[Tuple[str, List[float]]]:
    """The op list as the C++ pipeline takes it."""
    return [op.spec() for op in ops]
