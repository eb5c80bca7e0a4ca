import io

import numpy as np
import pytest
import stoker
import torch
from stoker import _core

Image = pytest.importorskip("PIL.Image", reason="Pillow is in the test extra")


def photo(h=60, w=80, seed=0):
    """A smooth, photo-like RGB image with some noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([128 + 100 * np.sin(x / 9.0 + c) * np.cos(y / 7.0 - c) for c in range(3)], -1)
    return np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)


def encode(arr_or_img, fmt, **kw):
    img = arr_or_img if isinstance(arr_or_img, Image.Image) else Image.fromarray(arr_or_img)
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def pil_rgb(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.mark.parametrize("mode", ["RGB", "L", "CMYK"])
def test_jpeg_full_decode_matches_pillow(mode):
    img = Image.fromarray(photo()).convert(mode)
    data = encode(img, "JPEG", quality=90)
    got = _core.decode_image(data)
    want = pil_rgb(data)
    assert got.shape == want.shape == (60, 80, 3)
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "I;16", "1"])
def test_png_full_decode_identical_to_pillow(mode):
    base = Image.fromarray(photo(31, 45))
    if mode == "P":
        img = base.quantize(64)
    elif mode == "I;16":
        img = Image.fromarray((photo(31, 45)[..., 0].astype(np.uint16) * 257))
    else:
        img = base.convert(mode)
    data = encode(img, "PNG")
    got = _core.decode_image(data)
    ref = Image.open(io.BytesIO(data))
    if mode == "I;16":  # Pillow keeps 16 bits in mode I; the 8-bit value is the high byte
        high = (np.asarray(ref).astype(np.uint32) >> 8).astype(np.uint8)
        want = np.repeat(high[..., None], 3, -1)
    else:
        want = np.asarray(ref.convert("RGB"))
    np.testing.assert_array_equal(got, want)


def test_chw_layout_and_flip_are_exact():
    data = encode(photo(), "PNG")
    hwc = _core.decode_image(data)
    np.testing.assert_array_equal(_core.decode_image(data, layout="CHW"), hwc.transpose(2, 0, 1))
    flipped = _core.decode_image(data, [("random_horizontal_flip", [1.0])])
    np.testing.assert_array_equal(flipped, hwc[:, ::-1])


def test_resize_and_center_crop_match_pillow():
    data = encode(photo(120, 90), "PNG")
    got = _core.decode_image(data, [op.spec() for op in
                                    [stoker.ops.Resize(50), stoker.ops.CenterCrop(40)]])
    img = Image.open(io.BytesIO(data)).convert("RGB")
    img = img.resize((50, int(50 * 120 / 90)), Image.BILINEAR)  # shorter side (w) -> 50
    top = int(round((img.height - 40) / 2.0))
    left = int(round((img.width - 40) / 2.0))
    want = np.asarray(img.crop((left, top, left + 40, top + 40)))
    assert got.shape == (40, 40, 3)
    # same triangle filter; float vs fixed-point accumulation differ by at most 1-2 levels
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 2


def test_random_resized_crop_is_deterministic_and_in_bounds():
    data = encode(photo(200, 300), "JPEG", quality=90)
    ops = [stoker.ops.RandomResizedCrop(64).spec()]
    a = _core.decode_image(data, ops, seed=5)
    assert a.shape == (64, 64, 3)
    np.testing.assert_array_equal(a, _core.decode_image(data, ops, seed=5))
    assert any(not np.array_equal(a, _core.decode_image(data, ops, seed=s)) for s in range(6, 9))


def test_normalize():
    data = encode(photo(), "PNG")
    raw = _core.decode_image(data).astype(np.float64)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    f32 = _core.decode_image(data, [stoker.ops.Normalize(mean, std).spec()])
    assert f32.dtype == np.float32
    np.testing.assert_allclose(f32, (raw / 255 - mean) / std, rtol=1e-5, atol=1e-5)
    f16 = _core.decode_image(data, [stoker.ops.Normalize(mean, std, "float16").spec()])
    assert f16.dtype == np.float16
    np.testing.assert_allclose(f16.astype(np.float32), f32, atol=4e-3)


@pytest.mark.parametrize("make, reason", [
    (lambda j, p: j[: len(j) // 2], "corrupt JPEG data"),
    (lambda j, p: p[: len(p) // 2], "corrupt PNG data"),
    (lambda j, p: b"GIF89a" + b"\0" * 20, "not a JPEG or PNG"),
    (lambda j, p: j[:2] + b"\xff\x00" * 10, "corrupt JPEG header"),
])
def test_bad_images_raise_decode_error(make, reason):
    arr = photo()
    data = make(encode(arr, "JPEG"), encode(arr, "PNG"))
    with pytest.raises(stoker.DecodeError, match=reason):
        _core.decode_image(data)


def test_pixel_limit_refuses_before_decoding():
    data = encode(photo(100, 100), "JPEG")
    with pytest.raises(stoker.DecodeError, match="above the limit of 9999"):
        _core.decode_image(data, max_pixels=9999)


def image_dataset(path, n=24, bad=()):
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(path, fields) as w:
        for i in range(n):
            data = encode(photo(40 + i, 50, seed=i), "JPEG" if i % 2 else "PNG")
            if i in bad:
                data = data[: len(data) // 3]
            w.write({"image": data, "label": i})
    return stoker.Dataset(path)


def test_loader_images_deterministic_across_threads(tmp_path):
    ds = image_dataset(tmp_path / "d")
    tf = {"image": [stoker.ops.RandomResizedCrop(32), stoker.ops.RandomHorizontalFlip()]}
    runs = []
    for threads in (1, 3):
        loader = stoker.Loader(ds, batch_size=8, shuffle=True, seed=2, num_threads=threads,
                               transforms=tf)
        runs.append([b["image"].clone() for b in loader])
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    assert runs[0][0].shape == (8, 32, 32, 3) and runs[0][0].dtype == torch.uint8


def test_loader_full_decode_equals_single_decode(tmp_path):
    fields = {"image": stoker.image(layout="CHW")}
    imgs = [encode(photo(30, 20, seed=i), "PNG") for i in range(5)]
    with stoker.ShardWriter(tmp_path / "d", fields) as w:
        for d in imgs:
            w.write({"image": d})
    b = next(iter(stoker.Loader(tmp_path / "d", batch_size=5)))
    for i, d in enumerate(imgs):
        np.testing.assert_array_equal(b["image"][i].numpy(), pil_rgb(d).transpose(2, 0, 1))


def test_images_of_different_sizes_need_a_crop(tmp_path):
    ds = image_dataset(tmp_path / "d", n=4)
    with pytest.raises(ValueError, match="different sizes"):
        list(stoker.Loader(ds, batch_size=4))
    b = next(iter(stoker.Loader(ds, batch_size=4, transforms={"image": stoker.ops.CenterCrop(30)})))
    assert b["image"].shape == (4, 30, 30, 3)


def test_corrupt_image_in_loader_names_record_or_is_skipped(tmp_path):
    ds = image_dataset(tmp_path / "d", bad=(5,))
    tf = {"image": [stoker.ops.CenterCrop(32)]}
    with pytest.raises(stoker.DecodeError, match=r"shard-00000.stk: record 5 .*field 'image'"):
        list(stoker.Loader(ds, batch_size=4, transforms=tf))
    loader = stoker.Loader(ds, batch_size=4, transforms=tf, on_error="skip")
    with pytest.warns(RuntimeWarning, match="replaced 1"):
        labels = sum((b["label"].tolist() for b in loader), [])
    assert labels[5] == 6 and loader.stats()["skipped"] == 1
