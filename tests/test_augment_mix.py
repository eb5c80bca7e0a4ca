"""batch_transforms: MixUp and CutMix on each assembled batch, through the Loader, held to
their definitions (torchvision's pairing of each row with the row before it, timm's
probability, label smoothing and switch between the two) on the same batches loaded
without them. Tolerances: a mixed uint8 pixel within 1 level of the float blend (rounding);
soft labels to 1e-6."""


import augment_reference as ref
import numpy as np
import pytest
import stoker
import torch
from conftest import png
from stoker import ops as T

K = 7



@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("mix") / "ds"
    rng = np.random.default_rng(0)
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(path, fields, shard_size="64KB") as w:
        for i in range(40):
            w.write({"image": png(rng.integers(0, 256, (16, 20, 3), dtype=np.uint8)),
                     "label": i % K})
    return stoker.Dataset(path)


def load(ds, batch_transforms=None, threads=2, epochs=1, **kw):
    loader = stoker.Loader(ds, batch_size=8, shuffle=True, seed=1, num_threads=threads,
                           batch_transforms=batch_transforms, **kw)
    out = []
    for e in range(epochs):
        loader.set_epoch(e)
        for b in loader:
            if b["image"].dtype == torch.bfloat16:
                b["image"] = b["image"].float()
            out.append({k: v.numpy().copy() for k, v in b.items()})
    return out


def lam_of(soft, labels, smoothing=0.0):
    """lam from the soft labels: row 0 holds lam at its own class (its partner differs)."""
    off = smoothing / K
    on = 1.0 - smoothing + off
    for i in range(len(labels)):
        if labels[i] != labels[i - 1]:
            return (soft[i, labels[i]] - off) / (on - off)
    raise AssertionError("every row has its partner's class")


def test_mixup_blends_each_image_with_the_one_before(ds):
    plain = load(ds, epochs=2)
    mixed = load(ds, [T.MixUp(0.8, num_classes=K)], epochs=2)
    lams = []
    for p, m in zip(plain, mixed, strict=True):
        y = p["label"]
        assert m["label"].dtype == np.float32 and m["label"].shape == (len(y), K)
        lam = lam_of(m["label"], y)
        lams.append(lam)
        np.testing.assert_allclose(m["label"], ref.mix_labels(y, K, lam), atol=1e-6)
        x = p["image"].astype(np.float64)
        want = lam * x + (1 - lam) * np.roll(x, 1, axis=0)
        assert np.abs(m["image"].astype(np.float64) - want).max() <= 1.0
    assert len(set(np.round(lams, 6))) == len(lams)   # a lam per batch


def test_cutmix_pastes_a_box_from_the_image_before(ds):
    plain = load(ds, epochs=2)
    mixed = load(ds, [T.CutMix(1.0, num_classes=K, label_smoothing=0.1)], epochs=2)
    for p, m in zip(plain, mixed, strict=True):
        x, got = p["image"], m["image"]
        prev = np.roll(x, 1, axis=0)
        from_prev = (got == prev).all(1) & (got != x).any(1)   # (b, h, w)
        union = from_prev.any(0)
        ys, xs = np.nonzero(union)
        inside = np.zeros_like(union)
        if len(ys):
            inside[ys.min():ys.max() + 1, xs.min():xs.max() + 1] = True
        for i in range(len(x)):
            # outside the box the image is its own; inside, its predecessor's
            np.testing.assert_array_equal(got[i][:, ~inside], x[i][:, ~inside])
            np.testing.assert_array_equal(got[i][:, inside], prev[i][:, inside])
        lam = 1 - inside.mean()
        np.testing.assert_allclose(m["label"], ref.mix_labels(p["label"], K, lam, 0.1),
                                   atol=1e-6)


@pytest.mark.parametrize("switch_prob", [0.0, 0.5, 1.0])
def test_timm_switch_between_mixup_and_cutmix(ds, switch_prob):
    plain = load(ds, epochs=10)
    mixed = load(ds, [T.MixUp(1.0, num_classes=K, switch_prob=switch_prob),
                      T.CutMix(1.0, num_classes=K)], epochs=10)
    cut = 0
    for p, m in zip(plain, mixed, strict=True):
        x, got = p["image"], m["image"]
        # CutMix copies every pixel from the image or its predecessor, and its lam is the
        # area kept, a whole number of pixels; MixUp blends them with any lam
        copied = ((got == x) | (got == np.roll(x, 1, axis=0))).all()
        area = lam_of(m["label"], p["label"]) * x.shape[2] * x.shape[3]
        cut += bool(copied and abs(area - round(area)) < 1e-3)
    n = len(plain)
    if switch_prob in (0.0, 1.0):
        assert cut == n * switch_prob
    else:
        assert 0.25 * n <= cut <= 0.75 * n   # binomial(50, 0.5): p < 1e-3 outside


def test_p_leaves_some_batches_unmixed_with_plain_one_hot_labels(ds):
    plain = load(ds, epochs=5)
    mixed = load(ds, [T.MixUp(1.0, num_classes=K, p=0.5)], epochs=5)
    untouched = 0
    for p, m in zip(plain, mixed, strict=True):
        if np.array_equal(p["image"], m["image"]):
            untouched += 1
            np.testing.assert_array_equal(m["label"], np.eye(K, dtype=np.float32)[p["label"]])
    assert 0 < untouched < len(plain)


def test_mixes_are_the_same_for_any_thread_count_and_resume_exactly(ds):
    bt = [T.MixUp(0.8, num_classes=K), T.CutMix(1.0, num_classes=K)]
    one, two = load(ds, bt, threads=1), load(ds, bt, threads=2)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["label"], b["label"])
    loader = stoker.Loader(ds, batch_size=8, shuffle=True, seed=1, num_threads=2,
                           batch_transforms=bt)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    resumed = stoker.Loader(ds, batch_size=8, shuffle=True, seed=1, num_threads=1,
                            batch_transforms=bt)
    resumed.load_state_dict(state)
    rest = [{k: v.numpy() for k, v in b.items()} for b in resumed]
    assert len(rest) == len(one) - 2
    for a, b in zip(rest, one[2:], strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["label"], b["label"])


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_mix_after_normalize_to_float(ds, dtype, tol):
    norm = {"image": [T.Normalize([0.5] * 3, [0.25] * 3, dtype)]}
    plain = load(ds, transforms=norm)
    mixed = load(ds, [T.MixUp(0.8, num_classes=K)], transforms=norm)
    for p, m in zip(plain, mixed, strict=True):
        assert m["image"].dtype == np.float32   # (bfloat16, widened by load())
        lam = lam_of(m["label"], p["label"])
        want = lam * p["image"] + (1 - lam) * np.roll(p["image"], 1, axis=0)
        np.testing.assert_allclose(m["image"], want, rtol=tol, atol=tol)


def test_bad_batch_transforms_are_refused(ds, tmp_path):
    with pytest.raises(ValueError, match="num_classes"):
        T.MixUp(1.0)
    with pytest.raises(ValueError, match="disagree on num_classes"):
        stoker.Loader(ds, batch_size=4, batch_transforms=[T.MixUp(1.0, num_classes=K),
                                                          T.CutMix(1.0, num_classes=K + 1)])
    with pytest.raises(ValueError, match="no field"):
        stoker.Loader(ds, batch_size=4,
                      batch_transforms=[T.MixUp(1.0, num_classes=K, labels="y")])
    with pytest.raises(ValueError, match="MixUp or CutMix"):
        stoker.Loader(ds, batch_size=4, batch_transforms=[T.RandomHorizontalFlip()])
    # a label outside [0, num_classes): the iterating thread gets the record and field
    loader = stoker.Loader(ds, batch_size=8, batch_transforms=[T.MixUp(1.0, num_classes=3)])
    with pytest.raises(Exception, match=r"label [3-6] is outside \[0, num_classes=3\)"):
        list(loader)


def test_batch_map_sees_the_mixed_batch_and_map_refuses_mixes(ds):
    seen = []

    def gn(batch, rng):
        seen.append(batch["label"].clone())
        return batch

    bt = [T.MixUp(0.8, num_classes=K)]
    mixed = load(ds, bt)
    via_map = load(ds, bt, batch_map=gn)
    # (batch_map may also have seen batches of the next epoch, prefetched)
    assert len(seen) >= len(mixed) and all(s.shape == (8, K) for s in seen)
    for a, b in zip(mixed, via_map, strict=True):
        assert any(np.array_equal(s.numpy(), a["label"]) for s in seen)
        np.testing.assert_array_equal(a["label"], b["label"])
        np.testing.assert_array_equal(a["image"], b["image"])
    with pytest.raises(ValueError, match="do not work with map="):
        stoker.Loader(ds, batch_size=8, batch_transforms=bt, map=lambda s, rng: s)
