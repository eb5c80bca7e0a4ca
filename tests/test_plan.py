"""Declare, then build (NOTE [ Loader plan ] in stoker/_plan.py): arguments give a plan,
checked and printable, with no thread started; the Loader is built from it."""

import inspect
import threading

import numpy as np
import pytest
import stoker
import torch
from conftest import png, write_dataset
from stoker import _plan
from stoker import ops as T


def no_new_threads(fn):
    before = {t.ident for t in threading.enumerate()}
    out = fn()
    assert {t.ident for t in threading.enumerate()} <= before
    return out


def test_loader_signature_and_plan_defaults_agree():
    params = inspect.signature(stoker.Loader.__init__).parameters
    named = {k: p.default for k, p in params.items()
             if k not in ("self", "dataset") and p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                             p.KEYWORD_ONLY)}
    assert named == _plan.DEFAULTS


def test_records_plan(tmp_path):
    ds = write_dataset(tmp_path / "ds", 20)
    p = no_new_threads(lambda: _plan.plan(ds, batch_size=8, shuffle=True, seed=-1))
    assert p.source.kind == "records" and p.producer == "RecordProducer" and p.stage is None
    assert p.sampling.batch_size == 8 and p.sampling.shuffle
    assert p.sampling.seed == -1 and p.sampling.seed64 == 2**64 - 1  # reduced once
    assert p.records is not None and p.records.images == () and p.records.groups == ()
    assert p.delivery.device == "cpu"
    text = str(p)
    assert "records" in text and "RecordProducer" in text and "batch_size=8" in text
    # the same arguments, the same plan (a plan compares by value)
    assert _plan.plan(ds, batch_size=8, shuffle=True, seed=-1) == p


def test_image_groups_and_batch_map_plan(tmp_path):
    import io

    from PIL import Image

    def png(arr):
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="PNG")
        return buf.getvalue()

    fields = {"image": stoker.image(), "mask": stoker.image(mode="L"),
              "boxes": stoker.boxes(), "classes": stoker.ndarray("int64", (None,))}
    with stoker.ShardWriter(tmp_path / "img", fields) as w:
        w.write({"image": png(np.zeros((8, 8, 3), np.uint8)),
                 "mask": png(np.zeros((8, 8), np.uint8)),
                 "boxes": np.zeros((1, 4), np.float32), "classes": np.zeros(1, np.int64)})
    ds = stoker.Dataset(tmp_path / "img")

    def gn(batch, rng):
        return batch

    p = _plan.plan(ds, batch_size=2, batch_map=gn, transforms={
        ("image", "mask", "boxes", "classes"): [T.RandomHorizontalFlip()]})
    assert p.producer == "RecordProducer" and p.records.handoff
    assert p.stage is not None and p.stage.fetch == "batches" and p.stage.batch_map is gn
    (g,) = p.records.groups
    assert g.fields == ("image", "mask", "boxes", "classes")
    assert [t[0] for t in g.targets] == ["image", "mask", "boxes", "rows"]
    assert p.delivery.nchw_views == ("image", "mask")
    assert "transforms[image, mask, boxes, classes]" in str(p)


def test_map_style_and_map_plans(tmp_path):
    tds = torch.utils.data.TensorDataset(torch.arange(10.0))
    p = _plan.plan(tds, batch_size=4, python_workers="process")
    assert p.source.kind == "map-style" and p.producer == "PythonProducer"
    assert p.stage.fetch == "map-style" and p.stage.processes
    ds = write_dataset(tmp_path / "ds", 10)

    def fn(sample, rng):
        return sample

    p = _plan.plan(ds, batch_size=4, map=fn)
    assert p.producer == "PythonProducer" and p.stage.fetch == "records"
    assert p.stage.map is fn and p.records is None and p.stage.records is not None


def test_every_check_is_in_the_plan(tmp_path):
    ds = write_dataset(tmp_path / "ds", 10)
    tds = torch.utils.data.TensorDataset(torch.arange(10.0))
    cases = [
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(on_error="ignore"), ValueError, "on_error"),
        (dict(shard_window=2), ValueError, "shuffle=True"),
        (dict(drop_last=True, even_batches=False), ValueError, "even_batches"),
        (dict(image_layout="NHWC"), ValueError, "image_layout"),
        (dict(device="mps"), ValueError, "device"),
        (dict(labels="unshifted"), ValueError, "labels="),
        (dict(map_fields={"x": object}), ValueError, "map_fields"),
        (dict(python_workers="fork"), ValueError, "python_workers"),
        (dict(seed=2**64), ValueError, "seed"),
        (dict(map=3), TypeError, "map must be a function"),
        (dict(no_such_argument=1), TypeError, "no_such_argument"),
    ]
    for kw, exc, words in cases:
        with pytest.raises(exc, match=words):
            no_new_threads(lambda kw=kw: _plan.plan(ds, **kw))
        with pytest.raises(exc, match=words):  # the Loader raises the plan's error
            stoker.Loader(ds, **kw)
    with pytest.raises(ValueError, match="map-style dataset has none"):
        _plan.plan(tds, shuffle=True, shard_window=2)


def test_token_plan(tmp_path):
    path = tmp_path / "train.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    ds = stoker.TokenDataset(str(path), dtype="uint16")
    p = _plan.plan(ds, batch_size=2, seq_len=16)
    assert p.source.kind == "tokens" and p.producer == "TokenProducer" and p.is_tokens
    assert p.tokens["seq_len"] == 16
    with pytest.raises(ValueError, match="transforms"):
        _plan.plan(ds, batch_size=2, seq_len=16, transforms={"x": []})


def test_loader_keeps_its_plan(tmp_path):
    ds = write_dataset(tmp_path / "ds", 10)
    with stoker.Loader(ds, batch_size=4, seed=3) as loader:
        assert loader.plan == _plan.plan(ds, batch_size=4, seed=3)
        assert [b["label"].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(6))


def test_each_kind_of_dataset_is_a_source_class_its_plan_prints(tmp_path):
    """NOTE [ Sources ] in stoker/_sources/__init__.py: LoaderPlan.source is a class per
    kind of dataset, shown by print(plan), with its kind for messages."""
    from stoker import _sources

    ds = write_dataset(tmp_path / "a", 6)
    other = write_dataset(tmp_path / "b", 4)
    toks = {}
    for n in ("web", "code"):
        path = tmp_path / f"{n}.bin"
        (np.arange(2000) % 97).astype(np.uint16).tofile(path)
        toks[n] = stoker.TokenDataset(str(path), dtype="uint16", eos_id=0)
    cases = [
        (ds, {}, _sources.RecordsSource, "records"),
        (str(tmp_path / "a"), {}, _sources.RecordsSource, "records"),  # a path opens
        (list(range(6)), {}, _sources.MapDatasetSource, "map-style"),
        (_Stream(), {}, _sources.IterableSource, "iterable"),
        (toks["web"], {"seq_len": 16}, _sources.TokensSource, "tokens"),
        (stoker.Mix({"a": ds, "b": other}), {}, _sources.MixtureSource, "mixture"),
        (stoker.Mix(toks), {"seq_len": 16}, _sources.TokenMixtureSource, "token mixture"),
    ]
    for dataset, kw, cls, kind in cases:
        p = no_new_threads(lambda d=dataset, k=kw: _plan.plan(d, batch_size=2, **k))
        assert type(p.source) is cls and p.source.kind == kind, (kind, p.source)
        assert str(p).splitlines()[0].startswith(f"LoaderPlan: {cls.__name__} ("), str(p)
        assert p.is_tokens == p.source.batches_are_tokens == kind.startswith("token")
        # a source holds no state: equal plans, equal sources
        assert _plan.plan(dataset, batch_size=2, **kw).source == p.source
    assert len({cls for _, _, cls, _ in cases}) == len(_sources.__all__) - 3  # all but
    # Source, Running and source_of


def test_dataset_sample_is_planned_as_a_loaders_map_samples(tmp_path):
    """Dataset.sample reads through the records source's fetch plan: what map= receives,
    a transform group with no op included (its boxes as stored, as the loader's, not
    clipped to the image by a group of no ops)."""
    fields = {"image": stoker.image(), "boxes": stoker.boxes(),
              "classes": stoker.ndarray("int64", (None,))}
    with stoker.ShardWriter(tmp_path / "ds", fields) as w:
        for _ in range(3):  # the second box reaches past the 64x48 image
            w.write({"image": png(np.full((48, 64, 3), 90, np.uint8)),
                     "boxes": [[2, 2, 14, 14], [60, 40, 70, 50]], "classes": [1, 2]})
    ds = stoker.Dataset(tmp_path / "ds")
    received = []

    def keep(sample, rng):
        received.append(sample)
        return {"n": len(sample["boxes"])}

    for transforms in ({("image", "boxes", "classes"): []}, {"image": [T.Resize(16)]}):
        received.clear()
        with stoker.Loader(ds, batch_size=1, map=keep, transforms=transforms, seed=0,
                           num_workers=0, as_stored=["boxes", "classes"]
                           if "image" in transforms else None) as loader:
            list(loader)
        for i, got in enumerate(received):
            s = ds.sample(i, transforms, seed=0, as_stored=["boxes", "classes"]
                          if "image" in transforms else None)
            assert s.keys() == got.keys()
            for k in s:
                assert np.array_equal(s[k], got[k]), (transforms, k)
        assert received[0]["boxes"].tolist() == [[2, 2, 14, 14], [60, 40, 70, 50]]
