"""stoker convert video|audio: class folders to a dataset (labels as ImageFolder's), bad
files named or skipped, the command line."""

import subprocess
import sys

import numpy as np
import pytest
import stoker
from media_reference import decode_all, make_audio, make_video
from stoker import _core
from stoker.convert.media import convert_audio, convert_video

pytestmark = pytest.mark.skipif(not _core.build_info()["video"],
                                reason="built without FFmpeg (STOKER_WITH_VIDEO=OFF)")


def test_convert_video_folders(tmp_path):
    src = tmp_path / "src"
    files = {}
    for c, cls in enumerate(["walk", "jump"]):
        (src / cls / "sub").mkdir(parents=True)
        for k in range(2):
            data = make_video("h264", frames=8 + k, w=32, h=32)
            path = src / cls / ("sub" if k else "") / f"{k}.mp4"
            path.write_bytes(data)
            files[str(path)] = (data, c)
    (src / "walk" / "notes.txt").write_text("not a video")
    stats = convert_video(src, tmp_path / "out", workers=2, progress=False)
    assert (stats["files"], stats["classes"], stats["skipped"]) == (4, 2, [])
    ds = stoker.Dataset(tmp_path / "out")
    assert ds.metadata["classes"] == ["jump", "walk"]
    got = sorted((ds[i]["video"], int(ds[i]["label"])) for i in range(len(ds)))
    want = sorted((d, 1 - c) for d, c in files.values())  # labels: sorted class names
    assert got == want
    with stoker.Loader(ds, batch_size=4, transforms={"video": [stoker.ops.CenterClip(2)]},
                       image_layout="HWC") as loader:
        b = next(iter(loader))
    ref = decode_all(ds[0]["video"])
    np.testing.assert_array_equal(b["video"][0, 0].numpy(), ref[(len(ref) - 2) // 2][1])


def test_bad_files_are_named_or_skipped(tmp_path):
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    (src / "0.wav").write_bytes(make_audio("wav", seconds=0.2))
    (src / "1.wav").write_bytes(b"RIFF not really")
    with pytest.raises(ValueError, match=r"1\.wav.*--skip-bad"):
        convert_audio(tmp_path / "src", tmp_path / "out", progress=False)
    stats = convert_audio(tmp_path / "src", tmp_path / "out2", skip_bad=True, progress=False,
                          sample_rate=16000, channels=1)
    assert stats["files"] == 1 and stats["skipped"][0][0].endswith("1.wav")
    ds = stoker.Dataset(tmp_path / "out2")
    assert ds.fields["audio"] == stoker.audio(sample_rate=16000, channels=1)


def test_command_line(tmp_path):
    src = tmp_path / "src" / "yes"
    src.mkdir(parents=True)
    for i in range(3):
        (src / f"{i}.flac").write_bytes(make_audio("flac", seconds=0.3))
    r = subprocess.run([sys.executable, "-m", "stoker", "convert", "audio", str(tmp_path / "src"),
                        str(tmp_path / "out"), "--sample-rate", "8000", "--quiet"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "wrote 3 audio files of 1 classes" in r.stderr
    ds = stoker.Dataset(tmp_path / "out")
    with stoker.Loader(ds, batch_size=3) as loader:
        b = next(iter(loader))
    assert b["audio"].shape == (3, 2, 2400)
