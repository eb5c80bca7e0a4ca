"""Settings that choose themselves (num_threads=None, prefetch=None), the stall telemetry in
``stats()``, and the log lines of a slow first batch (docs/tuning.md).

Nothing here asserts a duration: the tuner's moves are checked on loops whose balance is
lopsided by orders of magnitude (a consumer sleeping milliseconds per batch behind a loader
needing microseconds, or a consumer that never waits behind a JPEG decoder), and the stall
figure is compared with what the test itself measures of the same loop.
"""

import io
import logging
import time

import numpy as np
import pytest
import stoker
import stoker._loader_args as loader_args
import torch
from conftest import timed_loop, write_dataset

RAW_SHAPE = (3, 16, 16)


@pytest.fixture(scope="module")
def raw_ds(tmp_path_factory):
    """Fast to load: fixed-size arrays."""
    fields = {"x": stoker.ndarray("uint8", RAW_SHAPE), "label": stoker.scalar("int64")}
    return write_dataset(tmp_path_factory.mktemp("raw") / "ds", 4000, fields=fields,
                         make=lambda i: {"x": np.full(RAW_SHAPE, i % 256, np.uint8),
                                         "label": i})


def jpeg_bytes(h, w, seed, quality=90):
    image = pytest.importorskip("PIL.Image", reason="Pillow is in the test extra")
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    arr = np.stack([(xx * 255 // w), (yy * 255 // h), ((xx + yy) % 256)], -1).astype(np.uint8)
    arr = np.clip(arr.astype(np.int16) + rng.integers(-20, 20, arr.shape), 0, 255)
    buf = io.BytesIO()
    image.fromarray(arr.astype(np.uint8)).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


@pytest.fixture(scope="module")
def jpeg_ds(tmp_path_factory):
    """Slow to load: JPEGs decoded and resized in every batch."""
    images = [jpeg_bytes(240, 320, i) for i in range(48)]
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    return write_dataset(tmp_path_factory.mktemp("jpeg") / "ds", 48, fields=fields,
                         shard_size="256KB",
                         make=lambda i: {"image": images[i], "label": i})


JPEG_OPS = {"image": [stoker.ops.RandomResizedCrop(96), stoker.ops.RandomHorizontalFlip()]}


@pytest.fixture
def cores(monkeypatch):
    """Pretend this process may use `n` cores (the tuner's maximum), whatever the machine."""
    def set_cores(n):
        monkeypatch.setattr(loader_args, "available_cores", lambda: n)
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    return set_cores


def run_until_settled(loader, step_s=0.0, max_batches=3000):
    """Iterates epochs (sleeping `step_s` per batch, the "training step") until the tuner
    settles or `max_batches` batches have gone by; returns the batches seen."""
    seen = 0
    epoch = 0
    while seen < max_batches:
        loader.set_epoch(epoch)
        for _ in loader:
            seen += 1
            if step_s:
                time.sleep(step_s)
            if seen % 8 == 0 and loader.stats()["settled"]:
                return seen
        epoch += 1
    return seen


def tuning_lines(caplog):
    return [r for r in caplog.records if r.name == "stoker" and "autotuning settled" in
            r.getMessage()]


# -- autotuning --------------------------------------------------------------------------------

def test_consumer_bound_loop_sheds_workers_and_stays_within_max_memory(raw_ds, cores, caplog):
    cores(4)
    batch = 32
    batch_bytes = batch * (int(np.prod(RAW_SHAPE)) + 8)
    caplog.set_level(logging.INFO, logger="stoker")
    loader = stoker.Loader(raw_ds, batch_size=batch, shuffle=True,
                           max_memory=3 * batch_bytes + 100)
    assert loader.stats()["num_threads"] == 4  # starts with every core: no slow start
    # a step long enough that the loop is the bottleneck even on a loaded machine
    run_until_settled(loader, step_s=0.01)
    s = loader.stats()
    assert s["settled"] and s["auto_threads"] and s["auto_prefetch"]
    # microseconds of work per batch behind a 10 ms step: one worker is plenty
    assert s["num_threads"] == 1 and s["max_threads"] == 4
    assert s["bottleneck"] == "consumer" and s["bottleneck_stage"] is None
    # the window never held more than max_memory allows (3 batches): the loop never found
    # more than 3 batches ready
    assert 1 <= s["prefetch"] <= 3
    assert s["batch_bytes"] >= batch_bytes - 64 * 4  # (64-byte aligned tensors)
    assert sum(s["queue_depth_hist"][4:]) == 0, s["queue_depth_hist"]
    lines = tuning_lines(caplog)
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    msg = lines[0].getMessage()
    assert "num_threads=1 (of 4 cores" in msg and "consumer-bound" in msg
    assert f"prefetch={s['prefetch']}" in msg


def test_loader_bound_loop_keeps_every_core(jpeg_ds, cores, caplog):
    cores(2)
    caplog.set_level(logging.INFO, logger="stoker")
    batch_bytes = 8 * 96 * 96 * 3 + 64  # images, and the labels' 64-byte aligned tensor
    loader = stoker.Loader(jpeg_ds, batch_size=8, shuffle=True, transforms=JPEG_OPS,
                           stall_warning=None, max_memory=3 * batch_bytes + 100)
    run_until_settled(loader, max_batches=2000)
    s = loader.stats()
    assert s["settled"]
    assert s["num_threads"] == 2  # the loop always waits and the workers are busy
    assert s["batch_bytes"] == batch_bytes
    assert 1 <= s["prefetch"] <= 3  # the start (4) was cut to what max_memory holds
    assert sum(s["queue_depth_hist"][4:]) == 0, s["queue_depth_hist"]
    assert s["bottleneck"] == "loader" and s["bottleneck_stage"] in ("decode", "ops")
    msg = tuning_lines(caplog)[0].getMessage()
    assert "num_threads=2 (of 2 cores" in msg and "loader-bound" in msg


def test_never_more_threads_than_this_rank_may_use(raw_ds, cores, monkeypatch):
    cores(8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # 4 ranks on this machine: 2 cores each
    loader = stoker.Loader(raw_ds, batch_size=64)
    list(loader)
    s = loader.stats()
    assert s["max_threads"] == 2 and s["num_threads"] <= 2


def test_explicit_settings_are_never_moved(raw_ds, cores, caplog):
    cores(4)
    caplog.set_level(logging.DEBUG, logger="stoker")
    loader = stoker.Loader(raw_ds, batch_size=32, num_threads=3, prefetch=5)
    for epoch in range(2):  # long enough for the tuner to have moved both
        loader.set_epoch(epoch)
        for _ in loader:
            time.sleep(0.002)
    s = loader.stats()
    assert (s["num_threads"], s["prefetch"]) == (3, 5)
    assert not (s["auto_threads"] or s["auto_prefetch"] or s["settled"])
    assert not [r for r in caplog.records if "autotuning" in r.getMessage()]
    # one explicit, one automatic: only the automatic one moves
    caplog.clear()
    loader = stoker.Loader(raw_ds, batch_size=32, num_threads=3)
    run_until_settled(loader, step_s=0.005)
    s = loader.stats()
    assert s["num_threads"] == 3 and s["settled"]
    assert "num_threads=3 (as given)" in tuning_lines(caplog)[0].getMessage()


@pytest.mark.parametrize("which", ["raw", "jpeg"])
def test_batches_are_the_same_with_autotuning_on_and_off(raw_ds, jpeg_ds, cores, which):
    cores(4)
    ds, kw = (raw_ds, {}) if which == "raw" else (jpeg_ds, {"transforms": JPEG_OPS})
    fixed = stoker.Loader(ds, batch_size=16, shuffle=True, seed=3, num_threads=1, prefetch=1,
                          **kw)
    tuned = stoker.Loader(ds, batch_size=16, shuffle=True, seed=3, **kw)
    moves = 0
    for epoch in range(3):
        fixed.set_epoch(epoch)
        tuned.set_epoch(epoch)
        want = [{k: v.clone() for k, v in b.items()} for b in fixed]
        got = []
        for b in tuned:
            got.append({k: v.clone() for k, v in b.items()})
            time.sleep(0.005)  # consumer-bound: the tuner moves while batches flow
            moves += tuned.stats()["num_threads"] != 4
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.keys() == w.keys()
            assert all(torch.equal(g[k], w[k]) for k in g)
    if which == "raw":
        assert moves > 0  # the comparison covered batches made with fewer threads


def test_max_memory_and_stall_warning_are_checked(raw_ds):
    with pytest.raises(ValueError, match="max_memory"):
        stoker.Loader(raw_ds, max_memory=0)
    with pytest.raises(ValueError, match="invalid size"):
        stoker.Loader(raw_ds, max_memory="lots")
    assert stoker.Loader(raw_ds, max_memory="2MB").max_memory == 2_000_000
    with pytest.raises(ValueError, match="stall_warning"):
        stoker.Loader(raw_ds, stall_warning=1.5)
    default = stoker.Loader(raw_ds).max_memory
    assert 0 < default <= loader_args.physical_memory() // 16


# -- stall telemetry ---------------------------------------------------------------------------

@pytest.mark.parametrize("step_ms", [0, 3, 30])
def test_data_stall_is_the_share_of_the_loop_spent_in_next(jpeg_ds, step_ms):
    """The loader's figure against the test's own clock around next(), for a consumer that
    never waits (stall near 1), one about as fast as the loader, and a slow one (near 0)."""
    loader = stoker.Loader(jpeg_ds, batch_size=8, shuffle=True, num_threads=1, prefetch=2,
                           transforms=JPEG_OPS, stall_warning=None)
    in_next, wall, n = timed_loop(loader, step_ms / 1e3)
    s = loader.stats()
    assert s["batches"] == n == len(loader)
    assert s["data_stall"] == pytest.approx(in_next / wall, abs=0.05)
    # what is not waiting is the loop's own time: the sleeps are part of it
    assert s["data_stall"] <= 1 - n * step_ms / 1e3 / s["run_seconds"] + 0.02


def test_stall_of_a_sleeping_consumer_behind_a_fast_loader(raw_ds):
    loader = stoker.Loader(raw_ds, batch_size=64, num_threads=2, prefetch=4)
    slept = []
    in_next, wall, n = timed_loop(loader, 0.01, limit=30, slept=slept)
    s = loader.stats()
    # The loop's time is its waits, its steps (sleeping) and its own bookkeeping: the
    # loader's stall and the sleep measured here add up to all of it but the bookkeeping.
    stall, sleep_share = s["data_stall"], slept[0] / s["run_seconds"]
    own = max(0.0, wall - in_next - slept[0]) / wall  # measured here; grows on a busy machine
    assert 1 - 0.05 - own <= stall + sleep_share <= 1 + 0.02
    assert stall < 0.5  # a loader this fast keeps up with a 10 ms step
    assert s["data_stall"] == pytest.approx(in_next / wall, abs=0.05)
    assert s["bottleneck"] == "consumer" and "consumer-bound" in s["verdict"]
    assert s["queue_depth_mean"] >= 1  # batches were waiting for the loop
    per = s["stage_seconds_per_batch"]
    assert per["read"] > 0 and per["decode"] > 0 and per["ops"] == 0 and per["copy"] == 0


def test_loader_bound_verdict_names_the_stage(jpeg_ds):
    loader = stoker.Loader(jpeg_ds, batch_size=8, num_threads=1, prefetch=2,
                           transforms=JPEG_OPS, stall_warning=None)
    for epoch in range(3):
        loader.set_epoch(epoch)
        list(loader)
    s = loader.stats()
    assert s["bottleneck"] == "loader" and s["data_stall"] > 0.5
    per = s["stage_seconds_per_batch"]
    assert per["decode"] > 0 and per["ops"] > 0  # the codec and the resize, apart
    top = max(("read", "decode", "ops", "plan"), key=per.get)
    assert s["bottleneck_stage"] == top
    assert s["verdict"].startswith("loader-bound")
    assert s["queue_depth_hist"][0] >= sum(s["queue_depth_hist"][1:])  # the loop found none


def test_stall_warning_names_the_stage_once(jpeg_ds, caplog):
    caplog.set_level(logging.WARNING, logger="stoker")
    loader = stoker.Loader(jpeg_ds, batch_size=8, num_threads=1, prefetch=2,
                           transforms=JPEG_OPS, stall_warning=0.3)
    for epoch in range(100):
        loader.set_epoch(epoch)
        list(loader)
        if caplog.records:
            break
    warnings = [r for r in caplog.records if "waited for data" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    msg = warnings[0].getMessage()
    assert "stall_warning=0.3" in msg and "loader-bound" in msg
    assert "decoding" in msg or "image ops" in msg
    list(loader)
    assert len([r for r in caplog.records if "waited for data" in r.getMessage()]) == 1
    # off: nothing
    caplog.clear()
    quiet = stoker.Loader(jpeg_ds, batch_size=8, num_threads=1, prefetch=2,
                          transforms=JPEG_OPS, stall_warning=None)
    for epoch in range(6):
        quiet.set_epoch(epoch)
        list(quiet)
    assert not [r for r in caplog.records if "waited for data" in r.getMessage()]


# -- no silent warm-up -------------------------------------------------------------------------

def test_slow_first_batch_says_what_the_workers_do(tmp_path, monkeypatch, caplog):
    # big JPEGs, one worker: the first batch takes several full decodes
    monkeypatch.setattr(loader_args, "SLOW_FIRST_BATCH_SECONDS", 0.05)
    big = [jpeg_bytes(1800, 2400, i, quality=95) for i in range(3)]
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    ds = write_dataset(tmp_path / "big", 3, fields=fields, shard_size="64MB",
                       make=lambda i: {"image": big[i], "label": i})
    caplog.set_level(logging.INFO, logger="stoker")
    loader = stoker.Loader(ds, batch_size=3, num_threads=1, prefetch=1,
                           transforms={"image": [stoker.ops.Resize((900, 1200))]})
    batch = next(iter(loader))
    assert batch["image"].shape == (3, 3, 900, 1200)
    lines = [r.getMessage() for r in caplog.records if r.name == "stoker"]
    waiting = [m for m in lines if "first batch of epoch 0 is not ready after" in m]
    assert waiting, lines
    activities = ("opening shards", "reading records", "decoding", "running image ops",
                  "planning batches")
    assert any(a in waiting[0] for a in activities), waiting[0]
    assert "parts of the batch done" in waiting[0] or "not planned yet" in waiting[0]
    assert any("first batch of epoch 0 came after" in m for m in lines)
    s = loader.stats()
    assert s["first_batch_seconds"] > 0.05 and s["warmup_seconds"] > 0.05


def test_fast_first_batch_logs_nothing(raw_ds, caplog):
    caplog.set_level(logging.DEBUG, logger="stoker")
    loader = stoker.Loader(raw_ds, batch_size=64, num_threads=1, prefetch=2)
    next(iter(loader))
    assert not [r for r in caplog.records if "first batch" in r.getMessage()]
    assert loader.stats()["first_batch_seconds"] is not None


def test_first_batch_waiting_for_downloads_says_so(raw_ds, tmp_path, monkeypatch, caplog):
    """A remote dataset opens from its index.json alone; a first batch that waits for its
    shards to download says so on the "stoker" logger, naming what the workers do (a
    loopback HTTP server that answers shards slowly)."""
    import functools
    import http.server
    import threading

    monkeypatch.setattr(loader_args, "SLOW_FIRST_BATCH_SECONDS", 0.05)

    class Slow(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            if self.path.endswith(".stk"):
                time.sleep(0.3)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Slow, directory=raw_ds.path))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    caplog.set_level(logging.INFO, logger="stoker")
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        ds = stoker.Dataset(url, cache_dir=tmp_path / "cache")
        assert len(ds) == len(raw_ds)
        loader = stoker.Loader(ds, batch_size=8, num_threads=1, prefetch=1)
        batch = next(iter(loader))
        assert torch.equal(batch["x"], next(iter(stoker.Loader(raw_ds, batch_size=8)))["x"])
        s = loader.stats()
        assert s["network"]["network_wait_seconds"] > 0
        ds.remote.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    lines = [r.getMessage() for r in caplog.records if r.name == "stoker"]
    waiting = [m for m in lines if "first batch of epoch 0 is not ready after" in m]
    assert waiting and "waiting for shards to download" in waiting[0], lines



def test_copy_bound_verdict_and_stall_with_a_device(raw_ds):
    """Through the transfer engine on the host fake (each copy takes >= 20 ms): the stall
    is still the loop's time in next(), and the verdict names the copy."""
    from conftest import fake_device_loader

    loader = fake_device_loader(raw_ds, 20000, batch_size=64, num_threads=2, prefetch=2,
                                stall_warning=None)
    in_next, wall, n = timed_loop(loader, 0, limit=15)
    s = loader.stats()
    assert s["copies"] >= n - 1
    assert s["data_stall"] == pytest.approx(in_next / wall, abs=0.05)
    assert s["stage_seconds_per_batch"]["copy"] >= 0.02  # the fake's delay: a sleep
    assert s["bottleneck"] == "copy" and s["bottleneck_stage"] == "copy"
    assert s["verdict"].startswith("copy-bound")
