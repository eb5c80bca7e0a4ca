"""The loader's resume state (stoker/_loader_state.py): typed, each field checked on
load_state_dict (type, range, presence), each stateful part under its own key."""

import pytest
import stoker
from conftest import write_dataset


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("state") / "ds", 30, shard_size="1KB")


def _mid_epoch_state(loader):
    it = iter(loader)
    next(it)
    next(it)
    state = loader.state_dict()
    it.close()
    return state


def test_state_round_trips_as_a_typed_state(ds):
    loader = stoker.Loader(ds, batch_size=4, shuffle=True, seed=5, num_threads=1)
    state = _mid_epoch_state(loader)
    typed = loader.state()
    assert typed.to_dict() == state
    assert (typed.epoch, typed.position, typed.world_size) == (0, 8, 1)
    fresh = stoker.Loader(ds, batch_size=4, shuffle=True, seed=5, num_threads=2)
    fresh.load_state_dict(state)
    rest = [b["label"].tolist() for b in fresh]
    whole = [b["label"].tolist() for b in stoker.Loader(ds, batch_size=4, shuffle=True, seed=5)]
    assert rest == whole[2:]


@pytest.mark.parametrize("key", ["world_size", "even_batches", "shard_window", "seed",
                                 "shuffle", "batch_size", "drop_last", "epoch", "position"])
@pytest.mark.parametrize("how", ["deleted", "None", "wrong type"])
def test_a_tampered_state_is_refused(ds, key, how):
    loader = stoker.Loader(ds, batch_size=4, shuffle=True, seed=5, num_threads=1)
    state = _mid_epoch_state(loader)
    if how == "deleted":
        del state[key]
    elif how == "None":
        if state[key] is None:  # shard_window is None here: a wrong value instead
            state[key] = 3
        else:
            state[key] = None
    else:
        state[key] = "1" if not isinstance(state[key], str) else 1
    other = stoker.Loader(ds, batch_size=4, shuffle=True, seed=5, num_threads=1)
    with pytest.raises(ValueError, match=f"{key}|cannot resume"):
        other.load_state_dict(state)


def test_a_scheduled_mixture_keeps_its_part(tmp_path):
    a = write_dataset(tmp_path / "a", 20, shard_size="1KB")
    b = write_dataset(tmp_path / "b", 20, shard_size="1KB")
    mix = stoker.Mix({"a": a, "b": b}, weights=[(0, {"a": 1, "b": 0}), (3, {"a": 0, "b": 1})],
                     samples_per_epoch=40)
    loader = stoker.Loader(mix, batch_size=4, num_threads=1)
    state = _mid_epoch_state(loader)
    assert state["mix"] == {"rows_per_step": 4}
    for bad in ({}, {"rows_per_step": None}, {"rows_per_step": 0}, None):
        tampered = dict(state)
        if bad is None:
            del tampered["mix"]
        else:
            tampered["mix"] = bad
        with pytest.raises(ValueError, match="mix|rows_per_step"):
            stoker.Loader(mix, batch_size=4, num_threads=1).load_state_dict(tampered)
    # constant weights keep no part
    const = stoker.Loader(stoker.Mix({"a": a, "b": b}, weights={"a": 1, "b": 1}), batch_size=4)
    assert "mix" not in _mid_epoch_state(const)
