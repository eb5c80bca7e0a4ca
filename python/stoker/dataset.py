"""Reading datasets: :class:`Dataset`."""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

from . import _core
from .fields import Field, core_specs, schema_hash
from .writer import FORMAT_NAME, FORMAT_VERSION, INDEX_NAME

__all__ = ["Dataset"]


def _is_count(v: Any) -> bool:
    """A non-negative integer that fits the format's 64-bit fields (not a bool)."""
    return type(v) is int and 0 <= v < 2**63


class Dataset:
    """A dataset written by :class:`stoker.ShardWriter`: a directory of shards plus
    ``index.json``.

    Example::

        ds = stoker.Dataset("out/train")   # the directory, or its index.json
        len(ds), ds.fields
        ds[0]      # {"label": np.int64(3), "image": b"\\xff\\xd8...", ...}

    Opening checks the index and the structure of every shard (sizes, headers, record
    tables and their checksums); reading a sample checks its checksum. Problems raise
    ``FileNotFoundError`` (no such dataset) or :class:`stoker.DataError` naming the file,
    and the record where there is one.
    """

    def __init__(self, path: Union[str, os.PathLike[str]]):
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such dataset directory or index file")
        if os.path.isdir(path):
            root, index_path = path, os.path.join(path, INDEX_NAME)
        else:
            root, index_path = os.path.dirname(path) or ".", path
        if not os.path.exists(index_path):
            raise FileNotFoundError(f"{index_path}: no index.json (not a stoker dataset, or "
                                    "its writing did not finish)")
        self.path = root
        self.index_path = index_path
        index = self._load_index(index_path)
        self._index = index
        self.metadata: Any = index.get("metadata")
        shards = []
        for s in index["shards"]:
            shards.append((os.path.join(root, s["path"]), int(s["num_records"]), int(s["bytes"])))
        self._shards = index["shards"]
        self._core = _core.Dataset(core_specs(self.fields), self._hash, shards)

    def _load_index(self, index_path: str) -> Dict[str, Any]:
        def bad(reason: str) -> _core.DataError:
            return _core.DataError(f"{index_path}: {reason}")

        try:
            with open(index_path, "rb") as f:
                index = json.loads(f.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise bad(f"invalid JSON ({e})") from None
        if not isinstance(index, dict) or index.get("format") != FORMAT_NAME:
            raise bad("not a stoker index (missing 'format': 'stoker')")
        if index.get("version") != FORMAT_VERSION:
            raise bad(f"format version {index.get('version')!r} is not supported "
                      f"(this stoker reads version {FORMAT_VERSION})")
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
        self.fields: Dict[str, Field] = fields
        self._hash = schema_hash(fields)
        if index.get("schema_hash") != f"{self._hash:016x}":
            raise bad("schema_hash does not match the schema (edited index?)")
        shards = index.get("shards")
        if not isinstance(shards, list):
            raise bad("missing 'shards' list")
        total = 0
        for i, s in enumerate(shards):
            ok = (isinstance(s, dict) and isinstance(s.get("path"), str) and s["path"]
                  and _is_count(s.get("num_records")) and _is_count(s.get("bytes"))
                  and (s.get("checksum") is None or _is_count(s["checksum"])))
            if not ok:
                raise bad(f"shard entry {i} is malformed: {s!r}")
            p = s["path"]
            if os.path.isabs(p) or ".." in p.replace("\\", "/").split("/"):
                raise bad(f"shard entry {i}: path {p!r} must be relative to the dataset")
            total += s["num_records"]
        if index.get("num_records") != total:
            raise bad(f"num_records {index.get('num_records')!r} differs from the shards' "
                      f"total {total}")
        return index

    def __len__(self) -> int:
        return len(self._core)

    def __getitem__(self, i: int) -> Dict[str, Any]:
        n = len(self)
        if not isinstance(i, int):
            try:
                i = i.__index__()
            except AttributeError:
                raise TypeError(f"dataset indices must be integers, got {type(i).__name__}") \
                    from None
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index out of range for a dataset of {n} samples")
        payloads = self._core.read(i)
        return {name: f.decode(p) for (name, f), p in zip(self.fields.items(), payloads)}

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for i in range(len(self)):
            yield self[i]

    @property
    def shards(self) -> List[Dict[str, Any]]:
        """The shard entries of index.json (path, num_records, bytes, checksum)."""
        return [dict(s) for s in self._shards]

    def verify(self, progress: Optional[Callable[[int, int], None]] = None) -> Dict[str, Any]:
        """Reads every record and checks its checksum and structure, and each shard
        file's checksum against index.json.

        Returns ``{"records", "bytes", "bad": [(shard_path, record, reason)], "ok"}``.
        """
        bad = []
        nbytes = 0
        for s, entry in enumerate(self._shards):
            crc, bad_records = self._core.verify_shard(s)
            path = self._core.shard_path(s)
            for rec, reason in bad_records:
                bad.append((path, rec, reason))
            want = entry.get("checksum")
            if want is not None and crc != want:
                bad.append((path, -1, f"file checksum {crc:08x} differs from index.json's "
                                      f"{want:08x}"))
            nbytes += entry["bytes"]
            if progress is not None:
                progress(s + 1, len(self._shards))
        return {"records": len(self), "bytes": nbytes, "shards": len(self._shards),
                "bad": bad, "ok": not bad}

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}: {f!r}" for n, f in self.fields.items())
        return f"stoker.Dataset({self.path!r}, {len(self)} samples, {{{fields}}})"
