"""Loader(..., shuffle=True, shard_window=N): the shard-window order, through the loader.

The order is stated here in plain Python from its definition (NOTE [ Shard windows ] in
csrc/sampler/shard_windows.h), with the sampler's keyed permutation as the reference
module has it: the shards in a keyed order, cut into windows of N, the records of each
window in a keyed order, window after window.
"""

import bisect
import pickle

import numpy as np
import pytest
import stoker
from _token_reference import Permutation, hash_combine
from conftest import epoch_labels, write_dataset

SEED = 3


@pytest.fixture
def ds(tmp_path):
    # 150 samples of 64 bytes in shards of about 12 records: 13 shards, the last shorter.
    return write_dataset(tmp_path / "ds", 150, shard_size="1KB")


def shard_records(ds):
    return [s["num_records"] for s in ds.shards]


def shard_of(ds, i):
    starts = np.cumsum([0] + shard_records(ds))
    return bisect.bisect_right(starts, i) - 1


def reference(records, window, seed, epoch):
    """(order: position -> dataset index, windows: the shards of each window)."""
    key = hash_combine(seed, epoch)
    first = np.cumsum([0] + records).tolist()
    slots = Permutation(len(records), hash_combine(key, 0x7368617264))  # "shard"
    per = min(window, len(records))
    order, windows = [], []
    for w, lo in enumerate(range(0, len(records), per)):
        shards = [slots(j) for j in range(lo, min(lo + per, len(records)))]
        samples = [first[s] + r for s in shards for r in range(records[s])]
        mix = Permutation(len(samples), hash_combine(hash_combine(key, 0x77696E646F77), w))
        order += [samples[mix(p)] for p in range(len(samples))]
        windows.append(shards)
    return order, windows


def flat(batches):
    return [i for b in batches for i in b]


def test_dataset_has_several_shards(ds):
    records = shard_records(ds)
    assert len(records) >= 8 and len(set(records)) > 1  # an uneven last shard


@pytest.mark.parametrize("window", [1, 3, 8, 100])
def test_epochs_follow_the_shard_window_order(ds, window):
    records = shard_records(ds)
    loader = stoker.Loader(ds, batch_size=7, shuffle=True, seed=SEED, shard_window=window,
                           num_threads=1)
    orders = []
    for epoch in range(2):
        got = flat(epoch_labels(loader))
        assert sorted(got) == list(range(len(ds)))  # every sample once
        assert got == reference(records, window, SEED, epoch)[0]
        orders.append(got)
    assert orders[0] != orders[1]
    assert len(loader) == len(stoker.Loader(ds, batch_size=7, shuffle=True))


def test_same_order_for_any_thread_count(ds):
    def order(threads, seed=SEED):
        loader = stoker.Loader(ds, batch_size=5, shuffle=True, seed=seed, shard_window=2,
                               num_threads=threads, prefetch=3)
        loader.set_epoch(4)
        return epoch_labels(loader)

    one = order(1)
    assert order(2) == one
    assert order(1, seed=SEED + 1) != one


def test_default_is_the_global_shuffle_unchanged(ds):
    # shard_window=None: the permutation of the whole epoch keyed by (seed, epoch)
    perm = Permutation(len(ds), hash_combine(SEED, 1))
    loader = stoker.Loader(ds, batch_size=16, shuffle=True, seed=SEED, shard_window=None)
    loader.set_epoch(1)
    assert flat(epoch_labels(loader)) == [perm(q) for q in range(len(ds))]
    windowed = stoker.Loader(ds, batch_size=16, shuffle=True, seed=SEED, shard_window=100)
    windowed.set_epoch(1)
    assert flat(epoch_labels(windowed)) != [perm(q) for q in range(len(ds))]


@pytest.mark.parametrize("window", [1, 2, 3])
def test_batches_come_window_by_window(ds, window):
    loader = stoker.Loader(ds, batch_size=8, shuffle=True, seed=SEED, shard_window=window)
    loader.set_epoch(2)
    got = flat(epoch_labels(loader))
    shards = [shard_of(ds, i) for i in got]
    # A shard is in use from its first sample to its last: never more than N at once.
    first, last = {}, {}
    for q, s in enumerate(shards):
        first.setdefault(s, q)
        last[s] = q
    for q in range(len(got)):
        assert sum(first[s] <= q <= last[s] for s in first) <= window
    # The windows: the first samples read exactly the first window's shards, and so on.
    _, windows = reference(shard_records(ds), window, SEED, 2)
    at = 0
    for w in windows:
        size = sum(shard_records(ds)[s] for s in w)
        assert set(shards[at:at + size]) == set(w)
        at += size
    assert at == len(got)


def test_resume_mid_epoch_with_other_thread_count(ds):
    def make(threads):
        return stoker.Loader(ds, batch_size=6, shuffle=True, seed=SEED, shard_window=3,
                             num_threads=threads)

    full = make(1)
    full.set_epoch(1)
    want = epoch_labels(full)
    loader = make(1)
    loader.set_epoch(1)
    it = iter(loader)
    first = [next(it)["label"].tolist() for _ in range(9)]
    state = loader.state_dict()
    del it
    assert state["shard_window"] == 3 and state["position"] == 9 * 6
    resumed = make(2)
    resumed.load_state_dict(state)
    assert first + epoch_labels(resumed) == want


def test_resume_at_another_world_size_and_skip(ds):
    n, batch = len(ds), 4

    def loader(rank, world):
        return stoker.Loader(ds, batch_size=batch, shuffle=True, seed=SEED, shard_window=2,
                             rank=rank, world_size=world, num_threads=1)

    order = reference(shard_records(ds), 2, SEED, 0)[0]
    # Two ranks take 5 batches each (rank r: positions r, r + 2, ...).
    for r in range(2):
        it = iter(loader(r, 2))
        got = flat(next(it)["label"].tolist() for _ in range(5))
        assert got == [order[r + 2 * j] for j in range(20)]
    # The state after them (skip: the same point, without reading) resumes on three ranks.
    state = loader(0, 2).skip(5).state_dict()
    assert state["position"] == 2 * 5 * batch
    rest = []
    for r in range(3):
        resumed = loader(r, 3)
        resumed.load_state_dict(state)
        got = flat(epoch_labels(resumed))
        assert got[:3] == [order[40 + r + 3 * j] for j in range(3)]
        rest += got
    left = n - 40
    padding = -left % 3  # DistributedSampler's padding, from the first unconsumed sample
    assert sorted(rest) == sorted(order[40:] + order[40:40 + padding])


def test_state_with_another_shard_window_is_refused(ds):
    state = stoker.Loader(ds, batch_size=10, shuffle=True, shard_window=2).state_dict()
    for other in (3, None):
        loader = stoker.Loader(ds, batch_size=10, shuffle=True, shard_window=other)
        with pytest.raises(ValueError, match=rf"shard_window=2 but this loader has "
                                             rf"shard_window={other}"):
            loader.load_state_dict(state)
    # a state without the key is refused, naming it (every field is checked: a tampered
    # state is never taken as a global shuffle)
    old = stoker.Loader(ds, batch_size=10, shuffle=True).state_dict()
    del old["shard_window"]
    with pytest.raises(ValueError, match="no 'shard_window'"):
        stoker.Loader(ds, batch_size=10, shuffle=True).load_state_dict(old)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", 2**63])
def test_bad_shard_window_refused(ds, bad):
    with pytest.raises(ValueError, match="shard_window must be"):
        stoker.Loader(ds, shuffle=True, shard_window=bad)


def test_integer_types_accepted(ds):
    assert stoker.Loader(ds, shuffle=True, shard_window=np.int64(2)).shard_window == 2


def test_shard_window_needs_shuffle(ds):
    with pytest.raises(ValueError, match="shard_window needs shuffle=True"):
        stoker.Loader(ds, shard_window=2)


def test_token_batches_refuse_shard_window(tmp_path):
    path = tmp_path / "train.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    tokens = stoker.TokenDataset(str(path), dtype="uint16")
    with pytest.raises(ValueError, match="shard_window applies to record datasets"):
        stoker.Loader(tokens, batch_size=2, seq_len=8, shuffle=True, shard_window=2)


def test_pickle_and_repr_keep_shard_window(ds):
    loader = stoker.Loader(ds, batch_size=10, shuffle=True, seed=SEED, shard_window=4)
    assert "shard_window=4" in repr(loader)
    assert "shard_window" not in repr(stoker.Loader(ds, batch_size=10, shuffle=True))
    it = iter(loader)
    next(it)
    copy = pickle.loads(pickle.dumps(loader))
    assert copy.shard_window == 4
    del it
    # the copy resumes where the original stood, in the same order
    want = reference(shard_records(ds), 4, SEED, 0)[0]
    assert flat(epoch_labels(copy)) == want[10:]
