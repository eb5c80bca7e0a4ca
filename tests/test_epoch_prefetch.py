"""Next-epoch prefetch (NOTE [ Next-epoch prefetch ] in csrc/pipeline/loader_core.h): the
stream of an epoch flows on into the next one within the same window, and the next iter()
takes it over (no new stream: stats()["streams"] stays)."""

import gc
import subprocess
import sys
import textwrap
import time

import pytest
import stoker
import torch
from conftest import (
    corrupt_record,
    epoch_labels,
    fake_device_loader,
    settled_thread_count,
    thread_count,
    thread_names,
    write_dataset,
)


def workers() -> int:
    return sum(1 for n in thread_names() if n.startswith("stoker-worker"))


def wait_until(cond, timeout=5.0) -> bool:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            return False
        time.sleep(0.01)
    return True


def reference(ds, epoch, **kw):
    """The batches of `epoch` from a fresh loader that prefetches nothing."""
    loader = stoker.Loader(ds, prefetch_next_epoch=False, **kw)
    loader.set_epoch(epoch)
    return epoch_labels(loader)


KW = dict(batch_size=10, shuffle=True, seed=7, num_threads=3, prefetch=2)


def test_next_epoch_loads_before_iter_and_iter_takes_it_over(small_ds):
    settled_thread_count()
    base = workers()
    loader = stoker.Loader(small_ds, **KW)
    assert epoch_labels(loader) == reference(small_ds, 0, **KW)
    # epoch 1 is loading though no iter() asked for it yet
    assert wait_until(lambda: loader.stats()["queue_depth"] == 0 and workers() == base + 3)
    s = loader.stats()
    assert s["batches"] == len(loader)  # assembled ahead is not delivered
    assert s["streams"] == 1
    it1 = iter(loader)
    assert workers() == base + 3
    assert [b["label"].tolist() for b in it1] == reference(small_ds, 1, **KW)
    assert loader.stats()["streams"] == 1  # taken over, not restarted
    loader.close()
    assert workers() == base


@pytest.mark.parametrize("fake_device", [False, True])
def test_epochs_together_hold_no_more_than_prefetch_batches(tmp_path, fake_device):
    """The next epoch gets the window only as the current one frees it: buffers stay at
    prefetch + the batches the loop holds, across epoch boundaries."""
    ds = write_dataset(tmp_path / "d", 400, shard_size="8KB")
    prefetch = 4
    kw = dict(batch_size=10, shuffle=True, num_threads=3, prefetch=prefetch)
    loader = fake_device_loader(ds, **kw) if fake_device else stoker.Loader(ds, **kw)
    for epoch in range(4):
        for k, _b in enumerate(loader):  # holds one batch, and the next while next() runs
            if k < len(loader) - 1:  # the workers fill the window, also at the epoch's end
                assert wait_until(lambda: loader.stats()["queue_depth"] >= prefetch)
        del _b
        s = loader.stats()
        if fake_device:  # host slots also back the copies in flight (up to prefetch more)
            assert s["device_buffers"] <= prefetch + 2, (epoch, s["device_buffers"])
            assert s["host_blocks"] <= 2 * prefetch, (epoch, s["host_blocks"])
        else:
            assert s["host_blocks"] <= prefetch + 2, (epoch, s["host_blocks"])
        assert s["streams"] == 1  # one stream flowed through every epoch
    loader.close()


@pytest.mark.parametrize("prefetch_next_epoch", [True, False])
def test_batches_do_not_depend_on_next_epoch_prefetch(tmp_path, prefetch_next_epoch):
    ds = write_dataset(tmp_path / "d", 237, shard_size="4KB")
    kw = dict(batch_size=16, shuffle=True, seed=3, num_threads=2, prefetch=3)
    loader = stoker.Loader(ds, prefetch_next_epoch=prefetch_next_epoch, **kw)
    got = []
    for epoch in range(4):
        loader.set_epoch(epoch)  # the usual loop: set_epoch names the epoch prefetched
        got.append(epoch_labels(loader))
    got.append(epoch_labels(loader))  # no set_epoch: the one after, 4
    assert got == [reference(ds, e, **kw) for e in range(5)]
    s = loader.stats()
    assert s["batches"] == 5 * len(loader) and s["samples"] == 5 * 237
    loader.close()


def test_without_prefetch_no_worker_outlives_the_epoch(small_ds):
    settled_thread_count()
    base = workers()
    loader = stoker.Loader(small_ds, prefetch_next_epoch=False, **KW)
    epoch_labels(loader)
    assert wait_until(lambda: workers() == base)
    s = loader.stats()  # and none was started again: no second stream, no live worker
    assert s["streams"] == 1 and s["live_workers"] == 0 and workers() == base


def test_set_epoch_to_another_epoch_drops_the_prefetch(small_ds):
    settled_thread_count()
    base = workers()
    loader = stoker.Loader(small_ds, **KW)
    epoch_labels(loader)
    assert wait_until(lambda: workers() == base + 3)
    loader.set_epoch(5)
    assert wait_until(lambda: workers() == base, 1.0)  # dropped: the workers end, not idle
    assert epoch_labels(loader) == reference(small_ds, 5, **KW)
    assert loader.stats()["streams"] == 2
    loader.set_epoch(6)  # the epoch now being prefetched: kept
    assert wait_until(lambda: workers() == base + 3)
    assert epoch_labels(loader) == reference(small_ds, 6, **KW)
    assert loader.stats()["streams"] == 2
    loader.close()


def test_resume_after_an_epoch_end_gets_the_right_batches(small_ds):
    loader = stoker.Loader(small_ds, **KW)
    epoch_labels(loader)
    it = iter(loader)
    first = [next(it)["label"].tolist() for _ in range(3)]
    state = loader.state_dict()
    it.close()
    want = reference(small_ds, 1, **KW)
    epoch_labels(loader)  # epoch 2 ran; epoch 3 is loading ahead
    loader.load_state_dict(state)  # epoch 1, batch 3: the prefetch is not it
    assert first + epoch_labels(loader) == want
    other = stoker.Loader(small_ds, **{**KW, "num_threads": 1})
    epoch_labels(other)  # other's epoch 1 is loading ahead, from batch 0
    other.load_state_dict(state)
    assert first + epoch_labels(other) == want
    # a state saved at an epoch's end resumes at the next epoch, which is prefetched
    other.load_state_dict(other.state_dict())
    assert epoch_labels(other) == reference(small_ds, 2, **KW)


def test_leaving_an_epoch_early_hands_its_window_to_the_next(small_ds):
    loader = stoker.Loader(small_ds, **KW)
    it = iter(loader)
    for _ in range(len(loader) - 1):
        next(it)
    # the workers finish epoch 0 (its last batch is ready), so that epoch 1 starts ahead
    assert wait_until(lambda: loader.stats()["queue_depth"] >= 1)
    it.close()  # one batch of epoch 0 never taken
    assert epoch_labels(loader) == reference(small_ds, 1, **KW)
    assert loader.stats()["streams"] == 1  # epoch 1 was loading already, and was kept
    it = iter(loader)
    next(it)
    it.close()  # far from the end: nothing of epoch 3 is loading, the stream stops
    assert epoch_labels(loader) == reference(small_ds, 3, **KW)
    assert loader.stats()["streams"] == 2
    loader.close()


def test_an_error_in_the_prefetched_epoch_surfaces_at_its_batch(tmp_path):
    ds = write_dataset(tmp_path / "d", 40, shard_size="1MB")
    corrupt_record(ds, 2)  # in batch 0
    ds = stoker.Dataset(tmp_path / "d")
    loader = stoker.Loader(ds, batch_size=4, num_threads=2, prefetch=2)
    state = loader.state_dict()
    state["position"] = 4
    loader.load_state_dict(state)  # epoch 0 from batch 1: no bad record in it
    assert sum(len(b["label"]) for b in loader) == 36  # epoch 1 was loading meanwhile
    it = iter(loader)
    with pytest.raises(stoker.DataError, match=r"shard-00000.stk: record 2: checksum mismatch"):
        next(it)
    loader.close()


def test_close_stops_every_worker_and_the_loader_stays_usable(small_ds):
    base = settled_thread_count()
    loader = stoker.Loader(small_ds, **KW)
    epoch_labels(loader)
    loader.close()
    assert thread_count() == base
    assert epoch_labels(loader) == reference(small_ds, 1, **KW)
    del loader
    gc.collect()
    assert thread_count() == base  # the destructor joins the workers


def test_a_prefetching_loader_does_not_hold_up_interpreter_exit(small_ds):
    script = textwrap.dedent(f"""
        import stoker
        loader = stoker.Loader({small_ds.path!r}, batch_size=1, num_threads=2, prefetch=2)
        n = sum(1 for _ in loader)  # the next epoch is now loading, and waits for space
        print(n, flush=True)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "100"
    assert "terminate" not in p.stderr


def test_fake_device_adopts_the_next_epoch_and_keeps_old_batches_intact(small_ds):
    loader = fake_device_loader(small_ds, **KW)
    kept = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        batches = list(loader)
        assert [b["label"].tolist() for b in batches] == reference(small_ds, epoch, **KW)
        kept.append(batches)
    for epoch, batches in enumerate(kept):  # device buffers were never reused under them
        labels = [b["label"].tolist() for b in batches]
        assert labels == reference(small_ds, epoch, **KW)
        for b in batches:
            assert torch.equal(b["x"][:, 0, 0, 0], (b["label"] % 256).to(torch.uint8))
    loader.close()
