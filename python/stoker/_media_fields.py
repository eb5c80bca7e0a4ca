"""The field types of video and audio (``stoker.video()``, ``stoker.audio()``): a file's
bytes as they are, behind a small index made once when the sample is written
(csrc/codecs/media_record.h), so that the loader's workers find a clip's frames and an audio
crop's samples without scanning the file. Re-exported by stoker/fields.py."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from .fields import SPEC_MAKERS, Field

MAX_SAMPLE_RATE = 768000  # csrc/codecs/media_record.h's kMaxSampleRate


def _file_bytes(value: Any, what: str, kind: str) -> bytes:
    """The bytes of a media file given as bytes or as a path."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (str, os.PathLike)):
        try:
            with open(value, "rb") as f:
                return f.read()
        except OSError as e:
            raise ValueError(f"{what}: cannot read the {kind} file {os.fspath(value)!r}: "
                             f"{e.strerror}") from None
    raise ValueError(f"{what}: expected the {kind} file's bytes or its path, got "
                     f"{type(value).__name__}")


def _check_positive(value: Optional[int], what: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive int or None, got {value!r}")
    return int(value)


class Video(Field):
    """A video per sample: the file's bytes as written (mp4, mkv, webm, ...: any container
    FFmpeg reads, with a stream FFmpeg decodes, e.g. H.264, H.265, VP9, AV1), plus the index
    of its first video stream's frames (presentation times, key frames), made once by
    ``encode``. The loader decodes clips in its C++ workers (``stoker.ops.RandomClip``,
    ``CenterClip``): ``batch[name]`` is ``uint8`` ``[B, T, C, H, W]`` and
    ``batch[name + "_pts"]`` each frame's presentation time, ``float64`` seconds ``[B, T]``.
    ``write`` takes the file's bytes or its path; ``Dataset[i]`` returns the file's bytes.
    """

    kind = "video"

    def encode(self, value: Any, what: str = "value") -> bytes:
        data = _file_bytes(value, what, "video")
        if data[:4] == b"\x93VID":  # a record already (stoker merge, a copied dataset)
            return data
        from . import _core

        try:
            return bytes(_core.video_record(data))
        except _core.DecodeError as e:
            raise ValueError(f"{what}: {e}") from None

    def decode(self, payload: bytes) -> bytes:
        from . import _core

        return bytes(payload[_core.video_info(bytes(payload))["file_offset"]:])

    def _core_spec(self, name: str) -> Dict[str, Any]:
        return {"name": name, "kind": self.kind, "dtype": "uint8", "shape": []}

    def __repr__(self) -> str:
        return "stoker.video()"


class Audio(Field):
    """Audio per sample: the file's bytes as written (wav, flac, mp3, ogg/opus, m4a/aac, ...:
    what FFmpeg reads), plus its rate, channels and exact length, made once by ``encode``
    (which decodes it once). The loader decodes it in its C++ workers to ``float32``
    ``[B, C, N]``, resampled to ``sample_rate`` and mixed to ``channels`` where the file
    differs (None: the file's own), with ``batch[name + "_lengths"]`` the samples of each row
    (the rest are zeros); ``stoker.ops.RandomAudioCrop(seconds)`` and ``CenterAudioCrop``
    decode only a crop. ``Dataset[i]`` returns the file's bytes."""

    kind = "audio"

    def __init__(self, sample_rate: Optional[int] = None, channels: Optional[int] = None):
        self.sample_rate = _check_positive(sample_rate, "audio sample_rate")
        if self.sample_rate is not None and self.sample_rate > MAX_SAMPLE_RATE:
            raise ValueError(f"audio sample_rate must be at most {MAX_SAMPLE_RATE} Hz, got "
                             f"{self.sample_rate}")
        self.channels = _check_positive(channels, "audio channels")
        if self.channels is not None and self.channels > 64:
            raise ValueError(f"audio channels must be at most 64, got {channels}")

    def encode(self, value: Any, what: str = "value") -> bytes:
        data = _file_bytes(value, what, "audio")
        if data[:4] == b"\x93AUD":
            return data
        from . import _core

        try:
            return bytes(_core.audio_record(data))
        except _core.DecodeError as e:
            raise ValueError(f"{what}: {e}") from None

    def decode(self, payload: bytes) -> bytes:
        from . import _core

        return bytes(payload[_core.audio_info(bytes(payload))["file_offset"]:])

    def spec(self) -> Dict[str, Any]:
        spec: Dict[str, Any] = {"kind": self.kind}
        if self.sample_rate is not None:
            spec["sample_rate"] = self.sample_rate
        if self.channels is not None:
            spec["channels"] = self.channels
        return spec

    def _core_spec(self, name: str) -> Dict[str, Any]:
        return {"name": name, "kind": self.kind, "dtype": "uint8", "shape": []}

    def __repr__(self) -> str:
        return f"stoker.audio(sample_rate={self.sample_rate!r}, channels={self.channels!r})"


def video() -> Video:
    """A video file per sample, decoded into clips by the loader::

        fields = {"video": stoker.video(), "label": stoker.scalar("int64")}
        w.write({"video": "clips/0001.mp4", "label": 3})      # a path or the file's bytes
        transforms = {"video": [stoker.ops.RandomClip(16, step=2), stoker.ops.Resize(224)]}
    """
    return Video()


def audio(sample_rate: Optional[int] = None, channels: Optional[int] = None) -> Audio:
    """An audio file per sample (wav, flac, mp3, ogg/opus, m4a/aac), decoded by the loader
    to float32 ``[C, N]``::

        fields = {"audio": stoker.audio(sample_rate=16000, channels=1)}
        transforms = {"audio": [stoker.ops.RandomAudioCrop(2.0)]}

    Args:
        sample_rate: samples per second the loader delivers; a file at another rate is
            resampled (libswresample). None (default): the file's own rate.
        channels: channels delivered (1: the mean of the file's channels). None
            (default): the file's own.
    """
    return Audio(sample_rate, channels)


SPEC_MAKERS["video"] = lambda spec: Video()
SPEC_MAKERS["audio"] = lambda spec: Audio(spec.get("sample_rate"), spec.get("channels"))
