"""Reading datasets: :class:`Dataset`."""

from __future__ import annotations

import contextlib
import operator
import os
import stat
import time
import warnings
import weakref
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from . import _core
from . import _generations as gen
from ._index import INDEX_NAME, Index, image_folder_hint, parse_index, shard_identity
from .fields import Field, core_specs

__all__ = ["Dataset"]

# Opening starts over from index.json when a write replaced it meanwhile; this many
# times in a row means a writer rewrites faster than a dataset can be opened.
_OPEN_ATTEMPTS = 100


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
        preload: ``True`` reads every shard into memory now (each file's checksum checked
            as it is read), so reads never touch the files again: for small datasets, and
            for datasets on a slow network filesystem. The memory is shared by every
            loader of the process and by forked children (no copy); every read still
            verifies its record. ``"auto"``: when the shards take at most a quarter of the
            memory available (at most 16 GiB). ``Loader.stats()["tier"]`` says which tier
            served the reads (``"memory"``, ``"mmap"`` or ``"remote"``). A URL's dataset
            is downloaded whole first, then read into memory.
        cache_dir: remote datasets (a URL): the local directory their shards are cached
            in, shared by every dataset and rank of the node that uses it. None:
            ``$STOKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/stoker``, else
            ``~/.cache/stoker``.
        cache_limit: remote datasets: bytes (or a size such as ``"50GB"``) the cache may
            hold; the directory's budget is the smallest ``cache_limit`` of the datasets
            using it. None: no limit of this dataset's.
        storage_options: remote datasets: options of the transport, e.g.
            ``{"endpoint_url": ...}`` for an S3-compatible store or ``{"headers": {...}}``
            for a private HTTP server (docs/sources.md).
        retry: remote datasets: a :class:`stoker.remote.Retry`, how often and how long a
            download is tried. None: ``Retry()``'s defaults.
        stall_timeout: remote datasets: seconds a transfer may receive nothing before it
            is retried. None: 30.
        as_tuple: field names, in the order a torch Dataset's items had them: ``ds[i]``
            is then that tuple (an image as a uint8 ``[C, H, W]`` tensor, arrays as
            tensors, a scalar as a 0-d tensor), a ``Loader``'s ``collate_fn`` receives
            those tuples, and without one its batches are lists in that order, as
            ``default_collate`` gives them: ``for images, labels in loader`` is unchanged
            after a move from a torch Dataset to shards (docs/python.md, "Step 2").
            Example: ``stoker.Dataset("out/train", as_tuple=("image", "label"))``.
            None (default): samples and batches are dicts of every field.

    Local paths take none of the remote arguments (a ``ValueError``); docs/sources.md
    describes the cache, ranges and retries.
    """

    _core: Any  # the C++ dataset (_core.Dataset), or _Closed once closed

    def __init__(self, path: Union[str, "os.PathLike[str]"], *, check_shards: bool = True,
                 cache_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
                 cache_limit: Optional[Union[int, str]] = None,
                 storage_options: Optional[Dict[str, Any]] = None,
                 preload: Union[bool, str] = False, retry: Any = None,
                 stall_timeout: Optional[float] = None,
                 as_tuple: Optional[Sequence[str]] = None):
        # A URL (s3://, https://, any fsspec URL): shards come through a local cache
        # (stoker.remote); ``self.remote`` holds it, its stats and the pins. stoker.remote
        # (http.client, ssl) is imported for a URL only: a local open stays quick.
        url = isinstance(path, str) and "://" in path
        if url:
            from .remote import is_url

            url = is_url(path)
        if preload not in (True, False, "auto"):
            raise ValueError(f"preload must be True, False or 'auto', got {preload!r}")
        self.remote = None
        self._preload = preload
        if as_tuple is not None and (isinstance(as_tuple, (str, bytes)) or
                                     not all(isinstance(n, str) for n in as_tuple)):
            raise TypeError(f"as_tuple must be a sequence of field names, got {as_tuple!r}")
        self.as_tuple: Optional[Tuple[str, ...]] = None if as_tuple is None else \
            tuple(as_tuple)
        if url:
            from .remote import RemoteDataset

            self.url = path
            self._remote_args = {"cache_dir": cache_dir, "cache_limit": cache_limit,
                                 "storage_options": storage_options, "preload": preload,
                                 "retry": retry, "stall_timeout": stall_timeout}
            self.remote = RemoteDataset(os.fspath(path), cache_dir=cache_dir,
                                        cache_limit=cache_limit,
                                        storage_options=storage_options, retry=retry,
                                        stall_timeout=30.0 if stall_timeout is None
                                        else stall_timeout)
            try:
                self._open_remote()
            except BaseException:
                self.remote.close()
                raise
            return
        if cache_dir is not None or cache_limit is not None or storage_options is not None \
                or retry is not None or stall_timeout is not None:
            raise ValueError("cache_dir, cache_limit, storage_options, retry and stall_timeout "
                             "apply to remote datasets (s3://, https://, ... URLs)")
        path = os.fspath(path)
        st = _stat(path)
        if st is None:
            raise FileNotFoundError(f"{path}: no such dataset directory or index file")
        if stat.S_ISDIR(st.st_mode):
            root, index_path = path, os.path.join(path, INDEX_NAME)
        else:
            root, index_path = os.path.dirname(path) or ".", path
        if _stat(index_path, follow=False) is None:
            raise FileNotFoundError(f"{index_path}: no index.json (not a stoker dataset, or "
                                    "its writing did not finish)"
                                    + (image_folder_hint(root) if root == path else ""))
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
            shards = [(os.path.join(self.path, s["path"]), s["num_records"], s["bytes"],
                       shard_identity(index, i), s.get("checksum"))
                      for i, s in enumerate(index["shards"])]
            try:
                # Version 1 carries no generations: its shards are mapped now, so that an
                # overwrite removing them later cannot take them from under this dataset.
                preload = _wants_preload(self._preload, index)
                self._core = _core.Dataset(core_specs(self.fields), self._hash, shards,
                                           probe_on_open=check_shards,
                                           map_on_open=index["version"] == 1 and check_shards,
                                           lease_fd=lease, preload=preload)
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
        is read (:mod:`stoker.remote`, NOTE [ Deferred shards ] in
        csrc/format/shard_gate.h). Preloaded, every shard is downloaded now, read into
        memory, and given back to the cache."""
        remote = self.remote
        assert remote is not None  # set by __init__ for a URL
        self.path = remote.url
        self.index_path = f"{remote.url}/{INDEX_NAME}"
        index = self._take_index(remote.parsed)
        specs = core_specs(self.fields)
        shards: List[Tuple[Any, ...]]
        if _wants_preload(self._preload, index):
            paths = remote.fetch_all()
            try:
                shards = [(p, s["num_records"], s["bytes"], shard_identity(index, i),
                           s.get("checksum")) for i, (p, s) in enumerate(zip(paths,
                                                                               index["shards"]))]
                self._core = _core.Dataset(specs, self._hash, shards, probe_on_open=True,
                                           preload=True)
            finally:
                remote.release_all()  # the bytes are in memory now
            remote.close()  # nothing more to fetch
        else:
            shards = [(remote.cache.object_path(i), s["num_records"], s["bytes"],
                       shard_identity(index, i)) for i, s in enumerate(index["shards"])]
            # Every shard may be given back: the cache directory's budget is shared
            # (NOTE [ Bounded cache ] in stoker/remote/dataset.py).
            self._core = _core.Dataset(specs, self._hash, shards, probe_on_open=False,
                                       map_on_open=False, deferred=True, releasable=True,
                                       record_ranges=True)
            remote.start(self._core, self._hash)
            # Dropping the dataset stops its downloads and drops its pins.
            weakref.finalize(self, remote.close)
        self._opened(index)

    def _holding(self, shards: List[int]) -> ContextManager[None]:
        """A remote dataset's shards made local and kept while the block runs."""
        assert self.remote is not None  # only deferred (remote) datasets come here
        return self.remote.holding(shards)

    @property
    def tier(self) -> str:
        """Where reads are served from: ``"memory"`` (read whole at open: ``preload``),
        ``"remote"`` (shards downloading into a local cache) or ``"mmap"`` (``"closed"``
        once closed)."""
        if self.closed:
            return "closed"
        if self._core.in_memory:
            return "memory"
        return "remote" if self._core.deferred else "mmap"

    def _opened(self, index: Dict[str, Any]) -> None:
        if self.as_tuple is not None:
            missing = [n for n in self.as_tuple if n not in self.fields]
            if missing or not self.as_tuple or len(set(self.as_tuple)) != len(self.as_tuple):
                raise ValueError(f"{self.path}: as_tuple={self.as_tuple!r} must name fields of "
                                 f"the dataset, each once (its fields: "
                                 f"{', '.join(self.fields)})")
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
        return self._take_index(parse_index(raw, self.index_path))

    def _take_index(self, ix: Index) -> Dict[str, Any]:
        self.fields: Dict[str, Field] = ix.fields
        self._hash = ix.schema_hash
        self.version: int = ix.version
        self.dataset_id: Optional[str] = ix.dataset_id
        self.generation: Optional[str] = ix.generation
        return ix.raw

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

    @property
    def classes(self) -> List[str]:
        """The class names, as torchvision's ``ImageFolder.classes``: label i is
        ``classes[i]`` (``stoker convert imagefolder`` keeps them in ``metadata``)."""
        classes = (self.metadata or {}).get("classes") if isinstance(self.metadata, dict) \
            else None
        if not isinstance(classes, list):
            raise AttributeError(f"{self.path}: this dataset has no class names (its metadata "
                                 "has no 'classes' list; `stoker convert imagefolder` writes "
                                 "one, ShardWriter(metadata={'classes': [...]}) too)")
        return list(classes)

    @property
    def class_to_idx(self) -> Dict[str, int]:
        """``{class name: label}``, as torchvision's ``ImageFolder.class_to_idx``."""
        return {c: i for i, c in enumerate(self.classes)}

    def __getitem__(self, i: int) -> Any:
        if self.as_tuple is not None:  # a torch Dataset's item: ds.sample's values as tensors
            from ._stage.sources import hwc_images, tuple_item

            return tuple_item(self.sample(i), self.as_tuple, hwc_images(self.fields))
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
        if self._core.deferred:
            with self._holding([self._core.locate(i)[0]]):
                payloads = self._core.read(i)
        else:
            payloads = self._core.read(i)
        return {name: f.decode(p) for (name, f), p in zip(self.fields.items(), payloads)}

    def sample(self, i: int, transforms: Optional[Dict[Any, Any]] = None, *, seed: int = 0,
               image_layout: Optional[str] = None, max_image_pixels: int = 100_000_000,
               box_rows: Optional[Sequence[str]] = None,
               as_stored: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """Sample `i` as a loader's ``map=`` receives it: verified, images decoded (and
        transformed by ``transforms``, ``{field: [stoker.ops...]}``) by the C++ path,
        other fields as writable arrays, scalars as NumPy scalars, blobs as bytes.
        ``transforms`` takes transform groups as the Loader does (``{("image", "boxes",
        "classes"): [...]}``, with ``box_rows`` and ``as_stored``; docs/augment.md): the
        group's masks come as (h, w, 1), its boxes, keypoints and rows without the dropped
        boxes' rows.
        Thread-safe, and the GIL is released while it reads and decodes. The ops' random
        draws come from (`seed`, `i`): inside ``map``, draw the seed from its ``rng`` to
        keep the loader deterministic. YOLO's mosaic reads three more images this way::

            def mosaic(sample, rng):
                others = [ds.sample(int(j), {"image": [stoker.ops.Resize(320)]},
                                    seed=int(rng.integers(2**63)))
                          for j in rng.integers(0, len(ds), 3)]
                ...
        """
        from ._sources.record_plan import sample  # planned as a loader's map= samples are

        n = len(self)
        i = operator.index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index out of range for a dataset of {n} samples")
        if self.remote is not None:
            with self.remote.holding([self._core.locate(i)[0]]):
                return sample(self, i, transforms, seed, image_layout, max_image_pixels,
                              box_rows, as_stored)
        return sample(self, i, transforms, seed, image_layout, max_image_pixels, box_rows,
                      as_stored)

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
        if self._core.deferred:
            with self._holding([i]):
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
            with (self._holding([s]) if self._core.deferred
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
        # rewritten in between is an error, not a mix. A local path is made absolute: the
        # process that reopens it may run in another folder (a service's actor).
        view = {"as_tuple": self.as_tuple} if self.as_tuple is not None else {}
        if self.remote is not None:
            return (_reopen, (self.url, self._identity(), {**self._remote_args, **view}))
        return (_reopen, (os.path.abspath(self.index_path), self._identity(),
                          {**({"preload": self._preload} if self._preload else {}), **view}
                          or None))

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}: {f!r}" for n, f in self.fields.items())
        view = "" if self.as_tuple is None else f", as_tuple={self.as_tuple!r}"
        if self.closed:
            return f"stoker.Dataset({self.path!r}, closed, {{{fields}}}{view})"
        return f"stoker.Dataset({self.path!r}, {len(self)} samples, {{{fields}}}{view})"


def _stat(path: str, follow: bool = True) -> Optional[os.stat_result]:
    """`path`'s stat, None if it does not exist; a PermissionError that says which folder
    this user may not enter (os.path.exists says False for it, as for a missing file)."""
    try:
        return os.stat(path, follow_symlinks=follow)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError as e:
        folder = os.path.dirname(os.path.abspath(path))
        raise PermissionError(
            e.errno, f"{path}: permission denied: this user (uid {os.getuid()}) may not read "
            f"the dataset folder {folder}; give it read and execute permission (chmod "
            f"u+rx, or o+rx for other users) or open the dataset as its owner") from None


def _wants_preload(preload: Union[bool, str], index: Dict[str, Any]) -> bool:
    """Whether to read the dataset into memory at open: always with ``preload=True``;
    with ``"auto"``, when its shards take at most :func:`preload_auto_limit` bytes."""
    if preload == "auto":
        return bool(sum(s["bytes"] for s in index["shards"]) <= preload_auto_limit())
    return bool(preload)


def preload_auto_limit() -> int:
    """The size up to which ``preload="auto"`` reads a dataset into memory: a quarter of
    the memory available now (``MemAvailable``), at most 16 GiB."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if avail is None:
        avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return min(avail // 4, 16 * 2**30)


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
