"""When your code fails (docs/python.md, "When your code fails"): whatever map, batch_map,
collate_fn or a map-style dataset does, the Python stage never loses a batch, never mixes
samples, never hangs and never leaks, with threads and with worker processes."""

import functools
import gc
import logging
import mmap
import multiprocessing
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
import stoker
import torch
from conftest import FakeDeviceLoader, eventually, fd_counts, process_alive, write_dataset
from test_python_stage import Squares

WORKERS = pytest.mark.parametrize("workers", ["thread", "process"])
# close(), a break and interpreter exit end within this, whatever map does (docs/python.md
# says "a few seconds"; the slack is for a loaded two-core machine).
BOUNDED_S = 10.0


def plain_map(s, rng):
    return {"label": s["label"], "x": s["x"]}


def labels_of(batches):
    return [v for b in batches for v in b["label"].tolist()]


# -- no value is a signal ---------------------------------------------------------------------

@WORKERS
def test_collate_fn_returning_none_yields_none_as_dataloader_does(workers):
    ds = Squares(10)
    want = list(torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=lambda b: None))
    loader = stoker.Loader(ds, batch_size=4, collate_fn=lambda b: None,
                           python_workers=workers, num_threads=2)
    it = iter(loader)
    assert next(it) is None and next(it) is None
    assert loader.state_dict()["position"] == 8  # the loop's position, as delivered
    assert next(it) is None
    with pytest.raises(StopIteration):
        next(it)
    assert list(loader) == want == [None] * 3
    loader.close()


def forgot_to_return(batch, rng):
    batch["label"] = batch["label"] * 2  # in place, no return


@WORKERS
@pytest.mark.parametrize("source", ["map", "map-style", "C++ batches"])
def test_batch_map_returning_none_is_an_error_that_says_why(labels_ds, workers, source):
    if source == "C++ batches" and workers == "process":
        pytest.skip("batch_map alone over a stoker dataset runs on C++ batches: no workers")
    if source == "map-style":
        loader = stoker.Loader([{"label": i} for i in range(32)], batch_size=8,
                               batch_map=forgot_to_return, python_workers=workers)
    elif source == "map":
        loader = stoker.Loader(labels_ds, batch_size=8, map=plain_map,
                               batch_map=forgot_to_return, python_workers=workers)
    else:
        loader = stoker.Loader(labels_ds, batch_size=8, batch_map=forgot_to_return)
    with pytest.raises(TypeError, match=r"batch_map returned None for batch 0 of epoch 0: did it "
                                        r"modify the batch in place without returning it\?"):
        list(loader)
    assert loader.state_dict()["position"] == 8  # the failed batch is consumed
    loader.close()


def test_batch_map_returning_none_on_the_device_is_an_error(labels_ds):
    loader = FakeDeviceLoader(labels_ds, batch_size=8, device="cuda", batch_map=forgot_to_return)
    with pytest.raises(TypeError, match="batch_map returned None for batch 0 of epoch 0"):
        list(loader)
    loader.close()


# -- replies belong to requests ---------------------------------------------------------------

def forking_map(s, rng):
    """Forks, and the child returns too: what a careless map (or a library in it) does."""
    label = int(s["label"])
    child = os.fork()
    return {"label": label, "a": np.full(5, label, np.int64), "name": f"s{label}",
            "child": child}


@pytest.mark.slow
@WORKERS
@pytest.mark.timeout(120)  # it hung before the stage told replies apart
def test_a_map_that_forks_mixes_nothing(labels_ds, workers):
    loader = stoker.Loader(labels_ds, batch_size=8, shuffle=True, seed=3, map=forking_map,
                           python_workers=workers, num_threads=2)
    children = []
    try:
        for e in range(4):
            loader.set_epoch(e)
            got = list(loader)
            assert len(got) == 8
            labels = labels_of(got)
            assert sorted(labels) == list(range(64)), labels  # no duplicate, none lost
            for b in got:
                assert len(b["label"]) == len(b["a"]) == len(b["name"])
                for label, a, name in zip(b["label"].tolist(), b["a"], b["name"]):
                    assert a.tolist() == [label] * 5 and name == f"s{label}"
                children += [c for c in b["child"].tolist() if c > 0]
        # the children returned from map and ended there (their results ignored)
        assert eventually(lambda: not any(process_alive(c) for c in children), 10)
    finally:
        loader.close()
        for c in children:
            if process_alive(c):
                os.kill(c, signal.SIGKILL)
            if workers == "thread":  # our own children: reaped
                try:
                    os.waitpid(c, 0)
                except ChildProcessError:
                    pass


@pytest.mark.parametrize("wrong", ["ticket", "pid"])
def test_a_reply_to_another_request_fails_the_batch_clearly(labels_ds, monkeypatch, wrong):
    """A reply that answers another request, or comes from a process that is not the
    worker, is never taken for this one: its batch fails with an error that says so, and
    the next iter() runs whole epochs with a new worker."""
    from stoker._stage import processes

    loader = stoker.Loader(labels_ds, batch_size=8, map=plain_map, python_workers="process",
                           num_threads=1)
    assert len(list(loader)) == 8
    real = processes._reply_header
    # the worker's replies claim another request, or another process
    monkeypatch.setattr(processes, "_reply_header",
                        lambda ticket, pid: real(ticket + 7, pid) if wrong == "ticket"
                        else real(ticket, pid + 1))
    loader.close()  # new workers at the next iter(), forked with the patched header
    with pytest.raises(processes.WorkerDied, match=r"answers (request \d+|process \d+)"):
        list(loader)
    monkeypatch.setattr(processes, "_reply_header", real)
    loader.close()
    got = list(loader)  # a new worker in its place
    assert labels_of(got) == list(range(64))
    loader.close()


def test_requests_go_out_in_the_order_their_chunks_were_claimed():
    """Of a worker's two stage threads, the one that claimed the later chunk sends after
    the other: a chunk of an earlier batch never waits at the worker behind a later one."""
    from stoker._stage.processes import SendOrder

    order = SendOrder(1)
    chunks = iter([("batch 0", 0, 4), ("batch 1", 0, 4), ("batch 2", 0, 4)])
    first, second, third = (order.claim(0, lambda: next(chunks)) for _ in range(3))
    assert first[:3] == ("batch 0", 0, 4)
    sent = []

    def send(item):
        order.wait(0, item[3], lambda: False)
        sent.append(item[0])
        order.done(0, item[3])

    later = [threading.Thread(target=send, args=(item,)) for item in (third, second)]
    for t in later:
        t.start()
    later[0].join(0.2)
    assert sent == [] and all(t.is_alive() for t in later)  # both wait for batch 0's
    send(first)
    for t in later:
        t.join(10)
    assert sent == ["batch 0", "batch 1", "batch 2"]
    # a new generation of stage threads (the pool started again) numbers from 0
    order.reset()
    assert order.claim(0, lambda: ("x", 0, 1))[3] == (1, 0)


# -- nothing waits forever on user code -------------------------------------------------------

STUCK_SCRIPT = """
import os, signal, sys, threading, time
import stoker

# Ctrl-C as a terminal gives it: Python's own handler, whatever disposition the parent left
# (a non-interactive shell starts its background jobs with SIGINT ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)
flag = {flag!r}


def stuck(s, rng):
    if int(s["label"]) == 9:  # batch 2
        open(flag, "w").close()
        threading.Event().wait()  # forever
    return {{"label": s["label"]}}


def entered():
    deadline = time.monotonic() + 60
    while not os.path.exists(flag):
        if time.monotonic() > deadline:
            sys.exit("map never reached the stuck sample")
        time.sleep(0.005)


def pids():
    if loader._stage.workers is not None:
        print("pids", *loader._stage.workers.pids(), flush=True)


def loop(ended=None):
    for _ in loader:  # blocks at a batch the stuck map holds up
        pass
    if ended is not None:
        ended.set()


# prefetch=4: iter() alone has the stage map batch 2 (a worker may hold an earlier batch's
# chunk behind the stuck one: next() would wait, as it waits for any batch user code holds)
loader = stoker.Loader(stoker.Dataset({path!r}), batch_size=4, map=stuck, num_threads=2,
                       prefetch=4, python_workers={workers!r})
how = {how!r}
if how == "close":  # from the loop's thread
    it = iter(loader)
    entered()
    pids()
    t0 = time.monotonic()
    loader.close()
    print("took", time.monotonic() - t0, flush=True)
elif how == "close from another thread":  # while the loop waits in next()
    ended = threading.Event()
    threading.Thread(target=loop, args=(ended,), daemon=True).start()
    entered()
    pids()
    t0 = time.monotonic()
    loader.close()
    assert ended.wait(30), "the loop did not end"
    print("took", time.monotonic() - t0, flush=True)
elif how == "ctrl-c":  # in the loop's wait, then close()
    def interrupt():
        entered()
        pids()
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        loop()
    except KeyboardInterrupt:
        t0 = time.monotonic()
        loader.close()
        print("took", time.monotonic() - t0, flush=True)
elif how == "exception":  # out of a with block
    try:
        with loader:
            it = iter(loader)
            entered()
            pids()
            t0 = time.monotonic()
            raise ValueError("the loop failed")
    except ValueError:
        print("took", time.monotonic() - t0, flush=True)
else:  # interpreter exit, the loader never closed, a loop waiting in next()
    threading.Thread(target=loop, daemon=True).start()
    entered()
    pids()
print("exiting", time.monotonic(), flush=True)
"""


def run_stuck(tmp_path, path, workers, how):
    """Runs STUCK_SCRIPT: (its output lines, seconds from "exiting" to its exit, pids)."""
    flag = tmp_path / f"entered-{workers}-{how.replace(' ', '-')}"
    script = STUCK_SCRIPT.format(flag=str(flag), path=str(path), workers=workers, how=how)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    pids = []
    try:
        out, err = p.communicate(timeout=40)
        ended = time.monotonic()
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # its workers too: they hold its pipes open
        out, err = p.communicate()
        raise AssertionError(f"{how}: the process did not end:\n{out}\n{err[-3000:]}") from None
    finally:
        for line in (out if p.returncode is not None else "").splitlines():
            if line.startswith("pids"):
                pids = [int(x) for x in line.split()[1:]]
        for pid in pids:  # nothing left behind, whatever happened
            if not eventually(lambda pid=pid: not process_alive(pid), 10):
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"{how}: worker {pid} outlived its loader")
    assert p.returncode == 0, out + err[-3000:]
    lines = out.splitlines()
    exiting = [float(x.split()[1]) for x in lines if x.startswith("exiting")]
    assert exiting, out + err[-3000:]
    return lines, ended - exiting[0], pids


@WORKERS
@pytest.mark.parametrize("how", ["close", "close from another thread", "ctrl-c", "exception",
                                 "exit"])
def test_close_and_exit_are_bounded_whatever_map_does(tmp_path, labels_ds, workers, how):
    lines, exit_s, pids = run_stuck(tmp_path, labels_ds.path, workers, how)
    if how != "exit":
        took = [float(x.split()[1]) for x in lines if x.startswith("took")]
        assert took and took[0] < BOUNDED_S, lines
    assert exit_s < BOUNDED_S, lines
    assert (workers == "process") == bool(pids)


def test_close_abandons_a_stuck_thread_and_the_loader_goes_on(labels_ds):
    """close() gives up on a stage thread that is stuck in map (it ends when map returns);
    the next iter() starts threads of its own and runs whole epochs."""
    release = threading.Event()
    entered = threading.Event()

    def stuck_once(s, rng):
        if int(s["label"]) == 9 and not release.is_set():
            entered.set()
            release.wait()
        return {"label": s["label"]}

    loader = stoker.Loader(labels_ds, batch_size=4, map=stuck_once, num_threads=2)
    it = iter(loader)
    next(it)
    assert entered.wait(30)
    t0 = time.monotonic()
    loader.close()
    assert time.monotonic() - t0 < BOUNDED_S
    release.set()  # only now: the epochs below need no stuck thread to return
    for _ in range(2):
        assert labels_of(loader) == list(range(64))
    loader.close()



def _gated_label_map(ctl, s, rng):
    """ctl (shared memory): [the label that raises, the label that sleeps, entered]."""
    bad, slow, _ = struct.unpack_from("qqq", ctl)
    label = int(s["label"])
    if label == bad:
        raise ValueError(f"bad sample {label}")
    if label == slow:
        struct.pack_into("q", ctl, 16, 1)
        time.sleep(0.5)
    return {"label": s["label"], "x": s["x"]}


@WORKERS
@pytest.mark.parametrize("left", ["failed", "held"])
def test_close_with_an_iterator_open_mid_epoch_then_whole_epochs(labels_ds, workers, left):
    """loader.close() while an iterator is open mid-epoch (after a failed batch, which
    leaves it open: NOTE [ After a failed batch ]; or held by the loop) and its stream is
    already mapping the next epoch's first batch: every stream stops, and the next epoch
    is whole and right. (The open iterator's stream was once kept for the next iterator
    after close() had dropped that batch's chunks in the stage: the next epoch's first
    batch came with rows missing, or never.)"""
    kw = dict(batch_size=8, shuffle=True, seed=3)
    plain = stoker.Loader(labels_ds, **kw)
    want = {}
    for e in range(6):
        plain.set_epoch(e)
        want[e] = [b["label"].tolist() for b in plain]
    ctl = mmap.mmap(-1, 24)  # MAP_SHARED: worker processes see each write
    struct.pack_into("qqq", ctl, 0, -1, -1, 0)
    loader = stoker.Loader(labels_ds, map=functools.partial(_gated_label_map, ctl),
                           prefetch=2, python_workers=workers, num_threads=2, timeout=60, **kw)
    try:
        for e in range(0, 6, 2):
            # the next epoch's first batch is in the stage (its last sample sleeping in
            # map) when close() comes
            struct.pack_into("qqq", ctl, 0, want[e][6][0] if left == "failed" else -1,
                             want[e + 1][0][-1], 0)
            loader.set_epoch(e)
            it = iter(loader)
            got = []
            if left == "failed":
                with pytest.raises(ValueError, match="bad sample"):
                    for b in it:
                        got.append(b["label"].tolist())
                assert got == want[e][:6]
            else:
                got = [next(it)["label"].tolist() for _ in range(7)]
                assert got == want[e][:7]
            assert eventually(lambda: struct.unpack_from("q", ctl, 16)[0] == 1, 30)
            struct.pack_into("qq", ctl, 0, -1, -1)
            loader.close()
            loader.set_epoch(e + 1)
            assert [b["label"].tolist() for b in loader] == want[e + 1], (e + 1, left)
            del it
    finally:
        loader.close()


KILLED_PARENT = """
import os, threading, time
import stoker


def stuck(s, rng):
    if int(s["label"]) == 9:
        threading.Event().wait()
    return {{"label": s["label"]}}


loader = stoker.Loader(stoker.Dataset({path!r}), batch_size=4, map=stuck, num_threads=3,
                       python_workers="process")


def start():
    next(iter(loader))


if {from_thread!r}:  # the workers are forked from a thread that ends before the loader
    t = threading.Thread(target=start)
    t.start()
    t.join()
else:
    start()
pids = loader._stage.workers.pids()
print("pids", *pids, flush=True)
threading.Event().wait()
"""


@pytest.mark.parametrize("from_thread", [False, True], ids=["main-thread", "other-thread"])
def test_workers_die_with_a_killed_loader_process(labels_ds, from_thread):
    script = KILLED_PARENT.format(path=str(labels_ds.path), from_thread=from_thread)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids = []
    try:
        line = p.stdout.readline()
        assert line.startswith("pids"), line
        pids = [int(x) for x in line.split()[1:]]
        assert len(pids) == 3 and all(process_alive(x) for x in pids)
        p.kill()
        p.wait(30)
        alive = eventually(lambda: not any(process_alive(x) for x in pids), 10)
        assert alive, [x for x in pids if process_alive(x)]
    finally:
        p.stdout.close()
        if p.poll() is None:
            p.kill()
            p.wait()
        for x in pids:
            if process_alive(x):
                os.kill(x, signal.SIGKILL)


def finish_while_stalled(it, caplog, release):
    """The rest of iterator `it`, consumed while the stage stalls: the stall's message is
    waited for (at most 20 s) on another thread, which then calls `release`. (The batches,
    the stage's stall messages.)"""
    def stalled():
        return [r.getMessage() for r in caplog.records
                if r.name == "stoker" and r.getMessage().startswith("stoker: batch ")
                and "not ready" in r.getMessage()]

    def watch():
        eventually(stalled, 20)
        release()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        got = list(it)
    finally:
        watcher.join()
    return got, stalled()


@WORKERS
def test_a_stall_mid_epoch_says_which_stage_and_sample(labels_ds, workers, caplog,
                                                       monkeypatch):
    monkeypatch.setattr(stoker._loader_args, "SLOW_FIRST_BATCH_SECONDS", 0.3)
    caplog.set_level(logging.INFO, logger="stoker")
    event = threading.Event() if workers == "thread" else \
        multiprocessing.get_context("fork").Event()  # the workers are forked: shared

    def blocks_at_20(s, rng):
        if int(s["label"]) == 20:
            event.wait()
        return {"label": s["label"]}

    loader = stoker.Loader(labels_ds, batch_size=4, map=blocks_at_20, num_threads=1,
                           python_workers=workers)
    it = iter(loader)
    got = [next(it) for _ in range(5)]
    rest, messages = finish_while_stalled(it, caplog, event.set)
    assert labels_of(got + rest) == list(range(64))  # then every batch came, right
    assert messages, "no progress message while the stage stalled"
    text = messages[0]
    assert "batch 5 of epoch 0 is not ready after" in text, text
    assert "in map for sample 20 (" in text, text
    if workers == "process":
        assert "worker process 0 (pid " in text, text
    else:
        assert "thread stoker-python-0 " in text, text
    lines = [r.getMessage() for r in caplog.records if r.name == "stoker"]
    assert "stoker: batch 5 of epoch 0 came after" in " ".join(lines), lines
    loader.close()


def test_a_stopped_worker_is_reported_mid_epoch(labels_ds, caplog, monkeypatch):
    monkeypatch.setattr(stoker._loader_args, "SLOW_FIRST_BATCH_SECONDS", 0.3)
    caplog.set_level(logging.INFO, logger="stoker")
    loader = stoker.Loader(labels_ds, batch_size=4, map=plain_map, num_threads=1, prefetch=2,
                           python_workers="process")
    it = iter(loader)
    got = [next(it), next(it)]
    pid = loader._stage.workers.pids()[0]
    os.kill(pid, signal.SIGSTOP)
    try:
        rest, messages = finish_while_stalled(it, caplog, lambda: os.kill(pid, signal.SIGCONT))
    finally:
        os.kill(pid, signal.SIGCONT)
    assert labels_of(got + rest) == list(range(64))
    assert messages and f"(pid {pid}) (the process is stopped" in messages[0], messages
    loader.close()


# -- no leak without close() ------------------------------------------------------------------

@pytest.mark.slow
@WORKERS
@pytest.mark.timeout(300)
def test_dropped_loaders_leak_no_worker_arena_or_fd(labels_ds, workers):
    """Loaders dropped mid-epoch without close(), some in reference cycles: descriptors,
    memfds and worker processes stay flat over a hundred or more of them."""
    def use(cycle):
        loader = stoker.Loader(labels_ds, batch_size=8, map=plain_map, num_threads=1,
                               python_workers=workers)
        it = iter(loader)
        next(it)
        if cycle:
            loader.me = loader
            it.me = it
        pids = [] if loader._stage.workers is None else loader._stage.workers.pids()
        return pids

    for _ in range(3):  # what the first loaders set up once (imports, the pools' threads)
        use(False)
    gc.collect()
    before = fd_counts()  # (memfds of loaders that other tests keep count here too)
    pids = []
    # a leak of one descriptor or process per loader shows over either count; a process
    # loader forks its workers (about 0.13 s each on 2 cores), a thread one does not
    for i in range(300 if workers == "thread" else 120):
        pids += use(i % 3 == 0)
        if i % 25 == 0:
            gc.collect()
    gc.collect()
    settled = eventually(lambda: fd_counts()[0] <= before[0] + 2 and
                         fd_counts()[1] <= before[1], 10)
    assert settled, (before, fd_counts())
    assert not any(process_alive(p) for p in pids)
    for p in pids:  # every worker reaped
        with pytest.raises(ChildProcessError):
            os.waitpid(p, os.WNOHANG)


# -- the user's exception, always -------------------------------------------------------------

class Abort(BaseException):
    """A user's BaseException subclass (not an Exception)."""


def raising_map(exc, s, rng):
    if int(s["label"]) == 9:
        raise exc
    return {"label": s["label"]}


@WORKERS
@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt("map"), Abort("stop")],
                         ids=["SystemExit", "KeyboardInterrupt", "BaseException"])
def test_base_exceptions_from_map_come_back_as_themselves(labels_ds, workers, exc):
    loader = stoker.Loader(labels_ds, batch_size=4, map=functools.partial(raising_map, exc),
                           python_workers=workers, num_threads=2)
    got = []
    with pytest.raises(type(exc)) as e:
        for b in loader:
            got.append(b)
    assert labels_of(got) == list(range(8))
    assert e.value.args == exc.args
    assert "sample 9 (" in "\n".join(getattr(e.value, "__notes__", [])), e.value
    if workers == "process":  # the worker is not lost for it
        pids = loader._stage.workers.pids()
        with pytest.raises(type(exc)):
            list(loader)
        assert loader._stage.workers.pids() == pids
    loader.close()


def twice(batch, rng):
    return {**batch, "twice": batch["label"] * 2}


def collate_labels(rows):
    return {"label": torch.tensor([int(r["label"]) for r in rows])}


@WORKERS
@pytest.mark.parametrize("source", ["stoker", "map-style"])
@pytest.mark.parametrize("use_map", [False, True], ids=["no-map", "map"])
@pytest.mark.parametrize("collate", [False, True], ids=["native", "collate_fn"])
def test_batch_map_without_next_epoch_prefetch(labels_ds, workers, source, use_map, collate):
    """prefetch_next_epoch=False with batch_map over every hook: whole epochs, in order.
    (The stage's bookkeeping dropped the last batch's delivery, its stream stopped, when
    its periodic purge came at that batch: every 16th next(), here epoch 0's last.)"""
    if workers == "process" and source == "stoker" and not (use_map or collate):
        pytest.skip("no per-sample Python: no worker processes")
    ds = labels_ds if source == "stoker" else [{"label": i} for i in range(64)]
    loader = stoker.Loader(ds, batch_size=4, shuffle=True, seed=2, prefetch_next_epoch=False,
                           map=(lambda s, rng: {"label": s["label"]}) if use_map else None,
                           collate_fn=collate_labels if collate else None, batch_map=twice,
                           python_workers=workers, num_threads=2)
    for e in range(3):
        loader.set_epoch(e)
        got = list(loader)
        assert len(got) == 16 and sorted(labels_of(got)) == list(range(64))
        for b in got:
            assert torch.equal(b["twice"], b["label"] * 2)
    loader.close()


# -- messages that name the source, field or file, and the fix --------------------------------

def test_a_mixture_with_an_empty_source_names_it(tmp_path, labels_ds):
    with stoker.ShardWriter(tmp_path / "empty", labels_ds.fields):
        pass
    empty = stoker.Dataset(tmp_path / "empty")
    with pytest.raises(ValueError, match=r"source 'web' \(.*empty.*\) has no samples"):
        stoker.Mix({"code": labels_ds, "web": empty})


def test_a_huge_schedule_step_is_a_clear_value_error(labels_ds):
    with pytest.raises(ValueError, match=r"weights\[1\]: the step must be .* at most"):
        stoker.Mix({"a": labels_ds, "b": labels_ds},
                   weights=[(0, {"a": 1, "b": 1}), (2**64, {"a": 1, "b": 2})])
    mix = stoker.Mix({"a": labels_ds, "b": labels_ds},
                     weights=[(0, {"a": 1, "b": 1}), (2**62, {"a": 1, "b": 2})])
    with pytest.raises(ValueError, match=r"weights\[1\]: step 4611686018427387904 .* batch_size"):
        stoker.Loader(mix, batch_size=8)


def test_an_unreadable_dataset_folder_says_permission(tmp_path_factory):
    """As a user without the right to enter the folder (root has every right: the check
    runs as nobody in a child process)."""
    base = tempfile.mkdtemp(prefix="stoker-perm-")
    try:
        os.chmod(base, 0o755)
        path = os.path.join(base, "ds")
        write_dataset(path, 4)
        os.chmod(path, 0)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(r)
                if os.getuid() == 0:
                    os.setgid(65534)
                    os.setuid(65534)
                try:
                    stoker.Dataset(path)
                    msg = "opened"
                except Exception as e:
                    msg = f"{type(e).__name__}: {e}"
                os.write(w, msg.encode())
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r) as f:
            msg = f.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert msg.startswith("PermissionError"), msg
        assert path in msg and "permission" in msg.lower() and "no index.json" not in msg, msg
    finally:
        os.chmod(os.path.join(base, "ds"), 0o755)
        import shutil

        shutil.rmtree(base)


# -- a soak: faults at random over many epochs ------------------------------------------------

# The soak's plan, in memory shared with forked workers: for this epoch and the next (whose
# first batches are mapped while this one ends), (fault, sample, fingerprint); the test's
# pid; the count of releases (a stuck map waits for the next). A fault applies to sample
# `k` of its own epoch only: the fingerprint is the first draw of that sample's generator
# (keyed by seed, epoch, index), or for batch_map of the batch's.
_CTL = struct.Struct("qqdqqdqq")
NONE, RAISE, EXIT, FORGET, FORK, KILL, STUCK, BREAK = range(8)
SOAK_SEED = 5


def _faults_for(ctl, label, draw):
    v = _CTL.unpack_from(ctl)
    for fault, k, fp in (v[0:3], v[3:6]):
        if fault == FORK or (label == k and draw == fp):
            yield fault


def soak_map(ctl, children, s, rng):
    label = int(s["label"])
    test_pid = _CTL.unpack_from(ctl)[6]
    for fault in _faults_for(ctl, label, rng.random()):
        if fault == FORK:
            child = os.fork()
            if child and os.getpid() == test_pid:
                children.append(child)
        elif fault == RAISE:
            raise ValueError(f"soak {label}")
        elif fault == EXIT:
            sys.exit(7)
        elif fault == KILL and os.getpid() != test_pid:
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault == STUCK:
            released = _CTL.unpack_from(ctl)[7]
            while _CTL.unpack_from(ctl)[7] == released:  # until released, or killed
                time.sleep(0.01)
    return {"label": label, "x": s["x"], "tag": label * 7}


def soak_batch_map(ctl, batch, rng):
    v = _CTL.unpack_from(ctl)
    draw = rng.random()
    if any(fault == FORGET and draw == fp for fault, _, fp in (v[0:3], v[3:6])):
        return None
    return {**batch, "sum": batch["x"].sum((1, 2, 3))}


@pytest.mark.soak
@WORKERS
@pytest.mark.timeout(600)
def test_soak_faults_at_random(labels_ds, workers):
    """Faults at random, epoch after epoch, on one loader (next-epoch prefetch on): every
    batch delivered is right (the same rows as a plain loader's) or the fault's error is
    raised; nothing hangs. 24 epochs by default; STOKER_SOAK_EPOCHS=N runs N (.ci/run: 120),
    STOKER_SOAK_FULL=1 400 (about 2.5 min per worker kind on 2 cores)."""
    from stoker._stage import processes
    from stoker._stage.rng import batch_rng, sample_rng

    full = os.environ.get("STOKER_SOAK_FULL") == "1"
    epochs = int(os.environ.get("STOKER_SOAK_EPOCHS") or (400 if full else 24))
    ctl = mmap.mmap(-1, _CTL.size)  # MAP_SHARED: the forked workers see each write
    children = []
    kw = dict(batch_size=8, shuffle=True, seed=SOAK_SEED)
    plain = stoker.Loader(labels_ds, **kw)
    want = []
    for e in range(epochs + 1):
        plain.set_epoch(e)
        want.append([b["label"].tolist() for b in plain])
    # prefetch=2: the next epoch's samples mapped early are in its batches 0 and 1
    loader = stoker.Loader(labels_ds, map=functools.partial(soak_map, ctl, children),
                           batch_map=functools.partial(soak_batch_map, ctl), prefetch=2,
                           python_workers=workers, num_threads=2, **kw)
    faults = [NONE, RAISE, EXIT, FORGET, FORK, BREAK, STUCK] + \
        ([KILL] if workers == "process" else [])
    errors = {RAISE: ValueError, EXIT: SystemExit, FORGET: TypeError, KILL: RuntimeError}
    rng = random.Random(11)
    plan = []
    for e in range(epochs + 1):
        fault = faults[e % len(faults)] if e < 2 * len(faults) else rng.choice(faults)
        # a stuck or killed worker takes its other chunks with it: never in a batch the
        # previous epoch's prefetch maps
        where = rng.randrange(2 if fault in (STUCK, KILL) else 0, 8)
        k = rng.choice(want[e][where])
        fp = batch_rng(SOAK_SEED, e, 0, 1, where).random() if fault == FORGET else \
            sample_rng(SOAK_SEED, e, k).random()
        plan.append((fault, k, fp, where))
    seen = {f: 0 for f in faults}
    try:
        for e in range(epochs):
            fault, k, fp, where = plan[e]
            seen[fault] += 1
            _CTL.pack_into(ctl, 0, *plan[e][:3], *plan[e + 1][:3], os.getpid(), e)
            loader.set_epoch(e)
            got = 0
            stop = rng.randrange(1, 9) if fault == BREAK else where if fault == STUCK else 8
            t0 = time.monotonic()
            try:
                for b in loader:
                    labels = b["label"].tolist()
                    assert labels == want[e][got], (e, fault, got)
                    assert len(labels) == len(b["x"]) == len(b["tag"]) == len(b["sum"])
                    for label, x, tag, total in zip(labels, b["x"], b["tag"].tolist(),
                                                    b["sum"].tolist()):
                        assert bool((x == label).all()) and tag == 7 * label
                        assert total == 48 * label
                    got += 1
                    if got == stop:
                        break
            except (ValueError, SystemExit, TypeError, RuntimeError) as exc:
                # the worker killed in the last epoch also held this epoch's first batches
                # (next-epoch prefetch): they fail with it (docs/python.md)
                held = e and plan[e - 1][0] == KILL and type(exc) is processes.WorkerDied \
                    and got < 2
                assert held or (fault in errors and isinstance(exc, errors[fault])), \
                    (e, fault, exc)
                # a killed worker fails every chunk it held: maybe an earlier batch's
                assert held or got == where or (fault == KILL and got <= where), \
                    (e, fault, got, where)
            else:
                assert fault not in errors, (e, fault)
                assert got == stop, (e, fault, got)
            if fault in (BREAK, STUCK) or rng.random() < 0.2:
                t1 = time.monotonic()
                loader.close()
                assert time.monotonic() - t1 < BOUNDED_S, (e, fault)
            # the next epoch's plan stays in place: its first batches may be mapped before
            # its iter() (next-epoch prefetch; after a failed batch, the failed iterator
            # maps ahead until the next iter() closes it: NOTE [ After a failed batch ])
            _CTL.pack_into(ctl, 0, NONE, -1, 0.0, *plan[e + 1][:3], os.getpid(), e + 1)
            assert time.monotonic() - t0 < 60, (e, fault)
        assert all(seen.values()), seen
    finally:
        _CTL.pack_into(ctl, 0, NONE, -1, 0.0, NONE, -1, 0.0, os.getpid(), -1)
        loader.close()
        for c in children:
            if process_alive(c):
                os.kill(c, signal.SIGKILL)
            try:
                os.waitpid(c, 0)
            except ChildProcessError:
                pass


class _RaisesWithLocals(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        marker = f"sample {i}"  # noqa: F841 (read back from the traceback's frame)
        if i == 5:
            raise ValueError("bad sample")
        return {"x": np.full(3, i, np.int32)}


def test_a_failed_batchs_error_keeps_the_users_frames_and_drops_stokers_locals():
    """A failed batch's error, kept past its raise, holds no memory through stoker's own
    frames (their locals dropped: stage._errors.without_locals), while the user's frame
    keeps its locals for a debugger (pdb.post_mortem, %debug)."""
    loader = stoker.Loader(_RaisesWithLocals(), batch_size=2, num_workers=1,
                           python_workers="thread")
    try:
        with pytest.raises(ValueError, match="bad sample") as info:
            for _ in loader:
                pass
    finally:
        loader.close()
    frames = []
    tb = info.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    user = [f for f in frames if f.f_code.co_name == "__getitem__"
            and f.f_code.co_filename == __file__]
    assert len(user) == 1 and user[0].f_locals["marker"] == "sample 5"
    # the frames of the stage thread that ran the sample: after the loop's own (its
    # next(), where the error was raised again, keeps its locals as any raise does)
    raised = max(k for k, f in enumerate(frames) if f.f_code.co_name == "next")
    own = os.path.dirname(stoker.__file__) + os.sep
    stage = [f for f in frames[raised + 1:] if f.f_code.co_filename.startswith(own)]
    assert stage and all(not f.f_locals for f in stage)
