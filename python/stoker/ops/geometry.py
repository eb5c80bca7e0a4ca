"""Image ops that move pixels, and the targets of a transform group with them (masks,
boxes, keypoints): crops, resizes, flips, padding, letterbox and warps (C++ kernels in
``csrc/geometry/``)."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

from ._base import Op, _floats, _pair, _range, _Size


def _probability(p: Any) -> Any:
    return float(p) if isinstance(p, (int, float)) and not isinstance(p, bool) else p


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
    moves_pixels = True
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
    moves_pixels = True
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
    moves_pixels = True
    num_args = 2

    def __init__(self, size: _Size):
        self.size = _pair(size, "CenterCrop")
        self.build()

    def args(self) -> List[Any]:
        return list(self.size)


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
    moves_pixels = True
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
    moves_pixels = True
    num_args = 1

    def __init__(self, p: float = 0.5):
        self.p = _probability(p)
        self.build()

    def args(self) -> List[Any]:
        return [self.p]


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
    moves_pixels = True
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
    moves_pixels = True
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
    moves_pixels = True
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
    moves_pixels = True
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
    moves_pixels = True
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
    moves_pixels = True
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
