"""The augmentation ops through the typed op boundary and the Loader: what they compute
(held to the NumPy references of tests/augment_reference.py), the timm-style recipe end to
end, the same batches for any thread count, exact resume, and clear errors."""

import io

import augment_reference as ref
import numpy as np
import pytest
import stoker
from conftest import png
from PIL import Image
from stoker import _core, ops


def photo(h, w, seed=0):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([128 + 90 * np.sin(x / (5.0 + c) + c) * np.cos(y / 7.0)
                    + rng.normal(0, 10, (h, w)) for c in range(3)], -1)
    return np.clip(img, 0, 255).astype(np.uint8)


def decode(img, op_list, seed=0):
    return _core.decode_image(png(img), ops.op_specs(op_list), "HWC", seed)


def test_colour_ops_compute_torchvisions_definitions():
    img = photo(30, 40)
    got = decode(img, [ops.ColorJitter(brightness=(1.3, 1.3))])
    np.testing.assert_array_equal(got, ref.brightness(img, 1.3))
    got = decode(img, [ops.ColorJitter(saturation=(0.4, 0.4))])
    np.testing.assert_array_equal(got, ref.saturation(img, 0.4))
    got = decode(img, [ops.RandomGrayscale(p=1.0)])
    np.testing.assert_array_equal(got, ref.grayscale(img))
    got = decode(img, [ops.GaussianBlur(5, sigma=1.5)])
    d = np.abs(got.astype(int) - ref.gaussian_blur(img, 5, 5, 1.5, 1.5))
    assert d.max() <= 1 and (d > 0).mean() < 0.02
    # A hue shift in a random order with contrast: each factor lies in its range.
    got = decode(img, [ops.ColorJitter(contrast=(0.5, 0.5), hue=(0.1, 0.1))], seed=3)
    a = ref.hue(ref.contrast(img, 0.5), 0.1)
    b = ref.contrast(ref.hue(img, 0.1), 0.5)
    assert min(np.abs(got.astype(int) - a).max(), np.abs(got.astype(int) - b).max()) <= 1


def test_auto_augment_ops_draw_per_seed_and_keep_the_size():
    img = photo(36, 48)
    outs = [decode(img, [ops.RandAugment(2, 9)], seed=s) for s in range(12)]
    assert all(o.shape == img.shape and o.dtype == np.uint8 for o in outs)
    assert len({o.tobytes() for o in outs}) > 8   # the draws differ between samples
    np.testing.assert_array_equal(outs[0], decode(img, [ops.RandAugment(2, 9)], seed=0))
    for op in (ops.TrivialAugmentWide(), ops.AutoAugment()):
        assert decode(img, [op], seed=1).shape == img.shape


def test_random_erasing_follows_normalize():
    img = photo(32, 32)
    norm = ops.Normalize((0.5,) * 3, (0.25,) * 3)
    out = decode(img, [norm, ops.RandomErasing(p=1.0, value=-9.0)], seed=2)
    x = (img.astype(np.float32) / 255 - 0.5) / 0.25
    erased = (out == -9.0).all(-1)
    assert 0 < erased.sum() < 32 * 32
    np.testing.assert_allclose(out[~erased], x[~erased], atol=1e-6)
    noisy = decode(img, [norm, ops.RandomErasing(p=1.0, value="random")], seed=2)
    assert 0.6 < noisy[erased].std() < 1.4


@pytest.mark.parametrize("make, match", [
    (lambda: ops.RandAugment(2, 40), "magnitude must be in"),
    (lambda: ops.ColorJitter(hue=0.7), "hue must satisfy"),
    (lambda: ops.ColorJitter(brightness=-1), "non-negative"),
    (lambda: ops.GaussianBlur(4), "odd and positive"),
    (lambda: ops.RandomErasing(value="noise"), "'random'"),
    (lambda: ops.RandomGrayscale(p=2), r"\[0, 1\]"),
    (lambda: ops.HSVJitter(h=1.5), r"\[0, 1\]"),
    (lambda: ops.AutoAugment("cifar10"), "imagenet"),
])
def test_bad_arguments_are_refused_at_construction(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_erasing_must_come_after_every_other_op():
    with pytest.raises(ValueError, match="after every other op"):
        ops.op_specs([ops.RandomErasing(), ops.RandomHorizontalFlip()])
    with pytest.raises(ValueError, match="must be the last op"):
        ops.op_specs([ops.Normalize((0,) * 3, (1,) * 3), ops.RandomHorizontalFlip()])
    ops.op_specs([ops.Normalize((0,) * 3, (1,) * 3), ops.RandomErasing(), ops.RandomErasing()])


def jpeg(arr):
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture
def jpegs(tmp_path):
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(tmp_path / "ds", fields, shard_size="64KB") as w:
        for i in range(48):
            w.write({"image": jpeg(photo(60 + i % 7, 80 - i % 5, seed=i)), "label": i})
    return stoker.Dataset(tmp_path / "ds")


TIMM = [ops.RandomResizedCrop(32), ops.RandomHorizontalFlip(), ops.RandAugment(2, 9),
        ops.ColorJitter(0.2, 0.2, 0.2, 0.05), ops.Normalize((0.485, 0.456, 0.406),
                                                           (0.229, 0.224, 0.225)),
        ops.RandomErasing(0.25, value="random")]


def batches(ds, threads, **kw):
    loader = stoker.Loader(ds, batch_size=8, shuffle=True, seed=5, num_threads=threads,
                           transforms={"image": TIMM}, **kw)
    return [{k: v.numpy().copy() for k, v in b.items()} for b in loader]


def test_timm_recipe_is_the_same_for_any_thread_count(jpegs):
    one, two = batches(jpegs, 1), batches(jpegs, 2)
    assert len(one) == 6
    for a, b in zip(one, two, strict=True):
        assert a["image"].dtype == np.float32 and a["image"].size == 8 * 3 * 32 * 32
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["label"], b["label"])


def test_timm_recipe_resumes_exactly(jpegs):
    loader = stoker.Loader(jpegs, batch_size=8, shuffle=True, seed=5, num_threads=2,
                           transforms={"image": TIMM})
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = loader.state_dict()
    rest = [b["image"].numpy().copy() for b in it]
    again = stoker.Loader(jpegs, batch_size=8, shuffle=True, seed=5, num_threads=1,
                          transforms={"image": TIMM})
    again.load_state_dict(state)
    resumed = [b["image"].numpy().copy() for b in again]
    assert len(resumed) == len(rest) == 4
    for a, b in zip(rest, resumed, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
def test_pad_and_random_crop_match_numpy_pad(mode):
    img = photo(20, 24)
    got = decode(img, [ops.Pad((3, 1, 4, 2), fill=(9, 8, 7), padding_mode=mode)])
    want = ref.pad_window(img, -3, -1, 31, 23, mode)
    if mode == "constant":
        want[:1], want[-2:], want[:, :3], want[:, -4:] = ([9, 8, 7],) * 4
    np.testing.assert_array_equal(got, want)
    # RandomCrop(size, padding): a window of the padded image, the same for the same seed
    padded = ref.pad_window(img, -4, -4, 32, 28, mode)
    for seed in range(5):
        out = decode(img, [ops.RandomCrop((20, 24), padding=4, padding_mode=mode)], seed=seed)
        assert any(np.array_equal(padded[y:y + 20, x:x + 24], out)
                   for y in range(9) for x in range(9))
    with pytest.raises(ValueError, match="padding_mode must be one of"):
        ops.Pad(2, padding_mode="wrap")
