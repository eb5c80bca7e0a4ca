"""Writing datasets: :class:`ShardWriter`."""

from __future__ import annotations

import json
import os
import re
import struct
from types import TracebackType
from typing import Any, Dict, List, Mapping, Optional, Type, Union

from . import _core
from .fields import Field, check_schema, schema_hash, schema_json

__all__ = ["ShardWriter"]

INDEX_NAME = "index.json"
FORMAT_NAME = "stoker"
FORMAT_VERSION = 1

_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9,
          "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


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


class ShardWriter:
    """Writes samples into shard files plus ``index.json`` in directory `path`.

    Example::

        fields = {"x": stoker.ndarray("float32", (3, 32, 32)), "label": stoker.scalar("int64")}
        with stoker.ShardWriter("out/train", fields, shard_size="256MB") as w:
            for x, y in samples:
                w.write({"x": x, "label": y})

    Each sample is checked against the schema: a missing or extra field, a wrong dtype or
    shape raises ``ValueError`` naming the field and the sample number. A shard is written
    under a temporary name and renamed when complete, and ``index.json`` is written last,
    so an exception inside the ``with`` block, or a killed process, never leaves a directory
    that :class:`stoker.Dataset` accepts: the partial shards are removed.

    Args:
        path: output directory (created if missing).
        fields: the schema, ``{name: field}``.
        shard_size: target bytes per shard file (``"256MB"``, ``"1GiB"`` or an int).
        metadata: JSON-serialisable data stored in index.json (``Dataset.metadata``).
        overwrite: replace an existing dataset in `path` (otherwise FileExistsError).
    """

    def __init__(self, path: Union[str, os.PathLike[str]], fields: Mapping[str, Field],
                 shard_size: Union[int, str] = "256MB", *, metadata: Optional[Any] = None,
                 overwrite: bool = False):
        self.path = os.fspath(path)
        self.fields: Dict[str, Field] = check_schema(fields)
        self.shard_size = parse_size(shard_size)
        self.metadata = metadata
        if metadata is not None:
            json.dumps(metadata)  # fail now, not at close()
        self._hash = schema_hash(self.fields)
        self._header = struct.Struct(f"<{len(self.fields)}I")
        self._index_path = os.path.join(self.path, INDEX_NAME)
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise NotADirectoryError(f"{self.path}: exists and is not a directory")
        if os.path.exists(self._index_path):
            if not overwrite:
                raise FileExistsError(f"{self.path}: already holds a dataset (index.json); "
                                      "pass overwrite=True to replace it")
            os.remove(self._index_path)  # from here on the directory is not a dataset
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise OSError(e.errno, f"{self.path}: cannot create the output directory: "
                          f"{e.strerror}") from e
        self._shards: List[Dict[str, Any]] = []   # finished: dicts for index.json
        self._current: Optional[_core.ShardFileWriter] = None
        self._count = 0
        self._closed = False

    # -- writing ---------------------------------------------------------------

    def _encode(self, sample: Mapping[str, Any]) -> bytes:
        n = self._count
        if not isinstance(sample, Mapping):
            raise ValueError(f"sample {n}: expected a dict of fields, got {type(sample).__name__}")
        missing = [k for k in self.fields if k not in sample]
        if missing:
            raise ValueError(f"sample {n}: missing field {missing[0]!r}")
        extra = [k for k in sample if k not in self.fields]
        if extra:
            raise ValueError(f"sample {n}: unexpected field {extra[0]!r} (not in the schema)")
        payloads = [f.encode(sample[name], f"sample {n}, field {name!r}")
                    for name, f in self.fields.items()]
        return self._header.pack(*map(len, payloads)) + b"".join(payloads)

    def write(self, sample: Mapping[str, Any]) -> None:
        """Validates and appends one sample (a dict with exactly the schema's fields)."""
        if self._closed:
            raise ValueError("ShardWriter is closed")
        record = self._encode(sample)
        if self._current is not None and self._current.num_records > 0 and \
                self._current.bytes_written + len(record) > self.shard_size:
            self._finish_shard()
        if self._current is None:
            name = f"shard-{len(self._shards):05d}.stk"
            self._current_name = name
            self._current = _core.ShardFileWriter(os.path.join(self.path, name), self._hash,
                                                  len(self.fields))
        self._current.append(record)
        self._count += 1

    def _finish_shard(self) -> None:
        assert self._current is not None
        n, size, crc = self._current.finish()
        self._shards.append({"path": self._current_name, "num_records": n, "bytes": size,
                             "checksum": crc})
        self._current = None

    def __len__(self) -> int:
        return self._count

    # -- closing ---------------------------------------------------------------

    def close(self) -> None:
        """Finishes the last shard and writes index.json (atomically, last)."""
        if self._closed:
            return
        try:
            if self._current is not None:
                self._finish_shard()
            index = {
                "format": FORMAT_NAME,
                "version": FORMAT_VERSION,
                "schema": schema_json(self.fields),
                "schema_hash": f"{self._hash:016x}",
                "num_records": self._count,
                "shards": self._shards,
                "metadata": self.metadata,
            }
            tmp = self._index_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(index, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._index_path)
        except BaseException:
            self.abort()
            raise
        self._closed = True

    def abort(self) -> None:
        """Drops everything written so far; the directory is left without a dataset."""
        if self._current is not None:
            self._current.abort()
            self._current = None
        for s in self._shards:
            try:
                os.remove(os.path.join(self.path, s["path"]))
            except FileNotFoundError:
                pass
        for tmp in (self._index_path + ".tmp",):
            if os.path.exists(tmp):
                os.remove(tmp)
        self._shards = []
        self._closed = True

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        # Never leave a half-written dataset looking complete; a writer that was
        # neither closed nor used in `with` is abandoned, not finished.
        if not getattr(self, "_closed", True):
            try:
                self.abort()
            except Exception:
                pass
