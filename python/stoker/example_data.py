"""Small example data for the documentation's examples: ``stoker example-data KIND PATH``.

Every example in the docs that reads data it does not make itself says so in its first
line, with the command that writes that data (tests/test_docs.py runs the command, then
the example, in an empty folder, as a reader would)::

    stoker example-data images data/train        # 48 small JPEGs in a stoker dataset
    stoker example-data tokens-bin train.bin     # a nanoGPT token file

Several ``KIND PATH`` pairs may follow one another. ``stoker example-data --help`` lists
the kinds. Each writes in a second or two, at most a few hundred kilobytes; the same
command writes the same data (the same samples; a stoker dataset's random id differs).
From Python: ``stoker.example_data.write("images", "data/train")``.
"""

from __future__ import annotations

import json
import os
import struct
import sysconfig
from typing import Callable, Dict, List, Sequence, Tuple

__all__ = ["KINDS", "write"]

EOT = 50256  # GPT-2's end of text: the document separator of the token kinds


def _records(path: str) -> None:
    import numpy as np

    from . import ShardWriter, ndarray, scalar

    fields = {"x": ndarray("uint8", (3, 4, 4)), "label": scalar("int64")}
    with ShardWriter(path, fields, shard_size="1KB", overwrite=True) as w:
        for i in range(40):
            w.write({"x": np.full((3, 4, 4), i % 256, np.uint8), "label": i})


def _jpeg(img) -> bytes:
    """JPEG bytes of ``uint8[h, w, 3]`` pixels, by libjpeg-turbo's encoder inside stoker's
    native core (no Pillow)."""
    from . import _core

    if not _core.build_info()["images"]:
        raise RuntimeError("writing JPEGs needs image support, and this build of stoker has "
                           "none (built with -DSTOKER_WITH_IMAGES=OFF): install the stoker "
                           "wheel, or build from source with libjpeg-turbo and libpng")
    return _core.encode_jpeg(img, 90)


def photo_like(rng, h: int, w: int):
    """An RGB ``uint8[h, w, 3]`` picture with smooth gradients and some noise: what a JPEG
    holds, unlike white noise."""
    import numpy as np

    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (h + w)], -1)
    return np.clip(img + rng.integers(-20, 21, img.shape), 0, 255).astype(np.uint8)


def _images(path: str) -> None:
    import numpy as np

    from . import ShardWriter, image, scalar

    rng = np.random.default_rng(0)
    fields = {"image": image(), "label": scalar("int64")}
    with ShardWriter(path, fields, shard_size="64KB", overwrite=True) as w:
        for i in range(48):
            h, w_ = int(rng.integers(40, 73)), int(rng.integers(40, 73))
            w.write({"image": _jpeg(photo_like(rng, h, w_)), "label": i % 4})


def _jpeg_folder(path: str) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    for name in ("cat", "dog", "fox"):
        os.makedirs(os.path.join(path, name), exist_ok=True)
        for i in range(8):
            img = photo_like(rng, int(rng.integers(48, 97)), int(rng.integers(48, 97)))
            with open(os.path.join(path, name, f"{name}-{i}.jpg"), "wb") as f:
                f.write(_jpeg(img))


def _photos(path: str) -> None:
    """The quickstart's folder: three classes, each with its dominant colour (a small
    model learns them in a few epochs), split into train and val."""
    import numpy as np

    rng = np.random.default_rng(0)
    for split, count in (("train", 16), ("val", 4)):
        for label, name in enumerate(["red", "green", "blue"]):
            os.makedirs(os.path.join(path, split, name), exist_ok=True)
            for i in range(count):
                pixels = rng.integers(0, 90, (int(rng.integers(64, 129)), 96, 3))
                pixels[..., label] += 150
                with open(os.path.join(path, split, name, f"{i:03d}.jpg"), "wb") as f:
                    f.write(_jpeg(pixels.astype(np.uint8)))


def _token_docs(n: int, seed: int, vocab: int) -> list:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(50, 400))).astype(np.uint16)
            for _ in range(n)]


def _tokens_bin(path: str) -> None:
    import numpy as np

    stream: List = []
    total = 0
    for doc in _token_docs(10_000, 0, EOT):
        stream += [doc, np.array([EOT], np.uint16)]
        total += len(doc) + 1
        if total >= 100_000:
            break
    np.concatenate(stream)[:100_000].tofile(path)


def _tokens(path: str) -> None:
    from . import ShardWriter, tokens

    with ShardWriter(path, {"tokens": tokens("uint16")}, overwrite=True) as w:
        for doc in _token_docs(200, 1, 256):
            w.write({"tokens": doc})


def _megatron(prefix: str) -> None:
    import numpy as np

    docs = _token_docs(200, 2, EOT)
    lengths = [len(d) for d in docs]
    with open(f"{prefix}.bin", "wb") as f:
        for d in docs:
            f.write(d.tobytes())
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * 2
    with open(f"{prefix}.idx", "wb") as f:  # Megatron-LM's MMapIndexedDataset, version 1
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(docs), len(docs) + 1))
        f.write(np.asarray(lengths, np.int32).tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes())


def texts() -> List[str]:
    """Real text: whole modules of Python's standard library (prose in docstrings, code,
    Unicode), and a few odd ones (empty, non-ASCII, one long word)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    out = []
    for name in ("json/decoder.py", "json/encoder.py", "textwrap.py", "string.py",
                 "heapq.py", "bisect.py", "colorsys.py", "keyword.py", "calendar.py"):
        with open(os.path.join(stdlib, name), encoding="utf-8") as f:
            text = f.read()
        out += [p.strip() for p in text.split("\n\n\n") if p.strip()]
    return out + ["héllo wörld — ünïcödé ✓", "x" * 5000]


def _tokenizer(path: str) -> None:
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise RuntimeError("training a tokenizer needs HF tokenizers: pip install tokenizers "
                           "(or stoker's [text] extra)") from None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([t[:2000] for t in texts()], trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(path)


def _split(path: str, write: Callable[[str, List[str]], None], suffix: str) -> None:
    all_texts = texts()
    if path.endswith("/"):  # a folder of two files
        half = len(all_texts) // 2
        write(os.path.join(path, f"part-0{suffix}"), all_texts[:half])
        write(os.path.join(path, f"part-1{suffix}"), all_texts[half:])
    else:
        write(path, all_texts)


def _write_jsonl(path: str, lines: Sequence[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for t in lines:
            f.write(json.dumps({"text": t}) + "\n")


def _jsonl(path: str) -> None:
    _split(path, _write_jsonl, ".jsonl")


def _sft_jsonl(path: str) -> None:
    t = [x[:1500] for x in texts()][:120]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(0, len(t) - 1, 2):  # a "prompt" and a "response" from real text
            f.write(json.dumps({"prompt": f"### Question\n{t[i][:300]}\n### Answer\n",
                                "response": t[i + 1][:600]}) + "\n")


def _parquet(path: str) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise RuntimeError("writing Parquet needs pyarrow: pip install pyarrow (or stoker's "
                           "[text] extra)") from None
    _split(path, lambda p, t: pq.write_table(pa.table({"content": t}), p), ".parquet")


def _hf(path: str) -> None:
    try:
        import datasets
    except ImportError:
        raise RuntimeError("writing a HuggingFace dataset needs datasets: pip install datasets "
                           "(or stoker's [text] extra)") from None
    t = texts()
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": t[:-5]}),
                          "test": datasets.Dataset.from_dict({"text": t[-5:]})}
                         ).save_to_disk(path)


def _parts(path: str) -> None:
    import numpy as np

    from . import ndarray, scalar
    from .convert import write_part

    fields = {"x": ndarray("uint8", (3, 4, 4)), "label": scalar("int64")}
    for task in range(3):
        write_part(({"x": np.full((3, 4, 4), i % 256, np.uint8), "label": i}
                    for i in range(10 * task, 10 * task + 10)), path, task, fields)


# kind -> (what it writes, the function)
KINDS: Dict[str, Tuple[str, Callable[[str], None]]] = {
    "records": ("a stoker dataset of 40 samples: x uint8[3,4,4] filled with i, label "
                "int64 = i; shards of 1 KB", _records),
    "images": ("a stoker dataset of 48 small JPEGs (40-72 px) in an `image` field, and "
               "`label` int64 (i % 4)", _images),
    "jpeg-folder": ("a folder of 24 JPEGs in torchvision's ImageFolder layout: "
                    "PATH/{cat,dog,fox}/*.jpg", _jpeg_folder),
    "photos": ("the quickstart's JPEGs: PATH/train (16 a class) and PATH/val (4 a class), "
               "each in torchvision's ImageFolder layout, classes red, green and blue (each "
               "image's dominant colour), 64-128 x 96 px", _photos),
    "tokens-bin": ("a nanoGPT token file: 100,000 uint16 ids below 50257, documents ended "
                   "by 50256 (GPT-2's end of text)", _tokens_bin),
    "tokens": ("a stoker dataset of 200 token documents, field `tokens` "
               "(stoker.tokens('uint16'), ids below 256)", _tokens),
    "megatron": ("PATH.bin + PATH.idx: 200 uint16 documents in Megatron-LM's indexed "
                 "format", _megatron),
    "tokenizer": ("a byte-level BPE tokenizer.json (HF tokenizers, 1,000 ids) that knows "
                  "<|endoftext|>; needs tokenizers", _tokenizer),
    "jsonl": ("JSON lines {\"text\": ...} of real text (Python's own modules); a PATH "
              "ending in / is a folder of two files", _jsonl),
    "sft-jsonl": ("JSON lines {\"prompt\": ..., \"response\": ...}", _sft_jsonl),
    "parquet": ("Parquet with a `content` column of text; a PATH ending in / is a folder "
                "of two files; needs pyarrow", _parquet),
    "hf": ("a datasets.DatasetDict (splits train and test, column `text`) saved with "
           "save_to_disk; needs datasets", _hf),
    "parts": ("a folder of three part datasets, part-000000 ..., with the fields of "
              "`records` (what Ray or Spark tasks write)", _parts),
}


def write(kind: str, path: str) -> None:
    """Writes the example data `kind` at `path` (see :data:`KINDS`), making the folders
    it needs, and replacing what an earlier call wrote there."""
    if kind not in KINDS:
        raise ValueError(f"no example data {kind!r}; the kinds are {', '.join(KINDS)}")
    path = os.fspath(path)
    parent = path if path.endswith("/") else os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    KINDS[kind][1](path)


def add_arguments(p) -> None:
    p.add_argument("pairs", nargs="+", metavar="KIND PATH",
                   help="what to write and where; several pairs may follow one another")


def run(args) -> int:
    import sys

    pairs = args.pairs
    if len(pairs) % 2:
        raise ValueError(f"arguments KIND PATH: {pairs[-1]!r} has no PATH (give pairs, "
                         "e.g. images data/train)")
    for kind in pairs[::2]:
        if kind not in KINDS:
            raise ValueError(f"argument KIND: no example data {kind!r}; the kinds are "
                             f"{', '.join(KINDS)}")
    for kind, path in zip(pairs[::2], pairs[1::2]):
        write(kind, path)
        print(f"wrote {kind} to {path}", file=sys.stderr)
    return 0


def kinds_help() -> str:
    """The kinds, for ``stoker example-data --help``."""
    width = max(map(len, KINDS))
    return "kinds:\n" + "\n".join(f"  {k:<{width}}  {what}"
                                  for k, (what, _) in KINDS.items())
