import json
import os
import re
import struct

import numpy as np
import pytest
import stoker
import torch
from conftest import write_dataset

HEADER = 64
FOOTER = 32


def shard_path(ds, i=0):
    return os.path.join(ds.path, ds.shards[i]["path"])


def test_missing_directory_and_index(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such dataset"):
        stoker.Dataset(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="index.json"):
        stoker.Dataset(tmp_path / "empty")


def test_images_given_for_a_dataset_point_to_convert_imagefolder(tmp_path):
    """A JPEG file, a folder of JPEGs and an ImageFolder tree opened as a dataset: each
    error says what was given and the command that makes a dataset of it."""
    from stoker import _core

    jpeg = _core.encode_jpeg(np.zeros((8, 8, 3), np.uint8))
    (tmp_path / "tree" / "cat").mkdir(parents=True)
    (tmp_path / "tree" / "cat" / "a.jpg").write_bytes(jpeg)
    with pytest.raises(stoker.DataError, match=r"a\.jpg: not a stoker dataset index \(a JPEG "
                       r"image\).*stoker convert imagefolder") as e:
        stoker.Dataset(tmp_path / "tree" / "cat" / "a.jpg")
    assert "JSON" not in str(e.value)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(stoker.DataError, match=r"notes\.txt: not a stoker dataset index"):
        stoker.Dataset(tmp_path / "notes.txt")
    for folder, says in (("tree", "an ImageFolder tree"), ("tree/cat", "one sub-folder per "
                                                                         "class")):
        for open_ in (stoker.Dataset, stoker.Loader):
            with pytest.raises(FileNotFoundError, match="no index.json") as e:
                open_(str(tmp_path / folder))
            assert "stoker convert imagefolder" in str(e.value) and says in str(e.value)
    (tmp_path / "arrays").mkdir()
    with pytest.raises(FileNotFoundError) as e:  # no images: no such advice
        stoker.Dataset(tmp_path / "arrays")
    assert "imagefolder" not in str(e.value)


@pytest.mark.parametrize("edit, message", [
    (lambda t: "{not json", "invalid JSON"),
    (lambda t: t.replace('"version": 2', '"version": 99'), "format version 99"),
    (lambda t: t.replace('"format": "stoker"', '"format": "other"'), "not a stoker index"),
    (lambda t: t.replace('"int64"', '"int32"'), "schema_hash does not match"),
    (lambda t: t.replace('"num_records": 30,', '"num_records": 31,', 1), "num_records"),
    (lambda t: t.replace('"gen-', '"../gen-', 1), "must be relative"),
])
def test_bad_index_is_reported(tmp_path, edit, message):
    write_dataset(tmp_path / "d", 30)
    index = tmp_path / "d" / "index.json"
    text = json.dumps(json.loads(index.read_text()))  # canonical spacing for the edits
    index.write_text(edit(text))
    with pytest.raises(stoker.DataError, match=message) as e:
        stoker.Dataset(tmp_path / "d")
    assert "index.json" in str(e.value)


_ODD_VALUES = [None, -1, 0, 1, 2**63, 2**70, 1.5, True, "", "x", "../x", "/etc/passwd", [],
               {}, [1], {"a": 1}, "ffffffffffffffff", "shard-00000.stk"]


def _json_paths(node, path=()):
    if path:
        yield path
    items = node.items() if isinstance(node, dict) else \
        enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from _json_paths(child, path + (key,))


def test_any_edit_of_the_index_is_accepted_or_a_data_error(tmp_path):
    """Structural fuzz of index.json: a value swapped for one of another type or size, or a
    key removed; half the time the schema hash is fixed up so the schema parsing is reached.
    Opening and reading the result either works or raises DataError naming index.json or
    the shard; never a TypeError, an OverflowError or a crash in C++."""
    import random

    from stoker.fields import Field, schema_hash

    write_dataset(tmp_path / "d", 42, shard_size="1KB")
    index_path = tmp_path / "d" / "index.json"
    original = json.loads(index_path.read_text())
    rng = random.Random(0)
    outcomes = {"opened": 0, "refused": 0}
    for _ in range(300):
        index = json.loads(json.dumps(original))
        for _ in range(rng.choice([1, 1, 2])):
            path = rng.choice(list(_json_paths(index)))
            parent = index
            for key in path[:-1]:
                parent = parent[key]
            if isinstance(parent, dict) and rng.random() < 0.15:
                del parent[path[-1]]
            else:
                parent[path[-1]] = rng.choice(_ODD_VALUES)
        if rng.random() < 0.5:
            try:
                fields = {f["name"]: Field.from_spec(f) for f in index["schema"]}
                index["schema_hash"] = f"{schema_hash(fields):016x}"
            except Exception:
                pass  # the schema itself is broken: Dataset must say so
        index_path.write_text(json.dumps(index))
        try:
            ds = stoker.Dataset(tmp_path / "d")
            for _ in stoker.Loader(ds, batch_size=16, num_threads=2):
                pass
            outcomes["opened"] += 1
        except stoker.DataError as e:
            assert str(tmp_path / "d") in str(e), str(e)  # names index.json or the shard
            outcomes["refused"] += 1
    assert outcomes["opened"] > 0 and outcomes["refused"] > 0, outcomes


def test_missing_shard_file(tmp_path):
    ds = write_dataset(tmp_path / "d", 30)
    path = shard_path(ds)
    os.remove(path)
    with pytest.raises(stoker.DataError, match="shard-00000.stk: cannot open shard"):
        stoker.Dataset(tmp_path / "d")


def test_truncated_shard_is_reported_with_path(tmp_path):
    ds = write_dataset(tmp_path / "d", 30)
    path = shard_path(ds)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 10)
    with pytest.raises(stoker.DataError, match=r"shard-00000.stk: shard is \d+ bytes but "
                                               r"index.json says"):
        stoker.Dataset(tmp_path / "d")


def flip(path, offset, mask=0x01):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))


def test_wrong_magic_and_version(tmp_path):
    ds = write_dataset(tmp_path / "d", 10)
    path = shard_path(ds)
    flip(path, 0)
    with pytest.raises(stoker.DataError, match="not a stoker shard"):
        stoker.Dataset(tmp_path / "d")
    flip(path, 0)
    # A well-formed header of another version: rewrite version and its checksum.
    with open(path, "r+b") as f:
        header = bytearray(f.read(HEADER))
        header[8:12] = struct.pack("<I", 3)
        header[60:64] = struct.pack("<I", stoker._core.checksum32(bytes(header[:60])))
        f.seek(0)
        f.write(header)
    with pytest.raises(stoker.DataError, match="format version 3 is not supported"):
        stoker.Dataset(tmp_path / "d")


def test_corrupt_record_names_file_and_record(tmp_path):
    ds = write_dataset(tmp_path / "d", 10, shard_size="1MB")
    path = shard_path(ds)
    record_len = 4 * 2 + 48 + 8
    flip(path, HEADER + 3 * record_len + 20)   # inside record 3's payload
    ds = stoker.Dataset(tmp_path / "d")        # the structure is still fine
    assert ds[2]["label"] == 2
    with pytest.raises(stoker.DataError, match=r"shard-00000.stk: record 3: checksum mismatch"):
        ds[3]
    loader = stoker.Loader(ds, batch_size=4, num_threads=2)
    with pytest.raises(stoker.DataError, match=r"shard-00000.stk: record 3: checksum mismatch"):
        list(loader)


def test_errors_name_the_file_and_keep_the_source_location_aside(tmp_path, monkeypatch):
    """The message is the user's (their shard, their record, what to do); where in csrc/
    it was raised is the exception's source_location, and in the message only with
    STOKER_DEBUG=1."""
    ds = write_dataset(tmp_path / "d", 10, shard_size="1MB")
    flip(shard_path(ds), HEADER + 3 * (4 * 2 + 48 + 8) + 20)
    ds = stoker.Dataset(tmp_path / "d")
    for read in (lambda: ds[3], lambda: list(stoker.Loader(ds, batch_size=4))):
        with pytest.raises(stoker.DataError) as e:
            read()
        assert "shard-00000.stk: record 3: checksum mismatch" in str(e.value)
        assert "csrc/" not in str(e.value) and ".cpp:" not in str(e.value), str(e.value)
        assert re.fullmatch(r"csrc/[\w/]+\.(cpp|h):\d+( <- csrc/[\w/]+\.(cpp|h):\d+)*",
                            e.value.source_location), e.value.source_location
    with pytest.raises(stoker.DataError) as e:  # the loader's says what to do
        list(stoker.Loader(ds, batch_size=4))
    assert 'on_error="skip"' in str(e.value)
    monkeypatch.setenv("STOKER_DEBUG", "1")
    with pytest.raises(stoker.DataError) as e:
        ds[3]
    assert str(e.value).endswith(f"[{e.value.source_location}]")
    # raised from Python, or by C++ code without STOKER_THROW: no location, never an
    # AttributeError
    assert stoker.DataError("x").source_location is None
    monkeypatch.delenv("STOKER_DEBUG")
    with pytest.raises(ValueError) as e:  # a usage error from C++: a ValueError, located too
        ds._core.read(10)
    assert "csrc/" not in str(e.value) and e.value.source_location.startswith("csrc/format/")


def test_every_single_byte_flip_is_detected(tmp_path):
    """Exhaustive: each byte of a small shard, flipped, is caught on open or on read."""
    ds = write_dataset(tmp_path / "d", 6, fields={"v": stoker.ndarray("int32", (None,)),
                                                  "s": stoker.scalar("int16")},
                       make=lambda i: {"v": np.arange(i, dtype=np.int32), "s": i})
    path = shard_path(ds)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        clean = f.read()
    undetected = []
    for off in range(size):
        flip(path, off, 0x10)
        try:
            d = stoker.Dataset(tmp_path / "d")
            for i in range(len(d)):
                d[i]
            undetected.append(off)
        except stoker.DataError as e:
            assert "shard-00000.stk" in str(e)
        flip(path, off, 0x10)
    with open(path, "rb") as f:
        assert f.read() == clean
    assert undetected == [], f"flips at offsets {undetected} of {size} went unnoticed"


def test_random_byte_flips_on_a_larger_shard(tmp_path):
    ds = write_dataset(tmp_path / "d", 2000, shard_size="10MB")
    path = shard_path(ds)
    size = os.path.getsize(path)
    rng = np.random.default_rng(1)
    for off in rng.integers(0, size, 150):
        mask = int(rng.integers(1, 256))
        flip(path, int(off), mask)
        with pytest.raises(stoker.DataError):
            d = stoker.Dataset(tmp_path / "d")
            report = d.verify()
            if not report["ok"]:
                raise stoker.DataError(str(report["bad"][0]))
        flip(path, int(off), mask)
    assert stoker.Dataset(tmp_path / "d").verify()["ok"]


def test_verify_reports_bad_records(tmp_path):
    ds = write_dataset(tmp_path / "d", 20)
    flip(shard_path(ds), HEADER + 5)
    report = stoker.Dataset(tmp_path / "d").verify()
    assert not report["ok"]
    assert report["records"] == 20
    assert (shard_path(ds), 0) == report["bad"][0][:2]
    assert any(rec == -1 for _, rec, _ in report["bad"])  # whole-file checksum too


def test_getitem_types(small_ds):
    s = small_ds[7]
    assert s["label"] == 7 and s["label"].dtype == np.int64
    assert s["x"].shape == (3, 4, 4) and (s["x"] == 7).all()
    s["x"][0, 0, 0] = 1  # writable copy, the mapping is untouched
    assert small_ds[7]["x"][0, 0, 0] == 7


# -- a torch Dataset's items: as_tuple, classes (docs/python.md, "Step 2") -------------------

@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An ImageFolder-style dataset: PNG images (exact pixels) and labels, class names."""
    from conftest import png

    rng = np.random.default_rng(0)
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    path = tmp_path_factory.mktemp("folder") / "ds"
    with stoker.ShardWriter(path, fields, metadata={"classes": ["cat", "dog", "emu"]}) as w:
        for i in range(10):
            w.write({"image": png(rng.integers(0, 255, (6, 5, 3), np.uint8)), "label": i % 3})
    return path


def _my_collate(samples):  # a torch Dataset's collate_fn, as written for (x, y) items
    xs, ys = zip(*samples)
    return torch.stack(xs), torch.stack(ys)


def test_as_tuple_gives_a_torch_datasets_items_and_dataloaders_batches(folder):
    import pickle

    from torch.utils.data import DataLoader

    ds = stoker.Dataset(folder, as_tuple=("image", "label"))
    x, y = ds[4]
    assert x.dtype == torch.uint8 and x.shape == (3, 6, 5) and y.dtype == torch.int64 \
        and y.dim() == 0 and int(y) == 1
    plain = stoker.Dataset(folder)
    assert torch.equal(x, torch.from_numpy(plain.sample(4)["image"]).permute(2, 0, 1))
    assert ds.classes == ["cat", "dog", "emu"] and ds.class_to_idx == {"cat": 0, "dog": 1,
                                                                      "emu": 2}
    assert pickle.loads(pickle.dumps(ds)).as_tuple == ("image", "label")
    # the same batches as DataLoader over the same dataset, with and without a collate_fn,
    # for images, labels in loader
    for kw in ({}, {"collate_fn": _my_collate}, {"collate_fn": _my_collate, "num_workers": 2}):
        want = list(DataLoader(ds, batch_size=4, **kw))
        got = list(stoker.Loader(ds, batch_size=4, **kw))
        assert len(got) == len(want) == 3
        for (gx, gy), (wx, wy) in zip(got, want, strict=True):
            assert type(gx) is type(wx) and torch.equal(gx, wx) and torch.equal(gy, wy)
        if not kw:
            assert all(isinstance(b, list) for b in got)  # default_collate's for tuples
    images, labels = next(iter(stoker.Loader(ds, batch_size=None)))  # the item itself
    assert images.shape == (3, 6, 5) and labels.dim() == 0


def test_as_tuple_is_checked(folder):
    with pytest.raises(ValueError, match="as_tuple=.*must name fields.*image, label"):
        stoker.Dataset(folder, as_tuple=("image", "target"))
    with pytest.raises(TypeError, match="sequence of field names"):
        stoker.Dataset(folder, as_tuple="image")
    with pytest.raises(AttributeError, match="no class names"):
        _ = write_dataset(os.path.join(os.path.dirname(folder), "plain"), 3).classes
