"""Tokenizers for :func:`stoker.convert.convert_text`: what a tokenizer spec names, wrapped
with one batch interface.

A spec is any callable from a string to a sequence of ids, or one of:

* a HuggingFace ``tokenizers.Tokenizer`` (or the path of its ``tokenizer.json``, or a
  folder holding one; a ``transformers`` fast tokenizer works as a callable object with
  ``encode``),
* a ``tiktoken.Encoding`` (or ``"tiktoken:NAME"``, e.g. ``"tiktoken:gpt2"``; special
  tokens in the text are encoded as plain text),
* a ``sentencepiece.SentencePieceProcessor`` (or the path of a ``.model`` file),
* ``"package.module:name"``: a callable importable by that name.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, List, Optional, Sequence

__all__ = ["Encoder", "load_tokenizer", "RELEASES_GIL"]

#: tokenizer kinds whose batch encoding runs in native code without the GIL (and in
#: parallel inside the library): converted on threads, never in processes
RELEASES_GIL = ("tokenizers", "tiktoken", "sentencepiece")


class Encoder:
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


def load_tokenizer(spec: Any) -> Encoder:
    """The tokenizer named by `spec` (see the module doc), wrapped for batch encoding."""
    if not isinstance(spec, (str, os.PathLike)):
        return Encoder(spec, repr(spec) if not callable(spec) else
                        getattr(spec, "__qualname__", repr(spec)))
    spec = os.fspath(spec)
    if spec.startswith("tiktoken:"):
        return Encoder(_tiktoken(spec.split(":", 1)[1]), spec)
    path = spec
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "tokenizer.json")):
        path = os.path.join(path, "tokenizer.json")
    if os.path.isfile(path):
        if path.endswith(".model"):
            import sentencepiece

            return Encoder(sentencepiece.SentencePieceProcessor(model_file=path), spec)
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ValueError(f"{path}: reading a tokenizer.json needs the 'tokenizers' "
                             "package (pip install tokenizers)") from e
        try:
            return Encoder(Tokenizer.from_file(path), spec)
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
        return Encoder(obj, spec)
    raise ValueError(f"tokenizer {spec!r}: not a file (tokenizer.json, .model), a folder with "
                     "tokenizer.json, 'tiktoken:NAME' or 'module:callable'")




def _tiktoken(name: str) -> Any:
    try:
        import tiktoken
    except ImportError:
        raise ValueError(f"tokenizer 'tiktoken:{name}' needs the tiktoken package "
                         "(pip install tiktoken)") from None
    try:
        return tiktoken.get_encoding(name)
    except ValueError as e:  # an unknown name: tiktoken lists the known ones
        raise ValueError(f"tokenizer 'tiktoken:{name}': {e}") from None
    except Exception as e:
        # tiktoken downloads an encoding's file on first use and caches it; offline, that
        # fails deep inside requests/urllib3
        cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR") \
            or "the temp dir's data-gym-cache"
        raise ValueError(
            f"tokenizer 'tiktoken:{name}': its BPE file could not be downloaded "
            f"({type(e).__name__}); tiktoken fetches it once from openaipublic.blob.core."
            f"windows.net into {cache} (TIKTOKEN_CACHE_DIR): run once with network access, "
            "or copy that cache from a machine that has it") from None
