"""Clip ops: which frames of a ``stoker.video()`` field and which samples of a
``stoker.audio()`` field a sample takes, chosen before anything is decoded (the C++ workers
then decode only those: csrc/geometry/video_pipeline.h, csrc/augment/audio_pipeline.h).

A video field's transforms start with one clip op; the image ops after it run on every
frame of the clip with one set of random draws (the same crop and flip on all frames)::

    transforms = {"video": [stoker.ops.RandomClip(16, step=2), stoker.ops.RandomResizedCrop(224)],
                  "audio": [stoker.ops.RandomAudioCrop(2.0)]}

Draws depend only on (seed, epoch, sample index), as every op's do.
"""

from __future__ import annotations

import math
from typing import Any, Optional


def _int(value: Any, what: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{what} must be an int >= {low}, got {value!r}")
    return int(value)


class ClipOp:
    """Base of the video clip ops: ``num_frames`` frames, ``step`` frames apart, or at
    ``fps`` frames a second by presentation time (a clip of (num_frames - 1) / fps seconds
    whatever the file's frame rate, variable rates included: each time takes the frame
    shown then). A video shorter than its clip repeats its last frame (``"<name>_pts"``
    shows it). ``spec()`` is the clip as the C++ pipeline takes it.

    Example::

        transforms = {"video": [stoker.ops.RandomClip(16, step=2), stoker.ops.Resize(224)]}
    """

    random = True

    def __init__(self, num_frames: int, step: int = 1, *, fps: Optional[float] = None):
        name = type(self).__name__
        self.num_frames = _int(num_frames, f"{name}: num_frames", 1)
        self.step = _int(step, f"{name}: step", 1)
        if fps is not None:
            if isinstance(fps, bool) or not isinstance(fps, (int, float)) or \
                    not math.isfinite(fps) or fps <= 0:
                raise ValueError(f"{name}: fps must be a positive number, got {fps!r}")
            if self.step != 1:
                raise ValueError(f"{name}: give step= (frames apart) or fps= (by time), not "
                                 "both")
            fps = float(fps)
        self.fps = fps

    def spec(self, ops: Any = (), layout: str = "CHW", max_pixels: Optional[int] = None) -> Any:
        """The ``_core.VideoFieldSpec`` of this clip with the frame ops ``ops`` (C++ ops)."""
        from .. import _core

        kw = {} if max_pixels is None else {"max_pixels": max_pixels}
        return _core.VideoFieldSpec(random=self.random, num_frames=self.num_frames,
                                    step=self.step, fps=self.fps or 0.0, ops=list(ops),
                                    layout=layout, **kw)

    def __repr__(self) -> str:
        fps = f", fps={self.fps}" if self.fps is not None else ""
        return f"{type(self).__name__}({self.num_frames}, step={self.step}{fps})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), self.num_frames, self.step, self.fps))


class RandomClip(ClipOp):
    """A clip starting at a random frame (uniform among the starts whose clip fits), drawn
    anew per sample and epoch: ``RandomClip(16, step=2)`` takes 16 frames, every other one;
    ``RandomClip(8, fps=4)`` 8 frames a quarter second apart.

    Example::

        transforms = {"video": [stoker.ops.RandomClip(16, step=2),
                                stoker.ops.RandomResizedCrop(112)]}
    """

    random = True


class CenterClip(ClipOp):
    """The clip in the middle of the video (evaluation's choice).

    Example::

        transforms = {"video": [stoker.ops.CenterClip(16, step=2), stoker.ops.Resize(128),
                                stoker.ops.CenterCrop(112)]}
    """

    random = False


class AudioCropOp:
    """Base of the audio crop ops: ``seconds`` of audio at the field's sample rate. A file
    shorter than that is taken whole, its row padded with zeros (``"<name>_lengths"``).

    Example::

        transforms = {"audio": stoker.ops.RandomAudioCrop(1.5)}
    """

    crop = 1

    def __init__(self, seconds: float):
        name = type(self).__name__
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or \
                not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"{name}: seconds must be a positive number, got {seconds!r}")
        self.seconds = float(seconds)

    def spec(self, sample_rate: Optional[int] = None, channels: Optional[int] = None) -> Any:
        """The ``_core.AudioFieldSpec`` of this crop for a field of that rate and channels."""
        return audio_spec(sample_rate, channels, self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.seconds})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), self.seconds))


class RandomAudioCrop(AudioCropOp):
    """``seconds`` of audio from a random position (uniform among those that fit), drawn
    anew per sample and epoch.

    Example::

        transforms = {"audio": [stoker.ops.RandomAudioCrop(2.0)]}
    """

    crop = 1


class CenterAudioCrop(AudioCropOp):
    """The middle ``seconds`` of the audio.

    Example::

        transforms = {"audio": [stoker.ops.CenterAudioCrop(2.0)]}
    """

    crop = 2


def audio_spec(sample_rate: Optional[int], channels: Optional[int],
               crop: Optional[AudioCropOp]) -> Any:
    """The ``_core.AudioFieldSpec`` of an audio field with an optional crop."""
    from .. import _core

    return _core.AudioFieldSpec(sample_rate=sample_rate or 0, channels=channels or 0,
                                crop=0 if crop is None else crop.crop,
                                seconds=0.0 if crop is None else crop.seconds)
