"""stoker.Dataset(path, preload=True): every shard read into memory at open (NOTE
[ Preloaded shards ] in csrc/format/shard_reader.h), with the same API and guarantees."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import stoker
import torch
from remote_servers import Nginx, nginx_binary


@pytest.fixture
def ds_path(tmp_path):
    fields = {"x": stoker.ndarray("float32", (8,)), "label": stoker.scalar("int64"),
              "tokens": stoker.ndarray("int32", (None,))}
    with stoker.ShardWriter(tmp_path / "ds", fields, shard_size="2KB") as w:
        for i in range(200):
            w.write({"x": np.full(8, i, np.float32), "label": i,
                     "tokens": np.arange(i % 7, dtype=np.int32)})
    assert len(stoker.Dataset(tmp_path / "ds").shards) >= 6
    return tmp_path / "ds"


def batches(ds, **kw):
    loader = stoker.Loader(ds, batch_size=16, shuffle=True, seed=3, num_threads=2, **kw)
    return [{k: v.clone() for k, v in b.items()} for b in loader], loader


def test_preloaded_reads_equal_mapped_reads_and_never_touch_the_files(ds_path):
    mapped = stoker.Dataset(ds_path)
    pre = stoker.Dataset(ds_path, preload=True)
    assert pre.tier == "memory" and mapped.tier == "mmap"
    assert pre._core.memory_bytes == sum(s["bytes"] for s in pre.shards)
    want, _ = batches(mapped)
    got, loader = batches(pre)
    assert loader.stats()["tier"] == "memory"
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys() and all(torch.equal(g[k], w[k]) for k in g)
    # The files may go: reads are served from memory (a mapped dataset would fail).
    for s in pre.shards:
        os.truncate(ds_path / s["path"], 10)
    assert all(int(pre[i]["label"]) == i for i in range(len(pre)))
    assert pre.verify()["ok"]
    again, _ = batches(pre)
    assert all(torch.equal(a["x"], w["x"]) for a, w in zip(again, want, strict=True))


def test_a_file_that_is_not_index_json_s_is_refused_by_name(ds_path):
    first = stoker.Dataset(ds_path).shards[1]["path"]
    with open(ds_path / first, "r+b") as f:  # a record's byte: the file checksum differs
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(stoker.DataError, match=rf"{first}: file checksum [0-9a-f]{{8}} differs "
                                                r"from index.json's"):
        stoker.Dataset(ds_path, preload=True)
    stoker.Dataset(ds_path)  # mapped, the shard is checked record by record when read


def test_auto_preloads_what_fits_and_bad_values_are_refused(ds_path, monkeypatch):
    from stoker import dataset as dataset_mod

    assert stoker.Dataset(ds_path, preload="auto").tier == "memory"
    monkeypatch.setattr(dataset_mod, "preload_auto_limit", lambda: 100)
    assert stoker.Dataset(ds_path, preload="auto").tier == "mmap"
    with pytest.raises(ValueError, match="preload must be True, False or 'auto'"):
        stoker.Dataset(ds_path, preload="yes")


FORKED = textwrap.dedent("""
    import os, sys
    import numpy as np
    import stoker
    fields = {"x": stoker.ndarray("uint8", (10000,)), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(sys.argv[1], fields, shard_size="4MB") as w:
        for i in range(2000):                       # 20 MB
            w.write({"x": np.full(10000, i % 251, np.uint8), "label": i})
    ds = stoker.Dataset(sys.argv[1], preload=True)
    def private_kb():
        with open("/proc/self/smaps_rollup") as f:
            return sum(int(l.split()[1]) for l in f if l.startswith("Private_"))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        before = private_kb()
        ok = all(int(ds[i]["label"]) == i for i in range(len(ds)))
        grown = private_kb() - before
        os.write(w, f"{ok} {grown}".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    ok, grown = os.read(r, 100).decode().split()
    print(ok, grown, ds._core.memory_bytes // 1024)
""")


def test_a_forked_child_reads_the_preloaded_memory_without_a_copy(tmp_path):
    r = subprocess.run([sys.executable, "-c", FORKED, str(tmp_path / "big")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ok, grown, size_kb = r.stdout.split()
    assert ok == "True"
    # The child's private memory grew by far less than the dataset: its pages are shared.
    assert int(size_kb) >= 19_000 and int(grown) < int(size_kb) // 4, (grown, size_kb)


def test_a_url_dataset_is_downloaded_then_held_in_memory(ds_path, tmp_path):
    if nginx_binary() is None:
        pytest.skip("nginx is not installed")
    server = Nginx(str(ds_path.parent), str(tmp_path / "nginx"))
    try:
        cache = tmp_path / "cache"
        ds = stoker.Dataset(f"{server.url}/ds", cache_dir=cache, preload=True)
        assert ds.tier == "memory"
        want, _ = batches(stoker.Dataset(ds_path))
        got, loader = batches(ds)
        assert loader.stats()["tier"] == "memory"
        assert all(torch.equal(g["x"], w["x"]) for g, w in zip(got, want, strict=True))
        # Nothing of the cache is held: every object may be evicted.
        import fcntl

        for name in os.listdir(cache / "objects"):
            fd = os.open(cache / "objects" / name, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)
    finally:
        server.stop()
