"""Loader(verify=...): a record's checksum is checked the first time a process reads it
(verify="first", the default: NOTE [ Verified once ] in csrc/format/shard_reader.h), or on
every read (verify="always"). Corruption is reported with the shard's path and record."""

import os

import pytest
import stoker
from conftest import corrupt_record, write_dataset


def epoch(loader, e=0):
    loader.set_epoch(e)
    return [b["label"].tolist() for b in loader]


@pytest.mark.parametrize("verify", ["first", "always"])
def test_a_corrupt_record_is_reported_on_its_first_read(tmp_path, verify):
    ds = write_dataset(tmp_path / "ds", 40, shard_size="1MB")
    corrupt_record(ds, 17)
    ds = stoker.Dataset(tmp_path / "ds")
    loader = stoker.Loader(ds, batch_size=8, num_threads=2, verify=verify)
    path = os.path.join(ds.path, ds.shards[0]["path"])
    with pytest.raises(stoker.DataError, match=r"record 17: checksum mismatch") as e:
        epoch(loader)
    assert path in str(e.value)
    # on_error="skip" passes over it in both modes, and counts it
    skip = stoker.Loader(ds, batch_size=8, num_threads=2, verify=verify, on_error="skip")
    with pytest.warns(RuntimeWarning, match="replaced 1 unreadable"):
        labels = [x for b in epoch(skip) for x in b]
    assert 17 not in labels and len(labels) == 40


def test_verified_once_then_always_on_every_read(tmp_path):
    ds = write_dataset(tmp_path / "ds", 40, shard_size="1MB")
    # (no next-epoch prefetch: epoch 1 is read after the damage below)
    first = stoker.Loader(ds, batch_size=8, num_threads=2, prefetch_next_epoch=False)
    always = stoker.Loader(ds, batch_size=8, num_threads=2, verify="always",
                           prefetch_next_epoch=False)
    assert first.plan.records.verify == "first"
    assert "verify='always'" in str(always.plan)
    want = epoch(first)
    assert epoch(always) == want  # every record read (and verified) once in this process
    # A record damaged under the mapping after its first read: verify="always" hashes it
    # again and says so; verify="first" does not hash it again (what it saves).
    corrupt_record(ds, 17)
    with pytest.raises(stoker.DataError, match="record 17"):
        epoch(always, 1)
    assert sorted(x for b in epoch(first, 1) for x in b) == list(range(40))
    # A new process (a new mapping) verifies every record again on its first read.
    fresh = stoker.Loader(stoker.Dataset(tmp_path / "ds"), batch_size=8, num_threads=1)
    with pytest.raises(stoker.DataError, match="record 17"):
        epoch(fresh)


def test_verify_argument_is_checked(small_ds):
    with pytest.raises(ValueError, match="verify must be 'first'"):
        stoker.Loader(small_ds, batch_size=4, verify="never")
    with pytest.raises(ValueError, match="map-style"):
        stoker.Loader(list(range(8)), batch_size=4, verify="always")
