"""Image ops that change pixel values only, so the targets of a group stay as they are:
colour (ColorJitter, RandomGrayscale, HSVJitter), blur, Normalize (C++ kernels in
``csrc/augment/``; Normalize is written with the pixels, ``csrc/geometry/pixel_writer.h``)."""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

from ._base import Op, _floats, _pair, _range, _Size


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
