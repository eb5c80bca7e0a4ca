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

:class:`RandomClip` and :class:`CenterClip` choose a ``stoker.video()`` field's frames (the
image ops after them run on every frame with one set of draws); :class:`RandomAudioCrop` and
:class:`CenterAudioCrop` a ``stoker.audio()`` field's samples (docs/video.md).

:class:`MixUp` and :class:`CutMix` act on whole batches: ``Loader(batch_transforms=[...])``;
:class:`Mosaic` reads three more samples for each one (YOLO's mosaic), :class:`DetectionMixUp`
one more (YOLO's MixUp, with the targets of both), :class:`CopyPaste` pastes another
sample's objects by their instance mask.

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

from ._base import BatchOp, Op
from ._base import op_specs as op_specs  # internal (not in __all__): ops as the core takes them
from .auto_augment import AutoAugment, RandAugment, TrivialAugmentWide
from .batch import CutMix, MixUp
from .clip import (
    AudioCropOp,
    CenterAudioCrop,
    CenterClip,
    ClipOp,
    RandomAudioCrop,
    RandomClip,
)
from .color import ColorJitter, GaussianBlur, HSVJitter, Normalize, RandomGrayscale
from .erasing_boxes import RandomErasing, SanitizeBoundingBoxes
from .geometry import (
    CenterCrop,
    Letterbox,
    Pad,
    RandomAffine,
    RandomCrop,
    RandomHorizontalFlip,
    RandomPerspective,
    RandomResizedCrop,
    RandomRotation,
    RandomVerticalFlip,
    Resize,
)
from .multi_sample import CopyPaste, DetectionMixUp, Mosaic

__all__ = ["Op", "RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip",
           "RandomVerticalFlip", "Normalize", "ColorJitter", "RandomGrayscale", "GaussianBlur",
           "HSVJitter", "RandAugment", "TrivialAugmentWide", "AutoAugment", "RandomErasing",
           "RandomCrop", "Pad", "Letterbox", "RandomRotation", "RandomAffine",
           "RandomPerspective", "SanitizeBoundingBoxes", "Mosaic", "DetectionMixUp", "CopyPaste",
           "BatchOp",
           "MixUp", "CutMix", "ClipOp", "RandomClip", "CenterClip", "AudioCropOp",
           "RandomAudioCrop", "CenterAudioCrop"]
