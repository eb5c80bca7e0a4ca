"""WebDataset tar shards to a stoker dataset.

Samples are grouped as WebDataset groups them: a member ``dir/abc.seg.png`` has the key
``dir/abc`` (the path up to the first dot of its base name) and the field ``seg.png``
(the rest, lower-cased); consecutive members with the same key form one sample, and a
field repeated within a sample is an error. Members named ``__...__`` at the top level
are metadata and skipped, as WebDataset does. ``.tar``, ``.tar.gz`` and ``.tgz`` are read.

The schema is inferred from the first samples (``infer_records``, default 100):
``jpg``/``jpeg``/``png`` (and ``*.jpg`` ...) holding JPEG/PNG bytes become
``stoker.image()``; ``cls``, ``cls2``, ``class``, ``count``, ``index``, ``inx``, ``id``
holding decimal integers (what WebDataset decodes as ``int``) become
``stoker.scalar("int64")``; ``npy`` becomes ``stoker.ndarray`` (fixed shape when every
sample agrees, else variable first dimension); anything else (``txt``, ``json``, ...)
``stoker.blob()`` with the bytes as stored. Every field must be in every sample; a later
sample with a field the first ones lack is an error, unless ``features``
(``--features "jpg:image,cls:int64"``) lists the fields to keep. ``keep_key`` adds the
sample key as a blob field ``__key__``.

Shards are converted in parallel (one tar per task, in ``workers`` worker processes) with
the same output for any number of workers. Example::

    stoker convert webdataset shards/ data/train --features "jpg:image,cls:int64"
"""

from __future__ import annotations

import argparse
import io
import os
import re
import struct
import tarfile
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np

from .._args import (
    add_out,
    add_overwrite,
    add_quiet,
    add_shard_size,
    add_workers,
    plain,
    positive_int,
)
from ..fields import Blob, Field, Image, NDArray, Scalar, blob, image, ndarray, scalar
from ._errors import InputError
from ._features import parse_features
from ._parallel import Skipped, convert_files, expand_sources, report

__all__ = ["convert_webdataset", "iter_samples", "infer_features", "WebDatasetError",
           "add_arguments", "run"]

_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # WebDataset's base_plus_ext
_IMAGE_EXTS = ("jpg", "jpeg", "png")
_INT_EXTS = ("cls", "cls2", "class", "count", "index", "inx", "id")
_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
KEY_FIELD = "__key__"
SUFFIXES = (".tar", ".tar.gz", ".tgz")


class WebDatasetError(InputError):
    """A bad shard or sample; the message names the tar file and the sample key."""


def iter_samples(path: str) -> Iterator[Tuple[int, str, Dict[str, bytes]]]:
    """Yields ``(sample number, key, {field: bytes})`` of one tar shard, in tar order."""
    try:
        tar = tarfile.open(path, mode="r|*")
    except (tarfile.TarError, OSError) as e:
        raise WebDatasetError(f"{path}: not a readable tar file ({e})") from None
    key: Optional[str] = None
    sample: Dict[str, bytes] = {}
    n = 0
    with tar:
        try:
            for member in tar:
                if not member.isreg():
                    continue
                name = member.name
                if "/" not in name and name.startswith("__") and name.endswith("__"):
                    continue
                m = _KEY.match(name)
                if not m:
                    continue  # no extension: WebDataset ignores it too
                prefix, suffix = m.group(1), m.group(2).lower()
                f = tar.extractfile(member)
                data = f.read() if f is not None else b""
                if key is None or prefix != key:
                    if key is not None:
                        yield n, key, sample
                        n += 1
                    key, sample = prefix, {}
                if suffix in sample:
                    raise WebDatasetError(f"{path}: sample {n} (key {key!r}): field "
                                          f"{suffix!r} appears twice")
                sample[suffix] = data
        except (tarfile.TarError, OSError, EOFError) as e:
            raise WebDatasetError(f"{path}: corrupt tar after sample {n} ({e})") from None
    if key is not None:
        yield n, key, sample


def _is_image(data: bytes) -> bool:
    return data[:3] == _JPEG_MAGIC or data[:8] == _PNG_MAGIC


def _npy(data: bytes, what: str) -> np.ndarray:
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as e:  # numpy raises several types for bad files
        raise WebDatasetError(f"{what}: not a .npy array ({type(e).__name__}: {e})") from None


def _int(data: bytes, what: str) -> int:
    try:
        return int(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise WebDatasetError(f"{what}: {data[:32]!r} is not an integer") from None


def infer_features(files: List[str], *, records: int = 100) -> Dict[str, Field]:
    """The schema of the first ``records`` samples of ``files`` (rules in the module doc)."""
    seen: Dict[str, List[bytes]] = {}
    n = 0
    for path in files:
        for num, key, sample in iter_samples(path):
            where = f"{path}: sample {num} (key {key!r})"
            for ext in seen:
                if ext not in sample:
                    raise WebDatasetError(f"{where}: lacks field {ext!r} that "
                                          "earlier samples have; list the fields to keep "
                                          "with --features")
            if n and set(sample) - set(seen):
                extra = sorted(set(sample) - set(seen))[0]
                raise WebDatasetError(f"{where}: has field {extra!r} that "
                                      "earlier samples lack; list the fields to keep with "
                                      "--features")
            for ext, data in sample.items():
                seen.setdefault(ext, []).append(data)
            n += 1
            if n >= records:
                break
        if n >= records:
            break
    if n == 0:
        raise WebDatasetError(f"{files[0]}: no samples to infer a schema from")
    fields: Dict[str, Field] = {}
    for ext in sorted(seen):
        values = seen[ext]
        last = ext.rsplit(".", 1)[-1]
        if last in _IMAGE_EXTS and all(_is_image(v) for v in values):
            fields[ext] = image()
        elif ext in _INT_EXTS and all(re.fullmatch(rb"\s*-?\d+\s*", v) for v in values):
            fields[ext] = scalar("int64")
        elif last == "npy":
            arrays = [_npy(v, f"field {ext!r}") for v in values]
            dtypes = {a.dtype.newbyteorder("=") for a in arrays}
            if len(dtypes) != 1:
                raise WebDatasetError(f"field {ext!r}: arrays of dtypes {sorted(map(str, dtypes))}"
                                      "; give one with --features")
            shapes = {a.shape for a in arrays}
            dt = dtypes.pop()
            if len(shapes) == 1:
                shape = shapes.pop()
                fields[ext] = scalar(dt) if shape == () else ndarray(dt, shape)
            elif len({s[1:] for s in shapes}) == 1 and all(len(s) >= 1 for s in shapes):
                fields[ext] = ndarray(dt, (None, *next(iter(shapes))[1:]))
            else:
                raise WebDatasetError(f"field {ext!r}: arrays of shapes {sorted(shapes)} differ "
                                      "beyond the first dimension")
        else:
            fields[ext] = blob()
    return fields


def _value(field: Field, data: bytes, what: str):
    if isinstance(field, (Image, Blob)):
        return data
    if isinstance(field, Scalar):
        if data[:6] == b"\x93NUMPY":
            return _npy(data, what).reshape(())[()]
        text = data.decode("ascii", "replace").strip()
        try:
            return int(text) if field.dtype.kind in "biu" else float(text)
        except ValueError:
            raise WebDatasetError(f"{what}: {data[:32]!r} is not a number") from None
    assert isinstance(field, NDArray)
    return _npy(data, what)


def _read(path: str, fields: Mapping[str, Field], options: Dict[str, Any],
          skipped: List[Skipped], on_bytes) -> Iterator[bytes]:
    """Encoded records of one tar shard (the reader of :func:`convert_files`)."""
    from .. import _core

    header = struct.Struct(f"<{len(fields)}I")

    strict, verify, skip_bad = options["strict"], options["verify"], options["skip_bad"]
    for n, key, sample in iter_samples(path):
        where = f"{path}: sample {n} (key {key!r})"
        try:
            if strict:
                extra = [e for e in sample if e not in fields]
                if extra:
                    raise WebDatasetError(f"{where}: field {extra[0]!r} is not in the schema "
                                          "inferred from the first samples; list the fields "
                                          "to keep with --features")
            payloads = []
            for name, field in fields.items():
                what = f"{where}: field {name!r}"
                if name == KEY_FIELD:
                    payloads.append(key.encode("utf-8"))
                    continue
                if name not in sample:
                    raise WebDatasetError(f"{what}: missing")
                v = field.encode(_value(field, sample[name], what), what)
                if isinstance(field, Image) and verify:
                    try:
                        _core.decode_image(v)
                    except _core.DecodeError as e:
                        raise WebDatasetError(f"{what}: corrupt image: {e}") from None
                payloads.append(v)
        except ValueError as e:
            if not skip_bad:
                raise WebDatasetError(str(e)) from None
            skipped.append((where, str(e)[len(where) + 2:]))
            continue
        yield header.pack(*map(len, payloads)) + b"".join(payloads)
    if on_bytes is not None:
        on_bytes(os.path.getsize(path))


def convert_webdataset(sources, out, *, features: Optional[Any] = None,
                       infer_records: int = 100, keep_key: bool = False, shard_size="256MB",
                       workers: Optional[int] = None, skip_bad: bool = False,
                       verify: bool = False, progress: bool = True,
                       overwrite: bool = False) -> Dict[str, Any]:
    """Converts WebDataset tar shards to a stoker dataset at ``out``.

    Args:
        sources: a tar file, a directory (its ``.tar``/``.tar.gz``/``.tgz`` in name order),
            or a list of them.
        out: output dataset directory.
        features: the schema (``"jpg:image,cls:int64"`` or ``{name: field or None}``);
            default: inferred from the first ``infer_records`` samples.
        keep_key: also store each sample's key as blob field ``__key__``.
        shard_size, workers, skip_bad, verify, progress, overwrite: as in
            :func:`stoker.convert.convert_tfrecord`.

    Returns:
        ``{"records", "files", "skipped": [(where, reason)], "shards", "fields"}``.

    Example::

        >>> convert_webdataset("shards/", "data/train", features="jpg:image,cls:int64")
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    files = expand_sources(list(sources), SUFFIXES)
    if features is None:
        fields = infer_features(files, records=infer_records)
        strict = True
    else:
        spec = parse_features(features) if isinstance(features, str) else dict(features)
        fields = {k: f for k, f in spec.items() if f is not None}
        strict = False
    if keep_key:
        if KEY_FIELD in fields:
            raise ValueError(f"keep_key: the schema already has a field {KEY_FIELD!r}")
        fields = {KEY_FIELD: blob(), **fields}
    options = {"strict": strict, "verify": verify, "skip_bad": skip_bad}
    metadata = {"source": "webdataset", "files": [os.path.basename(f) for f in files]}
    stats = convert_files(files, os.fspath(out), fields, _read, options, workers=workers,
                          shard_size=shard_size, metadata=metadata, overwrite=overwrite,
                          progress=progress, desc="webdataset")
    stats["fields"] = fields
    return stats


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``stoker convert webdataset``."""
    p.description = plain(__doc__.split("\n\n")[0])
    p.add_argument("src", nargs="+", metavar="SRC", help="tar shards or directories of them")
    add_out(p)
    p.add_argument("--features", default=None,
                   help="the schema, e.g. 'jpg:image,cls:int64,json:blob,txt:skip' (default: "
                        "inferred; unlisted fields are dropped)")
    p.add_argument("--infer-records", type=positive_int, default=100, metavar="N",
                   help="samples the schema is inferred from (default 100)")
    p.add_argument("--keep-key", action="store_true",
                   help="store each sample's key as blob field __key__")
    add_shard_size(p)
    add_workers(p)
    p.add_argument("--skip-bad", action="store_true",
                   help="skip bad samples (reported) instead of failing")
    p.add_argument("--verify", action="store_true", help="decode every image once")
    add_overwrite(p)
    add_quiet(p)


def run(args: argparse.Namespace) -> int:
    stats = convert_webdataset(args.src, args.out, features=args.features,
                               infer_records=args.infer_records, keep_key=args.keep_key,
                               shard_size=args.shard_size, workers=args.workers,
                               skip_bad=args.skip_bad, verify=args.verify,
                               progress=not args.quiet, overwrite=args.overwrite)
    report(stats, args.out, "samples", "shard(s)")
    return 0
