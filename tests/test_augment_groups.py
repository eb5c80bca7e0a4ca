"""Transform groups (an image with its mask, boxes and class rows; csrc/geometry/transform_group)
against references of the definitions: torchvision's kernels in NumPy
(tests/augment_reference.py) and Pillow, one sample at a time through a private binding.

Tolerances: geometry of pixels as in test_augment_kernels.py (nearest: < 1% of pixels differ,
from float32 grids); the letterbox's resize is the antialiased triangle of stoker's Resize,
held to Pillow's BILINEAR within 2 levels; boxes to 1e-3 pixel.
"""


import augment_reference as ref
import numpy as np
import pytest
from conftest import native_testing, png
from PIL import Image
from stoker import ops as T

_testing = native_testing()  # the test-only entry points (tests/ext/)


def scene(h=48, w=64, seed=0):
    """A noisy image with a bright rectangle, its mask (label 3) and box (xyxy)."""
    rng = np.random.default_rng(seed)
    img = rng.integers(40, 120, (h, w, 3), dtype=np.uint8)
    mask = np.zeros((h, w), np.uint8)
    x1, y1, x2, y2 = w // 4, h // 3, 3 * w // 4, 5 * h // 6
    img[y1:y2, x1:x2] = [220, 30, 30]
    mask[y1:y2, x1:x2] = 3
    box = np.array([[x1, y1, x2, y2], [0, 0, 4, 4]], np.float32)
    return img, mask, box


def group(img, mask=None, boxes=None, classes=None, ops=(), seed=0, **kw):
    return _testing.augment_group(png(img), None if mask is None else png(mask), boxes,
                               classes=classes,
                               ops=T.op_specs(list(ops)), seed=seed, **kw)


def test_letterbox_matches_pillow_resize_and_pad():
    img, mask, boxes = scene(30, 40)
    out = group(img, mask, boxes, np.array([5, 6]), [T.Letterbox(64)])
    # 40 x 30 -> 64 x 48, 8 rows above and below
    want = np.full((64, 64, 3), 114, np.uint8)
    want[8:56] = np.asarray(Image.fromarray(img).resize((64, 48), Image.BILINEAR))
    d = np.abs(out["image"].astype(int) - want)
    assert d.max() <= 2 and (d > 0).mean() < 0.05
    assert (out["mask"][:8] == 0).all() and (out["mask"][56:] == 0).all()
    r = 64 / 40
    np.testing.assert_allclose(out["boxes"], boxes * r + [0, 8, 0, 8], atol=1e-3)
    assert out["classes"].tolist() == [5, 6]


@pytest.mark.parametrize("before", [[], [T.RandomHorizontalFlip(p=1.0)]])
@pytest.mark.parametrize("pad", [[0, 8, 0, 8], [5, 0, 3, 2]])
def test_a_frame_around_a_resize_equals_framing_the_resized_pixels(before, pad):
    """A constant-fill window around all of a pending resize (Letterbox) runs the resize
    straight into the framed image; RandomRotation(0) (a nearest warp by the identity, the
    same pixels) in between makes the window copy the resized pixels instead: same bytes,
    and boxes the same."""
    img, mask, boxes = scene(30, 40)
    ops = before + [T.Resize((48, 64))]
    frame = [T.Pad(pad, fill=(114, 20, 200))]
    fast = group(img, mask, boxes, np.array([5, 6]), ops + frame)
    slow = group(img, mask, boxes, np.array([5, 6]), ops + [T.RandomRotation(0)] + frame)
    for key in ("image", "mask", "boxes", "classes"):
        np.testing.assert_array_equal(fast[key], slow[key])
    assert fast["image"].shape == (48 + pad[1] + pad[3], 64 + pad[0] + pad[2], 3)


@pytest.mark.parametrize("frame", [
    [T.Letterbox(64)],                                  # rows of 114 above and below
    [T.Letterbox((40, 64), fill=0)],                    # zeros: the lazy window
    [T.Pad([3, 1, 4, 2], fill=(9, 8, 7))],
    [T.RandomCrop(32, padding=6, fill=(200, 10, 10))],  # a frame on some sides, or none
    [T.RandomCrop(10, padding=30, fill=(90, 20, 50))],  # often no content at all
    [T.Pad(5, fill=(1, 2, 3)), T.RandomHorizontalFlip(p=1.0)],
    [T.RandomHorizontalFlip(p=1.0), T.Pad([3, 1, 9, 2], fill=0)],  # a mirrored lazy window
    [T.RandomHorizontalFlip(p=1.0), T.Pad([3, 1, 9, 2], fill=(5, 250, 5))],
])
def test_hsv_on_a_framed_image_equals_hsv_on_every_pixel(frame):
    """After a window with a constant fill, HSVJitter maps the content and the fill colour
    once (then repaints the frame): the same bytes as mapping every pixel. Pad(0) between
    them (a window inside the image) makes the second run map every pixel."""
    img, _, _ = scene(30, 40)
    hsv = [T.HSVJitter(0.5, 0.7, 0.4), T.HSVJitter(0.1, 0.2, 0.3)]
    changed = 0
    for seed in range(12):
        fast = group(img, ops=frame + hsv, seed=seed)["image"]
        full = group(img, ops=frame + [T.Pad(0)] + hsv, seed=seed)["image"]
        np.testing.assert_array_equal(fast, full)
        changed += not np.array_equal(fast, group(img, ops=frame, seed=seed)["image"])
    assert changed == 12


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
def test_pad_matches_numpy(mode):
    img, _, _ = scene(20, 24)
    out = group(img, ops=[T.Pad([3, 1, 4, 2], fill=(9, 8, 7), padding_mode=mode)])["image"]
    want = ref.pad_window(img, -3, -1, 24 + 7, 20 + 3, mode)
    if mode == "constant":
        want[:1], want[-2:], want[:, :3], want[:, -4:] = ([9, 8, 7],) * 4
    np.testing.assert_array_equal(out, want)


def test_random_crop_with_padding_is_a_uniform_window_of_the_padded_image():
    img, _, _ = scene(32, 32)
    padded = np.pad(img, ((4, 4), (4, 4), (0, 0)))
    seen = {}
    for seed in range(900):
        out = group(img, ops=[T.RandomCrop(32, padding=4)],
                    seed=seed)["image"]
        hits = [(y, x) for y in range(9) for x in range(9)
                if np.array_equal(padded[y:y + 32, x:x + 32], out)]
        assert len(hits) >= 1
        seen[hits[0]] = seen.get(hits[0], 0) + 1
    assert len(seen) == 81
    counts = np.array(list(seen.values()))
    chi2 = ((counts - 900 / 81) ** 2 / (900 / 81)).sum()
    assert chi2 < 124  # 80 degrees of freedom, p = 0.001


def test_random_crop_pad_if_needed_and_too_small():
    img, _, _ = scene(10, 12)
    out = group(img, ops=[T.RandomCrop((14, 12), pad_if_needed=True)])
    assert out["image"].shape == (14, 12, 3)
    with pytest.raises(Exception, match="larger than the image"):
        group(img, ops=[T.RandomCrop((14, 12))])


@pytest.mark.parametrize("angle", [-25.0, 12.5, 90.0])
def test_rotation_moves_image_mask_and_boxes_together(angle):
    img, mask, boxes = scene(48, 48)
    out = group(img, mask, boxes, np.array([1, 2]),
                [T.RandomRotation((angle, angle))])
    want = ref.rotate_image(img, angle, "nearest", [0])
    assert (out["image"] != want).any(-1).mean() < 0.01
    want_mask = ref.rotate_image(mask, angle, "nearest", [0])
    assert (out["mask"] != want_mask).mean() < 0.01
    fwd = ref.forward_affine_matrix((24, 24), -angle, (0, 0), 1.0, (0.0, 0.0))
    clipped, moved, _, _ = ref.boxes_left(boxes.astype(np.float64), 48, 48,
                                          [("warp", *fwd.ravel(), 48, 48)])
    keep = ref.keep_boxes(clipped, moved, 0.0, 0.0, 0.0)
    np.testing.assert_allclose(out["boxes"], clipped[keep], atol=1e-3)
    assert out["classes"].tolist() == [c for c, k in zip([1, 2], keep) if k]


def test_affine_matches_torchvision_affine():
    img, mask, _ = scene(40, 56)
    op = T.RandomAffine((17.0, 17.0), scale=(1.2, 1.2), shear=(6.0, 6.0),
                        interpolation="bilinear", fill=(20, 40, 60), mask_fill=255)
    out = group(img, mask, ops=[op])
    want = ref.affine_image(img, 17.0, [0, 0], 1.2, [6.0, 0.0], "bilinear", [20, 40, 60])
    d = np.abs(out["image"].astype(int) - want)
    assert d.max() <= 1 and (d > 0).mean() < 0.02
    want_mask = ref.affine_image(mask, 17.0, [0, 0], 1.2, [6.0, 0.0], "nearest", [255])
    assert (out["mask"] != want_mask).mean() < 0.01
    assert set(np.unique(out["mask"])) <= {0, 3, 255}


def test_classic_crop_flip_resize_keep_masks_and_boxes_aligned():
    img, mask, boxes = scene(60, 80)
    ops = [T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.RandomVerticalFlip()]
    for seed in range(30):
        out = group(img, mask, boxes[:1], np.array([3]), ops, seed=seed)
        lab = out["mask"] == 3
        if not lab.any():
            continue
        ys, xs = np.nonzero(lab)
        b = out["boxes"][0]
        assert xs.min() + 0.5 >= b[0] - 1 and xs.max() + 0.5 <= b[2] + 1
        assert ys.min() + 0.5 >= b[1] - 1 and ys.max() + 0.5 <= b[3] + 1
        red = (out["image"][..., 0] > 150) & (out["image"][..., 1] < 90)
        assert (red & lab).sum() >= 0.8 * lab.sum()


def test_draws_depend_on_the_seed_only():
    img, mask, boxes = scene()
    ops = [T.RandomResizedCrop(32), T.ColorJitter(brightness=0.5, hue=0.1),
           T.RandomRotation(30)]
    a = group(img, mask, boxes, ops=ops, seed=11)
    b = group(img, mask, boxes, ops=ops, seed=11)
    c = group(img, mask, boxes, ops=ops, seed=12)
    for k in ("image", "mask", "boxes"):
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["image"], c["image"])
    # The image does not depend on which targets come with it.
    alone = group(img, ops=ops, seed=11)
    np.testing.assert_array_equal(alone["image"], a["image"])


def test_boxes_filtered_by_visibility_drop_their_classes():
    img, mask, boxes = scene(40, 40)
    out = group(img, mask, boxes, np.array([7, 8]), [T.CenterCrop((40, 12)),
                T.SanitizeBoundingBoxes(min_visibility=0.2)])
    # CenterCrop(40, 12) keeps columns 14..26: box 0 (10..30) keeps 12/20, box 1 none
    assert out["classes"].tolist() == [7]
    np.testing.assert_allclose(out["boxes"], [[0, 13, 12, 33]], atol=1e-3)
    out = group(img, mask, boxes, np.array([7, 8]), [T.CenterCrop((40, 12)),
                T.SanitizeBoundingBoxes(min_visibility=0.7)])
    assert out["classes"].tolist() == [] and out["boxes"].shape == (0, 4)


def test_normalize_then_erasing_on_the_output():
    img, _, _ = scene(32, 32)
    ops = [T.Normalize([0.5] * 3, [0.25] * 3), T.RandomErasing(1.0)]
    out = group(img, ops=ops, seed=4)["image"]
    assert out.dtype == np.float32
    x = (img.astype(np.float32) / 255 - 0.5) / 0.25
    erased = (out == 0).all(-1) & (x != 0).any(-1)
    ys, xs = np.nonzero(erased)
    assert erased.sum() > 0
    np.testing.assert_array_equal(erased[ys.min():ys.max() + 1, xs.min():xs.max() + 1], True)
    keep = ~erased
    np.testing.assert_allclose(out[keep], x[keep], rtol=1e-6, atol=1e-6)
    noisy = group(img, ops=[ops[0], T.RandomErasing(1.0, value="random")],
                  seed=4)["image"]
    inside = noisy[ys.min():ys.max() + 1, xs.min():xs.max() + 1]
    assert abs(float(inside.mean())) < 0.3 and 0.7 < float(inside.std()) < 1.3


@pytest.mark.parametrize("ops, match", [
    ([T.RandAugment()], "masks, boxes and keypoints cannot follow"),
    ([T.Pad(1, padding_mode="reflect")], "padding_mode"),
    ([T.RandomRotation((0, 5), expand=True)], "expand=True"),
    ([T.Normalize([0] * 3, [1] * 3), T.CenterCrop(4)], "Normalize must be the last op"),
    ([T.Pad(1, mask_fill=255), T.RandomRotation((0, 1))], "different values"),
])
def test_groups_refuse_what_cannot_apply(ops, match):
    img, mask, _ = scene()
    with pytest.raises(ValueError, match=match):
        group(img, mask, ops=ops)


def test_mask_sizes_must_match_the_image():
    img, _, _ = scene(20, 20)
    with pytest.raises(Exception, match="mask 'mask' is 10x10 but 'image' is 20x20"):
        group(img, np.zeros((10, 10), np.uint8))


@pytest.mark.parametrize("warp", [T.RandomAffine(20, translate=(0.1, 0.1), scale=(0.6, 1.4),
                                                 interpolation="bilinear", fill=114),
                                  T.RandomRotation(30, fill=9),
                                  T.RandomPerspective(0.4, p=1.0, fill=(1, 2, 3))])
def test_a_crop_inside_a_warp_makes_the_warp_write_only_the_crop(warp):
    """NOTE [ Lazy warps ]: a crop right after a warp folds into it, the same bytes as
    warping the whole image and cropping, for the image, its mask and its boxes."""
    img, mask, boxes = scene(60, 80)
    classes = np.array([1, 2])
    for seed in range(5):
        whole = group(img, mask, boxes, classes, [warp], seed=seed)
        crop = group(img, mask, boxes, classes, [warp, T.CenterCrop((30, 40))], seed=seed)
        np.testing.assert_array_equal(crop["image"], whole["image"][15:45, 20:60])
        np.testing.assert_array_equal(crop["mask"], whole["mask"][15:45, 20:60])
        # a crop past the edges is not folded: padding, not the warp's fill
        past = group(img, mask, boxes, classes, [warp, T.CenterCrop((70, 80))], seed=seed)
        assert (past["image"][:5] == 0).all() and (past["image"][-5:] == 0).all()
