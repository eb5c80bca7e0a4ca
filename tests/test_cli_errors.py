"""Every ``stoker`` subcommand given bad input, as a user would type it (a subprocess):
missing paths, a file for a folder and a folder for a file, unreadable files, names that
are not UTF-8, negative and zero counts, an unreachable URL. Each must end in one line on
stderr that names the argument, with exit status 2 for usage and 1 for bad data, and never
a traceback. Also: help text for every option, a closed stdout, the import budget."""

import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
from conftest import write_dataset

NOT_UTF8 = os.fsdecode(b"out\xff")


def _closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused
    return port


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    w = tmp_path_factory.mktemp("cli-errors")
    write_dataset(w / "ds", 20)
    write_dataset(w / "ds2", 5)
    (w / "afile").write_text("not a dataset\n")
    (w / "empty").mkdir()
    np.save(w / "x.npy", np.arange(10))
    np.save(w / "y5.npy", np.arange(5))
    (w / "adir.npy").mkdir()
    (w / "notnpy.npy").write_bytes(b"hello, not an array")
    (w / "bad.jsonl").write_text('{"text": "fine"}\n{"text": \n')
    (w / "odd.bin").write_bytes(b"\x00\x01\x02")
    from stoker import _core

    jpeg = _core.encode_jpeg(np.full((40, 40, 3), 99, np.uint8))
    (w / "photos" / "a").mkdir(parents=True)  # an ImageFolder tree, not yet a dataset
    (w / "photos" / "a" / "p.jpg").write_bytes(jpeg)
    (w / "cut" / "a").mkdir(parents=True)
    (w / "cut" / "a" / "t.jpg").write_bytes(jpeg[:len(jpeg) // 2])
    (w / "unreadable").mkdir()
    write_dataset(w / "unreadable" / "ds", 5)
    np.save(w / "unreadable" / "x.npy", np.arange(3))
    return w


def _unprivileged():
    """A prefix that runs a command without the power to read any file (root would), or
    None when a permission check cannot be made here."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    caps = "-dac_override,-dac_read_search"
    return [setpriv, "--bounding-set", caps, "--inh-caps", caps]


def stoker(args, cwd, prefix=(), env=None, stdout=subprocess.PIPE):
    return subprocess.run([*prefix, sys.executable, "-m", "stoker", *args], cwd=cwd,
                          stdout=stdout, stderr=subprocess.PIPE, timeout=180,
                          env={**os.environ, **(env or {})})


def check(r, status, *names):
    err = r.stderr.decode("utf-8", "replace")
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    assert r.returncode == status, (r.returncode, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("stoker") and "error" in lines[0], lines[0]
    assert "STOKER_TRACEBACK" not in lines[0], f"an unexpected exception: {lines[0]}"
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


URL = "http://127.0.0.1:{port}/data/train"

CASES = [
    # (arguments, exit status, what the line must name)
    (["inspect", "missing"], 2, ["missing"]),
    (["inspect", "afile"], 2, ["afile"]),
    (["inspect", "empty"], 2, ["empty"]),
    (["inspect", NOT_UTF8], 2, ["UTF-8"]),
    (["inspect", URL], 1, ["127.0.0.1"]),
    (["inspect", "ds", "--frobnicate"], 2, ["--frobnicate"]),
    (["convert", "npy", "afile", "x=x.npy"], 2, ["afile"]),
    (["convert", "npy", "o1", "x=adir.npy"], 2, ["adir.npy"]),
    (["convert", "npy", "o1", "x=notnpy.npy"], 1, ["notnpy.npy"]),
    (["convert", "npy", "o1", "x=missing.npy"], 2, ["missing.npy"]),
    (["convert", "npy", "o1", "x=x.npy", "y=y5.npy"], 2, ["length"]),
    (["convert", "npy", NOT_UTF8, "x=x.npy"], 2, ["UTF-8", "OUT"]),
    (["convert", "npy", "o1", "x=x.npy", "--shard-size", "-5"], 2, ["--shard-size"]),
    # an output that holds a dataset: the flag to pass, as the command line spells it
    (["convert", "npy", "ds", "x=x.npy"], 2, ["ds", "already holds a dataset", "--overwrite"]),
    (["merge", "ds", "ds2"], 2, ["ds2", "--overwrite"]),
    (["example-data", "frob", "o8"], 2, ["frob", "images"]),
    (["example-data", "images"], 2, ["PATH"]),
    (["demo", "--samples", "-1"], 2, ["--samples"]),
    (["demo", "--samples", "0"], 2, ["--samples"]),
    (["demo", "--batch-size", "0"], 2, ["--batch-size"]),
    (["demo", "--epochs", "0"], 2, ["--epochs"]),
    (["demo", "--samples", "ten"], 2, ["--samples"]),
    (["demo", "--out", "afile", "--samples", "10"], 2, ["afile"]),
    (["demo", "--out", NOT_UTF8, "--samples", "10"], 2, ["--out", "UTF-8"]),
    (["bench", "--samples", "0"], 2, ["--samples"]),
    (["bench", "ds", "--threads", "0"], 2, ["--threads"]),
    (["bench", "ds", "--threads", "-2"], 2, ["--threads"]),
    (["bench", "ds", "--workers", "-1"], 2, ["--workers"]),
    (["bench", "ds", "--repeats", "0"], 2, ["--repeats"]),
    (["bench", "ds", "--sweep", "--seconds", "-1"], 2, ["--seconds"]),
    (["bench", "ds", "--plot", "p.png"], 2, ["--plot"]),
    (["bench", "--ray-actors", "2"], 2, ["--ray-actors"]),
    (["bench", "ds", "--ray-actors", "0"], 2, ["--ray-actors"]),
    (["bench", "ds", "--sweep", "--ray-actors", "2"], 2, ["--ray-actors"]),
    (["bench", "missing"], 2, ["missing"]),
    (["bench", "afile"], 2, ["afile"]),
    (["bench", "empty"], 2, ["empty"]),
    (["bench", URL], 1, ["127.0.0.1"]),
    (["merge", "ds", "ds", "o2"], 2, ["ds", "twice"]),
    (["merge", "missing", "o2"], 2, ["missing"]),
    (["merge", "afile", "o2"], 2, ["afile"]),
    (["merge", "ds", "afile"], 2, ["afile"]),
    (["merge", "ds", NOT_UTF8], 2, ["UTF-8"]),
    (["merge", "ds", "o2", "--metadata", "{nope"], 2, ["--metadata"]),
    (["convert", "tfrecord", "missing", "o3"], 2, ["missing"]),
    (["convert", "tfrecord", "afile", "o3"], 1, ["afile"]),
    (["convert", "tfrecord", "empty", "o3"], 2, ["empty"]),
    (["convert", "tfrecord", "afile", "o3", "--workers", "0"], 2, ["--workers"]),
    (["convert", "tfrecord", "afile", "o3", "--infer-records", "-3"], 2, ["--infer-records"]),
    (["convert", "webdataset", "afile", "o4"], 1, ["afile"]),
    (["convert", "webdataset", "missing", "o4"], 2, ["missing"]),
    (["convert", "jsonl", "missing", "o5", "--tokenizer", "tiktoken:gpt2"], 2, ["missing"]),
    (["convert", "jsonl", "bad.jsonl", "o5", "--tokenizer", "json:loads"], 1, ["bad.jsonl:2"]),
    (["convert", "jsonl", "bad.jsonl", "o5", "--tokenizer", "nothing-here"], 2,
     ["nothing-here"]),
    (["convert", "jsonl", "bad.jsonl", "afile", "--tokenizer", "json:loads"], 2, ["afile"]),
    (["convert", "imagefolder", "afile", "o6"], 2, ["afile"]),
    (["convert", "imagefolder", "missing", "o6"], 2, ["missing"]),
    (["convert", "imagefolder", "empty", "o6"], 2, ["empty"]),
    (["convert", "imagefolder", "empty", "o6", "--quality", "0"], 2, ["--quality"]),
    (["convert", "imagefolder", "cut", "o6"], 1, ["t.jpg", "truncated JPEG", "--skip-bad"]),
    # images where a dataset belongs: the command that makes one
    (["inspect", "photos"], 2, ["photos", "stoker convert imagefolder"]),
    (["inspect", "photos/a/p.jpg"], 2, ["p.jpg", "a JPEG image", "stoker convert imagefolder"]),
    (["bench", "photos"], 2, ["photos", "stoker convert imagefolder"]),
    (["convert", "megatron", "afile", "o7"], 2, ["afile"]),
    (["convert", "nanogpt", "odd.bin", "o7", "--dtype", "uint16"], 1, ["odd.bin"]),
    (["convert", "nanogpt", "odd.bin", "o7", "--dtype", "float"], 2, ["--dtype"]),
    (["convert", "frob", "a", "b"], 2, ["frob"]),
    (["frobnicate"], 2, ["frobnicate"]),
    ([], 2, ["COMMAND"]),
]


@pytest.mark.parametrize("args,status,names", CASES,
                         ids=[" ".join(c[0]).encode("ascii", "replace").decode()
                              for c in CASES])
def test_bad_input_is_one_line(work, args, status, names):
    port = _closed_port()
    args = [a.format(port=port) if "{port}" in a else a for a in args]
    r = stoker(args, work)
    check(r, status, *names)
    assert not (work / "o1").exists() and not (work / "o3").exists()  # nothing half-written


def test_offline_tiktoken_names_what_to_fetch(work, tmp_path):
    """tiktoken downloads an encoding on first use; offline that is one line saying what
    to fetch and where it is cached, not 60 lines of urllib3."""
    env = {"TIKTOKEN_CACHE_DIR": str(tmp_path / "empty-cache"),
           "HTTPS_PROXY": f"http://127.0.0.1:{_closed_port()}", "HTTP_PROXY": "",
           "https_proxy": f"http://127.0.0.1:{_closed_port()}", "NO_PROXY": ""}
    (work / "ok.jsonl").write_text('{"text": "hello"}\n')
    r = stoker(["convert", "jsonl", "ok.jsonl", str(tmp_path / "o"), "--tokenizer",
                "tiktoken:gpt2"], work, env=env)
    line = check(r, 2, "tiktoken:gpt2", "TIKTOKEN_CACHE_DIR")
    assert "download" in line


def test_unreadable_files_are_permission_errors(work):
    prefix = _unprivileged()
    if prefix is None:
        pytest.skip("running as root without setpriv: every file is readable")
    unr = work / "unreadable"
    (unr / "ds" / "index.json").chmod(0)
    (unr / "x.npy").chmod(0)
    try:
        r = stoker(["inspect", "ds"], unr, prefix)
        check(r, 2, "index.json", "Permission denied")
        r = stoker(["convert", "npy", "o", "x=x.npy"], unr, prefix)
        check(r, 2, "x.npy", "Permission denied")
        r = stoker(["merge", "ds", "o"], unr, prefix)
        check(r, 2, "index.json")
    finally:
        (unr / "ds" / "index.json").chmod(0o644)
        (unr / "x.npy").chmod(0o644)


def test_a_closed_stdout_is_not_a_traceback(work):
    """`stoker inspect --json | head -1`: the reader leaves before stoker has written."""
    read, write = os.pipe()
    os.close(read)
    try:
        r = stoker(["inspect", "ds", "--json"], work, stdout=write)
    finally:
        os.close(write)
    assert r.returncode in (0, 1, 141) and b"Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == b"", r.stderr


def test_inspect_json_pipes_whole(work):
    r = stoker(["inspect", "ds", "--json"], work)
    assert r.returncode == 0 and json.loads(r.stdout)["samples"] == 20


def _actions(parser, path=()):
    import argparse

    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _actions(sub, path + (name,))
        else:
            yield path, a


def test_every_option_has_help():
    import argparse

    from stoker.cli import build_parser

    p = build_parser()
    missing = [f"stoker {' '.join(path)} {a.option_strings or a.dest}"
               for path, a in _actions(p)
               if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert missing == []
    commands = {path[0] for path, _ in _actions(p) if path}
    assert {"demo", "inspect", "convert", "merge", "bench"} <= commands
    top = p.format_help()
    assert "merge" in top
    helps = [top] + [sub.format_help() for a in p._actions
                     if isinstance(a, argparse._SubParsersAction) for sub in a.choices.values()]
    for text in helps:  # plain text, not reST
        assert "``" not in text and ":mod:" not in text and ":class:" not in text, text


def test_no_torch_for_help_inspect_and_merge(work):
    """`stoker --help`, `inspect` and `merge` need neither torch, NumPy (about 0.15 s of a
    0.3 s budget), the remote package (http.client, ssl) nor the benchmarks: imports are
    checked, not timed (timings are not pass/fail here)."""
    probe = ("import sys, runpy\n"
             "sys.argv = ['stoker'] + sys.argv[1:]\n"
             "try:\n"
             "    runpy.run_module('stoker', run_name='__main__')\n"
             "except SystemExit as e:\n"
             "    code = e.code\n"
             "bad = sorted(m for m in sys.modules\n"
             "             if m in ('torch', 'numpy', 'stoker.remote')\n"
             "             or m.startswith('stoker.bench.'))\n"
             "sys.stderr.write('IMPORTED ' + ' '.join(bad) + '\\n')\n")
    for args in (["--help"], ["inspect", "ds"], ["inspect", "ds", "--verify"],
                 ["merge", "ds", str(work / "merged"), "--overwrite"],
                 ["convert", "npy", "--help"]):
        r = subprocess.run([sys.executable, "-c", probe, *args], cwd=work,
                           capture_output=True, text=True, timeout=120)
        imported = [ln for ln in r.stderr.splitlines() if ln.startswith("IMPORTED")]
        assert imported == ["IMPORTED "], (args, r.stderr)
