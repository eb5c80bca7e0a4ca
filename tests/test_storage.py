"""Datasets that never mix, never vanish and never kill a reader: shard identity (format
version 2), version-1 compatibility, generations and reader leases, the writer lock, shards
changed under a reader, nothing discarded silently. Kills and rewrite races are in
test_reliability.py."""

import gc
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import stoker
from conftest import write_dataset
from stoker import _core
from stoker.writer import WriterLockError

V1_FIXTURE = Path(__file__).parent / "data" / "v1_dataset"
FIELDS = {"x": stoker.ndarray("uint8", (3, 4, 4)), "label": stoker.scalar("int64")}


def tagged(tag):
    """Sample i of dataset `tag`: every record the same size whatever the tag."""
    return lambda i: {"x": np.full((3, 4, 4), (tag + i) % 256, np.uint8), "label": tag * 10**6 + i}


def shard_file(ds, i):
    return os.path.join(ds.path, ds.shards[i]["path"])


def labels(ds):
    return [int(ds[i]["label"]) for i in range(len(ds))]


def edit_index(path, fn):
    index_path = Path(path) / "index.json"
    index = json.loads(index_path.read_text())
    fn(index)
    index_path.write_text(json.dumps(index))


class CliResult:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run_cli(capsys):
    """`stoker ARGS...` in this process (the command line's own tests run it as a
    subprocess): exit status, stdout, stderr."""
    from stoker.cli import main

    def run(*args):
        capsys.readouterr()
        try:
            rc = main(list(args))
        except SystemExit as e:  # argparse's usage errors
            rc = e.code
        out, err = capsys.readouterr()
        return CliResult(rc, out, err)

    return run


def run_script(script, *args, timeout=120, **kw):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, **kw)


# -- identity -------------------------------------------------------------------------------

def test_foreign_shard_with_the_same_schema_size_and_count_is_refused(tmp_path):
    a = write_dataset(tmp_path / "a", 40, shard_size="600B", make=tagged(1))
    b = write_dataset(tmp_path / "b", 40, shard_size="600B", make=tagged(2))
    assert a.shards[1]["bytes"] == b.shards[1]["bytes"]  # only the identity tells them apart
    shutil.copyfile(shard_file(b, 1), shard_file(a, 1))
    with pytest.raises(stoker.DataError, match=r"shard-00001\.stk: belongs to another dataset "
                                               r"or another write .*" + b.dataset_id):
        stoker.Dataset(tmp_path / "a")


def test_swapped_shards_are_refused(tmp_path):
    ds = write_dataset(tmp_path / "d", 40, shard_size="600B")
    p0, p1 = shard_file(ds, 0), shard_file(ds, 1)
    assert os.path.getsize(p0) == os.path.getsize(p1)
    os.rename(p0, p0 + ".x")
    os.rename(p1, p0)
    os.rename(p0 + ".x", p1)
    with pytest.raises(stoker.DataError, match=r"shard-00000\.stk: is shard 1 of its dataset but "
                                               r"index.json lists it as shard 0 \(shards "
                                               r"swapped or reordered\)"):
        stoker.Dataset(tmp_path / "d")


def test_stale_shard_of_an_earlier_write_is_refused(tmp_path):
    old = write_dataset(tmp_path / "d", 40, shard_size="600B")
    stale = Path(shard_file(old, 1)).read_bytes()
    del old
    new = write_dataset(tmp_path / "d", 40, shard_size="600B", overwrite=True)  # same samples
    Path(shard_file(new, 1)).write_bytes(stale)
    with pytest.raises(stoker.DataError, match=r"shard-00001\.stk: belongs to another dataset or "
                                               r"another write of this one"):
        stoker.Dataset(tmp_path / "d")


@pytest.mark.parametrize("edit, message", [
    (lambda ix: ix["shards"].reverse(), "shards swapped or reordered"),
    (lambda ix: ix["shards"].__setitem__(1, dict(ix["shards"][0])),
     "shard entries 0 and 1 are the same file"),
    (lambda ix: ix["shards"][1].pop("checksum"), "shard entry 1 is malformed"),
    (lambda ix: ix["shards"][1].pop("header_checksum"), "shard entry 1 is malformed"),
    (lambda ix: ix["shards"][1].pop("table_checksum"), "shard entry 1 is malformed"),
    (lambda ix: ix["shards"][1].update(table_checksum=ix["shards"][1]["table_checksum"] ^ 1),
     r"shard-00001.stk: record table checksum \d+ differs from index.json's"),
    (lambda ix: ix["shards"][1].update(header_checksum=ix["shards"][1]["header_checksum"] ^ 1),
     r"shard-00001.stk: header checksum \d+ differs from index.json's"),
    (lambda ix: ix.update(dataset_id="0" * 32), "dataset_id's"),  # paths no longer match
    (lambda ix: ix.pop("dataset_id"), "dataset_id None is not 32 lowercase hex digits"),
    (lambda ix: ix["shards"][0].update(path=ix["shards"][0]["path"].replace("gen-", "old-")),
     "is not a shard of generation"),
])
def test_index_entries_must_be_unique_in_order_and_fully_checksummed(tmp_path, edit, message):
    write_dataset(tmp_path / "d", 40, shard_size="600B")
    edit_index(tmp_path / "d", lambda ix: (edit(ix), ix.update(
        num_records=sum(s["num_records"] for s in ix["shards"]))))
    with pytest.raises(stoker.DataError, match=message):
        stoker.Dataset(tmp_path / "d")


SPECIAL_FILES_SCRIPT = """
    import os, sys, stoker
    root, shard = sys.argv[1], sys.argv[2]
    index = os.path.join(root, "index.json")
    makers = {"fifo": os.mkfifo, "dir": os.mkdir, "dev": lambda p: os.symlink("/dev/zero", p)}
    for name, make in makers.items():
        for target in (shard, index):
            os.rename(target, target + ".real")
            make(target)
            try:
                stoker.Dataset(root)
                print(name, "OPENED")
            except stoker.DataError as e:
                print(name, e)
            (os.rmdir if name == "dir" else os.remove)(target)
            os.rename(target + ".real", target)
"""


def test_shards_and_index_must_be_regular_files_and_nothing_blocks(tmp_path):
    """A FIFO, a device or a directory where a shard or index.json should be: a clear error
    at once (a FIFO opened for reading would wait for a writer forever, /dev/zero would be
    read until memory runs out). In a subprocess, so that a regression shows as a timeout
    instead of a hung test run."""
    ds = write_dataset(tmp_path / "d", 20)
    r = run_script(SPECIAL_FILES_SCRIPT, tmp_path / "d", shard_file(ds, 0), timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 6 and not any("OPENED" in line for line in lines), r.stdout
    for k, (name, kind) in enumerate([("fifo", "a FIFO"), ("dir", "a directory"),
                                      ("dev", "a character device")]):
        shard_line, index_line = lines[2 * k], lines[2 * k + 1]
        assert shard_line.startswith(name) and index_line.startswith(name)
        assert f"shard-00000.stk: is {kind}, not a shard file" in shard_line, shard_line
        assert f"index.json: is {kind}, not an index file" in index_line, index_line


def test_index_json_has_a_size_cap(tmp_path):
    write_dataset(tmp_path / "d", 5)
    with open(tmp_path / "d" / "index.json", "r+b") as f:
        f.truncate(300 * 2**20)  # sparse: costs no disk
    with pytest.raises(stoker.DataError, match=r"index.json: \d+ bytes is over the 256 MiB limit"):
        stoker.Dataset(tmp_path / "d")


# -- opening in O(1) per shard, mapping on first use ----------------------------------------

def settled_mappings() -> int:
    """Mappings of this process once those of earlier tests' objects are gone (a loader's
    workers drop theirs when they end, a moment after the loader)."""
    n = -1
    for _ in range(100):
        gc.collect()
        now = _core.live_mappings()
        if now == n:
            return n
        n = now
        time.sleep(0.05)
    return n


def test_opening_maps_nothing_and_reading_maps_only_what_it_reads(tmp_path):
    write_dataset(tmp_path / "d", 200, shard_size="1KB")
    before = settled_mappings()
    ds = stoker.Dataset(tmp_path / "d")
    assert len(ds.shards) > 5
    assert ds.open_shards == [] and _core.live_mappings() == before
    assert ds[0]["label"] == 0
    assert ds.open_shards == [0]
    ds.open_shard(3)
    assert ds.open_shards == [0, 3] and _core.live_mappings() == before + 2
    with pytest.raises(IndexError):
        ds.open_shard(len(ds.shards))
    del ds
    assert settled_mappings() == before


def test_opening_reads_headers_and_footers_only(tmp_path):
    """Damage in a record table or a record is not read at open (O(1) per shard): it shows
    when the shard is first used, naming the file, and the other shards work meanwhile."""
    ds = write_dataset(tmp_path / "d", 200, shard_size="1KB")
    size = ds.shards[2]["bytes"]
    path = shard_file(ds, 2)
    with open(path, "r+b") as f:  # a byte of the record table (just before the 32-byte footer)
        f.seek(size - 32 - 5)
        b = f.read(1)
        f.seek(size - 32 - 5)
        f.write(bytes([b[0] ^ 1]))
    ds = stoker.Dataset(tmp_path / "d")
    first_of_2 = sum(s["num_records"] for s in ds.shards[:2])
    assert ds[0]["label"] == 0 and ds[first_of_2 - 1]["label"] == first_of_2 - 1
    with pytest.raises(stoker.DataError, match=r"shard-00002\.stk: record table checksum "
                                               r"mismatch"):
        ds[first_of_2]
    with pytest.raises(stoker.DataError, match=r"shard-00002\.stk"):
        ds.open_shard(2)


def test_check_shards_false_defers_every_check_to_first_use(tmp_path):
    ds = write_dataset(tmp_path / "d", 100, shard_size="1KB")
    os.remove(shard_file(ds, 1))
    with pytest.raises(stoker.DataError, match=r"shard-00001\.stk: cannot open shard"):
        stoker.Dataset(tmp_path / "d")
    lazy = stoker.Dataset(tmp_path / "d", check_shards=False)
    assert lazy[0]["label"] == 0
    with pytest.raises(stoker.DataError, match=r"shard-00001\.stk: cannot open shard"):
        lazy[ds.shards[0]["num_records"]]
    with pytest.raises(stoker.DataError, match=r"shard-00001\.stk: cannot open shard"):
        list(stoker.Loader(lazy, batch_size=16, num_threads=2))


MAP_LIMIT_SCRIPT = """
    import ctypes, mmap, os, sys, stoker
    ds = stoker.Dataset(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    page = mmap.PAGESIZE
    # Fill the process's mappings up to vm.max_map_count: one page each, alternating
    # protections so that neighbours never merge into one mapping.
    held = []
    while True:
        p = libc.mmap(None, page, mmap.PROT_READ if len(held) % 2 else 0,  # 0: PROT_NONE
                      mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if p in (None, ctypes.c_void_p(-1).value):
            break
        held.append(p)
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    for p in held[-8:]:  # room for the interpreter itself, not for every shard
        libc.munmap(p, page)
    seen = 0
    try:
        for s in range(len(ds.shards)):
            ds.open_shard(s)
            seen += 1
        print("ALL OPENED", seen)
    except stoker.DataError as e:
        print("ERROR", e)
"""


def test_running_out_of_mappings_names_vm_max_map_count(tmp_path):
    write_dataset(tmp_path / "d", 400, shard_size="200B")
    r = run_script(MAP_LIMIT_SCRIPT, tmp_path / "d", timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ERROR "), r.stdout
    assert "shard-" in r.stdout and "out of memory mappings" in r.stdout
    assert "vm.max_map_count" in r.stdout and "shard_size" in r.stdout


# -- version 1 ------------------------------------------------------------------------------

def v1_copy(tmp_path):
    dst = tmp_path / "v1"
    shutil.copytree(V1_FIXTURE, dst, ignore=shutil.ignore_patterns("README*"))
    return dst


def check_fixture_samples(ds):
    assert len(ds) == 30
    for i in (0, 7, 11, 29):
        s = ds[i]
        assert s["label"] == i and (s["x"] == i).all()
        np.testing.assert_array_equal(s["tokens"], np.arange(i % 5, dtype=np.int32))
        assert s["raw"] == bytes([i]) * (i % 3)


def test_version_1_dataset_opens_with_a_warning(tmp_path):
    path = v1_copy(tmp_path)
    with pytest.warns(UserWarning, match=r"version 1, whose shards carry no dataset identity.*"
                                         r"stoker inspect --upgrade"):
        ds = stoker.Dataset(path)
    assert ds.version == 1 and ds.dataset_id is None and ds.generation is None
    check_fixture_samples(ds)
    assert [b["label"].tolist() for b in stoker.Loader(ds, batch_size=16)] == \
        [list(range(16)), list(range(16, 30))]
    assert ds.verify()["ok"]


def test_version_1_index_must_list_shards_in_order(tmp_path):
    path = v1_copy(tmp_path)
    edit_index(path, lambda ix: ix["shards"].reverse())
    with pytest.raises(stoker.DataError, match=r"shard entry 0: 'shard-00002.stk' is out of "
                                               r"order"):
        stoker.Dataset(path)


def test_inspect_upgrade_rewrites_version_1_in_place(tmp_path, run_cli):
    path = v1_copy(tmp_path)
    r = run_cli("inspect", str(path), "--upgrade")
    assert r.returncode == 0, r.stderr
    assert "upgraded to shard format version 2" in r.stderr
    assert re.search(r"^  format version +2$", r.stdout, re.M), r.stdout
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no identity" warning any more
        ds = stoker.Dataset(path)
    assert ds.version == 2 and ds.dataset_id is not None
    check_fixture_samples(ds)
    assert [s["num_records"] for s in ds.shards] == [11, 11, 8]  # shard boundaries kept
    assert sorted(os.listdir(path)) == sorted([ds.generation, "index.json"])  # v1 files gone
    assert ds.verify()["ok"]
    r = run_cli("inspect", str(path), "--upgrade")
    assert r.returncode == 0 and "already in the current format" in r.stderr


def test_upgrade_refuses_a_corrupt_version_1_shard(tmp_path, run_cli):
    path = v1_copy(tmp_path)
    with open(path / "shard-00001.stk", "r+b") as f:
        f.seek(64 + 20)
        b = f.read(1)
        f.seek(64 + 20)
        f.write(bytes([b[0] ^ 1]))
    r = run_cli("inspect", str(path), "--upgrade")
    assert r.returncode == 1 and "shard-00001.stk: record 0: checksum mismatch" in r.stdout
    # nothing changed: still the version-1 dataset, and nothing left over
    assert sorted(os.listdir(path)) == sorted(os.listdir(V1_FIXTURE)) and \
        json.loads((path / "index.json").read_text())["version"] == 1


# -- generations ----------------------------------------------------------------------------

def test_an_open_dataset_keeps_its_generation_across_rewrites(tmp_path):
    path = tmp_path / "d"
    old = write_dataset(path, 60, shard_size="600B", make=tagged(1))
    assert old.open_shards == []  # nothing mapped yet: the lease alone keeps the files
    for tag, n in ((2, 30), (3, 10)):  # rewrites with fewer shards
        write_dataset(path, n, shard_size="600B", make=tagged(tag), overwrite=True)
    assert labels(old) == [10**6 + i for i in range(60)]
    assert [b["label"].tolist()[0] for b in stoker.Loader(old, batch_size=60)] == [10**6]
    assert labels(stoker.Dataset(path)) == [3 * 10**6 + i for i in range(10)]
    generations = {g for g in os.listdir(path) if g.startswith("gen-")}
    assert old.generation in generations and len(generations) == 2  # tag 2's is gone
    del old
    gc.collect()
    new = write_dataset(path, 5, make=tagged(4), overwrite=True)
    assert sorted(os.listdir(path)) == sorted([new.generation, "index.json"])


def test_a_loader_keeps_the_generation_of_its_dataset(tmp_path):
    path = tmp_path / "d"
    loader = stoker.Loader(stoker.Dataset(write_dataset(path, 80, shard_size="600B",
                                                         make=tagged(1)).path),
                           batch_size=10, num_threads=2)
    write_dataset(path, 20, make=tagged(2), overwrite=True)
    gc.collect()
    got = [x for b in loader for x in b["label"].tolist()]
    assert got == [10**6 + i for i in range(80)]


def test_failed_rewrite_leaves_the_old_dataset_whole(tmp_path):
    path = tmp_path / "d"
    old = write_dataset(path, 30, shard_size="600B", make=tagged(1))
    generation = old.generation
    del old
    with pytest.raises(RuntimeError, match="boom"):
        with stoker.ShardWriter(path, FIELDS, shard_size="600B", overwrite=True) as w:
            for i in range(100):
                w.write(tagged(2)(i))
            raise RuntimeError("boom")
    ds = stoker.Dataset(path)
    assert labels(ds) == [10**6 + i for i in range(30)]
    assert sorted(os.listdir(path)) == sorted([generation, "index.json"])


FULL_DISK_SCRIPT = """
    import resource, signal, sys, numpy as np, stoker
    # Writes past RLIMIT_FSIZE fail with EFBIG (SIGXFSZ ignored), as writes to a full disk
    # fail with ENOSPC: the rewrite fails in the middle of a shard.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
    fields = {"x": stoker.ndarray("uint8", (3, 4, 4)), "label": stoker.scalar("int64")}
    try:
        with stoker.ShardWriter(sys.argv[1], fields, shard_size="1MB", overwrite=True) as w:
            for i in range(5000):
                w.write({"x": np.zeros((3, 4, 4), np.uint8), "label": i})
        print("WROTE")
    except stoker.DataError as e:
        print("ERROR", e)
"""


def test_rewrite_failing_for_lack_of_space_leaves_the_old_dataset(tmp_path):
    path = tmp_path / "d"
    old = write_dataset(path, 30, make=tagged(1))
    generation = old.generation
    del old
    r = run_script(FULL_DISK_SCRIPT, path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ERROR ") and "File too large" in r.stdout, r.stdout
    assert labels(stoker.Dataset(path)) == [10**6 + i for i in range(30)]
    assert sorted(os.listdir(path)) == sorted([generation, "index.json"])


def test_inspect_clean_removes_leftovers_but_not_what_a_reader_uses(tmp_path, run_cli):
    path = tmp_path / "d"
    old = write_dataset(path, 30, shard_size="600B", make=tagged(1))
    new = write_dataset(path, 30, shard_size="600B", make=tagged(2), overwrite=True)
    stale = path / ("gen-" + "ab" * 16)  # as a killed write leaves it
    stale.mkdir()
    (stale / "shard-00000.stk.tmp").write_bytes(b"partial")
    (path / "index.json.tmp").write_text("{")
    r = run_cli("inspect", str(path), "--clean")
    assert r.returncode == 0, r.stderr
    assert f"removed {stale.name}" in r.stderr and "removed index.json.tmp" in r.stderr
    assert f"kept {old.generation}: a reader still uses it" in r.stderr
    assert sorted(os.listdir(path)) == sorted([old.generation, new.generation, "index.json"])
    assert labels(old)[:2] == [10**6, 10**6 + 1]
    del old
    gc.collect()
    r = run_cli("inspect", str(path), "--clean")
    assert r.returncode == 0 and "removed gen-" in r.stderr
    assert sorted(os.listdir(path)) == sorted([new.generation, "index.json"])


def test_unrelated_files_in_the_directory_are_left_alone(tmp_path):
    path = tmp_path / "d"
    path.mkdir()
    (path / "README.txt").write_text("mine")
    (path / "gen-notours").mkdir()
    write_dataset(path, 10)
    ds = write_dataset(path, 10, overwrite=True)
    assert sorted(os.listdir(path)) == sorted(["README.txt", "gen-notours", ds.generation,
                                               "index.json"])


def test_a_generation_removed_by_hand_is_named(tmp_path):
    path = tmp_path / "d"
    generation = write_dataset(path, 10).generation
    shutil.rmtree(path / generation)
    with pytest.raises(stoker.DataError, match=rf"{generation}/shard-00000\.stk: cannot open "
                                               r"shard: No such file"):
        stoker.Dataset(path)


def test_without_file_locks_a_write_warns_and_keeps_the_generation_it_replaced(
        tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    path = tmp_path / "d"
    write_dataset(path, 10, make=tagged(1))
    monkeypatch.setattr(fcntl, "flock", no_locks)
    reader = stoker.Dataset(path)  # no lease to take: opens without one
    with pytest.warns(RuntimeWarning, match="does not support file locks"):
        second = write_dataset(path, 10, make=tagged(2), overwrite=True)
    assert labels(reader)[0] == 10**6  # the generation it replaced is kept
    assert sorted(os.listdir(path)) == sorted([reader.generation, second.generation,
                                               "index.json"])
    with pytest.warns(RuntimeWarning, match="does not support file locks"):
        third = write_dataset(path, 10, make=tagged(3), overwrite=True)
    assert sorted(os.listdir(path)) == sorted([second.generation, third.generation,
                                               "index.json"])


# -- one writer at a time -------------------------------------------------------------------

def test_second_writer_fails_naming_the_first(tmp_path):
    path = tmp_path / "d"
    w = stoker.ShardWriter(path, FIELDS)
    with pytest.raises(WriterLockError, match=re.escape(
            f"{path}: another writer is writing this dataset (held by pid {os.getpid()} on "
            f"host {socket.gethostname()}, ShardWriter started ")):
        stoker.ShardWriter(path, FIELDS, overwrite=True)
    with pytest.raises(BlockingIOError):  # what the error is, for `except` clauses
        stoker.ShardWriter(path, FIELDS, overwrite=True)
    w.write(tagged(1)(0))
    w.close()
    assert sorted(os.listdir(path)) == sorted([stoker.Dataset(path).generation, "index.json"])
    write_dataset(path, 3, overwrite=True)  # free again once the first one closed


WRITER_SCRIPT = """
    import os, sys, time, numpy as np, stoker
    from stoker.writer import WriterLockError
    path, tag, hold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    fields = {"x": stoker.ndarray("uint8", (3, 4, 4)), "label": stoker.scalar("int64")}
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    try:
        with stoker.ShardWriter(path, fields, shard_size="600B", overwrite=True) as w:
            print("writing", os.getpid(), flush=True)
            for i in range(50):
                w.write({"x": np.full((3, 4, 4), tag, np.uint8), "label": tag * 10**6 + i})
            if hold < 0:
                sys.stdin.readline()  # finish when told
            time.sleep(max(hold, 0))
        print("done", os.getpid(), tag)
    except WriterLockError as e:
        print("locked", e)
"""


def start_writer(path, tag, hold):
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER_SCRIPT), str(path),
                          str(tag), str(hold)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_writer_in_another_process_keeps_a_second_out(tmp_path):
    path = tmp_path / "d"
    p = start_writer(path, 1, -1)
    try:
        p.stdin.write("go\n")
        p.stdin.flush()
        line = p.stdout.readline().split()
        assert line[0] == "writing"
        with pytest.raises(WriterLockError, match=rf"held by pid {line[1]} on host "):
            stoker.ShardWriter(path, FIELDS)
    finally:
        out, _ = p.communicate("\n", timeout=60)
    assert out.split()[0] == "done", out
    assert labels(stoker.Dataset(path))[0] == 10**6


def test_two_writer_processes_at_once_one_fails_clearly_the_other_opens(tmp_path):
    """Every rank of a job running the conversion: one writes, the other is refused."""
    path = tmp_path / "d"
    procs = [start_writer(path, tag, -1) for tag in (1, 2)]
    for p in procs:  # both are past their imports: let them race for the lock
        p.stdin.write("go\n")
        p.stdin.flush()
    # the winner holds the lock until told to finish, however late the other one runs
    first = [p.stdout.readline() for p in procs]
    assert sorted(line.split()[0] for line in first) == ["locked", "writing"], first
    outs = [line + p.communicate("finish\n", timeout=120)[0]
            for line, p in zip(first, procs, strict=True)]
    done = [o for o in outs if "done" in o]
    locked = [o for o in outs if "locked" in o]
    assert len(done) == 1 and len(locked) == 1, outs
    winner_pid, tag = done[0].split()[-2:]  # "done <pid> <tag>"
    assert f"{path}: another writer is writing this dataset (held by pid {winner_pid}" in \
        locked[0]
    assert labels(stoker.Dataset(path)) == [int(tag) * 10**6 + i for i in range(50)]


# -- shards changed under a reader ----------------------------------------------------------

TRUNCATE_SCRIPT = """
    import sys, stoker
    ds = stoker.Dataset(sys.argv[1])
    it = iter(stoker.Loader(ds, batch_size=8, num_threads=2, prefetch=2))
    next(it)
    print("ready", flush=True)
    sys.stdin.readline()          # the shard is cut short now
    try:
        n = sum(1 for _ in it)
        print("LOADER NO ERROR", n)
    except stoker.DataError as e:
        print("LOADER", e)
    try:
        ds[len(ds) - 1]
        print("GETITEM NO ERROR")
    except stoker.DataError as e:
        print("GETITEM", e)
    print("VERIFY", ds.verify()["bad"])
"""


def test_shard_truncated_under_a_live_loader_is_a_data_error_not_sigbus(tmp_path):
    """`cp -r new/. data/` truncates shards under a running reader. Touching a mapped page
    past the new end raises SIGBUS, whose default action killed the process (-7)."""
    make = lambda i: {"x": np.full(4096, i % 251, np.uint8), "label": i}  # noqa: E731
    ds = write_dataset(tmp_path / "d", 3000, fields={"x": stoker.ndarray("uint8", (4096,)),
                                                      "label": stoker.scalar("int64")},
                       make=make, shard_size="64MB")
    shard = shard_file(ds, 0)
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(TRUNCATE_SCRIPT), ds.path],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "ready"
    os.truncate(shard, 100_000)
    out, err = p.communicate("go\n", timeout=120)
    assert p.returncode == 0, f"reader died with {p.returncode}: {err}"
    got = dict(line.split(" ", 1) for line in out.splitlines())
    for key in ("LOADER", "GETITEM"):
        assert f"{shard}: record " in got[key], got
        assert "changed on disk while in use" in got[key], got
    assert "changed on disk while in use" in got["VERIFY"]


def test_shard_rewritten_in_place_is_reported_as_changed(tmp_path):
    a = write_dataset(tmp_path / "a", 40, shard_size="600B", make=tagged(1))
    b = write_dataset(tmp_path / "b", 40, shard_size="600B", make=tagged(2))
    path = shard_file(a, 0)
    os.utime(path, ns=(10**9, 10**9))  # so that the rewrite below shows in the mtime
    ds = stoker.Dataset(tmp_path / "a")
    assert ds[0]["label"] == 10**6
    shutil.copyfile(shard_file(b, 0), path)  # what `cp` does: truncate, then write
    with pytest.raises(stoker.DataError, match=r"shard-00000\.stk: record 1: changed on disk "
                                               r"while in use \(the file now has another "
                                               r"shard's header"):
        ds[1]
    with pytest.raises(stoker.DataError, match="changed on disk while in use"):
        list(stoker.Loader(ds, batch_size=4, num_threads=2))


def test_record_edited_in_place_after_opening_is_reported_as_changed(tmp_path):
    ds = write_dataset(tmp_path / "d", 20)
    path = shard_file(ds, 0)
    os.utime(path, ns=(10**9, 10**9))  # so that the edit shows in the mtime
    ds = stoker.Dataset(tmp_path / "d")
    assert ds[3]["label"] == 3
    rec = 4 * 2 + 48 + 8
    with open(path, "r+b") as f:
        f.seek(64 + 3 * rec + 20)
        f.write(b"\xee")
    with pytest.raises(stoker.DataError, match=r"shard-00000\.stk: record 3: changed on disk "
                                               r"while in use \(checksum mismatch\)"):
        ds[3]


# -- nothing discarded silently -------------------------------------------------------------

def test_writer_dropped_without_close_warns_and_leaves_the_dataset_as_it_was(tmp_path):
    path = tmp_path / "d"
    w = stoker.ShardWriter(path, FIELDS)
    for i in range(7):
        w.write(tagged(1)(i))
    with pytest.warns(UserWarning, match=r"dropped without close\(\): the 7 sample\(s\) written "
                                         r"to it were discarded"):
        del w
        gc.collect()
    assert not path.exists()  # the directory it made goes too
    ds = write_dataset(path, 5, make=tagged(2))
    w = stoker.ShardWriter(path, FIELDS, overwrite=True)
    w.write(tagged(3)(0))
    with pytest.warns(UserWarning, match="the 1 sample"):
        del w
        gc.collect()
    assert labels(stoker.Dataset(path)) == labels(ds)
    assert sorted(os.listdir(path)) == sorted([ds.generation, "index.json"])


def test_unclosed_writer_at_exit_warns_with_the_count(tmp_path):
    script = """
        import sys, stoker
        w = stoker.ShardWriter(sys.argv[1], {"label": stoker.scalar("int64")})
        for i in range(3):
            w.write({"label": i})
    """
    r = run_script(script, tmp_path / "d")
    assert r.returncode == 0, r.stderr
    assert "the 3 sample(s) written to it were discarded" in r.stderr
    assert not (tmp_path / "d").exists()


# -- stoker inspect --verify ----------------------------------------------------------------

def test_inspect_verify_lists_every_bad_shard_and_record(tmp_path, run_cli):
    ds = write_dataset(tmp_path / "d", 80, shard_size="600B")
    assert len(ds.shards) >= 6
    rec = 4 * 2 + 48 + 8

    def flip(i, offset):
        with open(shard_file(ds, i), "r+b") as f:
            f.seek(offset)
            b = f.read(1)
            f.seek(offset)
            f.write(bytes([b[0] ^ 1]))

    flip(0, 20)                        # shard 0: header
    flip(2, 64 + 1 * rec + 30)         # shard 2: records 1 and 3
    flip(2, 64 + 3 * rec + 30)
    p4, p5 = shard_file(ds, 4), shard_file(ds, 5)
    os.rename(p4, p4 + ".x")           # shards 4 and 5: swapped
    shutil.copyfile(p5, p4)
    os.rename(p4 + ".x", p5)
    r = run_cli("inspect", ds.path, "--verify")
    assert r.returncode == 1, (r.stdout, r.stderr)
    bad = [line.strip() for line in r.stdout.splitlines() if line.strip().startswith("BAD")]
    assert any("shard-00000.stk: file: header checksum mismatch" in b for b in bad), bad
    assert any("shard-00002.stk: record 1: checksum mismatch" in b for b in bad), bad
    assert any("shard-00002.stk: record 3: checksum mismatch" in b for b in bad), bad
    assert any("shard-00004.stk: file: is shard 5" in b for b in bad), bad
    assert any("shard-00005.stk: file: is shard 4" in b for b in bad), bad
    assert "in 4 shard(s)" in r.stdout
    # without --verify a damaged dataset is still exit status 1, not a usage error
    r = run_cli("inspect", ds.path)
    assert r.returncode == 1 and "BAD" in r.stdout and "shard-00000.stk" in r.stdout
    (Path(ds.path) / "index.json").write_text("{not json")
    r = run_cli("inspect", ds.path, "--verify")
    assert r.returncode == 1 and "invalid JSON" in r.stdout
    r = run_cli("inspect", str(tmp_path / "nope"), "--verify")
    assert r.returncode == 2 and "no such dataset" in r.stderr
    r = run_cli("inspect", ds.path, "--no-such-flag")
    assert r.returncode == 2


def test_append_shard_copies_records_under_the_new_identity(tmp_path):
    """The building block of merges: parts written separately become one dataset."""
    parts = [write_dataset(tmp_path / f"part{k}", 25, shard_size="600B", make=tagged(k))
             for k in range(3)]
    with stoker.ShardWriter(tmp_path / "merged", FIELDS, shard_size="2KB") as w:
        for part in parts:
            for s in range(len(part.shards)):
                w.append_shard(shard_file(part, s))
    merged = stoker.Dataset(tmp_path / "merged")
    assert labels(merged) == [x for part in parts for x in labels(part)]
    assert len(merged.shards) < sum(len(p.shards) for p in parts)  # packed to shard_size
    assert merged.verify()["ok"]
    other = {"x": stoker.ndarray("uint8", (3, 4, 4)), "label": stoker.scalar("int32")}
    with stoker.ShardWriter(tmp_path / "bad", other) as w:
        with pytest.raises(stoker.DataError, match=r"part0/gen-.*schema hash does not match"):
            w.append_shard(shard_file(parts[0], 0))
