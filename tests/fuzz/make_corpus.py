"""Writes seed corpora for the fuzz targets: small valid shards (format versions 2 and 1),
images, Megatron indexes, patches of a decoded cache's file, and small videos and sounds
(files and records, fuzz_media.cpp's first byte saying which).

    python tests/fuzz/make_corpus.py OUT_DIR   -> OUT_DIR/shard/*, OUT_DIR/image/*,
                                                  OUT_DIR/megatron/*, OUT_DIR/cache/*,
                                                  OUT_DIR/media/*
"""

import base64
import io
import os
import struct
import sys
import tempfile

import numpy as np
import stoker


def shards(out):
    os.makedirs(out, exist_ok=True)
    fields = {"x": stoker.ndarray("uint8", (4,)), "v": stoker.ndarray("int32", (None, 2)),
              "b": stoker.blob()}
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for k, n in enumerate((1, 2, 3, 9)):
            path = os.path.join(tmp, str(k))
            with stoker.ShardWriter(path, fields) as w:
                for i in range(n):
                    w.write({"x": rng.integers(0, 255, 4, dtype=np.uint8),
                             "v": rng.integers(0, 9, (i % 3, 2), dtype=np.int32),
                             "b": bytes(i % 4)})
            shard = stoker.Dataset(path).shards[0]["path"]  # gen-<id>/shard-00000.stk
            with open(os.path.join(path, shard), "rb") as f:
                data = f.read()
            with open(os.path.join(out, f"shard{k}"), "wb") as f:
                f.write(data)


def v1_shards(out):
    """Version-1 shards (no identity), still read: the compatibility fixture's."""
    src = os.path.join(os.path.dirname(__file__), "..", "data", "v1_dataset")
    for name in sorted(os.listdir(src)):
        if name.endswith(".stk"):
            with open(os.path.join(src, name), "rb") as f, \
                    open(os.path.join(out, "v1-" + name), "wb") as g:
                g.write(f.read())


def images(out):
    from PIL import Image

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 255, (23, 31, 3), dtype=np.uint8)
    variants = [("RGB", "JPEG", {"quality": 80}), ("L", "JPEG", {}), ("CMYK", "JPEG", {}),
                ("RGB", "JPEG", {"progressive": True}), ("RGB", "PNG", {}), ("RGBA", "PNG", {}),
                ("P", "PNG", {}), ("L", "PNG", {}), ("RGB", "PNG", {"interlace": 1})]
    for k, (mode, fmt, kw) in enumerate(variants):
        img = Image.fromarray(arr).convert(mode)
        buf = io.BytesIO()
        img.save(buf, format=fmt, **kw)
        with open(os.path.join(out, f"img{k}.{fmt.lower()}"), "wb") as f:
            f.write(buf.getvalue())


def megatron(out):
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    for k, n in enumerate((0, 1, 5, 40)):
        lengths = rng.integers(0, 300, n).astype(np.int32)
        pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * 2 \
            if n else np.zeros(0, np.int64)
        data = (b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, n, n + 1) + lengths.tobytes()
                + pointers.tobytes() + np.arange(n + 1, dtype=np.int64).tobytes())
        with open(os.path.join(out, f"idx{k}"), "wb") as f:
            f.write(data)


def cache(out):
    """Patches (u16 offset, u8 length, bytes) of fuzz_cache.cpp: a header field, an entry's
    word, an entry's head and pixels, a process slot's holder count."""
    os.makedirs(out, exist_ok=True)
    data = 4096 + 8192 + 4096 + 4096  # header, process slots, words and marks of 8 slots
    seeds = {
        "words-offset": [(56, struct.pack("<Q", 1 << 40))],
        "used": [(128, struct.pack("<Q", 1 << 62))],
        "used-misaligned": [(128, struct.pack("<Q", 17))],  # an entry head off its alignment
        "word-past-end": [(4096 + 8192 + 3 * 8, struct.pack("<Q", (1 << 40) << 2 | 2))],
        "head": [(data, struct.pack("<Qiiii", 99, 1 << 30, 1 << 30, 1, 1))],
        "pixels": [(data + 64, b"\xff" * 60)],
        "holders": [(4096, b"\x00" * 64)],
    }
    for name, patches in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            for at, raw in patches:
                f.write(struct.pack("<HB", at, len(raw)) + raw)


def media(out):
    """fuzz_media.cpp's inputs: tiny videos (H.264 with B-frames, VP9, a variable frame rate)
    and sounds (wav, flac), each as a file (path 1 or 3) and as its record (path 0 or 2)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from media_reference import encoders_here, make_audio, make_video

    os.makedirs(out, exist_ok=True)
    here = encoders_here()
    videos = [("h264", make_video("h264", frames=6, w=16, h=16, gop=4))] if "h264" in here else []
    if "vp9" in here:
        videos.append(("vp9", make_video("vp9", frames=4, w=16, h=16)))
    if "h264" in here:
        videos.append(("vfr", make_video("h264", frames=5, w=16, h=16, vfr=True, gop=2)))
    sounds = [(fmt, make_audio(fmt, seconds=0.05, rate=8000, channels=2))
              for fmt in ("wav", "flac")]
    for name, data in videos:
        for path, raw in ((1, data), (0, stoker.video().encode(data))):
            with open(os.path.join(out, f"{name}-{path}"), "wb") as f:
                f.write(bytes([path]) + raw)
    for name, data in sounds:
        for path, raw in ((3, data), (2, stoker.audio().encode(data))):
            with open(os.path.join(out, f"{name}-{path}"), "wb") as f:
                f.write(bytes([path]) + raw)
    # Inputs fuzz_media found, kept so every run tries them again: a record of 2 channels
    # over a WAV of 8193 whose LIST chunk claims 4 GB (FFmpeg allocated 2 GB for its tag).
    for name, b64 in FOUND.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(base64.b64decode(b64))


FOUND = {
    "wav-list-4gb-2": (
        "ApNBVUQBAAAAMAAAAAAAAABAHwAAAgAAAAABAECQAAAAAQAAAAAAAAAAAAAAAAAAAFJJRkaGBgAAV0FW"
        "RWZtdCAQAAAAASACAEAfAAAAfQAABAAQAExJU1QZ///+SU5GT0lTRlQObWV0YWRhdGEyLjEyLjEwMgBk"
        "YXRhQAYAAAAAAADNCB8NVxFdGV0ZBAT8+bsMKO0RWhWV4cccDNgZM/cfDQ=="),
}


if __name__ == "__main__":
    root = sys.argv[1]
    shards(os.path.join(root, "shard"))
    v1_shards(os.path.join(root, "shard"))
    images(os.path.join(root, "image"))
    megatron(os.path.join(root, "megatron"))
    cache(os.path.join(root, "cache"))
    if stoker._core.build_info()["video"]:
        media(os.path.join(root, "media"))
