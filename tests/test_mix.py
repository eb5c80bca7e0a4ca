"""stoker.Mix: its argument checks, its weights as exact fractions, and the mixture
sampler seen from Python (csrc/sampler/mixture.h)."""

import pickle
from fractions import Fraction

import numpy as np
import pytest
import stoker
from conftest import write_dataset
from stoker import _core
from stoker.mix import rational_counts


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
        np.arange(size, dtype=np.uint16).tofile(p)
        out[n] = stoker.TokenDataset(str(p), dtype="uint16")
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
    assert all(abs(Fraction(ci, 1 << 20) - wi) < Fraction(1, 1 << 20) for ci, wi in zip(c, w))


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
    st = _core.SourceStream([10, 15], True, 0, 123)
    pos = np.arange(3 * 25, dtype=np.int64)
    out = st.map(pos)
    passes = out.reshape(3, 25)
    for p in passes:
        assert sorted(p) == list(range(25))  # no sample twice within a pass
    assert not (passes[0] == passes[1]).all()  # a fresh order each pass
