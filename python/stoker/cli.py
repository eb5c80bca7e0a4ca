"""The ``stoker`` command line.

Commands import what they need when they run, so that ``stoker --help``, ``inspect`` and
``merge`` start without importing torch or NumPy (tests/test_cli_errors.py checks it).
Every error is one line on stderr, ``stoker CMD: error: ...``, with exit status 2 for
usage (bad arguments, missing or unreadable paths, an output in the way) and 1 for bad
data (corrupt, undecodable, not what the arguments describe) or data that cannot be
fetched (a server that does not answer);
``STOKER_TRACEBACK=1`` shows the traceback as well.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, List, NoReturn, Optional

from ._args import (
    add_out,
    add_overwrite,
    add_quiet,
    add_shard_size,
    check_dataset,
    positive_int,
    utf8_path,
)

DESCRIPTION = """\
Write, convert, check and benchmark stoker datasets.

exit status: 0 done; 1 bad data (corrupt, undecodable, not what the arguments describe) or
data that cannot be fetched; 2 usage (bad arguments, a missing or unreadable path, an
output in the way).
`stoker COMMAND --help` shows a command's options."""


class _Parser(argparse.ArgumentParser):
    """argparse, with errors as one line that names the argument (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Version(argparse.Action):
    """--version, computed when asked for (it loads the native core)."""

    def __init__(self, option_strings: List[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: Optional[str] = None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: Optional[str] = None) -> None:
        print(version_text())
        parser.exit()


def version_text() -> str:
    """What ``stoker --version`` prints: the version and how the native core was built."""
    from . import __version__, _core

    info = _core.build_info()
    images = (info["codecs"] if info["images"]
              else "none (built with -DSTOKER_WITH_IMAGES=OFF)")
    media = (info["media"] if info.get("video")
             else "none (built with -DSTOKER_WITH_VIDEO=OFF)")
    text = f"stoker {__version__} (image codecs: {images}; video and audio: {media})"
    if info["version"] not in (__version__, "unknown"):
        text += f"\nwarning: the compiled core is version {info['version']}: reinstall stoker"
    return text


# -- commands -------------------------------------------------------------------------------

def _demo(args: argparse.Namespace) -> int:
    from .bench.demo import demo

    return demo(args.out, samples=args.samples, batch_size=args.batch_size,
                epochs=args.epochs)


def _inspect(args: argparse.Namespace) -> int:
    """Exit status: 0 fine, 1 the dataset is corrupt (any problem found), 2 usage errors
    (no such dataset, another writer busy)."""
    from . import Dataset
    from ._core import DataError
    from ._progress import Progress
    from .maintenance import clean, upgrade

    check_dataset(args.path)
    try:
        if args.upgrade:
            if upgrade(args.path):
                print(f"{args.path}: upgraded to shard format version 2", file=sys.stderr)
            else:
                print(f"{args.path}: already in the current format", file=sys.stderr)
        if args.clean:
            removed, in_use = clean(args.path)
            for name in removed:
                print(f"removed {name}", file=sys.stderr)
            for name in in_use:
                print(f"kept {name}: a reader still uses it", file=sys.stderr)
        # With --verify, shards are checked one by one below, so that every bad one is
        # listed instead of the first stopping the open.
        ds = Dataset(args.path, check_shards=not args.verify)
    except DataError as e:  # the report, on stdout as the rest of it
        print(f"BAD {_one_line(str(e))}")
        return 1
    sizes = [s["bytes"] for s in ds.shards]
    info = {
        "path": ds.path,
        "samples": len(ds),
        "shards": len(sizes),
        "bytes": sum(sizes),
        "format_version": ds.version,
        "dataset_id": ds.dataset_id,
        "fields": {n: f.spec() for n, f in ds.fields.items()},
        "metadata": ds.metadata,
    }
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        print(describe_dataset(ds))
    if not args.verify:
        return 0

    sizes_done = [0]
    for size in sizes:
        sizes_done.append(sizes_done[-1] + size)
    with Progress(sizes_done[-1], "stoker inspect --verify", unit="B", unit_scale=True) as bar:
        def progress(done: int, total: int) -> None:
            bar.set(sizes_done[done])
            bar.note(f"shard {done}/{total}")

        report = ds.verify(progress=progress)
    bad_shards = len({path for path, _, _ in report["bad"]})
    print(f"verified {report['records']} records, {report['bytes']} bytes in "
          f"{report['shards']} shards: {len(report['bad'])} problem(s) in {bad_shards} "
          "shard(s)")
    for path, rec, reason in report["bad"]:
        where = f"record {rec}" if rec >= 0 else "file"
        print(f"  BAD {path}: {where}: {reason}")
    return 0 if report["ok"] else 1


def _size(n: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:.3g} {unit}"
        n /= 1000
    raise AssertionError


def _short(value: Any, width: int = 72) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= width else text[:width - 22] + " ... (--json: all of it)"


def describe_dataset(ds: Any) -> str:
    """What ``stoker inspect PATH`` prints: a table of the dataset's size, identity, fields
    (as the field constructors that declare them) and metadata (``--json`` gives it all)."""
    sizes = [s["bytes"] for s in ds.shards]
    total = sum(sizes)
    rows = [("samples", f"{len(ds):,}"),
            ("shards", f"{len(sizes):,}, {_size(total)} in all"
             + (f" ({_size(total / len(sizes))} each on average)" if len(sizes) > 1 else "")),
            ("format version", str(ds.version)),
            ("dataset id", ds.dataset_id or "none (format version 1)")]
    width = max(len(n) for n in ds.fields) if ds.fields else 0
    fields = [f"{n:<{width}}  {f!r}" for n, f in ds.fields.items()] or ["(none)"]
    rows += [("fields", fields[0])] + [("", f) for f in fields[1:]]
    meta = ds.metadata
    if isinstance(meta, dict) and meta:
        width = max(len(str(k)) for k in meta)
        lines = [f"{k!s:<{width}}  {_short(v)}" for k, v in meta.items()]
    else:
        lines = ["(none)" if meta in (None, {}) else _short(meta)]
    rows += [("metadata", lines[0])] + [("", m) for m in lines[1:]]
    return "\n".join([ds.path] + [f"  {n:<15} {v}".rstrip() for n, v in rows])


def _load_npy(file: str) -> Any:
    import numpy as np

    from .convert._errors import InputError

    with open(file, "rb") as f:  # a missing file, a folder: OSError, a usage error
        magic = f.read(6)
    if magic != b"\x93NUMPY":
        raise InputError(f"{file}: not a .npy file (no NumPy header); save arrays with "
                         "numpy.save")
    try:
        a = np.load(file, mmap_mode="r")
    except ValueError as e:
        raise InputError(f"{file}: {e}") from None
    if a.dtype.hasobject:
        raise InputError(f"{file}: an array of Python objects cannot be stored; give "
                         "numeric arrays")
    if a.ndim == 0:
        raise InputError(f"{file}: a 0-d array; its first dimension must be the sample")
    return a


def _convert_npy(args: argparse.Namespace) -> int:
    """Arrays whose first dimension is the sample: name=file.npy ... -> a dataset."""
    from . import ShardWriter, ndarray, scalar
    from ._progress import Progress

    arrays = {}
    for spec in args.arrays:
        name, sep, file = spec.partition("=")
        if not sep:
            name, file = os.path.splitext(os.path.basename(spec))[0], spec
        if not name:
            raise ValueError(f"argument NAME=FILE.npy: {spec!r} has no field name")
        if name in arrays:
            raise ValueError(f"argument NAME=FILE.npy: field {name!r} given twice")
        arrays[name] = _load_npy(file)
    lengths = {len(a) for a in arrays.values()}
    if len(lengths) != 1:
        raise ValueError("the arrays differ in length (first dimension): "
                         + ", ".join(f"{n}: {len(a)}" for n, a in arrays.items()))
    fields = {n: scalar(a.dtype) if a.ndim == 1 else ndarray(a.dtype, a.shape[1:])
              for n, a in arrays.items()}
    n = lengths.pop()
    with ShardWriter(args.out, fields, shard_size=args.shard_size,
                     overwrite=args.overwrite) as w, \
            Progress(n, "stoker convert npy", unit="samples", enabled=not args.quiet) as bar:
        for i in range(n):
            w.write({k: a[i] for k, a in arrays.items()})
            bar.update()
    print(f"wrote {n} samples with fields {list(fields)} to {args.out}", file=sys.stderr)
    return 0


def _lazy(module: str, function: str) -> Any:
    """A command handler that imports ``stoker.<module>`` when the command runs."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        return int(getattr(importlib.import_module(f"stoker.{module}"), function)(args))

    return run


def _wanted(argv: Optional[List[str]]) -> Optional[List[str]]:
    """The command (and format) `argv` asks for: the parser then adds the arguments of
    those alone, importing no other converter. None: all of them."""
    if argv is None:
        return None
    words = [a for a in argv if not a.startswith("-")]
    return words[:2]


def build_parser(argv: Optional[List[str]] = None) -> argparse.ArgumentParser:
    """The parser; with `argv`, one whose subcommands other than the one asked for have no
    arguments yet (each imports its module to add them, and --help lists only names)."""
    import importlib

    wanted = _wanted(argv)

    def want(*path: str) -> bool:
        return wanted is None or list(path) == wanted[:len(path)]

    def module(name: str) -> Any:
        return importlib.import_module(f"stoker.{name}")

    p = _Parser(prog="stoker", description=DESCRIPTION,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=_Version,
                   help="print the version and the image, video and audio codecs of the native "
                        "core")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser("demo", help="write a small built-in dataset and iterate it, with "
                                    "throughput and where the time goes",
                       description="Writes a small dataset (uint8[3,64,64] images, variable-"
                                   "length int32 tokens, an int64 label), iterates it for a "
                                   "few epochs and reports samples/s with its spread and "
                                   "where the workers' time goes.")
    d.add_argument("--out", default=None, metavar="DIR", type=utf8_path,
                   help="where to write it (default: a temporary folder, removed after)")
    d.add_argument("--samples", type=positive_int, default=10000, metavar="N",
                   help="samples to write (default 10000)")
    d.add_argument("--batch-size", type=positive_int, default=256, metavar="N",
                   help="samples per batch (default 256)")
    d.add_argument("--epochs", type=positive_int, default=4, metavar="N",
                   help="epochs to time (default 4: the first, which maps the shards and "
                        "starts the threads, and 3 more for the median and spread)")
    d.set_defaults(func=_demo)

    e = sub.add_parser("example-data", help="write the small example data that the docs' "
                                            "examples read",
                       description="Writes small example data (a second or two each) at "
                                   "PATH: what an example of the docs names in its first "
                                   "line, e.g. `stoker example-data images data/train`.",
                       epilog=module("example_data").kinds_help() if want("example-data")
                       else None,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    if want("example-data"):
        module("example_data").add_arguments(e)
    e.set_defaults(func=_lazy("example_data", "run"))

    i = sub.add_parser("inspect", help="describe a dataset; --verify checks every record",
                       description="Describe a dataset. Exit status 0: fine; 1: the dataset "
                                   "is corrupt; 2: usage error (no dataset, writer busy).")
    i.add_argument("path", metavar="PATH", type=utf8_path,
                   help="a dataset directory (or its index.json), or an https:// or s3:// URL")
    i.add_argument("--verify", action="store_true",
                   help="check every shard and record; list each problem; exit 1 if any")
    i.add_argument("--upgrade", action="store_true",
                   help="rewrite a format-version-1 dataset in the current format "
                        "(in place, atomically)")
    i.add_argument("--clean", action="store_true",
                   help="remove old generations no reader uses and leftovers of killed "
                        "writes")
    i.add_argument("--json", action="store_true", help="print the description as JSON")
    i.set_defaults(func=_inspect)

    c = sub.add_parser("convert", help="convert data to a stoker dataset (npy, imagefolder, "
                                       "video, audio, tfrecord, webdataset, jsonl, parquet, "
                                       "hf, megatron, nanogpt)",
                       description="Convert data to a stoker dataset. `stoker convert FORMAT "
                                   "--help` shows a format's options.")
    csub = c.add_subparsers(dest="source", required=True, metavar="FORMAT")
    npy = csub.add_parser("npy", help="NumPy arrays (first dim = sample) to a dataset",
                          description="NumPy .npy arrays whose first dimension is the sample "
                                      "to a dataset: one field per array.")
    add_out(npy)
    npy.add_argument("arrays", nargs="+", metavar="NAME=FILE.npy",
                     help="a field name and its array (FILE.npy alone: the file's name)")
    add_shard_size(npy)
    add_overwrite(npy)
    add_quiet(npy)
    npy.set_defaults(func=_convert_npy)
    for fmt, name, what in (
            ("imagefolder", "imagefolder", "torchvision ImageFolder layout to a dataset"),
            ("video", "media", "class folders of videos to a dataset (labels from folders)"),
            ("audio", "media", "class folders of audio files to a dataset (labels from "
                               "folders)"),
            ("tfrecord", "tfrecord", "TFRecord files of tf.train.Example to a dataset"),
            ("webdataset", "webdataset", "WebDataset tar shards to a dataset"),
            ("jsonl", "text", "JSON lines to token documents through a tokenizer"),
            ("parquet", "text", "Parquet files to token documents through a tokenizer"),
            ("hf", "text", "a HuggingFace datasets folder (save_to_disk) to token documents "
                           "through a tokenizer"),
            ("megatron", "tokens", "a Megatron-LM .bin/.idx dataset to checksummed token "
                                   "documents"),
            ("nanogpt", "tokens", "nanoGPT flat token files to checksummed token documents")):
        t = csub.add_parser(fmt, help=what)
        if want("convert", fmt):
            m = module(f"convert.{name}")
            m.add_arguments(t, fmt) if name in ("text", "tokens", "media") else \
                m.add_arguments(t)
        t.set_defaults(func=_lazy(f"convert.{name}", "run"))

    mrg = sub.add_parser("merge", help="merge part datasets (from Ray, Spark, ...) into one")
    if want("merge"):
        module("convert.merge").add_arguments(mrg)
    mrg.set_defaults(func=_lazy("convert.merge", "run"))

    b = sub.add_parser("bench", help="benchmark a dataset (or synthetic records) against "
                                    "DataLoader; --sweep: batch size x threads",
                       description="Benchmark stoker on your dataset against DataLoader "
                                   "over the same shards (or, without PATH, on synthetic "
                                   "fixed-size records). Every figure is the median of "
                                   "repeated runs, shown with its spread.")
    if want("bench"):
        module("bench").add_arguments(b)
    b.set_defaults(func=_lazy("bench", "main"))
    return p


# -- errors ---------------------------------------------------------------------------------

def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines())


def _describe(e: BaseException) -> str:
    from .writer import DatasetExistsError

    if isinstance(e, DatasetExistsError):  # Python's words are overwrite=True
        return f"{e.path}: already holds a dataset; add --overwrite to replace it"
    if isinstance(e, OSError) and e.strerror:
        if e.filename is None:
            return _one_line(e.strerror)
        where = os.fsdecode(e.filename) if isinstance(e.filename, bytes) else str(e.filename)
        text = f"{where}: {e.strerror}"
        if e.filename2 is not None:
            text += f" ({e.filename2})"
        return text
    return _one_line(str(e)) or type(e).__name__


def _status(e: BaseException) -> int:
    """1 for bad data, 2 for usage (see the module doc)."""
    from ._core import DataError
    from .convert._errors import InputError
    from .convert._workers import WorkerError

    if isinstance(e, (DataError, InputError, WorkerError)):
        return 1
    if isinstance(e, (FileNotFoundError, NotADirectoryError, IsADirectoryError,
                      FileExistsError, PermissionError, BlockingIOError, ValueError)):
        return 2  # BlockingIOError: WriterLockError, another writer holds the dataset
    return 1


def _known(e: BaseException) -> bool:
    from ._core import Error

    return isinstance(e, (OSError, ValueError, Error, RuntimeError))


def main(argv: Optional[List[str]] = None) -> int:
    # A path that is not UTF-8 (Linux allows any bytes) is printed with escapes rather
    # than failing to print.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, a usage error: its status, as a return
        return e.code if isinstance(e.code, int) else 2
    prog = "stoker " + args.command + (f" {args.source}" if args.command == "convert" else "")
    try:
        status = args.func(args)
        sys.stdout.flush()  # a closed pipe is found here, not at exit
        return status
    except BrokenPipeError:
        # `stoker inspect --json | head`: the reader left; nothing more to say. Later
        # flushes (at exit) go nowhere instead of raising again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get("STOKER_TRACEBACK"):
            raise
        text = _describe(e)
        if not _known(e):  # a bug, not the data's fault: say what it was
            text = f"{type(e).__name__}: {text} (STOKER_TRACEBACK=1 shows where)"
        print(f"{prog}: error: {text}", file=sys.stderr)
        return _status(e)


if __name__ == "__main__":
    sys.exit(main())
