"""stoker convert webdataset: grouping by key as WebDataset does, schema inference,
overrides, bad samples, parallel conversion."""

import io
import os
import tarfile

import numpy as np
import pytest
import stoker
from conftest import dataset_content
from stoker import cli
from stoker.convert import convert_webdataset
from stoker.convert.webdataset import WebDatasetError, iter_samples

Image = pytest.importorskip("PIL.Image", reason="Pillow is in the test extra")


def jpeg(seed):
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (16, 20, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def npy(arr):
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def write_tar(path, members, mode="w"):
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def sample(i):
    rng = np.random.default_rng(i)
    return {"jpg": jpeg(i), "cls": str(i % 7).encode(), "json": b'{"i": %d}' % i,
            "seg.npy": npy(rng.integers(0, 9, (i % 3 + 1, 2), dtype=np.int16))}


@pytest.fixture
def shards(tmp_path):
    """Two .tar shards and one .tar.gz, 5 + 4 + 6 samples, keys with folders and dots."""
    src = tmp_path / "src"
    src.mkdir()
    originals = []
    k = 0
    for j, (n, mode, ext) in enumerate(((5, "w", "tar"), (4, "w", "tar"), (6, "w:gz", "tar.gz"))):
        members = [("__meta__", b"ignored")]
        for _ in range(n):
            s = sample(k)
            originals.append((f"d{j}/s{k:04d}", s))
            members += [(f"{originals[-1][0]}.{ext_}", data) for ext_, data in s.items()]
            k += 1
        write_tar(src / f"shard-{j:03d}.{ext}", members, mode)
    (src / "README").write_text("not a shard")
    return src, originals


def check(ds, originals, key=False):
    assert len(ds) == len(originals)
    for i, (name, s) in enumerate(originals):
        got = ds[i]
        assert got["jpg"] == s["jpg"]
        assert got["cls"] == int(s["cls"])
        assert got["json"] == s["json"]
        np.testing.assert_array_equal(got["seg.npy"], np.load(io.BytesIO(s["seg.npy"])))
        if key:
            assert got["__key__"] == name.encode()


def test_grouping_like_webdataset(tmp_path):
    path = write_tar(tmp_path / "a.tar", [
        ("x/a.b.jpg", b"1"), ("x/a.b.cls", b"2"),      # key x/a, fields b.jpg, b.cls
        ("x/c.TXT", b"3"), ("__keys__", b""), ("noext", b"4"),
        ("x/a.txt", b"5"),                             # x/a again after x/c: a new sample
    ])
    got = [(k, s) for _, k, s in iter_samples(str(path))]
    assert got == [("x/a", {"b.jpg": b"1", "b.cls": b"2"}), ("x/c", {"txt": b"3"}),
                   ("x/a", {"txt": b"5"})]
    dup = write_tar(tmp_path / "d.tar", [("k.txt", b"1"), ("k.TXT", b"2")])
    with pytest.raises(WebDatasetError, match=r"d.tar: sample 0 \(key 'k'\): field 'txt' "
                                              "appears twice"):
        list(iter_samples(str(dup)))


def test_convert_infers_schema(shards, tmp_path):
    src, originals = shards
    stats = convert_webdataset(src, tmp_path / "out", workers=1, progress=False, keep_key=True)
    ds = stoker.Dataset(tmp_path / "out")
    assert stats["records"] == 15 and stats["files"] == 3
    assert ds.fields == {"__key__": stoker.blob(), "cls": stoker.scalar("int64"),
                         "jpg": stoker.image(), "json": stoker.blob(),
                         "seg.npy": stoker.ndarray("int16", (None, 2))}
    check(ds, originals, key=True)
    batch = next(iter(stoker.Loader(ds, batch_size=5, shuffle=False)))
    assert batch["jpg"].shape == (5, 3, 16, 20)
    assert batch["cls"].tolist() == [0, 1, 2, 3, 4]


def test_same_output_for_any_worker_count(shards, tmp_path):
    src, originals = shards
    outs = []
    for workers in (1, 3):
        out = tmp_path / f"out{workers}"
        convert_webdataset(src, out, workers=workers, shard_size="3KB", progress=False)
        outs.append(out)
    want = dataset_content(outs[0])  # all but each write's random dataset id
    assert len(want["shards"]) > 2 and dataset_content(outs[1]) == want
    check(stoker.Dataset(outs[1]), originals)


def test_features_override_and_missing(shards, tmp_path):
    src, originals = shards
    convert_webdataset(src, tmp_path / "out", progress=False, workers=2,
                       features="jpg:blob,cls:uint8,json:skip")
    ds = stoker.Dataset(tmp_path / "out")
    assert ds.fields == {"jpg": stoker.blob(), "cls": stoker.scalar("uint8")}
    assert [int(ds[i]["cls"]) for i in range(len(ds))] == [i % 7 for i in range(15)]
    with pytest.raises(WebDatasetError, match=r"shard-000.tar: sample 0 \(key 'd0/s0000'\): "
                                              "field 'txt': missing"):
        convert_webdataset(src, tmp_path / "o2", progress=False, features="txt:blob")


def test_inconsistent_samples(tmp_path):
    a = write_tar(tmp_path / "a.tar", [("k0.jpg", jpeg(0)), ("k0.cls", b"1"),
                                       ("k1.jpg", jpeg(1)), ("k1.cls", b"2"), ("k1.txt", b"x"),
                                       ("k2.jpg", jpeg(2))])
    with pytest.raises(WebDatasetError, match=r"sample 1 \(key 'k1'\): has field 'txt' that "
                                              "earlier samples lack"):
        convert_webdataset(a, tmp_path / "o", progress=False)
    with pytest.raises(WebDatasetError, match=r"sample 1 \(key 'k1'\): field 'txt' is not in "
                                              "the schema"):
        convert_webdataset(a, tmp_path / "o", progress=False, infer_records=1)
    stats = convert_webdataset(a, tmp_path / "o", progress=False, features="jpg:image,cls:int64",
                               skip_bad=True)
    assert stats["records"] == 2
    assert stats["skipped"] == [(f"{a}: sample 2 (key 'k2')", "field 'cls': missing")]
    assert not os.path.exists(tmp_path / "o2")


def test_bad_image_and_corrupt_tar(tmp_path):
    a = write_tar(tmp_path / "a.tar", [("k0.jpg", jpeg(0)), ("k1.jpg", b"GIF89a...")])
    with pytest.raises(WebDatasetError, match=r"a.tar: sample 1 \(key 'k1'\): field 'jpg'"):
        convert_webdataset(a, tmp_path / "o", progress=False, features="jpg:image")
    cut = write_tar(tmp_path / "c.tar", [("k0.jpg", jpeg(0)), ("k1.jpg", jpeg(1)[:-100])])
    with pytest.raises(WebDatasetError, match=r"c.tar: sample 1 \(key 'k1'\): field 'jpg': "
                                              "corrupt image"):
        convert_webdataset(cut, tmp_path / "o", progress=False, verify=True)
    data = (tmp_path / "a.tar").read_bytes()
    (tmp_path / "t.tar").write_bytes(data[:700])
    with pytest.raises(WebDatasetError, match="t.tar: corrupt tar"):
        convert_webdataset(tmp_path / "t.tar", tmp_path / "o", progress=False,
                           features="jpg:blob")
    assert not os.path.exists(tmp_path / "o")


def test_cli(shards, tmp_path, capsys):
    src, originals = shards
    out = tmp_path / "out"
    assert cli.main(["convert", "webdataset", str(src), str(out), "--quiet"]) == 0
    assert "wrote 15 samples from 3 shard(s)" in capsys.readouterr().err
    check(stoker.Dataset(out), originals)
