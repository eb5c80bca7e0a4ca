"""RandomErasing (on the written output) and SanitizeBoundingBoxes (which boxes of a
transform group stay, with their rows): C++ in ``csrc/augment/erasing.h`` and
``csrc/geometry/target_geometry.h``."""

from __future__ import annotations

from typing import Any, List

from ._base import Op, _floats, _range


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
