"""stoker.audio(): samples equal PyAV's full decode (wav, flac, mp3, aac, opus), crops at
their drawn place, resampling within a stated tolerance of a reference resampler
(scipy's polyphase filter), channel mixing, and the loader's batches."""

import numpy as np
import pytest
import stoker
import torch
from conftest import same_for_threads_and_resume
from media_reference import decode_audio, make_audio
from stoker import _core

pytestmark = pytest.mark.skipif(not _core.build_info()["video"],
                                reason="built without FFmpeg (STOKER_WITH_VIDEO=OFF)")

FORMATS = ["wav", "flac", "mp3", "aac", "opus"]
# PyAV bundles a newer FFmpeg than the one stoker builds against (Debian 12's 5.1): its
# float AAC and Opus decoders changed in between (AAC reworked in 7.x, float SIMD) and round
# some samples a unit in the last place differently (at most 1.4e-7 here). PCM, FLAC and
# MP3 give the same bits.
ATOL = {"aac": 1e-6, "opus": 1e-6}


@pytest.fixture(scope="module")
def files():
    return {fmt: make_audio(fmt) for fmt in FORMATS}


@pytest.mark.parametrize("fmt", FORMATS)
def test_samples_equal_pyav(files, fmt):
    """The whole file and random crops: PyAV's decode, sample for sample, bit for bit."""
    ref, rate = decode_audio(files[fmt])
    record = stoker.audio().encode(files[fmt])
    info = _core.audio_info(record)
    assert (info["sample_rate"], info["channels"], info["samples"]) == (rate, 2, ref.shape[1])
    whole, got, r = _core.decode_audio_record(record, stoker.ops.clip.audio_spec(None, None, None))
    assert (got, r) == (ref.shape[1], rate)
    np.testing.assert_allclose(whole, ref, rtol=0, atol=ATOL.get(fmt, 0))
    crop = stoker.ops.RandomAudioCrop(0.25)
    n = int(0.25 * rate + 0.5)  # round half up, as the crop rounds
    starts = set()
    for seed in range(12):
        out, got, _ = _core.decode_audio_record(record, crop.spec(), seed)
        assert got == n and out.shape == (2, n)
        # where it was cut: a place where the full decode has exactly these samples
        tol = ATOL.get(fmt, 0)
        first = ref[0, :ref.shape[1] - n + 1]
        near = (np.abs(first - out[0, 0]) <= tol) & (np.abs(ref[0, 1:first.size + 1] -
                                                             out[0, 1]) <= tol)
        hits = [s for s in np.flatnonzero(near)
                if np.abs(ref[:, s:s + n] - out).max() <= tol]
        assert hits, f"{fmt} seed {seed}: the crop is no run of the full decode"
        starts.add(hits[0])
    assert len(starts) > 6  # drawn, not fixed
    out, _, _ = _core.decode_audio_record(record, stoker.ops.CenterAudioCrop(0.25).spec())
    s = (ref.shape[1] - n) // 2
    np.testing.assert_allclose(out, ref[:, s:s + n], rtol=0, atol=ATOL.get(fmt, 0))


def test_resampled_within_tolerance_of_a_reference(files):
    """22050 -> 16000 Hz: libswresample's default filter against scipy's resample_poly on
    the full decode, whole and for crops cut from the middle; tolerance 2e-3 on a signal of
    amplitude 0.4 (both filters pass these tones, far below either Nyquist)."""
    from scipy.signal import resample_poly

    ref, rate = decode_audio(files["wav"])
    want = resample_poly(ref.astype(np.float64), 320, 441, axis=1)
    record = stoker.audio().encode(files["wav"])
    whole, got, r = _core.decode_audio_record(record, stoker.ops.clip.audio_spec(16000, None,
                                                                                 None))
    assert r == 16000 and got == ref.shape[1] * 16000 // rate
    edge = 64  # the ends, where each filter sees zeros in its own way
    np.testing.assert_allclose(whole[:, edge:-edge], want[:, edge:got - edge], atol=2e-3)
    crop = stoker.ops.RandomAudioCrop(0.3)
    for seed in range(6):
        out, got, _ = _core.decode_audio_record(record, crop.spec(16000, None), seed)
        assert got == 4800
        heads = np.lib.stride_tricks.sliding_window_view(want[0, :-4800], 16)
        near = np.flatnonzero(np.abs(heads - out[0, :16]).max(1) < 2e-3)
        lag = [s for s in near if np.abs(want[:, s:s + 4800] - out).max() < 2e-3]
        assert lag, f"seed {seed}: no place in the reference within 2e-3"


def test_channels_mixed(files):
    record = stoker.audio().encode(files["flac"])
    ref, _ = decode_audio(files["flac"])
    mono, _, _ = _core.decode_audio_record(record, stoker.ops.clip.audio_spec(None, 1, None))
    assert mono.shape == (1, ref.shape[1])
    # to mono: the mean of the channels (not libswresample's default, each at -3 dB)
    np.testing.assert_allclose(mono[0], ref.mean(0), atol=1e-6)


def test_loader_batches(tmp_path, files):
    fields = {"audio": stoker.audio(sample_rate=16000, channels=1),
              "label": stoker.scalar("int64")}
    lengths = [0.2, 0.5, 1.0, 1.5]
    clips = [make_audio("flac", seconds=s, rate=22050) for s in lengths] * 2
    with stoker.ShardWriter(tmp_path / "ds", fields) as w:
        for i, c in enumerate(clips):
            w.write({"audio": c, "label": i})
    ds = stoker.Dataset(tmp_path / "ds")
    with stoker.Loader(ds, batch_size=4, transforms={"audio": stoker.ops.RandomAudioCrop(0.4)},
                       seed=1) as loader:
        b = next(iter(loader))
    assert b["audio"].shape == (4, 1, 6400) and b["audio"].dtype == torch.float32
    assert b["audio_lengths"].tolist() == [round(0.2 * 16000), 6400, 6400, 6400]
    assert not b["audio"][0, :, 3200:].any()  # past its length: zeros
    with stoker.Loader(ds, batch_size=4) as loader:  # whole files, padded to the longest
        b = next(iter(loader))
    assert b["audio"].shape == (4, 1, 24000)
    assert b["audio_lengths"].tolist() == [int(s * 22050) * 16000 // 22050 for s in lengths]

    def make(threads):
        return stoker.Loader(ds, batch_size=3, shuffle=True, seed=5, num_threads=threads,
                             transforms={"audio": [stoker.ops.RandomAudioCrop(0.3)]})

    same_for_threads_and_resume(make)


def test_an_absurd_rate_is_refused_not_resampled(files):
    """A record whose rate is over 768 kHz (a damaged header: resampling it would build a
    filter of millions of taps, found by fuzz_media) is refused, as is such a target rate."""
    import struct

    record = bytearray(stoker.audio().encode(files["wav"]))
    assert _core.audio_info(bytes(record))["sample_rate"] == struct.unpack_from("<i", record, 16)[0]
    struct.pack_into("<i", record, 16, 268443456)
    with pytest.raises(stoker.DecodeError, match="header is inconsistent .268443456 Hz"):
        _core.decode_audio_record(bytes(record), stoker.ops.clip.audio_spec(8000, None, None))
    with pytest.raises(ValueError, match="at most 768000 Hz"):
        stoker.audio(sample_rate=1_000_000)


def _wav(pcm: bytes, rate: int, channels: int, extra: bytes = b"") -> bytes:
    import struct

    fmt = struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, channels, rate, rate * 2 * channels,
                      2 * channels, 16)
    body = b"WAVE" + fmt + extra + b"data" + struct.pack("<I", len(pcm)) + pcm
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_a_record_that_does_not_match_its_file_is_refused():
    """A record whose channels say other than its file decodes to (a damaged header) is
    refused naming both, before the file's channels size a buffer (found by fuzz_media: a
    file of 8193 channels under a record of 2)."""
    import struct

    pcm = (np.sin(np.arange(1600) / 5) * 8000).astype("<i2").tobytes()
    record = bytearray(stoker.audio().encode(_wav(pcm, 8000, 1)))
    assert _core.audio_info(bytes(record))["channels"] == 1
    spec = stoker.ops.clip.audio_spec(None, None, None)
    assert _core.decode_audio_record(bytes(record), spec)[0].shape == (1, 1600)
    struct.pack_into("<i", record, 20, 2)
    with pytest.raises(stoker.DecodeError, match=r"decodes to 8000 Hz x 1, its record says "
                                                 r"8000 Hz x 2"):
        _core.decode_audio_record(bytes(record), spec)
    with pytest.raises(ValueError, match="65 channels: stoker reads 1 to 64"):
        stoker.audio().encode(_wav(b"\0" * 130 * 4, 8000, 65))


def test_a_header_that_claims_gigabytes_allocates_no_gigabytes(tmp_path):
    """A WAV whose LIST chunk claims 4 GB makes FFmpeg's demuxer allocate (and zero) a tag
    of the size it claims, 2 GB, before reading a byte of it (PyAV, over the same bytes,
    peaks at 2 GB; found by fuzz_media). stoker caps FFmpeg's single allocations at 1 GiB,
    so the file is refused, writing or reading, and the process stays small."""
    import struct
    import subprocess
    import sys

    pcm = (np.sin(np.arange(800) / 5) * 8000).astype("<i2").tobytes()
    info = b"INFO" + b"ISFT" + struct.pack("<I", 0x7FFFFFF0) + b"stoker\0\0"
    bad = _wav(pcm, 8000, 1, b"LIST" + struct.pack("<I", 0xFFFFFFF0) + info)
    good = stoker.audio().encode(_wav(pcm, 8000, 1))
    head = struct.unpack_from("<I", good, 8)[0]
    (tmp_path / "bad.wav").write_bytes(bad)
    (tmp_path / "bad.rec").write_bytes(good[:head] + bad)
    script = """
import resource, sys, pathlib
import stoker
from stoker import _core
d = pathlib.Path(sys.argv[1])
try:
    stoker.audio().encode((d / "bad.wav").read_bytes())
    print("encoded")
except ValueError as e:
    print("refused:", e)
try:
    _core.decode_audio_record((d / "bad.rec").read_bytes(),
                              stoker.ops.clip.audio_spec(None, None, None))
    print("decoded")
except stoker.DecodeError as e:
    print("refused:", e)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("refused: ") and "FFmpeg cannot read the file" in lines[0]
    assert lines[1].startswith("refused: ") and "FFmpeg cannot read the file" in lines[1]
    assert int(lines[2]) < 1024, f"peak RSS {lines[2]} MB"
