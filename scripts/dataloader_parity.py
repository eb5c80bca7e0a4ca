#!/usr/bin/env python
"""PyTorch's own DataLoader tests, run against ``stoker.Loader`` (issue #34).

Usage::

    python scripts/dataloader_parity.py PATH/TO/test_dataloader.py [--only REGEX]
        [--timeout S] [--json OUT] [--slow] [--keep]
        [--mode stoker --against EARLIER.json]

PATH is PyTorch's ``test/test_dataloader.py`` for the torch installed here (it is
PyTorch's code, so it stays outside this repository). The script copies it into a
temporary directory and runs its DataLoader test classes (SELECTION below) twice with
pytest, each in subprocesses of its own:

  dataloader  the file as it is;
  stoker      with ``torch.utils.data.DataLoader`` replaced by ``stoker.Loader``: a
              ``sitecustomize`` on PYTHONPATH rebinds the name before the test module
              imports it, in the pytest process and in every Python process started under
              it (spawned workers re-importing the test module, the tests' own
              ``python -c`` subprocesses). The arguments stay exactly as the tests pass them.

Each test has a timeout (pytest-timeout), and a run that hangs or dies anyway (a crash in
native code, a timeout that cannot interrupt) costs one test: the test running then is
recorded as ``hung``/``crashed`` and the run goes on with the tests after it.

It prints the tests DataLoader passes, how many of those stoker passes, the ratio (also
over the tests that construct a loader at all: NO_LOADER lists the ones that only test
samplers or default_collate), and stoker's failures among them with the first line of
each, grouped by why they fail: KNOWN below says, for each test stoker is known to fail,
whether it is (a) a gap in stoker's drop-in behaviour, (b) a test of DataLoader's own
machinery or (c) a behaviour stoker has on purpose, and why; any other failure is listed
as unexplained, grouped by its first line. ``--json OUT`` writes every test's outcome in
both runs. ``--mode stoker --against EARLIER.json`` runs stoker's side only and takes
DataLoader's outcomes from an earlier run's ``--json`` on the same machine and torch (its
report is the same as a full run's, in half the time). Nothing is written anywhere else but
the temporary directory (removed unless ``--keep``); no network. PyTorch's test file
imports ``expecttest`` (through ``torch.testing._internal.common_utils``): where it is not
installed, a stub of the little the file uses goes into the temporary directory.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

# The test classes of test_dataloader.py that construct DataLoaders (chosen by reading the
# file); the dataset-only classes (TestTensorDataset, TestStackDataset, TestConcatDataset,
# the rest of TestDatasetRandomSplit) test torch.utils.data's datasets, not the loader.
# A name ending in "::test_..." selects one test; TestDataLoaderDeviceType is instantiated
# per device (TestDataLoaderDeviceTypeCPU, ...), hence the prefix match.
SELECTION = (
    "TestDataLoader",
    "TestDataLoaderPersistentWorkers",
    "TestDataLoaderDeviceType*",
    "IntegrationTestDataLoaderDataPipe",
    "TestStringDataLoader",
    "TestDictDataLoader",
    "TestNamedTupleDataLoader",
    "TestCustomPinFn",
    "TestIndividualWorkerQueue",
    "TestSetAffinity",
    "TestConvAfterFork",
    "TestDatasetRandomSplit::test_splits_indexing_type",
)

# Tests in the selected classes that never construct a DataLoader: they test samplers,
# default_convert / default_collate or worker seeding helpers directly, so they pass or
# fail the same with any loader. Reported apart, so that the ratio over the tests that do
# use a loader is visible too.
NO_LOADER = (
    "test_random_sampler",
    "test_distributed_sampler_invalid_rank",
    "test_sampler_reproducibility",
    "test_numpy_gen_state",
    "test_default_convert_mapping_keep_type",
    "test_default_convert_sequence_keep_type",
    "test_default_convert_sequence_dont_keep_type",
    "test_default_collate_dtype",
    "test_default_collate_mapping_keep_type",
    "test_default_collate_sequence_keep_type",
    "test_default_collate_sequence_dont_keep_type",
    "test_default_collate_bad_numpy_types",
    "test_default_collate_numpy_memmap",
    "test_default_collate_bad_sequence_type",
    "test_default_collate_shared_tensor",
)

MODULE = "test_dataloader"  # the copy keeps this name: the file imports itself by it

# Rebinds the name in every Python process started with this directory on PYTHONPATH.
SITECUSTOMIZE = '''\
import os
if os.environ.get("STOKER_PARITY_PATCH") == "1":
    import torch.utils.data
    import stoker
    torch.utils.data.DataLoader = stoker.Loader
    torch.utils.data.dataloader.DataLoader = stoker.Loader
'''

# A pytest plugin writing one JSON line as each test starts and as each phase ends, so
# that a run that dies still says what it did and which test it was running.
PLUGIN = '''\
import json, os, time

_OUT = os.environ["PARITY_EVENTS"]


def _write(event):
    with open(_OUT, "a") as f:
        f.write(json.dumps(event) + "\\n")


def _first_line(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr or "")
    if isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
        text = report.longrepr[2]
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:400]
    return ""


def pytest_runtest_logstart(nodeid, location):
    _write({"event": "start", "nodeid": nodeid, "time": time.time()})


def pytest_runtest_logreport(report):
    outcome = report.outcome
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    _write({"event": "report", "nodeid": report.nodeid, "when": report.when,
            "outcome": outcome, "message": _first_line(report) if outcome != "passed" else "",
            "duration": report.duration})
'''

# torch.testing._internal.common_utils imports expecttest (a test dependency of PyTorch,
# not of torch): where it is missing, this much of it is enough for test_dataloader.py.
EXPECTTEST_STUB = '''\
"""A stub of expecttest (written by stoker's scripts/dataloader_parity.py)."""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    pass
'''

# Why stoker fails the tests it still fails, by test name (a TestDataLoader test fails or
# passes the same in TestDataLoaderPersistentWorkers): (kind, reason), where kind is
#   a  a gap in stoker's drop-in behaviour (to fix; "larger": beyond the Python layer)
#   b  a test of DataLoader's own machinery (_workers, _iterator, worker queues and
#      processes), which no other implementation has
#   c  a behaviour stoker has on purpose (the reason says which and why)
# The first failure a test meets decides its line; a test that fails for an unlisted
# reason is reported as unexplained.
KNOWN = {
    "test_worker_init_fn": (
        "c", "worker processes seed random, numpy.random and torch's generator before each "
        "sample from (seed, epoch, index), so that the batches are the same for any worker "
        "count, chunk assignment and resume; that overrides the torch.manual_seed a "
        "worker_init_fn made, which DataLoader's once-per-worker seeding leaves in place"),
    "test_multi_epochs_reproducibility": (
        "c", "an IterableDataset's batches are cut from the merged stream of the workers "
        "(so the batch count does not depend on num_workers: NOTE [ Iterable datasets ]); "
        "DataLoader batches each worker's stream apart, which this test checks"),
    "test_iterable_style_dataset": (
        "c", "expects per-worker batches (as test_multi_epochs_reproducibility)"),
    "test_ind_worker_queue": (
        "b", "checks that batch i is made by worker i % num_workers (DataLoader's "
        "per-worker index queues); stoker's worker processes each take a chunk of every "
        "batch, as they come"),
    "test_multiprocessing_iterdatapipe": (
        "c", "expects one batch per worker, where stoker batches the workers' merged "
        "stream (as test_multi_epochs_reproducibility)"),
}


def _kind(nodeid: str) -> Optional[Tuple[str, str]]:
    return KNOWN.get(nodeid.rsplit("::", 1)[1])


def _first(message: str) -> str:
    """A failure's first line with its numbers as N, to group like failures."""
    return re.sub(r"\d+", "N", message)[:160]


def _selected(nodeid: str) -> bool:
    parts = nodeid.split("::")
    if len(parts) < 3:
        return False
    cls, test = parts[1], parts[2]
    for sel in SELECTION:
        name, _, one = sel.partition("::")
        hit = cls.startswith(name[:-1]) if name.endswith("*") else cls == name
        if hit and (not one or test == one):
            return True
    return False


def _pytest(python: str, tmp: str, ini: str, args: List[str]) -> List[str]:
    return [python, "-m", "pytest", "-c", ini, "--rootdir", tmp, "-p", "no:cacheprovider",
            "-q", *args]


def collect(python: str, tmp: str, ini: str, env: Dict[str, str],
            only: Optional[str]) -> List[str]:
    out = subprocess.run(_pytest(python, tmp, ini, ["--collect-only", f"{MODULE}.py"]),
                         cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line]
    if not ids:
        sys.exit(f"collecting the tests failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    ids = [i for i in ids if _selected(i)]
    if only:
        ids = [i for i in ids if re.search(only, i.split("::", 1)[1].replace("::", "."))]
    return ids


def _read_events(path: str) -> List[dict]:
    if not os.path.exists(path):
        return []
    events = []
    with open(path) as f:
        for line in f:
            try:
                events.append(json.loads(line))
            except ValueError:  # a line cut short by a kill
                pass
    return events


def _outcomes(events: List[dict]) -> Tuple[Dict[str, Tuple[str, str]], Optional[str]]:
    """Each finished test's (outcome, first line), and the test started but not finished."""
    phases: Dict[str, List[dict]] = collections.defaultdict(list)
    started: List[str] = []
    for e in events:
        if e["event"] == "start":
            started.append(e["nodeid"])
        else:
            phases[e["nodeid"]].append(e)
    done: Dict[str, Tuple[str, str]] = {}
    for nodeid, reps in phases.items():
        if not any(r["when"] == "teardown" for r in reps):
            continue
        outcome, message = "passed", ""
        for r in reps:
            if r["outcome"] in ("failed", "xpassed"):
                outcome = "error" if r["when"] != "call" else "failed"
                message = message or r["message"] or r["outcome"]
            elif r["outcome"] in ("skipped", "xfailed") and outcome == "passed":
                outcome, message = r["outcome"], r["message"]
        done[nodeid] = (outcome, message)
    running = next((n for n in reversed(started) if n not in done), None)
    return done, running


def run_mode(mode: str, python: str, tmp: str, ini: str, base_env: Dict[str, str],
             ids: List[str], timeout: float) -> Dict[str, Tuple[str, str]]:
    """Runs `ids` under pytest until each has an outcome; a run that hangs past the
    per-test timeout (plus a margin) or dies marks its running test and goes on."""
    env = dict(base_env)
    if mode == "stoker":
        env["STOKER_PARITY_PATCH"] = "1"
    results: Dict[str, Tuple[str, str]] = {}
    attempt = 0
    while True:
        remaining = [i for i in ids if i not in results]
        if not remaining:
            return results
        attempt += 1
        events_path = os.path.join(tmp, f"events-{mode}-{attempt}.jsonl")
        env["PARITY_EVENTS"] = events_path
        args_file = os.path.join(tmp, f"ids-{mode}-{attempt}.txt")
        with open(args_file, "w") as f:
            f.write("\n".join(remaining) + "\n")
        cmd = _pytest(python, tmp, ini, ["-p", "parity_plugin", f"--timeout={timeout:g}",
                                         "--timeout-method=signal", f"@{args_file}"])
        log = open(os.path.join(tmp, f"log-{mode}-{attempt}.txt"), "w")
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        reason = None
        last_size, last_change = -1, time.time()
        while proc.poll() is None:
            time.sleep(1)
            size = os.path.getsize(events_path) if os.path.exists(events_path) else 0
            if size != last_size:
                last_size, last_change = size, time.time()
            elif time.time() - last_change > timeout + 60:  # the test's own timeout failed
                reason = "hung"
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        try:  # workers the run left behind, in its process group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        done, running = _outcomes(_read_events(events_path))
        results.update({k: v for k, v in done.items() if k in remaining})
        if running is not None and running not in results:
            why = reason or f"crashed (pytest exited with {proc.returncode})"
            results[running] = ("failed", f"{why} while running this test")
        if not any(i not in results for i in remaining):
            continue
        if running is None and not done:  # nothing ran at all: report, do not loop
            with open(os.path.join(tmp, f"log-{mode}-{attempt}.txt")) as f:
                tail = f.read()[-3000:]
            for i in remaining:
                results.setdefault(i, ("error", "the pytest run produced no result"))
            print(f"[{mode}] pytest produced no result:\n{tail}", file=sys.stderr)
        elif running is None:  # finished, but some tests were never reported
            for i in remaining:
                results.setdefault(i, ("error", "not reported by pytest"))


def _name(nodeid: str) -> str:
    return nodeid.split("::", 1)[1].replace("::", ".")


def report(ids: List[str], base: Dict[str, Tuple[str, str]],
           mine: Dict[str, Tuple[str, str]]) -> dict:
    passing = [i for i in ids if base[i][0] == "passed"]
    both = [i for i in passing if mine[i][0] == "passed"]
    failing = [i for i in passing if mine[i][0] != "passed"]
    with_loader = [i for i in passing if i.rsplit("::", 1)[1] not in NO_LOADER]
    both_loader = [i for i in with_loader if mine[i][0] == "passed"]
    counts = collections.Counter(base[i][0] for i in ids)
    print(f"selected tests: {len(ids)}; DataLoader: "
          + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    print(f"DataLoader passes {len(passing)}; stoker passes {len(both)} of them: "
          f"{len(both) / max(1, len(passing)):.1%}")
    print(f"  over the {len(with_loader)} of them that construct a loader: "
          f"{len(both_loader)}, {len(both_loader) / max(1, len(with_loader)):.1%}")
    titles = {"a": "(a) gaps in stoker's drop-in behaviour",
              "b": "(b) tests of DataLoader's own machinery",
              "c": "(c) behaviour stoker has on purpose",
              "?": "unexplained (grouped by their first line)"}
    groups: Dict[str, List[str]] = collections.defaultdict(list)
    unexplained: Dict[str, List[str]] = collections.defaultdict(list)
    for i in failing:
        outcome, message = mine[i]
        known = _kind(i)
        if known is None:
            unexplained[_first(message)].append(_name(i))
            groups["?"].append(i)
        else:
            groups[known[0]].append(i)
    if failing:
        print(f"\nstoker fails {len(failing)} of them:")
    for kind in ("a", "b", "c"):
        if not groups[kind]:
            continue
        print(f"\n{titles[kind]} ({len(groups[kind])}):")
        by_test: Dict[str, List[str]] = collections.defaultdict(list)
        for i in groups[kind]:
            by_test[i.rsplit("::", 1)[1]].append(i)
        for test in sorted(by_test):
            nodes = by_test[test]
            classes = ", ".join(sorted(n.split("::")[1] for n in nodes))
            firsts = sorted({mine[n][1] for n in nodes})
            print(f"  {test} ({classes}): {' | '.join(firsts)}")
            print(f"      why: {KNOWN[test][1]}")
    if unexplained:
        print(f"\n{titles['?']} ({len(groups['?'])}):")
        for first in sorted(unexplained, key=lambda f: -len(unexplained[f])):
            print(f"  {first}")
            for name in sorted(unexplained[first]):
                print(f"      {name}")
    extra = [i for i in ids if base[i][0] != "passed" and mine[i][0] == "passed"]
    if extra:
        print(f"\nstoker passes {len(extra)} that DataLoader does not: "
              + ", ".join(_name(i) for i in extra))
    return {"passing": len(passing), "stoker_passing": len(both),
            "ratio": len(both) / max(1, len(passing)),
            "with_loader": len(with_loader), "stoker_with_loader": len(both_loader),
            "failing": {_name(i): {"outcome": mine[i][0], "message": mine[i][1],
                                   "kind": (_kind(i) or ("?", ""))[0],
                                   "why": (_kind(i) or ("?", ""))[1]} for i in failing},
            "tests": {_name(i): {"dataloader": list(base[i]), "stoker": list(mine[i])}
                      for i in ids}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="PyTorch's test/test_dataloader.py")
    ap.add_argument("--only", help="run only tests whose Class.test_name matches this regex")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per test (300)")
    ap.add_argument("--json", help="write every test's outcomes here")
    ap.add_argument("--slow", action="store_true",
                    help="also run the tests PyTorch marks slow (PYTORCH_TEST_WITH_SLOW=1)")
    ap.add_argument("--mode", choices=("both", "dataloader", "stoker"), default="both",
                    help="run both (default), or one side only (its outcomes alone)")
    ap.add_argument("--against", metavar="JSON",
                    help="with --mode stoker: DataLoader's outcomes from an earlier --json")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    opts = ap.parse_args()
    if not os.path.isfile(opts.path):
        sys.exit(f"{opts.path}: no such file")
    earlier: Optional[Dict[str, Tuple[str, str]]] = None
    if opts.against:
        if opts.mode != "stoker":
            sys.exit("--against takes DataLoader's side from a file: use it with --mode stoker")
        with open(opts.against) as f:
            earlier = {name: tuple(sides["dataloader"])
                       for name, sides in json.load(f)["tests"].items() if "dataloader" in sides}

    tmp = tempfile.mkdtemp(prefix="stoker-parity-")
    try:
        shutil.copy(opts.path, os.path.join(tmp, f"{MODULE}.py"))
        with open(os.path.join(tmp, "sitecustomize.py"), "w") as f:
            f.write(SITECUSTOMIZE)
        with open(os.path.join(tmp, "parity_plugin.py"), "w") as f:
            f.write(PLUGIN)
        if importlib.util.find_spec("expecttest") is None:
            with open(os.path.join(tmp, "expecttest.py"), "w") as f:
                f.write(EXPECTTEST_STUB)
            print("note: expecttest is not installed; using a stub of its TestCase")
        ini = os.path.join(tmp, "pytest.ini")
        with open(ini, "w") as f:
            f.write("[pytest]\n")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [tmp] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.pop("STOKER_PARITY_PATCH", None)
        env.pop("CI", None)  # common_utils changes behaviour under CI
        if opts.slow:
            env["PYTORCH_TEST_WITH_SLOW"] = "1"
        ids = collect(sys.executable, tmp, ini, env, opts.only)
        if not ids:
            sys.exit("no test selected")
        print(f"{len(ids)} tests selected; per-test timeout {opts.timeout:g}s", flush=True)
        runs = {}
        for mode in ("dataloader", "stoker"):
            if opts.mode in ("both", mode):
                t0 = time.time()
                runs[mode] = run_mode(mode, sys.executable, tmp, ini, env, ids, opts.timeout)
                print(f"[{mode}] {time.time() - t0:.0f}s", flush=True)
        if earlier is not None:
            missing = [_name(i) for i in ids if _name(i) not in earlier]
            if missing:
                sys.exit(f"{opts.against} has no DataLoader outcome for {len(missing)} of the "
                         f"selected tests (e.g. {missing[0]}): run --mode dataloader again")
            summary = report(ids, {i: earlier[_name(i)] for i in ids}, runs["stoker"])
        elif opts.mode != "both":
            out = runs[opts.mode]
            for i in ids:
                print(f"{_name(i)}: {out[i][0]}" + (f": {out[i][1]}" if out[i][1] else ""))
            summary = {"tests": {_name(i): {opts.mode: list(out[i])} for i in ids}}
        else:
            summary = report(ids, runs["dataloader"], runs["stoker"])
        if opts.json:
            with open(opts.json, "w") as f:
                json.dump(summary, f, indent=1)
    finally:
        if opts.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
