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


def pil_crop_resize(data, box, size_hw):
    """torchvision's resized_crop on a PIL image: crop, then BILINEAR (antialiased)."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    x, y, w, h = box
    img = img.crop((x, y, x + w, y + h))
    return np.asarray(img.resize((size_hw[1], size_hw[0]), Image.BILINEAR))


def absdiff(a, b):
    return np.abs(a.astype(int) - b.astype(int))


@pytest.mark.parametrize("mode, kw", [
    ("RGB", {}),
    ("RGB", {"subsampling": 0}),        # 4:4:4
    ("RGB", {"progressive": True}),
    ("L", {}),
    ("CMYK", {}),                       # Pillow writes Adobe (inverted) CMYK
])
def test_jpeg_full_decode_matches_pillow(mode, kw):
    img = Image.fromarray(photo(61, 83)).convert(mode)
    data = encode(img, "JPEG", quality=90, **kw)
    got = _core.decode_image(data)
    want = pil_rgb(data)
    assert got.shape == want.shape == (61, 83, 3) and got.dtype == np.uint8
    assert absdiff(got, want).max() <= 1


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "I;16", "1", "RGB;16", "PA"])
def test_png_full_decode_identical_to_pillow(mode):
    base = Image.fromarray(photo(31, 45))
    if mode == "P":
        img = base.quantize(64)
    elif mode == "PA":  # palette with transparency: alpha dropped, colours kept
        img = base.quantize(16)
        img.info["transparency"] = 3
    elif mode == "I;16":
        img = Image.fromarray((photo(31, 45)[..., 0].astype(np.uint16) * 257))
    else:
        img = base.convert(mode if mode != "RGB;16" else "RGB")
    data = encode(img, "PNG")
    if mode == "RGB;16":  # Pillow cannot write 16-bit RGB; build it by hand below
        data = png16_rgb(photo(31, 45))
    got = _core.decode_image(data)
    ref = Image.open(io.BytesIO(data))
    if mode == "I;16":  # Pillow keeps 16 bits in mode I; the 8-bit value is the high byte
        high = (np.asarray(ref).astype(np.uint32) >> 8).astype(np.uint8)
        want = np.repeat(high[..., None], 3, -1)
    else:
        want = np.asarray(ref.convert("RGB"))
    np.testing.assert_array_equal(got, want)


def png16_rgb(arr8):
    """A 16-bit RGB PNG whose high bytes are arr8 (low bytes 0x5A)."""
    import struct
    import zlib
    h, w, _ = arr8.shape
    px = np.empty((h, w, 3), ">u2")
    px[...] = arr8.astype(np.uint16) * 256 + 0x5A
    raw = b"".join(b"\0" + px[y].tobytes() for y in range(h))

    def chunk(tag, body):
        return (struct.pack(">I", len(body)) + tag + body
                + struct.pack(">I", zlib.crc32(tag + body) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_chw_layout_and_flip_are_exact():
    data = encode(photo(), "PNG")
    hwc = _core.decode_image(data)
    np.testing.assert_array_equal(_core.decode_image(data, layout="CHW"), hwc.transpose(2, 0, 1))
    flipped = _core.decode_image(data, stoker.ops.op_specs([stoker.ops.RandomHorizontalFlip(1.0)]))
    np.testing.assert_array_equal(flipped, hwc[:, ::-1])
    kept = _core.decode_image(data, stoker.ops.op_specs([stoker.ops.RandomHorizontalFlip(0.0)]))
    np.testing.assert_array_equal(kept, hwc)


def test_flip_is_random_with_p():
    data = encode(photo(), "PNG")
    ops = stoker.ops.op_specs([stoker.ops.RandomHorizontalFlip(0.3)])
    hwc = _core.decode_image(data)
    flips = sum(not np.array_equal(_core.decode_image(data, ops, seed=s), hwc) for s in range(400))
    assert 80 < flips < 160  # binomial(400, 0.3): mean 120, sd 9


def test_resize_and_center_crop_match_pillow():
    data = encode(photo(120, 90), "PNG")
    got = _core.decode_image(data, stoker.ops.op_specs([stoker.ops.Resize(50),
                                                      stoker.ops.CenterCrop(40)]))
    img = Image.open(io.BytesIO(data)).convert("RGB")
    img = img.resize((50, int(50 * 120 / 90)), Image.BILINEAR)  # shorter side (w) -> 50
    top = int(round((img.height - 40) / 2.0))
    left = int(round((img.width - 40) / 2.0))
    want = np.asarray(img.crop((left, top, left + 40, top + 40)))
    assert got.shape == (40, 40, 3)
    # Same triangle filter; float vs PIL's fixed-point accumulation: at most 2 levels.
    assert absdiff(got, want).max() <= 2


def test_exact_resize_and_upscale_match_pillow():
    data = encode(photo(40, 30), "PNG")
    for h, w in [(17, 23), (80, 61), (40, 30)]:
        got = _core.decode_image(data, stoker.ops.op_specs([stoker.ops.Resize((h, w))]))
        want = np.asarray(Image.open(io.BytesIO(data)).resize((w, h), Image.BILINEAR))
        assert got.shape == (h, w, 3)
        assert absdiff(got, want).max() <= 2


def test_center_crop_of_jpeg_equals_full_decode_crop():
    # The JPEG path decodes only the crop's rows and iMCU columns: it must not change pixels.
    data = encode(photo(150, 203), "JPEG", quality=90)
    full = _core.decode_image(data)
    for h, w in [(64, 99), (150, 1), (1, 203), (17, 16)]:
        got = _core.decode_image(data, stoker.ops.op_specs([stoker.ops.CenterCrop((h, w))]))
        top, left = int(round((150 - h) / 2.0)), int(round((203 - w) / 2.0))
        np.testing.assert_array_equal(got, full[top:top + h, left:left + w])


def test_center_crop_larger_than_image_pads_with_zeros_like_torchvision():
    data = encode(photo(20, 30), "PNG")
    full = _core.decode_image(data)
    got = _core.decode_image(data, stoker.ops.op_specs([stoker.ops.CenterCrop((25, 33))]))
    want = np.zeros((25, 33, 3), np.uint8)
    want[2:22, 1:31] = full  # torchvision pads (crop - size) // 2 before, the rest after
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_random_resized_crop_of_whole_image_matches_pillow(fmt):
    # scale=(1, 1) with the image's own ratio makes the crop the whole image, so the
    # reference is known. For the JPEG this runs the DCT-scaled decode (640 -> 1/4 -> 80):
    # a different prefilter than Pillow's full-resolution one, hence the looser bound.
    arr = photo(480, 640)
    data = encode(arr, fmt, **({"quality": 92} if fmt == "JPEG" else {}))
    op = stoker.ops.RandomResizedCrop((60, 80), scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3))
    got = _core.decode_image(data, stoker.ops.op_specs([op]), seed=3)
    want = pil_crop_resize(data, (0, 0, 640, 480), (60, 80))
    d = absdiff(got, want)
    if fmt == "PNG":
        assert d.max() <= 2
    else:
        assert d.mean() < 1.5 and np.percentile(d, 99) <= 8


def test_random_resized_crop_is_deterministic_and_varies_with_seed():
    data = encode(photo(200, 300), "JPEG", quality=90)
    ops = stoker.ops.op_specs([stoker.ops.RandomResizedCrop(64)])
    a = _core.decode_image(data, ops, seed=5)
    assert a.shape == (64, 64, 3)
    np.testing.assert_array_equal(a, _core.decode_image(data, ops, seed=5))
    outs = [_core.decode_image(data, ops, seed=s).tobytes() for s in range(20)]
    assert len(set(outs)) == 20


def test_flip_after_crop_mirrors_the_same_crop():
    data = encode(photo(200, 300), "JPEG", quality=90)
    crop = stoker.ops.RandomResizedCrop((48, 40))
    plain = _core.decode_image(data, stoker.ops.op_specs([crop]), seed=11)
    flipped = _core.decode_image(
        data, stoker.ops.op_specs([crop, stoker.ops.RandomHorizontalFlip(1.0)]), seed=11)
    np.testing.assert_array_equal(flipped, plain[:, ::-1])


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_every_output_form_carries_the_same_pixels(p):
    # The last resize runs straight into the output for uint8 HWC (mirrored there
    # when flipped), and through a buffer for CHW, Normalize, or a crop after it.
    data = encode(photo(180, 260), "JPEG", quality=90)
    crop, flip = stoker.ops.RandomResizedCrop((40, 56)), stoker.ops.RandomHorizontalFlip(p)
    hwc = _core.decode_image(data, stoker.ops.op_specs([crop, flip]), seed=3)
    chw = _core.decode_image(data, stoker.ops.op_specs([crop, flip]), seed=3, layout="CHW")
    np.testing.assert_array_equal(chw, hwc.transpose(2, 0, 1))
    norm = stoker.ops.Normalize((0, 0, 0), (1, 1, 1))
    f32 = _core.decode_image(data, stoker.ops.op_specs([crop, flip, norm]), seed=3)
    np.testing.assert_allclose(f32 * 255, hwc, atol=1e-3)
    # A center crop after the resize: the middle of the same resized image.
    cc = _core.decode_image(
        data, stoker.ops.op_specs([crop, flip, stoker.ops.CenterCrop((20, 30))]), seed=3)
    np.testing.assert_array_equal(cc, hwc[10:30, 13:43])
    # And the flip, done inside the resize, is exactly the mirror of the plain crop.
    plain = _core.decode_image(data, stoker.ops.op_specs([crop]), seed=3)
    np.testing.assert_array_equal(hwc, plain[:, ::-1] if p == 1.0 else plain)


def test_same_output_from_many_threads():
    from concurrent.futures import ThreadPoolExecutor
    data = [encode(photo(100 + 7 * i, 150, seed=i), "JPEG", quality=90) for i in range(6)]
    ops = stoker.ops.op_specs([stoker.ops.RandomResizedCrop(32), stoker.ops.RandomHorizontalFlip()])
    jobs = [(d, s) for d in data for s in range(8)]
    want = [_core.decode_image(d, ops, seed=s) for d, s in jobs]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda j: _core.decode_image(j[0], ops, seed=j[1]), jobs * 3))
    for i, g in enumerate(got):
        np.testing.assert_array_equal(g, want[i % len(jobs)])


def test_normalize():
    data = encode(photo(), "PNG")
    raw = _core.decode_image(data).astype(np.float64)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    f32 = _core.decode_image(data, [stoker.ops.Normalize(mean, std).build()])
    assert f32.dtype == np.float32
    np.testing.assert_allclose(f32, (raw / 255 - mean) / std, rtol=1e-5, atol=1e-5)
    f16 = _core.decode_image(data, [stoker.ops.Normalize(mean, std, "float16").build()])
    assert f16.dtype == np.float16
    np.testing.assert_array_equal(f16, f32.astype(np.float16))  # round to nearest even
    chw = _core.decode_image(data, [stoker.ops.Normalize(mean, std).build()], layout="CHW")
    np.testing.assert_array_equal(chw, f32.transpose(2, 0, 1))


def test_output_size_from_header():
    data = encode(photo(90, 120), "JPEG")
    assert _core.image_size(data) == (90, 120)
    assert _core.image_output_size(data) == (90, 120)
    assert _core.image_output_size(data, stoker.ops.op_specs([stoker.ops.Resize(45)])) == (45, 60)
    ops = stoker.ops.op_specs([stoker.ops.Resize(45), stoker.ops.CenterCrop((20, 30))])
    assert _core.image_output_size(data, ops) == (20, 30)
    assert _core.decode_image(data, ops).shape == (20, 30, 3)


def jpeg_with_size(data, w, h):
    """Rewrites the size in the SOF0 segment."""
    i = data.index(b"\xff\xc0")
    return data[:i + 5] + h.to_bytes(2, "big") + w.to_bytes(2, "big") + data[i + 9:]


@pytest.mark.parametrize("make, reason", [
    (lambda j, p: j[: len(j) // 2], "truncated JPEG data"),
    (lambda j, p: p[: len(p) // 2], "truncated PNG data"),
    (lambda j, p: j[:40], "JPEG header"),
    (lambda j, p: p[:30], "PNG header"),
    (lambda j, p: b"GIF89a" + b"\0" * 20,
     r"not a JPEG or PNG \(26 bytes, starts with 0x47494638\)"),
    (lambda j, p: b"", "not a JPEG or PNG"),
    (lambda j, p: j[:2] + b"\xff\x00" * 10, "JPEG header"),
    (lambda j, p: j[:2] + b"\xff\xc0\x00\x02" + j[2:], "corrupt JPEG header: Bogus marker length"),
    (lambda j, p: p[:60] + bytes(b ^ 0x55 for b in p[60:90]) + p[90:], "corrupt PNG data"),
    (lambda j, p: j[: len(j) // 2] + j[-2:], "corrupt JPEG data: premature end of data segment"),
    (lambda j, p: jpeg_with_size(j, 20000, 20000),
     "image declares 20000x20000 = 400000000 pixels, above the limit of 100000000"),
    (lambda j, p: jpeg_with_size(j, 0, 60), "(?i)empty"),
])
def test_bad_images_raise_decode_error(make, reason):
    arr = photo()
    data = make(encode(arr, "JPEG"), encode(arr, "PNG"))
    with pytest.raises(stoker.DecodeError, match=reason):
        _core.decode_image(data)
    assert issubclass(stoker.DecodeError, stoker.DataError)


def test_truncated_jpeg_is_caught_even_when_the_crop_needs_only_its_top():
    data = encode(photo(256, 256), "JPEG", quality=90)
    cut = data[: len(data) * 3 // 4]
    for ops in ([stoker.ops.CenterCrop(8)],
                [stoker.ops.RandomResizedCrop(8, scale=(0.01, 0.02))]):
        for seed in range(5):
            with pytest.raises(stoker.DecodeError, match="truncated JPEG data"):
                _core.decode_image(cut, stoker.ops.op_specs(ops), seed=seed)


def test_pixel_limit_refuses_before_decoding():
    for fmt in ("JPEG", "PNG"):
        data = encode(photo(100, 100), fmt)
        with pytest.raises(stoker.DecodeError, match="above the limit of 9999"):
            _core.decode_image(data, max_pixels=9999)
        with pytest.raises(stoker.DecodeError, match="above the limit of 9999"):
            _core.image_output_size(data, max_pixels=9999)
        assert _core.decode_image(data, max_pixels=10000).shape == (100, 100, 3)


def test_bad_op_lists_are_usage_errors():
    data = encode(photo(), "PNG")
    cpp = _core
    with pytest.raises(TypeError):  # only typed ops cross: no (kind, args) tuples
        _core.decode_image(data, [("center_crop", [4, 4])])
    with pytest.raises(ValueError, match="Normalize must be the last op"):
        _core.decode_image(data, [cpp.Normalize((0, 0, 0), (1, 1, 1)), cpp.CenterCrop(4, 4)])
    with pytest.raises(ValueError, match="CenterCrop: w must be a positive whole number"):
        _core.decode_image(data, [cpp.CenterCrop(4)])
    with pytest.raises(ValueError, match="layout"):
        _core.decode_image(data, layout="WHC")


def test_decode_only_throughput():
    data = [encode(photo(64, 48, seed=i), "JPEG") for i in range(4)]
    assert _core.decode_only_throughput(data, 2, 3) > 0
    with pytest.raises(stoker.DecodeError):
        _core.decode_only_throughput(data + [data[0][:100]], 1)


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
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))
    assert runs[0][0].shape == (8, 3, 32, 32) and runs[0][0].dtype == torch.uint8


def test_loader_full_decode_equals_single_decode(tmp_path):
    fields = {"image": stoker.image(layout="CHW")}
    imgs = [encode(photo(30, 20, seed=i), "PNG") for i in range(5)]
    with stoker.ShardWriter(tmp_path / "d", fields) as w:
        for d in imgs:
            w.write({"image": d})
    b = next(iter(stoker.Loader(tmp_path / "d", batch_size=5)))
    for i, d in enumerate(imgs):
        np.testing.assert_array_equal(b["image"][i].numpy(), pil_rgb(d).transpose(2, 0, 1))


def test_images_come_as_nchw_channels_last_views_of_the_decode(tmp_path):
    """The default delivers [N, C, H, W]: an HWC decode as that memory with channels_last
    strides (no copy), a CHW field contiguous; image_layout="HWC" keeps [N, H, W, C]."""
    ds = image_dataset(tmp_path / "d", n=8)
    tf = {"image": [stoker.ops.CenterCrop(24)]}

    def first(path=ds, **kw):
        return next(iter(stoker.Loader(path, batch_size=4, transforms=tf, **kw)))["image"]

    nchw, hwc, chw = first(), first(image_layout="HWC"), first(image_layout="CHW")
    assert nchw.shape == chw.shape == (4, 3, 24, 24) and hwc.shape == (4, 24, 24, 3)
    assert nchw.is_contiguous(memory_format=torch.channels_last) and not nchw.is_contiguous()
    assert nchw.permute(0, 2, 3, 1).is_contiguous()  # the decode's own memory, as written
    assert nchw.untyped_storage().nbytes() == nchw.numel()  # no second copy behind the view
    assert chw.is_contiguous()
    assert torch.equal(nchw, chw) and torch.equal(nchw, hwc.permute(0, 3, 1, 2))
    with stoker.ShardWriter(tmp_path / "planar", {"image": stoker.image(layout="CHW")}) as w:
        for i in range(4):
            w.write({"image": ds[i]["image"]})
    planar = first(str(tmp_path / "planar"))
    assert planar.is_contiguous() and torch.equal(planar, chw)


def test_images_of_different_sizes_need_a_crop(tmp_path):
    ds = image_dataset(tmp_path / "d", n=4)
    with pytest.raises(ValueError, match="different sizes"):
        list(stoker.Loader(ds, batch_size=4))
    b = next(iter(stoker.Loader(ds, batch_size=4, transforms={"image": stoker.ops.CenterCrop(30)})))
    assert b["image"].shape == (4, 3, 30, 30)


def test_corrupt_image_in_loader_names_record_or_is_skipped(tmp_path):
    ds = image_dataset(tmp_path / "d", bad=(5,))
    tf = {"image": [stoker.ops.CenterCrop(32)]}
    with pytest.raises(stoker.DecodeError, match=r"shard-00000.stk: record 5 .*field 'image'"):
        list(stoker.Loader(ds, batch_size=4, transforms=tf))
    loader = stoker.Loader(ds, batch_size=4, transforms=tf, on_error="skip")
    with pytest.warns(RuntimeWarning, match="replaced 1"):
        labels = sum((b["label"].tolist() for b in loader), [])
    assert labels[5] == 6 and loader.stats()["skipped"] == 1


def test_skip_covers_unreadable_headers_without_a_crop(tmp_path):
    """No op fixes the size, so batch planning reads headers; a bad one is still skipped."""
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(tmp_path / "d", fields) as w:
        for i in range(12):
            data = encode(photo(40, 50, seed=i), "JPEG")
            w.write({"image": data[:20] if i == 5 else data, "label": i})
    ds = stoker.Dataset(tmp_path / "d")
    with pytest.raises(stoker.DecodeError, match=r"record 5 .*field 'image'"):
        list(stoker.Loader(ds, batch_size=4))
    for threads in (1, 3):
        loader = stoker.Loader(ds, batch_size=4, on_error="skip", num_threads=threads)
        with pytest.warns(RuntimeWarning, match="replaced 1"):
            batches = list(loader)
        labels = sum((b["label"].tolist() for b in batches), [])
        assert labels == [0, 1, 2, 3, 4, 6, 6, 7, 8, 9, 10, 11]
        assert batches[1]["image"].shape == (4, 3, 40, 50)
