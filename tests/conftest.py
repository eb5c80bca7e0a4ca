import os

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


def epoch_labels(loader):
    return [b["label"].tolist() for b in loader]
