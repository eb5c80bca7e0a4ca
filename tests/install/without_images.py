"""A stoker built with -DSTOKER_WITH_IMAGES=OFF -DSTOKER_WITH_VIDEO=OFF (no libjpeg-turbo, no
libpng, no FFmpeg): arrays and tokens load as usual, and an image, video or audio field fails
at once with an error that says why. `.ci/run` builds that variant and runs this file with
pytest from outside the source tree; it is not part of `pytest tests` (its name does not start
with test_)."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import stoker
from stoker import _core

JPEG = bytes.fromhex("ffd8ffe000104a46494600010100000100010000ffd9")  # SOI, APP0, EOI
PNG = b"\x89PNG\r\n\x1a\n" + bytes(32)
NO_IMAGES = re.escape("built with -DSTOKER_WITH_IMAGES=OFF")
NO_MEDIA = re.escape("built with -DSTOKER_WITH_VIDEO=OFF")


def test_build_info_and_version_say_so():
    assert _core.build_info()["images"] is False
    assert _core.build_info()["codecs"] == "none"
    assert _core.build_info()["video"] is False
    assert _core.build_info()["media"] == "none"
    out = subprocess.run([sys.executable, "-m", "stoker", "--version"], capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith(f"stoker {stoker.__version__} (image codecs: none (built with "
                          "-DSTOKER_WITH_IMAGES=OFF); video and audio: none (built with "
                          "-DSTOKER_WITH_VIDEO=OFF))")


def test_extension_does_not_link_the_codecs():
    core = Path(_core.__file__)
    out = subprocess.run(["ldd", str(core)], capture_output=True, text=True, check=True).stdout
    assert "not found" not in out
    assert not re.search(r"lib(jpeg|png|av(format|codec|util)|sw(scale|resample))", out), out


def test_arrays_load(tmp_path):
    fields = {"x": stoker.ndarray("float32", (2, 3)), "tokens": stoker.ndarray("int32", (None,)),
              "label": stoker.scalar("int64")}
    with stoker.ShardWriter(tmp_path / "ds", fields) as w:
        for i in range(10):
            w.write({"x": np.full((2, 3), i, np.float32),
                     "tokens": np.arange(i + 1, dtype=np.int32), "label": i})
    batches = list(stoker.Loader(stoker.Dataset(tmp_path / "ds"), batch_size=4))
    assert [b["label"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert batches[2]["tokens_lengths"].tolist() == [9, 10]


def test_an_image_field_is_a_clear_error(tmp_path):
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(tmp_path / "ds", fields) as w:  # writing stores bytes: works
        w.write({"image": JPEG, "label": 0})
    ds = stoker.Dataset(tmp_path / "ds")
    assert ds[0]["image"] == JPEG
    for transforms in (None, {"image": [stoker.ops.RandomResizedCrop(8)]}):
        with pytest.raises(_core.Error, match=NO_IMAGES):
            stoker.Loader(ds, batch_size=1, transforms=transforms)
    for data in (JPEG, PNG):
        with pytest.raises(_core.Error, match=NO_IMAGES):
            _core.decode_image(data)
        with pytest.raises(_core.Error, match=NO_IMAGES):
            _core.image_size(data)
    with pytest.raises(_core.Error, match=NO_IMAGES):
        _core.decode_only_throughput([JPEG], 1)


@pytest.mark.parametrize("field", [stoker.video(), stoker.audio()])
def test_a_video_or_audio_field_is_a_clear_error(tmp_path, field):
    with pytest.raises(_core.Error, match=NO_MEDIA):
        with stoker.ShardWriter(tmp_path / "ds", {"media": field}) as w:
            w.write({"media": b"\x1aE\xdf\xa3" + bytes(60)})


def test_example_images_say_this_build_cannot_write_them(tmp_path):
    """The JPEGs of `stoker example-data images` come from the core's libjpeg-turbo
    encoder, which this build has not: one line that says so, exit status 1."""
    for kind in ("images", "jpeg-folder"):
        r = subprocess.run([sys.executable, "-m", "stoker", "example-data", kind, "out"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert "image support" in r.stderr and "-DSTOKER_WITH_IMAGES=OFF" in r.stderr
    with pytest.raises(_core.Error, match=NO_IMAGES):
        _core.encode_jpeg(np.zeros((8, 8, 3), np.uint8))
