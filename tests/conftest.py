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


def epoch_labels(loader):
    return [b["label"].tolist() for b in loader]
