"""The transforms of video and audio fields, split off a Loader's (or ``Dataset.sample``'s)
``transforms=`` before the image checks (stoker/_transform_args.py): a video field takes one
clip op (``stoker.ops.RandomClip``, ``CenterClip``) and then image ops, run on every frame
with one set of draws; an audio field at most one crop (``RandomAudioCrop``,
``CenterAudioCrop``). What comes out is a :class:`MediaPlan`: values, turned into the
``videos=`` and ``audios=`` of ``_core.RecordOptions`` by :meth:`MediaPlan.options`."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple

from ._media_fields import Audio, Video
from .fields import Field
from .ops import Op, op_specs
from .ops.clip import AudioCropOp, ClipOp, audio_spec


@dataclasses.dataclass(frozen=True)
class MediaPlan:
    """Per video field its clip and frame ops; per audio field its rate, channels, crop."""

    videos: Tuple[Tuple[str, ClipOp, Tuple[Op, ...]], ...] = ()
    audios: Tuple[Tuple[str, Optional[int], Optional[int], Optional[AudioCropOp]], ...] = ()
    layout: str = "CHW"  # frames CHW (a batch [B, T, C, H, W]) unless image_layout="HWC"
    max_pixels: Optional[int] = None  # max_image_pixels: larger frames are refused

    def options(self) -> Dict[str, Any]:
        """``videos=`` and ``audios=`` of ``_core.RecordOptions``."""
        return {"videos": {name: clip.spec(op_specs(list(ops)), self.layout, self.max_pixels)
                           for name, clip, ops in self.videos},
                "audios": {name: audio_spec(rate, channels, crop)
                           for name, rate, channels, crop in self.audios}}

    def __bool__(self) -> bool:
        return bool(self.videos or self.audios)


def split_media(fields: Mapping[str, Field], transforms: Any, image_layout: Optional[str] = None,
                max_pixels: Optional[int] = None) -> Tuple[MediaPlan, Dict[Any, Any]]:
    """(the media plan, the rest of ``transforms``). ValueError for a video field without
    a clip op, a clip or crop op on another field, or ops that cannot follow."""
    rest: Dict[Any, Any] = {}
    media: Dict[str, list] = {}
    if transforms is None:
        transforms = {}
    if not isinstance(transforms, Mapping):
        raise TypeError(f"transforms must be a dict {{field name: [ops]}}, got "
                        f"{type(transforms).__name__}")
    for key, ops in transforms.items():
        seq = [ops] if isinstance(ops, (Op, ClipOp, AudioCropOp)) else ops
        try:
            seq = list(seq)
        except TypeError:
            seq = [seq]
        names = key if isinstance(key, tuple) else (key,)
        is_media = [isinstance(fields.get(n), (Video, Audio)) for n in names
                    if isinstance(n, str)]
        if any(is_media):
            if isinstance(key, tuple):
                raise ValueError(f"transforms: {key!r} groups a video or audio field with "
                                 "others; give each video and audio field its own key")
            media[key] = seq
            continue
        for op in seq:
            if isinstance(op, (ClipOp, AudioCropOp)):
                raise ValueError(f"transforms[{key!r}]: {op!r} applies to stoker.video() and "
                                 "stoker.audio() fields")
        rest[key] = ops
    videos, audios = [], []
    for name, f in fields.items():
        if isinstance(f, Video):
            ops = media.get(name)
            if not ops or not isinstance(ops[0], ClipOp):
                raise ValueError(
                    f"transforms: the video field {name!r} needs a clip first, e.g. "
                    f"transforms={{{name!r}: [stoker.ops.RandomClip(16, step=2), "
                    f"stoker.ops.Resize(224)]}} (or stoker.ops.CenterClip)")
            for op in ops[1:]:
                if not isinstance(op, Op) or isinstance(op, ClipOp):
                    raise ValueError(f"transforms[{name!r}]: after the clip, image ops "
                                     f"(stoker.ops.Resize, RandomResizedCrop, ...), got {op!r}")
                if op.kind in ("mosaic", "detection_mixup", "copy_paste"):
                    raise ValueError(f"transforms[{name!r}]: {op!r} reads other samples; it "
                                     "does not apply to video frames")
            op_specs(list(ops[1:]))  # the C++ op list's own checks
            videos.append((name, ops[0], tuple(ops[1:])))
        elif isinstance(f, Audio):
            ops = media.get(name, [])
            if len(ops) > 1 or any(not isinstance(op, AudioCropOp) for op in ops):
                raise ValueError(f"transforms[{name!r}]: an audio field takes one "
                                 "stoker.ops.RandomAudioCrop or CenterAudioCrop, got "
                                 f"{ops!r}")
            audios.append((name, f.sample_rate, f.channels, ops[0] if ops else None))
    return MediaPlan(tuple(videos), tuple(audios), image_layout or "CHW", max_pixels), rest
