"""The Python stage in worker processes (python_workers="process", NOTE [ Python stage
processes ] in stoker/_stage/processes.py): the same batches as threads, errors and skips
from the workers, a worker that dies, lifetime, arrays through memfd arenas, and a script
without a __main__ guard."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import stoker
import torch
from stoker._stage import processes as _process_workers
from test_python_stage import (
    CROP,
    JITTER_FIELDS,
    BoxError,
    Squares,
    failing_map,
    img_ds,  # noqa: F401 (fixture)
    jitter,
    same_batches,
    slow_map,
    yolo_collate,
)


def test_same_batches_as_threads(img_ds):  # noqa: F811
    kw = dict(batch_size=7, shuffle=True, seed=3, transforms=CROP, map=jitter,
              map_fields=JITTER_FIELDS, num_threads=2)
    threads = stoker.Loader(img_ds, **kw)
    procs = stoker.Loader(img_ds, python_workers="process", **kw)
    for e in range(2):
        threads.set_epoch(e)
        procs.set_epoch(e)
        same_batches(list(procs), list(threads))
    pids = procs._stage.workers.pids()
    assert len(pids) == 2 and os.getpid() not in pids
    procs.close()
    for pid in pids:  # close() ended and reaped them
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_map_style_dataset_and_collate_fn_in_processes():
    ds = Squares(22)
    want = list(torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=yolo_collate))
    got = list(stoker.Loader(ds, batch_size=4, collate_fn=yolo_collate,
                             python_workers="process", num_threads=2))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g[0], w[0]) and g[1:] == w[1:]
    named = list(stoker.Loader(Squares(kind="dict"), batch_size=5, python_workers="process"))
    assert named[0]["path"] == [f"{i}.png" for i in range(5)]
    assert torch.equal(named[1]["x"], torch.stack([Squares(kind="dict")[i]["x"]
                                                   for i in range(5, 10)]))


def test_error_from_a_worker_is_itself_with_its_traceback(img_ds):  # noqa: F811
    loader = stoker.Loader(img_ds, batch_size=8, map=failing_map, python_workers="process",
                           num_threads=2)
    with pytest.raises(BoxError, match="bad box in 13") as e:
        list(loader)
    notes = "\n".join(e.value.__notes__)
    assert "sample 13 (" in notes and "raised in Python worker process" in notes
    assert "in failing_map" in notes  # the worker's traceback, as text

    class Unpicklable(Exception):  # local: cannot be pickled back
        pass

    def bad(s, rng):
        raise Unpicklable("nope")

    with pytest.raises(RuntimeError, match="(?s)Unpicklable.*not picklable.*nope"):
        list(stoker.Loader(img_ds, batch_size=8, map=bad, python_workers="process"))


def test_skip_in_workers(img_ds):  # noqa: F811
    loader = stoker.Loader(img_ds, batch_size=8, map=failing_map, on_error="skip",
                           python_workers="process", num_threads=2)
    with pytest.warns(RuntimeWarning, match="replaced 2"):
        labels = [v for b in loader for v in b["label"].tolist()]
    assert labels[13] == 14 and labels[17] == 18 and len(labels) == 60


def test_a_killed_worker_fails_its_batch_and_is_replaced_once(img_ds):  # noqa: F811
    loader = stoker.Loader(img_ds, batch_size=4, map=slow_map, python_workers="process",
                           num_threads=2, prefetch=2)
    it = iter(loader)
    next(it)
    victim = loader._stage.workers.pids()[0]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"worker process 0 \(pid \d+\) was killed by signal "
                                           r"SIGKILL \(killed: out of memory\?\)"):
        for _ in it:
            pass
    assert victim not in loader._stage.workers.pids()
    assert len(list(loader)) == 15  # the next iter() started a new worker
    new = loader._stage.workers.pids()
    assert len(new) == 2 and victim not in new


def slower_map(s, rng):
    time.sleep(0.05)
    return {"label": s["label"]}


def test_a_worker_killed_with_two_chunks_queued_fails_once_and_hangs_nothing(img_ds):  # noqa: F811
    """Both stage threads of a worker wait on it (one for its reply, one for its turn)
    when it dies: both fail their batch with its exit status, nothing waits forever, and
    the next iter() runs a whole epoch."""
    loader = stoker.Loader(img_ds, batch_size=4, map=slower_map, python_workers="process",
                           num_threads=2, prefetch=4)
    it = iter(loader)
    next(it)
    w = loader._stage.workers._workers[0]
    deadline = time.monotonic() + 10
    while w.sent - w.received < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert w.sent - w.received >= 2  # a chunk in the worker, another queued behind it
    os.kill(w.pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker process 0 \(pid \d+\) was killed"):
        for _ in it:
            pass
    assert time.monotonic() - t0 < 30
    assert len(list(loader)) == 15
    assert w.pid not in loader._stage.workers.pids()
    loader.close()


def test_large_outputs_grow_the_arena(img_ds, monkeypatch):  # noqa: F811
    monkeypatch.setattr(_process_workers, "_ARENA_BYTES", 1 << 12)
    big = stoker.Loader(img_ds, batch_size=6, map=big_map, python_workers="process",
                        num_threads=2)
    for b in big:
        for row, label in zip(b["a"], b["label"].tolist()):
            assert row.shape == (300, 300) and bool((row == label).all())


def outsized_map(s, rng, flag):
    """While `flag` exists, the first batch's samples are 18 MB each."""
    n = 18 << 20 if int(s["label"]) < 4 and os.path.exists(flag) else 8
    return {"a": np.full(n, int(s["label"]), np.uint8), "label": s["label"]}


def arena_bytes(loader):
    return sum(a.resident() for w in loader._stage.workers._workers for a in w.arenas)


def test_arenas_give_back_what_outsized_chunks_took(img_ds, tmp_path):  # noqa: F811
    """Memory an outsized chunk took is given back once later chunks no longer need it
    (NOTE [ Python stage processes ])."""
    import functools

    flag = tmp_path / "big"
    flag.touch()
    loader = stoker.Loader(img_ds, batch_size=4, map=functools.partial(outsized_map,
                                                                        flag=str(flag)),
                           map_fields={"a": stoker.ndarray("uint8", (None,))},
                           python_workers="process", num_threads=2)
    first = list(loader)
    assert first[0]["a"].shape == (4, 18 << 20) and first[1]["a"].shape == (4, 8)
    del first
    took = arena_bytes(loader)
    assert took >= 36 << 20  # two samples of 18 MB per chunk, in some worker's arena
    flag.unlink()  # the next epoch's first batch may already be mapped: big once more
    # An arena gives back what the worker's last 64 chunks did not need in it when it is
    # next written; every 16th lease takes the arena idle longest: 20 epochs (about 320
    # chunks a worker, 5 or 6 arenas each) write every arena after that horizon.
    for e in range(20):
        for b in loader:
            assert e == 0 or b["a"].shape == (4, 8)
    assert arena_bytes(loader) < 4 << 20, (took, arena_bytes(loader))
    loader.close()


def big_map(s, rng):
    return {"a": np.full((300, 300), int(s["label"]), np.float32), "label": s["label"]}


def tagged_map(s, rng):
    """Every array of the output holds the sample's label: a row overwritten by a later
    chunk shows."""
    label = int(s["label"])
    return {"a": np.full((40, 40), label, np.float32), "meta": np.full(3, label, np.int64),
            "label": s["label"]}


def test_rows_are_not_overwritten_by_later_chunks(img_ds):  # noqa: F811
    """Rows are views of a worker's arena until their batch is assembled, and an object
    field keeps copies: every batch, kept to the end of two epochs, still holds its own
    values (NOTE [ Python stage processes ])."""
    loader = stoker.Loader(img_ds, batch_size=5, shuffle=True, seed=1, map=tagged_map,
                           map_fields={"meta": object}, python_workers="process",
                           num_threads=2)
    kept = []
    for e in range(2):
        loader.set_epoch(e)
        kept += list(loader)
    assert len(kept) == 2 * (len(img_ds) // 5 + (len(img_ds) % 5 > 0))
    for b in kept:
        labels = b["label"].tolist()
        for row, meta, label in zip(b["a"], b["meta"], labels):
            assert bool((row == label).all())
            assert isinstance(meta, np.ndarray) and meta.tolist() == [label] * 3
    loader.close()


def test_arenas_are_reused_after_breaks(img_ds):  # noqa: F811
    """A batch dropped before all its chunks ran (break) gives its arenas back too: after
    many breaks and a whole epoch, each worker holds a few arenas, all free."""
    loader = stoker.Loader(img_ds, batch_size=2, map=tagged_map, map_fields={"meta": object},
                           python_workers="process", num_threads=2,
                           prefetch_next_epoch=False)
    for _ in range(40):
        it = iter(loader)
        next(it)
        del it  # the stream stops with chunks of later batches in flight or queued
    assert len(list(loader)) == -(-len(img_ds) // 2)
    for w in loader._stage.workers._workers:
        # a batch's chunks in flight at once, from the prefetch window (without dropping
        # stopped batches: over 30)
        assert len(w.arenas) <= 8, len(w.arenas)
        assert sorted(w.free) == list(range(len(w.arenas)))  # the epoch's batches are done
    loader.close()


def frozen_map(s, rng):
    import gc

    return {"frozen": gc.get_freeze_count(), "label": s["label"]}


def test_workers_do_not_collect_what_they_inherit(img_ds):  # noqa: F811
    """The loader's objects are in the collector's permanent generation in each worker
    (their pages stay shared, not copied by the collector's walk), and back in the
    loader's own generations after the fork."""
    import gc

    loader = stoker.Loader(img_ds, batch_size=6, map=frozen_map, python_workers="process",
                           num_threads=2)
    frozen = torch.cat([b["frozen"] for b in loader])
    assert bool((frozen > 1000).all()), frozen
    assert gc.get_freeze_count() == 0
    loader.close()


def spin_map(s, rng):
    end = time.thread_time() + 0.003
    while time.thread_time() < end:  # pure Python, on the worker's CPU
        pass
    return {"label": s["label"]}


def test_python_time_is_the_workers_not_the_queue(img_ds):  # noqa: F811
    """With two stage threads per worker, a chunk waits while the worker maps the other
    thread's: the stage's Python time is the workers' (and the threads' own CPU), so it
    is not blocked time (which the verdict would read as GIL-bound)."""
    loader = stoker.Loader(img_ds, batch_size=6, map=spin_map, python_workers="process",
                           num_threads=2, stall_warning=None)
    assert len(list(loader)) == 10
    s = loader.stats()
    blocked = s["python_seconds"] - s["python_cpu_seconds"] - s["python_wait_seconds"]
    assert s["python_cpu_seconds"] >= 60 * 0.003 * 0.9
    assert blocked < 0.25 * s["python_seconds"], s
    assert "GIL-bound" not in s["verdict"]
    loader.close()


def test_no_files_in_dev_shm(img_ds):  # noqa: F811
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    loader = stoker.Loader(img_ds, batch_size=6, map=big_map, python_workers="process")
    it = iter(loader)
    next(it)
    now = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert now - before == set()
    loader.close()


def test_dropped_loader_ends_its_workers(img_ds):  # noqa: F811
    import gc

    loader = stoker.Loader(img_ds, batch_size=6, map=slow_map, python_workers="process")
    next(iter(loader))
    pids = loader._stage.workers.pids()
    del loader
    gc.collect()
    deadline = time.monotonic() + 5
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
        time.sleep(0.02)
    assert alive == []


def test_argument_checks(img_ds):  # noqa: F811
    with pytest.raises(ValueError, match="'thread' or 'process'"):
        stoker.Loader(img_ds, map=slow_map, python_workers="processes")
    with pytest.raises(ValueError, match="pass one of them"):
        stoker.Loader(img_ds, python_workers="process")


def test_a_script_without_a_main_guard(tmp_path, img_ds):  # noqa: F811
    """What users write: a lambda in an unguarded script. The workers are forked, so the
    script is not imported again (no endless respawn) and the lambda needs no pickling."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import os, stoker
        print("script body ran in", os.getpid(), flush=True)
        ds = stoker.Dataset({str(img_ds.path)!r})
        loader = stoker.Loader(ds, batch_size=8, python_workers="process", num_threads=2,
                               map=lambda s, rng: {{"y": int(s["label"]) * 2}})
        print(sum(v for b in loader for v in b["y"].tolist()), flush=True)
    """))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[-1] == str(2 * sum(range(60)))
    assert sum(line.startswith("script body ran") for line in lines) == 1


class OddTensors(torch.utils.data.Dataset):
    """Tensors that NumPy cannot view as they are: a conjugate and a negative view (lazy
    bits), bfloat16 and float8 (no NumPy dtype), beside a plain one."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return {"z": torch.tensor([1 + 1j * i, 2 - 1j]).conj(),
                "neg": torch.tensor([1.0, float(i)])._neg_view(),
                "bf16": torch.tensor([0.5, float(i)], dtype=torch.bfloat16),
                "f8": torch.tensor([0.5, float(i)]).to(torch.float8_e4m3fn),
                "x": torch.full((3,), i)}


def _same_odd(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for k in w:
            assert g[k].dtype == w[k].dtype, k
            assert torch.equal(g[k].resolve_conj().resolve_neg().view(torch.uint8),
                               w[k].resolve_conj().resolve_neg().view(torch.uint8)), k


def test_tensors_numpy_cannot_view_come_from_worker_processes_as_they_are():
    """Before: a worker process asked NumPy for a conjugate view's memory, the error
    ended the worker, and the batch failed as a dead worker's."""
    want = list(torch.utils.data.DataLoader(OddTensors(), batch_size=2))
    for e in range(2):  # the first batches by the arenas, then straight into batches
        loader = stoker.Loader(OddTensors(), batch_size=2, num_workers=2)
        _same_odd([b for _ in range(e + 1) for b in loader], want * (e + 1))
        loader.close()
    one = list(stoker.Loader(OddTensors(), batch_size=None, num_workers=2))
    _same_odd([{k: v.unsqueeze(0) for k, v in s.items()} for s in one],
              [{k: v[i: i + 1] for k, v in b.items()} for b in want for i in range(2)])

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            w, n = (0, 1) if info is None else (info.id, info.num_workers)
            return (OddTensors()[i] for i in range(w, 6, n))

    got = list(stoker.Loader(Stream(), batch_size=2, num_workers=2))
    flat = sorted((int(b["x"][j, 0]), {k: v[j] for k, v in b.items()})
                  for b in got for j in range(len(b["x"])))
    _same_odd([s for _, s in flat], [OddTensors()[i] for i in range(6)])


def test_a_row_that_cannot_be_encoded_fails_its_sample_and_the_worker_goes_on(monkeypatch):
    """A sample whose value the worker cannot hand over fails as that sample, with the
    reason; the worker process lives on (the same pids) and later batches come."""
    from stoker._stage import direct, transport

    plain = transport.plain_array

    def refuse(value):
        if isinstance(value, np.ndarray) and value.shape == (3,) and value[0] in (2, 13):
            raise ValueError(f"cannot carry sample {value[0]}")
        return plain(value)

    # forked with it: by the arena (the first batch, planned before any row was seen)
    # and straight into their batch (the later ones)
    monkeypatch.setattr(transport, "plain_array", refuse)
    monkeypatch.setattr(direct, "plain_array", refuse)

    class Arrays(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            return {"x": np.full((3,), i)}

    loader = stoker.Loader(Arrays(), batch_size=4, num_workers=2)
    it = iter(loader)
    with pytest.raises(TypeError, match="(?s)index 2 cannot leave the worker process.*"
                                        "ValueError: cannot carry sample 2"):
        next(it)
    pids = loader._stage.workers.pids()
    assert [next(it)["x"][:, 0].tolist() for _ in range(2)] == [[4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(TypeError, match="index 13 cannot leave the worker process"):
        next(it)
    assert loader._stage.workers.pids() == pids and len(pids) == 2
    loader.close()

    class Stream(torch.utils.data.IterableDataset):  # its workers' path
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            return ({"x": np.full((3,), i)} for i in range(info.id, 16, info.num_workers))

    with pytest.raises(TypeError, match="(?s)a row cannot leave worker [01].*"
                                        "ValueError: cannot carry sample (2|13)"):
        list(stoker.Loader(Stream(), batch_size=4, num_workers=2))
