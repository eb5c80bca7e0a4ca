"""The loader core's contract at its edges: signals, threads sharing an iterator, fork,
argument bounds, errors in batch planning, and a stress test of random use from two
threads (NOTE [ Epochs and iterators ] and NOTE [ Loader shutdown ] in csrc/pipeline)."""

import gc
import io
import os
import random
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
from conftest import (
    epoch_labels,
    fake_device_loader,
    settled_thread_count,
    write_dataset,
)


def _encode(pixels, fmt):
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt)
    return buf.getvalue()


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- Ctrl-C while blocked in next() ---------------------------------------------------

def test_sigint_while_blocked_in_next_raises_within_100ms(tmp_path):
    """A real SIGINT from another process while the main thread waits for a slow batch:
    200 full decodes of a 1080x1920 PNG on one thread (seconds; PNG has no reduced-size
    decode), resized to 32x32 so that the batch stays small. The batch must still be
    pending when the signal arrives, however slowly a loaded machine runs the parent."""
    h, w = 1080, 1920
    picture = np.add.outer(np.arange(h), np.arange(w)).astype(np.uint8)
    png = _encode(np.stack([picture, picture[::-1], picture[:, ::-1]], axis=-1), "PNG")
    ds = write_dataset(tmp_path / "d", 200, fields={"image": stoker.image(),
                                                    "label": stoker.scalar("int64")},
                       shard_size="64MB", make=lambda i: {"image": png, "label": i})
    # A shell that starts jobs in the background (CI scripts run with `&`) starts them
    # with SIGINT ignored, and Python then installs no KeyboardInterrupt handler: the
    # child installs it itself, as an interactive training run has it.
    script = textwrap.dedent(f"""
        import signal, sys, time, stoker
        signal.signal(signal.SIGINT, signal.default_int_handler)
        loader = stoker.Loader({ds.path!r}, batch_size=200, num_threads=1, prefetch=1,
                               transforms={{"image": [stoker.ops.Resize((32, 32))]}})
        it = iter(loader)
        print("waiting", flush=True)
        t0 = time.perf_counter()
        try:
            next(it)
            print("not interrupted", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "waiting"
        time.sleep(0.05)  # inside next(), waiting with the GIL released
        t_sent = time.perf_counter()
        p.send_signal(signal.SIGINT)
        line = p.stdout.readline().strip()
        latency = time.perf_counter() - t_sent
        assert line == "interrupted"
        assert p.wait(timeout=30) == 0
        assert latency < 0.1, f"KeyboardInterrupt after {latency * 1e3:.0f} ms"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()


# -- one iterator, two threads ---------------------------------------------------

def test_one_iterator_from_two_threads_serves_each_batch_once(tmp_path):
    ds = write_dataset(tmp_path / "d", 3000, shard_size="1MB")
    loader = stoker.Loader(ds, batch_size=50, num_threads=1, prefetch=1, shuffle=True, seed=2)
    want = sorted(sum(epoch_labels(loader), []))
    loader.set_epoch(0)
    it = iter(loader)
    got, errors = [[], []], []

    def consume(k):
        try:
            for b in it:
                got[k].append(b["label"].tolist())
                time.sleep(0.001)
        except Exception as e:  # pragma: no cover - the assertion below reports it
            errors.append(e)

    threads = [threading.Thread(target=consume, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread hangs in next()"
    assert not errors
    assert sorted(sum(got[0] + got[1], [])) == want  # every sample once, none twice
    assert len(got[0]) + len(got[1]) == len(loader)


# -- fork -------------------------------------------------------------------------

@pytest.mark.parametrize("child", ["exits", "drops_iterator", "drops_loader"])
def test_forked_child_never_hangs_on_the_parents_loader(small_ds, child):
    loader = stoker.Loader(small_ds, batch_size=10, num_threads=2, prefetch=2)
    it = iter(loader)
    next(it)  # workers running, a batch window full
    pid = os.fork()
    if pid == 0:  # the child: leave the parent's objects in every way a program does
        try:
            if child == "drops_iterator":
                del it
                gc.collect()
            elif child == "drops_loader":
                del it, loader
                gc.collect()
        finally:
            os._exit(0)  # after a normal return path; atexit runs in sys.exit below
    deadline = time.time() + 20
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail(f"the child hung ({child})")
    assert os.waitstatus_to_exitcode(status) == 0
    assert [b["label"].tolist() for b in it][0] == list(range(10, 20))


def test_forked_child_exiting_through_the_interpreter_does_not_hang(small_ds):
    script = textwrap.dedent(f"""
        import os, sys, stoker
        loader = stoker.Loader({small_ds.path!r}, batch_size=10, num_threads=2, prefetch=2)
        it = iter(loader)
        next(it)
        pid = os.fork()
        if pid == 0:
            sys.exit(0)   # interpreter teardown in the child: atexit, destructors
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), sum(1 for _ in it), flush=True)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", "9"]


# -- argument bounds ----------------------------------------------------------------

def test_prefetch_is_bounded_instead_of_allocating_without_end(small_ds):
    with pytest.raises(ValueError, match="prefetch must be at most 1024"):
        stoker.Loader(small_ds, prefetch=2**31 - 1)
    assert len(list(stoker.Loader(small_ds, batch_size=10, prefetch=1024))) == 10


@pytest.mark.parametrize("batch_size, world_size, drop_last, want",
                         [(2**63 - 1, 1, False, 1), (2**63 - 1, 1, True, 0),
                          (10, 2**63 - 1, False, 1), (10, 2**63 - 1, True, 0),
                          (2**62, 2**62, False, 1)])
def test_huge_batch_size_and_world_size_do_not_overflow(small_ds, batch_size, world_size,
                                                        drop_last, want):
    loader = stoker.Loader(small_ds, batch_size=batch_size, world_size=world_size, rank=0,
                           drop_last=drop_last)
    assert len(loader) == want
    batches = list(loader)
    assert len(batches) == want
    if want:
        n = len(batches[0]["label"])
        assert n == (100 if world_size == 1 else 1)


# -- planning errors ---------------------------------------------------------------------

def _jpeg(h, w, seed):
    rng = np.random.default_rng(seed)
    return _encode(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "JPEG")


def test_corrupt_image_header_is_skipped_when_no_op_fixes_the_size(tmp_path):
    """Planning reads image headers to size the batch; a corrupt record there is that
    sample's error (skipped with on_error="skip"), not a misleading size error."""
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    ds = write_dataset(tmp_path / "d", 12, fields=fields, shard_size="1MB",
                       make=lambda i: {"image": _jpeg(16, 24, i), "label": i})
    path = os.path.join(ds.path, ds.shards[0]["path"])
    # records are back to back after the 64-byte header: 2 lengths, the JPEG, the label
    start = 64 + sum(8 + len(_jpeg(16, 24, i)) + 8 for i in range(5)) + 8
    with open(path, "r+b") as f:  # a byte of sample 5's JPEG header (its APP0 marker)
        f.seek(start + 3)
        b = f.read(1)
        f.seek(start + 3)
        f.write(bytes([b[0] ^ 0xFF]))
    ds = stoker.Dataset(ds.path)
    loader = stoker.Loader(ds, batch_size=4, on_error="skip")
    with pytest.warns(RuntimeWarning, match="replaced 1 unreadable sample"):
        batches = list(loader)
    labels = sum((b["label"].tolist() for b in batches), [])
    assert labels == [0, 1, 2, 3, 4, 6, 6, 7, 8, 9, 10, 11]
    assert all(b["image"].shape[1:] == (3, 16, 24) for b in batches)
    strict = stoker.Loader(ds, batch_size=4)
    it = iter(strict)
    next(it)
    with pytest.raises(stoker.DataError, match=r"shard-00000.stk: record 5.*checksum"):
        next(it)


def test_corrupt_variable_length_record_is_its_own_error(tmp_path):
    fields = {"tok": stoker.ndarray("int32", (None,)), "label": stoker.scalar("int64")}
    ds = write_dataset(tmp_path / "d", 20, fields=fields, shard_size="1MB",
                       make=lambda i: {"tok": np.arange(i % 5 + 1, dtype=np.int32),
                                       "label": i})
    path = os.path.join(ds.path, ds.shards[0]["path"])
    with open(path, "r+b") as f:  # make record 7's length field claim a huge array
        data = bytearray(f.read())
        off = 64
        for _ in range(7):
            n_tok = int.from_bytes(data[off:off + 4], "little")
            off += 8 + n_tok + 8
        data[off:off + 4] = (1 << 30).to_bytes(4, "little")
        f.seek(0)
        f.write(data)
    ds = stoker.Dataset(ds.path)
    it = iter(stoker.Loader(ds, batch_size=4))
    next(it)
    with pytest.raises(stoker.DataError, match="record 7"):
        next(it)
    skip = stoker.Loader(ds, batch_size=4, on_error="skip")
    with pytest.warns(RuntimeWarning, match="replaced 1"):
        labels = sum(epoch_labels(skip), [])
    assert labels[7] == 8 and len(labels) == 20


# -- stress ----------------------------------------------------------------------------

def _check_batch(b, kept_x=True):
    labels = b["label"]
    assert (b["x"].reshape(len(labels), -1) == (labels % 256).to(torch.uint8)[:, None]).all()


@pytest.mark.parametrize("fake_device", [False, True])
def test_stress_random_use_from_two_threads(tmp_path, fake_device):
    """Many loaders driven at random from two threads: break, close, del, new iter(),
    load_state_dict, concurrent iterators. Every batch is checked against the data it
    must hold; threads, fds and RSS are flat at the end."""
    full = os.environ.get("STOKER_SOAK_FULL") == "1"
    seconds = 30.0 if full else 4.0
    ds = write_dataset(tmp_path / "d", 300, shard_size="4KB")
    reference = {}

    def want(bs, seed, epoch):
        key = (bs, seed, epoch)
        if key not in reference:
            r = stoker.Loader(ds, batch_size=bs, shuffle=True, seed=seed,
                              prefetch_next_epoch=False)
            r.set_epoch(epoch)
            reference[key] = epoch_labels(r)
        return reference[key]

    for bs in (7, 32):
        for epoch in range(5):
            want(bs, 1, epoch)
    base_threads, base_fds = settled_thread_count(), _fd_count()
    errors = []
    stop = time.monotonic() + seconds

    def make(rng):
        kw = dict(batch_size=rng.choice([7, 32]), shuffle=True, seed=1,
                  num_threads=rng.choice([1, 2, 3]), prefetch=rng.choice([1, 2, 4]))
        return fake_device_loader(ds, **kw) if fake_device else stoker.Loader(ds, **kw)

    def driver(k):
        rng = random.Random(k)
        try:
            while time.monotonic() < stop:
                loader = make(rng)
                for _ in range(rng.randint(1, 4)):
                    action = rng.random()
                    epoch = rng.randint(0, 3)
                    loader.set_epoch(epoch)
                    if action < 0.15:
                        state = loader.state_dict()
                        state["position"] = rng.randint(0, 300)
                        loader.load_state_dict(state)
                        got = epoch_labels(loader)
                        if state["position"] == 300:  # a whole epoch: the next one runs
                            assert got == want(loader.batch_size, 1, epoch + 1)
                        else:
                            expect = want(loader.batch_size, 1, epoch)
                            assert sum(got, []) == sum(expect, [])[state["position"]:]
                        continue
                    it = iter(loader)
                    expect = want(loader.batch_size, 1, epoch)
                    stop_at = rng.choice([0, 1, 3, None])
                    other = iter(loader) if rng.random() < 0.2 else None
                    for n, b in enumerate(it):
                        _check_batch(b)
                        assert b["label"].tolist() == expect[n]
                        if other is not None and n == 1:
                            ob = next(other)  # a concurrent iterator: same epoch, own stream
                            assert ob["label"].tolist() == expect[0]
                        if stop_at is not None and n >= stop_at:
                            break
                    r = rng.random()
                    if r < 0.3:
                        it.close()
                    elif r < 0.5:
                        loader.close()
                    del it, other
                if rng.random() < 0.5:
                    loader.close()
                del loader
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=driver, args=(k,)) for k in range(2)]
    gc.collect()
    rss0 = _rss_bytes()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 60)
    assert not any(t.is_alive() for t in threads), "a driver hangs"
    if errors:
        raise errors[0]
    assert settled_thread_count() == base_threads
    assert _fd_count() == base_fds
    growth = _rss_bytes() - rss0
    assert growth < 64 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB"
