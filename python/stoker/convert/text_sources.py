"""Text sources for :func:`stoker.convert.convert_text`: JSON lines, Parquet and saved
HuggingFace ``datasets``, each yielding ``(where, strings)`` in the source's order, where
``where`` names the file and line (or row) for error messages."""

from __future__ import annotations

import gzip
import json
import os
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

from ._errors import InputError

__all__ = ["guess_format", "read_hf", "read_jsonl", "read_parquet"]


def _files(src: Union[str, Sequence[str]], exts: Tuple[str, ...]) -> List[str]:
    paths = [os.fspath(src)] if isinstance(src, (str, os.PathLike)) else [os.fspath(s) for s in src]
    out: List[str] = []
    for p in paths:
        if os.path.isdir(p):
            found = sorted(os.path.join(root, f) for root, _, fs in os.walk(p) for f in fs
                           if f.endswith(exts))
            if not found:
                raise FileNotFoundError(f"{p}: no {'/'.join(exts)} files")
            out += found
        elif os.path.exists(p):
            out.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or directory")
    return out


def _text(value: Any, where: str, key: str) -> str:
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        raise InputError(f"{where}: field {key!r} is {kind}, not a string")
    return value


def read_jsonl(src, keys: List[str]) -> Iterator[Tuple[str, Tuple[str, ...]]]:
    for path in _files(src, (".jsonl", ".jsonl.gz", ".json", ".ndjson")):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8", errors="strict") as f:
            lineno = 0
            try:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    where = f"{path}:{lineno}"
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise InputError(f"{where}: invalid JSON ({e.msg})") from None
                    for key in keys:
                        if not isinstance(obj, dict) or key not in obj:
                            raise InputError(f"{where}: no {key!r} field (use --text-key / "
                                             "--prompt-key)")
                    yield where, tuple(_text(obj[k], where, k) for k in keys)
            except UnicodeDecodeError as e:
                raise InputError(f"{path}:{lineno + 1}: not UTF-8 ({e.reason})") from None


def read_parquet(src, keys: List[str]) -> Iterator[Tuple[str, Tuple[str, ...]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ValueError("reading Parquet needs pyarrow (pip install pyarrow)") from e
    for path in _files(src, (".parquet",)):
        try:
            f = pq.ParquetFile(path)
        except Exception as e:
            raise InputError(f"{path}: not a Parquet file ({e})") from None
        for key in keys:
            if key not in f.schema_arrow.names:
                raise InputError(f"{path}: no column {key!r} (columns: "
                                 f"{', '.join(f.schema_arrow.names)}; use --text-key)")
        row = 0
        for batch in f.iter_batches(columns=keys, batch_size=4096):
            columns = [batch.column(i).to_pylist() for i in range(len(keys))]
            for values in zip(*columns):
                where = f"{path}: row {row}"
                yield where, tuple(_text(v, where, k) for v, k in zip(values, keys))
                row += 1


def read_hf(src, keys: List[str], split: Optional[str]) -> Iterator[Tuple[str, Tuple[str, ...]]]:
    try:
        import datasets
    except ImportError as e:
        raise ValueError("reading a HuggingFace dataset needs the 'datasets' package "
                         "(pip install datasets)") from e
    path = os.fspath(src)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: not a dataset folder (datasets.save_to_disk output)")
    try:
        ds = datasets.load_from_disk(path)
    except Exception as e:
        raise InputError(f"{path}: cannot load with datasets.load_from_disk ({e})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split is None:
            if len(ds) != 1:
                raise ValueError(f"{path}: holds splits {', '.join(ds)}; choose one with --split")
            split = next(iter(ds))
        if split not in ds:
            raise ValueError(f"{path}: no split {split!r} (splits: {', '.join(ds)})")
        ds = ds[split]
    elif split is not None:
        raise ValueError(f"{path}: a single dataset, --split does not apply")
    for key in keys:
        if key not in ds.column_names:
            raise InputError(f"{path}: no column {key!r} (columns: "
                             f"{', '.join(ds.column_names)}; use --text-key)")
    row = 0
    for batch in ds.select_columns(keys).iter(batch_size=4096):
        for values in zip(*(batch[k] for k in keys)):
            where = f"{path}: row {row}"
            yield where, tuple(_text(v, where, k) for v, k in zip(values, keys))
            row += 1



def guess_format(src: Any) -> str:
    first = src if isinstance(src, (str, os.PathLike)) else (src[0] if src else "")
    first = os.fspath(first)
    if os.path.isdir(first):
        if os.path.exists(os.path.join(first, "dataset_info.json")) or \
                os.path.exists(os.path.join(first, "dataset_dict.json")):
            return "hf"
        names = [f for _, _, fs in os.walk(first) for f in fs]
        if any(n.endswith(".parquet") for n in names):
            return "parquet"
        return "jsonl"
    return "parquet" if first.endswith(".parquet") else "jsonl"
