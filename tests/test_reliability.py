"""Faults and long runs: a killed writer, and a soak of many short epochs."""

import gc
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import stoker
from conftest import settled_thread_count, write_dataset


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_killed_writer_leaves_no_dataset(tmp_path):
    out = tmp_path / "d"
    script = textwrap.dedent(f"""
        import numpy as np, stoker, sys
        fields = {{"x": stoker.ndarray("uint8", (1000,))}}
        w = stoker.ShardWriter({str(out)!r}, fields, shard_size="20KB")
        for i in range(10**9):
            w.write({{"x": np.zeros(1000, np.uint8)}})
            if i == 200:
                print("ready", flush=True)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    p.stdout.close()
    generations = [g for g in os.listdir(out) if g.startswith("gen-")]
    assert len(generations) == 1
    assert any(f.endswith(".stk") for f in os.listdir(out / generations[0]))  # shards finished
    with pytest.raises(FileNotFoundError, match="index.json"):
        stoker.Dataset(out)
    # The next write takes the lock the dead writer held and removes what it left.
    ds = write_dataset(out, 5)
    assert sorted(os.listdir(out)) == sorted([ds.generation, "index.json"])


def test_soak_many_short_epochs(tmp_path):
    """Random early exits, resumes and thread counts: memory, threads and fds stay flat.

    The default run is short; CI (CI=true) or STOKER_SOAK_FULL=1 runs the full length.
    """
    full = os.environ.get("STOKER_SOAK_FULL") == "1" or os.environ.get("CI") == "true"
    epochs = 400 if full else 60
    ds = write_dataset(tmp_path / "d", 500, shard_size="8KB")
    rng = random.Random(0)
    base_threads, base_fds = settled_thread_count(), fd_count()

    def one_epoch(e: int, state):
        threads = rng.choice([1, 2, 3, 5])
        loader = stoker.Loader(ds, batch_size=rng.choice([7, 32]), shuffle=True, seed=1,
                               num_threads=threads, prefetch=rng.choice([1, 2, 4]))
        if state is not None and state["batch_size"] == loader.batch_size:
            loader.load_state_dict(state)
        else:
            loader.set_epoch(e)
        stop_at = rng.choice([None, 0, 1, 3, 10])
        it = iter(loader)
        seen = 0
        for b in it:
            assert b["label"].shape[0] <= loader.batch_size
            seen += 1
            if stop_at is not None and seen > stop_at:
                break
        state = loader.state_dict() if rng.random() < 0.3 else None
        del it, loader
        return state

    state = None
    for e in range(20):  # warm up allocator caches before the baseline
        state = one_epoch(e, state)
    gc.collect()
    rss0 = rss_bytes()
    for e in range(epochs):
        state = one_epoch(e, state)
        if e % 50 == 0:
            assert settled_thread_count() == base_threads, f"threads leaked after epoch {e}"
    gc.collect()
    growth = rss_bytes() - rss0
    assert settled_thread_count() == base_threads
    assert fd_count() == base_fds
    assert growth < 32 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB over {epochs} epochs"


def test_stop_is_prompt_even_mid_batch(tmp_path):
    """close() of an iterator whose epoch is running, while a worker is in the middle of a
    batch and cannot finish it (half its records are in a shard the server holds back),
    returns without waiting for that batch; the loader then runs the next epoch whole."""
    import threading

    from remote_servers import GatedServer

    local = write_dataset(tmp_path / "www" / "ds", 60, shard_size="1KB")
    n0 = local.shards[0]["num_records"]
    assert len(local.shards) >= 3 and n0 >= 4
    first = local.shards[0]["path"].rsplit("/", 1)[-1]
    server = GatedServer(str(tmp_path / "www"), allow=(first,))
    try:
        ds = stoker.Dataset(f"{server.url}/ds", cache_dir=tmp_path / "cache")
        # batch 0 lies in shard 0; batch 1 starts in shard 0 and ends in held-back shard 1
        batch = n0 // 2 + 1
        loader = stoker.Loader(ds, batch_size=batch, num_threads=2, prefetch=2)
        it = iter(loader)
        assert next(it)["label"].tolist() == list(range(batch))  # the epoch is running
        deadline = time.monotonic() + 30
        while loader.stats()["network"]["network_wait_seconds"] == 0:  # a worker waits
            assert time.monotonic() < deadline, "no worker ever waited for shard 1"
            time.sleep(0.01)
        closer = threading.Thread(target=it.close)
        closer.start()
        closer.join(30)  # the gate holds shard 1 back for 60 s: close must not wait for it
        assert not closer.is_alive() and not server.gate.is_set()
        with pytest.raises(StopIteration):
            next(it)
        server.open_gate()
        labels = [int(x) for b in loader for x in b["label"]]  # the next epoch, whole
        assert labels == list(range(60))
    finally:
        server.stop()


# -- rewrites under fire: kills and concurrent readers ---------------------------------------
# A dataset rewritten with overwrite=True is always old or new, whole. Sample i of the
# dataset written with tag t is {"x": t % 251 repeated, "tag": t, "i": i} and there are
# n_of(t) of them, so a mix of two writes shows in any of the three.

REWRITE_COMMON = """
import json, os, random, signal, sys, time
import numpy as np, stoker

FIELDS = {"x": stoker.ndarray("uint8", (200,)), "tag": stoker.scalar("int64"),
          "i": stoker.scalar("int64")}

def n_of(tag):
    return 60 + (tag * 37) % 90

def write(root, tag):
    with stoker.ShardWriter(root, FIELDS, shard_size="3KB", overwrite=True) as w:
        for i in range(n_of(tag)):
            w.write({"x": np.full(200, tag % 251, np.uint8), "tag": tag, "i": i})

def check(ds, loader=False):
    # The tag of a whole dataset; AssertionError on any mix.
    if loader:
        rows = [(int(t), int(i), int(x[0])) for b in stoker.Loader(ds, batch_size=32,
                                                                   num_threads=2)
                for t, i, x in zip(b["tag"], b["i"], b["x"])]
    else:
        rows = [(int(s["tag"]), int(s["i"]), int(s["x"][0])) for s in ds]
    tag = rows[0][0]
    want = [(tag, i, tag % 251) for i in range(n_of(tag))]
    assert rows == want, f"mixed or partial dataset: tags {sorted({r[0] for r in rows})}"
    return tag
"""

KILL_SCRIPT = REWRITE_COMMON + """
root, runs, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
write(root, 0)
t0 = time.perf_counter()
write(root, 1)
duration = time.perf_counter() - t0
outcome = {"old": 0, "new": 0}

def killed_rewrite(tag, child):
    before = check(stoker.Dataset(root))
    pid = os.fork()
    if pid == 0:
        try:
            child(tag)
        finally:
            os._exit(0)
    return before, pid

# 1. SIGKILL at a random moment of a rewrite.
for run in range(runs):
    tag = 2 + run
    before, pid = killed_rewrite(tag, lambda t: write(root, t))
    time.sleep(rng.uniform(0, 1.3 * duration))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    got = check(stoker.Dataset(root))
    assert got in (before, tag), (got, before, tag)
    outcome["old" if got == before else "new"] += 1

# 2. SIGKILL just before each filesystem step of the commit and the cleanup that
#    follows, in turn (the shards themselves are written by C++: part 1 covers them).
STEPS = ("mkdir", "replace", "rename", "fsync", "unlink", "rmdir", "ftruncate", "pwrite",
         "scandir")

def write_killed_at(tag, step):
    calls = [0]
    for name in STEPS:
        real = getattr(os, name)
        def wrapped(*a, _real=real, **k):
            calls[0] += 1
            if calls[0] == step:
                os.kill(os.getpid(), signal.SIGKILL)
            return _real(*a, **k)
        setattr(os, name, wrapped)
    write(root, tag)

# Step k, then k + 1, ... until a write gets through all its steps (their number varies
# with what earlier kills left for it to clean up).
tag, steps = 2 + runs, 0
while True:
    tag += 1
    before, pid = killed_rewrite(tag, lambda t: write_killed_at(t, steps + 1))
    _, status = os.waitpid(pid, 0)
    got = check(stoker.Dataset(root))
    assert got in (before, tag), (steps + 1, got, before, tag)
    if not os.WIFSIGNALED(status):
        assert got == tag
        break
    steps += 1
    outcome["old" if got == before else "new"] += 1
    assert steps < 1000

# What the killed writes left is removed by the next one.
write(root, 10**6)
left = sorted(os.listdir(root))
print(json.dumps({"outcome": outcome, "steps": steps, "left": left}))
"""


def test_killed_rewrites_leave_the_old_or_the_new_dataset(tmp_path):
    """SIGKILL at random moments of a rewrite (24 runs), then just before every filesystem
    step of its commit and cleanup: the dataset always opens, whole, old or new."""
    root = tmp_path / "d"
    r = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(root), "24", "7"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["steps"] >= 8, report  # the commit really was cut at each step
    assert report["outcome"]["old"] > 0 and report["outcome"]["new"] > 0, report
    assert len(report["left"]) == 2 and "index.json" in report["left"], report


READER_SCRIPT = REWRITE_COMMON + """
root, stop, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
stats = {"opens": 0, "errors": [], "tags": []}
stoker.Loader  # imported (with torch) before the race starts, not during the first read
print("ready", flush=True)
while not os.path.exists(stop):
    try:
        ds = stoker.Dataset(root)
        time.sleep(rng.uniform(0, 0.02))  # rewrites happen between opening and reading
        tag = check(ds, loader=stats["opens"] % 2 == 1)
        stats["opens"] += 1
        if not stats["tags"] or stats["tags"][-1] != tag:
            stats["tags"].append(tag)
        del ds
    except Exception as e:
        stats["errors"].append(f"{type(e).__name__}: {e}")
        if len(stats["errors"]) > 20:
            break
print(json.dumps(stats))
"""


def _rewrite_race(tmp_path, rewrites: int, readers: int) -> dict:
    namespace: dict = {}
    exec(REWRITE_COMMON, namespace)
    root, stop = tmp_path / "d", tmp_path / "stop"
    namespace["write"](str(root), 0)
    procs = [subprocess.Popen([sys.executable, "-c", READER_SCRIPT, str(root), str(stop),
                               str(k)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for k in range(readers)]
    try:
        for p in procs:  # each reader has imported and starts its loop
            assert p.stdout.readline().strip() == "ready"
        t0 = time.perf_counter()
        for tag in range(1, rewrites + 1):
            namespace["write"](str(root), tag)
        seconds = time.perf_counter() - t0
        time.sleep(0.2)
    finally:
        stop.touch()
        outs = [p.communicate(timeout=120) for p in procs]
    stats = []
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        stats.append(json.loads(out.strip().splitlines()[-1]))
    # Every generation a reader held is gone once it is: one write removes them all.
    namespace["write"](str(root), rewrites + 1)
    left = sorted(os.listdir(root))
    return {"rewrites": rewrites, "seconds": seconds, "readers": stats, "left": left}


@pytest.mark.slow
def test_readers_never_see_an_error_or_a_mix_during_rewrites(tmp_path):
    """Readers opening in a loop (then sleeping, then reading every sample, half the time
    through a Loader) while the dataset is rewritten 50 times: never an error, never a
    mix; each reader sees several generations; nothing is left behind afterwards.
    STOKER_SOAK_FULL=1 runs 2000 rewrites with 2 readers and prints the figures."""
    full = os.environ.get("STOKER_SOAK_FULL") == "1"
    report = _rewrite_race(tmp_path, rewrites=2000 if full else 50, readers=2 if full else 1)
    for r in report["readers"]:
        assert r["errors"] == [], r["errors"][:5]
        assert r["opens"] > 0 and len(r["tags"]) >= 2, r
    assert len(report["left"]) == 2 and "index.json" in report["left"], report["left"]
    if full:
        print("\nrewrite race:", json.dumps({
            "rewrites": report["rewrites"], "seconds": round(report["seconds"], 1),
            "opens": [r["opens"] for r in report["readers"]],
            "generations_seen": [len(r["tags"]) for r in report["readers"]],
            "errors": sum(len(r["errors"]) for r in report["readers"])}))


# -- token files and writer start-up as safe as shards --------------------------------------

TRUNCATE_UNDER_LOADER = textwrap.dedent("""
    import os, sys
    import numpy as np
    import stoker
    path = sys.argv[1]
    np.arange(1 << 22, dtype=np.uint16).tofile(path)    # 8 MiB: train.bin
    ds = stoker.TokenDataset(path, dtype="uint16")
    loader = stoker.Loader(ds, batch_size=8, seq_len=1024, shuffle=True, seed=0,
                           num_threads=2)
    it = iter(loader)
    next(it)
    os.truncate(path, 4096)     # prepare.py rewriting train.bin in place, say
    try:
        for _ in it:
            pass
    except stoker.DataError as e:
        print("DataError:", e)
        sys.exit(0)
    print("no error")
    sys.exit(1)
""")


def test_a_token_file_cut_short_under_a_loader_is_a_data_error(tmp_path):
    """A flat token file truncated under a token loader gives a DataError naming the
    file (its pages read as zeros), never SIGBUS."""
    r = subprocess.run([sys.executable, "-c", TRUNCATE_UNDER_LOADER, str(tmp_path / "train.bin")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert f"DataError: {tmp_path / 'train.bin'}: changed on disk while in use" in r.stdout


def test_a_token_state_refuses_another_file_and_world_size_zero(tmp_path):
    import numpy as np

    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    np.arange(50_000, dtype=np.uint16).tofile(a)
    (np.arange(50_000, dtype=np.uint16) ^ 7).tofile(b)        # same token count
    state = stoker.Loader(stoker.TokenDataset(str(a), dtype="uint16"), batch_size=4,
                          seq_len=64, seed=0).state_dict()
    same = stoker.Loader(stoker.TokenDataset(str(a), dtype="uint16"), batch_size=4,
                         seq_len=64, seed=0)
    same.load_state_dict(state)
    other = stoker.Loader(stoker.TokenDataset(str(b), dtype="uint16"), batch_size=4,
                          seq_len=64, seed=0)
    with pytest.raises(ValueError, match="cannot resume: the state is for another dataset "
                                         r"\(files"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="world_size must be a positive int, got 0"):
        same.load_state_dict(dict(state, world_size=0))


START_FULL = textwrap.dedent("""
    import os, resource, signal, sys
    import stoker
    path = sys.argv[1]
    fields = {"x": stoker.scalar("int64")}
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # writes past the limit fail (EFBIG)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
    try:
        stoker.ShardWriter(path, fields)
    except OSError as e:
        print("failed:", e)
    else:
        sys.exit("no error at start")
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    with stoker.ShardWriter(path, fields, overwrite=True) as w:   # the lock was released
        w.write({"x": 1})
    print("written", len(stoker.Dataset(path)))
""")


def test_a_writer_that_fails_at_start_releases_its_lock(tmp_path):
    """A ShardWriter whose first write fails (a full disk: here a file size limit of 0)
    names the path and releases the writer lock: the next writer, in this process or
    another, is not told that another one is writing."""
    out = tmp_path / "d"
    r = subprocess.run([sys.executable, "-c", START_FULL, str(out)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"failed: [Errno 27] {out}/writer.lock: cannot write the writer lock file" in r.stdout
    assert "written 1" in r.stdout
