"""Remote datasets through the shard cache, against real servers on loopback: nginx for
HTTP, moto's S3 server for S3, and a raw TCP server that cuts bodies short."""

import hashlib
import io
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import stoker
import torch
from remote_servers import GatedServer, S3Server, TruncatingServer
from stoker import _core
from stoker.remote import RemoteDataset, RemoteError, ShardCache, open_source

Image = pytest.importorskip("PIL.Image", reason="Pillow is in the test extra")

N = 120


def jpeg(i):
    rng = np.random.default_rng(i)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def local_ds(tmp_path_factory):
    """A dataset of ~8 shards (images, labels, variable-length tokens) under www/ds."""
    www = tmp_path_factory.mktemp("www")
    fields = {"image": stoker.image(), "label": stoker.scalar("int64"),
              "tokens": stoker.ndarray("int32", (None,))}
    rng = np.random.default_rng(0)
    with stoker.ShardWriter(www / "ds", fields, shard_size="16KB") as w:
        for i in range(N):
            w.write({"image": jpeg(i), "label": i,
                     "tokens": rng.integers(0, 1000, i % 9, dtype=np.int32)})
    ds = stoker.Dataset(www / "ds")
    assert len(ds.shards) >= 6
    return www, ds


@pytest.fixture(scope="module")
def served_root(local_ds):
    """What the `nginx` fixture (conftest.py) serves."""
    return local_ds[0]


@pytest.fixture(scope="module")
def s3(local_ds):
    pytest.importorskip("boto3", reason="boto3 is in the test extra")
    pytest.importorskip("moto", reason="moto (with flask for its server) is in the test extra")
    server = S3Server()
    server.upload_dir(str(local_ds[0] / "ds"), "bucket", "datasets/ds")
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)
    return s3


def same_records(a, b):
    assert len(a) == len(b) and a.fields == b.fields
    for i in range(len(a)):
        x, y = a[i], b[i]
        for k in x:
            if isinstance(x[k], bytes):
                assert x[k] == y[k], (i, k)
            else:
                np.testing.assert_array_equal(x[k], y[k])


def epoch(ds, seed, e):
    loader = stoker.Loader(ds, batch_size=16, shuffle=True, seed=seed, num_threads=2)
    loader.set_epoch(e)
    return [{k: v.clone() for k, v in b.items()} for b in loader], loader


def same_epochs(remote, local):
    for e in (0, 1):
        got, loader = epoch(remote, 7, e)
        want, _ = epoch(local, 7, e)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.keys() == w.keys()
            for k in g:
                assert torch.equal(g[k], w[k]), k
    return loader


def objects(cache_dir):
    d = os.path.join(cache_dir, "objects")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def parts(cache_dir):
    d = os.path.join(cache_dir, "tmp")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


# -- a full epoch, bit for bit -------------------------------------------------------------

def test_http_epoch_equals_local(local_ds, nginx, tmp_path):
    _, local = local_ds
    cache = tmp_path / "cache"
    url = f"{nginx.url}/ds"
    before = nginx.requests("/ds/gen-")
    ds = stoker.Dataset(url, cache_dir=cache, cache_limit="10MB")
    same_records(ds, local)
    loader = same_epochs(ds, local)
    net = loader.stats()["network"]
    n = len(local.shards)
    assert net["downloads"] == n and net["cache_hits"] == 0
    assert net["bytes_downloaded"] == sum(s["bytes"] for s in local.shards)
    assert nginx.requests("/ds/gen-", before + n) - before == n
    assert ds.verify()["ok"]
    # again: every shard from the cache, nothing asked of the server but index.json
    ds2 = stoker.Dataset(url + "/index.json", cache_dir=cache)
    same_records(ds2, local)
    assert ds2.remote.stats()["cache_hits"] == n and ds2.remote.stats()["downloads"] == 0
    assert nginx.requests("/ds/gen-", before + n) - before == n
    assert parts(cache) == []
    # pickled (a spawn/forkserver worker): reopened by URL through the same cache
    again = pickle.loads(pickle.dumps(ds))
    assert again.url == url and again.remote.stats()["downloads"] == 0
    same_records(again, local)


def test_token_dataset_over_a_url_equals_local(local_ds, nginx, tmp_path):
    """A token view of a remote dataset indexes every record's length on open: it fetches
    the shards first (the document index reads them all), then reads like the local one."""
    _, local = local_ds
    ds = stoker.Dataset(f"{nginx.url}/ds", cache_dir=tmp_path / "cache")
    remote_tokens = stoker.TokenDataset(ds, field="tokens")
    local_tokens = stoker.TokenDataset(local, field="tokens")
    assert (remote_tokens.num_docs, remote_tokens.num_tokens) == \
        (local_tokens.num_docs, local_tokens.num_tokens)
    assert ds.remote.stats()["downloads"] == len(local.shards)


def _read_all_in_child(ds, queue):
    labels = [int(x) for b in stoker.Loader(ds, batch_size=16, num_threads=2)
              for x in b["label"]]
    queue.put((local_digest(ds), labels))


def test_a_forked_child_reads_a_url_dataset(local_ds, nginx, tmp_path):
    """A DataLoader-style fork of a process holding a remote dataset before its shards are
    local: the child's loader and reads fetch what they need themselves."""
    import multiprocessing as mp

    _, local = local_ds
    ds = stoker.Dataset(f"{nginx.url}/ds", cache_dir=tmp_path / "cache")
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_read_all_in_child, args=(ds, queue))
    child.start()
    digest, labels = queue.get(timeout=60)
    child.join(30)
    assert child.exitcode == 0 and digest == local_digest(local)
    assert labels == list(range(len(local)))


def test_s3_epoch_equals_local(local_ds, s3_env, tmp_path):
    _, local = local_ds
    ds = stoker.Dataset("s3://bucket/datasets/ds", cache_dir=tmp_path / "cache")
    same_records(ds, local)
    same_epochs(ds, local)
    assert ds.remote.stats()["downloads"] == len(local.shards)
    # explicit endpoint instead of the environment's
    ds2 = stoker.Dataset("s3://bucket/datasets/ds/", cache_dir=tmp_path / "c2",
                         storage_options={"endpoint_url": s3_env.endpoint})
    same_records(ds2, local)


def test_s3_missing_object_is_named(local_ds, s3_env, tmp_path):
    with pytest.raises(RemoteError, match=r"s3://bucket/nope/index.json: S3 NoSuchKey"):
        stoker.Dataset("s3://bucket/nope", cache_dir=tmp_path / "cache")


# -- sharing, killing, limits --------------------------------------------------------------

READER = textwrap.dedent("""
    import hashlib, json, sys
    import stoker
    import os, time
    url, cache, rate = sys.argv[1], sys.argv[2], sys.argv[3]
    opts = {"headers": {"X-Test-Rate": rate}} if rate != "0" else None
    if len(sys.argv) > 4:  # start together with the other reader
        print("ready", flush=True)
        while not os.path.exists(sys.argv[4]):
            time.sleep(0.005)
    ds = stoker.Dataset(url, cache_dir=cache, storage_options=opts)
    h = hashlib.sha256()
    for i in range(len(ds)):
        for k, v in ds[i].items():
            h.update(v if isinstance(v, bytes) else v.tobytes())
    print(json.dumps({"digest": h.hexdigest(), **ds.remote.stats()}))
""")


def local_digest(ds):
    h = hashlib.sha256()
    for i in range(len(ds)):
        for v in ds[i].values():
            h.update(v if isinstance(v, bytes) else v.tobytes())
    return h.hexdigest()


@pytest.mark.slow
def test_two_processes_share_one_download_per_shard(local_ds, nginx, tmp_path):
    import json

    _, local = local_ds
    cache = str(tmp_path / "cache")
    url = f"{nginx.url}/ds"
    before = nginx.requests("/ds/gen-")
    # slowed (nginx sends a second's worth at once, then 4 KB/s: ~3 s a shard) and started
    # together, so that the two processes overlap
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", READER, url, cache, "4000", str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in procs:
        assert p.stdout.readline() == "ready\n"
    go.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    n = len(local.shards)
    assert nginx.requests("/ds/gen-", before + n) - before == n          # one GET per shard
    assert sum(o["downloads"] for o in outs) == n
    assert sum(o["shared_hits"] for o in outs) >= 1
    assert all(o["downloads"] + o["cache_hits"] == n for o in outs)
    assert {o["digest"] for o in outs} == {local_digest(local)}
    assert len(objects(cache)) == n and parts(cache) == []


def test_killed_download_leaves_nothing_read(local_ds, nginx, tmp_path):
    import json

    _, local = local_ds
    cache = str(tmp_path / "cache")
    url = f"{nginx.url}/ds"
    # nginx sends a second's worth at once, then 4 KB/s: ~3 s a shard, 4 at a time
    p = subprocess.Popen([sys.executable, "-c", READER, url, cache, "4000"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ps = parts(cache)
            try:  # the .part may be published (renamed) between the listing and the stat
                started = bool(ps) and os.path.getsize(os.path.join(cache, "tmp", ps[0])) > 0
            except FileNotFoundError:
                started = False
            if len(objects(cache)) >= 1 and started:
                break
            time.sleep(0.02)
        else:
            pytest.fail("the download never got under way")
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    left = parts(cache)
    assert left, "the killed download should have left its .part file"
    done = objects(cache)
    assert 1 <= len(done) < len(local.shards)
    sizes = {s["bytes"] for s in local.shards}
    for name in done:  # whatever reached objects/ is whole
        assert os.path.getsize(os.path.join(cache, "objects", name)) in sizes
    out = subprocess.run([sys.executable, "-c", READER, url, cache, "0"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)
    assert stats["digest"] == local_digest(local)
    assert stats["cache_hits"] == len(done)
    assert stats["downloads"] == len(local.shards) - len(done)
    assert parts(cache) == []  # the killed download's .part was cleaned up


def cache_epoch(cache, local, order, window=2):
    """Reads every record of ``local``'s shards in ``order`` through the cache, fetching
    ``window`` shards ahead, holding one at a time; returns the bytes read."""
    fields = stoker.fields.core_specs(local.fields)
    h = hashlib.sha256()
    peak = 0
    for k, s in enumerate(order):
        cache.prefetch(order[k + 1:k + 1 + window])
        path = cache.path(s)
        entry = local.shards[s]
        one = _core.Dataset(fields, local._hash, [(path, entry["num_records"], entry["bytes"])])
        for r in range(len(one)):
            for p in one.read(r):
                h.update(p)
        del one
        peak = max(peak, objects_bytes(cache.cache_dir))
        cache.release(s)
    return h.hexdigest(), peak


def objects_bytes(cache_dir):
    """Bytes in the cache's objects/ now; a file evicted by the prefetch thread between
    the listing and its stat counts as gone."""
    used = 0
    with os.scandir(os.path.join(cache_dir, "objects")) as listing:
        for e in listing:
            try:
                used += e.stat().st_size
            except FileNotFoundError:
                pass
    return used


def local_order_digest(local, order):
    """The digest cache_epoch gives for ``order``, from the local shard files."""
    fields = stoker.fields.core_specs(local.fields)
    h = hashlib.sha256()
    for s in order:
        entry = local.shards[s]
        one = _core.Dataset(fields, local._hash, [(os.path.join(local.path, entry["path"]),
                                                   entry["num_records"], entry["bytes"])])
        for r in range(len(one)):
            for p in one.read(r):
                h.update(p)
    return h.hexdigest()


def test_cache_smaller_than_dataset_completes_epochs(local_ds, nginx, tmp_path):
    _, local = local_ds
    sizes = [s["bytes"] for s in local.shards]
    limit = 3 * max(sizes) + 10
    assert limit < sum(sizes) / 2
    remote = RemoteDataset(f"{nginx.url}/ds", cache_dir=tmp_path / "cache", cache_limit=limit)
    rng = np.random.default_rng(0)
    for _ in range(2):
        order = [int(i) for i in rng.permutation(len(sizes))]
        got, peak = cache_epoch(remote.cache, local, order)
        assert peak <= limit
        assert got == local_order_digest(local, order)
    st = remote.stats()
    assert st["evictions"] > 0 and st["downloads"] > len(sizes)  # evicted, fetched again
    remote.close()
    assert parts(tmp_path / "cache") == []


# -- a dataset larger than its cache, through the Loader (NOTE [ Bounded cache ]) ----------

def bounded_epochs(remote, local, cache_dir, limit, **kw):
    """Two epochs of ``remote`` equal bit for bit to ``local``'s with the same settings,
    while the cache on disk stays within ``limit`` (checked after every batch)."""
    loader = stoker.Loader(remote, batch_size=8, seed=5, num_threads=2, **kw)
    ref = stoker.Loader(local, batch_size=8, seed=5, **kw)
    peak = 0
    for e in (0, 1):
        loader.set_epoch(e)
        ref.set_epoch(e)
        got = []
        for b in loader:
            got.append({k: v.clone() for k, v in b.items()})
            peak = max(peak, cache_bytes(cache_dir))
        want = list(ref)
        assert len(got) == len(want) == len(ref)
        for g, w in zip(got, want, strict=True):
            assert g.keys() == w.keys()
            for k in g:
                assert torch.equal(g[k], w[k]), (e, k)
    assert peak <= limit
    return loader


def cache_bytes(cache_dir):
    """What the cache's space accounting counts: its objects and the sizes its downloads
    announce, read under its eviction lock (where objects are evicted and downloads get
    room); a download published between the two listings is counted once, by its key."""
    import fcntl

    fd = os.open(os.path.join(cache_dir, "evict.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        by_key = {}
        for name in parts(cache_dir):  # <key>.<pid>.<n>.<size>.part
            key, size = name.split(".")[0], int(name.rsplit(".", 2)[-2])
            by_key[key] = max(by_key.get(key, 0), size)
        with os.scandir(os.path.join(cache_dir, "objects")) as listing:
            for e in listing:  # <key>.stk
                try:
                    size = e.stat().st_size
                except FileNotFoundError:
                    continue
                key = e.name.split(".")[0]
                by_key[key] = max(by_key.get(key, 0), size)
        return sum(by_key.values())
    finally:
        os.close(fd)


def test_loader_reads_a_dataset_larger_than_its_cache(local_ds, nginx, tmp_path):
    _, local = local_ds
    sizes = [s["bytes"] for s in local.shards]
    limit = 3 * max(sizes) + 10
    assert limit < sum(sizes) / 2
    cache = tmp_path / "cache"
    ds = stoker.Dataset(f"{nginx.url}/ds", cache_dir=cache, cache_limit=limit)
    assert ds.remote.bounded and ds._core.releasable
    # A global shuffle reads every shard in every batch: refused, with the way out.
    with pytest.raises(ValueError, match=r"larger than cache_limit.*shard_window=\d"):
        stoker.Loader(ds, batch_size=8, shuffle=True)
    with pytest.raises(ValueError, match="shard_window=4 may need .* more than cache_limit"):
        stoker.Loader(ds, batch_size=8, shuffle=True, shard_window=4)
    for kw in ({"shuffle": True, "shard_window": 1}, {"shuffle": True, "shard_window": 2},
               {"shuffle": False}):
        loader = bounded_epochs(ds, local, cache, limit, **kw)
        del loader
    st = ds.remote.stats()
    assert st["evictions"] > 0 and st["downloads"] > 2 * len(sizes)  # given back, fetched again
    assert ds.remote._fetcher.released > 0
    # Reads outside a loader hold their shard while they copy it out.
    same_records(ds, local)
    ds.remote.close()
    assert parts(cache) == []


def test_map_on_a_bounded_remote_dataset_is_followed_by_its_fetcher(local_ds, nginx, tmp_path):
    """Loader(ds, map=fn) on a dataset larger than its cache: the samples go through the
    Python stage, and the fetcher follows that loader's order as it follows a plain one
    (shards given back and fetched again), so two epochs read every sample."""
    _, local = local_ds
    sizes = [s["bytes"] for s in local.shards]
    limit = 3 * max(sizes) + 10
    ds = stoker.Dataset(f"{nginx.url}/ds", cache_dir=tmp_path / "cache", cache_limit=limit)
    loader = stoker.Loader(ds, batch_size=8, shuffle=True, shard_window=1, seed=2,
                           num_threads=2, map=lambda sample, rng: {"label": sample["label"]})
    for e in range(2):
        loader.set_epoch(e)
        got = sorted(int(v) for b in loader for v in b["label"])
        assert got == list(range(len(local))), e
    assert ds.remote._fetcher.released > 0 and ds.remote.stats()["evictions"] > 0
    ds.remote.close()
    assert parts(tmp_path / "cache") == []


def test_s3_loader_through_a_small_cache(local_ds, s3_env, tmp_path):
    _, local = local_ds
    sizes = [s["bytes"] for s in local.shards]
    limit = 3 * max(sizes) + 10
    cache = tmp_path / "cache"
    ds = stoker.Dataset("s3://bucket/datasets/ds", cache_dir=cache, cache_limit=limit)
    bounded_epochs(ds, local, cache, limit, shuffle=True, shard_window=1)
    assert ds.remote.stats()["evictions"] > 0


def test_token_dataset_needs_a_cache_that_holds_it(local_ds, nginx, tmp_path):
    _, local = local_ds
    limit = 2 * max(s["bytes"] for s in local.shards)
    ds = stoker.Dataset(f"{nginx.url}/ds", cache_dir=tmp_path / "cache", cache_limit=limit)
    with pytest.raises(ValueError, match="TokenDataset keeps every shard"):
        stoker.TokenDataset(ds, field="tokens")


def test_shards_for_upcoming_samples(local_ds, tmp_path):
    _, local = local_ds
    cache = ShardCache(open_source("http://127.0.0.1:9/ds"), local.shards, str(tmp_path / "c"))
    counts = [s["num_records"] for s in local.shards]
    starts = np.cumsum([0] + counts)
    order = [int(i) for i in np.random.default_rng(3).permutation(N)[:40]]
    want = []
    for i in order:  # by hand: the shard whose range holds i, first need first
        s = next(k for k in range(len(counts)) if starts[k] <= i < starts[k + 1])
        if s not in want:
            want.append(s)
    assert cache.shards_for(order) == want
    assert cache.shards_for([N - 1, 0]) == [len(counts) - 1, 0]
    with pytest.raises(IndexError):
        cache.shards_for([N])
    cache.close()


def test_pinned_shards_are_never_evicted(local_ds, nginx, tmp_path):
    _, local = local_ds
    size = max(s["bytes"] for s in local.shards)
    cache = ShardCache(open_source(f"{nginx.url}/ds"), local.shards, str(tmp_path / "c"),
                       cache_limit=2 * size + 10, timeout=1.0)
    a, b = cache.path(0), cache.path(1)
    # a second process-like cache on the same directory cannot take their room
    other = ShardCache(open_source(f"{nginx.url}/ds"), local.shards, str(tmp_path / "c"),
                       cache_limit=2 * size + 10, timeout=1.0)
    with pytest.raises(RemoteError, match=r"(?s)no room within 1 s in the cache directory .* "
                                          r"held by:\n.*pins [\d.]+ KB .*a budget of at least"):
        other.path(2)
    assert os.path.exists(a) and os.path.exists(b)
    cache.release(0)
    assert other.path(2) and not os.path.exists(a) and os.path.exists(b)
    cache.close()
    other.close()


# -- errors --------------------------------------------------------------------------------

def test_server_errors_after_retries(local_ds, nginx, tmp_path):
    url = f"{nginx.url}/err503/ds"
    before = nginx.requests("/err503/ds/index.json")
    with pytest.raises(RemoteError, match=rf"{url}/index.json: HTTP 503 .*after 3 attempts"):
        RemoteDataset(url, cache_dir=tmp_path / "c", retries=2)
    assert nginx.requests("/err503/ds/index.json", before + 3) - before == 3
    with pytest.raises(RemoteError, match=rf"{nginx.url}/missing/index.json: HTTP 404"):
        stoker.Dataset(f"{nginx.url}/missing", cache_dir=tmp_path / "c")


def test_truncated_bodies_after_retries(local_ds, tmp_path):
    www, local = local_ds
    server = TruncatingServer(str(www), cut="shard-00002", keep=1000)
    try:
        remote = RemoteDataset(f"{server.url}/ds", cache_dir=tmp_path / "c", retries=2,
                               timeout=10)
        remote.cache.backoff = 0.01
        with pytest.raises(RemoteError, match=rf"{server.url}/ds/gen-[0-9a-f]+/shard-00002.stk: "
                                              r"body ended after 1000 of \d+ bytes "
                                              r"\(after 3 attempts\)"):
            remote.cache.path(2)
        assert remote.stats()["retries"] == 2
        remote.close()
    finally:
        server.stop()
    assert not any("shard-00002" in o for o in objects(tmp_path / "c")) and \
        parts(tmp_path / "c") == []


def test_a_shard_that_cannot_be_fetched_fails_the_iterating_thread(local_ds, tmp_path,
                                                                    monkeypatch):
    """The download fails in the fetcher's thread; the loader's next() raises it, naming the
    shard's URL and the reason, after the batches before it; nothing hangs."""
    www, local = local_ds
    monkeypatch.setitem(RemoteDataset.__init__.__kwdefaults__, "retries", 1)
    server = TruncatingServer(str(www), cut="shard-00002", keep=1000)
    try:
        ds = stoker.Dataset(f"{server.url}/ds", cache_dir=tmp_path / "c")
        first_bad = sum(s["num_records"] for s in local.shards[:2])
        loader = stoker.Loader(ds, batch_size=1, num_threads=2)
        it = iter(loader)
        got = []
        with pytest.raises(RemoteError, match=rf"{server.url}/ds/gen-[0-9a-f]+/shard-00002.stk: "
                                              r"body ended after 1000 of \d+ bytes"):
            for b in it:
                got.append(int(b["label"][0]))
        assert got == list(range(first_bad))  # in order, up to the shard that failed
        with pytest.raises(RemoteError, match="shard-00002"):  # ds[i] says the same
            ds[first_bad]
        # on_error="skip" passes over it (each of its samples replaced by the next
        # readable one), trying the shard again on later demands
        bad = local.shards[2]["num_records"]
        for batch_size in (1, 8):
            skipping = stoker.Loader(ds, batch_size=batch_size, num_threads=2, on_error="skip")
            with pytest.warns(RuntimeWarning, match=f"replaced {bad} unreadable sample"):
                labels = [int(x) for b in skipping for x in b["label"]]
            assert len(labels) == len(local) and skipping.stats()["skipped"] == bad
            assert first_bad not in labels and labels[:first_bad] == list(range(first_bad))
    finally:
        server.stop()


def test_open_returns_before_the_shards_and_a_batch_waits_only_for_its_own(local_ds,
                                                                             tmp_path):
    """Dataset(url) needs index.json alone. An unshuffled loader's first batch needs the
    first shard alone: it comes while every other shard is held back by the server; the
    workers waiting for the others say so and stop when told; the epoch then equals the
    local one."""
    www, local = local_ds
    first = local.shards[0]["path"]
    server = GatedServer(str(www), allow=(first,))
    try:
        ds = stoker.Dataset(f"{server.url}/ds", cache_dir=tmp_path / "c")  # shards held back
        assert len(ds) == len(local) and not server.gate.is_set()
        n0 = local.shards[0]["num_records"]
        loader = stoker.Loader(ds, batch_size=n0, num_threads=2, prefetch=2)
        it = iter(loader)
        b = next(it)  # only shard 0 is served so far
        assert b["label"].tolist() == list(range(n0))
        assert not server.gate.is_set()
        deadline = time.monotonic() + 10
        while loader.stats()["network"]["network_wait_seconds"] == 0:  # a worker waits
            assert time.monotonic() < deadline
            time.sleep(0.01)
        it.close()  # workers waiting for held-back shards give up: close returns
        server.open_gate()
        labels = [int(x) for b in loader for x in b["label"]]  # the next epoch, whole
        assert labels == list(range(len(local)))
        got, _ = epoch(ds, 7, 0)
        want, _ = epoch(local, 7, 0)
        for g, w in zip(got, want, strict=True):
            for k in g:
                assert torch.equal(g[k], w[k]), k
    finally:
        server.stop()


def test_first_batches_come_by_range_while_their_shards_download(local_ds, tmp_path):
    """NOTE [ Records by range ]: a cold, shuffled epoch's first batch reads every shard.
    With every whole-shard download held back by the server, its records come by range
    requests instead (the shards' tables, then the records), bit for bit the local batch;
    the shards then arrive and the rest of the epoch reads them."""
    www, local = local_ds
    server = GatedServer(str(www), ranges=True)
    try:
        ds = stoker.Dataset(f"{server.url}/ds", cache_dir=tmp_path / "c")
        loader = stoker.Loader(ds, batch_size=16, shuffle=True, seed=3, num_threads=2,
                               prefetch=1)
        ref = list(stoker.Loader(local, batch_size=16, shuffle=True, seed=3))
        it = iter(loader)
        first = next(it)  # every whole shard is still held back
        assert not server.gate.is_set()
        for k in first:
            assert torch.equal(first[k], ref[0][k]), k
        st = loader.stats()["network"]
        assert st["range_records"] >= 16 and st["range_bytes"] > 0
        assert st["downloads"] == 0  # no shard is local yet
        shards_read = {p.rsplit("/", 1)[-1] for p, _, _ in server.range_requests}
        assert len(shards_read) > 1  # a shuffled batch spans shards
        server.open_gate()
        rest = [next(it)] + list(it)
        assert len(rest) + 1 == len(ref)
        for g, w in zip(rest, ref[1:], strict=True):
            for k in g:
                assert torch.equal(g[k], w[k]), k
        assert ds.remote.stats()["downloads"] == len(local.shards)
        assert ds._core.buffered_records == (0, 0)  # dropped once their shards came
    finally:
        server.stop()


def test_a_server_without_ranges_serves_whole_shards(local_ds, tmp_path):
    """A server that ignores range requests (200, the whole file): the first batch's
    shards are declined and their readers wait for the whole shards; the epoch is still
    exact."""
    www, local = local_ds
    server = GatedServer(str(www), ranges="ignore")  # whole shards held back meanwhile
    try:
        ds = stoker.Dataset(f"{server.url}/ds", cache_dir=tmp_path / "c")
        ds.remote._fetcher.cache.source.ignored_range_limit = 0  # a 200: "no ranges"

        def open_once_declined():
            deadline = time.monotonic() + 30
            while not ds.remote._fetcher._declined and time.monotonic() < deadline:
                time.sleep(0.01)
            server.open_gate()

        opener = threading.Thread(target=open_once_declined)
        opener.start()
        got, _ = epoch(ds, 7, 0)
        opener.join()
        assert server.range_requests
        want, _ = epoch(local, 7, 0)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            for k in g:
                assert torch.equal(g[k], w[k]), k
        assert ds.remote.stats()["downloads"] == len(local.shards)
        st = ds.remote.stats()
        assert ds.remote._fetcher._declined and st["range_records"] == 0
    finally:
        server.stop()


def test_wrong_content_is_never_cached(local_ds, nginx, tmp_path):
    www, local = local_ds
    bad = www / "bad"
    for root, _, names in os.walk(www / "ds"):  # shards are in gen-<id>/ (format v2)
        for name in names:
            src = os.path.join(root, name)
            rel = os.path.relpath(src, www / "ds")
            with open(src, "rb") as f:
                data = f.read()
            if rel == local.shards[1]["path"]:
                data = data[:100] + bytes([data[100] ^ 1]) + data[101:]   # same size
            if rel == local.shards[3]["path"]:
                data = data + b"extra"                                   # longer
            (bad / rel).parent.mkdir(parents=True, exist_ok=True)
            (bad / rel).write_bytes(data)
    remote = RemoteDataset(f"{nginx.url}/bad", cache_dir=tmp_path / "c", retries=1)
    remote.cache.backoff = 0.01
    name = local.shards[1]["path"]
    before = nginx.requests(f"/bad/{name}")
    # A complete body with the wrong checksum is permanent: one request, no retry.
    with pytest.raises(RemoteError, match=r"shard-00001.stk: checksum [0-9a-f]{8} differs "
                                          r"from index.json's [0-9a-f]{8} \(the whole file came"):
        remote.cache.path(1)
    assert nginx.requests(f"/bad/{name}", before + 1) - before == 1
    with pytest.raises(RemoteError, match="shard-00003.stk: body longer than"):
        remote.cache.path(3)
    assert remote.cache.path(0)
    assert len(objects(tmp_path / "c")) == 1 and parts(tmp_path / "c") == []
    remote.close()


def test_checksum32_streaming_matches_whole():
    data = np.random.default_rng(1).integers(0, 256, 3_000_001, dtype=np.uint8).tobytes()
    c = _core.Checksum32()
    for k in range(0, len(data), 65_537):
        c.update(data[k:k + 65_537])
    assert c.digest() == _core.checksum32(data)


def test_local_path_refuses_cache_arguments(local_ds, tmp_path):
    www, _ = local_ds
    with pytest.raises(ValueError, match="apply to remote datasets"):
        stoker.Dataset(www / "ds", cache_dir=tmp_path)


def test_inspect_a_url(local_ds, nginx, tmp_path, monkeypatch, capsys):
    from stoker import cli

    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    assert cli.main(["inspect", f"{nginx.url}/ds", "--verify"]) == 0
    out = capsys.readouterr().out
    assert f"verified {N} records" in out and "0 problem(s)" in out
    assert len(objects(tmp_path / "cache")) == len(local_ds[1].shards)


def test_a_download_published_during_the_eviction_scan_is_left_alone(local_ds, tmp_path,
                                                                     monkeypatch):
    """The scan opens a .part and tries its lock; a download that finishes in between has
    renamed it into objects/ and unlocked it. The scan must count it as gone, not fail
    (this race failed a reader's download with FileNotFoundError) nor delete the object."""
    import fcntl

    from stoker.remote import cache as cache_mod

    _, local = local_ds
    cache = ShardCache(open_source("http://127.0.0.1:9/ds"), local.shards, str(tmp_path / "c"),
                       cache_limit=10 * sum(s["bytes"] for s in local.shards))
    s = cache._shards[0]
    part = tmp_path / "c" / "tmp" / f"{s.key}.1.1.{s.size}.part"
    part.write_bytes(b"x" * 64)
    published = tmp_path / "c" / "objects" / "published.stk"
    real_flock = fcntl.flock

    def flock(fd, op):
        if op & fcntl.LOCK_NB and part.exists():
            os.rename(part, published)  # the writer publishes, then unlocks
        return real_flock(fd, op)

    monkeypatch.setattr(cache_mod.fcntl, "flock", flock)
    assert cache._make_room(s)
    assert published.read_bytes() == b"x" * 64
    assert parts(tmp_path / "c") == []
    cache.close()
