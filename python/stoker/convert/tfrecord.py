"""TFRecord files of ``tf.train.Example`` to a stoker dataset, without TensorFlow.

A TFRecord file is a sequence of records framed as ``u64 length``, ``u32 masked
CRC-32C of the length``, ``data``, ``u32 masked CRC-32C of the data`` (little endian).
Both checksums are verified; a record that fails, or does not parse as a
``tf.train.Example``, is reported by file, record number and byte offset. GZIP files are
recognised by their magic bytes; ZLIB needs ``compression="zlib"`` (offsets are then
positions in the uncompressed stream).

The schema is inferred from the first records (``infer_records``, default 100): a bytes
feature holding one JPEG/PNG per record becomes ``stoker.image()``, other bytes
``stoker.blob()``; an int64/float list of length 1 in every record becomes
``stoker.scalar("int64"/"float32")``, a constant length L ``stoker.ndarray(dtype, (L,))``,
and anything else a variable-length ``stoker.ndarray(dtype, (None,))``. Fields are in
feature-name order. With an inferred schema a later record holding a feature that the
first records lack is an error (nothing is dropped silently); ``features`` (``--features``,
see :mod:`stoker.convert._features`) gives the schema explicitly, and then every unlisted
feature is dropped. As in ``tf.io.parse_example``, a missing feature is an empty list for
a variable-length field (and empty bytes for a blob), and an error for a fixed one.

Files are converted in parallel (``workers`` worker processes, one file per task: the
parsing is Python), and the output is the same for any number of workers. Example::

    stoker convert tfrecord gs-mirror/train-*.tfrecord data/train \\
        --features "image/encoded:image,image/class/label:int64"
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import struct
import zlib
from typing import Any, BinaryIO, Dict, Iterator, List, Mapping, Optional, Tuple

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
from ._example_proto import BYTES, INT64, MalformedExample, parse_example
from ._features import parse_features
from ._parallel import Skipped, convert_files, expand_sources, report

__all__ = ["convert_tfrecord", "infer_features", "read_records", "masked_crc32c",
           "TFRecordError", "add_arguments", "run"]

_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_HEADER = struct.Struct("<QI")
_U32 = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8


class TFRecordError(InputError):
    """A bad TFRecord file or record; the message names the file and byte offset."""


class _Broken(Exception):
    """A framing error: the reason, without the place."""


def _crc32c():
    try:
        import google_crc32c
    except ImportError:
        raise ImportError("reading TFRecords needs google-crc32c "
                          "(pip install google-crc32c: stoker's [convert] extra)") from None
    return google_crc32c.value


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C rotated right by 15 bits plus a constant."""
    crc = _crc32c()(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


class _ZlibReader(io.RawIOBase):
    """A read-only stream that inflates a ZLIB file."""

    def __init__(self, f: BinaryIO):
        self._f, self._d, self._buf = f, zlib.decompressobj(), b""

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        while (n < 0 or len(self._buf) < n) and not self._d.eof:
            chunk = self._f.read(1 << 20)
            if not chunk:
                break
            self._buf += self._d.decompress(chunk)
        if n < 0:
            n = len(self._buf)
        out, self._buf = self._buf[:n], self._buf[n:]
        return out


def _open(path: str, compression: str) -> Tuple[BinaryIO, BinaryIO]:
    """(stream to read records from, the raw file for progress)."""
    raw = open(path, "rb")
    if compression == "auto":
        compression = "gzip" if raw.peek(2)[:2] == b"\x1f\x8b" else "none"
    if compression == "none":
        return raw, raw
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    if compression == "zlib":
        return io.BufferedReader(_ZlibReader(raw), 1 << 20), raw
    raw.close()
    raise ValueError(f"compression must be auto, none, gzip or zlib, got {compression!r}")


def read_records(path: str, *, compression: str = "auto", skipped: Optional[List[Skipped]] = None
                 ) -> Iterator[Tuple[int, int, bytes]]:
    """Yields ``(record number, byte offset, data)`` of every record of a TFRecord file,
    both CRCs verified.

    Raises :class:`TFRecordError` naming the file, record and offset for a truncated file or
    a failed checksum. With a ``skipped`` list, a record whose data checksum fails is
    reported there instead and reading goes on; a broken length field (the rest of the file
    cannot be framed) is reported there and ends the file.
    """
    crc = _crc32c()
    stream, raw = _open(path, compression)
    with raw, stream:
        offset = rec = 0
        while True:
            head = stream.read(12)
            if not head:
                return
            where = f"{path}: record {rec} at offset {offset}"
            try:
                if len(head) < 12:
                    raise _Broken(f"truncated record header ({len(head)} of 12 bytes)")
                length, length_crc = _HEADER.unpack(head)
                want = crc(head[:8])
                want = (((want >> 15) | (want << 17)) + _MASK_DELTA) & 0xFFFFFFFF
                if want != length_crc:
                    raise _Broken(f"length CRC-32C mismatch (stored {length_crc:08x}, computed "
                                  f"{want:08x}): not a TFRecord file, or corrupt")
                body = stream.read(length + 4)
                if len(body) < length + 4:
                    raise _Broken(f"truncated record ({len(body)} of {length + 4} bytes)")
            except (_Broken, OSError, EOFError, zlib.error) as e:
                if skipped is None:
                    raise TFRecordError(f"{where}: {e}") from None
                skipped.append((where, f"{e}; rest of the file skipped"))
                return
            data = body[:length]
            (data_crc,) = _U32.unpack_from(body, length)
            got = crc(data)
            got = (((got >> 15) | (got << 17)) + _MASK_DELTA) & 0xFFFFFFFF
            if got != data_crc:
                msg = (f"data CRC-32C mismatch (stored {data_crc:08x}, computed {got:08x})")
                if skipped is None:
                    raise TFRecordError(f"{where}: {msg}")
                skipped.append((where, msg))
            else:
                yield rec, offset, data
            offset += 16 + length
            rec += 1


# -- schema --------------------------------------------------------------------------------

def infer_features(files: List[str], *, records: int = 100, compression: str = "auto",
                   skip_bad: bool = False) -> Dict[str, Field]:
    """The schema of the first ``records`` Examples of ``files`` (rules in the module doc).
    With ``skip_bad``, bad records are passed over (the conversion reports them)."""
    seen: Dict[str, Dict[str, Any]] = {}
    n = 0
    for path in files:
        for rec, offset, data in read_records(path, compression=compression,
                                              skipped=[] if skip_bad else None):
            try:
                ex = parse_example(data)
            except MalformedExample as e:
                if skip_bad:
                    continue
                raise TFRecordError(f"{path}: record {rec} at offset {offset}: not a "
                                    f"tf.train.Example ({e})") from None
            for name, (kind, vals) in ex.items():
                s = seen.setdefault(name, {"kinds": set(), "counts": set(), "present": 0,
                                           "image": True})
                s["present"] += 1
                s["counts"].add(len(vals))
                if kind is not None and len(vals):
                    s["kinds"].add(kind)
                if kind == BYTES:
                    s["image"] &= all(v[:3] == _JPEG_MAGIC or v[:8] == _PNG_MAGIC
                                      for v in vals)
            n += 1
            if n >= records:
                break
        if n >= records:
            break
    if n == 0:
        raise TFRecordError(f"{files[0]}: no records to infer a schema from")
    fields: Dict[str, Field] = {}
    for name in sorted(seen):
        s = seen[name]
        always = s["present"] == n
        if len(s["kinds"]) > 1:
            raise TFRecordError(f"feature {name!r} holds {' and '.join(sorted(s['kinds']))} "
                                "lists in different records; give its type with --features")
        if not s["kinds"]:
            raise TFRecordError(f"feature {name!r} is empty in the first {n} records; give "
                                f"its type with --features (e.g. {name}:int64[]) or drop it "
                                f"({name}:skip)")
        kind = s["kinds"].pop()
        counts = s["counts"]
        if kind == BYTES:
            if max(counts) > 1:
                raise TFRecordError(
                    f"feature {name!r} holds up to {max(counts)} byte strings per record, a "
                    f"stoker field one; drop it with --features ({name}:skip)")
            if s["image"] and always and counts == {1}:
                fields[name] = image()
            else:
                fields[name] = blob()
            continue
        dtype = "int64" if kind == INT64 else "float32"
        if always and counts == {1}:
            fields[name] = scalar(dtype)
        elif always and len(counts) == 1:
            fields[name] = ndarray(dtype, (counts.pop(),))
        else:
            fields[name] = ndarray(dtype, (None,))
    return fields


# -- conversion ----------------------------------------------------------------------------

def _cast(arr: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """``arr`` as ``dtype`` when no value changes (floats may round to a narrower float)."""
    if arr.dtype == dtype:
        return arr
    if arr.dtype.kind == "f" and dtype.kind != "f":
        raise TFRecordError(f"{what}: float values do not fit dtype {dtype.name}")
    with np.errstate(all="ignore"):
        out = arr.astype(dtype)
    lost = dtype.kind == "u" and arr.dtype.kind == "i" and bool((arr < 0).any())
    if lost or (arr.dtype.kind != "f" and not np.array_equal(out.astype(arr.dtype), arr)):
        raise TFRecordError(f"{what}: values do not fit dtype {dtype.name}")
    return out


def _value(field: Field, kind: Optional[str], vals, what: str):
    if isinstance(field, (Image, Blob)):
        if kind not in (BYTES, None) and len(vals):
            raise TFRecordError(f"{what}: is a {kind} list, the field takes bytes")
        if len(vals) == 1:
            return bytes(vals[0])
        if not vals and isinstance(field, Blob):
            return b""
        raise TFRecordError(f"{what}: holds {len(vals)} byte strings, the field takes one")
    if kind == BYTES and len(vals):
        raise TFRecordError(f"{what}: is a bytes list, the field takes numbers")
    arr = _cast(vals if kind is not None else np.zeros(0, field.dtype), field.dtype, what)
    if isinstance(field, Scalar):
        if arr.size != 1:
            raise TFRecordError(f"{what}: holds {arr.size} values, the field takes one")
        return arr[0]
    assert isinstance(field, NDArray)
    if field.variable:
        row = int(np.prod(field.shape[1:], dtype=np.int64))
        if row == 0 or arr.size % row:
            raise TFRecordError(f"{what}: {arr.size} values do not make rows of "
                                f"{field.shape[1:]}")
        return arr.reshape((-1, *field.shape[1:]))
    want = int(np.prod(field.shape, dtype=np.int64))
    if arr.size != want:
        raise TFRecordError(f"{what}: holds {arr.size} values, the field's shape "
                            f"{field.shape} takes {want}")
    return arr.reshape(field.shape)


def _read(path: str, fields: Mapping[str, Field], options: Dict[str, Any],
          skipped: List[Skipped], on_bytes) -> Iterator[bytes]:
    """Encoded records of one TFRecord file (the reader of :func:`convert_files`)."""
    from .. import _core

    header = struct.Struct(f"<{len(fields)}I")

    skip_bad, strict, verify = options["skip_bad"], options["strict"], options["verify"]
    pos = 0
    for rec, offset, data in read_records(path, compression=options["compression"],
                                          skipped=skipped if skip_bad else None):
        where = f"{path}: record {rec} at offset {offset}"
        try:
            try:
                ex = parse_example(data)
            except MalformedExample as e:
                raise TFRecordError(f"{where}: not a tf.train.Example ({e})") from None
            if strict:
                extra = [k for k in ex if k not in fields]
                if extra:
                    raise TFRecordError(
                        f"{where}: feature {extra[0]!r} is not in the schema inferred from "
                        "the first records; list the features to keep with --features")
            payloads = []
            for name, field in fields.items():
                kind, vals = ex.get(name, (None, []))
                what = f"{where}: feature {name!r}"
                if name not in ex and not (isinstance(field, Blob) or
                                           (isinstance(field, NDArray) and field.variable)):
                    raise TFRecordError(f"{what}: missing (the field is not variable-length)")
                v = _value(field, kind, vals, what)
                if isinstance(field, Image):
                    v = field.encode(v, what)  # JPEG or PNG
                    if verify:
                        try:
                            _core.decode_image(v)
                        except _core.DecodeError as e:
                            raise TFRecordError(f"{what}: corrupt image: {e}") from None
                    payloads.append(v)
                elif isinstance(field, Blob):
                    payloads.append(v)
                else:  # _value made it the field's dtype and shape: stored as Field.encode does
                    payloads.append(np.ascontiguousarray(v, dtype=field.dtype).tobytes())
        except ValueError as e:
            if not skip_bad:
                raise TFRecordError(str(e)) from None
            skipped.append((where, str(e)[len(where) + 2:]))
            continue
        if on_bytes is not None:
            end = offset + 16 + len(data)
            on_bytes(end - pos)
            pos = end
        yield header.pack(*map(len, payloads)) + b"".join(payloads)
    if on_bytes is not None:  # compressed input: offsets are not file positions
        on_bytes(max(0, os.path.getsize(path) - pos))


def convert_tfrecord(sources, out, *, features: Optional[Any] = None, infer_records: int = 100,
                     shard_size="256MB", compression: str = "auto", workers: Optional[int] = None,
                     skip_bad: bool = False, verify: bool = False, progress: bool = True,
                     overwrite: bool = False) -> Dict[str, Any]:
    """Converts TFRecord files of ``tf.train.Example`` to a stoker dataset at ``out``.

    Args:
        sources: a file, a directory (its files in name order) or a list of them.
        out: output dataset directory.
        features: the schema: a ``--features`` spec string or ``{name: field or None}``
            (None drops the feature); default: inferred from the first ``infer_records``.
        shard_size: target bytes per shard.
        compression: ``"auto"`` (GZIP by magic bytes), ``"none"``, ``"gzip"``, ``"zlib"``.
        workers: files converted at once, each in a worker process (default: the cores
            this process may use).
        skip_bad: skip bad records (reported in the result) instead of failing.
        verify: decode every image once, so a corrupt one is reported now.
        progress: a progress bar on stderr when it is a terminal.
        overwrite: replace an existing dataset at ``out``.

    Returns:
        ``{"records", "files", "skipped": [(where, reason)], "shards", "fields"}``.

    Example::

        >>> convert_tfrecord("tfrecords/", "data/train", workers=8)
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    files = expand_sources(list(sources))
    if features is None:
        fields = infer_features(files, records=infer_records, compression=compression,
                                skip_bad=skip_bad)
        strict = True
    else:
        spec = parse_features(features) if isinstance(features, str) else dict(features)
        fields = {k: f for k, f in spec.items() if f is not None}
        strict = False
    options = {"compression": compression, "skip_bad": skip_bad, "strict": strict,
               "verify": verify}
    metadata = {"source": "tfrecord", "files": [os.path.basename(f) for f in files]}
    stats = convert_files(files, os.fspath(out), fields, _read, options, workers=workers,
                          shard_size=shard_size, metadata=metadata, overwrite=overwrite,
                          progress=progress, desc="tfrecord")
    stats["fields"] = fields
    return stats


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``stoker convert tfrecord``."""
    p.description = plain(__doc__.split("\n\n")[0])
    p.add_argument("src", nargs="+", metavar="SRC", help="TFRecord files or directories of them")
    add_out(p)
    p.add_argument("--features", default=None,
                   help="the schema, e.g. 'image/encoded:image,label:int64,emb:float32[64],"
                        "ids:int64[],meta:skip' (default: inferred; unlisted features are "
                        "dropped)")
    p.add_argument("--infer-records", type=positive_int, default=100, metavar="N",
                   help="records the schema is inferred from (default 100)")
    p.add_argument("--compression", default="auto", choices=["auto", "none", "gzip", "zlib"],
                   help="auto (default) recognises GZIP by its magic bytes; ZLIB must be named")
    add_shard_size(p)
    add_workers(p)
    p.add_argument("--skip-bad", action="store_true",
                   help="skip bad records (reported) instead of failing")
    p.add_argument("--verify", action="store_true", help="decode every image once")
    add_overwrite(p)
    add_quiet(p)


def run(args: argparse.Namespace) -> int:
    stats = convert_tfrecord(args.src, args.out, features=args.features,
                             infer_records=args.infer_records, shard_size=args.shard_size,
                             compression=args.compression, workers=args.workers,
                             skip_bad=args.skip_bad, verify=args.verify,
                             progress=not args.quiet, overwrite=args.overwrite)
    report(stats, args.out, "records", "file(s)")
    return 0
