"""Maintenance of datasets on disk: ``stoker inspect --upgrade`` and ``--clean``."""

from __future__ import annotations

import os
import warnings
from typing import List, Tuple, Union

from . import _core
from . import _generations as gen
from .writer import FORMAT_VERSION, INDEX_NAME, ShardWriter, _read_existing

__all__ = ["clean", "upgrade"]


def upgrade(path: Union[str, "os.PathLike[str]"]) -> bool:
    """Rewrites a version-1 dataset in the current format, in place and atomically (the
    shards are copied with identity headers; records are not decoded). Returns False if
    it was already current."""
    from .dataset import Dataset

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the "no identity" warning of v1
        old = Dataset(path)
    if old.version == FORMAT_VERSION:
        return False
    with ShardWriter(old.path, old.fields, shard_size=1, metadata=old.metadata,
                     overwrite=True) as w:
        for s in old.shards:
            w.append_shard(os.path.join(old.path, s["path"]))
    return True


def clean(path: Union[str, "os.PathLike[str]"]) -> Tuple[List[str], List[str]]:
    """Removes generations and temporary files that no index.json names and no reader
    uses; returns (removed, still_in_use). Takes the writer lock."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such dataset directory")
    lock = gen.WriterLock(path, what="stoker inspect --clean")
    try:
        keep, keep_v1 = _read_existing(os.path.join(path, INDEX_NAME))
        if keep is None:
            raise _core.DataError(f"{os.path.join(path, INDEX_NAME)}: unreadable, so it is "
                                  "unknown which generation is live; nothing was removed")
        return gen.clean(path, keep=keep, keep_files=keep_v1, locks=lock.enforced)
    finally:
        lock.release()
