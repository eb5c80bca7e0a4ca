"""Benchmarks of ``stoker bench``.

``stoker bench DATASET``: your own dataset (:mod:`stoker.bench.dataset`).
``stoker bench DATASET --sweep [--plot FILE.png]``: batch size x threads on it
(:mod:`stoker.bench.sweep`).
``stoker bench`` (no dataset): fixed-size records (:mod:`stoker.bench.records`).
"""

from __future__ import annotations

import argparse
from typing import List

from ._timing import memcpy_bandwidth, warm
from .dataset import PythonDataset, collate, pil_decode, rrc_params, run_dataset
from .records import make_data, run
from .sweep import Point, sweep

__all__ = ["Point", "PythonDataset", "add_arguments", "collate", "main", "make_data",
           "memcpy_bandwidth", "pil_decode", "rrc_params", "run", "run_dataset", "sweep", "warm"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", nargs="?", default=None,
                   help="a stoker dataset to benchmark; without it, a synthetic one of "
                        "fixed-size records")
    p.add_argument("--samples", type=int, default=20000,
                   help="synthetic dataset: number of samples")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=None,
                   help="runs per configuration, median reported (default 3; 1 with --sweep)")
    p.add_argument("--epochs", type=int, default=1,
                   help="synthetic dataset: consecutive epochs per timed run, for every "
                        "contender (steadier than one short epoch)")
    p.add_argument("--data", default=None,
                   help="synthetic dataset: directory to keep it in (default: temp)")
    p.add_argument("--workers", default="0,1,2", help="DataLoader num_workers to try")
    p.add_argument("--threads", default=None,
                   help="stoker num_threads to try (default: 1,2 synthetic; 1 and all "
                        "cores for a dataset)")
    p.add_argument("--image-size", type=int, default=224,
                   help="dataset: RandomResizedCrop size for image fields, 0 for none")
    p.add_argument("--max-batches", type=int, default=50,
                   help="dataset: batches per timed run at most")
    p.add_argument("--no-dataloader", action="store_true",
                   help="dataset: skip the DataLoader peer")
    p.add_argument("--sweep", action="store_true",
                   help="dataset: batch size x threads: samples/s, first batch, stall and the "
                        "bottleneck per point, the fastest setting, and what a larger batch "
                        "costs on this data")
    p.add_argument("--batch-sizes", default=None,
                   help="--sweep: batch sizes to try (default 32,64,...,512 as the data allows)")
    p.add_argument("--seconds", type=float, default=3.0,
                   help="--sweep: seconds per point after its first batch")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="--sweep: also plot it (needs matplotlib: pip install 'stoker[plot]')")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _int_list(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"expected comma-separated ints, got {text!r}") from None
    if any(v < 0 for v in values):
        raise ValueError(f"expected non-negative ints, got {text!r}")
    return values


def main(args: argparse.Namespace) -> int:
    workers = _int_list(args.workers)
    threads = _int_list(args.threads) if args.threads else None
    if args.plot is not None and not args.sweep:
        raise ValueError("--plot goes with --sweep")
    if args.sweep:
        if args.dataset is None:
            raise ValueError("--sweep runs on a dataset: stoker bench PATH --sweep")
        if args.seconds <= 0:
            raise ValueError(f"--seconds must be positive, got {args.seconds}")
        sweep(args.dataset, _int_list(args.batch_sizes) if args.batch_sizes else None,
              threads, args.image_size, args.seconds, args.repeats or 1, args.plot,
              progress=not args.quiet)
    elif args.dataset is not None:
        run_dataset(args.dataset, args.batch_size, threads, workers, args.repeats or 3,
                    args.image_size, args.max_batches, not args.no_dataloader,
                    progress=not args.quiet)
    else:
        run(args.samples, args.batch_size, args.repeats or 3, args.data, workers,
            threads or [1, 2], progress=not args.quiet, epochs=args.epochs)
    return 0
