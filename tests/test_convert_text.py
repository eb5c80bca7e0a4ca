"""stoker convert jsonl|parquet|hf|megatron|nanogpt, on real text that ships with the
machine (the licenses in /usr/share/common-licenses where present, and the Python
standard library's sources), tokenized by a byte-level BPE trained on it with the
`tokenizers` library."""

import glob
import json
import os
import sysconfig

import numpy as np
import pytest
import stoker
from stoker import cli
from stoker import token_dataset as td
from stoker.convert import convert_text, convert_tokens
from test_tokens import write_megatron

tokenizers = pytest.importorskip("tokenizers")


def real_texts():
    """Paragraphs of the license texts and whole standard-library modules: prose, code,
    Unicode, and empty strings."""
    texts = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                texts += [p.strip() for p in f.read().split("\n\n") if p.strip()][:40]
    stdlib = sysconfig.get_paths()["stdlib"]
    for name in ("json/decoder.py", "json/encoder.py", "textwrap.py", "string.py",
                 "heapq.py", "bisect.py", "colorsys.py", "keyword.py", "calendar.py"):
        with open(os.path.join(stdlib, name), encoding="utf-8") as f:
            texts.append(f.read())
    texts += ["", "héllo wörld — ünïcödé ✓", "x" * 5000]
    return texts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    texts = real_texts()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok_path = str(root / "tokenizer.json")
    tok.save(tok_path)
    jsonl = root / "corpus.jsonl"
    with open(jsonl, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": i, "text": t}) + "\n")
    return {"root": root, "texts": texts, "tok": tok, "tok_path": tok_path, "jsonl": str(jsonl)}


def expected_docs(corpus, eos=True):
    tok = corpus["tok"]
    eos_id = tok.token_to_id("<|endoftext|>")
    out = []
    for t in corpus["texts"]:
        ids = tok.encode(t, add_special_tokens=False).ids + ([eos_id] if eos else [])
        if ids:
            out.append(ids)
    return out


def docs_of(path):
    return [d.tolist() for d in stoker.TokenDataset(path)]


def test_jsonl_with_a_trained_bpe(corpus, tmp_path):
    out = tmp_path / "ds"
    s = convert_text(corpus["jsonl"], out, corpus["tok_path"], eos="<|endoftext|>", workers=1)
    docs = docs_of(out)
    assert docs == expected_docs(corpus)
    ds = stoker.TokenDataset(out)
    assert ds.dtype == "uint16" and ds.vocab_size == corpus["tok"].get_vocab_size()
    meta = stoker.Dataset(out).metadata
    assert meta["documents"] == s["documents"] == len(docs) and meta["eos_id"] == docs[0][-1]
    assert meta["tokens"] == sum(map(len, docs)) and meta["format"] == "jsonl"
    # the byte-level BPE is lossless: documents decode to the texts
    for d, t in zip(docs, corpus["texts"], strict=True):
        assert corpus["tok"].decode(d[:-1]) == t
    assert stoker.Dataset(out).verify()["ok"]
    # the empty text made a document of just the EOS; without eos it is left out, counted
    s2 = convert_text(corpus["jsonl"], tmp_path / "noeos", corpus["tok_path"], workers=1)
    assert s2["empty_documents"] == 1 and docs_of(tmp_path / "noeos") == \
        expected_docs(corpus, eos=False)


def test_prompt_key_for_fine_tuning(corpus, tmp_path):
    src = tmp_path / "sft.jsonl"
    texts = [t for t in corpus["texts"] if t][:30]
    with open(src, "w") as f:
        for q, a in zip(texts[::2], texts[1::2]):
            f.write(json.dumps({"question": q[:200], "answer": a[:400]}) + "\n")
    convert_text(src, tmp_path / "out", corpus["tok_path"], text_key="answer",
                 prompt_key="question", eos="<|endoftext|>", workers=1)
    ds = stoker.TokenDataset(tmp_path / "out")
    assert ds.prompt_field == "prompt_tokens"
    tok = corpus["tok"]
    eos = tok.token_to_id("<|endoftext|>")
    for i, (q, a) in enumerate(zip(texts[::2], texts[1::2])):
        pq = tok.encode(q[:200], add_special_tokens=False).ids
        pa = tok.encode(a[:400], add_special_tokens=False).ids
        assert ds[i].tolist() == pq + pa + [eos]
        assert ds.prompt_lengths()[i] == len(pq)
    with pytest.raises(ValueError, match=r"sft\.jsonl:1: no 'prompt' field"):
        convert_text(src, tmp_path / "x", corpus["tok_path"], text_key="answer",
                     prompt_key="prompt", workers=1)


def test_parallel_output_is_the_same(corpus, tmp_path):
    one = tmp_path / "one"
    two = tmp_path / "two"
    convert_text(corpus["jsonl"], one, corpus["tok_path"], eos="<|endoftext|>", workers=1)
    convert_text(corpus["jsonl"], two, corpus["tok_path"], eos="<|endoftext|>", workers=2,
                 shard_size="64KB")
    assert docs_of(one) == docs_of(two)
    assert len(stoker.Dataset(two).shards) > 1


def test_callable_tokenizer_on_threads(corpus, tmp_path):
    """Any callable text -> ids; one that cannot be loaded by name in a worker process (a
    local function) runs on threads."""
    def utf8(text):  # a local function: not picklable
        return list(text.encode("utf-8"))

    convert_text(corpus["jsonl"], tmp_path / "b", utf8, workers=2, dtype="uint16")
    docs = docs_of(tmp_path / "b")
    want = [list(t.encode()) for t in corpus["texts"] if t]
    assert docs == want
    assert stoker.Dataset(tmp_path / "b").metadata["vocab_size"] is None


def test_parquet(corpus, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts = corpus["texts"]
    for i in range(3):  # a folder of files, read in sorted order
        part = texts[i::3]
        pq.write_table(pa.table({"body": part, "n": list(range(len(part)))}),
                       tmp_path / f"part-{i}.parquet", row_group_size=7)
    os.makedirs(tmp_path / "pq")
    for i in range(3):
        os.replace(tmp_path / f"part-{i}.parquet", tmp_path / "pq" / f"part-{i}.parquet")
    convert_text(tmp_path / "pq", tmp_path / "out", corpus["tok_path"], text_key="body",
                 eos="<|endoftext|>", workers=1)
    tok = corpus["tok"]
    eos = tok.token_to_id("<|endoftext|>")
    want = [tok.encode(t, add_special_tokens=False).ids + [eos]
            for i in range(3) for t in texts[i::3]]
    assert docs_of(tmp_path / "out") == want


def test_hf_dataset_on_disk(corpus, tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": corpus["texts"]})
    ds.save_to_disk(str(tmp_path / "hf"))
    assert cli.main(["convert", "hf", str(tmp_path / "hf"), str(tmp_path / "out"),
                     "--tokenizer", corpus["tok_path"], "--eos", "<|endoftext|>",
                     "--workers", "1"]) == 0
    assert docs_of(tmp_path / "out") == expected_docs(corpus)
    dd = datasets.DatasetDict({"train": ds, "test": ds.select(range(3))})
    dd.save_to_disk(str(tmp_path / "hfdd"))
    with pytest.raises(ValueError, match="holds splits train, test; choose one with --split"):
        convert_text(tmp_path / "hfdd", tmp_path / "x", corpus["tok_path"], format="hf")
    convert_text(tmp_path / "hfdd", tmp_path / "t", corpus["tok_path"], format="hf",
                 split="test", workers=1)
    assert len(docs_of(tmp_path / "t")) == 3


def test_sentencepiece_and_tiktoken(corpus, tmp_path):
    spm = pytest.importorskip("sentencepiece")
    tiktoken = pytest.importorskip("tiktoken")
    text_file = tmp_path / "corpus.txt"
    text_file.write_text("\n".join(t.replace("\n", " ") for t in corpus["texts"] if t))
    spm.SentencePieceTrainer.train(input=str(text_file), model_prefix=str(tmp_path / "sp"),
                                   vocab_size=400, model_type="bpe", minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    convert_text(corpus["jsonl"], tmp_path / "sp_out", str(tmp_path / "sp.model"),
                 eos="</s>", workers=1)
    want = [sp.encode(t) + [sp.piece_to_id("</s>")] for t in corpus["texts"]]
    assert docs_of(tmp_path / "sp_out") == want
    # a tiktoken Encoding built here (tiktoken's named encodings download their ranks)
    enc = tiktoken.Encoding(name="bytes", pat_str=r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",  # noqa: E501
                            mergeable_ranks={bytes([i]): i for i in range(256)},
                            special_tokens={"<|endoftext|>": 256})
    convert_text(corpus["jsonl"], tmp_path / "tk", enc, eos="<|endoftext|>", workers=1)
    docs = docs_of(tmp_path / "tk")
    assert docs[0] == list(corpus["texts"][0].encode()) + [256]


@pytest.mark.parametrize("lines, match", [
    (['{"text": "ok"}', '{"text": "a", '], r"bad\.jsonl:2: invalid JSON"),
    (['{"text": "ok"}', '{"body": "a"}'], r"bad\.jsonl:2: no 'text' field"),
    (['{"text": null}'], r"bad\.jsonl:1: field 'text' is null, not a string"),
    (['{"text": 3}'], r"bad\.jsonl:1: field 'text' is int"),
    (['["text"]'], r"bad\.jsonl:1: no 'text' field"),
    ([], r"bad\.jsonl: no documents"),
    (["", "   "], r"bad\.jsonl: no documents"),
])
def test_bad_jsonl(tmp_path, lines, match):
    (tmp_path / "bad.jsonl").write_text("\n".join(lines))
    with pytest.raises(ValueError, match=match):
        convert_text(tmp_path / "bad.jsonl", tmp_path / "out", lambda s: [1], workers=1)
    assert not os.path.exists(tmp_path / "out" / "index.json")


def test_bad_tokens_and_tokenizers(corpus, tmp_path):
    src = tmp_path / "s.jsonl"
    src.write_text('{"text": "a"}\n{"text": "b"}\n')
    with pytest.raises(ValueError, match=r"s\.jsonl:2: token id 70000 does not fit uint16"):
        convert_text(src, tmp_path / "o", lambda s: [70000 if s == "b" else 1], dtype="uint16",
                     workers=1)

    def fails(s):
        raise RuntimeError("boom")

    with pytest.raises(ValueError, match=r"s\.jsonl:1 .. .*s\.jsonl:2: the tokenizer failed: "
                                         r"RuntimeError: boom"):
        convert_text(src, tmp_path / "o", fails, workers=1)
    with pytest.raises(ValueError, match="eos '<nope>': the tokenizer has no such token"):
        convert_text(src, tmp_path / "o", corpus["tok_path"], eos="<nope>")
    with pytest.raises(ValueError, match="not a file"):
        convert_text(src, tmp_path / "o", "no-such-tokenizer")
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(ValueError, match="not a HuggingFace tokenizer.json"):
        convert_text(src, tmp_path / "o", str(tmp_path / "junk.json"))
    with pytest.raises(ValueError, match="cannot import"):
        convert_text(src, tmp_path / "o", "os.path:no_such_function")
    (tmp_path / "x.parquet").write_bytes(b"not parquet")
    pytest.importorskip("pyarrow")
    with pytest.raises(ValueError, match=r"x\.parquet: not a Parquet file"):
        convert_text(tmp_path / "x.parquet", tmp_path / "o", lambda s: [1])
    with pytest.raises(FileNotFoundError, match="nothing.jsonl"):
        convert_text(tmp_path / "nothing.jsonl", tmp_path / "o", lambda s: [1])


def test_cli_jsonl_and_errors(corpus, tmp_path, capsys):
    out = tmp_path / "cli"
    assert cli.main(["convert", "jsonl", corpus["jsonl"], str(out), "--tokenizer",
                     corpus["tok_path"], "--eos", "<|endoftext|>", "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert "documents" in err and f"to {out}" in err
    assert docs_of(out) == expected_docs(corpus)
    (tmp_path / "bad.jsonl").write_text('{"text": 1}\n')
    assert cli.main(["convert", "jsonl", str(tmp_path / "bad.jsonl"), str(tmp_path / "o"),
                     "--tokenizer", corpus["tok_path"]]) == 1  # bad data
    assert "bad.jsonl:1: field 'text' is int" in capsys.readouterr().err


def test_convert_megatron_and_nanogpt(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50000, int(n), dtype=np.int64).astype(np.uint16)
            for n in rng.integers(0, 300, 200)]
    prefix = write_megatron(str(tmp_path / "m"), docs)
    assert cli.main(["convert", "megatron", prefix, str(tmp_path / "mout")]) == 0
    out = stoker.TokenDataset(tmp_path / "mout")
    assert [d.tolist() for d in out] == [d.tolist() for d in docs if len(d)]
    assert stoker.Dataset(tmp_path / "mout").metadata["empty_documents"] == sum(
        len(d) == 0 for d in docs)
    # nanoGPT: without eos, the stream is stored in chunks; windows are unchanged
    stream = np.concatenate(docs)
    stream[[10, 500]] = 65000  # an end-of-text id, found nowhere else
    stream.tofile(tmp_path / "train.bin")
    assert cli.main(["convert", "nanogpt", str(tmp_path / "train.bin"), str(tmp_path / "nout"),
                     "--dtype", "uint16", "--chunk-tokens", "1000"]) == 0
    conv = stoker.TokenDataset(tmp_path / "nout")
    assert conv.num_tokens == len(stream) and set(conv.doc_lengths()[:-1]) == {1000}
    flat = stoker.TokenDataset(str(tmp_path / "train.bin"), dtype="uint16")
    a = td._make_producer(flat, seq_len=256, batch_size=4, shuffle=True, seed=1)
    b = td._make_producer(conv, seq_len=256, batch_size=4, shuffle=True, seed=1)
    pa, pb = a.plan_epoch(0), b.plan_epoch(0)
    assert pa.num_batches == pb.num_batches
    for k in range(pa.num_batches):
        np.testing.assert_array_equal(a.batch(pa, k)["input_ids"], b.batch(pb, k)["input_ids"])
    # with --eos-id, one document per EOS
    assert cli.main(["convert", "nanogpt", str(tmp_path / "train.bin"), str(tmp_path / "e"),
                     "--dtype", "uint16", "--eos-id", "65000"]) == 0
    assert list(stoker.TokenDataset(tmp_path / "e").doc_lengths()) == [11, 490, len(stream) - 501]
    assert stoker.TokenDataset(tmp_path / "e")[0].tolist() == stream[:11].tolist()
    # bad input: a Megatron .bin that does not match, a file that is not one
    with open(prefix + ".bin", "ab") as f:
        f.write(b"\x00\x00")
    assert cli.main(["convert", "megatron", prefix, str(tmp_path / "bad")]) == 1  # bad data
    with pytest.raises(ValueError, match="not a Megatron dataset"):
        convert_tokens(str(tmp_path / "train.bin"), tmp_path / "x", format="megatron")
