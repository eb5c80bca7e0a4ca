"""stoker.video(): frame-exact clips against PyAV's full sequential decode (every codec
both PyAV encodes and this build decodes; B-frames and variable frame rates), through the
loader (shapes, times, ops on every frame with one draw, the same clips for any thread
count and after a resume, on_error="skip", mixtures, the Python stage)."""

import io

import av
import numpy as np
import pytest
import stoker
import torch
from conftest import same_for_threads_and_resume
from media_reference import decode_all, encoders_here, make_video
from stoker import _core

pytestmark = pytest.mark.skipif(not _core.build_info()["video"],
                                reason="built without FFmpeg (STOKER_WITH_VIDEO=OFF)")

CODECS = encoders_here()


def test_codecs_cover_the_issue():
    """This build decodes what the fields are documented for, and the tests encode it."""
    for codec in ("h264", "hevc", "vp9", "av1"):
        assert codec in _core.media_codecs().split(",")
        assert codec in CODECS


@pytest.mark.parametrize("codec", CODECS)
def test_random_clips_equal_pyav(codec):
    """200 random clips over a B-frame stream and a variable-frame-rate stream of `codec`:
    every frame equals PyAV's full decode at the same presentation time, bit for bit."""
    videos = [make_video(codec, frames=48, bframes=True),
              make_video(codec, frames=40, vfr=True, gop=8)]
    checked = 0
    for v, data in enumerate(videos):
        ref = decode_all(data)
        record = stoker.video().encode(data)
        info = _core.video_info(record)
        assert info["frames"] == len(ref)
        np.testing.assert_allclose(info["pts"], [t for t, _ in ref], rtol=0, atol=1e-12)
        for seed in range(100):
            num, step = [(1, 1), (4, 1), (5, 3), (3, 9), (16, 2)][seed % 5]
            spec = stoker.ops.RandomClip(num, step=step).spec(layout="HWC")
            frames, pts = _core.decode_clip(record, spec, seed)
            ids = _core.clip_frames(record, spec, seed)
            for j, i in enumerate(ids):
                assert pts[j] == pytest.approx(ref[i][0], abs=1e-12)
                np.testing.assert_array_equal(frames[j], ref[i][1],
                                              err_msg=f"{codec} video {v} seed {seed} frame {i}")
            checked += 1
    assert checked == 200


def test_the_stream_probe_is_stored_at_write_time():
    """A record keeps what FFmpeg's stream probe finds (the decoder's reorder delay), so a
    clip opens the file without probing; a record without it (an older writer's: the probe
    flag alone) is probed again and gives the same frames; a delay no decoder has is
    refused when the record is read."""
    import struct

    for codec in ("h264", "vp9"):  # mp4 with B-frames, webm: both need the probe
        data = make_video(codec, frames=36, bframes=True, gop=12)
        with av.open(io.BytesIO(data)) as c:
            probed = c.streams.video[0].codec_context.has_b_frames
        record = stoker.video().encode(data)
        flags, delay = struct.unpack_from("<ii", record, 40)
        assert flags == 3 and _core.video_info(record)["reorder_delay"] == delay
        assert bool(delay) == probed and (delay > 0) == (codec == "h264")
        older = bytearray(record)
        struct.pack_into("<ii", older, 40, 1, 0)
        assert _core.video_info(bytes(older))["reorder_delay"] is None
        ref = decode_all(data)
        for seed in range(12):
            spec = stoker.ops.RandomClip(5, step=2).spec(layout="HWC")
            ids = _core.clip_frames(record, spec, seed)
            for r in (record, bytes(older)):
                frames, _ = _core.decode_clip(r, spec, seed)
                for j, i in enumerate(ids):
                    np.testing.assert_array_equal(frames[j], ref[i][1])
        bad = bytearray(record)
        struct.pack_into("<i", bad, 44, 99)
        with pytest.raises(stoker.DecodeError, match="reorder delay of 99"):
            _core.video_info(bytes(bad))


def test_clip_by_time_on_a_variable_rate():
    """fps=: each time takes the frame shown then (the last at or before it)."""
    data = make_video("h264", frames=40, vfr=True)
    ref = decode_all(data)
    times = np.array([t for t, _ in ref])
    record = stoker.video().encode(data)
    for seed in range(20):
        spec = stoker.ops.RandomClip(6, fps=10).spec(layout="HWC")
        frames, pts = _core.decode_clip(record, spec, seed)
        t0 = pts[0]
        assert t0 in times
        for j in range(6):
            want = np.searchsorted(times, t0 + j / 10 + 1e-9, side="right") - 1
            assert pts[j] == times[want]
            np.testing.assert_array_equal(frames[j], ref[want][1])


def test_center_clip_and_a_short_video():
    data = make_video("h264", frames=10, bframes=False)
    record = stoker.video().encode(data)
    ref = decode_all(data)
    frames, pts = _core.decode_clip(record, stoker.ops.CenterClip(4).spec(layout="HWC"))
    np.testing.assert_array_equal(pts, [t for t, _ in ref[3:7]])
    # 8 frames 2 apart need 15: the last frame repeats, and the times say so
    frames, pts = _core.decode_clip(record, stoker.ops.RandomClip(8, step=2).spec(layout="HWC"))
    np.testing.assert_array_equal(pts, [ref[min(2 * i, 9)][0] for i in range(8)])
    np.testing.assert_array_equal(frames[7], ref[9][1])


def _write(path, videos, **extra):
    fields = {"video": stoker.video(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(path, fields, shard_size="64KB") as w:
        for i, v in enumerate(videos):
            w.write({"video": v, "label": i})
    return stoker.Dataset(path)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    videos = [make_video("h264", frames=20 + 3 * i, w=48, h=32) for i in range(10)]
    return _write(tmp_path_factory.mktemp("v") / "ds", videos), videos


def test_loader_batches_and_one_draw_per_clip(clips):
    ds, videos = clips
    ops = [stoker.ops.RandomClip(6, step=2), stoker.ops.RandomResizedCrop(24),
           stoker.ops.RandomHorizontalFlip()]
    with stoker.Loader(ds, batch_size=4, shuffle=True, seed=3,
                       transforms={"video": ops}) as loader:
        batches = list(loader)
    b = batches[0]
    assert b["video"].shape == (4, 6, 3, 24, 24) and b["video"].dtype == torch.uint8
    assert b["video_pts"].shape == (4, 6) and b["video_pts"].dtype == torch.float64
    # each row is its video's frames at the times it says, with the same crop on every
    # frame: the clip decoded alone through the same image ops (one draw) matches
    for batch in batches:
        for row, label in enumerate(batch["label"].tolist()):
            ref = dict(decode_all(videos[label]))
            pts = batch["video_pts"][row].tolist()
            assert all(t in ref for t in pts) and pts == sorted(pts)
            assert all(b - a == pytest.approx(0.08) for a, b in zip(pts, pts[1:]))
    # image_layout="HWC": frames as decoded, [B, T, H, W, C]
    with stoker.Loader(ds, batch_size=2, image_layout="HWC",
                       transforms={"video": [stoker.ops.CenterClip(3)]}) as loader:
        b = next(iter(loader))
    assert b["video"].shape == (2, 3, 32, 48, 3)
    ref = decode_all(videos[0])
    start = (20 - 3) // 2
    for j in range(3):
        np.testing.assert_array_equal(b["video"][0, j].numpy(), ref[start + j][1])


def test_same_clips_for_any_thread_count_and_resume(clips):
    ds, _ = clips

    def make(threads):
        return stoker.Loader(ds, batch_size=3, shuffle=True, seed=11, num_threads=threads,
                             transforms={"video": [stoker.ops.RandomClip(4, step=3),
                                                   stoker.ops.RandomResizedCrop(16)]})

    one = same_for_threads_and_resume(make)
    assert len(one) == 4


def test_python_stage_sees_the_loaders_clips(clips):
    ds, _ = clips
    t = {"video": [stoker.ops.RandomClip(5, step=2), stoker.ops.Resize(20)]}
    with stoker.Loader(ds, batch_size=5, seed=2, transforms=t) as loader:
        plain = list(loader)
    with stoker.Loader(ds, batch_size=5, seed=2, transforms=t,
                       map=lambda s, rng: {**s, "mean": s["video"].mean()}) as loader:
        mapped = list(loader)
    for a, b in zip(plain, mapped, strict=True):
        assert torch.equal(a["video"], b["video"])
        assert torch.equal(a["video_pts"], b["video_pts"])
        assert torch.allclose(b["mean"], a["video"].double().mean((1, 2, 3, 4)))


def test_corrupt_video_is_named_and_skipped(tmp_path):
    videos = [make_video("h264", frames=16, w=32, h=32) for _ in range(4)]
    ds = _write(tmp_path / "ds", videos)
    # a corrupt file: the container's bytes damaged behind an intact index
    record = stoker.video().encode(videos[1])
    bad = bytearray(record)
    off = _core.video_info(record)["file_offset"]
    bad[off:off + 64] = b"\0" * 64
    fields = {"video": stoker.video(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(tmp_path / "bad", fields) as w:
        for i, v in enumerate(videos):
            w.write({"video": bytes(bad) if i == 1 else v, "label": i})
    ds = stoker.Dataset(tmp_path / "bad")
    t = {"video": [stoker.ops.RandomClip(4)]}
    with pytest.raises(stoker.DecodeError, match=r"record 1 .*field 'video'"):
        with stoker.Loader(ds, batch_size=4, transforms=t) as loader:
            list(loader)
    with pytest.warns(RuntimeWarning, match="replaced 1 unreadable"):
        with stoker.Loader(ds, batch_size=4, transforms=t, on_error="skip") as loader:
            labels = [x for b in loader for x in b["label"].tolist()]
    assert labels == [0, 2, 2, 3]  # the next readable sample in its place


def test_write_errors_and_loader_errors(tmp_path, clips):
    with pytest.raises(ValueError, match="FFmpeg cannot read"):
        stoker.video().encode(b"not a video at all" * 10)
    with pytest.raises(ValueError, match="cannot read the video file"):
        stoker.video().encode(str(tmp_path / "missing.mp4"))
    ds, _ = clips
    with pytest.raises(ValueError, match="needs a clip first"):
        stoker.Loader(ds, batch_size=2)
    with pytest.raises(ValueError, match="applies to stoker.video"):
        stoker.Loader(ds, batch_size=2, transforms={"video": [stoker.ops.RandomClip(2)],
                                                    "label": [stoker.ops.RandomClip(2)]})
    with pytest.raises(ValueError, match="fps"):
        stoker.ops.RandomClip(4, step=2, fps=10)


def test_mixture_of_video_datasets(tmp_path):
    a = _write(tmp_path / "a", [make_video("h264", frames=12, w=32, h=32) for _ in range(6)])
    b = _write(tmp_path / "b", [make_video("vp9", frames=12, w=32, h=32) for _ in range(6)])
    mix = stoker.Mix({"a": a, "b": b}, weights={"a": 0.5, "b": 0.5})
    with stoker.Loader(mix, batch_size=4, seed=0,
                       transforms={"video": [stoker.ops.RandomClip(3)]}) as loader:
        batches = list(loader)
    src = torch.cat([x["source"] for x in batches])
    assert set(src.tolist()) == {0, 1}
    assert batches[0]["video"].shape == (4, 3, 3, 32, 32)


def _rows(loader):
    """{label: (clip, times)} of an epoch's rows, and the labels in order."""
    rows, labels = {}, []
    for b in loader:
        for j, label in enumerate(b["label"].tolist()):
            rows.setdefault(label, []).append((b["video"][j].clone(), b["video_pts"][j].clone()))
            labels.append(label)
    return rows, labels


def test_elastic_resume_gives_every_sample_its_clip(clips):
    """Saved at 2 ranks mid-epoch, resumed at 3 ranks with other thread counts: the rest of
    the epoch is the samples not yet yielded, each with the clip (frames and times) a plain
    one-rank run gives it."""
    ds, _ = clips
    t = {"video": [stoker.ops.RandomClip(4, step=2), stoker.ops.RandomResizedCrop(16),
                   stoker.ops.RandomHorizontalFlip()]}

    def make(threads, **kw):
        return stoker.Loader(ds, batch_size=2, shuffle=True, seed=5, num_threads=threads,
                             transforms=t, **kw)

    with make(2) as loader:
        loader.set_epoch(1)
        want, order = _rows(loader)
    consumed = []
    for r in range(2):
        with make(1, rank=r, world_size=2) as loader:
            loader.set_epoch(1)
            b = next(iter(loader))
            consumed += b["label"].tolist()
            state = loader.state_dict()
    assert sorted(consumed) == sorted(order[:4])
    rest = []
    for r in range(3):
        with make(1 + r, rank=r, world_size=3) as loader:
            loader.load_state_dict(state)
            got, labels = _rows(loader)
        rest += labels
        for label, pairs in got.items():
            for clip, pts in pairs:
                assert torch.equal(clip, want[label][0][0]), (r, label)
                assert torch.equal(pts, want[label][0][1]), (r, label)
    left = order[4:]
    assert sorted(set(rest)) == sorted(left)  # nothing lost, nothing consumed comes again
    assert len(rest) - len(left) < 3  # at most the padding equal batch counts need


def test_mix_of_video_and_images_is_refused_with_the_reason(tmp_path, clips):
    from conftest import png

    ds, _ = clips
    with stoker.ShardWriter(tmp_path / "img", {"image": stoker.image(),
                                               "label": stoker.scalar("int64")}) as w:
        for i in range(4):
            w.write({"image": png(np.full((32, 48, 3), 40 * i, np.uint8)), "label": i})
    images = stoker.Dataset(tmp_path / "img")
    with pytest.raises(ValueError, match=r"other fields.*one tensor per field.*own Loader"):
        stoker.Mix({"v": ds, "i": images})


def test_decoded_cache_refuses_clips_and_keeps_the_images_beside_them(tmp_path, clips):
    """cache='decoded' keeps images only: a video-only dataset is refused with the reason;
    with an image field beside the video, the images are cached and the clips are those of
    a loader without the cache."""
    from conftest import png

    ds, videos = clips
    t = {"video": [stoker.ops.RandomClip(3)]}
    with pytest.raises(ValueError, match=r"\['video'\] are video or audio: their clips are "
                                         r"drawn anew every epoch"):
        stoker.Loader(ds, batch_size=2, transforms=t, cache="decoded", cache_size="16MB")
    fields = {"video": stoker.video(), "image": stoker.image(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(tmp_path / "both", fields) as w:
        for i, v in enumerate(videos[:6]):
            w.write({"video": v, "image": png(np.full((24, 24, 3), 30 * i, np.uint8)),
                     "label": i})
    both = stoker.Dataset(tmp_path / "both")
    t = {"video": [stoker.ops.RandomClip(3)], "image": [stoker.ops.RandomResizedCrop(16)]}

    def run(**kw):
        with stoker.Loader(both, batch_size=3, shuffle=True, seed=1, transforms=t,
                           **kw) as loader:
            out = [[{k: v.clone() for k, v in b.items()} for b in loader] for _ in range(2)]
            return out, loader.stats().get("cache")

    plain, _ = run()
    cached, stats = run(cache="decoded", cache_size="16MB")
    assert stats["images"] == 6 and stats["hits"] > 0
    for a, b in zip(sum(plain, []), sum(cached, []), strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k
