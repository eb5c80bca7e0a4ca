"""Converting many input files in parallel with the same output for any process count.

Each input file is converted by one task into a part dataset (:mod:`.merge`), in worker
processes (:mod:`._workers`: the readers parse in Python, holding the GIL); the parts are
copied, in input order, into the output as soon as each is done (so copying overlaps the
conversion of later files). With one process the files are converted straight into the
output. The output shards are cut by ``shard_size`` alone, so 1 or N processes write the
same bytes. Everything is written in a temporary sibling directory renamed to ``out`` at
the end: a failed conversion leaves nothing at ``out``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections import deque
from concurrent.futures import Executor
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from .._progress import Progress
from ..fields import Field
from ._workers import ProcessPool, available_cores
from .merge import _sibling_tmp, copy_records, part_name, record_writer

__all__ = ["convert_files", "expand_sources", "ordered_results", "report", "Skipped"]

#: (where, reason) of a record that skip_bad dropped
Skipped = Tuple[str, str]
#: reader(path, fields, options, skipped, on_bytes) -> iterator of encoded records (the
#: u32 payload lengths, then the payloads, each as the field's ``encode`` makes it)
Reader = Callable[[str, Mapping[str, Field], Dict[str, Any], List[Skipped],
                   Optional[Callable[[int], None]]], Iterator[Mapping[str, Any]]]


def ordered_results(pool: Executor, job: Callable[[int], Any], n: int,
                    depth: int) -> Iterator[Any]:
    """``job(i)`` for i in range(n) run on `pool`, yielded in order, with at most `depth`
    submitted ahead (memory stays flat on any input size). Closed early (a bad file
    raised), the jobs not yet started are cancelled, so the pool's shutdown does not wait
    for them."""
    pending: deque = deque()
    next_i = 0
    try:
        for _ in range(n):
            while next_i < n and len(pending) < depth:
                pending.append(pool.submit(job, next_i))
                next_i += 1
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()


def expand_sources(sources: Sequence[str], suffixes: Optional[Tuple[str, ...]] = None
                   ) -> List[str]:
    """Input files: each source is a file, or a directory whose files (matching
    ``suffixes`` when given; hidden files never) are taken in name order."""
    files: List[str] = []
    for s in map(os.fspath, sources):
        if os.path.isdir(s):
            found = sorted(
                e.path for e in os.scandir(s)
                if e.is_file() and not e.name.startswith(".")
                and (suffixes is None or e.name.lower().endswith(suffixes)))
            if not found:
                want = f" ({', '.join(suffixes)})" if suffixes else ""
                raise FileNotFoundError(f"{s}: no input files{want}")
            files.extend(found)
        elif os.path.isfile(s):
            files.append(s)
        else:
            raise FileNotFoundError(f"{s}: no such file or directory")
    if not files:
        raise FileNotFoundError("no input files")
    return files


def _part_task(reader: Reader, path: str, fields: Mapping[str, Field], options: Dict[str, Any],
               part_dir: str, shard_size) -> Tuple[int, List[Skipped]]:
    skipped: List[Skipped] = []
    with record_writer(part_dir, fields, shard_size=shard_size, overwrite=True) as w:
        for record in reader(path, fields, options, skipped, None):
            w.write(record)
        n = len(w)
    return n, skipped


def convert_files(files: Sequence[str], out: str, fields: Mapping[str, Field], reader: Reader,
                  options: Dict[str, Any], *, workers: Optional[int], shard_size,
                  metadata: Any, overwrite: bool, progress: bool, desc: str
                  ) -> Dict[str, Any]:
    """Runs ``reader`` over ``files`` and writes the samples, in file order, to ``out``.

    Returns ``{"records", "files", "skipped", "shards"}``.
    """
    from ..dataset import Dataset

    out = os.fspath(out)
    if workers is None:
        workers = available_cores()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    workers = min(workers, len(files))
    sizes = [os.path.getsize(f) for f in files]
    skipped: List[Skipped] = []
    parts = _sibling_tmp(out, "parts") if workers > 1 else None
    pool = None
    bar = None
    try:
        if parts is not None:
            pool = ProcessPool(workers)
            results = [pool.submit(_part_task, reader, f, fields, options,
                                   os.path.join(parts, part_name(i)), shard_size)
                       for i, f in enumerate(files)]
        # One ShardWriter write into `out`: atomic as every write (a new generation,
        # index.json renamed last), refused if `out` holds a dataset and not overwrite.
        with record_writer(out, fields, shard_size=shard_size, metadata=metadata,
                           overwrite=overwrite) as w:
            bar = Progress(sum(sizes), desc, unit="B", unit_scale=True, enabled=progress)
            if parts is None:
                for f in files:
                    for record in reader(f, fields, options, skipped, bar.update):
                        w.write(record)
            else:
                for i, r in enumerate(results):
                    _, part_skipped = r.result()
                    skipped.extend(part_skipped)
                    part = os.path.join(parts, part_name(i))
                    copy_records(w, Dataset(part))
                    shutil.rmtree(part)
                    bar.update(sizes[i])
            records = len(w)
        shards = len(Dataset(out).shards)
        bar.close()
        bar = None
        if pool is not None:
            pool.close()
            pool = None
    except BaseException:
        if pool is not None:
            pool.terminate()
        if bar is not None:
            bar.close()
        raise
    finally:
        if parts is not None:
            shutil.rmtree(parts, ignore_errors=True)
    return {"records": records, "files": len(files), "skipped": skipped, "shards": shards}


def report(stats: Mapping[str, Any], out: str, items: str, files: str) -> None:
    """A converter command's last words, on stderr: each item skipped and why, then what
    was written (`items`: "records", "samples"; `files`: what the sources are called)."""
    for where, reason in stats["skipped"]:
        print(f"skipped {where}: {reason}", file=sys.stderr)
    fields = ", ".join(f"{n}: {f!r}" for n, f in stats["fields"].items())
    print(f"wrote {stats['records']} {items} from {stats['files']} {files} to {out} "
          f"({stats['shards']} shards; {{{fields}}})"
          + (f"; skipped {len(stats['skipped'])}" if stats["skipped"] else ""),
          file=sys.stderr)
