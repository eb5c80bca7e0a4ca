"""Loader(verify=...): a record's checksum is checked the first time a process reads it
and again once its file changed (verify="first", the default: NOTE [ Verified once ] in
csrc/format/shard_reader.h), on every read (verify="always", and "first" on format-1
shards), or the first time for every format (verify="once"). Corruption is reported with
the shard's path and record. Each test proves one sentence of docs/storage.md's "What
verify catches"."""

import os
import shutil
import struct
import time
from pathlib import Path

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


def test_verified_once_then_again_after_the_file_changed(tmp_path):
    """A record changed in place (same size, header intact) after its epoch: "always"
    hashes it again on its next read, "first" stats the file at the next epoch and hashes
    it again, and both raise naming it; a new process too."""
    ds = write_dataset(tmp_path / "ds", 40, shard_size="1MB")
    # (no next-epoch prefetch: epoch 1 is read after the damage below)
    first = stoker.Loader(ds, batch_size=8, num_threads=2, prefetch_next_epoch=False)
    always = stoker.Loader(ds, batch_size=8, num_threads=2, verify="always",
                           prefetch_next_epoch=False)
    assert first.plan.records.verify == "first"
    assert "verify='always'" in str(always.plan)
    want = epoch(first)
    assert epoch(always) == want  # every record read (and verified) once in this process
    corrupt_record(ds, 17)
    with pytest.raises(stoker.DataError, match="record 17"):
        epoch(always, 1)
    with pytest.raises(stoker.DataError, match="record 17: changed on disk while in use"):
        epoch(first, 1)
    # A new process (a new mapping) verifies every record again on its first read.
    fresh = stoker.Loader(stoker.Dataset(tmp_path / "ds"), batch_size=8, num_threads=1)
    with pytest.raises(stoker.DataError, match="record 17"):
        epoch(fresh)
    corrupt_record(ds, 17)  # as it was: read again without a word
    assert epoch(first, 2) == want


def test_a_change_after_epoch_0_raises_in_epoch_1_with_every_default(tmp_path):
    """The default loader (next-epoch prefetch on) and its worker processes: a record of
    the end of epoch 1's order changed after epoch 0 raises in epoch 1."""
    ds = write_dataset(tmp_path / "ds", 400, shard_size="1MB")
    plain = stoker.Loader(ds, batch_size=8, num_threads=2)
    workers = stoker.Loader(ds, batch_size=8, num_workers=2, python_workers="process",
                            map=lambda s, rng: s, prefetch_next_epoch=False)
    for ld in (plain, workers):
        assert sorted(x for b in epoch(ld) for x in b) == list(range(400))
    corrupt_record(ds, 397)  # in the last batch of the unshuffled epoch 1
    for ld in (plain, workers):
        with pytest.raises(stoker.DataError, match="record 397: changed on disk"):
            epoch(ld, 1)


def test_a_touch_costs_a_hash_and_nothing_else(tmp_path):
    ds = write_dataset(tmp_path / "ds", 40, shard_size="1MB")
    ld = stoker.Loader(ds, batch_size=8, num_threads=2)
    want = epoch(ld)
    os.utime(os.path.join(ds.path, ds.shards[0]["path"]))
    assert epoch(ld, 1) == want


def shard_record(ds, index):
    """(shard file, record in it) of dataset index `index`."""
    for s in ds.shards:
        if index < s["num_records"]:
            return os.path.join(ds.path, s["path"]), index
        index -= s["num_records"]
    raise IndexError(index)


def flip_last_byte(ds, index):
    """Flips the last payload byte of sample `index`, in place (the record table found
    from the footer: any format version)."""
    path, record = shard_record(ds, index)
    with open(path, "r+b") as f:
        f.seek(-32, os.SEEK_END)
        table, _ = struct.unpack("<QQ", f.read(16))
        f.seek(table + 16 * record)
        offset, length, _ = struct.unpack("<QII", f.read(16))
        f.seek(offset + length - 1)
        b = f.read(1)
        f.seek(offset + length - 1)
        f.write(bytes([b[0] ^ 0xFF]))


V1_FIXTURE = Path(__file__).parent / "data" / "v1_dataset"


def v1_dataset(tmp_path):
    dst = tmp_path / "v1"
    shutil.copytree(V1_FIXTURE, dst, ignore=shutil.ignore_patterns("README*"))
    with pytest.warns(UserWarning, match="version 1"):
        return stoker.Dataset(dst)


def read_twice(ds, index, verify, pause=0.0):
    """Sample `index` read twice in one epoch, its record changed in place between the
    reads (by map, after the first), after a record of its shard was read twice (so its
    file was checked this epoch): (the second read's sample or the DataError it raised,
    the next epoch's DataError or None). A sampler names the samples; no workers: the
    reads run in order. With `pause`, map waits that long after the change, and 40 other
    samples come between the reads (their batches are planned after the pause)."""
    seen = []

    def change(sample, rng):
        seen.append(1)
        if len(seen) == 3:
            flip_last_byte(ds, index)
            time.sleep(pause)
        return sample

    other = index - 1
    between = [other] * (40 if pause else 0)
    ld = stoker.Loader(ds, batch_size=1, sampler=[other, other, index] + between + [index],
                       num_workers=0, map=change, verify=verify, collate_fn=lambda b: b[0],
                       prefetch=2)
    try:
        second = list(ld)[-1]
    except stoker.DataError as e:
        second = e
    try:
        list(ld)
        later = None
    except stoker.DataError as e:
        later = e
    return second, later


@pytest.mark.parametrize("case", ["format 2, first", "format 2, once", "format 2, always",
                                  "format 2, first, a second later", "format 1, first",
                                  "format 1, once", "format 1, always"])
def test_what_a_change_within_an_epoch_meets(tmp_path, case):
    """A record changed between two reads of one epoch: "always" hashes every read, and so
    does "first" on a format-1 shard (its header cannot tell a rewrite); "first" on format
    2 and "once" look at the file once an epoch and once a second while batches are
    planned, so the second read within the second gives the new bytes, unverified, and one
    of a batch planned a second later raises."""
    fmt, verify = case.split(", ")[:2]
    later = case.endswith("a second later")
    ds = v1_dataset(tmp_path) if fmt == "format 1" else write_dataset(tmp_path / "ds", 12)
    second, next_epoch = read_twice(ds, 7, verify, pause=1.2 if later else 0.0)
    assert isinstance(next_epoch, stoker.DataError) and "record 7" in str(next_epoch)
    if verify == "always" or later or (fmt == "format 1" and verify == "first"):
        assert isinstance(second, stoker.DataError) and "record 7" in str(second), second
    else:  # the new bytes, not hashed: what verify="always" is for
        assert not isinstance(second, Exception), second


def test_verify_argument_is_checked(small_ds):
    assert stoker.Loader(small_ds, batch_size=4, verify="once").plan.records.verify == "once"
    with pytest.raises(ValueError, match="verify must be 'first'"):
        stoker.Loader(small_ds, batch_size=4, verify="never")
    with pytest.raises(ValueError, match="map-style"):
        stoker.Loader(list(range(8)), batch_size=4, verify="always")
