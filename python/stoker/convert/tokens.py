"""Token files to a checksummed stoker dataset: Megatron-LM ``.bin``/``.idx`` and
nanoGPT's flat ``.bin``.

``stoker.TokenDataset`` reads both in place already; converting adds what they lack: a
checksum on every document, verified on every read, and one self-describing dataset
(``stoker inspect --verify`` checks it). Each Megatron sequence becomes one document. A
nanoGPT file has no document boundaries: with ``eos_id`` a document ends after each
end-of-text token; without it the stream is stored in documents of ``chunk_tokens``
tokens (default 4096: windows read and verify whole records, so records stay small), and
``TokenDataset`` windows over the result equal windows over the original file.

Example::

    stoker convert megatron corpus_text_document data/train
    stoker convert nanogpt train.bin data/train --dtype uint16 --eos-id 50256
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence, Union

import numpy as np

from .._args import add_out, add_overwrite, add_quiet, add_shard_size, nonneg_int, positive_int
from .._progress import Progress
from ._errors import InputError

__all__ = ["convert_tokens", "add_arguments", "run"]

_CHUNK_DEFAULT = 4096


def convert_tokens(src: Union[str, os.PathLike, Sequence[str]], out: Union[str, os.PathLike],
                   *, format: str, dtype: Optional[str] = None, eos_id: Optional[int] = None,
                   chunk_tokens: int = _CHUNK_DEFAULT, vocab_size: Optional[int] = None,
                   shard_size: Union[int, str] = "256MB", overwrite: bool = False,
                   progress: bool = False) -> dict:
    """Copies the documents of a Megatron dataset (``format="megatron"``, `src` a prefix or
    a list of them) or of nanoGPT token files (``format="nanogpt"``, `dtype` required) into
    a stoker dataset with one ``stoker.tokens`` field. Returns the summary stored in
    ``Dataset(out).metadata``."""
    from .. import ShardWriter, TokenDataset, tokens

    if format == "megatron":
        if eos_id is not None:
            raise ValueError("eos_id applies to nanogpt files; Megatron datasets record "
                             "their documents")
        from ..token_dataset import megatron_prefix

        for p in ([src] if isinstance(src, (str, os.PathLike)) else src):
            if megatron_prefix(os.fspath(p)) is None:
                raise ValueError(f"{os.fspath(p)}: not a Megatron dataset (no .idx beside it)")
        ds = TokenDataset(src, dtype=dtype)
    elif format == "nanogpt":
        ds = TokenDataset(src, dtype=dtype, eos_id=eos_id)
        if ds.kind != "flat":
            raise ValueError(f"{src}: a {ds.kind} dataset, not flat token files")
    else:
        raise ValueError(f"format must be 'megatron' or 'nanogpt', got {format!r}")
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be a positive int, got {chunk_tokens!r}")
    store = ds.dtype if ds.dtype in ("uint16", "uint32", "int32", "int64") else None
    if store is None:  # uint8 / int8 / int16: widen to a token field type
        store = "uint16" if np.dtype(ds.dtype).kind == "u" else "int32"
    split = format == "nanogpt" and eos_id is None
    names = [os.path.basename(p) for p in ds.paths]  # by name: paths mean nothing elsewhere
    summary = {"source": names if len(names) > 1 else names[0], "format": format,
               "vocab_size": vocab_size, "eos_id": eos_id, "documents": 0,
               "tokens": ds.num_tokens, "empty_documents": 0,
               "chunk_tokens": chunk_tokens if split else None}
    with ShardWriter(out, {"tokens": tokens(store)}, shard_size=shard_size,
                     overwrite=overwrite, metadata=summary) as w, \
            Progress(len(ds), f"stoker convert {format}", unit="docs", enabled=progress) as bar:
        for i in range(len(ds)):
            bar.update()
            doc = ds[i]
            if np.dtype(ds.dtype).kind == "i" and len(doc) and doc.min() < 0:
                raise InputError(f"{ds._source.where(i)}: negative token id {int(doc.min())}")
            if len(doc) == 0:
                summary["empty_documents"] += 1
                continue
            pieces = [doc[j:j + chunk_tokens] for j in range(0, len(doc), chunk_tokens)] \
                if split else [doc]
            for piece in pieces:
                w.write({"tokens": piece.astype(store, copy=False)})
                summary["documents"] += 1
        if summary["documents"] == 0:
            raise InputError(f"{summary['source']}: no tokens")
    return summary


def add_arguments(p: argparse.ArgumentParser, fmt: str) -> None:
    p.add_argument("src", nargs="+", metavar="SRC",
                   help="Megatron prefix(es): PREFIX for PREFIX.bin + PREFIX.idx"
                   if fmt == "megatron" else "token file(s), one stream in the order given")
    add_out(p)
    if fmt == "nanogpt":
        p.add_argument("--dtype", required=True,
                       choices=("uint8", "int8", "uint16", "int16", "uint32", "int32", "int64"),
                       help="token type of the files (nanoGPT: uint16)")
        p.add_argument("--eos-id", type=nonneg_int, default=None, metavar="ID",
                       help="a document ends after each such token (nanoGPT's GPT-2: 50256)")
        p.add_argument("--chunk-tokens", type=positive_int, default=_CHUNK_DEFAULT, metavar="N",
                       help=f"without --eos-id: tokens per stored document "
                            f"(default {_CHUNK_DEFAULT})")
    p.add_argument("--vocab-size", type=positive_int, default=None, metavar="N",
                   help="stored in the metadata; ids at or above it are refused when loading")
    add_shard_size(p)
    add_overwrite(p)
    add_quiet(p)
    p.set_defaults(token_format=fmt)


def run(args: argparse.Namespace) -> int:
    src = args.src[0] if len(args.src) == 1 else args.src
    s = convert_tokens(src, args.out, format=args.token_format,
                       dtype=getattr(args, "dtype", None), eos_id=getattr(args, "eos_id", None),
                       chunk_tokens=getattr(args, "chunk_tokens", _CHUNK_DEFAULT),
                       vocab_size=args.vocab_size, shard_size=args.shard_size,
                       overwrite=args.overwrite, progress=not args.quiet)
    print(f"wrote {s['documents']:,} documents, {s['tokens']:,} tokens to {args.out}",
          file=sys.stderr)
    return 0
