"""The field types of targets: stoker.image(mode="L"), stoker.boxes, stoker.keypoints:
validation on write, round trips through a dataset, and batching."""


import numpy as np
import pytest
import stoker
from conftest import png
from stoker.fields import Field, schema_hash


def test_specs_round_trip_and_old_image_specs_are_unchanged():
    for f in (stoker.image(), stoker.image("CHW", mode="L"), stoker.boxes(),
              stoker.boxes("cxcywh", normalized=True), stoker.keypoints(17),
              stoker.keypoints(5, normalized=True)):
        assert Field.from_spec(f.spec()) == f
        assert repr(Field.from_spec(f.spec())) == repr(f)
    # An RGB image's spec has no mode: datasets written before modes keep their hash.
    assert stoker.image().spec() == {"kind": "image", "layout": "HWC"}
    assert schema_hash({"image": stoker.image()}) != schema_hash({"image": stoker.image(mode="L")})
    assert stoker.image(mode="L").channels == 1 and stoker.image().channels == 3
    assert stoker.boxes("xywh").spec() == {"kind": "boxes", "format": "xywh", "normalized": False}


@pytest.mark.parametrize("make, match", [
    (lambda: stoker.image(mode="RGBA"), "mode must be 'RGB' or 'L'"),
    (lambda: stoker.boxes("yolo"), "box format must be one of"),
    (lambda: stoker.boxes(normalized=1), "normalized must be True or False"),
    (lambda: stoker.keypoints(0), "positive int"),
    (lambda: stoker.keypoints(True), "positive int"),
])
def test_invalid_field_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("field, value, match", [
    (stoker.boxes(), np.zeros((2, 5)), r"\(n, 4\)"),
    (stoker.boxes(), [[0, 0, 1, np.nan]], "finite"),
    (stoker.boxes(), [[5, 0, 1, 3]], "x2 < x1"),
    (stoker.boxes("xywh"), [[5, 0, -1, 3]], "negative width"),
    (stoker.boxes(), [["a", "b", "c", "d"]], "must be numbers"),
    (stoker.boxes(), [[1, 2, 3, 4], [1, 2]], "cannot convert"),
    (stoker.keypoints(3), np.zeros((1, 2, 3)), r"\(n, 3, 3\)"),
    (stoker.keypoints(3), np.full((1, 3, 3), np.inf), "finite"),
])
def test_invalid_values_are_refused_on_write(field, value, match):
    with pytest.raises(ValueError, match=match):
        field.encode(value, "sample 0 'x'")


def test_values_round_trip_through_a_dataset(tmp_path):
    fields = {"image": stoker.image(), "mask": stoker.image(mode="L"),
              "boxes": stoker.boxes("xywh"), "classes": stoker.ndarray("int64", (None,)),
              "kp": stoker.keypoints(2)}
    rgb = np.zeros((8, 10, 3), np.uint8)
    mask = np.arange(80, dtype=np.uint8).reshape(8, 10) % 4
    samples = [
        {"boxes": [[1, 2, 3, 4], [0, 0, 10, 8]], "classes": [3, 1],
         "kp": [[[1, 1], [2, 2]], [[3, 3], [4, 4]]]},           # (n, k, 2): visible
        {"boxes": np.zeros((0, 4), np.float32), "classes": np.zeros(0, np.int64),
         "kp": np.zeros((0, 2, 3), np.float32)},                # no objects
    ]
    with stoker.ShardWriter(tmp_path / "ds", fields) as w:
        for s in samples:
            w.write({"image": png(rgb), "mask": png(mask), **s})
    ds = stoker.Dataset(tmp_path / "ds")
    assert ds.fields == fields
    np.testing.assert_array_equal(ds[0]["boxes"], [[1, 2, 3, 4], [0, 0, 10, 8]])
    assert ds[0]["boxes"].dtype == np.float32
    np.testing.assert_array_equal(ds[0]["kp"][..., 2], 2)
    assert ds[1]["boxes"].shape == (0, 4) and ds[1]["kp"].shape == (0, 2, 3)
    batch = next(iter(stoker.Loader(ds, batch_size=2)))
    assert tuple(batch["boxes"].shape) == (2, 2, 4)
    assert batch["boxes_lengths"].tolist() == [2, 0]
    assert tuple(batch["kp"].shape) == (2, 2, 2, 3)
