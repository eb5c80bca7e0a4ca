"""Command-line argument types and options shared by the ``stoker`` subcommands.

Each type raises ``argparse.ArgumentTypeError`` with the reason, which argparse reports as
``stoker CMD: error: argument --flag: reason`` (exit status 2).
"""

from __future__ import annotations

import argparse
from typing import List

__all__ = ["add_out", "add_overwrite", "add_quiet", "add_shard_size", "add_workers",
           "check_dataset", "int_list", "nonneg_int", "plain", "positive_float", "positive_int",
           "size", "utf8_path"]


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


def plain(doc: str) -> str:
    """A docstring's text for --help: no reST markup (``code``, :mod:`x`)."""
    import re

    doc = re.sub(r":\w+:`~?([^`]+)`", r"\1", doc)
    return " ".join(doc.replace("``", "").split())


def add_out(p: argparse.ArgumentParser, help: str = "output dataset directory") -> None:
    p.add_argument("out", metavar="OUT", type=utf8_path, help=help)


def add_shard_size(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shard-size", type=size, default="256MB", metavar="SIZE",
                   help="target bytes per shard, e.g. 64MB, 1GiB (default 256MB)")


def add_overwrite(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help="replace the dataset at OUT (atomically: readers keep the old one)")


def add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def utf8_path(text: str) -> str:
    """A path stoker writes or reads a dataset at: datasets keep their shard paths in
    index.json and the native core takes UTF-8, so a name that is not valid UTF-8 (Linux
    allows any bytes) is refused here, once, rather than failing later."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = text.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
        raise argparse.ArgumentTypeError(
            f"{shown!r} is not valid UTF-8; rename it (dataset paths are UTF-8)") from None
    return text


def check_dataset(path: str) -> None:
    """Raises a usage error (FileNotFoundError, PermissionError, ValueError) when `path`
    cannot be a local dataset: missing, a file other than an index.json, an index.json
    that cannot be read. URLs are left to the remote layer."""
    import os

    if "://" in path:
        return
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such dataset (a directory with index.json, or "
                                "its index.json)")
    index = path
    if os.path.isdir(path):
        index = os.path.join(path, "index.json")
        if not os.path.exists(index):
            return  # the reader says what is there instead (a version-1 dataset, parts)
    elif os.path.basename(path) != "index.json":
        from ._index import IMAGES_HINT, what_file

        with open(path, "rb") as f:
            what = what_file(f.read(16))
        raise ValueError(f"{path}: a file{f' ({what})' if what else ''}, not a dataset (a "
                         "directory with index.json, or its index.json)"
                         + (IMAGES_HINT if what and "image" in what else ""))
    with open(index, "rb"):  # unreadable: PermissionError, a usage error, not corruption
        pass
