import json
import os

import numpy as np
import pytest
import stoker
from conftest import write_dataset


def test_roundtrip_all_field_kinds(tmp_path):
    fields = {
        "label": stoker.scalar("int64"),
        "x": stoker.ndarray("float32", (2, 3)),
        "tokens": stoker.ndarray("int32", (None,)),
        "raw": stoker.blob(),
    }
    rng = np.random.default_rng(0)
    samples = [{"label": i, "x": rng.standard_normal((2, 3)).astype(np.float32),
                "tokens": np.arange(i % 5, dtype=np.int32), "raw": bytes([i]) * (i % 4)}
               for i in range(50)]
    with stoker.ShardWriter(tmp_path / "d", fields, shard_size="1KB",
                            metadata={"classes": ["a", "b"]}) as w:
        for s in samples:
            w.write(s)
    ds = stoker.Dataset(tmp_path / "d")
    assert len(ds) == 50
    assert len(ds.shards) > 1, "1KB shards must roll over"
    assert ds.fields == fields
    assert ds.metadata == {"classes": ["a", "b"]}
    for i in (0, 17, 49, -1):
        got, want = ds[i], samples[i]
        assert got["label"] == want["label"]
        np.testing.assert_array_equal(got["x"], want["x"])
        np.testing.assert_array_equal(got["tokens"], want["tokens"])
        assert got["raw"] == want["raw"]
    # index.json given directly works too
    assert len(stoker.Dataset(tmp_path / "d" / "index.json")) == 50
    with pytest.raises(IndexError):
        ds[50]


@pytest.mark.parametrize("sample, message", [
    ({"label": 1}, "sample 2: missing field 'x'"),
    ({"label": 1, "x": np.zeros((2, 2), np.uint8), "y": 0}, "sample 2: unexpected field 'y'"),
    ({"label": 1.5, "x": np.zeros((2, 2), np.uint8)}, "sample 2, field 'label'"),
    ({"label": 1, "x": np.zeros((2, 3), np.uint8)}, r"sample 2, field 'x': expected shape"),
    ({"label": 1, "x": np.zeros((2, 2), np.int16)}, r"sample 2, field 'x': expected dtype"),
])
def test_invalid_samples_name_field_and_sample(tmp_path, sample, message):
    fields = {"label": stoker.scalar("int64"), "x": stoker.ndarray("uint8", (2, 2))}
    good = {"label": 0, "x": np.zeros((2, 2), np.uint8)}
    with pytest.raises(ValueError, match=message):
        with stoker.ShardWriter(tmp_path / "d", fields) as w:
            w.write(good)
            w.write(good)
            w.write(sample)
    # the failed writer leaves nothing: not even the directory it made
    assert not (tmp_path / "d").exists()
    with pytest.raises(FileNotFoundError):
        stoker.Dataset(tmp_path / "d")


def test_exception_inside_with_leaves_no_dataset(tmp_path):
    fields = {"label": stoker.scalar("int64")}
    with pytest.raises(RuntimeError, match="boom"):
        with stoker.ShardWriter(tmp_path / "d", fields, shard_size="100B") as w:
            for i in range(100):
                w.write({"label": i})
            raise RuntimeError("boom")
    assert not (tmp_path / "d").exists()  # it made the directory: it removes it
    (tmp_path / "e").mkdir()  # a directory that was there stays, empty
    with pytest.raises(RuntimeError, match="boom"):
        with stoker.ShardWriter(tmp_path / "e", fields, shard_size="100B") as w:
            w.write({"label": 1})
            raise RuntimeError("boom")
    assert os.listdir(tmp_path / "e") == []


def test_existing_dataset_needs_overwrite(tmp_path):
    write_dataset(tmp_path / "d", 5)
    with pytest.raises(FileExistsError):
        stoker.ShardWriter(tmp_path / "d", {"label": stoker.scalar("int64")})
    write_dataset(tmp_path / "d", 7, overwrite=True)
    assert len(stoker.Dataset(tmp_path / "d")) == 7


def test_unwritable_path_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        stoker.ShardWriter(tmp_path / "file", {"label": stoker.scalar("int64")})
    with pytest.raises(OSError, match="cannot create the output directory"):
        stoker.ShardWriter(tmp_path / "file" / "sub", {"label": stoker.scalar("int64")})


def test_index_lists_shards_with_sizes_and_checksums(tmp_path):
    write_dataset(tmp_path / "d", 40, shard_size="600B")
    index = json.loads((tmp_path / "d" / "index.json").read_text())
    assert index["num_records"] == 40
    assert sum(s["num_records"] for s in index["shards"]) == 40
    for s in index["shards"]:
        data = (tmp_path / "d" / s["path"]).read_bytes()
        assert s["bytes"] == len(data)
        assert s["checksum"] == stoker._core.checksum32(data)


@pytest.mark.parametrize("size, want", [("256MB", 256_000_000), ("1GiB", 2**30), (1000, 1000),
                                        ("2.5KB", 2500)])
def test_shard_size_parsing(size, want):
    from stoker.writer import parse_size
    assert parse_size(size) == want


def test_bad_shard_size():
    with pytest.raises(ValueError, match="invalid size"):
        stoker.ShardWriter("unused", {"a": stoker.blob()}, shard_size="lots")
