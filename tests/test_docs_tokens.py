"""The recipes of docs/tokens.md run as written, through ``stoker.Loader``."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import stoker
from test_convert_text import real_texts

DOC = Path(__file__).resolve().parent.parent / "docs" / "tokens.md"


def recipe(title):
    text = DOC.read_text()
    section = text.split(f"## Recipe: {title}", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, title
    return "\n".join(blocks)


def run(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(code, str(DOC), "exec"), scope)
    return scope


def test_nanogpt_recipe(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    rng.integers(0, 50257, 100_000, dtype=np.int64).astype(np.uint16).tofile(
        tmp_path / "train.bin")
    scope = run(recipe("nanoGPT-style pretraining"), tmp_path, monkeypatch)
    assert scope["step"] == 2
    # the resumed loader continues where the checkpoint was taken
    first = stoker.Loader
    ds = stoker.TokenDataset(tmp_path / "train.bin", dtype="uint16")
    fresh = iter(first(ds, batch_size=4, seq_len=64, shuffle=True, seed=1337))
    for _ in range(3):
        next(fresh)
    assert np.array_equal(scope["batch"]["input_ids"].numpy(), next(fresh)["input_ids"].numpy())


def test_packed_sft_recipe(tmp_path, monkeypatch):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = [t[:1500] for t in real_texts() if t][:120]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    with open(tmp_path / "sft.jsonl", "w") as f:
        for i in range(0, len(texts) - 1, 2):  # "prompt" and "response" from real text
            f.write(json.dumps({"prompt": f"### Question\n{texts[i][:300]}\n### Answer\n",
                                "response": texts[i + 1][:600]}) + "\n")
    assert tokenizers is not None
    scope = run(recipe("packed supervised fine-tuning"), tmp_path, monkeypatch)
    assert scope["loss"].item() > 0 and np.isfinite(scope["loss"].item())
    assert 0 < scope["loader"].stats()["pad_fraction"] < 0.25
    # the converter recorded the prompt lengths, and the dataset found them
    ds = scope["ds"]
    assert ds.prompt_field == "prompt_tokens" and ds.prompt_lengths().min() > 0
