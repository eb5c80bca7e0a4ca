"""The public token API through the loader: ``stoker.Loader(ds, seq_len=..., packing=...,
token_dtype=..., max_tokens=...)``, its batch keys, len, epochs, state_dict and ranks."""

import numpy as np
import pytest
import stoker
import torch
from test_tokens import random_docs, write_token_dataset


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("tl")
    return write_token_dataset(root / "ds", random_docs(400, 300, seed=3), shard_size="64KB")


def batches(loader):
    return [{k: v.clone() for k, v in b.items()} for b in loader]


@pytest.mark.parametrize("kwargs, keys", [
    (dict(batch_size=8, seq_len=64), {"input_ids", "labels"}),
    (dict(batch_size=8, seq_len=64, packing="concat"),
     {"input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen", "loss_mask"}),
    (dict(batch_size=8, seq_len=64, packing="document"),
     {"input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen", "loss_mask"}),
    (dict(max_tokens=2048), {"input_ids", "labels", "loss_mask", "attention_mask"}),
])
def test_keys_dtypes_len(ds, kwargs, keys):
    Loader = stoker.Loader
    for token_dtype, want in (("int64", torch.int64), ("int32", torch.int32)):
        loader = Loader(ds, shuffle=True, seed=0, token_dtype=token_dtype, **kwargs)
        got = batches(loader)
        assert len(got) == len(loader) > 0
        for b in got:
            assert set(b) == keys
            assert b["input_ids"].dtype == want and b["labels"].dtype == want
            if "cu_seqlens" in b:
                assert b["cu_seqlens"].dtype == torch.int32
                assert b["position_ids"].dtype == want and b["loss_mask"].dtype == torch.bool
            if "seq_len" in kwargs:
                assert b["input_ids"].shape[1] == kwargs["seq_len"]
            else:
                assert b["input_ids"].numel() <= kwargs["max_tokens"]


@pytest.mark.parametrize("kwargs", [
    dict(batch_size=8, seq_len=64),
    dict(batch_size=4, seq_len=128, packing="document"),
    dict(max_tokens=1500, pad_to_multiple_of=32),
])
def test_epochs_and_resume(ds, kwargs):
    Loader = stoker.Loader
    loader = Loader(ds, shuffle=True, seed=7, **kwargs)
    e0 = batches(loader)
    e1 = batches(loader)  # the next epoch: another order
    assert len(e0) == len(e1)
    assert any(not torch.equal(a["input_ids"], b["input_ids"]) or
               a["input_ids"].shape != b["input_ids"].shape for a, b in zip(e0, e1, strict=True))
    loader.set_epoch(0)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(e0, loader, strict=True))
    # stop mid-epoch, save, resume in a new loader: the rest of the epoch, exactly
    for stop in (1, len(e0) // 2, len(e0) - 1):
        loader = Loader(ds, shuffle=True, seed=7, **kwargs)
        loader.set_epoch(0)
        it = iter(loader)
        for _ in range(stop):
            next(it)
        state = loader.state_dict()
        fresh = Loader(ds, shuffle=True, seed=7, **kwargs)
        fresh.load_state_dict(state)
        rest = batches(fresh)
        assert len(rest) == len(e0) - stop
        for a, b in zip(rest, e0[stop:], strict=True):
            for k in a:
                assert torch.equal(a[k], b[k]), k


def test_ranks_share_the_epoch(ds):
    Loader = stoker.Loader
    seen = []
    lengths = set()
    for rank in range(3):
        loader = Loader(ds, batch_size=4, seq_len=64, packing="concat", shuffle=True, seed=1,
                        rank=rank, world_size=3, drop_last=True)
        got = batches(loader)
        lengths.add(len(got))
        seen += [tuple(r.tolist()) for b in got for r in b["input_ids"]]
    assert len(lengths) == 1                       # every rank the same number of batches
    assert len(seen) == len(set(seen))             # disjoint rows
    single = batches(Loader(ds, batch_size=4, seq_len=64, packing="concat"))
    rows = {tuple(r.tolist()) for b in single for r in b["input_ids"]}
    assert set(seen) <= rows and len(rows) - len(seen) < 3 * 4


@pytest.mark.parametrize("kwargs", [
    dict(batch_size=4, seq_len=64),
    dict(batch_size=5, seq_len=64, packing="concat"),
    dict(batch_size=4, seq_len=128, packing="document"),
    dict(batch_size=3, seq_len=128, packing="document"),  # 479 rows: rank 2 ends empty
])
def test_even_batches_false_gives_every_row_to_one_rank(ds, kwargs):
    """Evaluation at world size 3: every row of the epoch on exactly one rank, none
    repeated to pad, every rank the same number of batches (its last ones short, or
    empty), num_samples what the rank yields; resuming mid-epoch keeps all of it."""
    Loader = stoker.Loader
    single = batches(Loader(ds, shuffle=True, seed=4, **kwargs))  # packing follows the seed
    rows = sorted(tuple(r.tolist()) for b in single for r in b["input_ids"])
    assert len(rows) % 3 != 0  # so the default (even_batches=True) would repeat rows
    seen, lengths, empty = [], set(), False
    for rank in range(3):
        loader = Loader(ds, rank=rank, world_size=3, even_batches=False, shuffle=True, seed=4,
                        **kwargs)
        got = batches(loader)
        lengths.add((len(got), len(loader)))
        mine = [tuple(r.tolist()) for b in got for r in b["input_ids"]]
        assert len(mine) == loader.num_samples
        assert all(len(b["input_ids"]) <= kwargs["batch_size"] for b in got)
        last = got[-1]
        assert last["input_ids"].shape[1:] == (kwargs["seq_len"],)
        assert all(v.shape[:1] == last["input_ids"].shape[:1]
                   for k, v in last.items() if k not in ("cu_seqlens", "max_seqlen"))
        if "cu_seqlens" in last:
            assert int(last["cu_seqlens"][-1]) == last["input_ids"].numel()
        empty = empty or len(last["input_ids"]) == 0
        seen += mine
    assert len(lengths) == 1 and lengths.pop()[0] == len(Loader(ds, world_size=3, **kwargs))
    assert sorted(seen) == rows
    assert empty == (kwargs["batch_size"] == 3)
    padded = [tuple(r.tolist()) for rank in range(3)
              for b in Loader(ds, rank=rank, world_size=3, shuffle=True, seed=4, **kwargs)
              for r in b["input_ids"]]
    assert len(padded) > len(rows)  # the default pads by wrapping around
    # a state saved after 2 batches of every rank resumes at world size 2, still exactly
    first = [Loader(ds, rank=r, world_size=3, even_batches=False, shuffle=True, seed=4,
                    **kwargs) for r in range(3)]
    its = [iter(loader) for loader in first]
    head = [tuple(r.tolist()) for it in its for _ in range(2) for r in next(it)["input_ids"]]
    state = first[0].state_dict()
    rest = []
    for rank in range(2):
        loader = Loader(ds, rank=rank, world_size=2, even_batches=False, shuffle=True, seed=4,
                        **kwargs)
        loader.load_state_dict(state)
        rest += [tuple(r.tolist()) for b in batches(loader) for r in b["input_ids"]]
    assert sorted(head + rest) == rows


def test_even_batches_false_refused_for_token_budgets(ds):
    with pytest.raises(ValueError, match="even_batches=False does not apply to max_tokens"):
        stoker.Loader(ds, max_tokens=2048, even_batches=False)


def test_stats_pad_fraction(ds):
    Loader = stoker.Loader
    loader = Loader(ds, batch_size=4, seq_len=128, packing="document", shuffle=True)
    for b in loader:  # loss_mask is exactly where labels are targets
        assert torch.equal(b["loss_mask"], b["labels"] != -100)
    total = sum(b["input_ids"].numel() for b in loader)
    pad_positions = 0
    for b in loader:
        cu = b["cu_seqlens"].long()
        for a, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
            flat = b["input_ids"].view(-1)[a:e]
            if not b["loss_mask"].view(-1)[a:e].any() and e % 128 == 0 and (flat == 0).all() \
                    and e - a < 128:
                pad_positions += e - a
    assert loader.stats()["pad_fraction"] == pytest.approx(pad_positions / total, abs=0.01)


def test_bad_arguments(ds):
    Loader = stoker.Loader
    with pytest.raises(ValueError, match="packing must be"):
        Loader(ds, batch_size=4, seq_len=64, packing="best")
    with pytest.raises(ValueError, match="token_dtype must be"):
        Loader(ds, batch_size=4, seq_len=64, token_dtype="float32")
    with pytest.raises(ValueError, match="seq_len does not apply with max_tokens"):
        Loader(ds, seq_len=64, max_tokens=1000)
    np.testing.assert_array_equal(stoker.TokenDataset(ds.paths[0])[0], ds[0])
