"""Loader(cache="decoded"): the decoded-sample cache (csrc/cache/decoded_cache.h,
stoker/_cache.py). Batches are bit-identical to the uncached loader's for any thread count,
resume and world size; processes of a node share one cache; a process killed mid-insert
leaves nothing another reads wrong; a rewritten dataset is never served stale pixels; a
budget too small caches part and says so; a full /dev/shm is never a SIGBUS."""

import glob
import io
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest
import stoker
import torch
from PIL import Image
from stoker import _core, ops

TF = {"image": [ops.RandomResizedCrop(48), ops.RandomHorizontalFlip()]}
# A small target: the large images' crops decode at DCT scales 1/8 .. 4/8.
TF_SMALL = {"image": [ops.RandomResizedCrop(12, scale=(0.3, 1.0))]}


def photo(h, w, seed=0, channels=3):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([128 + 90 * np.sin(x / (5.0 + c) + c + seed) * np.cos(y / 7.0)
                    + rng.normal(0, 10, (h, w)) for c in range(channels)], -1)
    return np.clip(img, 0, 255).astype(np.uint8)


def encode(arr, fmt="JPEG", **kw):
    buf = io.BytesIO()
    Image.fromarray(arr.squeeze()).save(buf, format=fmt, **kw)
    return buf.getvalue()


def image_bytes(i, seed=0):
    """Sample i's image: mostly small JPEGs; a few large ones (DCT scaling), a progressive,
    a grayscale JPEG and a PNG."""
    s = seed * 1000 + i
    if i % 11 == 3:
        return encode(photo(420, 520, s))
    if i % 11 == 5:
        return encode(photo(70, 90, s), progressive=True)
    if i % 11 == 7:
        return encode(photo(66, 80, s, channels=1))
    if i % 11 == 9:
        return encode(photo(60, 77, s), "PNG")
    return encode(photo(50 + i % 13, 64 + i % 9, s))


def write_images(path, n=44, seed=0, overwrite=False):
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(path, fields, shard_size="96KB", overwrite=overwrite) as w:
        for i in range(n):
            w.write({"image": image_bytes(i, seed), "label": i})
    return stoker.Dataset(path)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return write_images(tmp_path_factory.mktemp("cache") / "ds")


@pytest.fixture(autouse=True)
def cache_dir(monkeypatch):
    """A folder of this test's own for the shared cache files (under /dev/shm: the
    memory the cache lives in), empty again once every loader is gone."""
    path = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp",
                        f"stoker-test-{uuid.uuid4().hex[:12]}")
    os.makedirs(path)
    monkeypatch.setenv("STOKER_CACHE_DIR", path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def cache_files(folder):
    """The cache files in `folder`: in this user's private folder there (NOTE [ Cache
    trust ] in csrc/cache/decoded_cache.cpp)."""
    private = _core.DecodedCache.private_dir(folder)
    return sorted(os.listdir(private)) if os.path.isdir(private) else []


def loader(ds, threads=2, tf=TF, **kw):
    return stoker.Loader(ds, batch_size=8, shuffle=True, seed=3, num_threads=threads,
                         transforms=tf, stall_warning=None, **kw)


def epoch(ld, e):
    ld.set_epoch(e)
    return [{k: v.clone() for k, v in b.items()} for b in ld]


def same(a, b):
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("tf", [TF, TF_SMALL], ids=["rrc48", "rrc12-dct"])
def test_cached_batches_are_bit_identical(images, tf):
    want = [epoch(loader(images, 1, tf), e) for e in range(3)]
    kept = []
    for threads in (1, 3):
        cached = loader(images, threads, tf, cache="decoded", cache_size="64MB")
        kept.append(cached)
        got = [epoch(cached, e) for e in range(3)]
        assert all(same(w, g) for w, g in zip(want, got, strict=True)), threads
        s = cached.stats()["cache"]
        assert s["cached_share"] == 1.0 and s["images"] == len(images)
        assert s["shared"] and s["bytes"] <= s["budget"] and not s["full"]
        if threads == 1:
            assert s["hits"] > s["misses"] > 0
            if tf is TF_SMALL:  # some images needed at several DCT scales
                assert s["entries"] > s["images"]
        else:  # the first loader's cache, still open: nothing to decode
            assert s["hits"] > 0 and s["misses"] == 0


def test_resume_and_elastic_resume_with_the_cache(images):
    plain = loader(images, 2, world_size=2, rank=0)
    plain.set_epoch(1)
    it = iter(plain)
    head = [next(it) for _ in range(1)]
    assert head
    state = plain.state_dict()
    want_rest = [b["image"].clone() for b in it]
    warm = loader(images, 2, cache="decoded", cache_size="64MB")
    epoch(warm, 0)
    epoch(warm, 1)  # the cache holds every image, at every scale epoch 1 needs
    resumed = loader(images, 3, cache="decoded", cache_size="64MB", world_size=2, rank=0)
    resumed.load_state_dict(state)
    assert same([{"i": x} for x in want_rest], [{"i": b["image"]} for b in resumed])
    assert resumed.stats()["cache"]["misses"] == 0
    # Elastic: resumed at another world size, every rank's rest as without the cache.
    for rank in range(3):
        a = loader(images, 2, world_size=3, rank=rank)
        b = loader(images, 1, cache="decoded", cache_size="64MB", world_size=3, rank=rank)
        a.load_state_dict(state)
        b.load_state_dict(state)
        assert same([{"i": x["image"]} for x in a], [{"i": x["image"]} for x in b])


def test_groups_and_the_python_stage_use_the_cache(tmp_path):
    fields = {"image": stoker.image(), "boxes": stoker.boxes(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(tmp_path / "det", fields) as w:
        for i in range(20):
            w.write({"image": image_bytes(i), "boxes": np.array([[2, 3, 30, 40]], np.float32),
                     "label": i})
    ds = stoker.Dataset(tmp_path / "det")
    group = {("image", "boxes"): [ops.RandomResizedCrop(32), ops.RandomHorizontalFlip()]}
    want = [epoch(loader(ds, 2, group), e) for e in range(2)]
    cached = loader(ds, 2, group, cache="decoded", cache_size="32MB")
    assert all(same(w, epoch(cached, e)) for e, w in enumerate(want))
    assert cached.stats()["cache"]["images"] == 20

    def keep(sample, rng):
        return sample

    # the image alone moves (TF): its boxes are delivered as stored, knowingly
    want = [epoch(loader(ds, 2, map=keep, as_stored=["boxes"]), e) for e in range(2)]
    staged = loader(ds, 2, map=keep, as_stored=["boxes"], cache="decoded", cache_size="32MB")
    assert all(same(w, epoch(staged, e)) for e, w in enumerate(want))
    s = staged.stats()["cache"]
    assert s["images"] == 20 and s["hits"] >= 20


def test_a_budget_too_small_caches_part_and_says_so(images):
    want = [epoch(loader(images, 2), e) for e in range(2)]
    index = _core.DecodedCache.index_bytes(len(images), 4)
    small = loader(images, 2, cache="decoded", cache_size=index + 200_000)
    with pytest.warns(RuntimeWarning, match="decoded-sample cache is full") as said:
        got0 = epoch(small, 0)
    assert said[0].filename == __file__  # the line of the loop (in epoch()), not stoker's
    got1 = epoch(small, 1)  # said once
    assert same(want[0], got0) and same(want[1], got1)
    s = small.stats()["cache"]
    assert s["full"] and s["declined"] > 0
    assert 0 < s["cached_share"] < 1
    assert s["bytes"] <= s["budget"] == index + 200_000


def test_max_side_keeps_reduced_copies_and_the_same_pixels_whatever_they_hold(images):
    want = epoch(loader(images, 2), 0)
    a = loader(images, 2, cache="decoded", cache_size="64MB", cache_max_side=40)
    first, second = epoch(a, 0), epoch(a, 0)
    assert same(first, second)  # misses then hits: the same pixels
    assert a.stats()["cache"]["cached_share"] == 1.0
    # A cache with no room makes the copies again each time: the same pixels again.
    index = _core.DecodedCache.index_bytes(len(images), 1)
    tiny = loader(images, 1, cache="decoded", cache_size=index + 4096, cache_max_side=40)
    with pytest.warns(RuntimeWarning, match="full"):
        assert same(first, epoch(tiny, 0))
    # Not the uncached pixels, but the same shapes, labels and draws, and close.
    assert [b["label"].tolist() for b in first] == [b["label"].tolist() for b in want]
    assert all(x["image"].shape == y["image"].shape for x, y in zip(first, want, strict=True))
    diff = np.mean([(x["image"].float() - y["image"].float()).abs().mean().item()
                    for x, y in zip(first, want, strict=True)])
    assert 0 < diff < 25
    # Without a reduction (max_side above every image), crops read the whole decode.
    big = loader(images, 2, cache="decoded", cache_size="64MB", cache_max_side=4096,
                 tf={"image": [ops.CenterCrop(40)]})
    assert same(epoch(big, 0), epoch(loader(images, 2, {"image": [ops.CenterCrop(40)]}), 0))


CHILD = textwrap.dedent("""
    import hashlib, os, sys, time
    import stoker
    from stoker import ops
    ds = stoker.Dataset(sys.argv[1])
    mode = sys.argv[2]
    ld = stoker.Loader(ds, batch_size=8, shuffle=True, seed=3, num_threads=2,
                       stall_warning=None, cache="decoded", cache_size="64MB",
                       prefetch_next_epoch=False,
                       transforms={"image": [ops.RandomResizedCrop(48),
                                             ops.RandomHorizontalFlip()]})
    digest = hashlib.sha256()
    for b in ld:
        digest.update(b["image"].numpy().tobytes())
    s = ld.stats()["cache"]
    print("RESULT", digest.hexdigest(), s["hits"], s["misses"], s["shared"], flush=True)
    if mode == "hold":  # keep the cache mapped until told to go
        sys.stdin.readline()
""")


def child(ds, mode, cache_dir, **kw):
    env = dict(os.environ, STOKER_CACHE_DIR=cache_dir)
    return subprocess.Popen([sys.executable, "-c", CHILD, ds.path, mode], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **kw)


def result(proc, done=False):
    """The child's RESULT line; with `done`, after it exited (its pipes closed)."""
    out = None
    for line in proc.stdout:
        if line.startswith("RESULT"):
            _, digest, hits, misses, shared = line.split()
            out = digest, int(hits), int(misses), shared == "True"
            break
    if done or out is None:
        finish(proc)
    if out is None:
        raise AssertionError(f"no result (exit {proc.returncode})")
    return out


def finish(proc):
    proc.stdin.close()
    proc.wait(60)
    proc.stdout.close()


def test_two_processes_share_one_cache(images, cache_dir):
    import hashlib

    digest = hashlib.sha256()
    for b in epoch(loader(images, 2), 0):
        digest.update(b["image"].numpy().tobytes())
    first = child(images, "hold", cache_dir)
    try:
        d1, hits1, misses1, shared1 = result(first)
        assert shared1 and d1 == digest.hexdigest() and misses1 == len(images)
        assert len(cache_files(cache_dir)) == 1
        # A second process while the first still maps the cache: it decodes nothing.
        d2, hits2, misses2, shared2 = result(child(images, "go", cache_dir), done=True)
        assert shared2 and d2 == d1 and misses2 == 0 and hits2 == len(images)
    finally:
        finish(first)
    assert cache_files(cache_dir) == []  # the last one out removed it


@pytest.mark.slow
def test_a_process_killed_mid_insert_leaves_nothing_torn(images, cache_dir):
    """A child decodes and inserts the epoch's images and is SIGKILLed at a random
    point, many times over; this process maps the cache all along, and every epoch it
    reads from it after each kill is the uncached one, bit for bit."""
    want = [epoch(loader(images, 2), e) for e in range(2)]
    watcher = loader(images, 2, cache="decoded", cache_size="64MB")
    rng = random.Random(7)
    for trial in range(8):
        proc = child(images, "go", cache_dir)
        time.sleep(rng.uniform(0.3, 2.0))  # importing torch takes most of a second
        proc.send_signal(signal.SIGKILL)
        finish(proc)
        assert same(want[trial % 2], epoch(watcher, trial % 2)), trial
    assert watcher.stats()["cache"]["images"] == len(images)


def test_a_rewritten_dataset_is_never_served_stale(tmp_path, cache_dir):
    ds = write_images(tmp_path / "ds", 22, seed=1)
    old = loader(ds, 2, cache="decoded", cache_size="32MB")
    epoch(old, 0)  # cached, and kept mapped while the dataset is rewritten
    new = write_images(tmp_path / "ds", 22, seed=2, overwrite=True)
    fresh = loader(new, 2, cache="decoded", cache_size="32MB")
    got = epoch(fresh, 0)
    assert same(got, epoch(loader(new, 2), 0))
    s = fresh.stats()["cache"]
    assert s["hits"] == 0 or s["misses"] >= 22  # nothing came from the old dataset's cache
    assert s["path"] != old.stats()["cache"]["path"]
    assert len(cache_files(cache_dir)) == 2
    del old, fresh
    import gc

    gc.collect()
    assert cache_files(cache_dir) == []


def _mount_tmpfs(path, size):
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")


def test_a_full_dev_shm_is_never_a_sigbus(images, tmp_path, monkeypatch):
    """/dev/shm filling up under a cache (other files grow there): the cache holds what
    fits, stops there without a SIGBUS, and the batches are the same. A /dev/shm without
    room for cache_size (a container's 64 MB) gives each process a private cache of
    cache_size over the job's processes, with a warning saying why."""
    small = str(tmp_path / "shm")
    _mount_tmpfs(small, "2m")
    import gc

    try:
        monkeypatch.setenv("STOKER_CACHE_DIR", small)
        want = [epoch(loader(images, 2, TF), e) for e in range(2)]
        cached = loader(images, 2, TF, cache="decoded", cache_size=1_900_000)
        with open(os.path.join(small, "filler"), "wb") as f:  # another user of /dev/shm
            f.write(b"\0" * 1_700_000)
        with pytest.warns(RuntimeWarning, match="full"):
            got = [epoch(cached, e) for e in range(2)]
        assert all(same(w, g) for w, g in zip(want, got, strict=True))
        s = cached.stats()["cache"]
        assert s["shared"] and s["full"] and s["declined"] > 0 and 0 < s["cached_share"] < 1
        del cached
        gc.collect()
        with pytest.warns(RuntimeWarning, match="not shared.*less than cache_size"):
            private = loader(images, 2, TF, cache="decoded", cache_size=1_900_000)
        assert same(want[0], epoch(private, 0))
        s = private.stats()["cache"]
        assert not s["shared"] and s["fallback"] and s["cached_share"] == 1.0
        assert cache_files(small) == [] and "filler" in os.listdir(small)
        del private
    finally:
        gc.collect()  # loaders an assertion left behind let go of the file system
        subprocess.run(["umount", "-l", small])


def _schema_dataset(path, fields, n=20):
    """Records of `fields`: RGB images as JPEGs (every fourth a PNG, one a large JPEG that
    decodes at DCT scales) and masks as PNGs of class ids, one size per record."""
    with stoker.ShardWriter(path, fields) as w:
        for i in range(n):
            h, wd = (300, 380) if i == 7 else (50 + i % 5, 64 + i % 7)
            row = {}
            for k, (name, f) in enumerate(fields.items()):
                if isinstance(f, stoker.fields.Image) and f.mode == "L":
                    m = np.zeros((h, wd), np.uint8)
                    m[10:30, 12:40] = 1 + i % 3
                    row[name] = encode(m, "PNG")
                elif isinstance(f, stoker.fields.Image):
                    row[name] = encode(photo(h, wd, 10 * i + k), "PNG" if i % 4 == 1 else "JPEG")
                else:
                    row[name] = i
            w.write(row)
    return stoker.Dataset(path)


@pytest.mark.parametrize("schema", ["image+mask", "two images", "image+mask+image"])
def test_every_schema_the_docs_show_caches(tmp_path, schema):
    """An image with a mask (the docs' segmentation recipe), several image fields: the
    cache opens (one slot per record and image field, a mask's left empty), and its batches
    are the uncached loader's, bit for bit, in the epoch that fills it and the next."""
    rgb, mask = stoker.image(), stoker.image(mode="L")
    crop = [ops.RandomResizedCrop(40, scale=(0.5, 1.0)), ops.RandomHorizontalFlip()]
    fields, tf = {
        "image+mask": ({"image": rgb, "mask": mask, "label": stoker.scalar("int64")},
                       {("image", "mask"): crop}),
        "two images": ({"left": rgb, "right": rgb}, {"left": crop, "right": [ops.Resize(32),
                                                                          ops.CenterCrop(32)]}),
        "image+mask+image": ({"image": rgb, "mask": mask, "depth": rgb},
                             {("image", "mask"): crop, "depth": [ops.Resize((24, 24))]}),
    }[schema]
    ds = _schema_dataset(tmp_path / "ds", fields)
    want = [epoch(loader(ds, 2, tf), e) for e in range(2)]
    cached = loader(ds, 2, tf, cache="decoded", cache_size="64MB")
    got = [epoch(cached, e) for e in range(2)]
    assert all(same(w, g) for w, g in zip(want, got, strict=True))
    s = cached.stats()["cache"]
    rgb_fields = sum(f is rgb for f in fields.values())
    assert s["slots"] == len(ds) * sum(isinstance(f, stoker.fields.Image)
                                       for f in fields.values())
    assert s["images"] >= len(ds) * rgb_fields and s["hits"] > 0


def test_cache_arguments_are_checked(images, tmp_path):
    with pytest.raises(ValueError, match="cache must be None or 'decoded'"):
        loader(images, cache="pixels")
    with pytest.raises(ValueError, match="pass cache='decoded' too"):
        loader(images, cache_size="1GB")
    with pytest.raises(ValueError, match="cache_max_side"):
        loader(images, cache="decoded", cache_max_side=0)
    with pytest.raises(ValueError, match="share of the machine's RAM"):
        loader(images, cache="decoded", cache_size=1.5)
    with pytest.raises(ValueError, match="cannot hold the cache's index"):
        loader(images, cache="decoded", cache_size=1000)
    with pytest.raises(ValueError, match="leaves nothing for batches"):
        loader(images, cache="decoded", cache_size="1GB", max_memory="512MB")
    arrays = stoker.Dataset(_arrays(tmp_path))
    with pytest.raises(ValueError, match="no stoker.image"):
        stoker.Loader(arrays, batch_size=4, cache="decoded")
    with pytest.raises(ValueError, match="stoker.Mix"):
        stoker.Loader(stoker.Mix({"a": images, "b": images}), batch_size=4, cache="decoded")
    with pytest.raises(ValueError, match="map-style"):
        stoker.Loader(list(range(10)), batch_size=4, cache="decoded")
    plan = stoker._plan.plan(images, batch_size=4, cache="decoded", cache_size="1GB",
                             cache_max_side=256)
    assert plan.records.cache.budget == 10**9 and plan.records.cache.max_side == 256
    assert "cache: decoded images" in str(plan) and "max_side=256" in str(plan)
    # max_memory covers this rank's share of the cache
    with_memory = stoker._plan.plan(images, batch_size=4, cache="decoded", cache_size="1GB",
                                    max_memory="3GB")
    assert with_memory.settings.max_memory == 3 * 10**9 - 10**9


def _arrays(tmp_path):
    with stoker.ShardWriter(tmp_path / "arr", {"x": stoker.ndarray("uint8", (4,))}) as w:
        for i in range(10):
            w.write({"x": np.full(4, i, np.uint8)})
    return tmp_path / "arr"


def test_cache_files_are_named_by_dataset_and_arguments(images, cache_dir):
    a = loader(images, 1, cache="decoded", cache_size="32MB")
    b = loader(images, 1, cache="decoded", cache_size="32MB")
    c = loader(images, 1, cache="decoded", cache_size="32MB", cache_max_side=32)
    d = loader(images, 1, cache="decoded", cache_size="33MB")
    paths = {x.stats()["cache"]["path"] for x in (a, b, c, d)}
    assert len(paths) == 3 and a.stats()["cache"]["path"] == b.stats()["cache"]["path"]
    private = _core.DecodedCache.private_dir(cache_dir)
    assert sorted(glob.glob(os.path.join(private, "stoker-cache-*"))) == sorted(paths)
    assert os.stat(private).st_mode & 0o777 == 0o700
    assert all(os.stat(p).st_mode & 0o777 == 0o600 for p in paths)
