"""Test media made with PyAV, and PyAV's decode as the reference (tests/test_video.py,
tests/test_audio.py): small videos of each codec both PyAV can encode and this build's
FFmpeg decodes, with B-frames and with variable frame rates; audio files of each format."""

from __future__ import annotations

import fractions
import io
import os

import av
import numpy as np

os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's encoder: errors only

# codec name (as stoker._core.media_codecs() says it) -> (PyAV encoder, container, options)
ENCODERS = {
    "h264": ("libx264", "mp4", lambda gop, bf: {
        "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes={3 if bf else 0}"}),
    "hevc": ("libx265", "mp4", lambda gop, bf: {
        "x265-params": f"keyint={gop}:min-keyint={gop}:bframes={3 if bf else 0}:log-level=error"}),
    "vp9": ("libvpx-vp9", "webm", lambda gop, bf: {
        "g": str(gop), "deadline": "realtime", "cpu-used": "8"}),
    "av1": ("libsvtav1", "matroska", lambda gop, bf: {"g": str(gop), "preset": "12"}),
}


def pattern(i: int, w: int, h: int) -> np.ndarray:
    """Frame i: moving gradients and a bright row, so every frame differs."""
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 4 + i * 7) % 256, (yy * 5 + i * 3) % 256,
                    ((xx + yy) * 3 + i * 11) % 256], -1).astype(np.uint8)
    img[(i * 5) % h, :] = 255
    return img


def make_video(codec: str, frames: int = 48, w: int = 64, h: int = 48, fps: int = 25,
               vfr: bool = False, bframes: bool = True, gop: int = 12,
               container: str = None) -> bytes:
    """A video of `frames` frames; with `vfr`, frame durations between 20 and 80 ms."""
    encoder, default_container, options = ENCODERS[codec]
    buf = io.BytesIO()
    out = av.open(buf, "w", format=container or default_container)
    s = out.add_stream(encoder, rate=fps)
    s.width, s.height, s.pix_fmt = w, h, "yuv420p"
    s.options = options(gop, bframes)
    tb = fractions.Fraction(1, 1000) if vfr else fractions.Fraction(1, fps)
    s.codec_context.time_base = tb
    rng = np.random.default_rng(frames + w)
    t = 0
    for i in range(frames):
        f = av.VideoFrame.from_ndarray(pattern(i, w, h), format="rgb24")
        f.pts, f.time_base = (t, tb) if vfr else (i, tb)
        t += int(rng.integers(20, 80))
        for p in s.encode(f):
            out.mux(p)
    for p in s.encode():
        out.mux(p)
    out.close()
    return buf.getvalue()


def decode_all(data: bytes):
    """PyAV's full sequential decode: [(time in seconds, rgb24 (h, w, 3))], by pts."""
    with av.open(io.BytesIO(data)) as c:
        frames = [(f.pts, f.time, f.to_ndarray(format="rgb24")) for f in c.decode(video=0)]
    frames.sort(key=lambda x: x[0])
    return [(t, a) for _, t, a in frames]


def encoders_here():
    """The codecs both PyAV encodes and this build decodes."""
    from stoker import _core

    have = set(_core.media_codecs().split(","))
    return [c for c, (enc, _, _) in ENCODERS.items() if c in have and enc in av.codecs_available]


def make_audio(fmt: str, seconds: float = 1.5, rate: int = 22050, channels: int = 2) -> bytes:
    """An audio file of sines (a different tone per channel): fmt one of wav, flac, mp3,
    aac (m4a), opus (ogg)."""
    codec, container, sample_fmt = {
        "wav": ("pcm_s16le", "wav", "s16"), "flac": ("flac", "flac", "s16"),
        "mp3": ("libmp3lame", "mp3", "fltp"), "aac": ("aac", "mp4", "fltp"),
        "opus": ("libopus", "ogg", "flt")}[fmt]
    if fmt == "opus":
        rate = 48000
    n = int(seconds * rate)
    t = np.arange(n) / rate
    sig = np.stack([0.4 * np.sin(2 * np.pi * (220 + 110 * c) * t) for c in range(channels)])
    buf = io.BytesIO()
    out = av.open(buf, "w", format=container)
    s = out.add_stream(codec, rate=rate, layout="stereo" if channels == 2 else "mono")
    frame_len = s.codec_context.frame_size or 1024
    for i in range(0, n, frame_len):
        chunk = sig[:, i:i + frame_len].astype(np.float32)
        if sample_fmt == "s16":
            data = (chunk.T.reshape(1, -1) * 32767).astype(np.int16)
        elif sample_fmt == "flt":
            data = chunk.T.reshape(1, -1)
        else:
            data = chunk
        f = av.AudioFrame.from_ndarray(np.ascontiguousarray(data), format=sample_fmt,
                                       layout="stereo" if channels == 2 else "mono")
        f.sample_rate = rate
        f.pts = i
        for p in s.encode(f):
            out.mux(p)
    for p in s.encode():
        out.mux(p)
    out.close()
    return buf.getvalue()


def decode_audio(data: bytes):
    """PyAV's full decode as float32 (channels, samples) and the rate (integer formats
    scaled as libswresample scales them: s16 / 32768)."""
    chunks = []
    with av.open(io.BytesIO(data)) as c:
        rate = c.streams.audio[0].rate
        for f in c.decode(audio=0):
            a = f.to_ndarray()
            if not f.format.is_planar:
                a = a.reshape(-1, len(f.layout.channels)).T
            if a.dtype == np.int16:
                a = a.astype(np.float32) / 32768
            elif a.dtype == np.int32:
                a = a.astype(np.float32) / 2147483648
            chunks.append(a.astype(np.float32))
    return np.concatenate(chunks, 1), rate
