"""The Python stage (NOTE [ Python stage ] in stoker/_python_stage.py): its pieces, then
map / batch_map / collate_fn / map-style datasets through the Loader."""

import threading
import time
import weakref

import numpy as np
import pytest
import torch
from stoker._python_stage import (
    MapStyleSource,
    StagePool,
    add_note,
    batch_rng,
    normalize_item,
    rng_keys,
    sample_rng,
)

# -- pieces ------------------------------------------------------------------------------


def test_sample_rng_depends_only_on_seed_epoch_index():
    a = sample_rng(7, 2, 1000).random(8)
    assert np.array_equal(a, sample_rng(7, 2, 1000).random(8))
    for other in (sample_rng(8, 2, 1000), sample_rng(7, 3, 1000), sample_rng(7, 2, 1001)):
        assert not np.array_equal(a, other.random(8))
    assert isinstance(sample_rng(0, 0, 0), np.random.Generator)
    # vectorised keys are the per-sample ones
    keys = rng_keys(7, 2, np.arange(995, 1005))
    assert np.array_equal(keys[5], rng_keys(7, 2, [1000])[0])
    # a batch's generator is another stream than any sample's
    assert not np.array_equal(batch_rng(7, 2, 0, 1, 1000).random(8), a)
    assert not np.array_equal(batch_rng(7, 2, 0, 1, 3).random(4),
                              batch_rng(7, 2, 1, 2, 3).random(4))


def test_sample_rng_streams_are_independent():
    # neighbouring indices (what a batch holds) give uncorrelated streams
    draws = np.stack([sample_rng(0, 0, i).random(64) for i in range(256)])
    corr = np.corrcoef(draws)
    off = corr[~np.eye(256, dtype=bool)]
    assert np.abs(off).max() < 0.6 and abs(off.mean()) < 0.02
    assert abs(draws.mean() - 0.5) < 0.01


def test_normalize_item():
    assert normalize_item({"a": 1}, None, "x") == {"a": 1}
    assert normalize_item((1, 2), None, "x") == {0: 1, 1: 2}
    assert normalize_item([1, 2], ["img", "y"], "x") == {"img": 1, "y": 2}
    t = torch.zeros(2)
    assert normalize_item(t, None, "x")[0] is t
    assert normalize_item(t, ["x"], "x")["x"] is t
    with pytest.raises(ValueError, match="dataset index 3: the item has 2 value.*names= gives 3"):
        normalize_item((1, 2), ["a", "b", "c"], "dataset index 3")
    with pytest.raises(TypeError, match="names="):
        normalize_item({"a": 1}, ["a"], "x")
    with pytest.raises(ValueError, match="repeated"):
        MapStyleSource([], names=["a", "a"])


def test_add_note_keeps_the_exception_and_its_traceback():
    def fn():
        raise KeyError("box")

    try:
        fn()
    except KeyError as e:
        err = e
    tb = err.__traceback__
    assert add_note(err, "stoker: map failed for sample 3") is err
    assert err.__traceback__ is tb
    assert "stoker: map failed for sample 3" in err.__notes__


class _Counter:
    def __init__(self):
        self.calls = {}
        self.lock = threading.Lock()

    def handle(self, slot):
        with self.lock:
            self.calls[slot] = self.calls.get(slot, 0) + 1


def _wait(slot):
    time.sleep(0.002)
    return slot


def test_pool_threads_named_parked_stopped_and_collected():
    owner = _Counter()
    pool = StagePool(owner, _wait, "handle", 3)
    pool.start()
    names = {t.name for t in threading.enumerate()}
    assert {"stoker-python-0", "stoker-python-1", "stoker-python-2"} <= names
    time.sleep(0.05)
    assert set(owner.calls) == {0, 1, 2}
    pool.set_active(1)
    time.sleep(0.05)
    before = dict(owner.calls)
    time.sleep(0.05)
    assert owner.calls[0] > before[0]
    assert owner.calls[1] == before[1] and owner.calls[2] == before[2]  # parked
    pool.set_active(3)
    time.sleep(0.05)
    assert owner.calls[2] > before[2]
    pool.stop()
    assert pool.alive() == 0
    pool.start()  # again after stop
    assert pool.alive() == 3
    ref = weakref.ref(owner)
    del owner
    deadline = time.monotonic() + 2
    while pool.alive() and time.monotonic() < deadline:  # the owner is gone: threads end
        time.sleep(0.01)
    assert ref() is None and pool.alive() == 0
