"""The Python stage (NOTE [ Python stage ] in stoker/_stage/__init__.py): its pieces, then
map / batch_map / collate_fn / map-style datasets through the Loader."""

import io
import os
import pickle
import re
import signal
import threading
import time
import traceback
import weakref

import numpy as np
import pytest
import stoker
import torch
from conftest import stoker_threads
from PIL import Image
from stoker._stage.errors import add_note
from stoker._stage.pool import StagePool
from stoker._stage.rng import batch_rng, rng_keys, sample_rng
from stoker._stage.sources import MapStyleSource, normalize_item

# -- pieces ------------------------------------------------------------------------------


def test_sample_rng_depends_only_on_seed_epoch_index():
    a = sample_rng(7, 2, 1000).random(8)
    assert np.array_equal(a, sample_rng(7, 2, 1000).random(8))
    for other in (sample_rng(8, 2, 1000), sample_rng(7, 3, 1000), sample_rng(7, 2, 1001)):
        assert not np.array_equal(a, other.random(8))
    assert isinstance(sample_rng(0, 0, 0), np.random.Generator)
    # vectorised keys are the per-sample ones
    keys = rng_keys(7, 2, np.arange(995, 1005))
    assert np.array_equal(keys[5], rng_keys(7, 2, [1000])[0])
    # a batch's generator is another stream than any sample's
    assert not np.array_equal(batch_rng(7, 2, 0, 1, 1000).random(8), a)
    assert not np.array_equal(batch_rng(7, 2, 0, 1, 3).random(4),
                              batch_rng(7, 2, 1, 2, 3).random(4))


def test_sample_rng_streams_are_independent():
    # neighbouring indices (what a batch holds) give uncorrelated streams
    draws = np.stack([sample_rng(0, 0, i).random(64) for i in range(256)])
    corr = np.corrcoef(draws)
    off = corr[~np.eye(256, dtype=bool)]
    assert np.abs(off).max() < 0.6 and abs(off.mean()) < 0.02
    assert abs(draws.mean() - 0.5) < 0.01


def test_normalize_item():
    # without names= an item is batched as it is (default_collate's structure)
    item = (1, 2)
    assert normalize_item(item, None, "x") is item
    assert normalize_item([1, 2], ["img", "y"], "x") == {"img": 1, "y": 2}
    t = torch.zeros(2)
    assert normalize_item(t, None, "x") is t
    assert normalize_item(t, ["x"], "x")["x"] is t
    with pytest.raises(ValueError, match="dataset index 3: the item has 2 value.*names= gives 3"):
        normalize_item((1, 2), ["a", "b", "c"], "dataset index 3")
    with pytest.raises(TypeError, match="names="):
        normalize_item({"a": 1}, ["a"], "x")
    with pytest.raises(ValueError, match="repeated"):
        MapStyleSource([], names=["a", "a"])


def test_add_note_keeps_the_exception_and_its_traceback():
    def fn():
        raise KeyError("box")

    try:
        fn()
    except KeyError as e:
        err = e
    tb = err.__traceback__
    assert add_note(err, "stoker: map failed for sample 3") is err
    assert err.__traceback__ is tb
    assert "stoker: map failed for sample 3" in err.__notes__


class _Counter:
    def __init__(self):
        self.calls = {}
        self.lock = threading.Lock()

    def handle(self, item, slot):
        assert item == slot
        with self.lock:
            self.calls[slot] = self.calls.get(slot, 0) + 1


def _wait(slot):
    time.sleep(0.002)
    return slot


def test_pool_threads_named_parked_stopped_and_collected():
    owner = _Counter()
    pool = StagePool(owner, _wait, "handle", 3)
    pool.start()
    names = {t.name for t in threading.enumerate()}
    assert {"stoker-python-0", "stoker-python-1", "stoker-python-2"} <= names
    time.sleep(0.05)
    assert set(owner.calls) == {0, 1, 2}
    pool.set_active(1)
    time.sleep(0.05)
    before = dict(owner.calls)
    time.sleep(0.05)
    assert owner.calls[0] > before[0]
    assert owner.calls[1] == before[1] and owner.calls[2] == before[2]  # parked
    pool.set_active(3)
    time.sleep(0.05)
    assert owner.calls[2] > before[2]
    pool.stop()
    assert pool.alive() == 0
    pool.start()  # again after stop
    assert pool.alive() == 3
    ref = weakref.ref(owner)
    del owner
    deadline = time.monotonic() + 2
    while pool.alive() and time.monotonic() < deadline:  # the owner is gone: threads end
        time.sleep(0.01)
    assert ref() is None and pool.alive() == 0


# -- through the Loader ------------------------------------------------------------------

def jpeg(i, h, w):
    rng = np.random.default_rng(i)
    img = (rng.random((h, w, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def img_ds(tmp_path_factory):
    """Images of several sizes, a label, a variable-length field and a blob."""
    fields = {"image": stoker.image(), "label": stoker.scalar("int64"),
              "tok": stoker.ndarray("int32", (None,)), "raw": stoker.blob()}
    path = tmp_path_factory.mktemp("img") / "ds"
    with stoker.ShardWriter(path, fields, shard_size="16KB") as w:
        for i in range(60):
            w.write({"image": jpeg(i, 40 + i % 5 * 4, 48 + i % 3 * 8), "label": i,
                     "tok": np.arange(i % 6, dtype=np.int32) + i, "raw": bytes([i]) * (i % 4)})
    return stoker.Dataset(path)


CROP = {"image": [stoker.ops.RandomResizedCrop(32), stoker.ops.RandomHorizontalFlip()]}


def jitter(sample, rng):
    """A map that uses its rng, changes a dtype and adds fields of each kind."""
    img = sample["image"].astype(np.float32) * rng.uniform(0.5, 1.5)
    return {"image": img, "label": sample["label"], "noise": rng.normal(size=3),
            "k": int(rng.integers(0, 1000)), "name": f"s{sample['label']}",
            "boxes": rng.random((int(rng.integers(0, 4)), 4), dtype=np.float32)}


JITTER_FIELDS = {"boxes": stoker.ndarray("float32", (None, 4))}


def same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert list(x) == list(y)
        for k in x:
            if isinstance(x[k], torch.Tensor):
                assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), k
            else:
                assert x[k] == y[k], k


def epochs(loader, n=2):
    out = []
    for e in range(n):
        loader.set_epoch(e)
        out.append(list(loader))
    return out


def test_map_outputs_identical_for_any_thread_count(img_ds):
    runs = [epochs(stoker.Loader(img_ds, batch_size=7, shuffle=True, seed=3, transforms=CROP,
                                 map=jitter, map_fields=JITTER_FIELDS, num_threads=t))
            for t in (1, 2, 4)]
    for other in runs[1:]:
        for e in range(2):
            same_batches(other[e], runs[0][e])
    first = runs[0][0][0]
    # an image map returns as it received it (HWC) batches as the loader's: NCHW
    assert first["image"].dtype == torch.float32 and first["image"].shape == (7, 3, 32, 32)
    assert first["noise"].dtype == torch.float64 and first["k"].dtype == torch.int64
    assert first["name"] == [f"s{i}" for i in first["label"].tolist()]
    assert first["boxes"].shape[:1] == (7,) and first["boxes_lengths"].shape == (7,)
    # a new epoch draws again
    assert not torch.equal(runs[0][0][0]["noise"], runs[0][1][0]["noise"])


_PEER = threading.local()


def albumentations_ops(img, rng):
    """An albumentations pipeline as users write it: one Compose per thread (it owns a
    generator), reseeded from the sample's rng."""
    import albumentations as A

    if not hasattr(_PEER, "aug"):
        _PEER.aug = A.Compose([A.ColorJitter(0.4, 0.4, 0.4, 0.1, p=1.0),
                               A.Rotate(limit=20, p=1.0),
                               A.GaussianBlur(blur_limit=(3, 7), p=1.0)])
    _PEER.aug.set_random_seed(int(rng.integers(2**32)))
    return _PEER.aug(image=img)["image"]


def pillow_ops(img, rng):
    from PIL import ImageEnhance, ImageFilter

    img = Image.fromarray(img)
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        img = enhance(img).enhance(float(rng.uniform(0.6, 1.4)))
    img = img.rotate(float(rng.uniform(-20, 20)), resample=Image.BILINEAR)
    return np.asarray(img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.1, 2.0)))))


def albumentations_map(sample, rng):
    return {"image": albumentations_ops(sample["image"], rng), "label": sample["label"]}


def pillow_map(sample, rng):
    return {"image": pillow_ops(sample["image"], rng), "label": sample["label"]}


@pytest.mark.parametrize("ops, fn", [(albumentations_ops, albumentations_map),
                                     (pillow_ops, pillow_map)], ids=["albumentations", "pillow"])
def test_peer_pipelines_in_map_are_exact_for_threads_and_processes(img_ds, ops, fn):
    """albumentations and Pillow pipelines through map: every image is what the same
    pipeline makes of the loader's own crop with the sample's generator, on 1 and 2
    threads and in worker processes."""
    pytest.importorskip("albumentations")
    plain = stoker.Loader(img_ds, batch_size=8, shuffle=True, seed=4, transforms=CROP)
    crops = {int(label): img.permute(1, 2, 0).numpy().copy()
             for b in plain for label, img in zip(b["label"], b["image"])}
    want = {i: ops(crop, sample_rng(4, 0, i)) for i, crop in crops.items()}
    assert sum(not np.array_equal(want[i], crops[i]) for i in want) > len(want) // 2
    for kw in (dict(num_threads=1), dict(num_threads=2),
               dict(num_threads=2, python_workers="process")):
        loader = stoker.Loader(img_ds, batch_size=8, shuffle=True, seed=4, transforms=CROP,
                               map=fn, **kw)
        got = {int(label): img.permute(1, 2, 0).numpy() for b in loader
               for label, img in zip(b["label"], b["image"])}
        assert sorted(got) == sorted(want)
        for i in want:
            assert np.array_equal(got[i], want[i]), (kw, i)


def test_identity_map_gives_the_loader_batches(img_ds):
    """map receives what the C++ path gives (decoded, transformed with the loader's draws):
    passing it on unchanged gives the batches of the loader without map, bit for bit (map
    sees the images HWC, as decoded; both batches are NCHW views of HWC memory)."""
    plain = epochs(stoker.Loader(img_ds, batch_size=5, shuffle=True, seed=1, transforms=CROP))
    mapped = epochs(stoker.Loader(img_ds, batch_size=5, shuffle=True, seed=1, transforms=CROP,
                                  map=lambda s, rng: s, num_threads=2))
    for e in range(2):
        for a, b in zip(mapped[e], plain[e], strict=True):
            assert a["image"].shape == b["image"].shape and a["image"].stride() == \
                b["image"].stride()
        same_batches(mapped[e], plain[e])


def test_map_sample_is_what_the_dataset_holds(img_ds):
    seen = {}

    def look(s, rng):
        seen[int(s["label"])] = s
        return {"label": s["label"]}

    list(stoker.Loader(img_ds, batch_size=8, map=look, num_threads=2))
    s = seen[7]
    assert isinstance(s["label"], np.int64) and s["label"] == 7
    assert s["tok"].dtype == np.int32 and s["tok"].tolist() == list(range(7, 8))
    assert s["raw"] == bytes([7]) * 3
    assert s["image"].dtype == np.uint8 and s["image"].shape == (44 + 4, 48 + 8, 3)
    assert s["image"].flags.writeable


def test_rng_is_keyed_by_seed_epoch_and_dataset_index(img_ds):
    got = {}

    def draw(s, rng):
        got[int(s["label"])] = rng.random()
        return {"label": s["label"]}

    loader = stoker.Loader(img_ds, batch_size=8, shuffle=True, seed=9, map=draw,
                           prefetch_next_epoch=False)  # only epoch 4's samples are mapped
    loader.set_epoch(4)
    list(loader)
    from stoker._stage.rng import sample_rng
    assert got == {i: sample_rng(9, 4, i).random() for i in range(60)}


def resume_run(make, stop_after):
    full = epochs(make(), 2)
    a = make()
    a.set_epoch(1)
    it = iter(a)
    head = [next(it) for _ in range(stop_after)]
    state = a.state_dict()
    next(it)  # the stage prepared more than the consumer took: not in the state
    del it
    b = make()
    b.load_state_dict(pickle.loads(pickle.dumps(state)))
    tail = list(b)
    same_batches(head + tail, full[1])


def mixup(batch, rng):
    lam = rng.beta(0.4, 0.4)
    x = batch["image"].float()
    return {"image": lam * x + (1 - lam) * x.flip(0), "label": batch["label"], "lam": lam}


def test_exact_resume_with_map_and_batch_map(img_ds):
    resume_run(lambda: stoker.Loader(img_ds, batch_size=6, shuffle=True, seed=2, transforms=CROP,
                                     map=jitter, map_fields=JITTER_FIELDS, batch_map=mixup,
                                     num_threads=2), 4)


def test_exact_resume_batch_map_over_cxx_batches(img_ds):
    resume_run(lambda: stoker.Loader(img_ds, batch_size=6, shuffle=True, seed=2, transforms=CROP,
                                     batch_map=mixup, num_threads=2), 3)


def test_batch_map_over_cxx_batches_sees_the_plain_batch(img_ds):
    plain = list(stoker.Loader(img_ds, batch_size=8, shuffle=True, seed=4, transforms=CROP))
    got = list(stoker.Loader(img_ds, batch_size=8, shuffle=True, seed=4, transforms=CROP,
                             batch_map=lambda b, rng: {**b, "sum": b["image"].sum((1, 2, 3))}))
    for p, g in zip(plain, got, strict=True):
        assert torch.equal(p["image"], g["image"]) and torch.equal(p["tok"], g["tok"])
        assert torch.equal(g["sum"], p["image"].sum((1, 2, 3)))


# -- map-style datasets ---------------------------------------------------------------

class Squares(torch.utils.data.Dataset):
    def __init__(self, n=30, kind="tuple"):
        self.n, self.kind = n, kind

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.full((2, 3), float(i))
        if self.kind == "tuple":
            return x, i * i
        if self.kind == "dict":
            return {"x": x, "y": i * i, "path": f"{i}.png"}
        return x


def test_map_style_dataset_like_dataloader():
    ds = Squares()
    want = list(torch.utils.data.DataLoader(ds, batch_size=4))
    got = list(stoker.Loader(ds, batch_size=4, num_threads=2))
    assert len(got) == len(want) == 8
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, list) and len(g) == 2  # default_collate's list for a tuple
        assert torch.equal(g[0], w[0]) and torch.equal(g[1], w[1])
    named = next(iter(stoker.Loader(ds, batch_size=4, names=("x", "y"))))
    assert list(named) == ["x", "y"] and named["y"].tolist() == [0, 1, 4, 9]
    d = next(iter(stoker.Loader(Squares(kind="dict"), batch_size=3)))
    assert d["path"] == ["0.png", "1.png", "2.png"] and d["x"].shape == (3, 2, 3)
    t = next(iter(stoker.Loader(Squares(kind="tensor"), batch_size=3)))
    assert isinstance(t, torch.Tensor) and t.shape == (3, 2, 3)
    with pytest.raises(ValueError, match="dataset index 0.*names= gives 3"):
        next(iter(stoker.Loader(ds, batch_size=3, names=("a", "b", "c"))))


def test_map_style_dataset_shuffled_ranks_padding_and_epochs():
    ds = Squares(n=23)
    seen = []
    for rank in range(3):
        loader = stoker.Loader(ds, batch_size=4, shuffle=True, seed=1, rank=rank, world_size=3)
        assert len(loader) == 2  # ceil(23 / 3) = 8 samples per rank
        loader.set_epoch(2)
        seen.append([int(v) for b in loader for v in b[1].sqrt().round()])
    assert all(len(s) == 8 for s in seen)
    assert sorted(set(sum(seen, []))) == list(range(23))  # 24 slots: one repeated (padding)
    # the same order as a stoker dataset of the same size
    order = [int(v) for b in stoker.Loader(ds, batch_size=5, shuffle=True, seed=1) for v in
             b[1].sqrt().round()]
    assert sorted(order) == list(range(23)) and order != list(range(23))


def test_lists_and_other_sequences_are_datasets():
    got = list(stoker.Loader([{"a": i} for i in range(5)], batch_size=2))
    assert [b["a"].tolist() for b in got] == [[0, 1], [2, 3], [4]]
    with pytest.raises(TypeError, match="IterableDataset"):
        stoker.Loader(torch.utils.data.IterableDataset(), batch_size=2)


# -- collate_fn ---------------------------------------------------------------------------

def yolo_collate(batch):
    imgs, labels = zip(*batch, strict=True)
    return torch.stack(imgs), [(i, lab) for i, lab in enumerate(labels)], "extra"


def test_collate_fn_as_dataloader_means_it():
    ds = Squares(10)
    want = list(torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=yolo_collate))
    got = list(stoker.Loader(ds, batch_size=4, collate_fn=yolo_collate, num_threads=2))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, tuple) and torch.equal(g[0], w[0]) and g[1:] == w[1:]


def test_collate_fn_after_map_over_a_stoker_dataset(img_ds):
    def collate(samples):
        return {"labels": [int(s["label"]) for s in samples], "n": len(samples)}

    got = list(stoker.Loader(img_ds, batch_size=25, map=lambda s, rng: s, collate_fn=collate))
    assert [g["n"] for g in got] == [25, 25, 10]
    assert sum((g["labels"] for g in got), []) == list(range(60))


# -- errors ---------------------------------------------------------------------------

class BoxError(Exception):
    pass


def failing_map(s, rng):
    if int(s["label"]) in (13, 17):
        raise BoxError(f"bad box in {int(s['label'])}")
    return {"label": s["label"]}


def test_map_error_surfaces_as_itself_with_traceback_and_sample(img_ds):
    loader = stoker.Loader(img_ds, batch_size=8, map=failing_map, num_threads=3)
    got = []
    with pytest.raises(BoxError, match="bad box in 13") as e:
        for b in loader:
            got.append(b)
    assert len(got) == 1  # batch 1 holds 13 (and 17 after it: the lowest position wins)
    frames = [f.name for f in traceback.extract_tb(e.value.__traceback__)]
    assert "failing_map" in frames
    note = "\n".join(e.value.__notes__)
    assert "sample 13 (" in note and ".stk: record" in note
    # the loader goes on: a new iterator starts cleanly
    assert len(list(stoker.Loader(img_ds, batch_size=8, map=lambda s, r: {"l": s["label"]}))) == 8


def test_dataset_error_names_the_dataset_index():
    class Broken(Squares):
        def __getitem__(self, i):
            if i == 6:
                raise KeyError("no file for 6")
            return super().__getitem__(i)

    with pytest.raises(KeyError) as e:
        list(stoker.Loader(Broken(), batch_size=4))
    assert "dataset index 6" in "\n".join(e.value.__notes__)


def test_skip_replaces_with_the_next_good_sample_and_counts(img_ds):
    loader = stoker.Loader(img_ds, batch_size=8, map=failing_map, on_error="skip",
                           num_threads=2)
    with pytest.warns(RuntimeWarning, match="replaced 2"):
        labels = [v for b in loader for v in b["label"].tolist()]
    assert len(labels) == 60
    assert labels[13] == 14 and labels[17] == 18  # the next sample in dataset order
    assert loader.stats()["skipped"] == 2


def test_batch_map_and_collate_errors_name_the_batch():
    def bad(batch, rng):
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch") as e:
        list(stoker.Loader(Squares(), batch_size=4, batch_map=bad))
    assert "batch_map for batch 0 of epoch 0" in "\n".join(e.value.__notes__)
    with pytest.raises(ZeroDivisionError) as e:
        list(stoker.Loader(Squares(), batch_size=4, collate_fn=lambda b: 1 / 0))
    assert "collate_fn for batch 0" in "\n".join(e.value.__notes__)


@pytest.mark.parametrize("ret, err, match", [
    (lambda s: {"x": torch.zeros(2, device="meta")}, ValueError, "tensor on meta"),
])
def test_wrong_returns_are_clear_errors(img_ds, ret, err, match):
    with pytest.raises(err, match=match) as e:
        list(stoker.Loader(img_ds, batch_size=4, map=lambda s, rng: ret(s)))
    assert "sample 0 (" in str(e.value)


def test_a_return_of_another_structure_is_a_clear_error(img_ds):
    def fn(s, rng):
        return {"a": 1} if int(s["label"]) < 2 else [1]

    # The structure is fixed by the first sample checked, which with several threads need
    # not be sample 0: the error names both samples, whichever came first.
    with pytest.raises(TypeError) as e:
        list(stoker.Loader(img_ds, batch_size=4, map=fn, num_workers=1))
    m = re.match(r"sample (\d+) \(.*record \d+\): the sample of the map output is a (\w+), "
                 r"where sample (\d+) \(.*record \d+\) has a (\w+)$", str(e.value))
    assert m, str(e.value)
    kinds = {int(m[1]): m[2], int(m[3]): m[4]}
    assert set(kinds.values()) == {"dict", "list"}
    assert all(kind == ("dict" if i < 2 else "list") for i, kind in kinds.items())


def test_layout_disagreement_names_sample_field_and_shapes():
    class Boxes(Squares):
        def __getitem__(self, i):
            return {"boxes": np.zeros((2 if i < 5 else 3, 4), np.float32)}

    class Pairs(Squares):
        def __getitem__(self, i):
            return (np.zeros((2 if i < 5 else 3, 4), np.float32), i)

    # inside a tuple a varying shape has no place for its lengths: an error, as for
    # default_collate, naming the sample, the field and both shapes
    with pytest.raises(ValueError, match=r"dataset index 5: field 0 has shape \(3, 4\).*"
                                         r"inferred from dataset index 0.*\(2, 4\)"):
        list(stoker.Loader(Pairs(), batch_size=8, num_workers=1))
    # a dict's value is padded, with its lengths, where it varies
    got = next(iter(stoker.Loader(Boxes(), batch_size=8)))
    assert got["boxes"].shape == (8, 3, 4) and got["boxes_lengths"].tolist() == [2] * 5 + [3] * 3
    got = next(iter(stoker.Loader(Boxes(), batch_size=4,
                                  map_fields={"boxes": stoker.ndarray("float32", (None, 4))})))
    assert got["boxes"].shape == (4, 2, 4) and got["boxes_lengths"].tolist() == [2] * 4


def test_argument_errors(img_ds):
    with pytest.raises(TypeError, match="map must be a function"):
        stoker.Loader(img_ds, map=3)
    with pytest.raises(ValueError, match="transforms"):
        stoker.Loader(Squares(), transforms=CROP)
    with pytest.raises(ValueError, match="map_fields"):
        stoker.Loader(img_ds, map_fields={"x": object})
    with pytest.raises(ValueError, match="batch_map"):
        stoker.Loader(img_ds, device="cuda", collate_fn=yolo_collate)


# -- lifecycle ------------------------------------------------------------------------

def slow_map(s, rng):
    time.sleep(0.002)
    return {"label": s["label"]}


def python_threads(settle=False):
    """The stage threads of this process (after the dropped loaders' ones ended)."""
    import gc

    if settle:
        deadline = time.monotonic() + 5
        while python_threads() and time.monotonic() < deadline:
            gc.collect()  # a dropped loader in a reference cycle goes at a collection
            time.sleep(0.02)
    return [n for n in stoker_threads() if n.startswith("stoker-python")]


def test_break_close_and_two_iterators(img_ds):
    assert python_threads(settle=True) == []
    loader = stoker.Loader(img_ds, batch_size=4, map=slow_map, num_threads=2)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert [v for b in loader for v in b["label"].tolist()] == list(range(60))  # next epoch
    both = list(zip(loader, loader, strict=True))
    assert all(torch.equal(a["label"], b["label"]) for a, b in both) and len(both) == 15
    assert sorted(python_threads()) == ["stoker-python-0", "stoker-python-1"]
    loader.close()  # joined: the OS threads end a moment after
    assert python_threads(settle=True) == []
    assert len(list(loader)) == 15  # usable after close()


def test_batches_dropped_by_a_break_leave_nothing_behind(img_ds):
    """A batch whose stream stopped before all its chunks were taken is never finished:
    the stage drops its partial rows (27 of 30 stayed, before)."""
    loader = stoker.Loader(img_ds, batch_size=8, map=lambda s, rng: {"y": s["label"]},
                           num_threads=2, prefetch_next_epoch=False)
    for _ in range(30):
        it = iter(loader)
        next(it)
        del it
    assert len(list(loader)) == 8
    assert len(loader._stage._pending) == 0
    loader.close()


def test_dropped_loader_ends_its_threads(img_ds):
    python_threads(settle=True)
    loader = stoker.Loader(img_ds, batch_size=4, map=slow_map, num_threads=2)
    next(iter(loader))
    assert len(python_threads()) == 2
    del loader
    assert python_threads(settle=True) == []


def test_ctrl_c_interrupts_a_wait_on_the_python_stage(img_ds):
    def very_slow(s, rng):
        time.sleep(0.2)
        return {"label": s["label"]}

    loader = stoker.Loader(img_ds, batch_size=16, map=very_slow, num_threads=1)
    it = iter(loader)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    old = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(it)  # 16 x 0.2 s of map: interrupted long before
    finally:
        signal.signal(signal.SIGALRM, old)
    assert time.monotonic() - t0 < 2.0
    loader.close()
    fast = stoker.Loader(img_ds, batch_size=16, map=slow_map)
    assert len(list(fast)) == 4


def test_fork_child_refuses_the_parents_loader(img_ds):
    loader = stoker.Loader(img_ds, batch_size=4, map=slow_map, num_threads=2)
    next(iter(loader))
    pid = os.fork()
    if pid == 0:  # the child: a clear error, and a new loader works
        code = 1
        try:
            try:
                iter(loader)
            except RuntimeError as e:
                if "another process" in str(e):
                    fresh = stoker.Loader(img_ds, batch_size=4, map=slow_map, num_threads=2)
                    code = 0 if len(list(fresh)) == 15 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert len(list(loader)) == 15


# -- telemetry, pickling, device ------------------------------------------------------

def test_stats_have_the_python_stage(img_ds):
    loader = stoker.Loader(img_ds, batch_size=4, map=slow_map, num_threads=2)
    list(loader)
    s = loader.stats()
    assert s["python_seconds"] >= 60 * 0.002 * 0.9
    assert s["stage_seconds_per_batch"]["python"] > 0
    assert s["read_seconds"] > 0 and s["decode_seconds"] > 0  # the C++ fetch, counted apart
    assert s["batches"] == 15 and s["samples"] == 60


def module_map(s, rng):
    return {"label": s["label"], "r": rng.random()}


def test_pickled_loader_keeps_its_hooks_and_position(img_ds):
    loader = stoker.Loader(img_ds, batch_size=4, shuffle=True, map=module_map, num_threads=2)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    clone = pickle.loads(pickle.dumps(loader))  # its drawn seed goes with its state
    rest = list(clone)
    full = list(stoker.Loader(img_ds, batch_size=4, shuffle=True, map=module_map,
                              seed=loader.seed))
    same_batches(first + rest, full)
    with pytest.raises(TypeError, match="map=<function.*lambda.*top level of a module"):
        pickle.dumps(stoker.Loader(img_ds, batch_size=4, map=lambda s, rng: s))
    pickle.loads(pickle.dumps(stoker.Loader(Squares(), batch_size=4)))  # a torch dataset


def test_batch_map_on_the_device_after_the_copy(img_ds):
    """device='cuda' through the host fake: batch_map receives the batch the copy
    delivered (fresh fake device memory is poisoned, so a batch_map that ran before the
    copy completed would see 0xCD), and gives what the CPU path's batch_map gives."""
    from conftest import fake_device_loader

    def stamp(batch, rng):
        return {**batch, "u": torch.tensor(rng.random())}

    cpu = list(stoker.Loader(img_ds, batch_size=8, shuffle=True, seed=5, transforms=CROP,
                             batch_map=stamp))
    fake = fake_device_loader(img_ds, 300, batch_size=8, shuffle=True, seed=5, transforms=CROP,
                              batch_map=stamp, num_threads=2)
    got = list(fake)
    same_batches(got, cpu)
    fake.close()  # copies are counted once the copy thread sees them done: it waits at close
    assert fake.stats()["copies"] >= len(cpu)
    mapped = fake_device_loader(img_ds, 300, batch_size=8, shuffle=True, seed=5,
                                transforms=CROP, map=jitter, map_fields=JITTER_FIELDS,
                                batch_map=stamp)
    want = list(stoker.Loader(img_ds, batch_size=8, shuffle=True, seed=5, transforms=CROP,
                              map=jitter, map_fields=JITTER_FIELDS, batch_map=stamp))
    same_batches(list(mapped), want)


def test_data_stall_counts_the_python_stage_time_in_next(img_ds):
    """data_stall is the share of the loop spent in next(), the Python stage's part of it
    too: here batch_map runs in next() (device='cuda' through the host fake runs it on
    the consumer's thread) for 40 ms a batch, while the workers keep batches ready, so
    next() barely waits for the core and the loop is nearly all next(). 15 batches: the
    loop is long enough (0.6 s) that one preemption of this machine's Python outside the
    loader's clock (a few ms) stays well inside the tolerance."""
    from conftest import fake_device_loader, timed_loop

    def slow(batch, rng):
        time.sleep(0.04)
        return batch

    loader = fake_device_loader(img_ds, batch_size=4, transforms=CROP, batch_map=slow,
                                stall_warning=None)
    in_next, wall, _ = timed_loop(loader, 0)
    loader.close()
    s = loader.stats()
    assert in_next / wall > 0.9
    assert s["data_stall"] == pytest.approx(in_next / wall, abs=0.05)
    assert s["wait_seconds"] >= 0.04 * s["batches"]
    # the workers kept up: the verdict says so, and names next()'s own time
    assert s["bottleneck"] == "consumer" and "next() itself took" in s["verdict"]


# -- torchrun, docs -------------------------------------------------------------------

def test_python_dataset_under_torchrun_two_processes(tmp_path):
    """Two ranks over a torch Dataset: disjoint shares (but for DistributedSampler's
    padding), equal batches, every sample each epoch, draws keyed by the sample."""
    import json
    import subprocess
    import sys

    from stoker._stage.rng import sample_rng

    out = str(tmp_path / "ddp")
    script = os.path.join(os.path.dirname(__file__), "frameworks", "torchrun_python_dataset.py")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node=2", script, out], capture_output=True, text=True,
                       timeout=240, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    res = []
    for r in range(2):
        with open(f"{out}.{r}") as f:
            res.append(json.load(f))
    assert [r["world"] for r in res] == [2, 2] and res[0]["len"] == res[1]["len"] == 6
    for epoch in range(2):
        shares = [[i for b in r["epochs"][epoch] for i in b["i"]] for r in res]
        assert [len(b["i"]) for b in res[0]["epochs"][epoch]] == \
            [len(b["i"]) for b in res[1]["epochs"][epoch]]  # equal batches on both ranks
        assert len(shares[0]) == len(shares[1]) == 23  # ceil(45 / 2)
        assert sorted(set(shares[0] + shares[1])) == list(range(45))
        assert len(set(shares[0]) & set(shares[1])) == 1  # the one padding sample
        for r in res:
            for b in r["epochs"][epoch]:
                for i, x in zip(b["i"], b["x"]):
                    assert x == pytest.approx(i + sample_rng(7, epoch, i).random())


DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                   "python.md")


def doc_blocks():
    import re

    with open(DOC) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def test_yolo_example_boxes_match_a_plain_python_reference(tmp_path, monkeypatch):
    """The YOLO-style example of docs/python.md, end to end: every target of every batch
    (and every mosaic pixel) equals what a plain-Python re-implementation computes from
    the stored boxes and the same draws."""
    from stoker._stage.rng import sample_rng

    code = next(b for b in doc_blocks() if "def mosaic" in b)
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(code, DOC, "exec"), scope)
    ds, S, TILE, loader = scope["ds"], scope["S"], scope["TILE"], scope["loader"]

    def reference(index, epoch):
        rng = sample_rng(0, epoch, index)  # the loader's seed=0
        xc, yc = (int(v) for v in rng.integers(S // 4, 3 * S // 4 + 1, 2))
        others = [int(j) for j in rng.integers(0, len(ds), 3)]
        canvas = np.full((S, S, 3), 114, np.uint8)
        rows = []
        for k, j in enumerate([index] + others):
            seed = int(rng.integers(2**63))
            w, h = Image.open(io.BytesIO(ds[j]["image"])).size
            x0 = xc - S // 2 if k % 2 == 0 else xc
            y0 = yc - S // 2 if k < 2 else yc
            tile_img = ds.sample(j, TILE, seed=seed)["image"]
            for yy in range(S // 2):
                for xx in range(S // 2):
                    if 0 <= y0 + yy < S and 0 <= x0 + xx < S:
                        canvas[y0 + yy, x0 + xx] = tile_img[yy, xx]
            stored = ds[j]
            for (bx0, by0, bx1, by1), c in zip(stored["boxes"].tolist(),
                                               stored["classes"].tolist()):
                sx, sy = (S / 2) / w, (S / 2) / h
                box = [bx0 * sx + x0, by0 * sy + y0, bx1 * sx + x0, by1 * sy + y0]
                lo_x, hi_x = max(x0, 0), min(x0 + S // 2, S)
                lo_y, hi_y = max(y0, 0), min(y0 + S // 2, S)
                box = [min(max(box[0], lo_x), hi_x), min(max(box[1], lo_y), hi_y),
                       min(max(box[2], lo_x), hi_x), min(max(box[3], lo_y), hi_y)]
                if box[2] - box[0] > 2 and box[3] - box[1] > 2:
                    rows.append((c, box))
        if rng.random() < 0.5:
            canvas = canvas[:, ::-1]
            rows = [(c, [S - b[2], b[1], S - b[0], b[3]]) for c, b in rows]
        targets = [[c, (b[0] + b[2]) / 2 / S, (b[1] + b[3]) / 2 / S, (b[2] - b[0]) / S,
                    (b[3] - b[1]) / S] for c, b in rows]
        return canvas, targets

    checked = 0
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            for i, index in enumerate(batch["id"].tolist()):
                canvas, want = reference(index, epoch)
                got = batch["targets"][batch["targets"][:, 0] == i][:, 1:].tolist()
                assert len(got) == len(want), (epoch, index)
                for g, w in zip(got, want, strict=True):
                    assert g == pytest.approx(w, abs=1e-5), (epoch, index)
                img = (batch["img"][i].permute(1, 2, 0) * 255).round().to(torch.uint8)
                assert np.array_equal(img.numpy(), canvas), (epoch, index)
                checked += len(want)
    assert checked > 50  # boxes were moved, clipped, dropped and flipped, and all checked
