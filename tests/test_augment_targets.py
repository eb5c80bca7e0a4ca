"""Transform groups through the Loader: an image with its segmentation mask, boxes, class
rows and keypoints written to a dataset, read back in batches, held to albumentations
(OpenCV) and Pillow/NumPy doing the same work on the same samples.

Tolerances: flips and crops move pixels exactly (masks and images equal); a resized mask is
the source pixel under each output pixel's centre exactly (Pillow's NEAREST), but for a
centre that falls exactly on the edge between two source pixels (a 2x downscale), where
stoker, as Pillow, may take either, by float rounding; a resized image within 2 levels of Pillow's
BILINEAR (antialiased triangle); boxes and keypoints to 1e-3 pixel.
"""


import albumentations as A
import cv2
import numpy as np
import pytest
import stoker
from conftest import png, same_for_threads_and_resume
from PIL import Image
from stoker import ops as T


def scene(h, w, seed):
    """A noisy image with a red rectangle, its mask (label 3, the rest 0), the rectangle's
    box and a small one in the top-left corner (xyxy), their classes, and two keypoints
    per box (left then right corner of the top edge, visible)."""
    rng = np.random.default_rng(seed)
    img = rng.integers(40, 120, (h, w, 3), dtype=np.uint8)
    mask = np.zeros((h, w), np.uint8)
    x1, y1 = int(rng.integers(2, w // 3)), int(rng.integers(2, h // 3))
    x2, y2 = int(rng.integers(w // 2, w - 2)), int(rng.integers(h // 2, h - 2))
    img[y1:y2, x1:x2] = [220, 30, 30]
    mask[y1:y2, x1:x2] = 3
    boxes = np.array([[x1, y1, x2, y2], [0, 0, 5, 4]], np.float32)
    classes = np.array([3, 0], np.int64)
    kps = np.array([[[x1, y1, 1], [x2 - 1, y1, 1]], [[0, 0, 1], [4, 0, 1]]], np.float32)
    return img, mask, boxes, classes, kps


SIZES = [(40, 56), (48, 48), (36, 60), (44, 52), (40, 40), (52, 44)]

FIELDS = {"image": stoker.image(), "mask": stoker.image(mode="L"), "boxes": stoker.boxes(),
          "classes": stoker.ndarray("int64", (None,)), "kps": stoker.keypoints(2),
          "label": stoker.scalar("int64")}


@pytest.fixture(scope="module")
def scenes():
    return [scene(h, w, i) for i, (h, w) in enumerate(SIZES * 2)]


@pytest.fixture(scope="module")
def ds(scenes, tmp_path_factory):
    path = tmp_path_factory.mktemp("targets") / "ds"
    with stoker.ShardWriter(path, FIELDS, shard_size="32KB") as w:
        for i, (img, mask, boxes, classes, kps) in enumerate(scenes):
            w.write({"image": png(img), "mask": png(mask), "boxes": boxes,
                     "classes": classes, "kps": kps, "label": i % 5})
    return stoker.Dataset(path)


def rows(batch, name, i):
    """Sample i's rows of a variable-length field, by its lengths."""
    return batch[name][i, :int(batch[f"{name}_lengths"][i])].numpy()


def hwc(x):
    """A batch entry as (H, W, C) or (H, W): the loader delivers NCHW shapes."""
    x = x.numpy()
    return x.transpose(1, 2, 0) if x.ndim == 3 and x.shape[0] == 3 else x.squeeze(0)


def load(ds, ops, fields=("image", "mask", "boxes", "classes", "kps"), **kw):
    kw.setdefault("batch_size", 4)
    loader = stoker.Loader(ds, num_threads=2, transforms={tuple(fields): ops}, **kw)
    return list(loader)


def test_flip_and_crop_move_image_mask_boxes_keypoints_as_albumentations(ds, scenes):
    ops = [T.RandomHorizontalFlip(1.0), T.RandomVerticalFlip(1.0), T.CenterCrop((32, 36))]
    ref = A.Compose([A.HorizontalFlip(p=1), A.VerticalFlip(p=1), A.CenterCrop(32, 36)],
                    bbox_params=A.BboxParams(format="pascal_voc", label_fields=["classes"],
                                             min_area=1.0),
                    keypoint_params=A.KeypointParams(format="xy", remove_invisible=False))
    n = 0
    for batch in load(ds, ops):
        assert batch["image"].shape[1:] == (3, 32, 36) and batch["mask"].shape[1:] == (1, 32, 36)
        for i in range(batch["image"].shape[0]):
            img, mask, boxes, classes, kps = scenes[n]
            n += 1
            want = ref(image=img, mask=mask, bboxes=boxes, classes=classes,
                       keypoints=kps[..., :2].reshape(-1, 2))
            np.testing.assert_array_equal(hwc(batch["image"][i]), want["image"])
            np.testing.assert_array_equal(hwc(batch["mask"][i]), want["mask"])
            np.testing.assert_allclose(rows(batch, "boxes", i), want["bboxes"], atol=1e-3)
            assert rows(batch, "classes", i).tolist() == list(want["classes"])
            # the keypoints of the kept boxes follow, pixel indices (x -> w - 1 - x);
            # albumentations moves every keypoint, stoker keeps those of the kept boxes
            got = rows(batch, "kps", i)
            keep = [classes.tolist().index(c) for c in want["classes"]]
            want_kp = want["keypoints"].reshape(2, 2, 2)[keep]
            inside = (want_kp[..., 0] >= 0) & (want_kp[..., 0] <= 35) & \
                (want_kp[..., 1] >= 0) & (want_kp[..., 1] <= 31)
            np.testing.assert_allclose(got[..., :2][inside], want_kp[inside], atol=1e-3)
            np.testing.assert_array_equal(got[..., 2], inside.astype(np.float32))
    assert n == len(scenes)


def test_resize_interpolates_the_image_and_takes_the_nearest_mask_label(ds, scenes):
    batches = load(ds, [T.Resize((24, 30))])
    n = 0
    for batch in batches:
        for i in range(batch["image"].shape[0]):
            img, mask, *_ = scenes[n]
            n += 1
            want = np.asarray(Image.fromarray(img).resize((30, 24), Image.BILINEAR))
            d = np.abs(hwc(batch["image"][i]).astype(int) - want)
            assert d.max() <= 2
            got = hwc(batch["mask"][i])
            assert set(np.unique(got)) <= {0, 3}   # labels, never blends of them
            # the centre of output pixel i lies at (2i + 1) * size / (2 * out) in the
            # source, in exact integers: an edge between two pixels when it divides
            h, w = mask.shape
            num_y, num_x = (2 * np.arange(24) + 1) * h, (2 * np.arange(30) + 1) * w
            lo_y, lo_x = num_y // 48 - (num_y % 48 == 0), num_x // 60 - (num_x % 60 == 0)
            hi_y, hi_x = num_y // 48, num_x // 60
            pil = np.asarray(Image.fromarray(mask).resize((30, 24), Image.NEAREST))
            # off the edges, exactly Pillow's; on one, either neighbour (float rounding)
            np.testing.assert_array_equal(
                (got == mask[lo_y][:, lo_x]) | (got == mask[hi_y][:, hi_x]), True)
            no_tie = np.outer(num_y % 48 != 0, num_x % 60 != 0)
            np.testing.assert_array_equal(got[no_tie], pil[no_tie])


def test_random_geometry_keeps_every_target_on_its_object(ds):
    """RandomResizedCrop + flips + rotation: one set of draws per sample moves the red
    rectangle, its mask and its box together; boxes the crop leaves are dropped with
    their classes, the rest padded with pad_values."""
    ops = [T.RandomResizedCrop(32, scale=(0.3, 1.0)), T.RandomHorizontalFlip(),
           T.RandomRotation(10), T.SanitizeBoundingBoxes(min_size=1, min_visibility=0.3)]
    kept = dropped = 0
    for epoch in range(3):
        loader = stoker.Loader(ds, batch_size=6, shuffle=True, seed=epoch, num_threads=2,
                               transforms={("image", "mask", "boxes", "classes", "kps"): ops},
                               pad_values={"classes": -1})
        for batch in loader:
            for i in range(batch["image"].shape[0]):
                n = int(batch["classes_lengths"][i])
                assert int(batch["boxes_lengths"][i]) == n
                assert (batch["classes"][i, n:] == -1).all()
                classes = rows(batch, "classes", i)
                img, lab = hwc(batch["image"][i]), hwc(batch["mask"][i]) == 3
                red = (img[..., 0] > 150) & (img[..., 1] < 90)
                if lab.sum() > 20:
                    assert (red & lab).sum() >= 0.8 * lab.sum()
                kept += n
                dropped += 2 - n
                if 3 in classes.tolist() and lab.sum() > 20:
                    b = rows(batch, "boxes", i)[classes.tolist().index(3)]
                    ys, xs = np.nonzero(lab)
                    # the rotated rectangle's enclosing box holds its mask pixels
                    assert xs.min() + 0.5 >= b[0] - 1.5 and xs.max() + 0.5 <= b[2] + 1.5
                    assert ys.min() + 0.5 >= b[1] - 1.5 and ys.max() + 0.5 <= b[3] + 1.5
    assert kept > 0 and dropped > 0


def test_boxes_dropped_with_their_rows_as_albumentations_min_visibility(ds, scenes):
    ops = [T.RandomCrop((20, 24)), T.SanitizeBoundingBoxes(min_size=0, min_area=0,
                                                           min_visibility=0.25)]
    batches = load(ds, ops, batch_size=1, pad_values={"classes": -1})
    for batch, (img, _, boxes, classes, _) in zip(batches, scenes, strict=True):
        i = 0
        out = hwc(batch["image"][i])
        # where the random crop fell: the window of the original that the output equals
        hits = [(y, x) for y in range(img.shape[0] - 19) for x in range(img.shape[1] - 23)
                if np.array_equal(img[y:y + 20, x:x + 24], out)]
        assert hits
        y, x = hits[0]
        ref = A.Compose([A.Crop(x, y, x + 24, y + 20)],
                        bbox_params=A.BboxParams(format="pascal_voc", label_fields=["classes"],
                                                 min_visibility=0.25))
        want = ref(image=img, bboxes=boxes, classes=classes)
        np.testing.assert_allclose(rows(batch, "boxes", i), np.reshape(want["bboxes"], (-1, 4)),
                                   atol=1e-3)
        assert rows(batch, "classes", i).tolist() == list(want["classes"])


def test_keypoints_flip_pairs_keep_left_and_right(ds, scenes):
    flip = [T.RandomHorizontalFlip(1.0, flip_pairs=[(0, 1)])]
    batches = load(ds, flip, batch_size=1)
    for batch, (img, _, _, _, kps) in zip(batches, scenes, strict=True):
        i, w = 0, img.shape[1]
        got = rows(batch, "kps", i)
        want = kps.copy()
        want[..., 0] = w - 1 - want[..., 0]
        want = want[:, ::-1]             # keypoint 0 (left) is now the flipped right one
        np.testing.assert_allclose(got, want, atol=1e-3)
        assert got[0, 0, 0] < got[0, 1, 0]   # the left keypoint stays on the left


@pytest.fixture(scope="module")
def yolo(tmp_path_factory):
    """Images of several aspect ratios with YOLO labels (cxcywh, normalised)."""
    path = tmp_path_factory.mktemp("yolo") / "ds"
    fields = {"image": stoker.image(), "boxes": stoker.boxes("cxcywh", normalized=True),
              "classes": stoker.ndarray("int64", (None,))}
    samples = []
    rng = np.random.default_rng(7)
    with stoker.ShardWriter(path, fields) as w:
        for h, w_ in [(30, 40), (40, 20), (32, 32), (20, 80), (48, 36), (64, 48)]:
            img = np.asarray(Image.fromarray(
                rng.integers(0, 255, (h // 4, w_ // 4, 3), dtype=np.uint8)).resize(
                    (w_, h), Image.BICUBIC))
            c = rng.uniform(0.25, 0.75, (3, 2))
            s = rng.uniform(0.05, 0.4, (3, 2))
            boxes = np.concatenate([c, s], 1).astype(np.float32)
            classes = rng.integers(0, 80, 3)
            samples.append((img, boxes, classes))
            w.write({"image": png(img), "boxes": boxes, "classes": classes})
    return stoker.Dataset(path), samples


def test_letterbox_matches_yolo_resize_and_pad(yolo):
    ds, samples = yolo
    batch = load(ds, [T.Letterbox(64)], fields=("image", "boxes", "classes"), batch_size=6)[0]
    assert batch["image"].shape == (6, 3, 64, 64)
    for i, (img, boxes, classes) in enumerate(samples):
        h, w = img.shape[:2]
        r = min(64 / h, 64 / w)
        nh, nw = round(h * r), round(w * r)
        top, left = (64 - nh) // 2, (64 - nw) // 2
        out = hwc(batch["image"][i])
        pad = np.ones((64, 64), bool)
        pad[top:top + nh, left:left + nw] = False
        assert (out[pad] == 114).all()
        # the image: stoker's resize (Pillow's BILINEAR) in the middle of the gray
        inner = np.asarray(Image.fromarray(img).resize((nw, nh), Image.BILINEAR))
        assert np.abs(out[top:top + nh, left:left + nw].astype(int) - inner).max() <= 2
        # the boxes: albumentations' letterbox (the longer side to 64, padded to the centre)
        ref = A.Compose([A.LongestMaxSize(64, interpolation=cv2.INTER_LINEAR),
                         A.PadIfNeeded(64, 64, position="center",
                                       border_mode=cv2.BORDER_CONSTANT, fill=114)],
                        bbox_params=A.BboxParams(format="yolo", label_fields=["classes"]))
        want = ref(image=img, bboxes=boxes, classes=classes)
        assert want["image"].shape == (64, 64, 3)
        np.testing.assert_allclose(rows(batch, "boxes", i), want["bboxes"], atol=1e-3 / 64)
        assert rows(batch, "classes", i).tolist() == list(want["classes"])


def test_groups_are_the_same_for_any_thread_count_and_resume_exactly(ds):
    ops = [T.RandomResizedCrop(32), T.RandomHorizontalFlip(flip_pairs=[(0, 1)]),
           T.ColorJitter(0.3, 0.3, 0.3, 0.05), T.RandomAffine(8, translate=(0.1, 0.1)),
           T.SanitizeBoundingBoxes()]

    one = same_for_threads_and_resume(lambda threads: stoker.Loader(
        ds, batch_size=4, shuffle=True, seed=3, num_threads=threads,
        transforms={("image", "mask", "boxes", "classes", "kps"): ops},
        pad_values={"classes": -1}))
    assert len(one) == 3


@pytest.mark.parametrize("transforms, match", [
    ({("mask",): [T.ColorJitter(0.5)]}, "colour|color|mask"),
    ({("image", "label"): [T.RandomHorizontalFlip()]}, "no geometry to follow"),
    ({("image", "mask", "boxes", "classes", "kps"): [T.RandAugment()]}, "cannot follow"),
    ({("image", "classes"): [T.SanitizeBoundingBoxes()]}, "boxes"),
    ({("image", "nope"): [T.RandomHorizontalFlip()]}, "no field 'nope'"),
    ({"boxes": [T.RandomHorizontalFlip()]}, "not an image field"),
])
def test_groups_that_cannot_apply_are_refused_at_loader(ds, transforms, match):
    with pytest.raises(ValueError, match=match):
        stoker.Loader(ds, batch_size=2, transforms=transforms)


def test_pad_values_are_checked(ds):
    with pytest.raises(ValueError, match="not a variable-length"):
        stoker.Loader(ds, batch_size=2, pad_values={"label": -1})
    with pytest.raises(ValueError, match="does not fit"):
        stoker.Loader(ds, batch_size=2, pad_values={"classes": 0.5})


def test_a_one_channel_image_alone_is_a_mask(ds, scenes, tmp_path):
    """stoker.image(mode="L") comes as one channel with or without ops; its ops resample it
    nearest (labels, never blends) and colour ops are refused. Alone in its own key beside
    a moving image it would move by draws of its own: refused (test_augment_whole_groups)."""
    batch = next(iter(stoker.Loader(ds, batch_size=1)))
    assert batch["mask"].shape == (1, 1) + scenes[0][1].shape
    np.testing.assert_array_equal(hwc(batch["mask"][0]), scenes[0][1])
    with stoker.ShardWriter(tmp_path / "masks", {"mask": stoker.image(mode="L")}) as w:
        for _, mask, *_ in scenes[:4]:
            w.write({"mask": png(mask)})
    size = [T.Resize((24, 30))]
    masks = stoker.Dataset(tmp_path / "masks")
    batch = next(iter(stoker.Loader(masks, batch_size=4, transforms={"mask": size})))
    assert batch["mask"].shape == (4, 1, 24, 30)
    assert set(np.unique(batch["mask"].numpy())) <= {0, 3}
    with pytest.raises(ValueError, match="ColorJitter cannot apply to mask 'mask'"):
        stoker.Loader(ds, batch_size=4, transforms={"mask": [T.ColorJitter(0.5)]})
    with pytest.raises(ValueError, match="'mask' .* moves by draws of its own"):
        stoker.Loader(ds, batch_size=4, transforms={"mask": size, "image": size})
