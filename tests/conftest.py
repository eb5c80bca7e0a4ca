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


class FakeDeviceLoader(stoker.Loader):
    """A Loader whose device is the host fake (``_core.fake_device``): the real transfer
    engine, copy thread, events and device buffer pool, with "device" memory in host
    memory (CPU tensors). Pass ``device="cuda"``."""

    copy_delay_us = 0

    def _open_device(self, index):
        return stoker._core.fake_device(self.copy_delay_us)


def fake_device_loader(ds, delay_us=0, **kw):
    cls = type("FakeDeviceLoaderWithDelay", (FakeDeviceLoader,), {"copy_delay_us": delay_us})
    return cls(ds, device="cuda", **kw)


def stoker_threads():
    return [n for n in thread_names() if n.startswith("stoker-")]


def settled_thread_count(timeout=5.0) -> int:
    """Threads of this process once every dropped loader's workers have ended."""
    import gc
    import time

    gc.collect()
    deadline = time.monotonic() + timeout
    while stoker_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return thread_count()


def dataset_content(path):
    """What two writes of the same samples share (all but each write's random dataset id):
    the schema, the metadata, the shard boundaries and record tables, every record's bytes."""
    ds = stoker.Dataset(path)
    return {"fields": {n: f.spec() for n, f in ds.fields.items()}, "metadata": ds.metadata,
            "shards": [(s["num_records"], s["bytes"], s["table_checksum"]) for s in ds.shards],
            "records": [ds._core.read(i) for i in range(len(ds))]}
