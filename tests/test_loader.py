import gc
import os
import time

import numpy as np
import pytest
import stoker
import torch
from conftest import (
    corrupt_record,
    epoch_labels,
    settled_thread_count,
    thread_count,
    thread_table,
    write_dataset,
)

# -- length and coverage -------------------------------------------------------

@pytest.mark.parametrize("n, bs, drop_last, world, want", [
    (100, 10, False, 1, 10), (101, 10, False, 1, 11), (101, 10, True, 1, 10),
    (442, 442, False, 1, 1), (442, 443, True, 1, 0), (100, 7, False, 3, 5),
    (100, 7, True, 3, 4), (5, 2, False, 8, 1),
])
def test_len_matches_batches_yielded(tmp_path, n, bs, drop_last, world, want):
    ds = write_dataset(tmp_path / "d", n)
    for threads in (1, 8):
        for rank in range(world):
            loader = stoker.Loader(ds, batch_size=bs, drop_last=drop_last, rank=rank,
                                   world_size=world, num_threads=threads, shuffle=True)
            assert len(loader) == want
            batches = list(loader)
            assert len(batches) == want
            if drop_last:
                assert all(len(b["label"]) == bs for b in batches)


def test_442_samples_one_batch_any_thread_count(tmp_path):
    ds = write_dataset(tmp_path / "d", 442)
    for threads in (1, 8):
        batches = list(stoker.Loader(ds, batch_size=442, num_threads=threads, shuffle=True))
        assert len(batches) == 1
        assert sorted(batches[0]["label"].tolist()) == list(range(442))


def test_sequential_without_shuffle(small_ds):
    labels = sum(epoch_labels(stoker.Loader(small_ds, batch_size=16, num_threads=2)), [])
    assert labels == list(range(100))


def test_shuffled_epoch_is_a_permutation_and_changes_with_epoch(small_ds):
    loader = stoker.Loader(small_ds, batch_size=16, shuffle=True, seed=3, num_threads=2)
    e0 = sum(epoch_labels(loader), [])
    e1 = sum(epoch_labels(loader), [])  # the next iterator runs the next epoch
    assert sorted(e0) == sorted(e1) == list(range(100))
    assert e0 != e1 and e0 != list(range(100))
    loader.set_epoch(0)
    assert sum(epoch_labels(loader), []) == e0
    other_seed = stoker.Loader(small_ds, batch_size=16, shuffle=True, seed=4)
    assert sum(epoch_labels(other_seed), []) != e0


def test_ranks_are_disjoint_and_equal_sized(tmp_path):
    ds = write_dataset(tmp_path / "d", 103)
    world = 4
    per_rank = []
    for rank in range(world):
        loader = stoker.Loader(ds, batch_size=8, shuffle=True, seed=1, rank=rank,
                               world_size=world)
        per_rank.append(sum(epoch_labels(loader), []))
    assert len({len(r) for r in per_rank}) == 1 and len(per_rank[0]) == 26  # ceil(103/4)
    everything = sum(per_rank, [])
    assert set(everything) == set(range(103))
    assert len(everything) - len(set(everything)) == 26 * 4 - 103  # only the wrap padding
    dropped = [sum(epoch_labels(stoker.Loader(ds, batch_size=8, shuffle=True, seed=1, rank=r,
                                               world_size=world, drop_last=True)), [])
               for r in range(world)]
    flat = sum(dropped, [])
    assert len(flat) == len(set(flat)) == 4 * 24  # floor(103/4)=25 -> 3 full batches of 8


def test_argument_errors(small_ds):
    with pytest.raises(ValueError, match="batch_size"):
        stoker.Loader(small_ds, batch_size=0)
    with pytest.raises(ValueError, match="rank"):
        stoker.Loader(small_ds, batch_size=4, rank=2, world_size=2)
    with pytest.raises(ValueError, match="num_threads"):
        stoker.Loader(small_ds, batch_size=4, num_threads=0)
    with pytest.raises(ValueError, match="on_error"):
        stoker.Loader(small_ds, batch_size=4, on_error="ignore")
    with pytest.raises(ValueError, match="no field 'img'"):
        stoker.Loader(small_ds, batch_size=4, transforms={"img": []})
    with pytest.raises(ValueError, match="not an image field"):
        stoker.Loader(small_ds, batch_size=4, transforms={"x": []})
    # bools are not ints here, and what would overflow the core's 64-bit ints is refused
    # in Python with the argument's name, not as a binding's TypeError
    for kwargs, message in [
        (dict(batch_size=True), "batch_size must be a positive int or None, got True"),
        (dict(batch_size=2**70), "batch_size must be at most"),
        (dict(batch_size=4, prefetch=True), "prefetch must be a positive int"),
        (dict(batch_size=4, prefetch=2**40), "prefetch must be at most"),
        (dict(batch_size=4, num_threads=True), "num_threads must be a positive int"),
        (dict(batch_size=4, seed=2**64), "seed must be at most"),
        (dict(batch_size=4, rank=0.0, world_size=1), "rank must be a non-negative int"),
        (dict(batch_size=4, world_size=0), "world_size must be a positive int"),
    ]:
        with pytest.raises(ValueError, match=message):
            stoker.Loader(small_ds, **kwargs)
    with pytest.raises(TypeError, match="transforms must be a dict"):
        stoker.Loader(small_ds, batch_size=4, transforms=[stoker.ops.CenterCrop(2)])
    def order(seed):
        return epoch_labels(stoker.Loader(small_ds, batch_size=4, shuffle=True, seed=seed))
    assert order(-1) == order(2**64 - 1) != order(0)  # negative seeds: modulo 2**64
    loader = stoker.Loader(small_ds, batch_size=4)
    for epoch in (-1, 2**63, 1.0):
        with pytest.raises(ValueError, match="epoch must be"):
            loader.set_epoch(epoch)
    # integer types of NumPy and torch are ints
    assert len(stoker.Loader(small_ds, batch_size=np.int64(8), num_threads=np.int32(2))) == 13
    loader.set_epoch(torch.tensor(3))
    assert loader.epoch == 3 and type(loader.epoch) is int


# -- determinism and resume ----------------------------------------------------

def batches_as_arrays(loader):
    return [{k: v.clone() for k, v in b.items()} for b in loader]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), k


def test_same_batches_for_any_threads_and_prefetch(tmp_path):
    fields = {"x": stoker.ndarray("uint8", (3, 4, 4)), "label": stoker.scalar("int64"),
              "tok": stoker.ndarray("int32", (None,)), "raw": stoker.blob()}
    rng = np.random.default_rng(0)
    samples = [{"x": rng.integers(0, 256, (3, 4, 4), dtype=np.uint8), "label": i,
                "tok": rng.integers(0, 9, rng.integers(0, 12), dtype=np.int32),
                "raw": bytes(rng.integers(0, 256, rng.integers(0, 5), dtype=np.uint8))}
               for i in range(257)]
    ds = write_dataset(tmp_path / "d", 257, fields=fields, make=lambda i: samples[i])
    ref = None
    for threads, prefetch in [(1, 1), (2, 2), (3, 8), (8, 3)]:
        loader = stoker.Loader(ds, batch_size=20, shuffle=True, seed=11, num_threads=threads,
                               prefetch=prefetch)
        loader.set_epoch(5)
        got = batches_as_arrays(loader)
        if ref is None:
            ref = got
        else:
            assert_same_batches(got, ref)
    # and the content is right: padding, lengths, the fixed fields
    for b in ref:
        for j, label in enumerate(b["label"].tolist()):
            s = samples[label]
            n = len(s["tok"])
            assert b["tok_lengths"][j] == n
            assert b["tok"][j, :n].tolist() == s["tok"].tolist()
            assert (b["tok"][j, n:] == 0).all()
            assert bytes(b["raw"][j, :b["raw_lengths"][j]].tolist()) == s["raw"]
            assert np.array_equal(b["x"][j].numpy(), s["x"])


def test_resume_mid_epoch_with_other_thread_count(small_ds):
    full = stoker.Loader(small_ds, batch_size=8, shuffle=True, seed=5, num_threads=2)
    full.set_epoch(2)
    want = epoch_labels(full)
    loader = stoker.Loader(small_ds, batch_size=8, shuffle=True, seed=5, num_threads=2)
    loader.set_epoch(2)
    it = iter(loader)
    first = [next(it)["label"].tolist() for _ in range(5)]
    state = loader.state_dict()
    assert state["epoch"] == 2 and state["position"] == 5 * 8  # global samples consumed
    del it
    resumed = stoker.Loader(small_ds, batch_size=8, shuffle=True, seed=5, num_threads=7,
                            prefetch=1)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # a training loop calls set_epoch again: the resume point holds
    rest = epoch_labels(resumed)
    assert first + rest == want
    # afterwards the next epoch starts from its beginning
    assert resumed.state_dict()["epoch"] == 3 and resumed.state_dict()["position"] == 0


def test_state_at_epoch_boundaries(small_ds):
    loader = stoker.Loader(small_ds, batch_size=10)
    assert loader.state_dict()["position"] == 0
    list(loader)
    s = loader.state_dict()
    assert (s["epoch"], s["position"]) == (1, 0)
    s["position"] = 100  # a complete epoch resumes at the next one
    other = stoker.Loader(small_ds, batch_size=10)
    other.load_state_dict(s)
    assert other.epoch == 2


def test_state_dict_refuses_other_settings(small_ds):
    state = stoker.Loader(small_ds, batch_size=10, seed=1).state_dict()
    with pytest.raises(ValueError, match="batch_size"):
        stoker.Loader(small_ds, batch_size=5, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        stoker.Loader(small_ds, batch_size=10, seed=2).load_state_dict(state)
    loader = stoker.Loader(small_ds, batch_size=10, seed=1)
    with pytest.raises(TypeError, match="state_dict"):
        loader.load_state_dict(None)
    for key, value in [("epoch", 2**63), ("epoch", "1"), ("position", -1)]:
        with pytest.raises(ValueError, match=f"state's {key} must be"):
            loader.load_state_dict({**state, key: value})
    # a state whose numbers went through NumPy or torch (a checkpoint) still resumes
    loader.load_state_dict({**state, "epoch": torch.tensor(2), "position": np.int64(30)})
    assert loader.state_dict()["epoch"] == 2 and len(epoch_labels(loader)) == 7


# -- memory: zero copy, kept batches, pool reuse --------------------------------

def test_kept_batches_stay_intact(small_ds):
    loader = stoker.Loader(small_ds, batch_size=4, num_threads=2, prefetch=2)
    kept = list(loader)  # many more batches than prefetch: the pool must grow
    assert len(kept) == 25
    for b in kept:
        for j, label in enumerate(b["label"].tolist()):
            assert (b["x"][j] == label % 256).all()
    assert loader.stats()["host_blocks"] >= 25


def test_slots_are_reused_when_batches_are_dropped(small_ds):
    loader = stoker.Loader(small_ds, batch_size=4, num_threads=2, prefetch=2)
    for _ in range(3):
        for _b in loader:
            pass
    assert loader.stats()["host_blocks"] <= 2 + 2 + 2  # in flight + idle, not one per batch


def test_tensors_alias_slot_memory(small_ds):
    loader = stoker.Loader(small_ds, batch_size=10, num_threads=1)
    b = next(iter(loader))
    x, label = b["x"], b["label"]
    # all tensors of a batch live in one buffer (the slot), at 64-byte aligned offsets
    lo = min(x.data_ptr(), label.data_ptr())
    hi = max(x.data_ptr() + x.nbytes, label.data_ptr() + label.nbytes)
    assert hi - lo < 4096
    assert x.data_ptr() % 64 == 0 and label.data_ptr() % 64 == 0


def test_batch_outlives_loader(small_ds):
    loader = stoker.Loader(small_ds, batch_size=10, num_threads=2)
    b = next(iter(loader))
    del loader
    gc.collect()
    assert b["label"].tolist() == list(range(10))


# -- errors and shutdown --------------------------------------------------------

def test_worker_error_surfaces_at_its_batch_and_loader_recovers(tmp_path):
    ds = write_dataset(tmp_path / "d", 40, shard_size="1MB")
    corrupt_record(ds, 23)
    ds = stoker.Dataset(tmp_path / "d")
    loader = stoker.Loader(ds, batch_size=4, num_threads=3)
    it = iter(loader)
    got = []
    with pytest.raises(stoker.DataError, match=r"shard-00000.stk: record 23: checksum mismatch"):
        for b in it:
            got.append(b["label"].tolist())
    assert got == [list(range(i, i + 4)) for i in range(0, 20, 4)]  # batches 0..4, then 5 fails
    # As DataLoader's: the failed batch is consumed, and the iterator goes on after it
    assert loader.state_dict()["position"] == 24
    rest = [b["label"].tolist() for b in it]
    assert rest == [list(range(i, i + 4)) for i in range(24, 40, 4)]
    # a new iteration works again, and fails at the same place
    loader.set_epoch(0)
    again = iter(loader)
    assert [next(again)["label"].tolist() for _ in range(5)] == got
    with pytest.raises(stoker.DataError, match="record 23"):
        next(again)


def test_a_new_iterator_after_a_failed_batch_starts_the_next_epoch(tmp_path):
    ds = write_dataset(tmp_path / "d", 40, shard_size="1MB")
    corrupt_record(ds, 23)
    ds = stoker.Dataset(tmp_path / "d")
    loader = stoker.Loader(ds, batch_size=4, num_threads=2, shuffle=True, seed=5)
    plain = stoker.Loader(stoker.Dataset(tmp_path / "d"), batch_size=4, shuffle=True, seed=5,
                          on_error="skip")
    plain.set_epoch(1)
    with pytest.warns(RuntimeWarning):
        want = [b["label"].tolist() for b in plain]
    errors = []
    try:
        for _ in loader:
            pass
    except stoker.DataError as e:
        errors.append(e)  # the error (and its traceback, and the iterator) kept alive
    assert len(errors) == 1 and loader.epoch == 1
    # as after a break: the loop's next epoch, whole (the failed iterator is closed)
    got = []
    with pytest.raises(stoker.DataError):
        for b in loader:
            got.append(b["label"].tolist())
    assert got == want[:len(got)] and len(got) < len(want)


def test_on_error_skip_replaces_and_warns(tmp_path):
    ds = write_dataset(tmp_path / "d", 40, shard_size="1MB")
    corrupt_record(ds, 23)
    ds = stoker.Dataset(tmp_path / "d")
    outs = []
    for threads in (1, 4):
        loader = stoker.Loader(ds, batch_size=4, num_threads=threads, on_error="skip")
        with pytest.warns(RuntimeWarning, match="replaced 1 unreadable sample"):
            labels = sum(epoch_labels(loader), [])
        assert loader.stats()["skipped"] == 1
        outs.append(labels)
    assert outs[0] == outs[1]
    assert outs[0][23] == 24 and len(outs[0]) == 40  # the next valid sample took its place
    # the warning names the loop's line, not stoker's iterator
    with pytest.warns(RuntimeWarning, match="replaced 1 unreadable sample") as said:
        for _ in stoker.Loader(ds, batch_size=4, on_error="skip"):
            pass
    assert [w.filename for w in said] == [__file__]


def test_break_and_del_stop_all_threads(small_ds):
    base = settled_thread_count()
    loader = stoker.Loader(small_ds, batch_size=2, num_threads=4, prefetch=2)
    for i, _b in enumerate(loader):
        if i == 1:
            break
    gc.collect()
    deadline = time.time() + 2
    while thread_count() > base and time.time() < deadline:
        time.sleep(0.01)
    assert thread_count() == base
    it = iter(loader)
    next(it)
    it2 = iter(loader)  # a second iterator runs on its own; the first one goes on
    assert next(it)["label"].tolist() == [2, 3]
    assert next(it2)["label"].tolist() == [0, 1]
    del it, it2, loader
    gc.collect()
    assert thread_count() == base


def test_keyboard_interrupt_in_loop_stops_workers(small_ds):
    base = settled_thread_count()
    loader = stoker.Loader(small_ds, batch_size=1, num_threads=4, prefetch=2)
    t0 = time.time()
    try:
        for _b in loader:
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    while thread_count() > base and time.time() - t0 < 1.0:
        time.sleep(0.01)
    assert thread_count() == base


def test_fork_child_gets_clear_error_and_can_make_its_own(small_ds):
    loader = stoker.Loader(small_ds, batch_size=10, num_threads=2)
    it = iter(loader)
    next(it)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            try:
                next(it)
                code = 2
            except RuntimeError as e:
                code = 3 if "another process" in str(e) else 4
            if code == 3:
                child = stoker.Loader(stoker.Dataset(small_ds.path), batch_size=10,
                                      num_threads=2)
                labels = sum(epoch_labels(child), [])
                code = 0 if labels == list(range(100)) else 5
        finally:
            os.write(w, bytes([code]))
            os._exit(0)
    os.close(w)
    code = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert code == b"\x00", code
    assert [b["label"].tolist() for b in it][0] == list(range(10, 20))


def test_stats_report_progress(small_ds):
    loader = stoker.Loader(small_ds, batch_size=10, num_threads=2)
    list(loader)
    s = loader.stats()
    assert s["batches"] == 10 and s["samples"] == 100
    assert s["bytes_read"] == 100 * (48 + 8)
    for key in ("read_seconds", "decode_seconds", "wait_seconds", "queue_depth"):
        assert key in s
    # throughput over the time iterators were open, kept once they are gone
    assert s["run_seconds"] > 0
    assert s["samples_per_second"] == pytest.approx(100 / s["run_seconds"])
    it = iter(loader)
    next(it)
    live = loader.stats()
    assert live["samples"] > 100 and live["run_seconds"] > s["run_seconds"]
    assert live["samples_per_second"] == pytest.approx(live["samples"] / live["run_seconds"])


def test_dataset_path_accepted(small_ds):
    assert len(stoker.Loader(small_ds.path, batch_size=10)) == 10


def test_workers_never_preempt_the_consumer(small_ds):
    """NOTE [ Worker scheduling ]: workers run under SCHED_BATCH."""
    settled_thread_count()  # no workers of other tests' loaders
    consumer = os.sched_getscheduler(0)
    loader = stoker.Loader(small_ds, batch_size=10, num_threads=2, prefetch=2)
    it = iter(loader)
    next(it)  # the window is full again at once: the workers wait, alive
    # on a busy machine a worker may not have run its first line yet: wait for its name,
    # which it takes after its scheduling policy
    deadline = time.monotonic() + 10
    while True:
        tids = [t for t, name in thread_table().items() if name.startswith("stoker-worker")]
        if len(tids) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert len(tids) == 2
    assert all(os.sched_getscheduler(t) == os.SCHED_BATCH for t in tids)
    assert os.sched_getscheduler(0) == consumer  # the consumer is left as it was
    it.close()
