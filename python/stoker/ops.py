"""Image ops, run by the C++ workers on ``stoker.image()`` fields.

Use them in ``Loader(transforms={"image": [...]})``; they apply in order to each image
after decoding, and their random draws depend only on (seed, epoch, sample index), so a
batch is bit-identical whatever the number of threads::

    transforms = {"image": [stoker.ops.RandomResizedCrop(224),
                            stoker.ops.RandomHorizontalFlip()]}

A key may be a tuple of fields that move together, with one set of draws per sample:
masks, boxes, keypoints and per-box rows follow the image's geometry (docs/augment.md)::

    transforms = {("image", "mask", "boxes", "classes"): [stoker.ops.RandomResizedCrop(512),
                                                           stoker.ops.RandomHorizontalFlip()]}

:class:`MixUp` and :class:`CutMix` act on whole batches: ``Loader(batch_transforms=[...])``.

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
from typing import Any, List, Optional, Sequence, Tuple, Union

from . import _core

__all__ = ["Op", "RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip",
           "RandomVerticalFlip", "Normalize", "ColorJitter", "RandomGrayscale", "GaussianBlur",
           "HSVJitter", "RandAugment", "TrivialAugmentWide", "AutoAugment", "RandomErasing",
           "RandomCrop", "Pad", "Letterbox", "RandomRotation", "RandomAffine",
           "RandomPerspective", "SanitizeBoundingBoxes", "BatchOp", "MixUp", "CutMix"]

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
    ``max_size`` caps the longer side (with ``size=None``: the longer side becomes
    ``max_size``), as torchvision's. Antialiased triangle filter (PIL's ``BILINEAR``).

    Example::

        [stoker.ops.Resize(256), stoker.ops.CenterCrop(224)]   # the usual evaluation pair
        stoker.ops.Resize(800, max_size=1333)                  # DETR's evaluation size
    """

    kind = "resize"
    num_args = 4
    min_args = 3

    def __init__(self, size: Optional[_Size], max_size: Optional[int] = None):
        self.size: Union[None, int, Tuple[int, int]]
        if size is None or (isinstance(size, int) and not isinstance(size, bool)):
            self.size = size
        else:
            self.size = _pair(size, "Resize")
        if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int)):
            raise ValueError(f"Resize: max_size must be an int or None, got {max_size!r}")
        if max_size is not None and isinstance(self.size, tuple):
            raise ValueError("Resize: max_size applies when size is an int (the shorter side) "
                             "or None, not (h, w)")
        if self.size is None and max_size is None:
            raise ValueError("Resize: give size, max_size, or both")
        self._max_size = max_size
        self.build()

    @property
    def max_size(self) -> Optional[int]:
        return self._max_size

    def args(self) -> List[Any]:
        # (h, w, shorter, max_size): exactly (h, w), or the shorter side to `shorter`
        if isinstance(self.size, tuple):
            return [*self.size, 0]
        if self._max_size is None:
            return [0, 0, self.size]
        return [0, 0, self.size or 0, self._max_size]

    def __repr__(self) -> str:
        cap = "" if self._max_size is None else f", max_size={self._max_size!r}"
        return f"Resize(size={self.size!r}{cap})"


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


def _probability(p: Any) -> Any:
    return float(p) if isinstance(p, (int, float)) and not isinstance(p, bool) else p


class RandomHorizontalFlip(Op):
    """Mirrors the image left-right with probability ``p``. In a transform group with
    keypoints, ``flip_pairs`` (pairs of keypoint indices, such as (left eye, right eye))
    swap under the flip, as ultralytics' ``flip_idx``, so that a left keypoint stays a
    left one.

    Example::

        stoker.ops.RandomHorizontalFlip()        # p = 0.5
        stoker.ops.RandomHorizontalFlip(flip_pairs=[(1, 2), (3, 4), (5, 6)])
    """

    kind = "random_horizontal_flip"
    num_args = 2
    min_args = 1

    def __init__(self, p: float = 0.5, flip_pairs: Optional[Sequence[Sequence[int]]] = None):
        self.p = _probability(p)
        pairs: Tuple[Tuple[int, int], ...] = ()
        if flip_pairs is not None:
            try:
                pairs = tuple((int(a), int(b)) for a, b in flip_pairs)
            except (TypeError, ValueError):
                raise ValueError(f"RandomHorizontalFlip: flip_pairs must be pairs of keypoint "
                                 f"indices, got {flip_pairs!r}") from None
        self._flip_pairs = pairs
        self.build()

    @property
    def flip_pairs(self) -> Tuple[Tuple[int, int], ...]:
        return self._flip_pairs

    def args(self) -> List[Any]:
        if not self._flip_pairs:
            return [self.p]
        return [self.p, tuple(i for pair in self._flip_pairs for i in pair)]

    def __repr__(self) -> str:
        pairs = f", flip_pairs={list(self._flip_pairs)!r}" if self._flip_pairs else ""
        return f"RandomHorizontalFlip(p={self.p!r}{pairs})"


class RandomVerticalFlip(Op):
    """Mirrors the image top-bottom with probability ``p`` (torchvision's).

    Example::

        stoker.ops.RandomVerticalFlip(0.5)       # aerial and medical images
    """

    kind = "random_vertical_flip"
    num_args = 1

    def __init__(self, p: float = 0.5):
        self.p = _probability(p)
        self.build()

    def args(self) -> List[Any]:
        return [self.p]


class Normalize(Op):
    """``(x / 255 - mean) / std`` per RGB channel, giving ``float32``, ``float16`` or
    ``bfloat16`` (a name or a ``torch.dtype``), written straight into the batch. Must be
    the last op (:class:`RandomErasing` may follow it).

    Example::

        stoker.ops.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
        stoker.ops.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), "bfloat16")
    """

    kind = "normalize"
    num_args = 3

    def __init__(self, mean: Sequence[float], std: Sequence[float], dtype: Any = "float32"):
        self.mean = _floats(mean)
        self.std = _floats(std)
        # a torch.dtype by its name: torch.bfloat16 -> "bfloat16"
        name = str(dtype)
        self.dtype = name[len("torch."):] if name.startswith("torch.") else dtype
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
    (``"constant"``, ``"edge"``, ``"reflect"``, ``"symmetric"``) as torchvision's. In a
    transform group, masks are padded with ``mask_fill`` (a class id, e.g. an ignore index
    of 255).

    Example::

        stoker.ops.RandomCrop(32, padding=4)           # the CIFAR recipe
    """

    kind = "random_crop"
    num_args = 10

    def __init__(self, size: _Size, padding: Any = 0, pad_if_needed: bool = False,
                 fill: Any = 0, padding_mode: str = "constant", mask_fill: int = 0):
        self.size = _pair(size, "RandomCrop")
        self.padding = _padding(padding if padding is not None else 0, "RandomCrop")
        self.pad_if_needed = bool(pad_if_needed)
        self.fill = _fill(fill)
        self.padding_mode = padding_mode
        self.mask_fill = mask_fill
        self._mode = _pad_mode(padding_mode, "RandomCrop")
        self.build()

    def args(self) -> List[Any]:
        return [*self.size, *self.padding, int(self.pad_if_needed), self.fill, self._mode,
                self.mask_fill]


class Pad(Op):
    """torchvision's Pad: ``padding`` (an int, (left/right, top/bottom) or (left, top,
    right, bottom)) filled with ``fill`` or by ``padding_mode``; masks of a group with
    ``mask_fill``.

    Example::

        stoker.ops.Pad(4, padding_mode="reflect")
    """

    kind = "pad"
    num_args = 7

    def __init__(self, padding: Any, fill: Any = 0, padding_mode: str = "constant",
                 mask_fill: int = 0):
        self.padding = _padding(padding, "Pad")
        self.fill = _fill(fill)
        self.padding_mode = padding_mode
        self.mask_fill = mask_fill
        self._mode = _pad_mode(padding_mode, "Pad")
        self.build()

    def args(self) -> List[Any]:
        return [*self.padding, self.fill, self._mode, self.mask_fill]


# -- geometry beyond crops: the targets of a group follow these too --------------------------

def _interpolation(value: Any, what: str) -> int:
    """"nearest" or "bilinear" (a name, torchvision's InterpolationMode, or PIL's 0 / 2)."""
    name = getattr(value, "value", value)  # InterpolationMode.BILINEAR.value == "bilinear"
    if name in ("nearest", 0):
        return 0
    if name in ("bilinear", 2):
        return 1
    raise ValueError(f"{what}: interpolation must be 'nearest' or 'bilinear', got {value!r}")


def _degrees(value: Any, what: str) -> Tuple[float, float]:
    """torchvision's degrees: a number d for (-d, d), or a (lo, hi) pair."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{what}: degrees as a single number must be non-negative, "
                             f"got {value}")
        return (-float(value), float(value))
    return _range(value, f"{what}: degrees")


def _center(value: Any, what: str) -> Tuple[Tuple[float, float], int]:
    if value is None:
        return (0.0, 0.0), 0
    try:
        x, y = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: center must be None or a point (x, y), got {value!r}") \
            from None
    return (x, y), 1


def _warp_fill(fill: Any) -> Any:
    return _fill(0 if fill is None else fill)


class Letterbox(Op):
    """YOLO's letterbox (ultralytics' ``LetterBox``): resized to fit ``size`` (an int for
    a square, or ``(h, w)``) keeping the aspect ratio, centred, the rest ``fill`` (114
    gray, as YOLO); ``scaleup=False`` never enlarges. Boxes and keypoints of a group are
    scaled and shifted with the image, masks padded with ``mask_fill``.

    Example::

        transforms = {("image", "boxes", "classes"): [stoker.ops.Letterbox(640),
                                                      stoker.ops.HSVJitter(),
                                                      stoker.ops.RandomHorizontalFlip()]}
    """

    kind = "letterbox"
    num_args = 5

    def __init__(self, size: _Size, fill: Any = 114, mask_fill: int = 0, scaleup: bool = True):
        self.size = _pair(size, "Letterbox")
        self.fill = _fill(fill)
        self.mask_fill = mask_fill
        self.scaleup = bool(scaleup)
        self.build()

    def args(self) -> List[Any]:
        return [*self.size, self.fill, self.mask_fill, int(self.scaleup)]


class RandomRotation(Op):
    """torchvision's RandomRotation: an angle drawn uniformly in ``degrees`` (a number d
    for (-d, d), or a pair), counter-clockwise, about ``center`` (the image's centre by
    default); ``interpolation`` ``"nearest"`` (default) or ``"bilinear"``; ``expand``
    enlarges each image to hold the whole rotated image (then an op that fixes the size
    must follow, to batch them); ``fill`` outside the image, ``mask_fill`` for masks.

    Example::

        stoker.ops.RandomRotation(15, interpolation="bilinear")
    """

    kind = "random_rotation"
    num_args = 7

    def __init__(self, degrees: Any, interpolation: Any = "nearest", expand: bool = False,
                 center: Any = None, fill: Any = 0, mask_fill: int = 0):
        self.degrees = _degrees(degrees, "RandomRotation")
        self.interpolation = interpolation
        self.expand = bool(expand)
        self.center = center
        self.fill = _warp_fill(fill)
        self.mask_fill = mask_fill
        self._interp = _interpolation(interpolation, "RandomRotation")
        self._center = _center(center, "RandomRotation")
        self.build()

    def args(self) -> List[Any]:
        (cx, cy), has = self._center
        return [self.degrees, self._interp, int(self.expand), (cx, cy), has, self.fill,
                self.mask_fill]


class RandomAffine(Op):
    """torchvision's RandomAffine: a rotation in ``degrees``, a translation of up to
    ``translate`` = (fx, fy) of the width and height (rounded to pixels), a scale in
    ``scale`` = (lo, hi), shears in ``shear`` (a number s for x in (-s, s), a pair for x,
    or 4 values for x then y), about ``center``; ``interpolation``, ``fill`` and
    ``mask_fill`` as :class:`RandomRotation`.

    Example::

        stoker.ops.RandomAffine(degrees=10, translate=(0.1, 0.1), scale=(0.5, 1.5), shear=2)
    """

    kind = "random_affine"
    num_args = 9

    def __init__(self, degrees: Any, translate: Any = None, scale: Any = None,
                 shear: Any = None, interpolation: Any = "nearest", fill: Any = 0,
                 center: Any = None, mask_fill: int = 0):
        self.degrees = _degrees(degrees, "RandomAffine")
        self.translate = None if translate is None else _range(translate, "RandomAffine: "
                                                                          "translate")
        self.scale = None if scale is None else _range(scale, "RandomAffine: scale")
        self.shear = None if shear is None else self._shear(shear)
        self.interpolation = interpolation
        self.fill = _warp_fill(fill)
        self.center = center
        self.mask_fill = mask_fill
        self._interp = _interpolation(interpolation, "RandomAffine")
        self._center = _center(center, "RandomAffine")
        self.build()

    @staticmethod
    def _shear(value: Any) -> Tuple[float, ...]:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value < 0:
                raise ValueError(f"RandomAffine: shear as a single number must be "
                                 f"non-negative, got {value}")
            return (-float(value), float(value), 0.0, 0.0)
        try:
            v = tuple(float(x) for x in value)
        except (TypeError, ValueError):
            v = ()
        if len(v) == 2:
            return (*v, 0.0, 0.0)
        if len(v) == 4:
            return v
        raise ValueError(f"RandomAffine: shear must be a number, 2 or 4 values, got {value!r}")

    def args(self) -> List[Any]:
        (cx, cy), has = self._center
        return [self.degrees, self.translate or (0.0, 0.0), self.scale or (1.0, 1.0),
                self.shear or (0.0, 0.0, 0.0, 0.0), self._interp, self.fill, self.mask_fill,
                (cx, cy), has]


class RandomPerspective(Op):
    """torchvision's RandomPerspective: with probability ``p``, each corner moved inwards
    by up to ``distortion_scale`` of half the size, and the image warped by the
    homography; ``interpolation`` ``"bilinear"`` (default) or ``"nearest"``.

    Example::

        stoker.ops.RandomPerspective(distortion_scale=0.3, p=0.5)
    """

    kind = "random_perspective"
    num_args = 5

    def __init__(self, distortion_scale: float = 0.5, p: float = 0.5,
                 interpolation: Any = "bilinear", fill: Any = 0, mask_fill: int = 0):
        self.distortion_scale = distortion_scale
        self.p = _probability(p)
        self.interpolation = interpolation
        self.fill = _warp_fill(fill)
        self.mask_fill = mask_fill
        self._interp = _interpolation(interpolation, "RandomPerspective")
        self.build()

    def args(self) -> List[Any]:
        return [self.distortion_scale, self.p, self._interp, self.fill, self.mask_fill]


class SanitizeBoundingBoxes(Op):
    """torchvision's SanitizeBoundingBoxes for a transform group with boxes: after the
    group's ops (wherever it stands in the list), a box whose clipped width or height is
    below ``min_size`` pixels, whose area is below ``min_area``, or which keeps less than
    ``min_visibility`` of its area (albumentations' ``BboxParams(min_visibility=)``) is
    dropped, with the same rows of the group's other per-box fields (class ids,
    keypoints). Without it, only boxes left with no area are dropped.

    Example::

        stoker.ops.SanitizeBoundingBoxes(min_size=2, min_visibility=0.1)
    """

    kind = "sanitize_bounding_boxes"
    num_args = 3

    def __init__(self, min_size: float = 1.0, min_area: float = 1.0,
                 min_visibility: float = 0.0):
        self.min_size, self.min_area, self.min_visibility = min_size, min_area, min_visibility
        self.build()

    def args(self) -> List[Any]:
        return [self.min_size, self.min_area, self.min_visibility]


# -- batch ops: Loader(batch_transforms=[...]) ---------------------------------------------

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


class MixUp(BatchOp):
    """torchvision's MixUp on whole batches, with timm's ``p`` and ``label_smoothing``:
    ``lam ~ Beta(alpha, alpha)`` per batch, each image blended with the one before it
    (``lam * x[i] + (1 - lam) * x[i - 1]``, the first with the last), and the integer
    label field (``labels``: "label" or "labels" by default) replaced by soft labels,
    float32 ``(batch, num_classes)``. Given with :class:`CutMix`, each batch gets one of
    the two: CutMix with probability ``switch_prob`` (timm's, default 0.5).

    Example::

        batch_transforms=[stoker.ops.MixUp(0.8, num_classes=1000),
                          stoker.ops.CutMix(1.0, num_classes=1000)]
    """

    _name = "mixup"


class CutMix(BatchOp):
    """torchvision's CutMix on whole batches, with timm's ``p`` and ``label_smoothing``:
    ``lam ~ Beta(alpha, alpha)``, a box of area ``1 - lam`` (centre uniform, clipped)
    pasted into each image from the one before it, ``lam`` corrected to the area kept,
    and soft labels as :class:`MixUp`.

    Example::

        batch_transforms=[stoker.ops.CutMix(1.0, num_classes=10)]
    """

    _name = "cutmix"


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
