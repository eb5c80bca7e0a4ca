"""Image ops, run by the C++ workers on ``stoker.image()`` fields.

Use them in ``Loader(transforms={"image": [...]})``; they apply in order to each image
after decoding, and their random draws depend only on (seed, epoch, sample index), so a
batch is bit-identical whatever the number of threads::

    transforms = {"image": [stoker.ops.RandomResizedCrop(224),
                            stoker.ops.RandomHorizontalFlip()]}

Semantics follow torchvision on PIL images: the crop rules, the rounding of sizes, and an
antialiased bilinear (triangle) resize like PIL's ``BILINEAR``. Images come out RGB
``uint8`` (grayscale, CMYK, palette and 16-bit inputs are converted; alpha is dropped),
in the field's layout (HWC or CHW; the loader hands either out in NCHW shape). Keep them
``uint8`` through the host-to-device copy (4x fewer bytes than float32) and normalise on
the GPU; :class:`Normalize` is here for CPU training.

For JPEGs, ``RandomResizedCrop`` decodes only the rows and columns its crop needs, at a
reduced DCT scale (1/2, 1/4, 1/8) when the crop is at least 2.5x, 5x, 10x the output
size; this is why it is cheaper than a full decode.
"""

from __future__ import annotations

import math
from typing import Any, List, Sequence, Tuple, Union

from . import _core

__all__ = ["Op", "RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip",
           "Normalize", "ColorJitter", "RandomGrayscale", "GaussianBlur", "HSVJitter",
           "RandAugment", "TrivialAugmentWide", "AutoAugment", "RandomErasing", "RandomCrop",
           "Pad"]

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
    ``stoker._core.IMAGE_OPS``: the ops of ``csrc/decode/image_ops.h``), and
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
        if not isinstance(args, (list, tuple)) or len(args) != self.num_args:
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
        self.scale = _range(scale, "RandomResizedCrop: scale")
        self.ratio = _range(ratio, "RandomResizedCrop: ratio")
        self.build()

    def args(self) -> List[Any]:
        return [*self.size, *self.scale, *self.ratio]


class Resize(Op):
    """Resizes the shorter side to ``size`` keeping the aspect ratio (the longer side
    becomes ``int(size * long / short)``, as torchvision), or to exactly ``(h, w)``.
    Antialiased triangle filter (PIL's ``BILINEAR``).

    Example::

        [stoker.ops.Resize(256), stoker.ops.CenterCrop(224)]   # the usual evaluation pair
    """

    kind = "resize"
    num_args = 3

    def __init__(self, size: _Size):
        self.size: Union[int, Tuple[int, int]]
        if isinstance(size, int) and not isinstance(size, bool):
            self.size = size
        else:
            self.size = _pair(size, "Resize")
        self.build()

    def args(self) -> List[Any]:
        # (h, w, shorter): exactly (h, w), or the shorter side to `shorter`
        return [0, 0, self.size] if isinstance(self.size, int) else [*self.size, 0]


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
        self.build()

    def args(self) -> List[Any]:
        return list(self.size)


class RandomHorizontalFlip(Op):
    """Mirrors the image left-right with probability ``p``.

    Example::

        stoker.ops.RandomHorizontalFlip()        # p = 0.5
    """

    kind = "random_horizontal_flip"
    num_args = 1

    def __init__(self, p: float = 0.5):
        self.p = float(p) if isinstance(p, (int, float)) and not isinstance(p, bool) else p
        self.build()

    def args(self) -> List[Any]:
        return [self.p]


class Normalize(Op):
    """``(x / 255 - mean) / std`` per RGB channel, giving ``float32`` or ``float16``.
    Must be the last op.

    Example::

        stoker.ops.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    """

    kind = "normalize"
    num_args = 3

    def __init__(self, mean: Sequence[float], std: Sequence[float], dtype: str = "float32"):
        self.mean = _floats(mean)
        self.std = _floats(std)
        self.dtype = dtype
        self.build()

    def args(self) -> List[Any]:
        return [self.mean, self.std, self.dtype]


def _jitter(value: Any, name: str, centre: float, lo_bound: float) -> Tuple[float, float]:
    """torchvision's ColorJitter argument: None (no change), a number v for
    [max(lo_bound, centre - v), centre + v], or a (lo, hi) pair."""
    if value is None:
        return (centre, centre)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"ColorJitter: {name} as a single number must be non-negative, "
                             f"got {value}")
        return (max(lo_bound, centre - value), centre + value)
    return _range(value, f"ColorJitter: {name}")


class ColorJitter(Op):
    """torchvision's ColorJitter: brightness, contrast and saturation factors and a hue
    shift, each drawn uniformly (a number ``v`` means ``[max(0, 1 - v), 1 + v]``, hue
    ``[-v, v]``; a pair is the range), applied in a random order, with torchvision's
    definitions on uint8 images. Fused: the four run in one or two passes over the pixels.

    Example::

        stoker.ops.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)
    """

    kind = "color_jitter"
    num_args = 4

    def __init__(self, brightness: Any = None, contrast: Any = None, saturation: Any = None,
                 hue: Any = None):
        self.brightness = _jitter(brightness, "brightness", 1.0, 0.0)
        self.contrast = _jitter(contrast, "contrast", 1.0, 0.0)
        self.saturation = _jitter(saturation, "saturation", 1.0, 0.0)
        self.hue = _jitter(hue, "hue", 0.0, -0.5)
        self.build()

    def args(self) -> List[Any]:
        return [self.brightness, self.contrast, self.saturation, self.hue]


class RandomGrayscale(Op):
    """With probability ``p``, the image's gray (0.2989 R + 0.587 G + 0.114 B) in every
    channel (torchvision's RandomGrayscale).

    Example::

        stoker.ops.RandomGrayscale(p=0.2)
    """

    kind = "random_grayscale"
    num_args = 1

    def __init__(self, p: float = 0.1):
        self.p = p
        self.build()

    def args(self) -> List[Any]:
        return [self.p]


class GaussianBlur(Op):
    """torchvision's GaussianBlur: an odd ``kernel_size`` (int or (h, w)) and a sigma
    drawn uniformly in ``sigma`` (a number, or a (lo, hi) pair) for both axes; reflect
    padding; separable.

    Example::

        stoker.ops.GaussianBlur(23, sigma=(0.1, 2.0))     # SimCLR / BYOL
    """

    kind = "gaussian_blur"
    num_args = 3

    def __init__(self, kernel_size: _Size, sigma: Any = (0.1, 2.0)):
        self.kernel_size = _pair(kernel_size, "GaussianBlur")
        if isinstance(sigma, (int, float)) and not isinstance(sigma, bool):
            sigma = (sigma, sigma)
        self.sigma = _range(sigma, "GaussianBlur: sigma")
        self.build()

    def args(self) -> List[Any]:
        return [*self.kernel_size, self.sigma]


class HSVJitter(Op):
    """YOLO's HSV jitter (ultralytics' ``augment_hsv`` with ``hsv_h``, ``hsv_s``,
    ``hsv_v``): gains ``1 + uniform(-1, 1) * (h, s, v)`` applied as tables in OpenCV's
    8-bit HSV space.

    Example::

        stoker.ops.HSVJitter(h=0.015, s=0.7, v=0.4)      # ultralytics' defaults
    """

    kind = "hsv_jitter"
    num_args = 3

    def __init__(self, h: float = 0.015, s: float = 0.7, v: float = 0.4):
        self.h, self.s, self.v = h, s, v
        self.build()

    def args(self) -> List[Any]:
        return [self.h, self.s, self.v]


class RandAugment(Op):
    """torchvision's RandAugment: ``num_ops`` ops drawn uniformly among its 14 (identity,
    shears, translations, rotation, brightness, color, contrast, sharpness, posterize,
    solarize, autocontrast, equalize) at bin ``magnitude`` of ``num_magnitude_bins``, a
    random sign where signed; nearest interpolation, zeros outside (torchvision's defaults).

    Example::

        stoker.ops.RandAugment(2, 9)                     # timm's rand-m9-n2
    """

    kind = "rand_augment"
    num_args = 3

    def __init__(self, num_ops: int = 2, magnitude: int = 9, num_magnitude_bins: int = 31):
        self.num_ops, self.magnitude, self.num_magnitude_bins = num_ops, magnitude, \
            num_magnitude_bins
        self.build()

    def args(self) -> List[Any]:
        return [self.num_ops, self.magnitude, self.num_magnitude_bins]


class TrivialAugmentWide(Op):
    """torchvision's TrivialAugmentWide: one op of RandAugment's 14 at a magnitude bin
    drawn uniformly, over the wide ranges.

    Example::

        stoker.ops.TrivialAugmentWide()
    """

    kind = "trivial_augment_wide"
    num_args = 1

    def __init__(self, num_magnitude_bins: int = 31):
        self.num_magnitude_bins = num_magnitude_bins
        self.build()

    def args(self) -> List[Any]:
        return [self.num_magnitude_bins]


class AutoAugment(Op):
    """torchvision's AutoAugment with its ImageNet policy (25 sub-policies of two ops with
    their probabilities and magnitudes).

    Example::

        stoker.ops.AutoAugment()
    """

    kind = "auto_augment"
    num_args = 0

    def __init__(self, policy: str = "imagenet"):
        if policy != "imagenet":
            raise ValueError(f"AutoAugment: only the 'imagenet' policy is built in, got {policy!r}")
        self.policy = policy
        self.build()

    def args(self) -> List[Any]:
        return []


class RandomErasing(Op):
    """torchvision's RandomErasing on the written output, as timm uses it after
    :class:`Normalize`: with probability ``p`` a rectangle of area fraction in ``scale``
    and aspect ratio in ``ratio`` gets ``value`` (a number or one per channel), or
    standard normal noise per element with ``value="random"`` (timm's ``mode="pixel"``).
    Must come after every other op.

    Example::

        [..., stoker.ops.Normalize(mean, std), stoker.ops.RandomErasing(0.25, value="random")]
    """

    kind = "random_erasing"
    num_args = 5

    def __init__(self, p: float = 0.5, scale: Any = (0.02, 0.33), ratio: Any = (0.3, 3.3),
                 value: Any = 0):
        self.p = p
        self.scale = _range(scale, "RandomErasing: scale")
        self.ratio = _range(ratio, "RandomErasing: ratio")
        if isinstance(value, str):
            if value != "random":
                raise ValueError(f"RandomErasing: value must be a number, 3 numbers or 'random', "
                                 f"got {value!r}")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)
        else:
            value = _floats(value)
        self.value = value
        self.build()

    def args(self) -> List[Any]:
        if self.value == "random":
            return [self.p, self.scale, self.ratio, (0.0, 0.0, 0.0), 1]
        v = self.value if isinstance(self.value, tuple) else (self.value,) * 3
        return [self.p, self.scale, self.ratio, v, 0]


_PAD_MODES = ("constant", "edge", "reflect", "symmetric")


def _padding(padding: Any, what: str) -> Tuple[int, int, int, int]:
    """torchvision's padding: an int (all sides), (left/right, top/bottom) or
    (left, top, right, bottom); as (left, top, right, bottom)."""
    if isinstance(padding, bool):
        raise ValueError(f"{what}: padding must be an int or a sequence of 2 or 4, got {padding!r}")
    if isinstance(padding, int):
        return (padding,) * 4
    p = tuple(padding)
    if len(p) == 1:
        return (p[0],) * 4
    if len(p) == 2:
        return (p[0], p[1], p[0], p[1])
    if len(p) == 4:
        return (p[0], p[1], p[2], p[3])
    raise ValueError(f"{what}: padding must be an int or a sequence of 2 or 4, got {padding!r}")


def _fill(fill: Any) -> Any:
    """A number for every channel, or one per channel (the C++ op checks the count)."""
    if isinstance(fill, (int, float)) and not isinstance(fill, bool):
        return (float(fill),) * 3
    return _floats(fill)


def _pad_mode(mode: str, what: str) -> int:
    if mode not in _PAD_MODES:
        raise ValueError(f"{what}: padding_mode must be one of {', '.join(_PAD_MODES)}, "
                         f"got {mode!r}")
    return _PAD_MODES.index(mode)


class RandomCrop(Op):
    """torchvision's RandomCrop: a ``size`` crop at a uniform position, after ``padding``
    (an int, (left/right, top/bottom) or (left, top, right, bottom)); ``pad_if_needed``
    pads both sides of a dimension smaller than the crop; ``fill`` and ``padding_mode``
    (``"constant"``, ``"edge"``, ``"reflect"``, ``"symmetric"``) as torchvision's.

    Example::

        stoker.ops.RandomCrop(32, padding=4)           # the CIFAR recipe
    """

    kind = "random_crop"
    num_args = 9

    def __init__(self, size: _Size, padding: Any = 0, pad_if_needed: bool = False,
                 fill: Any = 0, padding_mode: str = "constant"):
        self.size = _pair(size, "RandomCrop")
        self.padding = _padding(padding if padding is not None else 0, "RandomCrop")
        self.pad_if_needed = bool(pad_if_needed)
        self.fill = _fill(fill)
        self.padding_mode = padding_mode
        self._mode = _pad_mode(padding_mode, "RandomCrop")
        self.build()

    def args(self) -> List[Any]:
        return [*self.size, *self.padding, int(self.pad_if_needed), self.fill, self._mode]


class Pad(Op):
    """torchvision's Pad: ``padding`` (an int, (left/right, top/bottom) or (left, top,
    right, bottom)) filled with ``fill`` or by ``padding_mode``.

    Example::

        stoker.ops.Pad(4, padding_mode="reflect")
    """

    kind = "pad"
    num_args = 6

    def __init__(self, padding: Any, fill: Any = 0, padding_mode: str = "constant"):
        self.padding = _padding(padding, "Pad")
        self.fill = _fill(fill)
        self.padding_mode = padding_mode
        self._mode = _pad_mode(padding_mode, "Pad")
        self.build()

    def args(self) -> List[Any]:
        return [*self.padding, self.fill, self._mode]


def _specs(ops: Union[Op, Sequence[Op]]) -> List[_core.ImageOp]:
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
