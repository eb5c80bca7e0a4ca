"""Text to token documents: JSONL, Parquet or a HuggingFace ``datasets`` dataset on disk,
through any tokenizer, into a stoker dataset with one ``stoker.tokens`` field.

The tokenizer is any callable from a string to a sequence of ids, or one of:

* a HuggingFace ``tokenizers.Tokenizer`` (or the path of its ``tokenizer.json``, or a
  folder holding one; a ``transformers`` fast tokenizer works as a callable object with
  ``encode``),
* a ``tiktoken.Encoding`` (or ``"tiktoken:NAME"``, e.g. ``"tiktoken:gpt2"``; special
  tokens in the text are encoded as plain text),
* a ``sentencepiece.SentencePieceProcessor`` (or the path of a ``.model`` file),
* ``"package.module:name"``: a callable importable by that name.

Documents are tokenized in parallel worker processes (``workers``; the tokenizer is
pickled to them, or inherited through ``fork`` when it cannot be pickled) and written in
the source's order, so the output does not depend on ``workers``. A progress line on
stderr shows documents, tokens and speed. ``eos`` (an id, or a token string the tokenizer
knows) is appended to every document, as nanoGPT appends ``<|endoftext|>``; ``bos`` is
prepended likewise.

Bad input stops the conversion with a ``ValueError`` naming the file and line (JSONL) or
row (Parquet, datasets): invalid JSON, a missing or non-string text field, an id that does
not fit the output dtype. Nothing is skipped silently: empty texts (which make empty
documents unless ``eos``/``bos`` is set) are left out and counted in the summary and in
``Dataset.metadata["empty_documents"]``.

Example::

    stoker convert jsonl corpus/ data/train --tokenizer tokenizer.json --eos "<|endoftext|>"

    from stoker.convert import convert_text
    convert_text("corpus.parquet", "data/train", tokenizer=tok, eos=0, workers=4)
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import json
import multiprocessing
import os
import pickle
import sys
import time
from collections import deque
from typing import Any, Deque, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._progress import Progress

__all__ = ["convert_text", "load_tokenizer", "add_arguments", "run", "FORMATS"]

FORMATS = ("jsonl", "parquet", "hf")
_CHUNK_DOCS = 256     # texts per task sent to a worker
_CHUNK_BYTES = 1 << 20


# -- tokenizers ---------------------------------------------------------------

class _Encoder:
    """A picklable wrapper giving ``encode_batch(texts) -> [ids]``, plus the vocabulary
    size and token lookup where the tokenizer knows them."""

    def __init__(self, tok: Any, name: str):
        self.tok = tok
        self.name = name
        self.kind = _kind(tok)

    def encode_batch(self, texts: List[str]) -> List[Sequence[int]]:
        t, k = self.tok, self.kind
        if k == "tokenizers":
            return [e.ids for e in t.encode_batch(texts, add_special_tokens=False)]
        if k == "tiktoken":
            return t.encode_ordinary_batch(texts)
        if k == "sentencepiece":
            return t.encode(texts)
        if k == "encode":
            return [t.encode(s) for s in texts]
        return [t(s) for s in texts]

    @property
    def vocab_size(self) -> Optional[int]:
        t, k = self.tok, self.kind
        try:
            if k == "tokenizers":
                return int(t.get_vocab_size(with_added_tokens=True))
            if k == "tiktoken":
                return int(t.n_vocab)
            if k == "sentencepiece":
                return int(t.get_piece_size())
            n = getattr(t, "vocab_size", None)
            if n is not None:
                return int(len(t) if hasattr(t, "__len__") else n)
        except Exception:
            return None
        return None

    def token_id(self, token: str) -> Optional[int]:
        t, k = self.tok, self.kind
        if k == "tokenizers":
            return t.token_to_id(token)
        if k == "tiktoken":
            try:
                return t.encode_single_token(token)
            except KeyError:
                return None
        if k == "sentencepiece":
            i = t.piece_to_id(token)
            return None if i == t.unk_id() and token != t.id_to_piece(i) else i
        conv = getattr(t, "convert_tokens_to_ids", None)
        return conv(token) if conv else None


def _kind(tok: Any) -> str:
    mod = type(tok).__module__ or ""
    if mod.startswith("tokenizers") and hasattr(tok, "encode_batch"):
        return "tokenizers"
    if mod.startswith("tiktoken") and hasattr(tok, "encode_ordinary_batch"):
        return "tiktoken"
    if mod.startswith("sentencepiece") and hasattr(tok, "piece_to_id"):
        return "sentencepiece"
    if callable(tok):
        return "callable"
    if hasattr(tok, "encode"):
        return "encode"
    raise ValueError(f"tokenizer {tok!r} is neither callable nor has encode(); pass a "
                     "callable text -> ids, a tokenizers.Tokenizer, a tiktoken.Encoding, a "
                     "SentencePieceProcessor or a path to tokenizer.json / a .model file")


def load_tokenizer(spec: Any) -> _Encoder:
    """The tokenizer named by `spec` (see the module doc), wrapped for batch encoding."""
    if not isinstance(spec, (str, os.PathLike)):
        return _Encoder(spec, repr(spec) if not callable(spec) else
                        getattr(spec, "__qualname__", repr(spec)))
    spec = os.fspath(spec)
    if spec.startswith("tiktoken:"):
        import tiktoken

        return _Encoder(tiktoken.get_encoding(spec.split(":", 1)[1]), spec)
    path = spec
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "tokenizer.json")):
        path = os.path.join(path, "tokenizer.json")
    if os.path.isfile(path):
        if path.endswith(".model"):
            import sentencepiece

            return _Encoder(sentencepiece.SentencePieceProcessor(model_file=path), spec)
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ValueError(f"{path}: reading a tokenizer.json needs the 'tokenizers' "
                             "package (pip install tokenizers)") from e
        try:
            return _Encoder(Tokenizer.from_file(path), spec)
        except Exception as e:
            raise ValueError(f"{path}: not a HuggingFace tokenizer.json ({e})") from None
    if ":" in spec and not os.path.exists(spec):
        module, _, name = spec.partition(":")
        try:
            obj = importlib.import_module(module)
            for part in name.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"tokenizer {spec!r}: cannot import {name!r} from {module!r} "
                             f"({e})") from None
        return _Encoder(obj, spec)
    raise ValueError(f"tokenizer {spec!r}: not a file (tokenizer.json, .model), a folder with "
                     "tokenizer.json, 'tiktoken:NAME' or 'module:callable'")


# -- sources ------------------------------------------------------------------

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
        raise ValueError(f"{where}: field {key!r} is {kind}, not a string")
    return value


def _read_jsonl(src, keys: List[str]) -> Iterator[Tuple[str, Tuple[str, ...]]]:
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
                        raise ValueError(f"{where}: invalid JSON ({e.msg})") from None
                    for key in keys:
                        if not isinstance(obj, dict) or key not in obj:
                            raise ValueError(f"{where}: no {key!r} field (use --text-key / "
                                             "--prompt-key)")
                    yield where, tuple(_text(obj[k], where, k) for k in keys)
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno + 1}: not UTF-8 ({e.reason})") from None


def _read_parquet(src, keys: List[str]) -> Iterator[Tuple[str, Tuple[str, ...]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ValueError("reading Parquet needs pyarrow (pip install pyarrow)") from e
    for path in _files(src, (".parquet",)):
        try:
            f = pq.ParquetFile(path)
        except Exception as e:
            raise ValueError(f"{path}: not a Parquet file ({e})") from None
        for key in keys:
            if key not in f.schema_arrow.names:
                raise ValueError(f"{path}: no column {key!r} (columns: "
                                 f"{', '.join(f.schema_arrow.names)}; use --text-key)")
        row = 0
        for batch in f.iter_batches(columns=keys, batch_size=4096):
            columns = [batch.column(i).to_pylist() for i in range(len(keys))]
            for values in zip(*columns):
                where = f"{path}: row {row}"
                yield where, tuple(_text(v, where, k) for v, k in zip(values, keys))
                row += 1


def _read_hf(src, keys: List[str], split: Optional[str]) -> Iterator[Tuple[str, Tuple[str, ...]]]:
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
        raise ValueError(f"{path}: cannot load with datasets.load_from_disk ({e})") from None
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
            raise ValueError(f"{path}: no column {key!r} (columns: "
                             f"{', '.join(ds.column_names)}; use --text-key)")
    row = 0
    for batch in ds.select_columns(keys).iter(batch_size=4096):
        for values in zip(*(batch[k] for k in keys)):
            where = f"{path}: row {row}"
            yield where, tuple(_text(v, where, k) for v, k in zip(values, keys))
            row += 1


# -- workers ------------------------------------------------------------------

def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 2  # unknown: assume threads, use spawn

_worker_encoder: Optional[_Encoder] = None


def _init_worker(payload: Optional[bytes]) -> None:
    global _worker_encoder
    if payload is not None:
        _worker_encoder = pickle.loads(payload)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _encode_chunk(texts: List[str]) -> Tuple[np.ndarray, np.ndarray]:
    """ids of every text back to back (int64) and each text's length."""
    assert _worker_encoder is not None
    out = _worker_encoder.encode_batch(texts)
    lengths = np.fromiter((len(ids) for ids in out), np.int64, len(out))
    flat = np.fromiter((int(i) for ids in out for i in ids), np.int64, int(lengths.sum())) \
        if len(out) else np.zeros(0, np.int64)
    return flat, lengths


def _chunks(items: Iterator[Tuple[str, Tuple[str, ...]]]):
    """(wheres, texts) lists of about _CHUNK_DOCS examples / _CHUNK_BYTES characters; an
    example's strings (prompt, text) are consecutive in texts."""
    wheres: List[str] = []
    texts: List[str] = []
    size = 0
    for where, strings in items:
        wheres.append(where)
        texts.extend(strings)
        size += sum(map(len, strings))
        if len(texts) >= _CHUNK_DOCS or size >= _CHUNK_BYTES:
            yield wheres, texts
            wheres, texts, size = [], [], 0
    if texts:
        yield wheres, texts


class _Progress:
    """Documents so far with their rate, as a bar on a terminal (stoker._progress; the total
    is not known ahead of a streamed source), and a summary line at the end."""

    def __init__(self, label: str, enabled: bool):
        self.label, self.enabled = label, enabled
        self.t0 = time.perf_counter()
        self._bar = Progress(None, label, unit="docs", enabled=enabled)

    def update(self, docs: int, tokens: int, chars: int, final: bool = False) -> None:
        self._bar.set(docs)
        self._bar.note(f"{tokens:,} tokens")
        if not final:
            return
        self._bar.close()
        if self.enabled:
            secs = max(time.perf_counter() - self.t0, 1e-9)
            print(f"{self.label}: {docs:,} documents, {tokens:,} tokens, "
                  f"{chars / secs / 1e6:.2f} M chars/s", file=sys.stderr, flush=True)


# -- the conversion -----------------------------------------------------------

def _resolve_special(enc: _Encoder, value: Any, name: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
        i = enc.token_id(value)
        if i is None:
            raise ValueError(f"{name} {value!r}: the tokenizer has no such token")
        return int(i)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a token id or a token string, got {value!r}")
    return int(value)


def convert_text(src: Union[str, os.PathLike, Sequence[str]], out: Union[str, os.PathLike],
                 tokenizer: Any, *, format: Optional[str] = None, text_key: str = "text",
                 split: Optional[str] = None, prompt_key: Optional[str] = None,
                 eos: Any = None, bos: Any = None,
                 dtype: Optional[str] = None, workers: Optional[int] = None,
                 shard_size: Union[int, str] = "256MB", overwrite: bool = False,
                 progress: bool = False) -> dict:
    """Tokenizes the texts of `src` into a stoker dataset at `out` with one field
    ``{"tokens": stoker.tokens(dtype)}``, one document per text, in the source's order.

    Args:
        src: a JSONL file (``.jsonl``, ``.jsonl.gz``), a Parquet file, a folder of either
            (sorted), a list of files, or a ``datasets.save_to_disk`` folder (``format="hf"``).
        tokenizer: see the module doc.
        format: ``"jsonl"``, ``"parquet"`` or ``"hf"``; None = from the file extension.
        text_key: the field / column holding the text.
        split: for a saved ``DatasetDict``: which split.
        prompt_key: fine-tuning data: the field with each example's prompt. A document is
            then bos + prompt + text + eos, and an ``int32`` field ``prompt_tokens`` holds
            the length of bos + prompt: packed batches give those positions no label
            (``TokenDataset`` finds the field through the metadata).
        eos, bos: appended / prepended id (or token string) for every document.
        dtype: ``"uint16"`` or ``"uint32"``; None = uint16 when the vocabulary fits.
        workers: tokenizer processes; None = the cores available, 1 = in this process.
    Returns the summary stored in ``Dataset(out).metadata``.
    """
    from .. import ShardWriter, scalar, tokens

    enc = load_tokenizer(tokenizer)
    fmt = format or _guess_format(src)
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    eos_id = _resolve_special(enc, eos, "eos")
    bos_id = _resolve_special(enc, bos, "bos")
    vocab = enc.vocab_size
    if dtype is None:
        dtype = "uint16" if vocab is not None and vocab <= 65536 else "uint32"
    if dtype not in ("uint16", "uint32"):
        raise ValueError(f"dtype must be 'uint16' or 'uint32', got {dtype!r}")
    limit = np.iinfo(dtype).max
    for name, v in (("eos", eos_id), ("bos", bos_id)):
        if v is not None and v > limit:
            raise ValueError(f"{name} id {v} does not fit {dtype}")
        if v is not None and vocab is not None and v >= vocab:
            raise ValueError(f"{name} id {v} is outside the tokenizer's vocabulary of {vocab}")
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    keys = [text_key] if prompt_key is None else [prompt_key, text_key]
    if fmt == "jsonl":
        items = _read_jsonl(src, keys)
    elif fmt == "parquet":
        items = _read_parquet(src, keys)
    else:
        items = _read_hf(src, keys, split)

    summary = {"source": os.fspath(src) if isinstance(src, (str, os.PathLike)) else list(src),
               "format": fmt, "tokenizer": enc.name, "vocab_size": vocab, "eos_id": eos_id,
               "bos_id": bos_id, "documents": 0, "tokens": 0, "empty_documents": 0,
               "prompt_field": None if prompt_key is None else "prompt_tokens"}
    bar = _Progress(f"stoker convert {fmt}", progress)
    global _worker_encoder
    pool = None
    if workers > 1:
        # fork is fast (nothing to import) and safe while this process has one thread;
        # otherwise spawn, which needs the tokenizer to pickle. One that does not pickle
        # (a lambda, a local function) is inherited through fork in any case.
        try:
            payload: Optional[bytes] = pickle.dumps(enc)
        except Exception:
            payload = None
        single = _thread_count() == 1
        method = "fork" if (payload is None or single) and \
            "fork" in multiprocessing.get_all_start_methods() else "spawn"
        if method == "fork":
            _worker_encoder = enc
            payload = None
        elif payload is None:
            raise ValueError("the tokenizer cannot be pickled and this platform cannot fork: "
                             "pass workers=1 or a picklable tokenizer")
        pool = multiprocessing.get_context(method).Pool(workers, initializer=_init_worker,
                                                         initargs=(payload,))
    else:
        _worker_encoder = enc

    per = len(keys)
    head = np.array([bos_id] if bos_id is not None else [], np.int64)
    tail = np.array([eos_id] if eos_id is not None else [], np.int64)

    def write(w, wheres: List[str], flat: np.ndarray, lengths: np.ndarray) -> None:
        if len(flat) and (flat.min() < 0 or flat.max() > limit):
            pos = int(np.flatnonzero((flat < 0) | (flat > limit))[0])
            doc = int(np.searchsorted(np.cumsum(lengths), pos, side="right")) // per
            raise ValueError(f"{wheres[doc]}: token id {int(flat[pos])} does not fit "
                             f"{dtype}" + (" (pass dtype='uint32')" if dtype == "uint16" else ""))
        ends = np.cumsum(lengths)
        for i in range(len(lengths) // per):
            parts = [flat[ends[j] - lengths[j]:ends[j]] for j in range(i * per, (i + 1) * per)]
            ids = np.concatenate([head] + parts + [tail]) if len(head) or len(tail) or per > 1 \
                else parts[0]
            if len(ids) == 0:
                summary["empty_documents"] += 1
                continue
            sample = {"tokens": ids.astype(dtype)}
            if prompt_key is not None:
                sample["prompt_tokens"] = len(head) + len(parts[0])
            w.write(sample)
            summary["documents"] += 1
            summary["tokens"] += len(ids)

    # Reading stays in this thread (errors name the line), and at most 2 chunks per
    # worker are in flight, so memory does not grow with the corpus.
    pending: Deque[Tuple[List[str], Any]] = deque()
    chars = 0

    def drain(w) -> None:
        wheres, res = pending.popleft()
        try:
            flat, lengths = res.get() if pool is not None else res
        except Exception as e:
            where = wheres[0] if len(wheres) == 1 else f"{wheres[0]} .. {wheres[-1]}"
            raise ValueError(f"{where}: the tokenizer failed: {type(e).__name__}: {e}") from e
        write(w, wheres, flat, lengths)
        bar.update(summary["documents"], summary["tokens"], chars)

    try:
        fields = {"tokens": tokens(dtype)}
        if prompt_key is not None:
            fields["prompt_tokens"] = scalar("int32")
        with ShardWriter(out, fields, shard_size=shard_size, overwrite=overwrite,
                         metadata=summary) as w:
            for wheres, texts in _chunks(items):
                chars += sum(map(len, texts))
                if pool is not None:
                    pending.append((wheres, pool.apply_async(_encode_chunk, (texts,))))
                else:
                    try:
                        pending.append((wheres, _encode_chunk(texts)))
                    except Exception as e:
                        raise ValueError(f"{wheres[0]} .. {wheres[-1]}: the tokenizer failed: "
                                         f"{type(e).__name__}: {e}") from e
                while len(pending) > 2 * workers:
                    drain(w)
            while pending:
                drain(w)
            if summary["documents"] == 0:
                raise ValueError(f"{summary['source']}: no documents (no text, or only empty "
                                 "texts)")
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        _worker_encoder = None
    bar.update(summary["documents"], summary["tokens"], chars, final=True)
    return summary


def _guess_format(src: Any) -> str:
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


# -- command line -------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser, fmt: str) -> None:
    p.add_argument("src", nargs="+" if fmt != "hf" else None,
                   help="input file(s) or folder" if fmt != "hf" else
                   "a datasets.save_to_disk folder")
    p.add_argument("out", help="output dataset directory")
    p.add_argument("--tokenizer", required=True,
                   help="tokenizer.json (or its folder), a .model file (sentencepiece), "
                        "tiktoken:NAME, or module:callable")
    p.add_argument("--text-key", default="text", help="field/column with the text")
    p.add_argument("--prompt-key", default=None,
                   help="fine-tuning data: field/column with a prompt that precedes the text "
                        "and gets no loss in packed batches")
    if fmt == "hf":
        p.add_argument("--split", default=None, help="split of a saved DatasetDict")
    p.add_argument("--eos", default=None, help="id or token appended to every document")
    p.add_argument("--bos", default=None, help="id or token prepended to every document")
    p.add_argument("--dtype", default=None, choices=("uint16", "uint32"))
    p.add_argument("--workers", type=int, default=None, help="tokenizer processes")
    p.add_argument("--shard-size", default="256MB")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(text_format=fmt)


def run(args: argparse.Namespace) -> int:
    src = args.src if args.text_format == "hf" else \
        (args.src[0] if len(args.src) == 1 else args.src)
    s = convert_text(src, args.out, args.tokenizer, format=args.text_format,
                     text_key=args.text_key, split=getattr(args, "split", None),
                     prompt_key=args.prompt_key, eos=args.eos,
                     bos=args.bos, dtype=args.dtype, workers=args.workers,
                     shard_size=args.shard_size, overwrite=args.overwrite, progress=True)
    print(f"wrote {s['documents']:,} documents, {s['tokens']:,} tokens to {args.out}"
          + (f" ({s['empty_documents']:,} empty texts left out)" if s["empty_documents"] else ""),
          file=sys.stderr)
    return 0
