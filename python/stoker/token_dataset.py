"""Language-model data: :class:`TokenDataset`, and the batches the loader makes of it.

Three kinds of token data are read where they lie, through ``mmap``, without conversion:

* flat token files, as nanoGPT's ``prepare.py`` writes them (``train.bin``: raw
  ``uint16`` ids): ``TokenDataset("train.bin", dtype="uint16")``; several files are
  one stream. Each file is one document, or, with ``eos_id=``, a document ends after
  every end-of-text token.
* Megatron-LM indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``):
  ``TokenDataset("corpus_text_document")``; each sequence of the index is a document.
* a stoker dataset with a :func:`stoker.tokens` field (one document per record, every
  record checksummed): ``TokenDataset("data/train")`` (``stoker convert jsonl|parquet``
  writes these).

``stoker.Loader(ds, seq_len=..., packing=..., max_tokens=...)`` turns them into
batches (see ``docs/tokens.md``); :func:`_make_producer` checks those arguments and
builds the C++ batch producer the loader runs.
"""

from __future__ import annotations

import operator
import os
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Union

from . import _core
from ._index import INDEX_NAME
from .dataset import Dataset
from .fields import NDArray, Tokens

if TYPE_CHECKING:  # imported where arrays are made: `import stoker` stays quick
    import numpy as np

__all__ = ["TokenDataset", "PACKING_MODES", "TOKEN_DTYPES", "LABEL_CONVENTIONS"]

PathLike = Union[str, "os.PathLike[str]"]

#: values of ``Loader(packing=...)``
PACKING_MODES = (None, "concat", "document")
#: values of ``Loader(token_dtype=...)``
TOKEN_DTYPES = ("int64", "int32")
#: values of ``Loader(labels=...)``: the label of position i is the next token
#: ("shifted", nanoGPT's x, y), or the token itself and the model shifts ("unshifted",
#: HuggingFace's causal-LM models); docs/tokens.md, "Label conventions"
LABEL_CONVENTIONS = ("shifted", "unshifted")
_FLAT_DTYPES = ("uint8", "uint16", "int16", "uint32", "int32", "int64")


def _is_stoker_dir(path: str) -> bool:
    return (os.path.isdir(path) and os.path.exists(os.path.join(path, INDEX_NAME))) or \
        os.path.basename(path) == INDEX_NAME


def megatron_prefix(path: str) -> Optional[str]:
    """The Megatron prefix `path` names (PREFIX, PREFIX.bin or PREFIX.idx), or None."""
    for ext in (".idx", ".bin"):
        if path.endswith(ext) and os.path.exists(path[: -len(ext)] + ".idx"):
            return path[: -len(ext)]
    if os.path.exists(path + ".idx"):
        return path
    return None


def _token_field(ds: Dataset, field: Optional[str]) -> str:
    if field is not None:
        if field not in ds.fields:
            raise ValueError(f"{ds.path}: no field {field!r} (fields: {', '.join(ds.fields)})")
        f = ds.fields[field]
        ok = isinstance(f, Tokens) or (isinstance(f, NDArray) and f.shape == (None,)
                                       and f.dtype.kind in "iu")
        if not ok:
            raise ValueError(f"{ds.path}: field {field!r} is {f!r}, not token documents "
                             "(stoker.tokens or a 1-D variable-length integer ndarray)")
        return field
    found = [n for n, f in ds.fields.items() if isinstance(f, Tokens)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise ValueError(f"{ds.path}: no stoker.tokens field (fields: "
                         f"{', '.join(f'{n}: {f!r}' for n, f in ds.fields.items())}); "
                         "pass field= to read a variable-length integer ndarray as tokens")
    raise ValueError(f"{ds.path}: several token fields ({', '.join(found)}); pass field=")


class TokenDataset:
    """Token documents for language-model training, read in place.

    Examples::

        ds = stoker.TokenDataset("train.bin", dtype="uint16")            # nanoGPT
        ds = stoker.TokenDataset(["a.bin", "b.bin"], dtype="uint16", eos_id=50256)
        ds = stoker.TokenDataset("corpus_text_document")                  # Megatron-LM
        ds = stoker.TokenDataset("data/train")              # a stoker dataset with stoker.tokens

        loader = stoker.Loader(ds, batch_size=64, seq_len=1024, shuffle=True)
        for batch in loader:                # input_ids, labels: int64 [64, 1024]
            ...

    ``len(ds)`` is the number of documents, ``ds[i]`` document i's ids (a read-only NumPy
    view; stoker records are checksum-verified first), ``ds.num_tokens`` the stream's
    length.

    Args:
        path: a flat token file, a Megatron prefix (``PREFIX``, ``PREFIX.bin`` or
            ``PREFIX.idx``), a stoker dataset (directory, ``index.json`` or
            :class:`stoker.Dataset`), or a list of flat files / Megatron prefixes (one
            stream, in order).
        dtype: element type of flat token files (``"uint16"`` for nanoGPT's GPT-2 files,
            ``"uint32"``...). Megatron and stoker datasets record their own; a value given
            for them must match.
        eos_id: flat files only: a document ends after each token equal to it (finding
            them reads every token once, at open). Without it each file is a document.
        field: stoker datasets: the token field (default: the one ``stoker.tokens`` field).
        vocab_size: ids at or above it are an error when read (default: the value in a
            stoker dataset's metadata, else only the output dtype's range is checked).
        prompt_field: stoker datasets of fine-tuning examples: an integer scalar field with
            the number of leading prompt tokens of each document; packed and token-budget
            batches give positions that predict a prompt token no label (``loss_mask``
            0). Default: the field named by the metadata's ``prompt_field``
            (``stoker convert ... --prompt-key`` writes it); ``""`` turns it off.

    Bad data raises :class:`stoker.DataError` naming the file: an empty or truncated
    token file, a ``.idx`` that does not match its ``.bin``, a corrupt record.
    """

    def __init__(self, path: Union[PathLike, Sequence[PathLike], Dataset],
                 dtype: Optional[str] = None, *, eos_id: Optional[int] = None,
                 field: Optional[str] = None, vocab_size: Optional[int] = None,
                 prompt_field: Optional[str] = None):
        self.eos_id = None if eos_id is None else _int_arg("eos_id", eos_id, 0)
        self.field: Optional[str] = None
        self.prompt_field: Optional[str] = None
        self.dataset: Optional[Dataset] = None
        self.metadata: Any = None
        if isinstance(path, Dataset):
            paths = [path.path]
        elif isinstance(path, (str, os.PathLike)):
            paths = [os.fspath(path)]
        elif isinstance(path, (list, tuple)) and path:
            paths = [os.fspath(p) for p in path]
        else:
            raise ValueError(f"path must be a path, a list of paths or a stoker.Dataset, "
                             f"got {path!r}")
        self.paths: List[str] = paths

        if isinstance(path, Dataset) or (len(paths) == 1 and _is_stoker_dir(paths[0])):
            ds = path if isinstance(path, Dataset) else Dataset(paths[0])
            self.kind = "stoker"
            self.dataset = ds
            self.field = _token_field(ds, field)
            self.metadata = ds.metadata
            meta = ds.metadata if isinstance(ds.metadata, dict) else {}
            if prompt_field is None:
                prompt_field = meta.get("prompt_field") or ""
            if prompt_field and prompt_field not in ds.fields:
                raise ValueError(f"{ds.path}: no field {prompt_field!r} for prompt lengths")
            self.prompt_field = prompt_field or None
            if ds.remote is not None:  # the document index reads every record's length
                if ds.remote.bounded:
                    raise ValueError(
                        f"{ds.path}: a TokenDataset keeps every shard of the dataset local, "
                        f"and cache_limit ({ds.remote.cache_limit} bytes) is smaller than "
                        f"the dataset ({ds.remote.total_bytes} bytes); open it with a "
                        "cache_limit that holds it (or none)")
                ds.remote.keep(range(len(ds.shards)))
            self._source = _core.open_record_tokens(ds._core, self.field, prompt_field)
            if vocab_size is None:
                vocab_size = meta.get("vocab_size")
        else:
            if field is not None or prompt_field:
                raise ValueError("field= and prompt_field= apply to stoker datasets only")
            prefixes = [megatron_prefix(p) for p in paths]
            if all(prefixes):
                self.kind = "megatron"
                self.paths = prefixes  # type: ignore[assignment]
                self._source = _core.open_megatron(self.paths)
            elif any(prefixes):
                raise ValueError("a list of token files must be all flat files or all "
                                 "Megatron prefixes")
            else:
                for p in paths:
                    if _is_stoker_dir(p):
                        raise ValueError(f"{p}: a list may hold flat files or Megatron "
                                         "prefixes, not stoker datasets")
                    if not os.path.exists(p):
                        raise FileNotFoundError(f"{p}: no such token file (nor {p}.idx of a "
                                                "Megatron dataset)")
                if dtype is None:
                    raise ValueError(f"{paths[0]}: flat token files record no dtype; pass "
                                     "dtype= (nanoGPT's GPT-2 files are 'uint16')")
                dt = dtype if isinstance(dtype, str) else _np().dtype(dtype).name
                if dt not in _FLAT_DTYPES:
                    raise ValueError(f"dtype must be one of {', '.join(_FLAT_DTYPES)}, "
                                     f"got {dtype!r}")
                self.kind = "flat"
                self._source = _core.open_token_files(paths, dt, self.eos_id)
        if self.kind != "flat":
            if self.eos_id is not None:
                raise ValueError(f"eos_id= applies to flat token files; {self.kind} datasets "
                                 "record their document boundaries")
            if dtype is not None and _np().dtype(dtype).name != self._source.dtype:
                raise ValueError(f"{self.paths[0]}: tokens are {self._source.dtype}, not "
                                 f"{_np().dtype(dtype).name}")
        self.dtype: str = self._source.dtype
        self.vocab_size = None if vocab_size is None else _int_arg("vocab_size", vocab_size, 1)
        self._fingerprint: Optional[List[List[int]]] = None

    # -- contents ------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        """Tokens in the stream (all documents)."""
        return self._source.num_tokens

    @property
    def num_docs(self) -> int:
        return self._source.num_docs

    def __len__(self) -> int:
        return self._source.num_docs

    def __getitem__(self, i: int) -> np.ndarray:
        n = len(self)
        i = operator.index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"document {i} out of range for {n} documents")
        return self._source.doc(i)

    def prompt_lengths(self) -> np.ndarray:
        """Leading prompt tokens of every document (zeros without a prompt field); reads
        every record."""
        np = _np()
        return np.array([self._source.no_loss_prefix(i) for i in range(len(self))], np.int64)

    def doc_lengths(self) -> np.ndarray:
        """Tokens per document (int64), known without reading any token."""
        return self._source.doc_lengths()

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    # -- identity ------------------------------------------------------------

    def fingerprint(self) -> Optional[List[List[int]]]:
        """What identifies the token files (flat or Megatron): per file, its size and a
        checksum of up to 16 blocks of 4 KiB spread over it (the first and the last
        included), so that a loader state refuses another file with the same token count
        (a re-tokenized corpus, a regenerated train.bin). None for a stoker dataset, whose
        id says it."""
        if self.kind == "stoker":
            return None
        if self._fingerprint is None:
            files = []
            for p in self.paths:
                files += [p + ".bin", p + ".idx"] if self.kind == "megatron" else [p]
            self._fingerprint = [_file_fingerprint(f) for f in files]
        return self._fingerprint

    def __reduce__(self):
        # local paths made absolute: the process that reopens them may run in another
        # folder (a service's actor)
        paths = [p if "://" in str(p) else os.path.abspath(p) for p in self.paths]
        args = (paths if len(paths) > 1 else paths[0],
                self.dtype if self.kind == "flat" else None)
        return (_rebuild, (args, {"eos_id": self.eos_id, "field": self.field,
                                  "vocab_size": self.vocab_size,
                                  "prompt_field": self.prompt_field or
                                  ("" if self.kind == "stoker" else None)}))

    def __repr__(self) -> str:
        more = len(self.paths) - 1
        what = self.paths[0] if not more else f"{self.paths[0]} (+{more})"
        return (f"stoker.TokenDataset({what!r}, {self.kind}, {self.dtype}, "
                f"{self.num_docs} documents, {self.num_tokens} tokens)")


def _file_fingerprint(path: str, blocks: int = 16, block: int = 4096) -> List[int]:
    """[size, checksum of up to ``blocks`` blocks of ``block`` bytes spread evenly over
    the file]."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        step = max(block, (size - block) // max(1, blocks - 1)) if size > block else block
        parts = [os.pread(fd, block, off) for off in range(0, max(1, size - block + 1), step)]
        parts.append(os.pread(fd, block, max(0, size - block)))
    finally:
        os.close(fd)
    return [size, int(_core.checksum32(b"".join(parts)))]


def _rebuild(args, kwargs) -> TokenDataset:
    return TokenDataset(*args, **kwargs)


def _int_arg(name: str, value: Any, low: Optional[int] = None, high: int = 2**63 - 1) -> int:
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or (low is not None and number < low) or number > high:
        bound = "" if low is None else (" >= %d" % low)
        raise ValueError(f"{name} must be an int{bound}, got {value!r}")
    return number


def _np() -> Any:
    import numpy

    return numpy


def _dtype_name(value: Any, name: str, allowed: Sequence[str]) -> str:
    try:
        s = str(value).replace("torch.", "") if not isinstance(value, str) else value
        s = _np().dtype(s).name
    except TypeError:
        s = None
    if s not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return s


def _make_producer(dataset: Any, **kwargs: Any) -> Any:
    """Checks the token arguments of ``Loader`` and builds the C++ batch producer
    (``_core.TokenProducer``, a ``_core.BatchProducer``) for `dataset`; the arguments are
    :func:`producer_args`'s."""
    ds, kw = producer_args(dataset, **kwargs)
    return _core.TokenProducer(ds._source, **kw)


def producer_args(dataset: Any, *, batch_size: Optional[int] = None,
                   seq_len: Optional[int] = None, packing: Optional[str] = None,
                   token_dtype: Any = "int64", max_tokens: Optional[int] = None,
                   shuffle: bool = False, seed: int = 0, drop_last: bool = False,
                   stride: Optional[int] = None, pad_id: int = 0, ignore_index: int = -100,
                   pack_fit: str = "best_fit", pack_window: int = 64, overlong: str = "split",
                   max_length: Optional[int] = None, pad_to_multiple_of: Optional[int] = None,
                   attention_mask: bool = True, field: Optional[str] = None,
                   labels: str = "shifted", even_batches: bool = True) -> tuple:
    """Checks the token arguments of ``Loader``: returns the :class:`TokenDataset` and the
    keyword arguments of ``_core.TokenProducer`` (which the tests' plain-Python
    ``_token_reference.Reference`` takes too).

    Modes: ``max_tokens`` given: token-budget batches (``batch_size`` then caps the rows,
    None = no cap); else ``seq_len`` windows (``packing=None``), concatenate-and-chunk
    rows (``"concat"``) or document-aware packed rows (``"document"``) of ``batch_size``
    rows. Every error is a ``ValueError`` naming the argument, or a
    :class:`stoker.DataError` naming the file when the data cannot serve the request
    (a stream shorter than ``seq_len + 1``; a document too long for ``max_tokens``).
    """
    if isinstance(dataset, TokenDataset):
        ds = dataset
        if field is not None and field != ds.field:
            raise ValueError(f"field={field!r} differs from the TokenDataset's {ds.field!r}")
    elif isinstance(dataset, (Dataset, str, os.PathLike, list, tuple)):
        ds = TokenDataset(dataset, field=field)
    else:
        raise ValueError(f"token batches need a stoker.TokenDataset, a stoker.Dataset with a "
                         f"tokens field or a path, got {type(dataset).__name__}")
    if packing not in PACKING_MODES:
        raise ValueError(f"packing must be None, 'concat' or 'document', got {packing!r}")
    token_dtype = _dtype_name(token_dtype, "token_dtype", TOKEN_DTYPES)
    seed = _int_arg("seed", seed, -2**63, 2**64 - 1) % 2**64
    int32 = token_dtype == "int32"
    lo, hi = (-2**31, 2**31 - 1) if int32 else (-2**63, 2**63 - 1)
    pad_id = _int_arg("pad_id", pad_id, lo, hi)
    ignore_index = _int_arg("ignore_index", ignore_index, lo, hi)
    if pack_fit not in ("best_fit", "first_fit"):
        raise ValueError(f"pack_fit must be 'best_fit' or 'first_fit', got {pack_fit!r}")
    if overlong not in ("split", "truncate", "error"):
        raise ValueError(f"overlong must be 'split', 'truncate' or 'error', got {overlong!r}")
    pack_window = _int_arg("pack_window", pack_window, 1, 1 << 20)
    if labels not in LABEL_CONVENTIONS:
        raise ValueError(f"labels must be 'shifted' (labels[i] is the next token, nanoGPT's "
                         f"x, y) or 'unshifted' (labels = input_ids, the model shifts: "
                         f"HuggingFace's), got {labels!r}")
    common = dict(shuffle=bool(shuffle), seed=seed, drop_last=bool(drop_last),
                  token_dtype=token_dtype, pad_id=pad_id, ignore_index=ignore_index,
                  vocab_size=ds.vocab_size or 0, unshifted=labels == "unshifted",
                  even_batches=bool(even_batches))

    if max_tokens is not None:
        max_tokens = _int_arg("max_tokens", max_tokens, 1, 2**31 - 1)
        if seq_len is not None:
            raise ValueError("seq_len does not apply with max_tokens (token-budget batches "
                             "hold whole documents); use max_length= to cut long ones")
        if packing is not None:
            raise ValueError("packing does not apply with max_tokens; for packed rows use "
                             "seq_len= and batch_size= (max_tokens = batch_size * seq_len)")
        if stride is not None:
            raise ValueError("stride applies to seq_len windows (packing=None), not max_tokens")
        cap = 0 if batch_size is None else _int_arg("batch_size", batch_size, 1)
        max_length = 0 if max_length is None else _int_arg("max_length", max_length, 1)
        multiple = 1 if pad_to_multiple_of is None else \
            _int_arg("pad_to_multiple_of", pad_to_multiple_of, 1, 2**31 - 1)
        return ds, dict(mode="budget", batch_size=cap, max_tokens=max_tokens,
                        max_length=max_length, pad_to_multiple_of=multiple,
                        attention_mask=bool(attention_mask), **common)

    if seq_len is None:
        raise ValueError("token batches need seq_len= (rows of seq_len tokens) or max_tokens= "
                         "(token-budget batches)")
    seq_len = _int_arg("seq_len", seq_len, 1, 2**31 - 1)
    batch_size = _int_arg("batch_size", 1 if batch_size is None else batch_size, 1)
    if batch_size * seq_len >= 2**31:
        raise ValueError(f"batch_size * seq_len = {batch_size * seq_len} must stay below 2**31 "
                         "(cu_seqlens are int32, as FlashAttention takes them)")
    for name, value in (("max_length", max_length), ("pad_to_multiple_of", pad_to_multiple_of)):
        if value is not None:
            raise ValueError(f"{name} applies to max_tokens batches; rows of seq_len are "
                             "already of one length")
    if packing is None:
        stride = seq_len if stride is None else _int_arg("stride", stride, 1)
        mode = "windows"
    else:
        if stride is not None:
            raise ValueError("stride applies to windows (packing=None)")
        mode = packing
    return ds, dict(mode=mode, seq_len=seq_len, stride=stride or 0, batch_size=batch_size,
                    pack_fit=pack_fit, pack_window=pack_window, overlong=overlong, **common)


# the name tests/_token_reference.py and tests/test_tokens.py build reference producers by
_producer_args = producer_args
