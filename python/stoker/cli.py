"""The ``stoker`` command line: demo, convert, inspect, bench."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import List, Optional

import numpy as np

from ._progress import Progress


def _demo(args: argparse.Namespace) -> int:
    """Writes a small built-in dataset and iterates it, printing throughput."""
    from . import Dataset, Loader, ShardWriter, ndarray, scalar

    tmp = None
    out = args.out
    if out is None:
        tmp = tempfile.TemporaryDirectory(prefix="stoker-demo-")
        out = tmp.name
    path = os.path.join(out, "demo")
    rng = np.random.default_rng(0)
    fields = {"x": ndarray("uint8", (3, 64, 64)), "tokens": ndarray("int32", (None,)),
              "label": scalar("int64")}
    t0 = time.perf_counter()
    with ShardWriter(path, fields, shard_size="16MB", overwrite=True) as w:
        for i in range(args.samples):
            w.write({"x": rng.integers(0, 256, (3, 64, 64), dtype=np.uint8),
                     "tokens": rng.integers(0, 50000, rng.integers(1, 64), dtype=np.int32),
                     "label": i % 10})
    print(f"wrote {args.samples} samples to {path} in {time.perf_counter() - t0:.2f} s")
    ds = Dataset(path)
    print(ds)
    loader = Loader(ds, batch_size=args.batch_size, shuffle=True, seed=0)
    print(f"{loader}: {len(loader)} batches per epoch")
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        first = None
        n = 0
        for batch in loader:
            if first is None:
                first = time.perf_counter() - t0
                shapes = {k: tuple(v.shape) for k, v in batch.items()}
            n += len(batch["label"])
        secs = time.perf_counter() - t0
        print(f"epoch {epoch}: {n} samples in {secs:.3f} s = {n / secs:,.0f} samples/s "
              f"(first batch after {first * 1e3:.1f} ms)")
    print(f"batch: {shapes}")
    state = loader.stats()
    print("stats: " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                for k, v in state.items()
                                if isinstance(v, (int, float)) and not isinstance(v, bool)))
    mode = "settled" if state["settled"] else \
        "tuning" if state["auto_threads"] or state["auto_prefetch"] else "as given"
    print(f"settings in force: num_threads={state['num_threads']} prefetch={state['prefetch']}"
          f" ({mode})")
    print(f"verdict: {state['verdict']}")
    if tmp is not None:
        tmp.cleanup()
    return 0


def _inspect(args: argparse.Namespace) -> int:
    """Exit status: 0 fine, 1 the dataset is corrupt (any problem found), 2 usage errors
    (no such dataset, another writer busy)."""
    from . import Dataset
    from ._core import DataError
    from .writer import WriterLockError, clean, upgrade

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
    except (FileNotFoundError, WriterLockError) as e:
        print(f"stoker: error: {e}", file=sys.stderr)
        return 2
    except DataError as e:
        print(f"BAD {e}")
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
    print(json.dumps(info, indent=2, default=str) if args.json else
          "\n".join(f"{k}: {v}" for k, v in info.items()))
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


def _convert_npy(args: argparse.Namespace) -> int:
    """Arrays whose first dimension is the sample: name=file.npy ... -> a dataset."""
    from . import ShardWriter, ndarray, scalar

    arrays = {}
    for spec in args.arrays:
        name, sep, file = spec.partition("=")
        if not sep:
            name, file = os.path.splitext(os.path.basename(spec))[0], spec
        arrays[name] = np.load(file, mmap_mode="r")
    lengths = {len(a) for a in arrays.values()}
    if len(lengths) != 1:
        raise SystemExit(f"stoker convert npy: arrays differ in length: "
                         f"{ {n: len(a) for n, a in arrays.items()} }")
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


def version_text() -> str:
    """What ``stoker --version`` prints: the version and how the native core was built."""
    from . import __version__, _core

    info = _core.build_info()
    images = (info["codecs"] if info["images"]
              else "none (built with -DSTOKER_WITH_IMAGES=OFF)")
    text = f"stoker {__version__} (image codecs: {images})"
    if info["version"] not in (__version__, "unknown"):
        text += f"\nwarning: the compiled core is version {info['version']}: reinstall stoker"
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stoker", description=__doc__)
    p.add_argument("--version", action="version", version=version_text())
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="write a small built-in dataset and iterate it")
    d.add_argument("--out", default=None, help="where to write it (default: a temp dir)")
    d.add_argument("--samples", type=int, default=10000)
    d.add_argument("--batch-size", type=int, default=256)
    d.add_argument("--epochs", type=int, default=3)
    d.set_defaults(func=_demo)

    i = sub.add_parser("inspect", help="describe a dataset; --verify checks every record",
                       description="Describe a dataset. Exit status 0: fine; 1: the dataset "
                                   "is corrupt; 2: usage error (no dataset, writer busy).")
    i.add_argument("path")
    i.add_argument("--verify", action="store_true",
                   help="check every shard and record; list each problem; exit 1 if any")
    i.add_argument("--upgrade", action="store_true",
                   help="rewrite a format-version-1 dataset in the current format "
                        "(in place, atomically)")
    i.add_argument("--clean", action="store_true",
                   help="remove old generations no reader uses and leftovers of killed "
                        "writes")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=_inspect)

    c = sub.add_parser("convert", help="convert data to a stoker dataset")
    csub = c.add_subparsers(dest="source", required=True)
    npy = csub.add_parser("npy", help="NumPy arrays (first dim = sample) to a dataset")
    npy.add_argument("out")
    npy.add_argument("arrays", nargs="+", metavar="NAME=FILE.npy")
    npy.add_argument("--shard-size", default="256MB")
    npy.add_argument("--overwrite", action="store_true")
    npy.add_argument("--quiet", action="store_true", help="no progress bar")
    npy.set_defaults(func=_convert_npy)
    try:
        from .convert import imagefolder
    except ImportError:
        imagefolder = None
    if imagefolder is not None:
        imf = csub.add_parser("imagefolder", help="torchvision ImageFolder layout to a dataset")
        imagefolder.add_arguments(imf)
        imf.set_defaults(func=imagefolder.run)
    from .convert import tfrecord, webdataset
    from .convert.merge import add_arguments as merge_arguments
    from .convert.merge import run as merge_run

    tfr = csub.add_parser("tfrecord", help="TFRecord files of tf.train.Example to a dataset")
    tfrecord.add_arguments(tfr)
    tfr.set_defaults(func=tfrecord.run)
    wds = csub.add_parser("webdataset", help="WebDataset tar shards to a dataset")
    webdataset.add_arguments(wds)
    wds.set_defaults(func=webdataset.run)

    mrg = sub.add_parser("merge", help="merge part datasets (from Ray, Spark, ...) into one")
    merge_arguments(mrg)
    mrg.set_defaults(func=merge_run)
    from .convert import text as text_convert
    from .convert import tokens as token_convert

    for fmt, what in (("jsonl", "JSON lines"), ("parquet", "Parquet files"),
                      ("hf", "a HuggingFace datasets folder (save_to_disk)")):
        t = csub.add_parser(fmt, help=f"{what} to token documents through a tokenizer")
        text_convert.add_arguments(t, fmt)
        t.set_defaults(func=text_convert.run)
    for fmt, what in (("megatron", "a Megatron-LM .bin/.idx dataset"),
                      ("nanogpt", "nanoGPT flat token files")):
        t = csub.add_parser(fmt, help=f"{what} to checksummed token documents")
        token_convert.add_arguments(t, fmt)
        t.set_defaults(func=token_convert.run)

    from . import bench

    b = sub.add_parser("bench", help="benchmark a dataset (or synthetic records) against "
                                    "DataLoader and the decode ceiling")
    bench.add_arguments(b)
    b.set_defaults(func=bench.main)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from ._core import DataError

    try:
        return args.func(args)
    except (DataError, FileNotFoundError, FileExistsError, BlockingIOError, ValueError) as e:
        print(f"stoker: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
