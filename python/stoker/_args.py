"""Command-line argument types and options shared by the ``stoker`` subcommands.

Each type raises ``argparse.ArgumentTypeError`` with the reason, which argparse reports as
``stoker CMD: error: argument --flag: reason`` (exit status 2).
"""

from __future__ import annotations

import argparse
from typing import List

__all__ = ["add_overwrite", "add_quiet", "add_shard_size", "add_workers", "int_list",
           "nonneg_int", "positive_float", "positive_int", "size"]


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def positive_int(text: str) -> int:
    v = _int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def nonneg_int(text: str) -> int:
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return v


def int_list(minimum: int):
    """A type for comma-separated ints, each at least `minimum`."""

    def parse(text: str) -> List[int]:
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated integers, got {text!r}") from None
        bad = [v for v in values if v < minimum]
        if bad:
            raise argparse.ArgumentTypeError(f"each must be at least {minimum}, got {bad[0]}")
        return values

    parse.__name__ = "int_list"
    return parse


def size(text: str) -> int:
    """A byte size: ``"256MB"``, ``"1GiB"``, ``"65536"``."""
    from .writer import parse_size

    try:
        v = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return v


def add_workers(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=positive_int, default=None, metavar="N",
                   help="inputs converted at once (threads, or processes where the work "
                        "holds the GIL; the output is the same for any N; default: the cores "
                        "this process may use)")


def add_shard_size(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shard-size", type=size, default="256MB", metavar="SIZE",
                   help="target bytes per shard, e.g. 64MB, 1GiB (default 256MB)")


def add_overwrite(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help="replace the dataset at OUT (atomically: readers keep the old one)")


def add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress bar")
