"""Benchmarks of ``stoker bench`` and ``stoker demo``.

``stoker bench DATASET``: your own dataset (:mod:`stoker.bench.dataset`).
``stoker bench DATASET --sweep [--plot FILE.png]``: batch size x threads on it
(:mod:`stoker.bench.sweep`).
``stoker bench DATASET --ray-actors N``: the dataset on a stoker.RayService beside the
local loader (:mod:`stoker.bench.service`).
``stoker bench`` (no dataset): fixed-size records (:mod:`stoker.bench.records`).
``stoker demo``: a small dataset written and iterated (:mod:`stoker.bench.demo`).

Every figure is the median of repeated runs, shown with its spread (:mod:`._spread`), and a
cause is stated only when the difference behind it is larger than that spread. The
benchmark modules import torch; this one does not, so ``stoker --help`` stays quick.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from .._args import check_dataset, int_list, nonneg_int, positive_float, positive_int, utf8_path

__all__ = ["Point", "PythonDataset", "add_arguments", "collate", "main", "make_data",
           "memcpy_bandwidth", "pil_decode", "rrc_params", "run", "run_dataset", "sweep", "warm"]

# public names -> the module that defines them, imported on first use
_LAZY = {"Point": "sweep", "sweep": "sweep", "PythonDataset": "dataset", "collate": "dataset",
         "pil_decode": "dataset", "rrc_params": "dataset", "run_dataset": "dataset",
         "make_data": "records", "run": "records", "memcpy_bandwidth": "_timing",
         "warm": "_timing"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", nargs="?", default=None, metavar="PATH", type=utf8_path,
                   help="a stoker dataset to benchmark; without it, a synthetic one of "
                        "fixed-size records")
    p.add_argument("--samples", type=positive_int, default=20000, metavar="N",
                   help="synthetic dataset: number of samples (default 20000)")
    p.add_argument("--batch-size", type=positive_int, default=256, metavar="N",
                   help="samples per batch (default 256)")
    p.add_argument("--repeats", type=positive_int, default=None, metavar="N",
                   help="runs per configuration; the median is reported with the spread "
                        "(default 3; fewer makes the spread unknown, and no cause is then "
                        "stated)")
    p.add_argument("--epochs", type=positive_int, default=1, metavar="N",
                   help="synthetic dataset: consecutive epochs per timed run, for every "
                        "contender (steadier than one short epoch)")
    p.add_argument("--data", default=None, metavar="DIR",
                   help="synthetic dataset: directory to keep it in (default: temp)")
    p.add_argument("--workers", type=int_list(0), default=[0, 1, 2], metavar="LIST",
                   help="DataLoader num_workers to try (default 0,1,2)")
    p.add_argument("--threads", type=int_list(1), default=None, metavar="LIST",
                   help="stoker num_threads to try (default: 1,2 synthetic; 1 and all "
                        "cores for a dataset; --sweep: 1, 2, 4, ... up to the cores)")
    p.add_argument("--image-size", type=nonneg_int, default=224, metavar="N",
                   help="RandomResizedCrop size for image fields, 0 for plain decodes "
                        "(default 224)")
    p.add_argument("--max-batches", type=positive_int, default=50, metavar="N",
                   help="dataset: batches per timed run at most (default 50)")
    p.add_argument("--no-dataloader", action="store_true",
                   help="dataset: skip the DataLoader peer")
    p.add_argument("--sweep", action="store_true",
                   help="dataset: batch size x threads: samples/s, first batch, stall and the "
                        "bottleneck per point, the fastest setting, and what a larger batch "
                        "costs on this data")
    p.add_argument("--batch-sizes", type=int_list(1), default=None, metavar="LIST",
                   help="--sweep: batch sizes to try (default 32,64,...,512 as the data allows)")
    p.add_argument("--seconds", type=positive_float, default=3.0, metavar="S",
                   help="--sweep: seconds per point after its first batches (default 3)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="--sweep: also plot it (needs matplotlib: pip install matplotlib)")
    p.add_argument("--ray-actors", type=positive_int, default=None, metavar="N",
                   help="dataset: also run it on a stoker.RayService of N actors (needs Ray: "
                        "pip install 'stoker[distributed]'; docs/service.md)")
    p.add_argument("--ray-cpus", type=positive_int, default=1, metavar="C",
                   help="--ray-actors: CPUs (and threads) per actor (default 1)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="--ray-actors: the Ray cluster to join (default: RAY_ADDRESS, else a "
                        "new local one)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    image_size = args.image_size
    if args.dataset is not None:
        check_dataset(args.dataset)
    if args.plot is not None and not args.sweep:
        raise ValueError("argument --plot: goes with --sweep")
    if args.ray_actors is not None:
        if args.dataset is None or args.sweep:
            raise ValueError("argument --ray-actors: runs on a dataset, without --sweep: "
                             "stoker bench PATH --ray-actors N")
        from .service import run_service

        run_service(args.dataset, args.ray_actors, args.ray_cpus, args.ray_address,
                    args.batch_size, args.repeats or 3, image_size, args.max_batches,
                    progress=not args.quiet)
    elif args.sweep:
        if args.dataset is None:
            raise ValueError("argument --sweep: runs on a dataset: stoker bench PATH --sweep")
        from .sweep import sweep

        sweep(args.dataset, args.batch_sizes, args.threads, image_size, args.seconds,
              args.repeats or 3, args.plot, progress=not args.quiet)
    elif args.dataset is not None:
        from .dataset import run_dataset

        run_dataset(args.dataset, args.batch_size, args.threads, args.workers,
                    args.repeats or 3, image_size, args.max_batches, not args.no_dataloader,
                    progress=not args.quiet)
    else:
        from .records import run

        run(args.samples, args.batch_size, args.repeats or 3, args.data, args.workers,
            args.threads or [1, 2], progress=not args.quiet, epochs=args.epochs)
    return 0
