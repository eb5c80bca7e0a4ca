"""The converters' parallel work (stoker.convert._workers): worker processes that are fresh
interpreters, so a script without an ``if __name__ == "__main__":`` guard converts as one
with it; a worker that cannot start is one clear error, never restarted; Python
tokenizers importable by name run in those processes, others on threads."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import stoker
from stoker.convert import convert_text
from stoker.convert._workers import ProcessPool, WorkerError

TOKENIZER_MODULE = textwrap.dedent('''
    import os

    def by_pid(text):
        """ids: the text's bytes, then the id of the process that tokenized it"""
        return list(text.encode("utf-8")) + [os.getpid() % 60000]

    def refuse(*args):
        raise RuntimeError("this worker refuses to start")
''')


@pytest.fixture
def tokmod(tmp_path, monkeypatch):
    (tmp_path / "pidtok.py").write_text(TOKENIZER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import pidtok

    return pidtok


def _jsonl(path, n=600):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"document {i} " + "x" * (i % 50)}) + "\n")
    return path


def test_a_python_tokenizer_by_name_runs_in_worker_processes(tmp_path, tokmod):
    src = _jsonl(tmp_path / "c.jsonl")
    convert_text(src, tmp_path / "out", tokmod.by_pid, workers=2, dtype="uint16")
    docs = [d.tolist() for d in stoker.TokenDataset(tmp_path / "out")]
    pids = {d[-1] for d in docs}
    assert os.getpid() % 60000 not in pids and 1 <= len(pids) <= 2
    # the same documents as in this process, bar the pid
    convert_text(src, tmp_path / "one", tokmod.by_pid, workers=1, dtype="uint16")
    ones = [d.tolist() for d in stoker.TokenDataset(tmp_path / "one")]
    assert [d[:-1] for d in docs] == [d[:-1] for d in ones]
    assert {d[-1] for d in ones} == {os.getpid() % 60000}


def test_a_worker_that_cannot_start_is_one_error(tokmod):
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="could not start: RuntimeError: this worker "
                                          "refuses to start"):
        ProcessPool(2, init=(tokmod.refuse, ()))
    assert time.monotonic() - t0 < 60  # raised, not retried


def test_a_worker_that_dies_fails_its_tasks(tokmod):
    pool = ProcessPool(1)
    try:
        pid = pool.submit(os.getpid).result(timeout=60)
        assert pid != os.getpid()
        slow = pool.submit(time.sleep, 30)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match="ended"):
            slow.result(timeout=60)
        with pytest.raises(WorkerError):
            pool.submit(os.getpid)
    finally:
        pool.terminate()


def test_task_errors_come_back_as_raised(tokmod):
    with ProcessPool(1) as pool:
        with pytest.raises(ZeroDivisionError):
            pool.submit(divmod, 1, 0).result(timeout=60)
        assert pool.submit(divmod, 7, 2).result(timeout=60) == (3, 1)


def test_large_tasks_and_results_pass_each_other():
    """Tasks and results far larger than a pipe's buffer, many in flight: the writer of
    tasks never blocks the reader of results (each would wait for the other)."""
    payloads = [bytes([i]) * (1 << 20) for i in range(60)]
    with ProcessPool(1) as pool:
        futures = [pool.submit(bytes, p) for p in payloads]  # bytes(p): p, sent back whole
        assert [f.result(timeout=120) for f in futures] == payloads


SCRIPT = '''
import json
import torch  # threads exist from here on: no fork would be safe
import stoker
from stoker.convert import convert_text, convert_tfrecord
import pidtok

with open("c.jsonl", "w") as f:
    for i in range(300):
        f.write(json.dumps({"text": "doc %d" % i}) + "\\n")

def local(text):  # defined in __main__: tokenized on threads
    return list(text.encode())

convert_text("c.jsonl", "a", local, workers=2, overwrite=True)
convert_text("c.jsonl", "b", pidtok.by_pid, workers=2, overwrite=True)  # in processes
convert_tfrecord(["t0.tfrecord", "t1.tfrecord"], "t", workers=2, progress=False,
                 overwrite=True)  # parsed in worker processes
print("done", len(stoker.Dataset("a")), len(stoker.Dataset("b")), len(stoker.Dataset("t")))
'''


@pytest.mark.slow
def test_a_script_without_a_main_guard_converts(tmp_path, tokmod):
    """What `python script.py` does with converters in a script that has no
    `if __name__ == "__main__":` guard and imports torch first: it finishes, once."""
    from test_convert_tfrecord import serialize, write_tfrecord

    for k in range(2):
        write_tfrecord(tmp_path / f"t{k}.tfrecord",
                       [serialize({"label": [10 * k + i]}) for i in range(10)])
    (tmp_path / "convert.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = subprocess.run([sys.executable, "convert.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["done", "300", "300", "20"], r.stdout
    assert "bootstrapping" not in r.stderr and "Traceback" not in r.stderr
    labels = [int(stoker.Dataset(tmp_path / "t")[i]["label"]) for i in range(20)]
    assert labels == list(range(20))
    assert np.array_equal(stoker.TokenDataset(tmp_path / "a")[5], np.frombuffer(b"doc 5", np.uint8))


def test_ordered_results_in_order_bounded_and_cancelled_when_closed():
    """The thread converters' look-ahead (convert/_parallel.ordered_results): results in
    input order whatever order the jobs finish in, at most `depth` submitted ahead, and the
    jobs not started cancelled when the consumer stops on a bad file."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from stoker.convert._parallel import ordered_results

    started, lock = [], threading.Lock()

    def job(i):
        with lock:
            started.append(i)
        time.sleep(0.002 * (5 - i % 5))  # later inputs finish first
        return i * i

    with ThreadPoolExecutor(3) as pool:
        seen = []
        for i, r in enumerate(ordered_results(pool, job, 40, depth=6)):
            assert len(started) <= i + 6  # never more than depth ahead
            seen.append(r)
        assert seen == [i * i for i in range(40)]
        started.clear()
        results = ordered_results(pool, job, 1000, depth=6)
        assert next(results) == 0
        results.close()
    assert len(started) <= 7  # the rest never ran
