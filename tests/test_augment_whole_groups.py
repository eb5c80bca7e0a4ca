"""Transform groups that cannot be half declared (NOTE [ Whole groups ] in
stoker/_transform_args.py): a group that drops boxes carries every variable-length field of
the sample or is told what each is (box_rows: rows of the boxes; as_stored: not); a mask,
boxes or keypoints field outside the group of the image whose ops move pixels is refused,
naming the field, unless as_stored names it."""


import numpy as np
import pytest
import stoker
from conftest import png
from stoker import ops as T


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    """Each sample: a 48x64 image, its mask, two boxes (one in the top-left corner, one
    in the bottom-right), their classes and keypoints, and a caption (not per box)."""
    path = tmp_path_factory.mktemp("whole") / "ds"
    fields = {"image": stoker.image(), "mask": stoker.image(mode="L"), "boxes": stoker.boxes(),
              "classes": stoker.ndarray("int64", (None,)), "kps": stoker.keypoints(1),
              "caption": stoker.ndarray("int32", (None,)), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(path, fields) as w:
        for i in range(8):
            img = np.full((48, 64, 3), 90, np.uint8)
            mask = np.zeros((48, 64), np.uint8)
            img[2:14, 2:14], mask[2:14, 2:14] = (230, 30, 30), 1
            img[34:46, 50:62], mask[34:46, 50:62] = (30, 230, 30), 2
            w.write({"image": png(img), "mask": png(mask),
                     "boxes": [[2, 2, 14, 14], [50, 34, 62, 46]], "classes": [1, 2],
                     "kps": [[[8, 8, 2]], [[56, 40, 2]]], "caption": list(range(i + 1)),
                     "label": i})
    return stoker.Dataset(path)


# A quarter of the image: it keeps one of the two boxes, or parts of both.
CROP = [T.RandomCrop((24, 32))]
ALL = ("image", "mask", "boxes", "classes", "kps")


def batches(ds, transforms, **kw):
    return list(stoker.Loader(ds, batch_size=4, seed=0, num_threads=2, transforms=transforms,
                              **kw))


def test_a_group_that_drops_boxes_names_each_variable_length_field_left_out(ds):
    with pytest.raises(ValueError, match=r"'classes' is a variable-length field outside it.*"
                                         r"box_rows=\['classes'\].*as_stored=\['classes'\]"):
        stoker.Loader(ds, batch_size=2, transforms={("image", "mask", "boxes", "kps"): CROP})
    with pytest.raises(ValueError, match="'caption' is a variable-length field outside it"):
        stoker.Loader(ds, batch_size=2, transforms={ALL: CROP})
    # even with no op that moves: boxes outside the image are dropped by any group
    with pytest.raises(ValueError, match="'caption'"):
        stoker.Loader(ds, batch_size=2, transforms={ALL: [T.SanitizeBoundingBoxes()]})


def test_box_rows_are_the_field_in_the_group_and_as_stored_leaves_it(ds):
    keyed = batches(ds, {ALL: CROP}, as_stored=["caption"])
    named = batches(ds, {("image", "mask", "boxes", "kps"): CROP}, box_rows=["classes"],
                    as_stored=["caption"])
    dropped = 0
    for a, b in zip(keyed, named, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(a[k].numpy(), b[k].numpy()), k
        assert a["classes_lengths"].tolist() == a["boxes_lengths"].tolist()
        assert a["caption_lengths"].tolist() == [len(range(i + 1)) for i in a["label"].tolist()]
        dropped += int((a["boxes_lengths"] < 2).sum())
    assert dropped > 0  # the crop removed boxes, and their classes went with them
    # as stored: not per box, delivered whole although boxes were dropped
    kept = batches(ds, {("image", "mask", "boxes", "kps"): CROP},
                   as_stored=["classes", "caption"])
    assert all(b["classes_lengths"].tolist() == [2] * 4 for b in kept)


def test_box_rows_and_as_stored_are_checked(ds):
    for kw, match in [(dict(box_rows=["label"]), "'label' is not a variable-length"),
                      (dict(box_rows=["boxes"]), "'boxes' is not a variable-length"),
                      (dict(box_rows=["nope"]), "no field 'nope'"),
                      (dict(box_rows=["classes"]), "in the transforms key"),
                      (dict(as_stored=["mask"]), "in the transforms key"),
                      (dict(box_rows=["caption"], as_stored=["caption"]), "in box_rows and")]:
        with pytest.raises(ValueError, match=match):
            stoker.Loader(ds, batch_size=2, transforms={ALL: CROP},
                          **{"as_stored": ["caption"], **kw})
    with pytest.raises(ValueError, match="no transform group has boxes"):
        stoker.Loader(ds, batch_size=2, transforms={"image": [T.ColorJitter(0.1)]},
                      box_rows=["classes"])


@pytest.mark.parametrize("transforms, name, how", [
    ({"image": CROP}, "mask", "stays where it was"),
    ({("image", "mask", "boxes", "classes"): CROP}, "kps", "stays where it was"),
    ({("image", "boxes", "classes", "kps"): [T.RandomHorizontalFlip()],
      "mask": [T.RandomHorizontalFlip()]}, "mask", "moves by draws of its own"),
    ({"image": [T.RandAugment()]}, "mask", "stays where it was"),
])
def test_a_target_outside_the_group_of_its_moving_image_is_refused(ds, transforms, name, how):
    grouped = {n for k in transforms for n in (k if isinstance(k, tuple) else (k,))}
    as_stored = [n for n in ("caption", "classes") if n not in grouped]
    with pytest.raises(ValueError, match=f"'{name}' .* is not in the group of 'image'.*{how}"):
        stoker.Loader(ds, batch_size=2, transforms=transforms, as_stored=as_stored)
    # outside every key and named in as_stored, it is delivered as stored, knowingly
    if name not in grouped:
        left = [n for n in ("mask", "boxes", "kps") if n not in grouped]
        stoker.Loader(ds, batch_size=2, transforms=transforms, as_stored=as_stored + left)


def test_ops_that_move_nothing_need_no_group(ds):
    b = batches(ds, {"image": [T.ColorJitter(0.2), T.GaussianBlur(3)]})[0]
    assert b["image"].shape == (4, 3, 48, 64) and b["boxes_lengths"].tolist() == [2] * 4


def test_dataset_sample_takes_groups_and_gives_the_loaders_sample(ds):
    """ds.sample(i, transforms={group: ops}, seed=e) is sample i of epoch e of a loader with
    seed=0 and those transforms: the same draws, the same image, mask, boxes and rows."""
    transforms = {ALL: CROP}
    rows = {"as_stored": ["caption"]}
    loader = stoker.Loader(ds, batch_size=1, seed=0, transforms=transforms, **rows)
    for epoch in range(2):
        loader.set_epoch(epoch)
        for i, b in enumerate(loader):
            s = ds.sample(i, transforms, seed=epoch, **rows)
            assert s["image"].shape == (24, 32, 3) and s["mask"].shape == (24, 32, 1)
            assert np.array_equal(s["image"], b["image"][0].permute(1, 2, 0).numpy())
            assert np.array_equal(s["mask"], b["mask"][0].permute(1, 2, 0).numpy())
            n = int(b["boxes_lengths"][0])
            assert s["boxes"].shape == (n, 4) and s["kps"].shape == (n, 1, 3)
            assert np.array_equal(s["boxes"], b["boxes"][0, :n].numpy())
            assert np.array_equal(s["classes"], b["classes"][0, :n].numpy())
            assert np.array_equal(s["kps"], b["kps"][0, :n].numpy())
            assert s["caption"].tolist() == list(range(i + 1))
    with pytest.raises(ValueError, match="'caption' is a variable-length field outside it"):
        ds.sample(0, transforms)
    with pytest.raises(ValueError, match="'mask' .* is not in the group of 'image'"):
        ds.sample(0, {("image", "boxes", "classes", "kps"): CROP}, **rows)


def test_map_receives_a_group_as_ds_sample_gives_it(ds):
    """map= takes transform groups: it receives the group's fields as ds.sample gives them,
    and passing them on gives the loader's batches without map (the rows of each sample;
    the loader pads a group's rows to the longest input, map's batch to the longest
    output)."""
    kw = dict(batch_size=4, shuffle=True, seed=2, transforms={ALL: CROP}, as_stored=["caption"])
    plain = list(stoker.Loader(ds, **kw))
    mapped = list(stoker.Loader(ds, map=lambda s, rng: s, num_threads=2, **kw))
    for a, b in zip(plain, mapped, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if f"{k}_lengths" in a:
                for i, n in enumerate(a[f"{k}_lengths"].tolist()):
                    assert np.array_equal(a[k][i, :n].numpy(), b[k][i, :n].numpy()), k
                continue
            assert a[k].shape == b[k].shape, k
            assert np.array_equal(a[k].numpy(), b[k].numpy()), k
