import io
import os
import sys

import numpy as np
import pytest
import stoker
from stoker import _core
from stoker.convert import convert_imagefolder

Image = pytest.importorskip("PIL.Image", reason="Pillow is in the test extra")


def picture(h, w, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([128 + 90 * np.sin(x / 5.0 + c + seed) * np.cos(y / 6.0) for c in range(3)], -1)
    return np.clip(img + rng.normal(0, 5, img.shape), 0, 255).astype(np.uint8)


def save(path, arr, fmt, **kw):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt, **kw)
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return buf.getvalue()


@pytest.fixture
def tree(tmp_path):
    """bird/ cat/ dog/ with JPEG, PNG, BMP, an upper-case extension, a nested folder and a
    file that is not an image (by extension)."""
    src = tmp_path / "src"
    files = {}
    files["cat/b.jpg"] = save(src / "cat/b.jpg", picture(30, 40, 1), "JPEG", quality=90)
    files["cat/a.PNG"] = save(src / "cat/a.PNG", picture(20, 25, 2), "PNG")
    files["dog/x/deep.jpeg"] = save(src / "dog/x/deep.jpeg", picture(33, 21, 3), "JPEG")
    files["dog/pic.bmp"] = save(src / "dog/pic.bmp", picture(9, 11, 4), "BMP")
    files["bird/z.jpg"] = save(src / "bird/z.jpg", picture(300, 200, 5), "JPEG", quality=95)
    (src / "dog/notes.txt").write_text("not an image")
    os.makedirs(src / "empty_class")
    return src, files


def read_all(out):
    ds = stoker.Dataset(out)
    return ds, [ds[i] for i in range(len(ds))]


def test_layout_labels_and_bytes(tree, tmp_path):
    src, files = tree
    stats = convert_imagefolder(src, tmp_path / "out", progress=False, workers=2)
    assert stats["images"] == 5 and stats["classes"] == 4 and stats["skipped"] == []
    ds, rows = read_all(tmp_path / "out")
    assert ds.metadata["classes"] == ["bird", "cat", "dog", "empty_class"]
    # torchvision's order: classes sorted, then os.walk order with sorted names.
    order = ["bird/z.jpg", "cat/a.PNG", "cat/b.jpg", "dog/pic.bmp", "dog/x/deep.jpeg"]
    assert [int(r["label"]) for r in rows] == [0, 1, 1, 2, 2]
    for name, row in zip(order, rows, strict=True):
        data = bytes(row["image"])
        if name.endswith(".bmp"):  # re-encoded losslessly
            assert data.startswith(b"\x89PNG")
            np.testing.assert_array_equal(_core.decode_image(data), picture(9, 11, 4))
        else:
            assert data == files[name]  # stored as is


def test_output_is_deterministic_whatever_the_workers(tree, tmp_path):
    src, _ = tree
    convert_imagefolder(src, tmp_path / "a", progress=False, workers=1, shard_size=2000)
    convert_imagefolder(src, tmp_path / "b", progress=False, workers=4, shard_size=2000)
    a, b = stoker.Dataset(tmp_path / "a"), stoker.Dataset(tmp_path / "b")
    assert len(a.shards) > 1 and len(a.shards) == len(b.shards)
    # Every write has its own dataset id in the shard headers: all bytes after them agree.
    for sa, sb in zip(a.shards, b.shards, strict=True):
        assert (sa["num_records"], sa["bytes"], sa["table_checksum"]) == \
            (sb["num_records"], sb["bytes"], sb["table_checksum"])
        da = (tmp_path / "a" / sa["path"]).read_bytes()
        db = (tmp_path / "b" / sb["path"]).read_bytes()
        assert da[64:] == db[64:]


def test_bad_file_is_an_error_naming_it_unless_skipped(tree, tmp_path, capsys):
    src, files = tree
    bad = src / "cat" / "c_truncated.jpg"
    bad.write_bytes(files["cat/b.jpg"][: len(files["cat/b.jpg"]) * 2 // 3])
    junk = src / "dog" / "junk.png"
    junk.write_bytes(b"this is no png")
    with pytest.raises(ValueError, match=r"c_truncated\.jpg: truncated JPEG data"):
        convert_imagefolder(src, tmp_path / "out", progress=False)
    stats = convert_imagefolder(src, tmp_path / "out2", skip_bad=True, progress=True)
    assert stats["images"] == 5
    assert [p for p, _ in stats["skipped"]] == [str(bad), str(junk)]
    err = capsys.readouterr().err
    assert f"skipped {bad}" in err and f"skipped {junk}" in err and "skipped 2 bad file(s)" in err
    _, rows = read_all(tmp_path / "out2")
    assert [int(r["label"]) for r in rows] == [0, 1, 1, 2, 2]


def test_max_side_resizes_only_large_images(tree, tmp_path):
    src, files = tree
    convert_imagefolder(src, tmp_path / "out", max_side=100, quality=80, progress=False)
    _, rows = read_all(tmp_path / "out")
    big = bytes(rows[0]["image"])  # bird/z.jpg, 300x200
    assert big != files["bird/z.jpg"] and big.startswith(b"\xff\xd8\xff")
    assert _core.image_size(big) == (100, 67)
    assert bytes(rows[2]["image"]) == files["cat/b.jpg"]  # 30x40: kept as is


def test_cli(tree, tmp_path, capsys):
    from stoker.cli import main
    src, _ = tree
    assert main(["convert", "imagefolder", str(src), str(tmp_path / "out"), "--quiet"]) == 0
    assert "wrote 5 images of 4 classes" in capsys.readouterr().err
    assert len(stoker.Dataset(tmp_path / "out")) == 5
    (src / "cat" / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0garbage")
    # bad data, not usage: exit status 1 (README, "Command line")
    assert main(["convert", "imagefolder", str(src), str(tmp_path / "o2"), "--quiet"]) == 1
    assert "bad.jpg" in capsys.readouterr().err


def test_files_named_as_images_that_are_not_say_so_without_pillow(tree, tmp_path, monkeypatch):
    """A text file named .jpg is not a JPEG, whether or not Pillow is there; a BMP needs
    Pillow to be stored (as PNG), and says so."""
    src, _ = tree
    (src / "cat" / "notes.jpg").write_text("hello, I am text")
    (src / "cat" / "empty.png").write_bytes(b"")
    for pillow in (True, False):
        if not pillow:
            monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL fails
        stats = convert_imagefolder(src, tmp_path / f"out{pillow}", skip_bad=True,
                                    progress=False, overwrite=True)
        why = dict(stats["skipped"])
        assert why[str(src / "cat" / "notes.jpg")] == \
            "not a JPEG: the file starts with b'hello, I am ', no image format's signature"
        assert why[str(src / "cat" / "empty.png")] == "not a PNG: the file is empty"
        if pillow:
            assert len(why) == 2 and stats["images"] == 5
        else:
            assert why[str(src / "dog" / "pic.bmp")] == \
                "a BMP image: storing it (as PNG) needs Pillow (pip install pillow)"
            assert not any("Pillow" in w for p, w in why.items() if not p.endswith(".bmp"))


def test_missing_source(tmp_path):
    with pytest.raises(FileNotFoundError):
        convert_imagefolder(tmp_path / "nope", tmp_path / "out", progress=False)


def test_write_options_in_metadata_and_verify(tree, tmp_path, capsys):
    from stoker.cli import main
    src, files = tree
    out = tmp_path / "out"
    assert main(["convert", "imagefolder", str(src), str(out), "--quiet", "--max-side", "64",
                 "--quality", "70"]) == 0
    ds = stoker.Dataset(out)
    assert ds.metadata["write_options"] == {"max_side": 64, "quality": 70, "verified": True}
    sizes = [_core.image_size(bytes(ds[i]["image"])) for i in range(len(ds))]
    assert max(max(s) for s in sizes) == 64
    # a file whose header is fine but whose data is cut: found only by decoding it
    bad = src / "cat" / "c_cut.jpg"
    bad.write_bytes(files["cat/b.jpg"][: len(files["cat/b.jpg"]) * 2 // 3])
    assert main(["convert", "imagefolder", str(src), str(tmp_path / "o2"), "--quiet",
                 "--verify"]) == 1  # bad data: exit status 1
    assert "c_cut.jpg: truncated JPEG data" in capsys.readouterr().err
    assert main(["convert", "imagefolder", str(src), str(tmp_path / "o3"), "--quiet",
                 "--no-verify"]) == 0
    ds = stoker.Dataset(tmp_path / "o3")
    assert ds.metadata["write_options"] == {"max_side": None, "quality": None, "verified": False}
    assert len(ds) == 6
