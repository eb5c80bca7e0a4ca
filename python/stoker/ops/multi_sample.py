"""Ops that read more samples than the one they transform: :class:`Mosaic` (C++ in
``csrc/geometry/transform_group.cpp``, NOTE [ Mosaic ]). The other samples are drawn by the
sample's own draws and read by the loader's workers, so a batch is the same for any thread
count and after a resume."""

from __future__ import annotations

from typing import Any, List

from ._base import Op, _pair, _range, _Size
from .geometry import _fill


class Mosaic(Op):
    """YOLO's mosaic (ultralytics' ``Mosaic``, YOLOv5's ``load_mosaic``): the sample and
    three more drawn uniformly from the dataset, each resized to fit ``size`` (an int, or
    ``(h, w)``) keeping its aspect ratio, meet at a random centre of a canvas twice
    ``size`` filled with ``fill`` (114 gray): x and y drawn uniformly in ``center`` times
    the size, (0.5, 1.5) as ultralytics' ``border=-size/2``. The sample's masks
    (``mask_fill`` where no image is), boxes, keypoints and per-box rows come with it, the
    rows of the four one after the other.

    It must be the first op of its list (the ops after it work on the canvas): the usual
    YOLO recipe follows it with an affine warp, HSV jitter, a flip and a crop or letterbox
    back to ``size``.

    Example::

        transforms = {("image", "boxes", "classes"): [
            stoker.ops.Mosaic(640), stoker.ops.RandomAffine(0, translate=(0.1, 0.1),
                                                            scale=(0.5, 1.5)),
            stoker.ops.CenterCrop(640), stoker.ops.HSVJitter(),
            stoker.ops.RandomHorizontalFlip()]}
    """

    kind = "mosaic"
    num_args = 5
    moves_pixels = True

    def __init__(self, size: _Size, center: Any = (0.5, 1.5), fill: Any = 114,
                 mask_fill: int = 0):
        self.size = _pair(size, "Mosaic")
        self.center = _range(center, "Mosaic: center")
        self.fill = _fill(fill)
        self.mask_fill = mask_fill
        self.build()

    def args(self) -> List[Any]:
        return [*self.size, self.center, self.fill, self.mask_fill]
