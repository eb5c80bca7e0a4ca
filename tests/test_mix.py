"""stoker.Mix: its argument checks, its weights as exact fractions, and the mixture
sampler seen from Python (csrc/sampler/mixture.h)."""

import os
import pickle
from fractions import Fraction

import numpy as np
import pytest
import stoker
import torch
from conftest import native_testing, write_dataset
from remote_servers import Nginx, nginx_binary
from stoker import _core
from stoker.mix import rational_counts

_testing = native_testing()  # the test-only entry points (tests/ext/)


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    return {n: write_dataset(root / n, size, shard_size="4KB")
            for n, size in (("a", 50), ("b", 30), ("c", 7))}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixtok")
    out = {}
    for n, size in (("web", 5000), ("code", 3000)):
        p = root / f"{n}.bin"
        (np.arange(size) % 97).astype(np.uint16).tofile(p)  # documents of 97 tokens
        out[n] = stoker.TokenDataset(str(p), dtype="uint16", eos_id=0)
    return out


def test_weights_normalised_and_exact(three):
    mix = stoker.Mix(three, weights={"a": 7, "b": 2, "c": 1})
    assert mix.weights == {"a": 0.7, "b": 0.2, "c": 0.1}
    assert mix.names == ["a", "b", "c"] and not mix.is_schedule and not mix.tokens
    assert mix.weights_unit == "samples"
    # floats become the fractions they spell: a period of 10 rows, exactly 7/2/1
    mix = stoker.Mix(three, weights={"a": 0.7, "b": 0.2, "c": 0.1})
    assert mix._breakpoints[0][1] == [Fraction(7, 10), Fraction(1, 5), Fraction(1, 10)]
    assert rational_counts(mix._breakpoints[0][1]) == [7, 2, 1]
    assert stoker.Mix(three).weights == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    assert rational_counts([Fraction(1, 3)] * 3) == [1, 1, 1]


def test_rational_counts_rounds_fine_weights():
    # token counts as weights: denominators past 2**20 are rounded, each by < 2**-20
    w = [Fraction(1234567, 8888889), Fraction(7654321, 8888889), Fraction(1, 8888889)]
    c = rational_counts(w)
    assert sum(c) == 1 << 20 and min(c) >= 1
    assert all(abs(Fraction(ci, 1 << 20) - wi) < Fraction(1, 1 << 20)
               for ci, wi in zip(c, w, strict=True))


def test_schedule(three):
    sched = [(0, {"a": 1, "b": 1, "c": 0}), (100, {"a": 0.2, "b": 0.3, "c": 0.5})]
    mix = stoker.Mix(three, weights=sched, interpolation="linear")
    assert mix.is_schedule
    assert mix.weights == [(0, {"a": 0.5, "b": 0.5, "c": 0.0}),
                           (100, {"a": 0.2, "b": 0.3, "c": 0.5})]
    # one weight vector repeated is constant weights
    same = stoker.Mix(three, weights=[(0, {"a": 1, "b": 1, "c": 1}),
                                      (5, {"a": 2, "b": 2, "c": 2})])
    assert not same.is_schedule


@pytest.mark.parametrize("weights, match", [
    ({"a": 1, "b": 1}, "no weight for source 'c'"),
    ({"a": 1, "b": 1, "c": 1, "d": 1}, "no source named 'd'"),
    ({"a": 1, "b": 0, "c": 1}, "weight of 'b' must be positive"),
    ({"a": 1, "b": -2, "c": 1}, "weight of 'b' must be positive"),
    ({"a": 1, "b": float("nan"), "c": 1}, "must be finite"),
    ({"a": 1, "b": "1", "c": 1}, "must be a number"),
    ({"a": True, "b": 1, "c": 1}, "must be a number"),
    ([(1, {"a": 1, "b": 1, "c": 1})], "starts at step 0"),
    ([(0, {"a": 1, "b": 1, "c": 1}), (10, {"a": 1, "b": 2, "c": 1}),
      (10, {"a": 2, "b": 1, "c": 1})], "steps must increase"),
    ([(0, {"a": 1, "b": 1, "c": 1}), (-1, {"a": 1, "b": 2, "c": 1})], "must be an int >= 0"),
    ([(0, {"a": 1, "b": 1, "c": 0}), (9, {"a": 1, "b": 2, "c": 0})], "'c' has weight 0 at "
                                                                     "every step"),
    ([(0, {"a": 0, "b": 0, "c": 0})], "no positive weight"),
    ([(0, {"a": 1, "b": 1, "c": 1}), (5,)], "list of \\(step"),
    ("web", "must be a dict"),
])
def test_bad_weights(three, weights, match):
    with pytest.raises(ValueError, match=match):
        stoker.Mix(three, weights=weights)


def test_bad_sources(three, tok, tmp_path):
    with pytest.raises(ValueError, match="non-empty dict"):
        stoker.Mix({})
    with pytest.raises(ValueError, match="non-empty strings"):
        stoker.Mix({"": three["a"]})
    with pytest.raises(ValueError, match="source 'x': expected a stoker.Dataset"):
        stoker.Mix({"x": [1, 2, 3]})
    with pytest.raises(ValueError, match="not both"):
        stoker.Mix({"a": three["a"], "web": tok["web"]})
    other = write_dataset(tmp_path / "other", 5, fields={"y": stoker.scalar("int32")},
                          make=lambda i: {"y": i})
    with pytest.raises(ValueError, match="'o' has other fields than 'a'.*y: "):
        stoker.Mix({"a": three["a"], "o": other})
    # paths open as datasets
    mix = stoker.Mix({"a": three["a"].path, "b": three["b"]})
    assert isinstance(mix.datasets["a"], stoker.Dataset)


def test_units_and_epochs(three, tok):
    assert stoker.Mix(tok).weights_unit == "tokens" and stoker.Mix(tok).tokens
    assert stoker.Mix(tok, weights_unit="samples").weights_unit == "samples"
    with pytest.raises(ValueError, match="applies to token datasets"):
        stoker.Mix(three, weights_unit="tokens")
    with pytest.raises(ValueError, match="weights_unit must be"):
        stoker.Mix(tok, weights_unit="bytes")
    with pytest.raises(ValueError, match="not both"):
        stoker.Mix(tok, samples_per_epoch=10, tokens_per_epoch=100)
    with pytest.raises(ValueError, match="tokens_per_epoch applies to token datasets"):
        stoker.Mix(three, tokens_per_epoch=100)
    with pytest.raises(ValueError, match="samples_per_epoch must be a positive int"):
        stoker.Mix(three, samples_per_epoch=0)
    with pytest.raises(ValueError, match="interpolation must be"):
        stoker.Mix(three, interpolation="cubic")
    assert stoker.Mix(three, samples_per_epoch=40).samples_per_epoch == 40


def test_vocab_sizes_must_agree(tmp_path):
    p = tmp_path / "t.bin"
    np.arange(100, dtype=np.uint16).tofile(p)
    a = stoker.TokenDataset(str(p), dtype="uint16", vocab_size=50304)
    b = stoker.TokenDataset(str(p), dtype="uint16", vocab_size=32000)
    with pytest.raises(ValueError, match="different vocab_size"):
        stoker.Mix({"a": a, "b": b})


def test_pickle(three):
    sched = [(0, {"a": Fraction(1, 3), "b": 1, "c": 1}), (7, {"a": 5, "b": 1, "c": 0})]
    mix = stoker.Mix(three, weights=sched, interpolation="linear", samples_per_epoch=11)
    again = pickle.loads(pickle.dumps(mix))
    assert again._breakpoints == mix._breakpoints and again.names == mix.names
    assert again.interpolation == "linear" and again.samples_per_epoch == 11
    assert [d.path for d in again.datasets.values()] == [d.path for d in mix.datasets.values()]


# -- the sampler, through _core ---------------------------------------------------


def test_sequence_ratio_bound_per_batch():
    """After n batches of B rows every source is within one row of n * B * w, for the
    RedPajama-like blend where the greedy rule drifts past a row."""
    counts = [670, 150, 45, 45, 25, 45, 20]
    seq = _core.MixSequence.constant(counts)
    w = np.array(counts) / sum(counts)
    src, idx = seq.rows(0, 20000)
    for B in (1, 8, 64):
        c = np.cumsum(np.eye(len(counts), dtype=np.int64)[src], axis=0)[B - 1::B]
        n = np.arange(1, len(c) + 1)[:, None] * B
        assert np.abs(c - n * w).max() < 1
    # each row's position in its source's stream counts that source's earlier rows
    for s in range(len(counts)):
        assert (idx[src == s] == np.arange((src == s).sum())).all()
    # O(1) counts far out agree with rows there
    far = 10**15 + 12345
    base = seq.counts(far)
    s2, i2 = seq.rows(far, 1000)
    assert (i2 == base[s2] + np.array([(s2[:j] == s2[j]).sum() for j in range(1000)])).all()


def test_source_stream_passes():
    st = _testing.SourceStream([10, 15], True, 0, 123)
    pos = np.arange(3 * 25, dtype=np.int64)
    out = st.map(pos)
    passes = out.reshape(3, 25)
    for p in passes:
        assert sorted(p) == list(range(25))  # no sample twice within a pass
    assert not (passes[0] == passes[1]).all()  # a fresh order each pass


# -- through the Loader ------------------------------------------------------------------

@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """Three record sources whose labels say where a row came from: source s's sample i
    has label 1000 * s + i."""
    root = tmp_path_factory.mktemp("labelled")
    out = {}
    for s, (n, size) in enumerate((("a", 50), ("b", 30), ("c", 7))):
        out[n] = write_dataset(root / n, size, shard_size="2KB",
                               make=lambda i, s=s: {"x": np.full((3, 4, 4), i % 256, np.uint8),
                                                    "label": 1000 * s + i})
    return out


def run(loader, epoch=None):
    if epoch is not None:
        loader.set_epoch(epoch)
    return [{k: v.clone() for k, v in b.items()} for b in loader]


def test_records_exact_per_batch_and_own_orders(labelled):
    w = {"a": 0.5, "b": 0.3, "c": 0.2}
    mix = stoker.Mix(labelled, weights=w)
    loader = stoker.Loader(mix, batch_size=10, shuffle=True, seed=3, num_threads=2)
    # default epoch: until the source with the largest len / weight (a: 50 / 0.5) is read
    # once, exactly: 100 rows
    batches = run(loader, 0) + run(loader, 1)
    per_epoch = len(loader)
    assert per_epoch == 10
    src = torch.cat([b["source"] for b in batches])
    labels = torch.cat([b["label"] for b in batches])
    assert ((labels // 1000) == src).all()  # each row from the source it names
    assert (src[:100] == 0).sum() == 50
    # after every batch every source within one row of n * B * w
    counts = np.zeros(3)
    for n, b in enumerate(batches, 1):
        counts += np.bincount(b["source"].numpy(), minlength=3)
        assert np.abs(counts - n * 10 * np.array([0.5, 0.3, 0.2])).max() < 1
        assert (b["source"].diff() >= 0).all()  # grouped by source
    # each source's stream: a permutation pass after pass, a fresh order each pass
    for s, size in enumerate((50, 30, 7)):
        seq = (labels[src == s] - 1000 * s).tolist()
        passes = [seq[i:i + size] for i in range(0, len(seq) - size + 1, size)]
        assert len(passes) >= 1
        for p in passes:
            assert sorted(p) == list(range(size))
        if len(passes) > 1:
            assert passes[0] != passes[1]
    st = loader.stats()["sources"]
    assert [st[n]["samples"] for n in "abc"] == np.bincount(src.numpy(), minlength=3).tolist()
    assert st["a"]["weight"] == 0.5 and abs(sum(v["ratio"] for v in st.values()) - 1) < 1e-9


def test_same_batches_for_any_thread_count(labelled):
    mix = stoker.Mix(labelled, weights={"a": 2, "b": 2, "c": 1}, samples_per_epoch=61)
    runs = [run(stoker.Loader(mix, batch_size=5, shuffle=True, seed=1, num_threads=t), 2)
            for t in (1, 3)]
    assert len(runs[0]) == 13
    for x, y in zip(*runs, strict=True):
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_resume_across_a_schedule_breakpoint(labelled):
    sched = [(0, {"a": 1, "b": 1, "c": 0}), (4, {"a": 1, "b": 2, "c": 1}),
             (9, {"a": 0.2, "b": 0.2, "c": 0.6})]
    rng = np.random.default_rng(0)
    for interpolation in ("constant", "linear"):
        mix = stoker.Mix(labelled, weights=sched, interpolation=interpolation,
                         samples_per_epoch=96)
        kw = dict(batch_size=6, shuffle=True, seed=5, num_threads=2)
        for epoch in (0, 1):
            whole = stoker.Loader(mix, **kw)
            whole.set_epoch(epoch)
            full = run(whole)
            assert len(full) == 16
            # constant: no source c before step 4 of epoch 0 (linear: it ramps up)
            if epoch == 0 and interpolation == "constant":
                assert not (torch.cat([b["source"] for b in full[:4]]) == 2).any()
            for k in sorted(rng.choice(np.arange(1, 16), 4, replace=False)):
                first = stoker.Loader(mix, **kw)
                first.set_epoch(epoch)
                it = iter(first)
                for _ in range(k):
                    next(it)
                state = first.state_dict()
                it.close()
                again = stoker.Loader(mix, **kw)
                again.load_state_dict(state)
                rest = run(again)
                assert len(rest) == 16 - k
                for x, y in zip(rest, full[k:], strict=True):
                    assert all(torch.equal(x[n], y[n]) for n in x)


def test_elastic_two_to_three_ranks(labelled):
    mix = stoker.Mix(labelled, weights={"a": 0.5, "b": 0.3, "c": 0.2}, samples_per_epoch=200)
    kw = dict(batch_size=8, shuffle=True, seed=9, even_batches=False)
    two = [stoker.Loader(mix, rank=r, world_size=2, **kw) for r in range(2)]
    its = [iter(loader) for loader in two]
    for _ in range(5):  # five steps of both ranks
        for it in its:
            next(it)
    state = two[0].state_dict()
    assert state == two[1].state_dict()  # the same on every rank
    rest_two = [(int(s), int(x)) for it in its for b in it
                for s, x in zip(b["source"], b["label"])]
    three = [stoker.Loader(mix, rank=r, world_size=3, **kw) for r in range(3)]
    rest_three = []
    for loader in three:
        loader.load_state_dict(state)
        rest_three += [(int(s), int(x)) for b in loader for s, x in zip(b["source"], b["label"])]
    assert len({len(loader) for loader in three}) == 1
    assert sorted(rest_three) == sorted(rest_two) and len(rest_two) == 200 - 5 * 16


def test_token_mixture_packed_keeps_the_token_ratio(tmp_path):
    rng = np.random.default_rng(0)
    srcs = {}
    # long documents, one per row of 128 with a third of it padding, and short ones
    # that pack densely
    for name, lo, hi, docs in (("long", 65, 100, 600), ("short", 2, 20, 6000)):
        path = tmp_path / name
        with stoker.ShardWriter(path, {"tokens": stoker.tokens("uint16")}) as w:
            for _ in range(docs):
                n = int(rng.integers(lo, hi))
                w.write({"tokens": rng.integers(0, 60000, n, dtype=np.uint16)})
        srcs[name] = stoker.TokenDataset(path)
    w = {"long": 0.5, "short": 0.5}
    # pad_id 65535: no id of the data, so padding is where input_ids holds it
    loader = stoker.Loader(stoker.Mix(srcs, weights=w), batch_size=8, seq_len=128,
                           packing="document", shuffle=True, seed=0, pad_id=65535)
    tokens = np.zeros(2)
    rows = np.zeros(2)
    v = np.array([float(x) for x in loader._mix._row_weights([0.5, 0.5])])
    assert v[0] > 0.6  # rows of long documents hold fewer tokens: more of them
    for n, b in enumerate(loader, 1):
        assert b["input_ids"].shape == (len(b["source"]), 128)
        assert n == len(loader) or len(b["source"]) == 8  # the last may be short
        src = b["source"].numpy()
        np.add.at(rows, src, 1)
        np.add.at(tokens, src, (b["input_ids"] != 65535).sum(1).numpy())
        assert np.abs(rows - rows.sum() * v).max() < 1  # rows: within one of their share
    st = loader.stats()["sources"]
    assert [st[k]["samples"] for k in w] == rows.tolist()
    assert [st[k]["tokens"] for k in w] == tokens.tolist()
    ratio = st["long"]["tokens"] / (st["long"]["tokens"] + st["short"]["tokens"])
    assert abs(ratio - 0.5) < 0.01  # in tokens, not rows: packed rows of short documents
    assert abs(st["long"]["ratio"] - ratio) < 1e-12
    assert st["long"]["pad_fraction"] > 0.2 > st["short"]["pad_fraction"]


@pytest.mark.parametrize("kwargs", [dict(seq_len=64), dict(seq_len=64, packing="concat"),
                                    dict(max_tokens=512)])
def test_token_modes_and_resume(tok, kwargs):
    mix = stoker.Mix(tok, weights={"web": 3, "code": 1})
    loader = stoker.Loader(mix, batch_size=4 if "seq_len" in kwargs else None, shuffle=True,
                           seed=2, **kwargs)
    batches = run(loader, 0)
    assert len(batches) == len(loader) > 4
    assert all("source" in b and b["source"].dtype == torch.int64 for b in batches)
    if "max_tokens" in kwargs:  # a budget batch is of one source
        assert all(len(set(b["source"].tolist())) == 1 for b in batches)
    again = stoker.Loader(mix, batch_size=4 if "seq_len" in kwargs else None, shuffle=True,
                          seed=2, **kwargs)
    loader.set_epoch(0)
    first = iter(loader)
    for _ in range(3):
        next(first)
    state = loader.state_dict()
    first.close()
    again.load_state_dict(state)
    rest = run(again)
    assert len(rest) == len(batches) - 3
    for x, y in zip(rest, batches[3:], strict=True):
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_loader_argument_checks(labelled, tok):
    with pytest.raises(ValueError, match="need token sources: source 'a': .*no stoker.tokens"):
        stoker.Loader(stoker.Mix(labelled), batch_size=4, seq_len=16)
    with pytest.raises(ValueError, match="token batches need seq_len="):
        stoker.Loader(stoker.Mix(tok), batch_size=4, packing=None)
    loader = stoker.Loader(stoker.Mix(labelled), batch_size=4)
    other = stoker.Loader(stoker.Mix(labelled, weights={"a": 1, "b": 1, "c": 2}), batch_size=4)
    with pytest.raises(ValueError, match="cannot resume: the state is for another dataset"):
        other.load_state_dict(loader.state_dict())


# -- a local and a remote source ----------------------------------------------------------

def _objects_bytes(cache_dir):
    d = os.path.join(cache_dir, "objects")
    if not os.path.isdir(d):
        return 0
    total = 0
    for e in os.scandir(d):
        try:
            total += e.stat().st_size
        except FileNotFoundError:
            pass
    return total


def test_local_and_remote_sources(labelled, tmp_path):
    """A source over HTTP (nginx on loopback), through a cache smaller than it, with
    shard_window, mixes like the same source read locally: the same batches, bit for bit,
    two epochs, with the cache within its limit."""
    if nginx_binary() is None:
        pytest.skip("nginx is not installed (apt-get install nginx; .ci/run installs it)")
    www = tmp_path / "www"
    big = write_dataset(www / "big", 480, shard_size="2KB",
                        make=lambda i: {"x": np.full((3, 4, 4), i % 256, np.uint8),
                                        "label": 5000 + i})
    assert len(big.shards) >= 12
    server = Nginx(str(www), str(tmp_path / "nginx"))
    try:
        sizes = [s["bytes"] for s in big.shards]
        limit = 4 * max(sizes) + 10
        assert limit < sum(sizes) / 2
        cache = tmp_path / "cache"
        remote = stoker.Dataset(f"{server.url}/big", cache_dir=cache, cache_limit=limit)
        assert remote.remote.bounded
        w = {"a": 0.3, "big": 0.7}
        kw = dict(batch_size=8, shuffle=True, shard_window=1, seed=4, num_threads=2)
        mixed = stoker.Loader(stoker.Mix({"a": labelled["a"], "big": remote}, weights=w), **kw)
        local = stoker.Loader(stoker.Mix({"a": labelled["a"], "big": big}, weights=w), **kw)
        with pytest.raises(ValueError, match="larger than cache_limit"):
            stoker.Loader(stoker.Mix({"a": labelled["a"], "big": remote}, weights=w),
                          batch_size=8, shuffle=True)  # a global shuffle of the remote one
        peak = 0
        for e in (0, 1):
            mixed.set_epoch(e)
            local.set_epoch(e)
            got = []
            for b in mixed:
                got.append({k: v.clone() for k, v in b.items()})
                peak = max(peak, _objects_bytes(cache))
            want = list(local)
            assert len(got) == len(want) == len(mixed) > 10
            for g, x in zip(got, want, strict=True):
                assert all(torch.equal(g[k], x[k]) for k in g)
        assert peak <= limit
        assert remote.remote.stats()["evictions"] > 0  # read through the cache, not into it
        st = mixed.stats()["sources"]
        assert "network" not in st["a"]
        assert st["big"]["network"]["bytes_downloaded"] >= sum(sizes)
    finally:
        server.stop()


def test_pickled_loader_goes_on(labelled):
    mix = stoker.Mix(labelled, weights=[(0, {"a": 1, "b": 1, "c": 1}),
                                        (3, {"a": 3, "b": 1, "c": 0})], samples_per_epoch=40)
    loader = stoker.Loader(mix, batch_size=4, shuffle=True, seed=8)
    it = iter(loader)
    for _ in range(4):
        next(it)
    st = loader.stats()["sources"]
    assert st["c"]["weight"] == 0 and st["a"]["weight"] == 0.75  # past step 3
    copy = pickle.loads(pickle.dumps(loader))
    rest = [b for b in it]
    again = run(copy)
    assert len(again) == len(rest) == 6
    for x, y in zip(again, rest, strict=True):
        assert all(torch.equal(x[k], y[k]) for k in x)


# -- elastic resume of token mixtures and schedules ------------------------------------------

def _doc_sources(root, specs, seed=0):
    """Stoker token datasets of documents whose first token names their source: source s's
    documents start with 60000 + s."""
    rng = np.random.default_rng(seed)
    out = {}
    for s, (name, lo, hi, docs) in enumerate(specs):
        path = root / name
        with stoker.ShardWriter(path, {"tokens": stoker.tokens("uint16")},
                                shard_size="8KB") as w:
            for _ in range(docs):
                n = int(rng.integers(lo, hi))
                body = rng.integers(1, 50000, n - 1, dtype=np.uint16)
                w.write({"tokens": np.concatenate([[60000 + s], body]).astype(np.uint16)})
        out[name] = path
    return out


def _rows(batches):
    """(source, the row's tokens) of every row: a multiset that names each row exactly."""
    return [(int(s), ids.numpy().tobytes()) for b in batches
            for s, ids in zip(b["source"], b["input_ids"])]


@pytest.mark.parametrize("weights", [
    {"long": 0.4, "short": 0.6},
    [(0, {"long": 1, "short": 0}), (6, {"long": 0.2, "short": 0.8})],
])
def test_packed_token_mixture_elastic_two_to_three_ranks(tmp_path, weights):
    """A packed token mixture saved by 2 ranks and resumed by 3: the 3 ranks read exactly
    the rows the 2 had not read (as a multiset), in equal numbers of batches; under a
    schedule the weights go on where they were in the stream. (Token batches pad every
    rank by wrapping around: an epoch of 480 rows leaves no padding at 2 or 3 ranks.)"""
    paths = _doc_sources(tmp_path, (("long", 60, 120, 300), ("short", 3, 30, 2000)))
    mix = stoker.Mix({n: stoker.TokenDataset(p) for n, p in paths.items()}, weights=weights,
                     samples_per_epoch=480)
    kw = dict(batch_size=4, seq_len=128, packing="document", shuffle=True, seed=7,
              pad_id=65535)
    two = [stoker.Loader(mix, rank=r, world_size=2, **kw) for r in range(2)]
    assert len({len(loader) for loader in two}) == 1
    its = [iter(loader) for loader in two]
    head = [next(it) for _ in range(9) for it in its]  # 9 steps: past the breakpoint
    state = two[0].state_dict()
    assert state == two[1].state_dict()
    rest_two = _rows(b for it in its for b in it)
    epoch_rows = len(_rows(head)) + len(rest_two)
    three = [stoker.Loader(mix, rank=r, world_size=3, **kw) for r in range(3)]
    rest_three = []
    for loader in three:
        loader.load_state_dict(state)
        rest_three += _rows(list(loader))
    assert len({len(loader) for loader in three}) == 1
    assert len(rest_two) == 480 - 9 * 8 and sorted(rest_three) == sorted(rest_two)
    # every row from the source it names, and a whole epoch's rows: the one of a fresh
    # single-rank run
    for s, ids in rest_three:
        assert np.frombuffer(ids, np.int64)[0] == 60000 + s
    assert epoch_rows == 480


@pytest.mark.parametrize("batch_size", [4, 7])
def test_mixtures_without_even_batches_give_every_row_to_one_rank(tmp_path, labelled,
                                                                  batch_size):
    """even_batches=False on a mixture, records and packed tokens, at world size 3: the
    epoch's rows (a single rank's run) split over the ranks with none repeated, the same
    number of batches on each, and num_samples what each rank yields."""
    paths = _doc_sources(tmp_path, (("long", 60, 120, 200), ("short", 3, 30, 900)))
    tokens = stoker.Mix({n: stoker.TokenDataset(p) for n, p in paths.items()},
                        weights={"long": 0.4, "short": 0.6}, samples_per_epoch=301)
    records = stoker.Mix(labelled, weights={"a": 0.5, "b": 0.3, "c": 0.2},
                         samples_per_epoch=301)
    row = {"tokens": lambda b: zip(b["source"].tolist(),
                                   (ids.numpy().tobytes() for ids in b["input_ids"])),
           "records": lambda b: zip(b["source"].tolist(), b["label"].tolist())}
    for name, mix, kw in (("tokens", tokens, dict(seq_len=128, packing="document")),
                          ("records", records, {})):
        kw = dict(batch_size=batch_size, shuffle=True, seed=5, **kw)
        whole = sorted(r for b in stoker.Loader(mix, **kw) for r in row[name](b))
        assert len(whole) == 301
        split, counts = [], set()
        for rank in range(3):
            loader = stoker.Loader(mix, rank=rank, world_size=3, even_batches=False, **kw)
            mine = [list(row[name](b)) for b in loader]
            counts.add(len(mine))
            assert sum(map(len, mine)) == loader.num_samples, (name, rank)
            split += [r for b in mine for r in b]
        assert len(counts) == 1, name
        assert sorted(split) == whole, name


def test_schedule_resume_at_another_world_size_keeps_the_weights(labelled):
    """A schedule's steps are those of the run that saved the state: resumed at another
    world size, each row of the stream still comes from the source it would have come
    from, and stats() shows the weights in force there."""
    sched = [(0, {"a": 1, "b": 0, "c": 0}), (4, {"a": 0, "b": 1, "c": 0}),
             (8, {"a": 0, "b": 0, "c": 1})]
    mix = stoker.Mix(labelled, weights=sched, samples_per_epoch=120)
    kw = dict(batch_size=5, shuffle=True, seed=2, even_batches=False)
    # one rank's stream of sources for the whole epoch: steps of 5 * 2 rows
    two = [stoker.Loader(mix, rank=r, world_size=2, **kw) for r in range(2)]
    its = [iter(loader) for loader in two]
    for _ in range(6):  # into the second breakpoint's steps (rows 60..)
        for it in its:
            next(it)
    state = two[0].state_dict()
    want = sorted((int(s), int(x)) for it in its for b in it
                  for s, x in zip(b["source"], b["label"]))
    three = [stoker.Loader(mix, rank=r, world_size=3, **kw) for r in range(3)]
    got = []
    for loader in three:
        loader.load_state_dict(state)
        assert loader.stats()["sources"]["b"]["weight"] == 1  # rows 60..: step 6 of 10 rows
        got += [(int(s), int(x)) for b in loader for s, x in zip(b["source"], b["label"])]
    # rows 60..79 from b, 80..119 from c, exactly as the 2-rank run would have read them
    assert sorted(got) == want
    assert sum(1 for s, _ in got if s == 1) == 20 and sum(1 for s, _ in got if s == 2) == 40


def test_token_mixture_with_a_remote_source(tmp_path):
    """A token source over HTTP (nginx on loopback) mixes like the same source read
    locally: the same batches, bit for bit."""
    if nginx_binary() is None:
        pytest.skip("nginx is not installed (apt-get install nginx; .ci/run installs it)")
    www = tmp_path / "www"
    paths = _doc_sources(www, (("web", 20, 200, 400), ("code", 50, 400, 200)))
    server = Nginx(str(www), str(tmp_path / "nginx"))
    try:
        w = {"web": 0.7, "code": 0.3}
        kw = dict(batch_size=4, seq_len=256, packing="document", shuffle=True, seed=1)
        remote = stoker.Dataset(f"{server.url}/code", cache_dir=tmp_path / "cache")
        mixed = stoker.Loader(stoker.Mix({"web": stoker.TokenDataset(paths["web"]),
                                          "code": stoker.TokenDataset(remote)}, weights=w), **kw)
        local = stoker.Loader(stoker.Mix({n: stoker.TokenDataset(p) for n, p in paths.items()},
                                         weights=w), **kw)
        got, want = run(mixed, 1), run(local, 1)
        assert len(got) == len(want) == len(mixed) > 10
        for g, x in zip(got, want, strict=True):
            assert all(torch.equal(g[k], x[k]) for k in g)
        assert set(torch.cat([b["source"] for b in got]).tolist()) == {0, 1}
        assert server.requests("/code/") > 0
        st = mixed.stats()["sources"]
        assert "network" not in st["web"] and st["code"]["network"]["bytes_downloaded"] > 0
    finally:
        server.stop()


@pytest.mark.parametrize("kwargs", [dict(batch_size=4, seq_len=128, packing="document"),
                                    dict(max_tokens=1024)])
def test_token_mixture_same_batches_for_any_thread_count(tmp_path, kwargs):
    paths = _doc_sources(tmp_path, (("long", 60, 120, 200), ("short", 3, 30, 1500)))
    mix = stoker.Mix({n: stoker.TokenDataset(p) for n, p in paths.items()},
                     weights={"long": 0.3, "short": 0.7})
    runs = [run(stoker.Loader(mix, shuffle=True, seed=4, num_threads=t, **kwargs), 1)
            for t in (1, 3)]
    assert len(runs[0]) == len(runs[1]) > 10
    for x, y in zip(*runs, strict=True):
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_sources_with_token_fields(tmp_path):
    """Record datasets with a stoker.tokens field mix as token sources when the loader
    makes token batches, as one such dataset does: the same batches as their
    TokenDatasets, weights in tokens by default."""
    paths = _doc_sources(tmp_path, (("long", 60, 120, 200), ("short", 3, 30, 1500)))
    w = {"long": 0.3, "short": 0.7}
    as_records = stoker.Mix({n: stoker.Dataset(p) for n, p in paths.items()}, weights=w,
                            tokens_per_epoch=30_000)
    assert not as_records.tokens and as_records.weights_unit == "samples"
    assert as_records.as_tokens().weights_unit == "tokens"
    as_tokens = stoker.Mix({n: stoker.TokenDataset(p) for n, p in paths.items()}, weights=w,
                           tokens_per_epoch=30_000)
    kw = dict(batch_size=4, seq_len=128, packing="document", shuffle=True, seed=3)
    got = stoker.Loader(as_records, **kw)
    assert got.dataset.tokens and got.stats()["sources"]["long"]["weight"] == 0.3
    x, y = run(got, 0), run(stoker.Loader(as_tokens, **kw), 0)
    assert len(x) == len(y) > 10
    for a, b in zip(x, y, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
    copy = pickle.loads(pickle.dumps(got))
    assert len(run(copy, 0)) == len(x)
    # read as records, token counts mean nothing
    with pytest.raises(ValueError, match="apply to token batches"):
        stoker.Loader(as_records, batch_size=4)
    samples = stoker.Mix({n: stoker.Dataset(p) for n, p in paths.items()}, weights=w,
                         weights_unit="samples")
    assert stoker.Loader(samples, **kw).dataset.weights_unit == "samples"
    assert len(next(iter(stoker.Loader(stoker.Mix(samples.datasets, weights=w),
                                       batch_size=4)))["tokens"]) == 4


def test_batch_map_takes_mixed_batches(labelled):
    """batch_map= runs on each mixed batch (its 'source' included), in order, with the same
    batches as without it; map= and collate_fn= take one dataset and say so."""
    mix = stoker.Mix(labelled, weights={"a": 0.5, "b": 0.3, "c": 0.2}, samples_per_epoch=60)
    kw = dict(batch_size=6, shuffle=True, seed=11, num_threads=2)

    def tag(batch, rng):
        batch["from_c"] = batch["source"] == 2
        return batch

    plain = run(stoker.Loader(mix, **kw), 0)
    mapped = run(stoker.Loader(mix, batch_map=tag, **kw), 0)
    assert len(mapped) == len(plain) == 10
    for m, p in zip(mapped, plain, strict=True):
        assert all(torch.equal(m[k], p[k]) for k in p)
        assert torch.equal(m["from_c"], p["source"] == 2)
    with pytest.raises(ValueError, match="map= and collate_fn= take samples of one"):
        stoker.Loader(mix, map=lambda s, rng: s, **kw)
    with pytest.raises(ValueError, match="map= and collate_fn= take samples of one"):
        stoker.Loader(mix, collate_fn=list, **kw)


def _scene_png(arr):
    import io

    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """Two sources of images with a mask, the mask's box and its class rows: source a has
    6 samples with one box each, source b 20 with two (the second a fixed corner box)."""
    root = tmp_path_factory.mktemp("mixscenes")
    fields = {"image": stoker.image(), "mask": stoker.image(mode="L"), "boxes": stoker.boxes(),
              "classes": stoker.ndarray("int64", (None,)), "label": stoker.scalar("int64")}
    out = {}
    for s, (n, size) in enumerate((("a", 6), ("b", 20))):
        with stoker.ShardWriter(root / n, fields, shard_size="8KB") as w:
            for i in range(size):
                rng = np.random.default_rng(100 * s + i)
                img = rng.integers(40, 120, (24, 32, 3), dtype=np.uint8)
                mask = np.zeros((24, 32), np.uint8)
                x1, y1 = int(rng.integers(6, 12)), int(rng.integers(2, 8))
                x2, y2 = int(rng.integers(16, 30)), int(rng.integers(12, 22))
                img[y1:y2, x1:x2] = [220, 30, 30]
                mask[y1:y2, x1:x2] = 3
                boxes = [[x1, y1, x2, y2]] + [[0, 0, 5, 4]] * s
                w.write({"image": _scene_png(img), "mask": _scene_png(mask),
                         "boxes": np.array(boxes, np.float32),
                         "classes": np.array([3] + [1] * s, np.int64), "label": i % 5})
        out[n] = stoker.Dataset(root / n)
    return out


def test_record_mixture_with_a_transform_group_and_mixup(scenes):
    """A mixture's rows go through a transform group (each row's draws keyed by its own
    occurrence), pad_values and MixUp (keyed by the batch, not by a dataset index that
    several sources share): the same batches for 1 and 2 threads, and an exact resume."""
    from stoker import ops as T
    mix = stoker.Mix(scenes, weights={"a": 1, "b": 1}, samples_per_epoch=24)
    kw = dict(batch_size=6, shuffle=True, seed=7,
              transforms={("image", "mask", "boxes", "classes"):
                          [T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3, 0.05)]},
              pad_values={"classes": -1}, batch_transforms=[T.MixUp(0.8, num_classes=5)])

    def load(threads, epochs=(0, 1), state=None, stop=None):
        loader = stoker.Loader(mix, num_threads=threads, **kw)
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for e in epochs:
            if state is None:
                loader.set_epoch(e)
            for b in loader:
                out.append({k: v.numpy().copy() for k, v in b.items()})
                if stop is not None and len(out) == stop:
                    return out, loader.state_dict()
        return out, None

    one, _ = load(1)
    two, _ = load(2)
    assert len(one) == 8
    for a, b in zip(one, two, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    mixed = 0
    for b in one:
        src = b["source"]
        assert sorted(np.bincount(src, minlength=2)) == [3, 3]
        # pad_values reached the mixture: source a's one class row padded with -1
        lengths = b["classes_lengths"]
        np.testing.assert_array_equal(lengths, 1 + src)
        for i in range(len(src)):
            assert (b["classes"][i, lengths[i]:] == -1).all()
            # the group's one flip moved the mask and its box together
            ys, xs = np.nonzero(b["mask"][i, 0])
            np.testing.assert_array_equal(b["boxes"][i, 0],
                                          [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
        # MixUp: soft labels, rows blended with the row before
        assert b["label"].shape == (6, 5) and b["label"].dtype == np.float32
        np.testing.assert_allclose(b["label"].sum(1), 1, atol=1e-6)
        mixed += int(((b["label"] > 0).sum(1) == 2).any())
    assert mixed > 0
    # source a (6 samples) is read twice in an epoch of 12 of its rows: each occurrence
    # draws its own flip (keyed by the occurrence, not the index), so its 12 masks are
    # more than its 6 samples' (a sample's mask and its mirror image)
    masks = {b["mask"][i].tobytes() for b in one[:4] for i in np.flatnonzero(b["source"] == 0)}
    assert 6 < len(masks) <= 12
    # MixUp keyed by the batch: in order, batches 0 and 2 both begin with source a's samples
    # 0, 1, 2 (labels 0, 1, 2; a is read twice an epoch), yet mix with their own lam (row 1
    # holds lam at its own class, row 0's class the rest)
    ordered = list(stoker.Loader(mix, num_threads=2, **dict(kw, shuffle=False)))
    for b in (ordered[0], ordered[2]):
        assert b["source"][:3].tolist() == [0, 0, 0]
        assert b["label"][1, 1] + b["label"][1, 0] == pytest.approx(1)
    assert ordered[0]["label"][1, 1] != ordered[2]["label"][1, 1]
    head, state = load(2, epochs=(0,), stop=3)
    rest, _ = load(1, epochs=(0,), state=state)
    assert len(head) + len(rest) == 4
    for a, b in zip(head + rest, one[:4], strict=True):  # epoch 0 of the two in `one`
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
