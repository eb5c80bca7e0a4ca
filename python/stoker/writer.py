"""Writing datasets: :class:`ShardWriter`."""

from __future__ import annotations

import json
import os
import struct
import warnings
import weakref
from types import TracebackType
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple, Type, Union

from . import _core
from . import _generations as gen
from ._generations import WriterLockError
from ._index import (
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_NAME,
    READABLE_VERSIONS,
    generation_name,
    parse_size,
)
from .fields import Field, check_schema, schema_hash, schema_json

# The format's constants and parse_size live in ._index; importable from here as before.
__all__ = ["DatasetExistsError", "FORMAT_NAME", "FORMAT_VERSION", "INDEX_NAME",
           "READABLE_VERSIONS", "ShardWriter", "WriterLockError", "parse_size"]


class DatasetExistsError(FileExistsError):
    """The output directory already holds a dataset and the write did not ask to replace
    it; ``path`` is the directory (the command line says ``--overwrite`` where Python
    says ``overwrite=True``)."""

    def __init__(self, path: str):
        super().__init__(f"{path}: already holds a dataset (index.json); pass overwrite=True "
                         "to replace it")
        self.path = path

    def __reduce__(self) -> Tuple[Any, Tuple[str]]:  # from a convert worker process, whole
        return type(self), (self.path,)


class _WriteState:
    """What an unfinished write holds. Kept apart from the ShardWriter so that a
    ``weakref.finalize`` can discard it (and say so) when the writer is dropped or the
    interpreter exits without ``close()``."""

    def __init__(self, path: str, created: bool = False):
        self.path = path
        self.created = created  # the writer made the directory: a discarded write removes it
        self.lock: Optional[gen.WriterLock] = None
        self.generation_dir: Optional[str] = None
        self.current: Optional[Any] = None  # _core.ShardFileWriter
        self.count = 0

    def discard(self) -> None:
        if self.current is not None:
            self.current.abort()
            self.current = None
        try:
            if self.generation_dir is not None and os.path.isdir(self.generation_dir):
                gen.remove_generation(self.generation_dir, locks=False)
            tmp = os.path.join(self.path, INDEX_NAME + ".tmp")
            if os.path.exists(tmp):
                os.remove(tmp)
        finally:
            self.generation_dir = None
            self.release()
        if self.created:
            try:
                os.rmdir(self.path)  # only if nothing else is in it
            except OSError:
                pass

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def _abandoned(state: _WriteState) -> None:
    """Finalizer of a ShardWriter dropped without close(): nothing is committed."""
    if state.count:
        warnings.warn(f"{state.path}: a ShardWriter was dropped without close(): the "
                      f"{state.count} sample(s) written to it were discarded and the "
                      "dataset was left as it was; use `with ShardWriter(...) as w:` or call "
                      "w.close()", UserWarning, stacklevel=2)
    state.discard()


def _read_existing(index_path: str) -> Tuple[Optional[Set[str]], Set[str]]:
    """({live generation}, {version-1 shard names}) of the dataset in place. The first is
    None when its index cannot be read: then no generation counts as stale until the new
    index is in place."""
    if not os.path.lexists(index_path):
        return set(), set()
    try:
        raw, _ = gen.read_index_file(index_path)
        index = json.loads(raw.decode("utf-8"))
        shards = [s["path"] for s in index.get("shards", []) if isinstance(s.get("path"), str)]
        if index.get("version") == 1:
            return set(), {p for p in shards if "/" not in p}
        dataset_id = index.get("dataset_id")
        if isinstance(dataset_id, str) and gen.is_generation_name(
                generation_name(dataset_id)):
            return {generation_name(dataset_id)}, set()
    except (OSError, ValueError, AttributeError, TypeError, KeyError, _core.DataError):
        pass
    return None, set()


class ShardWriter:
    """Writes samples into shard files plus ``index.json`` in directory `path`.

    Example::

        fields = {"x": stoker.ndarray("float32", (3, 32, 32)), "label": stoker.scalar("int64")}
        with stoker.ShardWriter("out/train", fields, shard_size="256MB") as w:
            for x, y in samples:
                w.write({"x": x, "label": y})

    Each sample is checked against the schema: a missing or extra field, a wrong dtype or
    shape raises ``ValueError`` naming the field and the sample number.

    Writing is atomic (NOTE [ Generations ] in ``stoker/_generations.py``): the shards go
    into a new generation directory and ``index.json`` is renamed over the old one as the
    last step, so a reader sees the old dataset or the new one, whole; an exception, a
    killed process or a full disk leaves the previous dataset (or none) as it was, and the
    old generation is removed once no reader uses it. One writer at a time: a second
    ShardWriter on the same directory raises :class:`stoker.writer.WriterLockError` (a
    ``BlockingIOError``) naming the other writer's pid and host. A writer dropped without
    ``close()`` discards what it wrote and warns.

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
        self._shards: List[Dict[str, Any]] = []   # finished: entries of index.json
        self._closed = True
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise NotADirectoryError(f"{self.path}: exists and is not a directory")
        created = not os.path.lexists(self.path)
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise OSError(e.errno, f"{self.path}: cannot create the output directory: "
                          f"{e.strerror}") from e
        state = _WriteState(self.path, created)
        try:
            state.lock = gen.WriterLock(self.path)
        except BaseException:
            state.discard()  # a directory it made goes again
            raise
        try:
            if os.path.lexists(self._index_path) and not overwrite:
                raise DatasetExistsError(self.path)
            self._replaced, self._replaced_v1 = _read_existing(self._index_path)
            # Leftovers of earlier writes that were killed or whose generation was in use.
            gen.clean(self.path, keep=self._replaced, keep_files=self._replaced_v1,
                      locks=state.lock.enforced)
            self.dataset_id = os.urandom(16).hex()
            self.generation = generation_name(self.dataset_id)
            state.generation_dir = os.path.join(self.path, self.generation)
            os.mkdir(state.generation_dir)
            gen.create_lease_file(state.generation_dir)
        except OSError as e:
            state.discard()  # releases the writer lock
            if e.errno is None or e.filename is not None or self.path in str(e):
                raise  # names its path already
            raise OSError(e.errno, f"{self.path}: cannot start writing: {e.strerror}") from e
        except BaseException:
            state.discard()
            raise
        self._state = state
        self._finalizer = weakref.finalize(self, _abandoned, state)
        self._closed = False

    # -- writing ---------------------------------------------------------------

    def _encode(self, sample: Mapping[str, Any]) -> bytes:
        n = self._state.count
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

    def _shard_for(self, nbytes: int) -> Any:
        """The shard to append `nbytes` to, finishing the current one if it would overflow."""
        current = self._state.current
        if current is not None and current.num_records > 0 and \
                current.bytes_written + nbytes > self.shard_size:
            self._finish_shard()
            current = None
        if current is None:
            ordinal = len(self._shards)
            self._current_name = f"{self.generation}/shard-{ordinal:05d}.stk"
            current = _core.ShardFileWriter(os.path.join(self.path, self._current_name),
                                            self._hash, len(self.fields), self.dataset_id,
                                            ordinal)
            self._state.current = current
        return current

    def write(self, sample: Mapping[str, Any]) -> None:
        """Validates and appends one sample (a dict with exactly the schema's fields)."""
        if self._closed:
            raise ValueError("ShardWriter is closed")
        record = self._encode(sample)
        self._shard_for(len(record)).append(record)
        self._state.count += 1

    def append_shard(self, path: Union[str, "os.PathLike[str]"]) -> int:
        """Appends every record of an existing shard file with the same schema (from
        another dataset, or a part of this one written elsewhere), in order, without
        decoding: the bytes are copied after each record's checksum is verified, and
        take this write's identity. Returns the number of records appended.

        This is how ``stoker inspect --upgrade`` rewrites a version-1 dataset, and how
        datasets written in parts (one per rank) can be merged into one (docs/storage.md).
        """
        if self._closed:
            raise ValueError("ShardWriter is closed")
        path = os.fspath(path)
        size = os.path.getsize(path)
        current = self._shard_for(size)
        before = current.num_records
        current.append_shard(path, self._hash)  # verifies everything before writing
        added = current.num_records - before
        self._state.count += added
        return int(added)

    def _finish_shard(self) -> None:
        current = self._state.current
        assert current is not None
        n, size, crc, header_sum, table_sum = current.finish()
        self._shards.append({"path": self._current_name, "num_records": n, "bytes": size,
                             "checksum": crc, "header_checksum": header_sum,
                             "table_checksum": table_sum})
        self._state.current = None

    def __len__(self) -> int:
        return self._state.count

    # -- closing ---------------------------------------------------------------

    def close(self) -> None:
        """Finishes the last shard, makes everything durable and renames index.json into
        place; then removes generations that no reader uses any more."""
        if self._closed:
            return
        state = self._state
        try:
            if state.current is not None:
                self._finish_shard()
            assert state.generation_dir is not None
            gen.fsync_dir(state.generation_dir)
            gen.fsync_dir(self.path)  # the generation's own directory entry
            index = {
                "format": FORMAT_NAME,
                "version": FORMAT_VERSION,
                "dataset_id": self.dataset_id,
                "schema": schema_json(self.fields),
                "schema_hash": f"{self._hash:016x}",
                "num_records": state.count,
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
        # Committed: from here on the new dataset is the one in place.
        state.generation_dir = None
        self._closed = True
        self._finalizer.detach()
        try:
            gen.fsync_dir(self.path)  # the rename itself
            replaced = next(iter(self._replaced or ()), None)
            try:
                gen.clean(self.path, keep={self.generation}, replaced=replaced,
                          locks=state.lock.enforced if state.lock is not None else True)
            except OSError as e:
                warnings.warn(f"{self.path}: the dataset was written, but removing the "
                              f"previous one failed ({e}); `stoker inspect --clean "
                              f"{self.path}` removes it", RuntimeWarning, stacklevel=2)
        finally:
            state.release()

    def abort(self) -> None:
        """Drops everything written so far; the dataset in place (if any) is untouched."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        self._shards = []
        self._state.discard()

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
