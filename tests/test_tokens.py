"""Language-model data: token sources, windows, packing, token budgets, resume.

Every batch the C++ producer makes is compared with the plain-Python reference
(tests/_token_reference.py) for the same documents and options, across sources,
modes, dtypes, ranks, world sizes and resume offsets.
"""

import os
import pickle
import struct

import numpy as np
import pytest
import stoker
from _token_reference import Permutation, Reference, Split
from stoker import _core
from stoker import token_dataset as td

_MEGATRON_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6,
                   "float32": 7, "uint16": 8}


def write_megatron(prefix, docs, dtype="uint16"):
    """PREFIX.bin + PREFIX.idx as Megatron-LM's IndexedDatasetBuilder writes them."""
    dt = np.dtype(dtype)
    lengths = [len(d) for d in docs]
    with open(f"{prefix}.bin", "wb") as f:
        for d in docs:
            f.write(np.asarray(d, dt).tobytes())
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * dt.itemsize \
        if docs else np.zeros(0, np.int64)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, _MEGATRON_CODES[dt.name],
                                                 len(docs), len(docs) + 1))
        f.write(np.asarray(lengths, np.int32).tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes())
    return prefix


def random_docs(n, max_len, seed=0, vocab=50000, dtype=np.uint16):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(0, max_len)), dtype=np.int64).astype(dtype)
            for _ in range(n)]


def write_token_dataset(path, docs, dtype="uint16", **kw):
    with stoker.ShardWriter(path, {"tokens": stoker.tokens(dtype)}, **kw) as w:
        for d in docs:
            w.write({"tokens": d})
    return stoker.TokenDataset(path)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The same documents as a stoker dataset, a Megatron dataset and flat files."""
    root = tmp_path_factory.mktemp("tok")
    docs = random_docs(300, 200, seed=1)
    docs[5] = np.zeros(0, np.uint16)  # an empty document
    out = {"stoker": write_token_dataset(root / "ds", docs, shard_size="20KB")}
    write_megatron(str(root / "mega"), docs)
    out["megatron"] = stoker.TokenDataset(str(root / "mega"))
    # flat files: documents end with an EOS id that appears nowhere else
    eos = 60000
    flat_docs = [np.append(d, eos).astype(np.uint16) for d in docs]
    half = len(flat_docs) // 2
    np.concatenate(flat_docs[:half]).tofile(root / "a.bin")
    np.concatenate(flat_docs[half:]).tofile(root / "b.bin")
    out["flat_eos"] = stoker.TokenDataset([str(root / "a.bin"), str(root / "b.bin")],
                                          dtype="uint16", eos_id=eos)
    out["flat"] = stoker.TokenDataset(str(root / "a.bin"), dtype="uint16")
    return out


def docs_of(ds):
    return [np.asarray(d) for d in ds]


def check_against_reference(ds, epochs=(0, 1), worlds=(1, 2, 3), offsets=True, **kwargs):
    ds2, kw = td._producer_args(ds, **kwargs)
    producer = _core.TokenProducer(ds2._source, **kw)
    prompts = list(ds2.prompt_lengths()) if ds2.prompt_field else ()
    ref = Reference(docs_of(ds2), prompts=prompts, **kw)
    assert producer.epoch_samples() == ref.epoch_samples()
    assert producer.pad_fraction == pytest.approx(ref.pad_fraction())
    for epoch in epochs:
        for world in worlds:
            n0 = ref.num_batches(0, world)
            starts = [0] + ([producer.consumed_after(epoch, 0, world, 0, n0 // 2)] if offsets
                            and n0 > 1 else [])
            for offset in starts:
                assert producer.consumed_after(epoch, 0, world, 0, n0 // 2) == \
                    ref.consumed_after(epoch, 0, world, 0, n0 // 2)
                for rank in range(world):
                    plan = producer.plan_epoch(epoch, rank, world, offset)
                    assert producer.num_batches(rank, world) == ref.num_batches(rank, world)
                    for k in range(plan.num_batches):
                        got = producer.batch(plan, k, threads=1 + k % 2)
                        want = ref.batch(epoch, rank, world, offset, k)
                        assert list(got) == list(want)
                        for key in want:
                            assert got[key].dtype == want[key].dtype, key
                            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    return producer


# -- sources -----------------------------------------------------------------

def test_sources_read_the_same_documents(sources):
    want = docs_of(sources["megatron"])
    assert [len(d) for d in want] == list(sources["megatron"].doc_lengths())
    for d, w in zip(sources["stoker"], want, strict=True):
        np.testing.assert_array_equal(d, w)
    flat = docs_of(sources["flat_eos"])
    assert len(flat) == len(want)
    for d, w in zip(flat, want, strict=True):
        np.testing.assert_array_equal(d[:-1], w)
        assert d[-1] == 60000
    assert len(sources["flat"]) == 1 and sources["flat"].num_tokens == sum(
        len(d) + 1 for d in want[:150])
    assert sources["megatron"].kind == "megatron" and sources["stoker"].kind == "stoker"
    assert not sources["megatron"][0].flags.writeable  # a view into the mapping
    assert sources["stoker"].dtype == "uint16"


def test_megatron_prefix_forms(tmp_path):
    prefix = write_megatron(str(tmp_path / "c"), random_docs(10, 50))
    for p in (prefix, prefix + ".bin", prefix + ".idx"):
        ds = stoker.TokenDataset(p)
        assert ds.kind == "megatron" and ds.paths == [prefix]
    with pytest.raises(ValueError, match="tokens are uint16"):
        stoker.TokenDataset(prefix, dtype="int32")


def test_pickle_by_path(sources):
    for name in ("stoker", "megatron", "flat_eos"):
        ds = sources[name]
        back = pickle.loads(pickle.dumps(ds))
        assert back.kind == ds.kind and back.num_tokens == ds.num_tokens
        np.testing.assert_array_equal(back[3], ds[3])


def test_tokens_field(tmp_path):
    f = stoker.tokens("uint16")
    assert f == stoker.Field.from_spec(f.spec()) and repr(f) == "stoker.tokens('uint16')"
    ds = write_token_dataset(tmp_path / "d", [[1, 2, 3], [], np.array([65535], np.uint32)])
    plain = stoker.Dataset(tmp_path / "d")
    assert isinstance(plain.fields["tokens"], stoker.Tokens)
    np.testing.assert_array_equal(plain[0]["tokens"], [1, 2, 3])
    assert plain[0]["tokens"].dtype == np.uint16 and len(plain[1]["tokens"]) == 0
    assert list(ds.doc_lengths()) == [3, 0, 1]
    # a plain Loader batches the field like ndarray(dtype, (None,)): padded, with lengths
    batch = next(iter(stoker.Loader(plain, batch_size=3)))
    assert batch["tokens"].tolist() == [[1, 2, 3], [0, 0, 0], [65535, 0, 0]]
    assert batch["tokens_lengths"].tolist() == [3, 0, 1]


@pytest.mark.parametrize("value, match", [
    ([1, 70000], "token id 70000 is outside uint16"),
    ([-1, 2], "token id -1 is outside uint16"),
    ([1.5, 2.0], "must be integers"),
    ([[1, 2]], "1-D"),
    (["a"], "must be integers"),
])
def test_tokens_field_refuses_bad_ids(tmp_path, value, match):
    with pytest.raises(ValueError, match=match):
        with stoker.ShardWriter(tmp_path / "bad", {"t": stoker.tokens("uint16")}) as w:
            w.write({"t": value})
    assert not os.path.exists(tmp_path / "bad" / "index.json")
    with pytest.raises(ValueError, match="token dtype"):
        stoker.tokens("float32")


# -- every mode against the reference -----------------------------------------

@pytest.mark.parametrize("source", ["stoker", "megatron", "flat_eos"])
@pytest.mark.parametrize("mode", [
    dict(seq_len=48, batch_size=8, stride=17),
    dict(seq_len=64, batch_size=5, packing="concat"),
    dict(seq_len=64, batch_size=6, packing="document"),
    dict(seq_len=64, batch_size=6, packing="document", pack_fit="first_fit", pack_window=4),
    dict(seq_len=64, batch_size=4, packing="document", overlong="truncate", drop_last=True),
    dict(max_tokens=700, pad_to_multiple_of=16),
    dict(max_tokens=512, max_length=100, batch_size=6, pad_id=7, ignore_index=-1),
])
@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_match_reference(sources, source, mode, shuffle):
    check_against_reference(sources[source], shuffle=shuffle, seed=11, **mode)


@pytest.mark.parametrize("mode", [
    dict(seq_len=48, batch_size=8, stride=17),
    dict(seq_len=64, batch_size=5, packing="concat"),
    dict(seq_len=64, batch_size=6, packing="document", pack_window=4),
    dict(max_tokens=512, max_length=100, batch_size=6, pad_id=7, ignore_index=-1),
])
def test_unshifted_labels_match_reference(sources, mode):
    """labels="unshifted" (HF's convention): the tokens themselves, ignore_index at every
    sequence start and on padding; packed batches with DataCollatorWithFlattening's keys."""
    check_against_reference(sources["flat_eos"], shuffle=True, seed=3, worlds=(1, 2),
                            labels="unshifted", **mode)


def test_prompt_tokens_get_no_label(tmp_path):
    """Fine-tuning examples: a position whose next token is still part of the prompt has
    no label, in packed rows (split or not) and token-budget batches; windows ignore it."""
    docs = random_docs(120, 150, seed=4)
    rng = np.random.default_rng(1)
    fields = {"tokens": stoker.tokens("uint16"), "prompt_tokens": stoker.scalar("int32")}
    prompts = []
    with stoker.ShardWriter(tmp_path / "sft", fields, metadata={"prompt_field": "prompt_tokens"}) \
            as w:
        for d in docs:
            prompts.append(int(rng.integers(0, len(d) + 1)))
            w.write({"tokens": d, "prompt_tokens": prompts[-1]})
    ds = stoker.TokenDataset(tmp_path / "sft")
    assert ds.prompt_field == "prompt_tokens" and list(ds.prompt_lengths()) == prompts
    for mode in (dict(seq_len=64, batch_size=4, packing="document"),
                 dict(seq_len=100, batch_size=3, packing="concat"),
                 dict(max_tokens=600, pad_to_multiple_of=8)):
        check_against_reference(ds, shuffle=True, seed=2, worlds=(1, 2), **mode)
        check_against_reference(ds, shuffle=True, seed=2, worlds=(1,), offsets=False,
                                labels="unshifted", **mode)
    p = td._make_producer(ds, seq_len=200, batch_size=len(docs), packing="document")
    targets = sum(int(b.sum()) for b in
                  [p.batch(p.plan_epoch(0), k)["loss_mask"] for k in range(p.num_batches())])
    assert targets == sum(len(d) - max(pr, 1)
                          for d, pr in zip(docs, prompts, strict=True) if len(d))
    off = stoker.TokenDataset(tmp_path / "sft", prompt_field="")
    assert off.prompt_field is None and not off.prompt_lengths().any()
    # a prompt longer than its document is refused when read
    with stoker.ShardWriter(tmp_path / "bad", fields) as w:
        w.write({"tokens": [1, 2, 3], "prompt_tokens": 4})
    bad = stoker.TokenDataset(tmp_path / "bad", prompt_field="prompt_tokens")
    p = td._make_producer(bad, seq_len=8, packing="document")
    with pytest.raises(stoker.DataError, match=r"record 0: prompt length 4 is outside \[0, 3\]"):
        p.batch(p.plan_epoch(0), 0)


def test_int32_output_and_windows_of_a_flat_file(sources):
    p = check_against_reference(sources["flat"], seq_len=100, batch_size=7, shuffle=True,
                                token_dtype="int32", worlds=(1, 4))
    ds = sources["flat"]
    stream = np.fromfile(ds.paths[0], np.uint16)
    assert p.epoch_samples() == (len(stream) - 101) // 100 + 1
    b = p.batch(p.plan_epoch(0), 0)
    assert b["input_ids"].dtype == np.int32
    # nanoGPT's x, y: y is x shifted by one along the stream
    s = int(np.flatnonzero((np.lib.stride_tricks.sliding_window_view(stream, 100)
                            == b["input_ids"][0]).all(1))[0])
    np.testing.assert_array_equal(b["labels"][0], stream[s + 1:s + 101])


def test_packed_layout_for_varlen_attention(sources):
    """cu_seqlens, position_ids and loss_mask agree with each other and with the
    documents: what flash_attn_varlen_func and DataCollatorWithFlattening expect."""
    ds = sources["megatron"]
    docs = docs_of(ds)
    p = td._make_producer(ds, seq_len=128, batch_size=4, packing="document", shuffle=True)
    plan = p.plan_epoch(0)
    seen = {}
    for k in range(plan.num_batches):
        b = p.batch(plan, k)
        x, y, pos, cu = b["input_ids"], b["labels"], b["position_ids"], b["cu_seqlens"]
        flat_pos = pos.reshape(-1)
        assert cu.dtype == np.int32 and cu[0] == 0 and cu[-1] == x.size
        np.testing.assert_array_equal(np.flatnonzero(flat_pos == 0), cu[:-1])
        assert int(b["max_seqlen"]) == int(np.diff(cu).max())
        np.testing.assert_array_equal(b["loss_mask"], y != -100)
        for a, e in zip(cu[:-1], cu[1:]):
            seq = x.reshape(-1)[a:e]
            if not b["loss_mask"].reshape(-1)[a:e].any() and (seq == 0).all() and e % 128 == 0:
                continue  # a padding run at the end of a row
            # a piece of one document, starting where its position says
            matches = [(d, o) for d, doc in enumerate(docs)
                       for o in range(len(doc) - len(seq) + 1)
                       if doc[o] == seq[0] and np.array_equal(doc[o:o + len(seq)], seq)]
            assert matches
            d, o = matches[0]
            assert o == 0 or len(docs[d]) > 128  # whole documents unless split
            for i in range(o, o + len(seq)):
                seen[(d, i)] = seen.get((d, i), 0) + 1
    # every token of every document exactly once in the epoch
    assert len(seen) == sum(len(d) for d in docs) and set(seen.values()) == {1}


def test_overlong_documents(tmp_path):
    docs = [np.arange(10, dtype=np.uint16), np.arange(300, dtype=np.uint16) + 1000]
    ds = write_token_dataset(tmp_path / "long", docs)
    with pytest.raises(stoker.DataError, match=r"shard-00000\.stk: record 1.*longer than "
                                               r"seq_len=128"):
        td._make_producer(ds, seq_len=128, batch_size=2, packing="document", overlong="error")
    split = td._make_producer(ds, seq_len=128, batch_size=8, packing="document")
    assert split.epoch_rows == 3 and split.unused_tokens == 0
    cut = td._make_producer(ds, seq_len=128, batch_size=8, packing="document",
                            overlong="truncate")
    assert cut.epoch_rows == 2 and cut.unused_tokens == 300 - 128
    # a split document keeps its real next token across the cut
    b = split.batch(split.plan_epoch(0), 0)
    row = int(np.flatnonzero(b["input_ids"][:, 0] == 1000)[0])
    assert b["labels"][row, -1] == 1000 + 128 and b["loss_mask"][row, -1]
    with pytest.raises(stoker.DataError, match="does not fit max_tokens=64; pass max_length"):
        td._make_producer(ds, max_tokens=64)
    ok = td._make_producer(ds, max_tokens=64, max_length=64)
    assert ok.epoch_samples() == 2


def test_budget_batches(sources):
    ds = sources["stoker"]
    lengths = ds.doc_lengths()
    p = td._make_producer(ds, max_tokens=1000, pad_to_multiple_of=8, shuffle=True, seed=3)
    for epoch in (0, 1):
        plan = p.plan_epoch(epoch)
        rows = 0
        shapes = []
        for k in range(plan.num_batches):
            b = p.batch(plan, k)
            n, w = b["input_ids"].shape
            assert n * w <= 1000 and w % 8 == 0
            np.testing.assert_array_equal(b["attention_mask"].sum(1) > 0, True)
            shapes.append((n, w))
            rows += n
        assert rows == int((lengths > 0).sum())
        if epoch == 0:
            first = sorted(shapes)
        else:
            assert sorted(shapes) == first  # the same batches every epoch, reordered
    assert 0 < p.pad_fraction < 0.2


# -- resume ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def long_stream(tmp_path_factory):
    """4 M tokens in documents of 1..2000 tokens, EOS-terminated, in one flat file."""
    root = tmp_path_factory.mktemp("long")
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 2000, 4000)
    stream = rng.integers(0, 50000, int(lengths.sum()), dtype=np.uint16)
    ends = np.cumsum(lengths) - 1
    stream[stream == 65000] = 1
    stream[ends] = 65000
    stream.tofile(root / "long.bin")
    return stoker.TokenDataset(str(root / "long.bin"), dtype="uint16", eos_id=65000)


@pytest.mark.parametrize("mode", [
    dict(seq_len=256, batch_size=16),
    dict(seq_len=256, batch_size=16, packing="concat"),
    dict(seq_len=512, batch_size=8, packing="document"),
    dict(max_tokens=8192, pad_to_multiple_of=64),
])
def test_resume_at_random_points(long_stream, mode):
    """Resuming anywhere in a multi-million-token epoch (any world size) continues with
    exactly the batches that were left, computed from (epoch, offset) alone."""
    ds = long_stream
    assert ds.num_tokens > 3_000_000
    p = td._make_producer(ds, shuffle=True, seed=5, **mode)
    ref = None
    rng = np.random.default_rng(0)
    full = p.plan_epoch(4, 0, 1, 0)
    for k in sorted(rng.choice(full.num_batches, 40, replace=False)):
        offset = p.consumed_after(4, 0, 1, 0, int(k))
        resumed = p.plan_epoch(4, 0, 1, offset)
        assert resumed.num_batches == full.num_batches - k
        for j in (0, 1, resumed.num_batches - 1):
            if 0 <= j < resumed.num_batches:
                a, b = p.batch(resumed, j), p.batch(full, int(k) + j)
                for key in a:
                    np.testing.assert_array_equal(a[key], b[key])
    # saved at world size 2, resumed at 3: the ranks share exactly what was left
    n2 = p.num_batches(0, 2)
    offset = p.consumed_after(4, 0, 2, 0, n2 // 3)
    ds2, kw = td._producer_args(ds, shuffle=True, seed=5, **mode)
    if mode.get("packing") != "document":  # the reference's packer is slow on 4 M tokens
        ref = Reference(docs_of(ds2), **kw)
        assert offset == ref.consumed_after(4, 0, 2, 0, n2 // 3)
        for rank in range(3):
            plan = p.plan_epoch(4, rank, 3, offset)
            for k in (0, plan.num_batches - 1):
                got, want = p.batch(plan, k), ref.batch(4, rank, 3, offset, k)
                for key in want:
                    np.testing.assert_array_equal(got[key], want[key])


def test_split_covers_the_rest_of_an_epoch():
    for n, offset, world, batch, drop in [(100, 0, 3, 4, False), (100, 37, 4, 5, False),
                                          (101, 40, 3, 7, True), (5, 4, 3, 2, False)]:
        got = []
        for r in range(world):
            s = Split(n, offset, r, world, batch, drop)
            for k in range(s.batches):
                got += s.positions(k)
        if drop:
            assert len(got) == len(set(got)) and set(got) <= set(range(offset, n))
            assert len(got) >= (n - offset) - world * batch
        else:
            assert set(range(offset, n)) <= set(got)


def test_permutation_is_the_cores():
    """The reference's Feistel permutation is the sampler's: shuffled record loaders and
    token loaders use one definition of an epoch order."""
    p = Permutation(1000, 42)
    values = [p(i) for i in range(1000)]
    assert sorted(values) == list(range(1000))
    # the same key drives the record sampler's shuffle (permutation.h, sampler.cpp)
    ds_seed, epoch = 9, 2
    from _token_reference import epoch_key
    q = Permutation(50, epoch_key(ds_seed, epoch))
    assert q(0) != q(1)


# -- bad input ------------------------------------------------------------------

def test_bad_flat_files(tmp_path):
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(stoker.DataError, match="empty.bin: empty token file"):
        stoker.TokenDataset(str(tmp_path / "empty.bin"), dtype="uint16")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    with pytest.raises(stoker.DataError, match="odd.bin: 3 bytes is not a whole number of "
                                               "uint16 tokens"):
        stoker.TokenDataset(str(tmp_path / "odd.bin"), dtype="uint16")
    with pytest.raises(FileNotFoundError, match="nope.bin"):
        stoker.TokenDataset(str(tmp_path / "nope.bin"), dtype="uint16")
    (tmp_path / "ok.bin").write_bytes(np.arange(10, dtype=np.uint16).tobytes())
    with pytest.raises(ValueError, match="pass dtype="):
        stoker.TokenDataset(str(tmp_path / "ok.bin"))
    with pytest.raises(ValueError, match="dtype must be one of"):
        stoker.TokenDataset(str(tmp_path / "ok.bin"), dtype="float32")
    with pytest.raises(ValueError, match="eos_id 70000 does not fit the token dtype uint16"):
        stoker.TokenDataset(str(tmp_path / "ok.bin"), dtype="uint16", eos_id=70000)
    ds = stoker.TokenDataset(str(tmp_path / "ok.bin"), dtype="uint16")
    with pytest.raises(stoker.DataError, match="10 tokens, but a window of seq_len=10 needs 11"):
        td._make_producer(ds, seq_len=10)
    td._make_producer(ds, seq_len=9)  # exactly enough


def test_megatron_idx_that_does_not_match_its_bin(tmp_path):
    prefix = write_megatron(str(tmp_path / "m"), random_docs(20, 100))
    with open(prefix + ".bin", "ab") as f:
        f.write(b"\x00\x00")
    with pytest.raises(stoker.DataError, match=r"m\.bin: .* the \.idx does not match its \.bin"):
        stoker.TokenDataset(prefix)
    prefix = write_megatron(str(tmp_path / "t"), random_docs(20, 100))
    idx = tmp_path / "t.idx"
    data = idx.read_bytes()
    idx.write_bytes(data[:-9])
    with pytest.raises(stoker.DataError, match=r"t\.idx: .*truncated"):
        stoker.TokenDataset(prefix)
    idx.write_bytes(data + b"\x00\x00\x00")
    with pytest.raises(stoker.DataError, match=r"t\.idx: .*truncated or corrupt index"):
        stoker.TokenDataset(prefix)
    idx.write_bytes(b"NOTANIDX" + data[8:])
    with pytest.raises(stoker.DataError, match="not a Megatron index"):
        stoker.TokenDataset(prefix)
    write_megatron(str(tmp_path / "f"), [np.zeros(3)], dtype="float32")
    with pytest.raises(stoker.DataError, match="floating-point tokens"):
        stoker.TokenDataset(str(tmp_path / "f"))
    write_megatron(str(tmp_path / "e"), [])
    empty = stoker.TokenDataset(str(tmp_path / "e"))
    assert len(empty) == 0
    with pytest.raises(stoker.DataError, match="0 tokens"):
        td._make_producer(empty, seq_len=8)
    with pytest.raises(stoker.DataError, match="no tokens to pack"):
        td._make_producer(empty, seq_len=8, packing="document")


def test_ids_outside_the_output_dtype_or_vocabulary(tmp_path):
    np.array([1, 2, 3, 2**31 + 5, 4, 5, 6, 7, 8], np.uint32).tofile(tmp_path / "big.bin")
    ds = stoker.TokenDataset(str(tmp_path / "big.bin"), dtype="uint32")
    p = td._make_producer(ds, seq_len=4, token_dtype="int32")
    with pytest.raises(stoker.DataError, match=r"big\.bin: document 0 .*: token 3 of the "
                       r"document is 2147483653, outside \[0, 2147483648\)"):
        p.batch(p.plan_epoch(0), 0)
    p64 = td._make_producer(ds, seq_len=4)  # int64 holds it
    assert p64.batch(p64.plan_epoch(0), 0)["input_ids"][0, 3] == 2**31 + 5
    small = stoker.TokenDataset(str(tmp_path / "big.bin"), dtype="uint32", vocab_size=6)
    pv = td._make_producer(small, seq_len=4)
    with pytest.raises(stoker.DataError, match=r"outside \[0, 6\) \(vocab_size=6\)"):
        pv.batch(pv.plan_epoch(0), 1)


def test_corrupt_token_record(tmp_path):
    docs = [np.full(50, i + 1, np.uint16) for i in range(10)]
    ds = write_token_dataset(tmp_path / "c", docs)
    path = os.path.join(ds.dataset.path, ds.dataset.shards[0]["path"])
    with open(path, "r+b") as f:  # record i starts at 64 + i * (4 + 100)
        f.seek(64 + 3 * 104 + 20)
        f.write(b"\xff")
    ds = stoker.TokenDataset(tmp_path / "c")  # the structure is intact: opens fine
    p = td._make_producer(ds, seq_len=50, batch_size=10, packing="document")
    with pytest.raises(stoker.DataError, match=r"shard-00000\.stk: record 3: checksum mismatch"):
        p.batch(p.plan_epoch(0), 0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(), "need seq_len= .* or max_tokens="),
    (dict(seq_len=0), "seq_len must be an int >= 1"),
    (dict(seq_len=True), "seq_len must be an int"),
    (dict(seq_len=8, packing="pack"), "packing must be None, 'concat' or 'document'"),
    (dict(seq_len=8, token_dtype="int16"), "token_dtype must be one of 'int64', 'int32'"),
    (dict(seq_len=8, max_tokens=100), "seq_len does not apply with max_tokens"),
    (dict(max_tokens=100, packing="document"), "packing does not apply with max_tokens"),
    (dict(seq_len=8, packing="concat", stride=2), "stride applies to windows"),
    (dict(seq_len=8, max_length=4), "max_length applies to max_tokens"),
    (dict(seq_len=8, pack_fit="worst"), "pack_fit must be"),
    (dict(seq_len=8, overlong="drop"), "overlong must be"),
    (dict(seq_len=8, pad_id=2**31, token_dtype="int32"), "pad_id must be an int"),
    (dict(seq_len=2**20, batch_size=2**12), "must stay below 2\\*\\*31"),
    (dict(max_tokens=0), "max_tokens must be an int >= 1"),
    (dict(max_tokens=10, pad_to_multiple_of=0), "pad_to_multiple_of must be an int >= 1"),
])
def test_argument_errors(sources, kwargs, match):
    with pytest.raises(ValueError, match=match):
        td._make_producer(sources["megatron"], **kwargs)


def test_dataset_without_tokens_field(tmp_path):
    with stoker.ShardWriter(tmp_path / "x", {"a": stoker.scalar("int64"),
                                             "t": stoker.ndarray("int32", (None,))}) as w:
        w.write({"a": 1, "t": [1, 2]})
    with pytest.raises(ValueError, match="no stoker.tokens field"):
        stoker.TokenDataset(tmp_path / "x")
    with pytest.raises(ValueError, match="not token documents"):
        stoker.TokenDataset(tmp_path / "x", field="a")
    ds = stoker.TokenDataset(tmp_path / "x", field="t")  # an integer ndarray works as tokens
    np.testing.assert_array_equal(ds[0], [1, 2])
