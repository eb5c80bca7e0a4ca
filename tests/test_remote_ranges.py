"""Byte-range reads of remote objects and of single records of remote shards
(stoker.remote.transport's read_range, stoker.remote.ranges), against real servers on
loopback: nginx for HTTP, moto's S3 server for S3, and a raw TCP server that cuts bodies
short."""

import itertools
import json
import os
import shutil
import struct

import numpy as np
import pytest
import stoker
from remote_servers import S3Server, TruncatingServer
from stoker import _core
from stoker.remote import RemoteError, open_source
from stoker.remote.ranges import (
    coalesce,
    fetch_range,
    fetch_ranges,
    fetch_records,
    fetch_shard_table,
    shard_identity,
)
from stoker.remote.transport import PermanentError, TransientError

N = 150
BLOB = 300_000  # bytes of www/blob.bin: several times the default coalescing gap
V1 = os.path.join(os.path.dirname(__file__), "data", "v1_dataset")


@pytest.fixture(scope="module")
def www(tmp_path_factory):
    """www/ds: a dataset of several shards (blobs of varied sizes, labels, variable-length
    tokens); www/v1: the format-version-1 fixture; www/blob.bin: random bytes."""
    www = tmp_path_factory.mktemp("www")
    fields = {"raw": stoker.blob(), "label": stoker.scalar("int64"),
              "tokens": stoker.ndarray("int32", (None,))}
    rng = np.random.default_rng(0)
    with stoker.ShardWriter(www / "ds", fields, shard_size="8KB") as w:
        for i in range(N):
            w.write({"raw": rng.bytes(int(rng.integers(0, 600))), "label": i,
                     "tokens": rng.integers(0, 1000, i % 9, dtype=np.int32)})
    shutil.copytree(V1, www / "v1")
    (www / "blob.bin").write_bytes(np.random.default_rng(1).bytes(BLOB))
    return www


@pytest.fixture(scope="module")
def local(www):
    """(index.json as a dict, the dataset opened locally)."""
    with open(www / "ds" / "index.json") as f:
        index = json.load(f)
    ds = stoker.Dataset(www / "ds")
    assert len(index["shards"]) >= 5
    return index, ds


@pytest.fixture(scope="module")
def served_root(www):
    """What the `nginx` fixture (conftest.py) serves."""
    return www


@pytest.fixture(scope="module")
def s3(www):
    pytest.importorskip("boto3", reason="boto3 is in the test extra")
    pytest.importorskip("moto", reason="moto (with flask for its server) is in the test extra")
    server = S3Server()
    server.upload_dir(str(www), "bucket", "www")
    yield server
    server.stop()


@pytest.fixture(params=["http", "s3"])
def root(request):
    """A Source for the www directory, over HTTP (nginx) or S3 (moto)."""
    if request.param == "http":
        return open_source(request.getfixturevalue("nginx").url)
    s3 = request.getfixturevalue("s3")
    return open_source("s3://bucket/www", storage_options={
        "endpoint_url": s3.endpoint, "region_name": "us-east-1",
        "aws_access_key_id": "testing", "aws_secret_access_key": "testing"})


_STEPS = itertools.count()


def tagged(name):
    """(``name`` with a query of its own, the tag): nginx serves the file whatever the
    query and logs it, so one step's requests are counted apart from every other's (and
    a log line that lags its answer cannot be counted in the wrong step)."""
    tag = f"?step{next(_STEPS)}_"
    return name + tag, tag


def blob(www):
    return (www / "blob.bin").read_bytes()


def local_table(path):
    """(offset, length, checksum) of every record, read from the file with struct: a
    parser independent of the C++ one."""
    with open(path, "rb") as f:
        data = f.read()
    table_offset, n = struct.unpack_from("<QQ", data, len(data) - 32)
    return [struct.unpack_from("<QII", data, table_offset + 16 * i) for i in range(n)]


def locate(index, i):
    """(shard, record) of sample i, from index.json's counts."""
    for s, entry in enumerate(index["shards"]):
        if i < entry["num_records"]:
            return s, i
        i -= entry["num_records"]
    raise IndexError(i)


def split(record, names):
    """A record's field payloads: a u32 length per field, then the payloads."""
    k = len(names)
    lengths = struct.unpack_from(f"<{k}I", record)
    out, at = {}, 4 * k
    for name, n in zip(names, lengths, strict=True):
        out[name] = record[at:at + n]
        at += n
    assert at == len(record)
    return out


def table_args(index, s):
    entry = index["shards"][s]
    return entry["path"], entry, int(index["schema_hash"], 16), shard_identity(index, s)


# -- read_range: exact bytes, clear errors ----------------------------------------------

def test_read_range_gives_exact_bytes(www, root):
    data = blob(www)
    rng = np.random.default_rng(2)
    cases = [(0, 1), (0, 100), (BLOB // 2, 1), (BLOB // 2 - 50, 100), (BLOB - 1, 1),
             (BLOB - 100, 100), (0, BLOB), (1, BLOB - 1), (123, 0)]
    for _ in range(30):
        start = int(rng.integers(0, BLOB))
        cases.append((start, int(rng.integers(1, BLOB - start + 1))))
    for start, length in cases:
        got = root.read_range("blob.bin", start, length)
        assert isinstance(got, bytes) and got == data[start:start + length], (start, length)


def test_read_range_past_the_end_is_a_clear_error(root):
    for start, length, why in [(BLOB, 1, "past the end"), (BLOB - 10, 20, "past the end"),
                               (10 ** 12, 5, "past the end")]:
        with pytest.raises(PermanentError, match=why):
            root.read_range("blob.bin", start, length)
    with pytest.raises(PermanentError, match="404|NoSuchKey"):
        root.read_range("missing.bin", 0, 10)
    for start, length in [(-1, 5), (0, -1), (1.5, 2)]:
        with pytest.raises(ValueError, match="range"):
            root.read_range("blob.bin", start, length)


def test_fetch_range_names_url_and_range(nginx):
    # A permanent error: one request, and the message says what and where.
    name, tag = tagged("blob.bin")
    source = open_source(nginx.url)
    with pytest.raises(RemoteError) as e:
        fetch_range(source, name, BLOB - 10, 20, backoff=0.001)
    msg = str(e.value)
    assert msg.startswith(f"{nginx.url}/{name} (bytes {BLOB - 10}-{BLOB + 9}): ")
    assert f"reach past the end of the object ({BLOB} bytes)" in msg and "attempts" not in msg
    assert nginx.requests(tag, 1) == 1


def test_server_that_ignores_ranges(www, nginx):
    data = blob(www)
    source = open_source(f"{nginx.url}/norange")
    # A small object is read whole and sliced ...
    source.ignored_range_limit = BLOB
    assert source.read_range("blob.bin", 1000, 17) == data[1000:1017]
    assert source.read_range("blob.bin", BLOB - 3, 3) == data[-3:]
    with pytest.raises(PermanentError, match="past the end"):
        source.read_range("blob.bin", BLOB - 3, 4)
    # ... a larger one is not downloaded to keep a few bytes of it.
    source.ignored_range_limit = BLOB - 1
    with pytest.raises(PermanentError, match="does not support range requests"):
        source.read_range("blob.bin", 1000, 17)
    with pytest.raises(RemoteError, match=r"/norange/blob.bin \(bytes 0-9\): the server does "
                                          "not support range requests"):
        fetch_range(source, "blob.bin", 0, 10, backoff=0.001)
    # The default limit reads a shard-sized object whole.
    assert open_source(f"{nginx.url}/norange").read_range("blob.bin", 5, 5) == data[5:10]


@pytest.mark.parametrize("ranges", [False, True], ids=["ignored", "honoured"])
def test_short_bodies_are_retried_then_named(www, ranges):
    server = TruncatingServer(str(www), cut="blob", keep=1000, ranges=ranges)
    try:
        source = open_source(server.url)
        with pytest.raises(TransientError, match="body ended after"):
            source.read_range("blob.bin", 500, 2000)
        server.requests = 0
        with pytest.raises(RemoteError) as e:
            fetch_range(source, "blob.bin", 500, 2000, retries=2, backoff=0.001)
        assert server.requests == 3
        assert str(e.value).startswith(f"{server.url}/blob.bin (bytes 500-2499): body ended "
                                       "after ")
        assert str(e.value).endswith("(after 3 attempts)")
        if ranges:  # a range within what the server does send arrives whole
            assert fetch_range(source, "blob.bin", 100, 200) == blob(www)[100:300]
        else:  # the whole object, sliced, would be: it is cut short
            with pytest.raises(RemoteError, match="body ended after 1000 of 300000 bytes"):
                fetch_range(source, "blob.bin", 100, 200, retries=0)
    finally:
        server.stop()


def test_server_errors_are_retried(nginx):
    source = open_source(f"{nginx.url}/err503")
    with pytest.raises(TransientError, match="503"):
        source.read_range("x.bin", 0, 10)
    name, tag = tagged("x.bin")
    with pytest.raises(RemoteError, match=r"/err503/x.bin\?step\d+_ \(bytes 0-9\): HTTP 503 "
                                          r".*\(after 3 attempts\)"):
        fetch_range(source, name, 0, 10, retries=2, backoff=0.001)
    assert nginx.requests(tag, 3) == 3


def test_fsspec_read_range(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    data = np.random.default_rng(3).bytes(5000)
    fs = fsspec.filesystem("memory")
    fs.pipe("/stoker-ranges/blob.bin", data)
    try:
        source = open_source("memory://stoker-ranges")
        for start, length in [(0, 1), (17, 1000), (4999, 1), (0, 5000)]:
            assert source.read_range("blob.bin", start, length) == data[start:start + length]
        with pytest.raises(PermanentError, match="past the end"):
            source.read_range("blob.bin", 4990, 11)
        with pytest.raises(PermanentError, match="not found"):
            source.read_range("missing.bin", 0, 1)
        assert fetch_ranges(source, "blob.bin", [(3, 4), (0, 2), (4000, 10)]) == \
            [data[3:7], data[:2], data[4000:4010]]
    finally:
        fs.rm("/stoker-ranges", recursive=True)


# -- many ranges: coalesced, parallel, deterministic --------------------------------------

def test_coalesce_is_a_pure_plan():
    assert coalesce([]) == []
    assert coalesce([(0, 10), (10, 5), (5, 1)], max_gap=0) == [(0, 15)]
    assert coalesce([(0, 10), (11, 5)], max_gap=0) == [(0, 10), (11, 5)]
    assert coalesce([(0, 10), (11, 5)], max_gap=1) == [(0, 16)]
    assert coalesce([(100, 0), (50, 10)]) == [(50, 10)]  # empty ranges need no request
    assert coalesce([(0, 10), (0, 10), (2, 3)]) == [(0, 10)]
    # A request stays within max_request; a single larger range stays whole.
    assert coalesce([(0, 10), (10, 10), (20, 10)], max_request=20) == [(0, 20), (20, 10)]
    assert coalesce([(0, 10), (10, 50), (60, 10)], max_request=20) == [(0, 10), (10, 50),
                                                                        (60, 10)]
    # Order of the input does not matter.
    rng = np.random.default_rng(4)
    ranges = [(int(s), int(n)) for s, n in zip(rng.integers(0, 10 ** 6, 200),
                                              rng.integers(0, 5000, 200))]
    plan = coalesce(ranges, max_gap=1000)
    assert coalesce(list(reversed(ranges)), max_gap=1000) == plan
    for (a, n), (b, _) in zip(plan, plan[1:]):
        assert b > a + n + 1000
    with pytest.raises(ValueError):
        coalesce([(0, 1)], max_gap=-1)


def test_adjacent_ranges_are_one_request(www, nginx):
    data = blob(www)
    source = open_source(nginx.url)

    def requests_for(ranges, **kw):
        name, tag = tagged("blob.bin")
        got = fetch_ranges(source, name, ranges, **kw)
        assert got == [data[s:s + n] for s, n in ranges]
        n = len(coalesce(ranges, **{k: v for k, v in kw.items() if k != "max_parallel"}))
        assert nginx.requests(tag, n) == n
        return n

    adjacent = [(1000 + 100 * k, 100) for k in range(20)]
    assert requests_for(adjacent) == 1
    assert requests_for(adjacent[::-1], max_parallel=1) == 1
    # Nearby (under max_gap apart): one request; far apart: one each, in parallel.
    assert requests_for([(0, 10), (4000, 10), (8000, 10)], max_gap=4096) == 1
    far = [(k * 20_000, 10) for k in range(10)]
    assert requests_for(far, max_gap=4096) == 10
    assert requests_for(far, max_gap=4096, max_parallel=1) == 10


def test_results_do_not_depend_on_parallelism(www, root):
    data = blob(www)
    rng = np.random.default_rng(5)
    ranges = []
    for _ in range(300):  # overlaps, repeats, empty ranges, any order
        start = int(rng.integers(0, BLOB))
        ranges.append((start, int(rng.integers(0, min(3000, BLOB - start) + 1))))
    ranges += ranges[:10] + [(0, BLOB)]
    want = [data[s:s + n] for s, n in ranges]
    for max_parallel in (1, 8):
        for max_gap in (0, 4096, 1 << 20):
            got = fetch_ranges(root, "blob.bin", ranges, max_parallel=max_parallel,
                               max_gap=max_gap, max_request=64 << 10)
            assert got == want, (max_parallel, max_gap)


def test_the_first_failing_request_is_reported(nginx):
    source = open_source(nginx.url)
    ranges = [(BLOB + 500, 10), (10, 10), (BLOB - 5, 10), (BLOB + 100, 1)]
    for max_parallel in (1, 8):
        with pytest.raises(RemoteError, match=rf"\(bytes {BLOB - 5}-{BLOB + 4}\): bytes "
                                              "[0-9-]+ reach past the end"):
            fetch_ranges(source, "blob.bin", ranges, max_gap=0, max_parallel=max_parallel,
                         backoff=0.001)


# -- shard tables and records by range ----------------------------------------------------

def test_shard_table_by_range_equals_local(www, local, root):
    index, _ = local
    for s, entry in enumerate(index["shards"]):
        name, entry, schema_hash, identity = table_args(index, s)
        table = fetch_shard_table(root, f"ds/{name}", entry, schema_hash, identity)
        assert table.path == root.object_url(f"ds/{name}")
        assert table.num_records == entry["num_records"] and table.file_size == entry["bytes"]
        assert table.version == 2 and table.num_fields == 3
        want = local_table(www / "ds" / name)
        assert [table.entry(i) for i in range(table.num_records)] == want
        assert table.table_offset == want[-1][0] + want[-1][1]
    with pytest.raises(ValueError, match="out of range"):
        table.entry(table.num_records)


def test_version_1_shard_table_by_range(www, nginx):
    with open(www / "v1" / "index.json") as f:
        index = json.load(f)
    source = open_source(f"{nginx.url}/v1")
    for s, entry in enumerate(index["shards"]):
        assert shard_identity(index, s) is None
        table = fetch_shard_table(source, entry["path"], entry, int(index["schema_hash"], 16))
        assert table.version == 1
        assert [table.entry(i) for i in range(table.num_records)] == \
            local_table(www / "v1" / entry["path"])


def test_shard_table_takes_two_requests_or_one(www, local, nginx):
    index, _ = local
    source = open_source(f"{nginx.url}/ds")
    name, entry, schema_hash, identity = table_args(index, 1)
    assert entry["bytes"] > 64 + _core.shard_tail_bytes(entry["num_records"]) + 1000
    for max_gap, n in [(0, 2), (1000, 2), (entry["bytes"], 1)]:
        step, tag = tagged(name)
        table = fetch_shard_table(source, step, entry, schema_hash, identity, max_gap=max_gap)
        assert table.num_records == entry["num_records"]
        assert nginx.requests(tag, n) == n


def test_records_by_range_equal_local(local, root):
    index, ds = local
    names = [f["name"] for f in index["schema"]]
    rng = np.random.default_rng(6)
    sample = [int(i) for i in rng.choice(N, 40, replace=False)] + [0, N - 1]
    by_shard = {}
    for i in sample:
        s, r = locate(index, i)
        by_shard.setdefault(s, []).append((i, r))
    assert len(by_shard) >= 4
    for s, items in sorted(by_shard.items()):
        name, entry, schema_hash, identity = table_args(index, s)
        table = fetch_shard_table(root, f"ds/{name}", entry, schema_hash, identity)
        records = [r for _, r in items]
        for kw in ({"max_parallel": 1}, {"max_parallel": 8, "max_gap": 0}):
            got = fetch_records(root, f"ds/{name}", table, records, **kw)
            assert len(got) == len(items)
            for (i, _), rec in zip(items, got, strict=True):
                fields, want = split(rec, names), ds[i]
                assert fields["raw"] == want["raw"]
                assert struct.unpack("<q", fields["label"])[0] == want["label"] == i
                np.testing.assert_array_equal(np.frombuffer(fields["tokens"], np.int32),
                                              want["tokens"])


@pytest.fixture
def corrupt(www, local, nginx, tmp_path):
    """www/bad-<n>: a copy of the dataset to damage; yields (source, index, path of a
    shard's file)."""
    index, _ = local
    name = f"bad-{len(os.listdir(www))}"
    shutil.copytree(www / "ds", www / name)
    yield open_source(f"{nginx.url}/{name}"), index, lambda s: www / name / index["shards"][s][
        "path"]
    shutil.rmtree(www / name)


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def test_a_corrupt_record_on_the_server_is_refused_by_name(corrupt):
    source, index, path = corrupt
    s = 2
    name, entry, schema_hash, identity = table_args(index, s)
    table = fetch_shard_table(source, name, entry, schema_hash, identity)
    k = table.num_records // 2
    offset, length, _ = table.entry(k)
    flip(path(s), offset + length - 1)
    url = source.object_url(name)
    with pytest.raises(stoker.DataError, match=f"{url}: record {k}: checksum mismatch"):
        fetch_records(source, name, table, [k - 1, k, k + 1])
    with pytest.raises(stoker.DataError, match=f"record {k}: checksum mismatch"):
        fetch_records(source, name, table, [k], max_parallel=1)
    # its neighbours, fetched in the same request or alone, are fine
    assert len(fetch_records(source, name, table, [k - 1, k + 1], max_gap=1 << 20)) == 2
    # bytes that are not the record: refused by length or checksum
    with pytest.raises(stoker.DataError, match="the record table gives"):
        table.verify(k - 1, b"\0" * (length + 1))


def test_a_corrupt_or_foreign_table_on_the_server_is_refused(corrupt):
    source, index, path = corrupt
    name, entry, schema_hash, identity = table_args(index, 1)
    url = source.object_url(name)
    # the record table itself
    flip(path(1), entry["bytes"] - 32 - 5)
    with pytest.raises(stoker.DataError, match=f"{url}: record table checksum"):
        fetch_shard_table(source, name, entry, schema_hash, identity)
    # another shard of the same write in its place
    shutil.copyfile(path(3), path(1))
    entry3 = index["shards"][3]
    with pytest.raises(stoker.DataError, match=f"{url}: is shard 3 of its dataset"):
        fetch_shard_table(source, name, dict(entry, bytes=entry3["bytes"]), schema_hash,
                          identity)
    # the index's expectations: schema, identity, record count, size
    name, entry, schema_hash, identity = table_args(index, 0)
    good = fetch_shard_table(source, name, entry, schema_hash, identity)
    assert good.num_records == entry["num_records"]
    with pytest.raises(stoker.DataError, match="schema hash does not match"):
        fetch_shard_table(source, name, entry, schema_hash ^ 1, identity)
    with pytest.raises(stoker.DataError, match="belongs to another dataset"):
        fetch_shard_table(source, name, entry, schema_hash, ("0" * 32,) + identity[1:])
    with pytest.raises(stoker.DataError, match="records but index.json says"):
        fetch_shard_table(source, name, dict(entry, num_records=entry["num_records"] + 1),
                          schema_hash, identity)
    with pytest.raises(stoker.DataError, match="bad footer magic"):
        fetch_shard_table(source, name, dict(entry, bytes=entry["bytes"] - 1), schema_hash,
                          identity)
    with pytest.raises(RemoteError, match="past the end"):
        fetch_shard_table(source, name, dict(entry, bytes=entry["bytes"] + 1), schema_hash,
                          identity, max_gap=0)
