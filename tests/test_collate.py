"""Native batching of Python outputs (stoker/_stage/collate.py): default_collate's structure,
layouts inferred or declared, padding with lengths, scalars, object lists, and the errors
for samples that disagree."""

import numpy as np
import pytest
import stoker
import torch
from stoker._stage.collate import BatchLayout, tensors_of


def batch(layout, samples, where="sample {}"):
    rows = [layout.check(s, where.format(i)) for i, s in enumerate(samples)]
    specs, nbytes = layout.plan(rows)
    buf = np.full(nbytes + 7, 0xAB, np.uint8)  # garbage: padding must be written
    objects = layout.write(rows, specs, buf)
    return layout.assemble(tensors_of(buf, specs), objects), specs


def test_fixed_arrays_scalars_and_objects_as_default_collate():
    layout = BatchLayout()
    samples = [{"img": np.full((2, 3), i, np.uint8), "label": i, "w": float(i) / 2,
                "flag": i % 2 == 0, "f32": np.float32(i), "t": torch.full((4,), i),
                "path": f"img{i}.jpg", "raw": bytes([i]), "meta": {"i": i}}
               for i in range(5)]
    out, specs = batch(layout, samples)
    ref = torch.utils.data.default_collate(samples)
    for k in ("img", "label", "w", "flag", "f32", "t"):
        assert out[k].dtype == ref[k].dtype, k
        assert torch.equal(out[k], ref[k]), k
    assert out["path"] == ref["path"] == [s["path"] for s in samples]
    assert out["raw"] == ref["raw"]
    assert torch.equal(out["meta"]["i"], ref["meta"]["i"])  # a nested dict, batched
    assert [s.offset % 64 for s in specs] == [0] * len(specs)
    assert list(out) == ["img", "label", "w", "flag", "f32", "t", "path", "raw", "meta"]


def test_variable_leading_dim_padded_with_lengths():
    layout = BatchLayout({"boxes": stoker.ndarray("float32", (None, 4)),
                          "cls": stoker.ndarray("int64", (None,))})
    samples = [{"boxes": np.arange(4 * n, dtype=np.float32).reshape(n, 4),
                "cls": np.arange(n), "img": np.zeros((2, 2), np.uint8)} for n in (2, 0, 3)]
    out, _ = batch(layout, samples)
    assert out["boxes"].shape == (3, 3, 4) and out["cls"].shape == (3, 3)
    assert out["boxes_lengths"].tolist() == [2, 0, 3]
    assert out["cls_lengths"].dtype == torch.int64
    for i, s in enumerate(samples):
        n = len(s["cls"])
        assert np.array_equal(out["boxes"][i, :n].numpy(), s["boxes"])
        assert not out["boxes"][i, n:].any() and not out["cls"][i, n:].any()


@pytest.mark.parametrize("tail, longest", [((), 5), ((4,), 5), ((2, 3), 5), ((4,), 0),
                                           ((1024,), 5)])
def test_padded_rows_match_a_row_by_row_reference(tail, longest):
    """Small rows go in by one masked copy for the batch, large ones (here 1024 x 4 bytes
    a row on average) row by row: both give each row, zeros after it, and its length,
    over garbage, for rows of every length, all full, and all empty."""
    rng = np.random.default_rng(len(tail) + longest)
    for lengths in ([0, longest, 1, longest // 2, 0, 3], [longest] * 4, [0] * 3,
                    list(rng.integers(0, longest + 1, 9))):
        lengths = [min(int(n), longest) for n in lengths]
        layout = BatchLayout({"x": stoker.ndarray("float32", (None,) + tail)})
        samples = [{"x": rng.standard_normal((n,) + tail).astype(np.float32)}
                   for n in lengths]
        out, _ = batch(layout, samples)
        width = max(lengths)
        assert out["x"].shape == (len(lengths), width) + tail
        assert out["x_lengths"].tolist() == lengths
        for i, s in enumerate(samples):
            want = np.zeros((width,) + tail, np.float32)
            want[:lengths[i]] = s["x"]
            assert np.array_equal(out["x"][i].numpy(), want), (lengths, i)


def test_blob_declared_batches_as_padded_bytes():
    layout = BatchLayout({"raw": stoker.blob()})
    out, _ = batch(layout, [{"raw": b"ab"}, {"raw": b"xyz"}])
    assert out["raw"].tolist() == [[97, 98, 0], [120, 121, 122]]
    assert out["raw_lengths"].tolist() == [2, 3]


def test_declared_object_and_scalar_types():
    layout = BatchLayout({"name": str, "y": stoker.scalar("int32")})
    out, _ = batch(layout, [{"name": "a", "y": 1}, {"name": "b", "y": np.int32(7)}])
    assert out["name"] == ["a", "b"] and out["y"].dtype == torch.int32
    assert out["y"].tolist() == [1, 7]
    with pytest.raises(ValueError, match="int64 scalar"):
        batch(layout, [{"name": "a", "y": np.int64(1)}])
    with pytest.raises(ValueError, match="float64 scalar"):
        batch(BatchLayout({"y": stoker.scalar("int32")}), [{"y": 1.5}])
    with pytest.raises(TypeError, match="map_fields"):
        BatchLayout({"x": stoker.image()})
    with pytest.raises(TypeError, match="map_fields"):
        BatchLayout({"x": "float32"})


def test_bfloat16_tensors():
    layout = BatchLayout()
    samples = [{"x": torch.full((3,), i, dtype=torch.bfloat16), "s": torch.tensor(
        float(i), dtype=torch.bfloat16)} for i in range(4)]
    out, _ = batch(layout, samples)
    assert out["x"].dtype == torch.bfloat16 and out["x"].shape == (4, 3)
    assert torch.equal(out["x"], torch.stack([s["x"] for s in samples]))
    assert torch.equal(out["s"], torch.stack([s["s"] for s in samples]))


def test_tuple_keys_keep_their_type():
    layout = BatchLayout(what="dataset item")
    out, specs = batch(layout, [{0: np.ones(2, np.float32), 1: 3}, {0: np.zeros(2, np.float32),
                                                                   1: 4}])
    assert list(out) == [0, 1] and out[1].tolist() == [3, 4]
    assert [s.name for s in specs] == ["0", "1"]


def test_later_sample_with_another_shape_names_sample_field_and_shapes():
    layout = BatchLayout()
    layout.check((np.zeros((3, 4), np.float32), 1), "sample 10")
    with pytest.raises(ValueError) as e:
        layout.check((np.zeros((5, 4), np.float32), 1), "sample 17 (dataset index 17)")
    msg = str(e.value)
    assert "sample 17" in msg and "field 0" in msg and "(5, 4)" in msg and "(3, 4)" in msg
    assert "inferred from sample 10" in msg
    assert "stoker.ndarray('float32', (None, 4))" in msg  # says how to declare it
    with pytest.raises(ValueError, match=r"field 0 has dtype float64.*float32"):
        layout.check((np.zeros((3, 4)), 1), "sample 2")
    # a dict's value whose first dimension varies is padded where it does
    layout = BatchLayout()
    out, _ = batch(layout, [{"b": np.ones((n, 4), np.float32)} for n in (3, 5)])
    assert out["b"].shape == (2, 5, 4) and out["b_lengths"].tolist() == [3, 5]


def test_keys_must_agree():
    layout = BatchLayout()
    layout.check({"a": 1, "b": 2}, "sample 0")
    with pytest.raises(ValueError, match=r"sample 3.*has key\(s\) 'c'.*lacks key\(s\) 'b'"):
        layout.check({"a": 1, "c": 2}, "sample 3")
    with pytest.raises(ValueError, match="declares"):
        BatchLayout({"b": stoker.scalar("int64")}).check({"a": 1}, "sample 0")
    layout = BatchLayout()
    layout.check({"x": {"y": 1}}, "sample 0")
    with pytest.raises(TypeError, match=r"sample 4: \['x'\] of the map output is a list, "
                                        r"where sample 0 has a dict"):
        layout.check({"x": [1]}, "sample 4")


@pytest.mark.parametrize("value", [
    np.arange(16, dtype=np.float32).reshape(4, 4)[:, ::2],  # a view
    torch.arange(16.0).view(4, 4).t(),                      # pil_to_tensor-like strides
    np.array([1, "x"], dtype=object),                       # a list of them
    torch.full((2,), 1 + 2j, dtype=torch.complex64),        # stacked by torch
    np.full(2, 3 - 1j, np.complex64),
])
def test_values_batched_as_default_collate(value):
    samples = [{"x": value}, {"x": value}]
    out, _ = batch(BatchLayout(), samples)
    if isinstance(value, np.ndarray) and value.dtype == object:
        assert all(a is value for a in out["x"])  # default_collate refuses these
        return
    ref = torch.utils.data.default_collate(samples)
    assert out["x"].dtype == ref["x"].dtype and torch.equal(out["x"], ref["x"])


def test_values_that_cannot_be_batched():
    with pytest.raises(ValueError, match="tensor on meta") as e:
        BatchLayout().check({"x": torch.zeros(2, device="meta")}, "sample 5")
    assert "sample 5" in str(e.value) and "'x'" in str(e.value)


def test_structures_as_default_collate():
    for samples in ([[1, 2.0], [3, 4.0]], [(np.int8(1), "a"), (np.int8(2), "b")],
                    [torch.ones(2), torch.zeros(2)], [7, 8]):
        out, _ = batch(BatchLayout(), samples)
        ref = torch.utils.data.default_collate(samples)
        assert type(out) is type(ref)
        if isinstance(ref, torch.Tensor):
            assert torch.equal(out, ref)
        else:
            for a, b in zip(out, ref, strict=True):
                assert a == b if isinstance(b, tuple) else torch.equal(a, b)


def test_empty_batch_after_layout():
    layout = BatchLayout({"v": stoker.ndarray("int32", (None,))})
    layout.check({"v": np.ones(3, np.int32), "x": np.ones(2)}, "sample 0")
    out, _ = batch(layout, [])
    assert out["v"].shape == (0, 0) and out["x"].shape == (0, 2) and out["v_lengths"].shape == (0,)


def test_name_clashes():
    with pytest.raises(ValueError, match="same name '0'"):
        BatchLayout().check({0: 1, "0": 2}, "sample 0")
    with pytest.raises(ValueError, match="'v_lengths'"):
        BatchLayout({"v": stoker.ndarray("int32", (None,))}).check(
            {"v": np.ones(1, np.int32), "v_lengths": 1}, "sample 0")
