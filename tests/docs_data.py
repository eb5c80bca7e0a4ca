"""The small data a documentation block can ask for (see test_docs.py).

A block declares it in the comment before it, ``<!-- stoker-docs: needs KIND:PATH ... -->``;
the test writes that data at PATH, relative to the folder the block runs in. Each kind is
what a reader of the docs would have at hand:

==================  ===========================================================================
``records:PATH``    a stoker dataset of 40 samples, ``x`` uint8[3,4,4] and ``label`` int64
                    (= i), in shards of 1 KB
``images:PATH``     a stoker dataset of 48 JPEG photos-like images (sizes 40-72 px) in an
                    ``image`` field, and ``label`` int64 (i % 4)
``tokens-bin:PATH`` a nanoGPT token file: 100,000 uint16 ids below 50257, documents ended by
                    50256 (GPT-2's end of text)
``tokens:PATH``     a stoker dataset of 200 token documents, ``tokens`` uint16
``megatron:PREFIX`` PREFIX.bin + PREFIX.idx: 200 uint16 documents (Megatron-LM's format)
``tokenizer:PATH``  a byte-level BPE ``tokenizer.json`` (HF tokenizers, 1,000 ids) that knows
                    ``<|endoftext|>``
``jsonl:PATH``      JSON lines ``{"text": ...}`` of real text; a PATH ending in ``/`` is a
                    folder of two such files
``sft-jsonl:PATH``  JSON lines ``{"prompt": ..., "response": ...}``
``parquet:PATH``    Parquet with a ``content`` column of text; ``/``: a folder of two files
``hf:PATH``         a ``datasets.DatasetDict`` (split ``train``, column ``text``) saved with
                    ``save_to_disk``
``parts:PATH``      a folder of three part datasets, ``part-000000`` ..., with the schema of
                    ``records`` (what Ray or Spark tasks write with ``write_part``)
==================  ===========================================================================

Adding a kind is adding a function here named ``make_<kind>`` (dashes as underscores).
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import stoker

EOT = 50256


def _texts():
    from test_convert_text import real_texts

    return [t for t in real_texts() if t.strip()]


def make_records(path: Path, cache: Path) -> None:
    from conftest import write_dataset

    write_dataset(path, 40, shard_size="1KB")


def make_images(path: Path, cache: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(path, fields, shard_size="64KB") as w:
        for i in range(48):
            h, w_ = int(rng.integers(40, 73)), int(rng.integers(40, 73))
            # smooth gradients plus noise: JPEG-like content, not white noise
            y, x = np.mgrid[0:h, 0:w_]
            img = np.stack([(x * 255 // w_), (y * 255 // h), ((x + y) * 127 // (h + w_))], -1)
            img = np.clip(img + rng.integers(-20, 21, img.shape), 0, 255).astype(np.uint8)
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, "JPEG", quality=90)
            w.write({"image": buf.getvalue(), "label": i % 4})


def _token_docs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, EOT, int(rng.integers(50, 400)), dtype=np.int64).astype(np.uint16)
            for _ in range(n)]


def make_tokens_bin(path: Path, cache: Path) -> None:
    stream = []
    total = 0
    for doc in _token_docs(10_000):
        stream += [doc, np.array([EOT], np.uint16)]
        total += len(doc) + 1
        if total >= 100_000:
            break
    np.concatenate(stream)[:100_000].tofile(path)


def make_tokens(path: Path, cache: Path) -> None:
    with stoker.ShardWriter(path, {"tokens": stoker.tokens("uint16")}) as w:
        for doc in _token_docs(200, seed=1):
            w.write({"tokens": doc})


def make_megatron(path: Path, cache: Path) -> None:
    from test_tokens import write_megatron

    write_megatron(str(path), _token_docs(200, seed=2))


def make_tokenizer(path: Path, cache: Path) -> None:
    cached = cache / "tokenizer.json"
    if not cached.exists():  # training takes a second or two: once per session
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator([t[:2000] for t in _texts()], trainers.BpeTrainer(
            vocab_size=1000, special_tokens=["<|endoftext|>"], show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.save(str(cached))
    shutil.copy(cached, path)


def _split(path: Path, write, suffix: str) -> None:
    texts = _texts()
    if path.is_dir():  # asked for as PATH/
        half = len(texts) // 2
        write(path / f"part-0{suffix}", texts[:half])
        write(path / f"part-1{suffix}", texts[half:])
    else:
        write(path, texts)


def _write_jsonl(path: Path, texts) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")


def make_jsonl(path: Path, cache: Path) -> None:
    _split(path, _write_jsonl, ".jsonl")


def make_sft_jsonl(path: Path, cache: Path) -> None:
    texts = [t[:1500] for t in _texts()][:120]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(0, len(texts) - 1, 2):  # "prompt" and "response" from real text
            f.write(json.dumps({"prompt": f"### Question\n{texts[i][:300]}\n### Answer\n",
                                "response": texts[i + 1][:600]}) + "\n")


def make_parquet(path: Path, cache: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    _split(path, lambda p, texts: pq.write_table(pa.table({"content": texts}), p), ".parquet")


def make_hf(path: Path, cache: Path) -> None:
    import datasets

    texts = _texts()
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts[:-5]}),
                          "test": datasets.Dataset.from_dict({"text": texts[-5:]})}
                         ).save_to_disk(str(path))


def make_parts(path: Path, cache: Path) -> None:
    from stoker.convert import write_part

    fields = {"x": stoker.ndarray("uint8", (3, 4, 4)), "label": stoker.scalar("int64")}
    for task in range(3):
        write_part(({"x": np.full((3, 4, 4), i % 256, np.uint8), "label": i}
                    for i in range(10 * task, 10 * task + 10)), path, task, fields)


def prepare(kind: str, spec: str, root: Path, cache: Path) -> None:
    """Writes data of `kind` at `spec` under `root` (see the module doc)."""
    make = globals().get("make_" + kind.replace("-", "_"))
    if make is None:
        kinds = sorted(k[5:].replace("_", "-") for k in globals() if k.startswith("make_"))
        raise ValueError(f"no data kind {kind!r}; the kinds are {', '.join(kinds)} "
                         "(tests/docs_data.py)")
    where = root / spec
    os.makedirs(where if spec.endswith("/") else where.parent, exist_ok=True)
    make(where, cache)
