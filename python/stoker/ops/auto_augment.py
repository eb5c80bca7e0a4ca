"""The auto-augment policies of torchvision (C++ in ``csrc/augment/auto_augment.h``): their
shears and rotations are not followed by targets, so a group with targets refuses them."""

from __future__ import annotations

from typing import Any, List

from ._base import Op


class RandAugment(Op):
    """torchvision's RandAugment: ``num_ops`` ops drawn uniformly among its 14 (identity,
    shears, translations, rotation, brightness, color, contrast, sharpness, posterize,
    solarize, autocontrast, equalize) at bin ``magnitude`` of ``num_magnitude_bins``, a
    random sign where signed; nearest interpolation, zeros outside (torchvision's defaults).

    Example::

        stoker.ops.RandAugment(2, 9)                     # timm's rand-m9-n2
    """

    kind = "rand_augment"
    moves_pixels = True
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
    moves_pixels = True
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
    moves_pixels = True
    num_args = 0

    def __init__(self, policy: str = "imagenet"):
        if policy != "imagenet":
            raise ValueError(f"AutoAugment: only the 'imagenet' policy is built in, got {policy!r}")
        self.policy = policy
        self.build()

    def args(self) -> List[Any]:
        return []
