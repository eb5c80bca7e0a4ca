"""The core's tensors as the loop gets them: a DLPack capsule as a torch tensor of the
same memory, and a batch of HWC images, as the loader decodes them, as an NCHW view of it
(channels_last strides: docs/python.md), whoever assembled the batch."""

from __future__ import annotations

from typing import Any, Dict, Sequence

import torch

__all__ = ["as_nchw", "mapped_as_nchw", "tensor_from_capsule"]


def as_nchw(batch: Dict[str, Any], names: Sequence[str]) -> Dict[str, Any]:
    """A C++-assembled batch (or its tensors), its image fields `names` viewed NCHW."""
    for name in names:
        if name in batch:
            batch[name] = batch[name].permute(0, 3, 1, 2)
    return batch


def mapped_as_nchw(batch: Any, names: Sequence[str]) -> Any:
    """An image field that map passes on as decoded, (h, w, 3) (a mask: (h, w, 1)),
    batched as the loader's own images are: an NCHW view of the HWC batch."""
    if isinstance(batch, dict):
        for name in names:
            t = batch.get(name)
            if isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[3] in (1, 3):
                batch[name] = t.permute(0, 3, 1, 2)
    return batch


def tensor_from_capsule(cap: Any) -> Any:
    """The tensor of a DLPack capsule the core gives (its memory, not a copy)."""
    from_capsule = getattr(torch._C, "_from_dlpack", None) or torch.from_dlpack
    return from_capsule(cap)
