"""stoker.image(storage="raw" | "smart"): images stored as decoded pixels, read straight
into the crop and resize with no decode, through the same ops and groups
(csrc/codecs/raw_image.h); ``stoker convert imagefolder --store raw|jpeg|smart``."""

import io
import os

import numpy as np
import pytest
import stoker
import torch
from PIL import Image
from stoker import _core, ops
from stoker.fields import RAW_MAGIC, raw_pixels, raw_record


def photo(h, w, seed=0):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([128 + 90 * np.sin(x / (5.0 + c) + c + seed) * np.cos(y / 7.0)
                    + rng.normal(0, 10, (h, w)) for c in range(3)], -1)
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg(arr, **kw):
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=90, **kw)
    return buf.getvalue()


def write(path, storage, images, **kw):
    fields = {"image": stoker.image(storage=storage, **kw), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(path, fields) as w:
        for i, img in enumerate(images):
            w.write({"image": img, "label": i})
    return stoker.Dataset(path)


def epochs(ds, tf, n=2, **kw):
    loader = stoker.Loader(ds, batch_size=6, shuffle=True, seed=1, num_threads=2,
                           transforms=tf, stall_warning=None, **kw)
    out = []
    for e in range(n):
        loader.set_epoch(e)
        out += [b["image"].clone() for b in loader]
    return out


@pytest.fixture(scope="module")
def jpegs():
    return [jpeg(photo(60 + i % 9, 80 - i % 7, seed=i)) for i in range(20)]


def test_raw_images_load_as_their_jpegs_decode(tmp_path, jpegs):
    """Stored raw from the JPEG bytes (decoded once, by stoker's own decoder), every crop
    and resize gives the JPEG dataset's bytes wherever the JPEG path decodes at full
    scale (small images: always), with the same draws."""
    enc = write(tmp_path / "jpeg", "encoded", jpegs)
    raw = write(tmp_path / "raw", "raw", jpegs)
    assert raw.fields["image"].storage == "raw"
    assert all(raw._core.read(i)[0][:4] == RAW_MAGIC for i in range(3))
    for tf in ({"image": [ops.RandomResizedCrop(32), ops.RandomHorizontalFlip()]},
               {"image": [ops.CenterCrop(40), ops.ColorJitter(0.4, 0.4, 0.4),
                          ops.GaussianBlur(3)]},
               {"image": [ops.Resize(48), ops.CenterCrop(48), ops.Normalize(
                   (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))]}):
        a, b = epochs(enc, tf), epochs(raw, tf)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), tf
    # Dataset[i] gives the pixels as an array; an encoded dataset, the bytes.
    px = raw[4]["image"]
    assert isinstance(px, np.ndarray) and px.shape == (64, 76, 3) and px.dtype == np.uint8
    assert np.array_equal(px, _core.decode_image(jpegs[4]))
    assert isinstance(enc[4]["image"], bytes)
    # raw storage takes arrays too, as they are
    arr = photo(30, 20, 5)
    ds = write(tmp_path / "arr", "raw", [arr])
    assert np.array_equal(ds[0]["image"], arr)
    plain = stoker.Loader(ds, batch_size=1, image_layout="HWC")
    assert np.array_equal(next(iter(plain))["image"][0].numpy(), arr)


def test_smart_storage_keeps_large_images_encoded(tmp_path):
    small, large = photo(20, 30, 1), photo(90, 120, 2)
    ds = write(tmp_path / "smart", "smart", [jpeg(small), jpeg(large), small, large],
               smart_pixels=1000)
    kinds = [ds._core.read(i)[0][:4] for i in range(4)]
    assert kinds[0] == RAW_MAGIC and kinds[2] == RAW_MAGIC
    assert kinds[1][:3] == b"\xff\xd8\xff" and kinds[3][:3] == b"\xff\xd8\xff"
    assert np.array_equal(ds[2]["image"], small)
    assert ds.fields["image"] == stoker.image(storage="smart", smart_pixels=1000)
    # one loader reads both kinds in one batch
    batch = next(iter(stoker.Loader(ds, batch_size=4, transforms={
        "image": [ops.Resize((24, 24))]})))
    assert batch["image"].shape == (4, 3, 24, 24)


def test_raw_masks_and_groups(tmp_path):
    """A raw mask (mode "L", one channel) moves with its raw image through a group."""
    img = photo(40, 50, 3)
    mask = (np.arange(40 * 50).reshape(40, 50) % 7).astype(np.uint8)
    fields = {"image": stoker.image(storage="raw"), "mask": stoker.image(mode="L", storage="raw")}
    png = io.BytesIO()
    Image.fromarray(mask).save(png, format="PNG")
    with stoker.ShardWriter(tmp_path / "seg", fields) as w:
        w.write({"image": img, "mask": mask})
        w.write({"image": jpeg(img), "mask": png.getvalue()})  # decoded once, stored raw
    ds = stoker.Dataset(tmp_path / "seg")
    assert np.array_equal(ds[0]["mask"], mask[:, :, None])
    assert np.array_equal(ds[1]["mask"], mask[:, :, None])
    group = {("image", "mask"): [ops.RandomResizedCrop(24), ops.RandomHorizontalFlip()]}
    enc_fields = {"image": stoker.image(), "mask": stoker.image(mode="L")}
    with stoker.ShardWriter(tmp_path / "enc", enc_fields) as w:
        png_img = io.BytesIO()
        Image.fromarray(img).save(png_img, format="PNG")
        w.write({"image": png_img.getvalue(), "mask": png.getvalue()})
    a = next(iter(stoker.Loader(stoker.Dataset(tmp_path / "enc"), batch_size=1, seed=0,
                                transforms=group)))
    b = next(iter(stoker.Loader(ds, batch_size=1, seed=0, transforms=group)))
    assert torch.equal(a["image"][0], b["image"][0]) and torch.equal(a["mask"][0], b["mask"][0])


def test_raw_records_are_checked(tmp_path):
    f = stoker.image(storage="raw")
    with pytest.raises(ValueError, match="uint8"):
        f.encode(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError, match=r"\(h, w, 3\)"):
        f.encode(np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match="channel"):
        f.encode(raw_record(np.zeros((4, 4), np.uint8)))
    with pytest.raises(ValueError, match="holds"):
        f.encode(raw_record(np.zeros((4, 4, 3), np.uint8))[:-1])
    with pytest.raises(ValueError, match="storage"):
        stoker.image(storage="png")
    assert stoker.image().spec() == {"kind": "image", "layout": "HWC"}  # old hashes stay
    assert stoker.image(storage="raw").spec()["storage"] == "raw"
    rec = raw_record(photo(5, 7))
    assert raw_pixels(rec).shape == (5, 7, 3)
    assert _core.image_size(rec) == (5, 7)


def test_convert_imagefolder_store_modes(tmp_path):
    from stoker.convert.imagefolder import convert_imagefolder

    src = tmp_path / "src"
    for c, name in enumerate(["cat", "dog"]):
        os.makedirs(src / name)
        for i in range(3):
            size = (40, 50) if i < 2 else (200, 300)
            Image.fromarray(photo(*size, seed=c * 10 + i)).save(src / name / f"{i}.jpg",
                                                                 quality=90)
    stats = {}
    for store in ("jpeg", "raw", "smart"):
        stats[store] = convert_imagefolder(src, tmp_path / store, store=store,
                                           smart_pixels=5000, progress=False)
    raw, smart = stoker.Dataset(tmp_path / "raw"), stoker.Dataset(tmp_path / "smart")
    assert raw.fields["image"].storage == "raw"
    assert raw.metadata["write_options"]["store"] == "raw"
    assert "store" not in stoker.Dataset(tmp_path / "jpeg").metadata["write_options"]
    assert [raw._core.read(i)[0][:4] == RAW_MAGIC for i in range(6)] == [True] * 6
    assert [smart._core.read(i)[0][:4] == RAW_MAGIC for i in range(6)] == \
        [True, True, False, True, True, False]
    assert stats["raw"]["bytes"] > stats["smart"]["bytes"] > stats["jpeg"]["bytes"]
    tf = {"image": [ops.CenterCrop(36), ops.RandomHorizontalFlip()]}  # full-scale decodes
    want = epochs(stoker.Dataset(tmp_path / "jpeg"), tf)
    assert all(torch.equal(x, y) for x, y in zip(want, epochs(raw, tf)))
    with pytest.raises(ValueError, match="store must be"):
        convert_imagefolder(src, tmp_path / "bad", store="png", progress=False)


def test_cli_store_flag(tmp_path):
    from stoker.cli import main

    src = tmp_path / "src" / "a"
    os.makedirs(src)
    Image.fromarray(photo(20, 20)).save(src / "x.jpg")
    assert main(["convert", "imagefolder", str(tmp_path / "src"), str(tmp_path / "out"),
                 "--store", "raw", "--quiet"]) == 0
    assert stoker.Dataset(tmp_path / "out").fields["image"].storage == "raw"
