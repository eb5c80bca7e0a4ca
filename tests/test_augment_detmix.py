"""DetectionMixUp (NOTE [ DetectionMixUp ] in csrc/geometry/detection_mixup.cpp): the
sample and another drawn by its own draws, read by the loader's workers, the other
letterboxed to the sample's size and blended in with r ~ Beta(alpha, alpha); the targets
of both; the same batches for any thread count and after a resume.

Each sample of the dataset is one flat colour of its own and one size, its mask its own
label, one box over all of it (its class: the sample's index) and a keypoint at its
centre. After a mix, a pixel is one of two values: the blend of the two colours where the
other sample lies, the blend of the sample's colour and the fill elsewhere; r is read
back from them, and the other's box, keypoint and mask must describe exactly its
pixels."""

import itertools

import numpy as np
import pytest
import stoker
from conftest import png, same_for_threads_and_resume
from stoker import ops as T

N = 16
# 16 colours far from each other and from the fill (114 gray)
COLOURS = [c for c in itertools.product((20, 120, 230), repeat=3)
           if max(abs(v - 114) for v in c) > 60][:N]
SIZES = [(20 + 7 * i % 41, 24 + 11 * i % 37) for i in range(N)]
GROUP = ("image", "mask", "boxes", "classes", "kps")


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("detmix") / "ds"
    fields = {"image": stoker.image(), "mask": stoker.image(mode="L"), "boxes": stoker.boxes(),
              "classes": stoker.ndarray("int64", (None,)), "kps": stoker.keypoints(1)}
    with stoker.ShardWriter(path, fields, shard_size="8KB") as w:
        for i, (h, wd) in enumerate(SIZES):
            img = np.empty((h, wd, 3), np.uint8)
            img[:] = COLOURS[i]
            w.write({"image": png(img), "mask": png(np.full((h, wd), i + 1, np.uint8)),
                     "boxes": [[0, 0, wd, h]], "classes": [i],
                     "kps": [[[(wd - 1) / 2, (h - 1) / 2, 2]]]})
    return stoker.Dataset(path)


def load(ds, ops, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("num_threads", 2)
    return list(stoker.Loader(ds, transforms={GROUP: ops}, pad_values={"classes": -1}, **kw))


def blend(a, b, r):
    """The mix of colour a (the sample's, weight r) and b, as the op truncates it."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return np.floor(b + (a - b) * np.float32(r)).astype(np.uint8)


def check_sample(batch, b, r_range=(0.0, 1.0)):
    """The targets of a mixed sample against its pixels; returns r (None: not mixed)."""
    img = batch["image"][b].permute(1, 2, 0).numpy()
    mask = batch["mask"][b, 0].numpy()
    n = int(batch["boxes_lengths"][b])
    boxes = batch["boxes"][b, :n].numpy()
    classes = batch["classes"][b, :n].numpy()
    kps = batch["kps"][b, :n].numpy()
    own = int(classes[0])  # the sample's rows come first
    h, w = SIZES[own]
    assert img.shape == (h, w, 3)  # the sample's size
    np.testing.assert_allclose(boxes[0], [0, 0, w, h])
    if n == 1:
        assert (img == COLOURS[own]).all() and (mask == own + 1).all()
        return None
    assert n == 2
    other = int(classes[1])
    # r: the one value that gives every pixel one of the two blends
    values = {tuple(v) for v in img.reshape(-1, 3)}
    assert 1 <= len(values) <= 2
    candidates = [r for r in np.linspace(*r_range, 4001)
                  if {tuple(blend(COLOURS[own], COLOURS[other], r)),
                      tuple(blend(COLOURS[own], (114, 114, 114), r))} >= values]
    assert candidates, (own, other, values)
    r = float(np.median(candidates))
    mixed, framed = blend(COLOURS[own], COLOURS[other], r), blend(COLOURS[own], (114,) * 3, r)
    inside = (img == mixed).all(-1)
    if (mixed == framed).all():  # r near 1, or the fill's colour: the box tells where it lies
        x1, y1, x2, y2 = boxes[1]
        inside = np.zeros((h, w), bool)
        inside[int(round(y1)):int(round(y2)), int(round(x1)):int(round(x2))] = True
    # the other's pixels: the letterbox of its size, centred
    oh, ow = SIZES[other]
    s = min(h / oh, w / ow)
    fw, fh = min(int(round(ow * s)), w), min(int(round(oh * s)), h)
    ys, xs = np.nonzero(inside)
    assert (xs.min(), ys.min()) == ((w - fw) // 2, (h - fh) // 2)
    assert (xs.max() + 1 - xs.min(), ys.max() + 1 - ys.min()) == (fw, fh)
    assert inside.sum() == fw * fh
    # its box is its pixels, its keypoint their centre
    np.testing.assert_allclose(boxes[1], [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1],
                               atol=1e-3)
    px, py, v = kps[1, 0]
    assert v == 2
    assert abs(px - (xs.min() + xs.max()) / 2) <= 0.5 + 1e-3
    assert abs(py - (ys.min() + ys.max()) / 2) <= 0.5 + 1e-3
    np.testing.assert_allclose(kps[0, 0], [(w - 1) / 2, (h - 1) / 2, 2], atol=1e-4)
    # the mask: the max of the two where the other lies, the sample's elsewhere
    assert (mask[inside] == max(own, other) + 1).all()
    assert (mask[~inside] == own + 1).all()
    return r


def test_two_samples_blended_with_their_targets_on_their_pixels(ds):
    rs = []
    for batch in load(ds, [T.DetectionMixUp()], shuffle=True, seed=1, batch_size=1):
        r = check_sample(batch, 0)
        assert r is not None  # p=1: every sample mixes
        rs.append(r)
    assert len(rs) == N
    # Beta(32, 32): r within a few of its 0.06 standard deviation of 0.5, not all equal
    assert all(0.25 < r < 0.75 for r in rs)
    assert 0.4 < np.mean(rs) < 0.6
    assert len({round(r, 2) for r in rs}) > 3


def test_alpha_spreads_r_and_p_mixes_that_share(ds):
    rs, mixed = [], 0
    for seed in range(4):  # images of their own sizes: batches of one
        for batch in load(ds, [T.DetectionMixUp(0.2, p=0.5)], shuffle=True, seed=seed,
                          batch_size=1):
            r = check_sample(batch, 0)
            if r is not None:
                mixed += 1
                rs.append(r)
    assert 16 <= mixed <= 48  # of 64, each with p=0.5
    # Beta(0.2, 0.2) puts most of r near 0 or 1
    assert sum(r < 0.1 or r > 0.9 for r in rs) > len(rs) / 2
    unmixed = load(ds, [T.DetectionMixUp(p=0.0)], batch_size=1)
    for i, batch in enumerate(unmixed):
        assert check_sample(batch, 0) is None and int(batch["classes"][0, 0]) == i


def test_mix_then_warp_crop_and_flip_keep_targets_on_their_pixels(ds):
    """A nearest warp keeps the two blends and the warp's fill (and the crop's zeros); the other
    sample's box holds its pixels and the mask labels them, but on a few edge pixels."""
    ops = [T.DetectionMixUp(8.0), T.RandomAffine(10, translate=(0.1, 0.1), scale=(0.8, 1.3),
                                                 interpolation="nearest", fill=114, mask_fill=0),
           T.CenterCrop(24), T.RandomHorizontalFlip()]
    checked = 0
    for batch in load(ds, ops, shuffle=True, seed=2):
        for b in range(batch["image"].shape[0]):
            img = batch["image"][b].permute(1, 2, 0).numpy()
            mask = batch["mask"][b, 0].numpy()
            n = int(batch["boxes_lengths"][b])
            boxes = batch["boxes"][b, :n].numpy()
            classes = batch["classes"][b, :n].tolist()
            if n < 2 or classes[0] == classes[1]:
                continue  # the other's box left the canvas, or the sample drew itself
            own, other = classes
            values = {tuple(v) for v in img.reshape(-1, 3)}
            candidates = [r for r in np.linspace(0, 1, 4001)
                          if {tuple(blend(COLOURS[own], COLOURS[other], r)),
                              tuple(blend(COLOURS[own], (114,) * 3, r)), (114,) * 3,
                              (0,) * 3} >= values]  # the crop pads with zeros
            assert candidates, (own, other, values)
            r = float(np.median(candidates))
            mixed = blend(COLOURS[own], COLOURS[other], r)
            if (mixed == blend(COLOURS[own], (114,) * 3, r)).all() or (mixed == 114).all():
                continue
            hit = (img == mixed).all(-1)
            if max(own, other) == other:
                assert ((mask == other + 1) != hit).sum() <= 0.1 * hit.sum() + 8
            else:
                assert (mask[hit] == own + 1).all() or hit.sum() < 8
            if hit.any():
                ys, xs = np.nonzero(hit)
                x1, y1, x2, y2 = boxes[1]
                assert xs.min() >= x1 - 1.5 and xs.max() + 1 <= x2 + 1.5
                assert ys.min() >= y1 - 1.5 and ys.max() + 1 <= y2 + 1.5
                checked += 1
    assert checked >= 4


def test_mixes_are_the_same_for_any_thread_count_and_resume_exactly(ds):
    ops = [T.DetectionMixUp(1.0, p=0.8), T.RandomAffine(5, scale=(0.8, 1.2)), T.Resize((40, 48))]

    one = same_for_threads_and_resume(lambda threads: stoker.Loader(
        ds, batch_size=4, shuffle=True, seed=3, num_threads=threads, transforms={GROUP: ops}))
    assert len(one) == N // 4
    assert any(int(n) == 2 for batch in one for n in batch["boxes_lengths"])
    # the partner and r are the sample's own draws: another seed, other mixes
    again = list(stoker.Loader(ds, batch_size=4, shuffle=True, seed=4, num_threads=2,
                               transforms={GROUP: ops}))
    assert any(not np.array_equal(a["image"], b["image"].numpy())
               for a, b in zip(one, again, strict=True))


def test_bad_arguments_and_places_are_refused(ds):
    for alpha in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="alpha"):
            T.DetectionMixUp(alpha)
    for p in (-0.1, 1.5):
        with pytest.raises(ValueError, match="DetectionMixUp: p must be"):
            T.DetectionMixUp(p=p)
    with pytest.raises(ValueError, match="alpha must be a number"):
        T.DetectionMixUp("32")
    with pytest.raises(ValueError, match="DetectionMixUp must be the first op"):
        stoker.Loader(ds, batch_size=2, transforms={GROUP: [T.RandomHorizontalFlip(),
                                                            T.DetectionMixUp()]})
    with pytest.raises(ValueError, match="DetectionMixUp must be the first op"):
        stoker.Loader(ds, batch_size=2, transforms={GROUP: [T.Mosaic(32), T.DetectionMixUp()]})
    with pytest.raises(ValueError, match="map= and ds.sample do not run it"):
        stoker.Loader(ds, batch_size=2, transforms={GROUP: [T.DetectionMixUp()]},
                      map=lambda s, rng: s)
    # a mask outside the group would be left unmixed
    with pytest.raises(ValueError, match="mask"):
        stoker.Loader(ds, batch_size=2, transforms={("image", "boxes", "classes", "kps"): [
            T.DetectionMixUp()]})


def test_an_image_alone_takes_a_mix(tmp_path):
    with stoker.ShardWriter(tmp_path / "ds", {"image": stoker.image()}) as w:
        for i in range(6):
            img = np.empty(SIZES[0] + (3,), np.uint8)
            img[:] = COLOURS[i]
            w.write({"image": png(img)})
    only = stoker.Dataset(tmp_path / "ds")
    b = next(iter(stoker.Loader(only, batch_size=6, transforms={"image": [T.DetectionMixUp()]})))
    assert b["image"].shape == (6, 3, *SIZES[0])
    for i in range(6):
        img = b["image"][i].permute(1, 2, 0).numpy()
        assert (img == img[0, 0]).all()  # same sizes: the other covers all of it
        assert not any((img[0, 0] == c).all() for j, c in enumerate(COLOURS[:6]) if j != i)


def test_signed_array_masks_take_the_signed_max(tmp_path):
    """An int16 mask array (labels -4..3): a mix keeps the larger label as a signed number
    (an unsigned max would keep the negative one of a pair of opposite signs)."""
    fields = {"image": stoker.image(), "mask": stoker.ndarray("int16", (12, 16)),
              "boxes": stoker.boxes(), "classes": stoker.ndarray("int64", (None,))}
    with stoker.ShardWriter(tmp_path / "ds", fields) as w:
        for i in range(8):
            img = np.empty((12, 16, 3), np.uint8)
            img[:] = COLOURS[i]
            w.write({"image": png(img), "mask": np.full((12, 16), i - 4, np.int16),
                     "boxes": [[0, 0, 16, 12]], "classes": [i]})
    arr = stoker.Dataset(tmp_path / "ds")
    opposite = 0
    for seed in range(3):
        for b in stoker.Loader(arr, batch_size=8, seed=seed, num_threads=2, transforms={
                ("image", "mask", "boxes", "classes"): [T.DetectionMixUp()]}):
            for i in range(8):
                own, other = b["classes"][i].tolist()  # same sizes: every sample mixes
                assert (b["mask"][i].numpy() == max(own, other) - 4).all()
                opposite += (own < 4) != (other < 4)
    assert opposite > 0


# ---- CopyPaste ------------------------------------------------------------------------------
# Each sample: a background and two objects (rectangles), each of its own colour, an instance
# mask (value k: box k - 1), class 10 * sample + k, a keypoint at each object's centre.

CP_N = 12
CP_SIZES = [(32 + 4 * (i % 3), 40 + 4 * (i % 4)) for i in range(CP_N)]
PALETTE = list(itertools.product((10, 70, 130, 190, 250), repeat=3))[::3][:3 * CP_N]
CP_GROUP = ("image", "instances", "boxes", "classes", "kps")


def cp_objects(i):
    """The two objects of sample i: (x1, y1, x2, y2) in pixels."""
    h, w = CP_SIZES[i]
    return [(2, 3, w // 2 - 2, h - 3), (w // 2 + 1, h // 4, w - 3, h - 2)]


def cp_colour(i, k):
    """Sample i's background (k = 0) and object colours (k = 1, 2)."""
    return PALETTE[3 * i + k]


@pytest.fixture(scope="module")
def cp_ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("copy_paste") / "ds"
    fields = {"image": stoker.image(), "instances": stoker.image(mode="L"),
              "boxes": stoker.boxes(), "classes": stoker.ndarray("int64", (None,)),
              "kps": stoker.keypoints(1)}
    with stoker.ShardWriter(path, fields, shard_size="8KB") as w:
        for i, (h, wd) in enumerate(CP_SIZES):
            img = np.empty((h, wd, 3), np.uint8)
            img[:] = cp_colour(i, 0)
            mask = np.zeros((h, wd), np.uint8)
            for k, (x1, y1, x2, y2) in enumerate(cp_objects(i), 1):
                img[y1:y2, x1:x2] = cp_colour(i, k)
                mask[y1:y2, x1:x2] = k
            w.write({"image": png(img), "instances": png(mask),
                     "boxes": cp_objects(i), "classes": [10 * i + 1, 10 * i + 2],
                     "kps": [[[(x1 + x2 - 1) / 2, (y1 + y2 - 1) / 2, 2]]
                             for x1, y1, x2, y2 in cp_objects(i)]})
    return stoker.Dataset(path)


def cp_load(ds, ops, **kw):
    kw.setdefault("batch_size", 1)
    kw.setdefault("num_threads", 2)
    return list(stoker.Loader(ds, transforms={CP_GROUP: ops}, pad_values={"classes": -1},
                              **kw))


def test_copy_paste_pastes_objects_under_their_masks_and_drops_covered_ones(cp_ds):
    drops = partial = pasted = 0
    for own, batch in enumerate(cp_load(cp_ds, [T.CopyPaste(p=1.0, occlusion=0.7)])):
        img = batch["image"][0].permute(1, 2, 0).numpy()
        mask = batch["instances"][0, 0].numpy()
        n = int(batch["boxes_lengths"][0])
        boxes = batch["boxes"][0, :n].numpy()
        classes = batch["classes"][0, :n].tolist()
        kps = batch["kps"][0, :n].numpy()
        assert img.shape[:2] == CP_SIZES[own]
        assert set(np.unique(mask).tolist()) <= set(range(n + 1))
        mine, theirs = classes[:n - 2], classes[n - 2:]        # the sample's kept objects first
        assert all(c // 10 == own for c in mine) and mine == sorted(mine)
        assert [c % 10 for c in theirs] == [1, 2]             # p=1: both objects pasted
        assert theirs[0] // 10 == theirs[1] // 10
        pasted += 2
        for k, (c, box, kp) in enumerate(zip(classes, boxes, kps, strict=True)):
            ys, xs = np.nonzero(mask == k + 1)
            assert len(ys) > 0, c
            x1, y1, x2, y2 = box
            tol = 1e-3 if k < len(mine) else 1.0              # pasted: a nearest resample
            assert xs.min() >= x1 - tol and xs.max() + 1 <= x2 + tol, (c, box)
            assert ys.min() >= y1 - tol and ys.max() + 1 <= y2 + tol, (c, box)
            if k < len(mine):  # the sample's keypoints stay as they were, covered or not
                ox1, oy1, ox2, oy2 = cp_objects(own)[c % 10 - 1]
                np.testing.assert_allclose(kp[0], [(ox1 + ox2 - 1) / 2, (oy1 + oy2 - 1) / 2, 2])
            else:
                assert x1 <= kp[0, 0] <= x2 and y1 <= kp[0, 1] <= y2 and kp[0, 2] == 2
            colour = cp_colour(c // 10, c % 10)
            shows = (img[ys, xs] == colour).all(-1)
            if k < len(mine):
                assert shows.all()                            # the sample's pixels, as they were
                # a covered object keeps the enclosing box of what its mask still shows
                np.testing.assert_allclose(box, [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1],
                                           atol=1e-3)
            else:
                assert shows.mean() > 0.5                     # its pixels (edges resampled)
        # the sample's objects: dropped when covered over 70%, else kept
        ids = np.asarray(mask)
        for o, (x1, y1, x2, y2) in enumerate(cp_objects(own), 1):
            cell = ids[y1:y2, x1:x2]
            covered = (cell > len(mine)).mean()
            if 10 * own + o in mine:
                assert covered <= 0.7
                partial += 0 < covered
            else:
                assert covered > 0.7
                drops += 1
    assert drops >= 2 and partial >= 2 and pasted == 2 * CP_N


def test_copy_paste_with_p_zero_changes_nothing(cp_ds):
    plain = cp_load(cp_ds, [])
    for a, b in zip(plain, cp_load(cp_ds, [T.CopyPaste(p=0.0)]), strict=True):
        n = int(a["boxes_lengths"][0])
        assert int(b["boxes_lengths"][0]) == n == 2
        for k in ("image", "instances"):
            np.testing.assert_array_equal(a[k].numpy(), b[k].numpy(), err_msg=k)
        for k in ("boxes", "classes", "kps"):  # the batch has room for the other's rows too
            np.testing.assert_array_equal(a[k][0, :n].numpy(), b[k][0, :n].numpy(), err_msg=k)


def test_copy_paste_is_the_same_for_any_thread_count_and_resumes_exactly(cp_ds):
    ops = [T.CopyPaste(p=0.5), T.RandomAffine(5, scale=(0.8, 1.2)), T.Resize((40, 48))]

    one = same_for_threads_and_resume(lambda threads: stoker.Loader(
        cp_ds, batch_size=3, shuffle=True, seed=5, num_threads=threads,
        transforms={CP_GROUP: ops}, pad_values={"classes": -1}))
    assert len(one) == CP_N // 3
    # some outputs hold objects of two samples (pasted ones, and the sample's kept)
    assert any(len({int(c) // 10 for c in batch["classes"][b, :int(n)]}) > 1
               for batch in one for b, n in enumerate(batch["boxes_lengths"]))


def test_copy_paste_refuses_bad_arguments_and_groups(cp_ds, tmp_path):
    for kw in ({"p": -0.5}, {"p": 1.01}, {"occlusion": 2.0}, {"occlusion": -1}):
        with pytest.raises(ValueError, match=f"CopyPaste: {next(iter(kw))} must be"):
            T.CopyPaste(**kw)
    with pytest.raises(ValueError, match="CopyPaste must be the first op"):
        stoker.Loader(cp_ds, batch_size=1, transforms={CP_GROUP: [T.Resize(32), T.CopyPaste()]})
    # the C++ group's checks, past the loader's (which would refuse the fields left out)
    with pytest.raises(ValueError, match="has no boxes field"):
        stoker.Loader(cp_ds, batch_size=1, transforms={("image", "instances"): [T.CopyPaste()]},
                      as_stored=["boxes", "classes", "kps"])
    with pytest.raises(ValueError, match="has 0 masks"):
        stoker.Loader(cp_ds, batch_size=1, transforms={("image", "boxes", "classes", "kps"): [
            T.CopyPaste()]}, as_stored=["instances"])
    fields = {"instances": stoker.image(mode="L"), "boxes": stoker.boxes()}
    with stoker.ShardWriter(tmp_path / "masks", fields) as w:
        w.write({"instances": png(np.ones((8, 8), np.uint8)), "boxes": [[0, 0, 8, 8]]})
    with pytest.raises(ValueError, match="needs an RGB image"):
        stoker.Loader(stoker.Dataset(tmp_path / "masks"), batch_size=1,
                      transforms={("instances", "boxes"): [T.CopyPaste()]})
