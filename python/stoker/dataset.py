"""Reading datasets: :class:`Dataset`."""

from __future__ import annotations

import contextlib
import json
import operator
import os
import posixpath
import re
import time
import warnings
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from . import _core
from . import _generations as gen
from .fields import Field, core_specs, schema_hash
from .writer import FORMAT_NAME, INDEX_NAME, READABLE_VERSIONS

__all__ = ["Dataset"]

# Opening starts over from index.json when a write replaced it meanwhile; this many
# times in a row means a writer rewrites faster than a dataset can be opened.
_OPEN_ATTEMPTS = 100
_V1_NAME = re.compile(r"shard-(\d+)\.stk")
_ID = re.compile(r"[0-9a-f]{32}")


def _is_count(v: Any) -> bool:
    """A non-negative integer that fits the format's 64-bit fields (not a bool)."""
    return type(v) is int and 0 <= v < 2**63


def _is_sum(v: Any) -> bool:
    return type(v) is int and 0 <= v < 2**32


class Dataset:
    """A dataset written by :class:`stoker.ShardWriter`: a directory of shards plus
    ``index.json``.

    Example::

        ds = stoker.Dataset("out/train")   # the directory, or its index.json
        len(ds), ds.fields
        ds[0]      # {"label": np.int64(3), "image": b"\\xff\\xd8...", ...}
        ds = stoker.Dataset("s3://bucket/train", cache_dir="/local/cache", cache_limit="50GB")

    Opening reads ``index.json`` and checks every shard against it from the shard's header
    and footer alone (a regular file of the listed size, of this write: dataset id and
    position; header and record-table checksums), without mapping it: a shard of another
    dataset, of an older write, or swapped with another is refused. A shard is mapped, and
    its record table validated, when it is first read (or :meth:`open_shard`); reading a
    sample checks its checksum. Problems raise ``FileNotFoundError`` (no such dataset) or
    :class:`stoker.DataError` naming the file, and the record where there is one.

    A dataset rewritten while it is open does not change under the Dataset: it keeps
    reading its own generation (NOTE [ Generations ] in ``stoker/_generations.py``). A
    shard edited in place under it (never done by stoker) gives ``DataError`` "changed on
    disk while in use" where it is read.

    Args:
        path: the dataset directory or its index.json.
        check_shards: check every shard when opening (default). ``False`` defers each
            shard's checks to its first use (faster to open on a slow filesystem; errors
            then come from the read that first touches the shard).
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], *, check_shards: bool = True,
                 cache_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
                 cache_limit: Optional[Union[int, str]] = None,
                 storage_options: Optional[Dict[str, Any]] = None):
        # A URL (s3://, https://, any fsspec URL): shards come through a local cache
        # (stoker.remote); ``self.remote`` holds it, its stats and the pins.
        from .remote import is_url

        self.remote = None
        if is_url(path):
            from .remote import RemoteDataset

            self.url = path
            self._remote_args = {"cache_dir": cache_dir, "cache_limit": cache_limit,
                                 "storage_options": storage_options}
            self.remote = RemoteDataset(os.fspath(path), cache_dir=cache_dir,
                                        cache_limit=cache_limit,
                                        storage_options=storage_options)
            try:
                self._open_remote()
            except BaseException:
                self.remote.close()
                raise
            return
        if cache_dir is not None or cache_limit is not None or storage_options is not None:
            raise ValueError("cache_dir, cache_limit and storage_options apply to remote "
                             "datasets (s3://, https://, ... URLs)")
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such dataset directory or index file")
        if os.path.isdir(path):
            root, index_path = path, os.path.join(path, INDEX_NAME)
        else:
            root, index_path = os.path.dirname(path) or ".", path
        if not os.path.lexists(index_path):
            raise FileNotFoundError(f"{index_path}: no index.json (not a stoker dataset, or "
                                    "its writing did not finish)")
        self.path = root
        self.index_path = index_path
        self._open(check_shards)

    def _open(self, check_shards: bool) -> None:
        """Reads index.json, takes the generation's lease, checks the shards; starts over
        when a write replaced index.json meanwhile (NOTE [ Generations ])."""
        for attempt in range(_OPEN_ATTEMPTS):
            if attempt:
                time.sleep(min(0.001 * attempt, 0.05))
            raw, stamp = gen.read_index_file(self.index_path)
            index = self._parse_index(raw)
            lease = -1
            if index["version"] >= 2:
                assert self.generation is not None  # set by _parse_index for version 2
                lease = gen.acquire_lease(os.path.join(self.path, self.generation))
                if lease == gen.LEASE_BUSY:
                    continue  # that generation is being removed: index.json was replaced
                if lease in (gen.LEASE_GONE, gen.LEASE_MISSING) and \
                        gen.index_changed(self.index_path, stamp):
                    continue
                if not isinstance(lease, int):
                    lease = -1  # opening the shards says what is missing, by name
            shards = []
            for i, s in enumerate(index["shards"]):
                identity = None
                if index["version"] >= 2:
                    identity = (index["dataset_id"], i, s["header_checksum"],
                                s["table_checksum"])
                shards.append((os.path.join(self.path, s["path"]), s["num_records"], s["bytes"],
                               identity))
            try:
                # Version 1 carries no generations: its shards are mapped now, so that an
                # overwrite removing them later cannot take them from under this dataset.
                self._core = _core.Dataset(core_specs(self.fields), self._hash, shards,
                                           probe_on_open=check_shards,
                                           map_on_open=index["version"] == 1 and check_shards,
                                           lease_fd=lease)
            except _core.DataError:
                if lease >= 0:
                    os.close(lease)
                if gen.index_changed(self.index_path, stamp):
                    continue
                raise
            except BaseException:
                if lease >= 0:
                    os.close(lease)
                raise
            break
        else:
            raise _core.DataError(f"{self.index_path}: the dataset was rewritten "
                                  f"{_OPEN_ATTEMPTS} times while it was being opened")
        self._opened(index)

    def _open_remote(self) -> None:
        """Opens a URL's dataset from its index.json alone: the shards download while it
        is read (:mod:`stoker.remote`, NOTE [ Deferred shards ] in csrc/format/shard_gate.h)."""
        remote = self.remote
        assert remote is not None  # set by __init__ for a URL
        self.path = remote.url
        self.index_path = f"{remote.url}/{INDEX_NAME}"
        index = self._parse_index(remote.index_bytes)
        shards = []
        for i, s in enumerate(index["shards"]):
            identity = None
            if index["version"] >= 2:
                identity = (index["dataset_id"], i, s["header_checksum"], s["table_checksum"])
            shards.append((remote.cache.object_path(i), s["num_records"], s["bytes"], identity))
        # A cache smaller than the dataset gives shards back (NOTE [ Bounded cache ]).
        self._core = _core.Dataset(core_specs(self.fields), self._hash, shards,
                                   probe_on_open=False, map_on_open=False, deferred=True,
                                   releasable=remote.bounded, record_ranges=True)
        remote.start(self._core, self._hash)
        # Dropping the dataset stops its downloads and drops its pins.
        weakref.finalize(self, remote.close)
        self._opened(index)

    def _opened(self, index: Dict[str, Any]) -> None:
        self._index = index
        self._shards = index["shards"]
        self.metadata: Any = index.get("metadata")
        if index["version"] == 1:
            warnings.warn(
                f"{self.path}: written in shard format version 1, whose shards carry no "
                "dataset identity: a shard swapped with another, or taken from another "
                "dataset with the same schema, cannot be detected. `stoker inspect --upgrade "
                f"{self.path}` rewrites it in the current format (in place, atomically)",
                UserWarning, stacklevel=4)

    def _parse_index(self, raw: bytes) -> Dict[str, Any]:
        index_path = self.index_path

        def bad(reason: str) -> _core.DataError:
            return _core.DataError(f"{index_path}: {reason}")

        try:
            index = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
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
        self.fields: Dict[str, Field] = fields
        self._hash = schema_hash(fields)
        if index.get("schema_hash") != f"{self._hash:016x}":
            raise bad("schema_hash does not match the schema (edited index?)")
        self.version: int = version
        self.dataset_id: Optional[str] = None
        self.generation: Optional[str] = None
        if version >= 2:
            dataset_id = index.get("dataset_id")
            if not isinstance(dataset_id, str) or not _ID.fullmatch(dataset_id):
                raise bad(f"dataset_id {dataset_id!r} is not 32 lowercase hex digits")
            self.dataset_id = dataset_id
            self.generation = gen.generation_name(dataset_id)
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
                if len(parts) != 2 or parts[0] != self.generation or parts[1] in (
                        "", ".", gen.LEASE_NAME):
                    raise bad(f"shard entry {i}: path {p!r} is not a shard of generation "
                              f"{self.generation}/ (the dataset_id's)")
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
        return index

    def __len__(self) -> int:
        return len(self._core)

    def close(self) -> None:
        """Lets go of what this Dataset holds: its shard mappings (unmapped once the loaders
        made from it are done with them too) and, for a remote dataset, the fetcher and
        its threads (close loaders of a remote dataset first: they read through it).
        Reading the dataset afterwards raises ``ValueError``; closing twice is harmless.
        ``with stoker.Dataset(path) as ds:`` closes it at the end of the block."""
        if isinstance(self._core, _Closed):
            return
        if self.remote is not None:
            self.remote.close()
        self._core = _Closed(self.path)

    @property
    def closed(self) -> bool:
        return isinstance(self._core, _Closed)

    def __enter__(self) -> "Dataset":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

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
        if self.remote is not None:
            with self.remote.holding([self._core.locate(i)[0]]):
                payloads = self._core.read(i)
        else:
            payloads = self._core.read(i)
        return {name: f.decode(p) for (name, f), p in zip(self.fields.items(), payloads)}

    def sample(self, i: int, transforms: Optional[Dict[str, Any]] = None, *, seed: int = 0,
               image_layout: Optional[str] = None,
               max_image_pixels: int = 100_000_000) -> Dict[str, Any]:
        """Sample `i` as a loader's ``map=`` receives it: verified, images decoded (and
        transformed by ``transforms``, ``{field: [stoker.ops...]}``) by the C++ path,
        other fields as writable arrays, scalars as NumPy scalars, blobs as bytes.
        Thread-safe, and the GIL is released while it reads and decodes. The ops' random
        draws come from (`seed`, `i`): inside ``map``, draw the seed from its ``rng`` to
        keep the loader deterministic. YOLO's mosaic reads three more images this way::

            def mosaic(sample, rng):
                others = [ds.sample(int(j), {"image": [stoker.ops.Resize(320)]},
                                    seed=int(rng.integers(2**63)))
                          for j in rng.integers(0, len(ds), 3)]
                ...
        """
        from ._python_stage import fetch_sample

        n = len(self)
        i = operator.index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index out of range for a dataset of {n} samples")
        if self.remote is not None:
            with self.remote.holding([self._core.locate(i)[0]]):
                return fetch_sample(self, i, transforms, seed, image_layout, max_image_pixels)
        return fetch_sample(self, i, transforms, seed, image_layout, max_image_pixels)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for i in range(len(self)):
            yield self[i]

    @property
    def shards(self) -> List[Dict[str, Any]]:
        """The shard entries of index.json (path relative to the dataset, num_records,
        bytes, and the checksums: whole file, header, record table)."""
        return [dict(s) for s in self._shards]

    def open_shard(self, i: int) -> None:
        """Maps shard `i` and validates its record table now; otherwise that happens when
        it is first read. Raises :class:`stoker.DataError` naming the file if it cannot be
        opened or does not match index.json."""
        if not 0 <= i < len(self._shards):
            raise IndexError(f"shard {i} out of range for a dataset of {len(self._shards)} "
                             "shards")
        if self.remote is not None:
            with self.remote.holding([i]):
                self._core.open_shard(i)
        else:
            self._core.open_shard(i)

    @property
    def open_shards(self) -> List[int]:
        """Indices of the shards mapped so far."""
        return [i for i in range(len(self._shards)) if self._core.is_mapped(i)]

    def verify(self, progress: Optional[Callable[[int, int], None]] = None) -> Dict[str, Any]:
        """Reads every record and checks its checksum and structure, and each shard
        file's checksum against index.json. Goes on past bad shards and records.

        Returns ``{"records", "bytes", "shards", "bad": [(shard_path, record, reason)],
        "ok"}``; record is -1 for a problem of the shard as a whole.
        """
        bad = []
        nbytes = 0
        for s, entry in enumerate(self._shards):
            with (self.remote.holding([s]) if self.remote is not None
                  else contextlib.nullcontext()):
                crc, bad_records = self._core.verify_shard(s)
            path = self._core.shard_path(s)
            for rec, reason in bad_records:
                bad.append((path, rec, reason))
            want = entry.get("checksum")
            if crc is not None and want is not None and crc != want:
                bad.append((path, -1, f"file checksum {crc:08x} differs from index.json's "
                                      f"{want:08x}"))
            nbytes += entry["bytes"]
            if progress is not None:
                progress(s + 1, len(self._shards))
        return {"records": len(self), "bytes": nbytes, "shards": len(self._shards),
                "bad": bad, "ok": not bad}

    def _identity(self) -> Dict[str, Any]:
        """What reopening the same path must find again (see __reduce__)."""
        if self.dataset_id is not None:  # every write has its own id (format v2)
            return {"dataset_id": self.dataset_id, "num_records": len(self)}
        return {"num_records": len(self), "schema_hash": f"{self._hash:016x}",
                "shards": [(s["path"], s["bytes"], s.get("checksum")) for s in self._shards]}

    def __reduce__(self) -> Tuple[Any, ...]:
        # Pickled as its path (a remote one's URL and cache settings, so a spawned worker
        # on the node reopens it through the shared cache) plus its identity: a dataset
        # rewritten in between is an error, not a mix.
        if self.remote is not None:
            return (_reopen, (self.url, self._identity(), self._remote_args))
        return (_reopen, (self.index_path, self._identity()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}: {f!r}" for n, f in self.fields.items())
        if self.closed:
            return f"stoker.Dataset({self.path!r}, closed, {{{fields}}})"
        return f"stoker.Dataset({self.path!r}, {len(self)} samples, {{{fields}}})"


class _Closed:
    """A closed Dataset's ``_core``: any use says so."""

    def __init__(self, path: str) -> None:
        self._path = path

    def _refuse(self, *args: Any) -> Any:
        raise ValueError(f"{self._path}: this stoker.Dataset is closed")

    __len__ = _refuse

    def __getattr__(self, name: str) -> Any:
        return self._refuse()


def _reopen(path: str, identity: Dict[str, Any],
            remote_args: Optional[Dict[str, Any]] = None) -> Dataset:
    ds = Dataset(path, **(remote_args or {}))
    mine = ds._identity()
    if mine != identity:
        changed = [k for k in identity if mine.get(k) != identity[k]]
        raise _core.DataError(f"{path}: the dataset changed since it was pickled "
                              f"({', '.join(changed)} differ); reopen it by path")
    return ds
