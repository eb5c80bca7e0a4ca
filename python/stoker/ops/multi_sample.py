"""Ops that read more samples than the one they transform: :class:`Mosaic` (C++ in
``csrc/geometry/transform_group.cpp``, NOTE [ Mosaic ]) and :class:`DetectionMixUp`
(``csrc/geometry/detection_mixup.cpp``, NOTE [ DetectionMixUp ]) and :class:`CopyPaste`
(``csrc/geometry/copy_paste.cpp``, NOTE [ CopyPaste ]). The other samples are
drawn by the sample's own draws and read by the loader's workers, so a batch is the same
for any thread count and after a resume."""

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


class DetectionMixUp(Op):
    """YOLO's MixUp of two samples (ultralytics' ``MixUp``, YOLOv5's ``mixup``), for
    transform groups with targets: with probability ``p``, another sample drawn uniformly
    from the dataset by the sample's own draws is blended in,
    ``image * r + other * (1 - r)`` truncated to uint8, ``r ~ Beta(alpha, alpha)``
    (ultralytics' 32.0: r close to 0.5). The boxes, keypoints and per-box rows of both
    come out, the sample's first.

    ultralytics mixes two images of the same size; here the other sample is brought to
    this one's size as :class:`Letterbox` does (resized to fit keeping its aspect ratio,
    centred, ``fill`` around it), its targets moved the same way. A mask is the per-pixel
    maximum of the two where the other sample's image lies, this sample's elsewhere. The
    output keeps the sample's size.

    Not :class:`MixUp`, which mixes whole batches for classification (soft labels).
    It must be the first op of its list (the ops after it work on the blend); ultralytics
    applies its MixUp after the mosaic and the affine warp, which a list here cannot
    (each op that reads more samples is first), so the usual recipe is one or the other
    per list.

    Example::

        transforms = {("image", "boxes", "classes"): [
            stoker.ops.DetectionMixUp(32.0, p=0.15), stoker.ops.Letterbox(640),
            stoker.ops.HSVJitter(), stoker.ops.RandomHorizontalFlip()]}
    """

    kind = "detection_mixup"
    num_args = 3
    moves_pixels = True

    def __init__(self, alpha: float = 32.0, p: float = 1.0, fill: Any = 114):
        for what, v in (("alpha", alpha), ("p", p)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"DetectionMixUp: {what} must be a number, got {v!r}")
        self.alpha = float(alpha)
        self.p = float(p)
        self.fill = _fill(fill)
        self.build()

    def args(self) -> List[Any]:
        return [self.alpha, self.p, self.fill]


class CopyPaste(Op):
    """Simple copy-paste (Ghiasi et al. 2021; ultralytics' ``CopyPaste``, albumentations
    style) for a transform group with an RGB image, boxes and one instance mask, where
    mask value k (1, 2, ...) is the object of box k - 1 (and of row k - 1 of the per-box
    fields and keypoints), any other value background.

    Another sample drawn uniformly from the dataset by the sample's own draws is brought
    to this one's size as :class:`Letterbox` does (fit, centred); each of its objects is
    pasted with probability ``p``: the pixels its mask covers, on top, with its box,
    keypoints and per-box rows. An object of this sample whose mask is covered over more
    than ``occlusion`` of its pixels is dropped with its rows; one covered less keeps the
    enclosing box of what its mask still shows. The mask comes out renumbered so that
    value k is box k - 1 again: the sample's kept objects in their order, then the pasted
    ones, 0 elsewhere (values that named no box become 0).

    It must be the first op of its list. Example::

        transforms = {("image", "instances", "boxes", "classes"): [
            stoker.ops.CopyPaste(p=0.5), stoker.ops.Letterbox(640),
            stoker.ops.RandomHorizontalFlip()]}
    """

    kind = "copy_paste"
    num_args = 2
    moves_pixels = True

    def __init__(self, p: float = 0.5, occlusion: float = 0.7):
        for what, v in (("p", p), ("occlusion", occlusion)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"CopyPaste: {what} must be a number, got {v!r}")
        self.p = float(p)
        self.occlusion = float(occlusion)
        self.build()

    def args(self) -> List[Any]:
        return [self.p, self.occlusion]
