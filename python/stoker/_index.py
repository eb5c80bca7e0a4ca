"""What a stoker dataset is on disk: the format's constants, sizes, and ``index.json``.

A leaf module (it imports only ``_core`` and ``fields``): the writer, the reader
(:mod:`stoker.dataset`), the maintenance commands and the remote layer all take the
format from here, and ``index.json`` is validated in one place (:func:`parse_index`).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _core
from .fields import Field, schema_hash

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "READABLE_VERSIONS", "INDEX_NAME",
           "GENERATION_PREFIX", "LEASE_NAME", "parse_size", "Index", "parse_index",
           "shard_identity", "generation_name", "what_file", "image_folder_hint"]

FORMAT_NAME = "stoker"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
INDEX_NAME = "index.json"
#: A write's shards live in ``gen-<dataset id>/`` (NOTE [ Generations ] in _generations.py)
GENERATION_PREFIX = "gen-"
#: ... beside the readers' lease file of that generation
LEASE_NAME = "readers.lock"

_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9,
          "GB": 10**9, "T": 10**12, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30,
          "TIB": 2**40}
_V1_NAME = re.compile(r"shard-(\d+)\.stk")
_ID = re.compile(r"[0-9a-f]{32}")


def parse_size(size: Union[int, str]) -> int:
    """``256MB`` -> 256_000_000, ``64MiB`` -> 67_108_864, ints pass through."""
    if isinstance(size, bool):
        raise ValueError(f"invalid size {size!r}")
    if isinstance(size, int):
        value = size
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(size))
        if not m or m.group(2).upper() not in _UNITS:
            raise ValueError(f"invalid size {size!r}; use e.g. 256MB, 1GiB or a byte count")
        value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise ValueError(f"size must be positive, got {size!r}")
    return value


# What turns images into a dataset, for the errors of a reader given images.
IMAGES_HINT = ("; to make one of a folder of images: stoker convert imagefolder SRC OUT "
               "(SRC/<class>/<image>, as torchvision's ImageFolder)")

_SIGNATURES = ((b"\xff\xd8\xff", "a JPEG image"), (b"\x89PNG\r\n\x1a\n", "a PNG image"),
               (b"GIF8", "a GIF image"), (b"BM", "a BMP image"), (b"II*\x00", "a TIFF image"),
               (b"MM\x00*", "a TIFF image"), (b"\x93NUMPY", "a NumPy .npy file"),
               (b"STKSHARD", "a stoker shard (open its dataset's directory)"),
               (b"PK\x03\x04", "a zip archive"), (b"\x1f\x8b", "a gzip file"),
               (b"PAR1", "a Parquet file"))
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def what_file(head: bytes) -> Optional[str]:
    """What a file is, from its first bytes, when it is a kind a user may hand a reader by
    mistake ("a JPEG image"); None otherwise."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "a WebP image"
    for magic, what in _SIGNATURES:
        if head.startswith(magic):
            return what
    return None


def image_folder_hint(path: str) -> str:
    """For a directory without index.json that holds images (at its top or in its
    sub-folders, as an ImageFolder tree does): the command that converts it; else ""."""
    def images(folder: str) -> bool:
        try:
            with os.scandir(folder) as it:
                for i, e in enumerate(it):
                    if i >= 1000:
                        break
                    if e.name.lower().endswith(_IMAGE_SUFFIXES) and e.is_file():
                        return True
        except OSError:
            pass
        return False

    if images(path):
        return ("; it holds image files: `stoker convert imagefolder SRC OUT` makes a dataset "
                "of images kept one sub-folder per class (SRC/<class>/<image>, as torchvision's "
                "ImageFolder): put them in such folders (one for all will do), then convert SRC")
    try:
        with os.scandir(path) as it:
            subs = [e.path for _, e in zip(range(100), it) if e.is_dir()]
    except OSError:
        return ""
    if any(images(s) for s in subs):
        return (f"; it holds folders of images, an ImageFolder tree: make a dataset of it "
                f"with `stoker convert imagefolder {path} OUT`, then open OUT")
    return ""


def generation_name(dataset_id: str) -> str:
    return GENERATION_PREFIX + dataset_id


def _is_count(v: Any) -> bool:
    """A non-negative integer that fits the format's 64-bit fields (not a bool)."""
    return type(v) is int and 0 <= v < 2**63


def _is_sum(v: Any) -> bool:
    return type(v) is int and 0 <= v < 2**32


class Index:
    """A validated ``index.json``: ``raw`` (the parsed JSON), ``fields`` (the schema),
    ``schema_hash``, ``version``, ``dataset_id`` and ``generation`` (None before format
    version 2), ``shards`` (the entries), ``metadata``."""

    __slots__ = ("raw", "fields", "schema_hash", "version", "dataset_id", "generation",
                 "shards", "metadata")

    def __init__(self, raw: Dict[str, Any], fields: Dict[str, Field], hash_: int,
                 version: int, dataset_id: Optional[str]):
        self.raw = raw
        self.fields = fields
        self.schema_hash = hash_
        self.version = version
        self.dataset_id = dataset_id
        self.generation = None if dataset_id is None else generation_name(dataset_id)
        self.shards: List[Dict[str, Any]] = raw["shards"]
        self.metadata: Any = raw.get("metadata")


def shard_identity(index: Dict[str, Any], shard: int) -> Optional[Tuple[str, int, int, int]]:
    """Shard ``shard``'s identity as ``index.json`` (a parsed dict) gives it, in the form
    ``_core.Dataset`` and ``_core.parse_shard_table`` take: (dataset id, ordinal, header
    checksum, table checksum), or None for a format-version-1 dataset."""
    if index.get("version", 1) < 2:
        return None
    s = index["shards"][shard]
    return (index["dataset_id"], shard, s["header_checksum"], s["table_checksum"])


def parse_index(raw: bytes, where: str) -> Index:
    """Validates the bytes of an ``index.json``; :class:`stoker.DataError` naming
    ``where`` (its path or URL) and the reason otherwise."""

    def bad(reason: str) -> _core.DataError:
        return _core.DataError(f"{where}: {reason}")

    try:
        index = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        what = what_file(raw)
        if what is not None or posixpath.basename(where.rstrip("/")) != INDEX_NAME:
            # a file given for a dataset (x.jpg): say what it is, not that its JSON is bad
            hint = IMAGES_HINT if what is not None and "image" in what else ""
            raise bad(f"not a stoker dataset index ({what or 'not JSON'}): a dataset is a "
                      f"directory holding {INDEX_NAME}, or that {INDEX_NAME}{hint}") from None
        raise bad(f"invalid JSON ({e})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT_NAME:
        raise bad("not a stoker index (missing 'format': 'stoker')")
    version = index.get("version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise bad(f"format version {version!r} is not supported (this stoker reads "
                  f"versions {', '.join(map(str, READABLE_VERSIONS))})")
    schema = index.get("schema")
    if not isinstance(schema, list) or not schema:
        raise bad("missing or empty 'schema'")
    fields: Dict[str, Field] = {}
    for spec in schema:
        try:
            name = spec["name"]
            if not isinstance(name, str) or not name or name in fields:
                raise ValueError(f"bad or repeated field name {name!r}")
            fields[name] = Field.from_spec(spec)
        except (KeyError, TypeError, ValueError) as e:
            raise bad(f"bad field in schema {spec!r}: {e}") from None
    hash_ = schema_hash(fields)
    if index.get("schema_hash") != f"{hash_:016x}":
        raise bad("schema_hash does not match the schema (edited index?)")
    dataset_id: Optional[str] = None
    if version >= 2:
        dataset_id = index.get("dataset_id")
        if not isinstance(dataset_id, str) or not _ID.fullmatch(dataset_id):
            raise bad(f"dataset_id {dataset_id!r} is not 32 lowercase hex digits")
    generation = None if dataset_id is None else generation_name(dataset_id)
    shards = index.get("shards")
    if not isinstance(shards, list):
        raise bad("missing 'shards' list")
    total = 0
    seen: Dict[str, int] = {}
    for i, s in enumerate(shards):
        ok = (isinstance(s, dict) and isinstance(s.get("path"), str) and s["path"]
              and _is_count(s.get("num_records")) and _is_count(s.get("bytes")))
        if ok and version >= 2:  # every checksum is required from version 2 on
            ok = all(_is_sum(s.get(k)) for k in ("checksum", "header_checksum",
                                                  "table_checksum"))
        elif ok:
            ok = s.get("checksum") is None or _is_sum(s["checksum"])
        if not ok:
            raise bad(f"shard entry {i} is malformed: {s!r}")
        p = s["path"]
        parts = p.replace("\\", "/").split("/")
        if os.path.isabs(p) or ".." in parts:
            raise bad(f"shard entry {i}: path {p!r} must be relative to the dataset")
        if version >= 2:
            # A generation's shards, and nothing else: a later write removes whole
            # generations, which must never hold another dataset's files.
            if len(parts) != 2 or parts[0] != generation or parts[1] in ("", ".", LEASE_NAME):
                raise bad(f"shard entry {i}: path {p!r} is not a shard of generation "
                          f"{generation}/ (the dataset_id's)")
        else:
            m = _V1_NAME.fullmatch(p)
            if m and int(m.group(1)) != i:
                raise bad(f"shard entry {i}: {p!r} is out of order (shard files are "
                          "listed in the order they were written)")
        key = posixpath.normpath(p.replace("\\", "/"))
        if key in seen:
            raise bad(f"shard entries {seen[key]} and {i} are the same file {p!r}")
        seen[key] = i
        total += s["num_records"]
    if index.get("num_records") != total:
        raise bad(f"num_records {index.get('num_records')!r} differs from the shards' "
                  f"total {total}")
    return Index(index, fields, hash_, version, dataset_id)
