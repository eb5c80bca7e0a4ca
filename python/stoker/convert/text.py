"""Text to token documents: JSONL, Parquet or a HuggingFace ``datasets`` dataset on disk,
through any tokenizer (:mod:`stoker.convert.tokenizer`), into a stoker dataset with one
``stoker.tokens`` field. The sources are read by :mod:`stoker.convert.text_sources`.

Documents are tokenized by ``workers`` in parallel and written in the source's order, so
the output does not depend on ``workers``. Tokenizers that encode in native code without
the GIL (HF ``tokenizers``, tiktoken, sentencepiece) run on threads; any other callable
runs in worker processes when it can be pickled by name (a module-level function or an
object of an importable class), else on threads. Worker processes are fresh interpreters
(:mod:`stoker.convert._workers`), so a script calling ``convert_text`` needs no
``if __name__ == "__main__":`` guard. A progress line on stderr shows documents, tokens and
speed. ``eos`` (an id, or a token string the tokenizer knows) is appended to every
document, as nanoGPT appends ``<|endoftext|>``; ``bos`` is prepended likewise.

Bad input stops the conversion with an :class:`~stoker.convert.InputError` (a
``ValueError``) naming the file and line (JSONL) or row (Parquet, datasets): invalid JSON, a
missing or non-string text field, an id that does not fit the output dtype. Nothing is
skipped silently: empty texts (which make empty documents unless ``eos``/``bos`` is set)
are left out and counted in the summary and in ``Dataset.metadata["empty_documents"]``.

Example::

    stoker convert jsonl corpus/ data/train --tokenizer tokenizer.json --eos "<|endoftext|>"

    from stoker.convert import convert_text
    convert_text("corpus.parquet", "data/train", tokenizer=tok, eos=0, workers=4)
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Deque, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._args import add_out, add_overwrite, add_quiet, add_shard_size, add_workers
from .._progress import Progress
from ._errors import InputError
from ._workers import ProcessPool, WorkerError, available_cores
from .text_sources import guess_format, read_hf, read_jsonl, read_parquet
from .tokenizer import RELEASES_GIL, Encoder, load_tokenizer

__all__ = ["convert_text", "load_tokenizer", "add_arguments", "run", "FORMATS"]

FORMATS = ("jsonl", "parquet", "hf")
_CHUNK_DOCS = 256     # texts per task sent to a worker
_CHUNK_BYTES = 1 << 20
_log = logging.getLogger("stoker")


# -- workers ------------------------------------------------------------------

# the tokenizer of a worker process, set once by _init_worker
_worker_encoder: Optional[Encoder] = None


def _init_worker(payload: bytes) -> None:
    global _worker_encoder
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _worker_encoder = pickle.loads(payload)


def _encode_in_worker(texts: List[str]) -> Tuple[np.ndarray, np.ndarray]:
    assert _worker_encoder is not None
    return _encode_chunk(_worker_encoder, texts)


def _encode_chunk(enc: Encoder, texts: List[str]) -> Tuple[np.ndarray, np.ndarray]:
    """ids of every text back to back (int64) and each text's length."""
    out = enc.encode_batch(texts)
    lengths = np.fromiter((len(ids) for ids in out), np.int64, len(out))
    flat = np.fromiter((int(i) for ids in out for i in ids), np.int64, int(lengths.sum())) \
        if len(out) else np.zeros(0, np.int64)
    return flat, lengths


def _by_name(enc: Encoder) -> Optional[bytes]:
    """The tokenizer pickled, if a fresh interpreter can load it (by module and name:
    nothing of the caller's ``__main__``, no lambda or local function), else None."""
    tok = enc.tok
    for obj in (tok, type(tok)):
        if getattr(obj, "__module__", None) in (None, "__main__"):
            return None
    try:
        return pickle.dumps(enc)
    except Exception:
        return None


class _Encoders:
    """`workers` parallel encoders: ``submit(texts) -> Future``, then ``finish(ok)``.
    Worker processes start at the first chunk, so bad input found while reading the first
    lines costs no process start."""

    def __init__(self, enc: Encoder, workers: int):
        self.enc, self.workers = enc, workers
        self.pool: Any = None
        self.threads: Optional[ThreadPoolExecutor] = None

    def _start(self) -> None:
        enc, workers = self.enc, self.workers
        if enc.kind not in RELEASES_GIL:
            payload = _by_name(enc)
            if payload is not None:
                try:
                    self.pool = ProcessPool(workers, init=(_init_worker, (payload,)))
                    return
                except WorkerError as e:
                    _log.info("stoker convert: tokenizing on threads: %s", e)
            else:
                _log.info("stoker convert: tokenizer %s cannot be loaded by name in a worker "
                          "process: tokenizing on threads (a Python tokenizer then holds the "
                          "GIL)", enc.name)
        self.threads = ThreadPoolExecutor(workers, thread_name_prefix="stoker-tokenize")

    def submit(self, texts: List[str]) -> Future:
        if self.workers > 1 and self.pool is None and self.threads is None:
            self._start()
        if self.pool is not None:
            return self.pool.submit(_encode_in_worker, texts)
        if self.threads is not None:
            return self.threads.submit(_encode_chunk, self.enc, texts)
        fut: Future = Future()
        try:
            fut.set_result(_encode_chunk(self.enc, texts))
        except Exception as e:
            fut.set_exception(e)
        return fut

    def finish(self, ok: bool) -> None:
        if self.pool is not None:
            self.pool.close() if ok else self.pool.terminate()
        if self.threads is not None:
            self.threads.shutdown(wait=True, cancel_futures=not ok)


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

def _tokenizer_name(enc: Encoder) -> str:
    """What the metadata keeps of the tokenizer: a file by its name, not its path."""
    name = enc.name
    return os.path.basename(name.rstrip("/")) if os.path.exists(name) else name


def _resolve_special(enc: Encoder, value: Any, name: str) -> Optional[int]:
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
        workers: how many texts are tokenized at once (threads or processes, as the
            module doc says); None = the cores this process may use, 1 = in this thread.
    Returns the summary stored in ``Dataset(out).metadata``.
    """
    from .. import ShardWriter, scalar, tokens

    for path in [src] if isinstance(src, (str, os.PathLike)) else src:
        if not os.path.exists(path):  # before loading a tokenizer (which may download)
            raise FileNotFoundError(f"{os.fspath(path)}: no such file or directory")
    enc = load_tokenizer(tokenizer)
    fmt = format or guess_format(src)
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
        workers = available_cores()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    keys = [text_key] if prompt_key is None else [prompt_key, text_key]
    if fmt == "jsonl":
        items = read_jsonl(src, keys)
    elif fmt == "parquet":
        items = read_parquet(src, keys)
    else:
        items = read_hf(src, keys, split)

    # Sources by name only: metadata travels with the dataset, and this machine's folders
    # mean nothing on the next one.
    names = [os.path.basename(os.fspath(s).rstrip("/")) for s in
             ([src] if isinstance(src, (str, os.PathLike)) else src)]
    summary = {"source": names[0] if isinstance(src, (str, os.PathLike)) else names,
               "format": fmt, "tokenizer": _tokenizer_name(enc), "vocab_size": vocab,
               "eos_id": eos_id, "bos_id": bos_id, "documents": 0, "tokens": 0,
               "empty_documents": 0,
               "prompt_field": None if prompt_key is None else "prompt_tokens"}
    bar = _Progress(f"stoker convert {fmt}", progress)
    encoders = _Encoders(enc, workers)

    per = len(keys)
    head = np.array([bos_id] if bos_id is not None else [], np.int64)
    tail = np.array([eos_id] if eos_id is not None else [], np.int64)

    def write(w, wheres: List[str], flat: np.ndarray, lengths: np.ndarray) -> None:
        if len(flat) and (flat.min() < 0 or flat.max() > limit):
            pos = int(np.flatnonzero((flat < 0) | (flat > limit))[0])
            doc = int(np.searchsorted(np.cumsum(lengths), pos, side="right")) // per
            raise InputError(f"{wheres[doc]}: token id {int(flat[pos])} does not fit "
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
            flat, lengths = res.result()
        except WorkerError:
            raise
        except Exception as e:
            where = wheres[0] if len(wheres) == 1 else f"{wheres[0]} .. {wheres[-1]}"
            raise InputError(f"{where}: the tokenizer failed: {type(e).__name__}: {e}") from e
        write(w, wheres, flat, lengths)
        bar.update(summary["documents"], summary["tokens"], chars)

    ok = False
    try:
        fields = {"tokens": tokens(dtype)}
        if prompt_key is not None:
            fields["prompt_tokens"] = scalar("int32")
        with ShardWriter(out, fields, shard_size=shard_size, overwrite=overwrite,
                         metadata=summary) as w:
            for wheres, texts in _chunks(items):
                chars += sum(map(len, texts))
                pending.append((wheres, encoders.submit(texts)))
                while len(pending) > 2 * workers:
                    drain(w)
            while pending:
                drain(w)
            if summary["documents"] == 0:
                raise InputError(f"{summary['source']}: no documents (no text, or only empty "
                                 "texts)")
        ok = True
    finally:
        encoders.finish(ok)
    bar.update(summary["documents"], summary["tokens"], chars, final=True)
    return summary


# -- command line -------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser, fmt: str) -> None:
    p.add_argument("src", nargs="+" if fmt != "hf" else None, metavar="SRC",
                   help="input file(s) or folder" if fmt != "hf" else
                   "a datasets.save_to_disk folder")
    add_out(p)
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
    p.add_argument("--dtype", default=None, choices=("uint16", "uint32"),
                   help="token type stored (default: uint16 when the vocabulary fits)")
    add_workers(p)
    add_shard_size(p)
    add_overwrite(p)
    add_quiet(p)
    p.set_defaults(text_format=fmt)


def run(args: argparse.Namespace) -> int:
    src = args.src if args.text_format == "hf" else \
        (args.src[0] if len(args.src) == 1 else args.src)
    s = convert_text(src, args.out, args.tokenizer, format=args.text_format,
                     text_key=args.text_key, split=getattr(args, "split", None),
                     prompt_key=args.prompt_key, eos=args.eos,
                     bos=args.bos, dtype=args.dtype, workers=args.workers,
                     shard_size=args.shard_size, overwrite=args.overwrite,
                     progress=not args.quiet)
    print(f"wrote {s['documents']:,} documents, {s['tokens']:,} tokens to {args.out}"
          + (f" ({s['empty_documents']:,} empty texts left out)" if s["empty_documents"] else ""),
          file=sys.stderr)
    return 0
