"""Partial datasets ("parts") written by parallel tasks, and their merge into one dataset.

A distributed job (Ray, Spark, a process pool) writes one part per task with
:func:`write_part`; :func:`merge` then copies the parts' records, in part order, into one
dataset whose shards are cut by ``shard_size`` alone. The merged dataset therefore does not
depend on how the job was partitioned: the same records in the same order give the same
shards (the same records, boundaries and checksums; only the write's random dataset id
differs from one write to the next), whether they came in 1 part or 50.

Part order is the order of the paths given; a directory of parts (``part-000000``,
``part-000001``, ...) is taken in name order, which is the task order :func:`write_part`
encodes. The merge is one :class:`stoker.ShardWriter` write into ``out``, so it is atomic
as every write is: its shards go into a new generation, ``index.json`` is renamed over the
old one last, readers of a dataset it replaces keep reading theirs, and a second writer
(another merge) is refused (docs/storage.md).

Example::

    stoker merge parts/ data/train            # every part under parts/, in name order
    stoker merge parts/part-0* data/train
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from .._args import (
    add_out,
    add_overwrite,
    add_quiet,
    add_shard_size,
    check_dataset,
    plain,
    utf8_path,
)
from .._progress import Progress
from ..fields import Field

__all__ = ["merge", "write_part", "part_name", "list_parts", "copy_records", "record_writer"]

_PART_PREFIX = "part-"
_UNSET = object()


def part_name(task_index: int) -> str:
    """The directory name of part ``task_index`` (sorts in task order up to 10**6 parts)."""
    if task_index < 0:
        raise ValueError(f"task index must be >= 0, got {task_index}")
    return f"{_PART_PREFIX}{task_index:06d}"


def write_part(samples: Iterable[Mapping[str, Any]], parts_dir: Union[str, os.PathLike],
               task_index: int, fields: Mapping[str, Field], *, shard_size="256MB",
               metadata: Optional[Any] = None) -> Dict[str, Any]:
    """Writes one task's samples as part ``task_index`` under ``parts_dir``.

    The part is written under a temporary name and renamed when complete, so a killed
    task leaves no part, and a retried or speculative copy of the same task (same input,
    same output) finds the first finished copy in place and drops its own.
    Returns ``{"path", "records"}``.
    """
    from ..writer import ShardWriter

    parts_dir = os.fspath(parts_dir)
    os.makedirs(parts_dir, exist_ok=True)
    path = os.path.join(parts_dir, part_name(task_index))
    tmp = tempfile.mkdtemp(prefix=f".{part_name(task_index)}.", dir=parts_dir)
    try:
        with ShardWriter(tmp, fields, shard_size=shard_size, metadata=metadata,
                         overwrite=True) as w:
            for s in samples:
                w.write(s)
            n = len(w)
        try:
            os.rename(tmp, path)
        except OSError:
            if not os.path.isfile(os.path.join(path, "index.json")):
                raise
            shutil.rmtree(tmp)  # another copy of this task finished first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"path": path, "records": n}


def list_parts(paths: Sequence[Union[str, os.PathLike]]) -> List[str]:
    """Part directories in merge order: each path is a part (holds index.json), or a
    directory whose sub-directories holding index.json are parts, in name order."""
    out: List[str] = []
    for p in map(os.fspath, paths):
        if os.path.isfile(os.path.join(p, "index.json")) or p.endswith("index.json"):
            out.append(p)
        elif os.path.isdir(p):
            subs = sorted(e.name for e in os.scandir(p)
                          if e.is_dir() and not e.name.startswith(".")
                          and os.path.isfile(os.path.join(e.path, "index.json")))
            if not subs:
                raise FileNotFoundError(f"{p}: neither a dataset nor a directory of parts")
            numbered = [s for s in subs if s.startswith(_PART_PREFIX)]
            if len(numbered) == len(subs):  # write_part's names: no task may be missing
                want = [part_name(i) for i in range(len(subs))]
                missing = sorted(set(want) - set(subs))
                if missing or subs != want:
                    gap = missing[0] if missing else subs[-1]
                    raise FileNotFoundError(f"{p}: parts are not numbered 0..{len(subs) - 1} "
                                            f"(see {gap}): a task's part is missing")
            out.extend(os.path.join(p, s) for s in subs)
        else:
            raise FileNotFoundError(f"{p}: no such part")
    if not out:
        raise ValueError("no parts to merge")
    return out


def _record_writer_class():
    from ..writer import ShardWriter

    class RecordWriter(ShardWriter):
        """A ShardWriter fed with records that a writer of the same schema already
        encoded and validated (read back, checksum verified, from a part): ``write`` takes
        the record's bytes, so copying costs no decoding or re-validation. Shards are cut
        and indexed exactly as ShardWriter does, which keeps merged output identical to a
        dataset written in one piece."""

        def _encode(self, record):
            return record

    return RecordWriter


def record_writer(path, fields, **kw):
    """A writer whose ``write`` takes encoded records (see :func:`copy_records`)."""
    return _record_writer_class()(path, fields, **kw)


def copy_records(writer, part) -> int:
    """Appends every record of dataset ``part`` to ``writer`` (a :func:`record_writer` of
    the same schema); returns the count. Each record is verified (checksum) on the way."""
    header = struct.Struct(f"<{len(writer.fields)}I")
    core = part._core
    for i in range(len(core)):
        payloads = core.read(i)
        writer.write(header.pack(*map(len, payloads)) + b"".join(payloads))
    return len(core)


def _sibling_tmp(out: str, tag: str) -> str:
    """A new temporary directory beside ``out`` (the same filesystem), for work files."""
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.{tag}-", dir=parent)


def merge(parts: Sequence[Union[str, os.PathLike]], out: Union[str, os.PathLike], *,
          shard_size="256MB", metadata: Any = _UNSET, overwrite: bool = False,
          progress: Optional[Callable[[int, int], None]] = None,
          allow_repeats: bool = False) -> Dict[str, Any]:
    """Merges part datasets, in order, into one dataset at ``out``, atomically.

    Args:
        parts: part directories (or directories of parts, see :func:`list_parts`).
        out: the merged dataset's directory; must not hold anything unless ``overwrite``.
        shard_size: target bytes per merged shard.
        metadata: the merged dataset's metadata; by default the parts' (which must agree).
        overwrite: replace an existing ``out``.
        progress: called as ``progress(parts_done, parts_total)``.
        allow_repeats: accept a part given more than once (the same directory by any path,
            or a copy of it: the same dataset id); refused by default, since its samples
            would be in the result twice.

    Returns:
        ``{"parts", "records", "shards", "path"}``.

    Raises:
        ValueError: the parts' schemas (or metadata, when not given) differ; a part is given
            twice (without ``allow_repeats``).
        stoker.DataError: a part's record fails its checksum.

    Example::

        >>> stoker.convert.merge(["parts/part-000000", "parts/part-000001"], "data/train")
    """
    from ..dataset import Dataset

    out = os.fspath(out)
    paths = list_parts(parts)
    datasets = [Dataset(p) for p in paths]
    if not allow_repeats:
        seen: Dict[Any, str] = {}
        for p, d in zip(paths, datasets):
            for key in (("path", os.path.realpath(d.path)), ("id", d.dataset_id)):
                if key[1] is None:
                    continue  # a version-1 part has no identity
                if key in seen:
                    how = "is" if key[0] == "path" else "is a copy of"
                    raise ValueError(f"{p}: {how} the part {seen[key]} given before: its "
                                     "samples would be merged twice (--allow-repeats, "
                                     "allow_repeats=True, if that is what you want)")
                seen[key] = p
    fields = datasets[0].fields
    for p, d in zip(paths, datasets):
        if list(d.fields.items()) != list(fields.items()):
            raise ValueError(f"{p}: schema {d.fields} differs from {paths[0]}'s {fields}")
    if metadata is _UNSET:
        metadata = datasets[0].metadata
        for p, d in zip(paths, datasets):
            if d.metadata != metadata:
                raise ValueError(f"{p}: metadata differs from {paths[0]}'s; pass metadata= "
                                 "(--metadata) to set the merged dataset's")
    with record_writer(out, fields, shard_size=shard_size, metadata=metadata,
                       overwrite=overwrite) as w:
        for k, d in enumerate(datasets):
            copy_records(w, d)
            if progress is not None:
                progress(k + 1, len(datasets))
        records = len(w)
    shards = len(Dataset(out).shards)
    return {"parts": len(paths), "records": records, "shards": shards, "path": out}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``stoker merge``."""
    p.description = plain(__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", metavar="PART", type=utf8_path,
                   help="part datasets, or directories of parts (taken in name order)")
    add_out(p, "the merged dataset's directory")
    add_shard_size(p)
    p.add_argument("--metadata", default=None, metavar="JSON",
                   help="JSON for the merged dataset's metadata (default: the parts')")
    p.add_argument("--allow-repeats", action="store_true",
                   help="accept the same part more than once (by default a part given twice, "
                        "by any path or as a copy, is refused: its samples would be repeated)")
    add_overwrite(p)
    add_quiet(p)


def run(args: argparse.Namespace) -> int:
    meta = _UNSET
    if args.metadata is not None:
        try:
            meta = json.loads(args.metadata)
        except ValueError as e:
            raise ValueError(f"argument --metadata: not JSON ({e})") from None

    parts = list_parts(args.paths)
    for part in parts:
        check_dataset(part)  # an unreadable index.json is a permission error, not corruption
    with Progress(len(parts), "stoker merge", unit="parts", enabled=not args.quiet) as bar:
        stats = merge(args.paths, args.out, shard_size=args.shard_size, metadata=meta,
                      overwrite=args.overwrite, progress=lambda done, total: bar.set(done),
                      allow_repeats=args.allow_repeats)
    print(f"merged {stats['parts']} parts, {stats['records']} records into "
          f"{stats['shards']} shards at {stats['path']}", file=sys.stderr)
    return 0
