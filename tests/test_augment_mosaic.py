"""Mosaic (NOTE [ Mosaic ] in csrc/geometry/transform_group.cpp): four samples, the other
three drawn by the sample's own draws and read by the loader's workers, placed as
ultralytics places them around a random centre, with their masks, boxes, keypoints and
class rows; the same batches for any thread count and after a resume.

Each sample of the dataset is one flat colour of its own, its mask its own label, one box
over all of it (its class: the sample's index) and a keypoint at its centre: in a mosaic,
the region of a colour is the tile of that sample, which its mask, box and keypoint must
describe."""

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



@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("mosaic") / "ds"
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


GROUP = ("image", "mask", "boxes", "classes", "kps")


def load(ds, ops, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("num_threads", 2)
    return list(stoker.Loader(ds, transforms={GROUP: ops}, pad_values={"classes": -1}, **kw))


def regions(img):
    """Per sample index: the pixels showing its colour (exactly: a mosaic without a warp
    resizes flat colours, which stay flat)."""
    out = {}
    for i, c in enumerate(COLOURS):
        hit = (img == np.array(c, np.uint8)).all(-1)
        if hit.any():
            out[i] = hit
    return out


def check_sample(batch, b, size):
    img = batch["image"][b].permute(1, 2, 0).numpy()
    mask = batch["mask"][b, 0].numpy()
    n = int(batch["boxes_lengths"][b])
    boxes = batch["boxes"][b, :n].numpy()
    classes = batch["classes"][b, :n].numpy()
    kps = batch["kps"][b, :n].numpy()
    assert img.shape == (2 * size, 2 * size, 3)
    seen = regions(img)
    shown = np.zeros(mask.shape, bool)
    for i, hit in seen.items():
        # the mask labels the tile's pixels with the sample's label, and nothing else
        assert (mask[hit] == i + 1).all()
        assert ((mask == i + 1) == hit).all()
        shown |= hit
    assert ((mask == 0) == ~shown).all()                      # mask_fill where no tile is
    assert (img[~shown] == 114).all()                         # the canvas' fill
    # every sample shown has its box (two, if the draw took it twice), nothing else has one
    assert set(classes.tolist()) == set(seen)
    for i, hit in seen.items():
        ys, xs = np.nonzero(hit)
        mine = boxes[classes == i]
        lo, hi = mine[:, :2].min(0), mine[:, 2:].max(0)
        np.testing.assert_allclose([*lo, *hi], [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1],
                                   atol=1e-4)
        for (x1, y1, x2, y2), (px, py, v) in zip(mine, kps[classes == i][:, 0]):
            assert hit[int(y1):int(y2), int(x1):int(x2)].all()  # each box on its tile
            if v:
                assert hit[int(round(py)), int(round(px))]
    return seen


def test_four_samples_placed_as_ultralytics_places_them(ds):
    """Each output: the sample's own tile ends at the centre (its bottom-right corner), the
    three others start there; every target sits on its tile."""
    batches = load(ds, [T.Mosaic(32)], shuffle=True, seed=1)
    tiles = 0
    for batch in batches:
        for b in range(batch["image"].shape[0]):
            seen = check_sample(batch, b, 32)
            own = int(batch["classes"][b, 0])  # the sample's rows come first
            tiles += len(seen)
            if (batch["classes"][b] == own).sum() > 1:
                continue  # the draw took the sample itself again: its colour twice
            ys, xs = np.nonzero(seen[own])
            yc, xc = ys.max() + 1, xs.max() + 1
            assert 16 <= xc <= 48 and 16 <= yc <= 48
            for i, hit in seen.items():
                if i != own and (batch["classes"][b] == i).sum() == 1:
                    ys, xs = np.nonzero(hit)
                    assert xs.min() >= xc or ys.min() >= yc
    assert tiles > 2 * N  # most samples show more than two tiles


def test_mosaic_then_warp_crop_and_flip_keep_targets_on_their_tiles(ds):
    ops = [T.Mosaic(32), T.RandomAffine(10, translate=(0.1, 0.1), scale=(0.5, 1.5),
                                        interpolation="nearest", fill=114, mask_fill=0),
           T.CenterCrop(32), T.RandomHorizontalFlip()]
    for batch in load(ds, ops, shuffle=True, seed=2):
        for b in range(batch["image"].shape[0]):
            img = batch["image"][b].permute(1, 2, 0).numpy()
            mask = batch["mask"][b, 0].numpy()
            n = int(batch["boxes_lengths"][b])
            classes = batch["classes"][b, :n].numpy()
            seen = regions(img)
            for i, hit in seen.items():
                # nearest warps: the mask and the image agree but on a few edge pixels
                assert ((mask == i + 1) != hit).sum() <= 0.1 * hit.sum() + 8
                if hit.sum() > 30:
                    assert i in classes.tolist()
            boxes = batch["boxes"][b, :n].numpy()
            for (x1, y1, x2, y2), c in zip(boxes, classes, strict=True):
                assert c in seen or (x2 - x1) * (y2 - y1) < 30
            for c, hit in seen.items():  # the boxes of c (two if drawn twice) hold its tiles
                mine = boxes[classes == c]
                if len(mine):
                    ys, xs = np.nonzero(hit)
                    assert xs.min() >= mine[:, 0].min() - 1.5
                    assert xs.max() + 1 <= mine[:, 2].max() + 1.5
                    assert ys.min() >= mine[:, 1].min() - 1.5
                    assert ys.max() + 1 <= mine[:, 3].max() + 1.5


def test_mosaics_are_the_same_for_any_thread_count_and_resume_exactly(ds):
    ops = [T.Mosaic((24, 32)), T.RandomAffine(5, scale=(0.8, 1.2)), T.Resize((40, 48))]

    one = same_for_threads_and_resume(lambda threads: stoker.Loader(
        ds, batch_size=4, shuffle=True, seed=3, num_threads=threads, transforms={GROUP: ops}))
    assert len(one) == N // 4
    # the partners are the sample's own draws: other epochs, other mosaics
    again = list(stoker.Loader(ds, batch_size=4, shuffle=True, seed=4, num_threads=2,
                               transforms={GROUP: ops}))
    assert any(not np.array_equal(a["image"], b["image"].numpy())
               for a, b in zip(one, again, strict=True))


def test_mosaic_is_first_and_runs_in_the_loaders_workers(ds):
    with pytest.raises(ValueError, match="Mosaic must be the first op"):
        stoker.Loader(ds, batch_size=2, transforms={GROUP: [T.RandomHorizontalFlip(),
                                                            T.Mosaic(32)]})
    with pytest.raises(ValueError, match="map= and ds.sample do not run it"):
        stoker.Loader(ds, batch_size=2, transforms={GROUP: [T.Mosaic(32)]},
                      map=lambda s, rng: s)

def test_an_image_alone_takes_a_mosaic(tmp_path):
    with stoker.ShardWriter(tmp_path / "ds", {"image": stoker.image()}) as w:
        for i in range(6):
            img = np.empty(SIZES[i] + (3,), np.uint8)
            img[:] = COLOURS[i]
            w.write({"image": png(img)})
    only = stoker.Dataset(tmp_path / "ds")
    b = next(iter(stoker.Loader(only, batch_size=2, transforms={"image": [T.Mosaic(16)]})))
    assert b["image"].shape == (2, 3, 32, 32)
    assert len(regions(b["image"][0].permute(1, 2, 0).numpy())) >= 2


def test_painting_only_what_the_warp_reads_gives_the_same_bytes(tmp_path):
    # An affine warp then a centre crop read a part of the canvas, which alone is painted
    # (csrc/geometry/mosaic_canvas.h); a vertical flip that never flips between them
    # (p=0: the same draws, the warp still cropped) keeps the whole canvas painted.
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    with stoker.ShardWriter(tmp_path / "ds", {"image": stoker.image(),
                                              "boxes": stoker.boxes()}) as w:
        for _ in range(12):
            h, wd = int(rng.integers(20, 90)), int(rng.integers(20, 90))
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (h, wd, 3), np.uint8)).save(buf, "JPEG")
            w.write({"image": buf.getvalue(), "boxes": [[1, 2, wd - 3, h - 1]]})
    textured = stoker.Dataset(tmp_path / "ds")
    for warp in (T.RandomAffine(10, translate=(0.1, 0.1), scale=(0.5, 1.5), shear=5,
                                interpolation="bilinear", fill=114),
                 T.RandomRotation(30, interpolation="bilinear", fill=114)):
        runs = []
        for between in ([], [T.RandomVerticalFlip(p=0.0)]):
            ops = [T.Mosaic(40), warp, *between, T.CenterCrop(40)]
            runs.append(list(stoker.Loader(textured, batch_size=4, shuffle=True, seed=1,
                                           num_threads=2, transforms={("image", "boxes"): ops})))
        for a, b in zip(*runs, strict=True):
            assert (a["image"] == b["image"]).all()
            assert (a["boxes"] == b["boxes"]).all()
