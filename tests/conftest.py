import os
import time

import numpy as np
import pytest
import stoker


def thread_count() -> int:
    """Threads of this process, C++ workers included."""
    return len(os.listdir("/proc/self/task"))


def write_dataset(path, n, fields=None, shard_size="1MB", make=None, **kw):
    """A dataset whose sample i is recognisable: x filled with i % 256, label = i."""
    fields = fields or {"x": stoker.ndarray("uint8", (3, 4, 4)), "label": stoker.scalar("int64")}
    make = make or (lambda i: {"x": np.full((3, 4, 4), i % 256, np.uint8), "label": i})
    with stoker.ShardWriter(path, fields, shard_size=shard_size, **kw) as w:
        for i in range(n):
            w.write(make(i))
    return stoker.Dataset(path)


@pytest.fixture
def small_ds(tmp_path):
    return write_dataset(tmp_path / "ds", 100, shard_size="2KB")


def corrupt_record(ds, record):
    """Flips a payload byte of `record` in the first shard of a write_dataset() dataset."""
    path = os.path.join(ds.path, ds.shards[0]["path"])
    rec_len = 4 * 2 + 48 + 8
    with open(path, "r+b") as f:
        f.seek(64 + record * rec_len + 12)
        b = f.read(1)
        f.seek(64 + record * rec_len + 12)
        f.write(bytes([b[0] ^ 0xFF]))


def thread_table():
    """{thread id: name} of this process's threads."""
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                out[int(t)] = f.read().strip()
        except OSError:
            pass  # the thread ended while listing
    return out


def thread_names():
    return list(thread_table().values())


def same_for_threads_and_resume(make):
    """Batches of `make(num_threads)` (a Loader) as NumPy dicts: with 1 and 3 threads, and
    with 2 threads stopped after 2 batches then resumed from its state on 1 thread, they
    must be equal, field by field. Returns the 1-thread run."""

    def run(threads, state=None, stop=None):
        with make(threads) as loader:
            if state is not None:
                loader.load_state_dict(state)
            out = []
            for k, b in enumerate(loader):
                out.append({n: t.numpy().copy() for n, t in b.items()})
                if k + 1 == stop:
                    return out, loader.state_dict()
            return out, None

    one, _ = run(1)
    three, _ = run(3)
    head, state = run(2, stop=2)
    rest, _ = run(1, state=state)
    for a, b, c in zip(one, three, head + rest, strict=True):
        assert a.keys() == b.keys() == c.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
            np.testing.assert_array_equal(a[k], c[k], err_msg=k)
    return one


# The command that builds stoker with its test-only extension, as README's test command does.
TESTING_INSTALL = ("pip install --no-build-isolation -Ccmake.define.STOKER_TESTING_MODULE=ON "
                   "\".[test]\" -c tests/constraints.txt")


def native_testing():
    """stoker._testing, the test-only entry points (tests/ext/), built only when asked for
    (CMake option STOKER_TESTING_MODULE): an install for use leaves it out. Missing, the
    error says how to build it."""
    try:
        from stoker import _testing
    except ImportError:
        raise ImportError("stoker._testing, the test-only extension (tests/ext/), is not "
                          "installed: an install for use leaves it out. Install stoker as "
                          f"README's test command does: {TESTING_INSTALL}") from None
    return _testing


def epoch_labels(loader):
    return [b["label"].tolist() for b in loader]


class FakeDeviceLoader(stoker.Loader):
    """A Loader whose device is the host fake (``_testing.fake_device``): the real transfer
    engine, copy thread, events and device buffer pool, with "device" memory in host
    memory (CPU tensors). Pass ``device="cuda"``."""

    copy_delay_us = 0

    def _open_device(self, index):
        return native_testing().fake_device(self.copy_delay_us)


def fake_device_loader(ds, delay_us=0, **kw):
    cls = type("FakeDeviceLoaderWithDelay", (FakeDeviceLoader,), {"copy_delay_us": delay_us})
    return cls(ds, device="cuda", **kw)


def stoker_threads():
    return [n for n in thread_names() if n.startswith("stoker-")]


def settled_thread_count(timeout=5.0) -> int:
    """Threads of this process once every dropped loader's workers have ended."""
    import gc
    import time

    gc.collect()
    deadline = time.monotonic() + timeout
    while stoker_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return thread_count()


def dataset_content(path):
    """What two writes of the same samples share (all but each write's random dataset id):
    the schema, the metadata, the shard boundaries and record tables, every record's bytes."""
    ds = stoker.Dataset(path)
    return {"fields": {n: f.spec() for n, f in ds.fields.items()}, "metadata": ds.metadata,
            "shards": [(s["num_records"], s["bytes"], s["table_checksum"]) for s in ds.shards],
            "records": [ds._core.read(i) for i in range(len(ds))]}


# torch's gloo backend can abort a finished process at interpreter exit: a gloo thread
# frees the last collective's work, whose tensors have Python objects, and takes the GIL
# after finalization began; CPython ends that thread with an unwind through a noexcept
# destructor, and libstdc++ aborts with this message (seen about once in 50 torchrun runs
# of a script that ends with dist.all_gather_object; the process's own Python code had all
# run). A run that ends so, with faulthandler's dump showing the main thread past all
# Python code, is run once more; any other failure, or the same one twice, fails the test.
_GLOO_EXIT_ABORT = "terminate called without an active exception"


def run_framework_script(args, *, cwd=None, timeout=240, returncode=0, env=None):
    """Runs a framework script (torchrun, Lightning DDP, accelerate) in a subprocess and
    asserts its exit code; returns the CompletedProcess. `env`: variables to add."""
    import subprocess

    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
           "PYTHONFAULTHANDLER": "1", **(env or {})}
    for attempt in range(2):
        p = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                           env=env)
        at_exit = (_GLOO_EXIT_ABORT in p.stderr and "<no Python frame>" in p.stderr
                   and "Fatal Python error: Aborted" in p.stderr)
        if p.returncode == returncode or not at_exit or attempt:
            break
        print(f"torch aborted at interpreter exit (gloo); running again: {args}")
    assert p.returncode == returncode, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def run_framework_scripts(*runs, timeout=240, returncodes=None):
    """Runs independent framework scripts (each an argument list) at the same time, as
    run_framework_script does one: a script's start-up (imports) takes one core, and these
    machines have two. `returncodes`: each run's expected exit status (default 0). Every run
    is waited for; the first failure is raised."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    # A port for each run's process group (Lightning's DDP reads MASTER_PORT), distinct:
    # each picking its own free port at the same moment could pick the same one.
    socks = [socket.socket() for _ in runs]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = [pool.submit(run_framework_script, args, timeout=timeout, returncode=code,
                               env={"MASTER_PORT": str(port)})
                   for args, port, code in zip(runs, ports, returncodes or [0] * len(runs))]
        return [f.result() for f in futures]


def timed_loop(loader, step_s, limit=None, slept=None):
    """(seconds spent in next(), wall seconds from the first next() to the end, batches),
    measured here, around the loader; `slept` (a list) gets the seconds actually slept."""
    it = iter(loader)
    in_next = asleep = 0.0
    n = 0
    t_start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            in_next += time.perf_counter() - t0
            break
        t1 = time.perf_counter()
        in_next += t1 - t0
        n += 1
        time.sleep(step_s)
        asleep += time.perf_counter() - t1
        if limit and n >= limit:
            break
    wall = time.perf_counter() - t_start
    it.close()  # (a device's copy thread may take a moment to stop: not the loop's time)
    if slept is not None:
        slept.append(asleep)
    return in_next, wall, n


def eventually(cond, timeout=5.0, every=0.005):
    """Polls `cond` until it is true or `timeout` seconds pass; its last value. The way a
    test waits for another thread or process: never a sleep of a guessed length."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(every)


def fd_counts():
    """(open file descriptors, of which memfds) of this process."""
    fds = memfds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed meanwhile
        fds += 1
        memfds += target.startswith("/memfd:")
    return fds, memfds


def process_alive(pid) -> bool:
    """Whether process `pid` runs (a zombie, dead but not reaped yet, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.fixture(scope="session")
def labels_ds(tmp_path_factory):
    """64 samples: x (3, 4, 4) uint8 filled with i, label i; shards of a few records."""
    return write_dataset(tmp_path_factory.mktemp("labels") / "ds", 64, shard_size="2KB")


def png(arr) -> bytes:
    """`arr` (uint8, (h, w) or (h, w, 3)) as PNG bytes, lossless: what a test's dataset
    stores when it compares pixels exactly."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def nginx(served_root, tmp_path_factory):
    """nginx serving the module's `served_root` fixture (a folder) on a loopback port, for
    the module's tests; skips where nginx is not installed (.ci/run installs it)."""
    from remote_servers import Nginx, nginx_binary

    if nginx_binary() is None:
        pytest.skip("nginx is not installed (apt-get install nginx; .ci/run installs it); "
                    "the S3 tests cover the same paths")
    server = Nginx(str(served_root), str(tmp_path_factory.mktemp("nginx")))
    yield server
    server.stop()


SECOND_USER = "stoker-test-other"


def second_user():
    """(uid, gid) of a second local user, for tests that play another user of a shared
    machine: created once with useradd (a system user, no home, no shell), found after.
    Skips where this cannot be: not root (only root creates and becomes another user), or
    no useradd."""
    import pwd
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("playing a second local user needs root (useradd, then setuid in a "
                    "child): the held-out checks run it with two real users")
    try:
        pw = pwd.getpwnam(SECOND_USER)
    except KeyError:
        try:
            r = subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                                "/usr/sbin/nologin", SECOND_USER], capture_output=True,
                               text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            pytest.skip(f"cannot create a second local user: {e}")
        if r.returncode not in (0, 9):  # 9: made meanwhile by another test process
            pytest.skip(f"cannot create a second local user: useradd: {r.stderr.strip()}")
        pw = pwd.getpwnam(SECOND_USER)
    return pw.pw_uid, pw.pw_gid


def as_user(user, argv, **kw):
    """Runs `argv` as `user` ((uid, gid) from second_user()): its CompletedProcess."""
    import subprocess

    uid, gid = user

    def become():
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    return subprocess.run(argv, preexec_fn=become, capture_output=True, text=True,
                          timeout=60, **kw)
