"""Ops on whole batches (``Loader(batch_transforms=[...])``): MixUp and CutMix, run by the
C++ workers on each assembled batch (``csrc/augment/batch_mix.h``)."""

from ._base import BatchOp


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
