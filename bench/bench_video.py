"""Video benchmark: random 16-frame clips at 224 from 10 s 480p videos (H.264, AV1).

    pip install av decord        # the peers (bench only; see below for torchcodec)
    python bench/bench_video.py [--videos 8] [--clips 96] [--repeats 3] [--gop 60]

Makes `--videos` videos per codec (854x480, 30 fps, 10 s, a key frame every `--gop` frames,
encoded with PyAV: libx264 preset fast, libsvtav1 preset 10), writes them as files and as a
stoker dataset, then measures, in one run on the cores this process may use, clips/s and
the peak PSS of the process tree for
  (a) stoker: Loader(transforms={"video": [RandomClip(16), Resize(224), CenterCrop(224)]}),
      num_threads = the cores;
  (b) DataLoader (num_workers 0, 1, 2: the best is quoted) over a map-style dataset whose
      __getitem__ opens the file and decodes a random 16-frame clip with
        - PyAV: seek to the key frame before the clip, decode forward, frames converted and
          resized by libswscale in one step (frame.to_ndarray(width, height)), centre crop;
        - decord: VideoReader(path, width, height, num_threads=1).get_batch(...), crop;
        - torchcodec: VideoDecoder(path, seek_mode="approximate").get_frames_at(...),
          resized with torch (only where torchcodec loads: PyPI's wheels are built for
          CUDA torch and do not load with the CPU build of torch 2.13 this project tests
          against, so it is skipped here and the reason printed);
  (c) the decode ceiling: the same clips' seek + decode, nothing converted, one process
      per core (PyAV, multiprocessing), with no loader at all;
  (d) CPU ms per clip on one thread for the very same clips: stoker's decode + convert +
      resize + crop against PyAV's decode alone and PyAV's decode + resize + crop (CPU
      time: what each costs, which a loaded machine's scheduling does not change).
Every clip is [16, 3, 224, 224] uint8 (the shorter side resized to 224, centre crop); each
loader's first batch (start-up: forks, threads, the first decodes) is outside the timing. The
video files and shards are read right before each timed run (a warm page cache). Prints
each row's ratio to stoker, and stoker's to the best peer.
"""

import argparse
import fractions
import io
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

W, H, FPS, SECONDS, T, SIZE = 854, 480, 30, 10, 16, 224
RW = round(W * SIZE / H)  # the width after resizing the shorter side to 224


# -- memory of the process tree (as bench/bench_python.py measures it) -----------------

def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def tree_pss(pid=None):
    total, todo = 0, [pid or os.getpid()]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
        todo += _children(p)
    return total


class PeakPss:
    def __init__(self):
        self.peak, self._stop = 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_pss())
            self._stop.wait(0.05)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


# -- the videos --------------------------------------------------------------------------

def make_video(codec, seed, gop):
    import av

    encoder, fmt, opts = {
        "h264": ("libx264", "mp4", {"preset": "fast", "g": str(gop),
                                    "x264-params": "log-level=error"}),
        "av1": ("libsvtav1", "mp4", {"preset": "10", "g": str(gop)})}[codec]
    buf = io.BytesIO()
    out = av.open(buf, "w", format=fmt)
    s = out.add_stream(encoder, rate=FPS)
    s.width, s.height, s.pix_fmt = W, H, "yuv420p"
    s.options = opts
    s.codec_context.time_base = fractions.Fraction(1, FPS)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    blobs = rng.uniform(0, 1, (6, 5))
    base = (np.sin(xx / (20 + 10 * blobs[0, 0])) * 40 + np.cos(yy / 17) * 40 + 128)
    for i in range(FPS * SECONDS):
        t = i / FPS
        img = np.empty((H, W, 3), np.float32)
        img[..., 0] = base + 60 * np.sin(xx / 50 + t * (1 + blobs[1, 0]))
        img[..., 1] = np.roll(base, int(t * 40), axis=1)
        img[..., 2] = 255 - np.roll(base, int(t * 25), axis=0)
        for b in blobs:  # moving discs
            cx, cy = (b[0] * W + t * 60 * (b[2] - 0.5)) % W, (b[1] * H + t * 40 * (b[3] - .5)) % H
            img[((xx - cx) ** 2 + (yy - cy) ** 2) < (20 + 40 * b[4]) ** 2] = b[:3] * 255
        img += rng.normal(0, 3, img.shape).astype(np.float32)
        frame = av.VideoFrame.from_ndarray(np.clip(img, 0, 255).astype(np.uint8), "rgb24")
        frame.pts = i
        for p in s.encode(frame):
            out.mux(p)
    for p in s.encode():
        out.mux(p)
    out.close()
    return buf.getvalue()


def warm(paths):
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 22):
                pass


# -- the peers' __getitem__ ------------------------------------------------------------

def crop(frames):
    """[T, 224, RW, 3] -> [T, 3, 224, 224] uint8 tensor (the centre crop)."""
    import torch

    x0 = (frames.shape[2] - SIZE) // 2
    return torch.from_numpy(np.ascontiguousarray(
        frames[:, :, x0:x0 + SIZE].transpose(0, 3, 1, 2)))


class PyAVClips:
    def __init__(self, paths, seed=0):
        self.paths, self.seed = paths, seed

    def __len__(self):
        return len(self.paths) * 1000

    def __getitem__(self, i):
        import av

        path = self.paths[i % len(self.paths)]
        rng = random.Random(self.seed * 7919 + i)
        with av.open(path) as c:
            st = c.streams.video[0]
            st.thread_type, st.thread_count = "SLICE", 1
            n = st.frames or FPS * SECONDS
            start = rng.randint(0, n - T)
            first = int(start / FPS / st.time_base)
            c.seek(first, stream=st, backward=True, any_frame=False)
            frames = []
            for f in c.decode(st):
                if f.pts < first:
                    continue
                frames.append(f.to_ndarray(width=RW, height=SIZE, format="rgb24"))
                if len(frames) == T:
                    break
        return crop(np.stack(frames))


class DecordClips(PyAVClips):
    def __getitem__(self, i):
        import decord

        path = self.paths[i % len(self.paths)]
        rng = random.Random(self.seed * 7919 + i)
        vr = decord.VideoReader(path, ctx=decord.cpu(0), width=RW, height=SIZE, num_threads=1)
        start = rng.randint(0, len(vr) - T)
        return crop(vr.get_batch(list(range(start, start + T))).asnumpy())


class TorchCodecClips(PyAVClips):
    def __getitem__(self, i):
        import torch
        from torchcodec.decoders import VideoDecoder

        path = self.paths[i % len(self.paths)]
        rng = random.Random(self.seed * 7919 + i)
        d = VideoDecoder(path, seek_mode="approximate", num_ffmpeg_threads=1)
        start = rng.randint(0, d.metadata.num_frames - T)
        x = d.get_frames_in_range(start, start + T).data  # [T, 3, 480, 854]
        x = torch.nn.functional.interpolate(x.float(), size=(SIZE, RW), mode="bilinear",
                                            antialias=True).round().clamp(0, 255).byte()
        x0 = (RW - SIZE) // 2
        return x[:, :, :, x0:x0 + SIZE].contiguous()


def peer_ok(cls, path):
    try:
        cls([path])[0]
        return None
    except Exception as e:  # a peer that does not install or load here
        return f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"


def time_dataloader(cls, paths, count, workers, batch):
    import torch

    ds = cls(paths, seed=workers)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True,
                                         num_workers=workers,
                                         persistent_workers=workers > 0,
                                         generator=torch.Generator().manual_seed(0))
    it = iter(loader)
    next(it)  # start-up (forks) outside the timing
    warm(paths)
    with PeakPss() as mem:
        t0 = time.perf_counter()
        n = 0
        while n < count:
            n += len(next(it))
        dt = time.perf_counter() - t0
    del it, loader
    return n / dt, mem.peak


def time_stoker_loader(loader, shard_files, count, field, shape):
    """Rows/s of a stoker.Loader (epoch after epoch) over `count` rows of `field`, each of
    `shape`, and the peak PSS; the first batch (start-up) outside the timing."""
    warm(shard_files)
    with PeakPss() as mem, loader:
        it = iter(loader)
        next(it)  # start-up outside the timing, as for DataLoader
        t0 = time.perf_counter()
        n = 0
        while n < count:
            for b in it:
                assert b[field].shape[1:] == shape
                n += len(b[field])
                if n >= count:
                    break
            it = iter(loader)  # the next epoch: new clips
        dt = time.perf_counter() - t0
    return n / dt, mem.peak


def time_stoker(root, shard_files, clips, threads, batch, epoch):
    import stoker

    ds = stoker.Dataset(root)
    loader = stoker.Loader(ds, batch_size=batch, shuffle=True, seed=epoch, num_threads=threads,
                           transforms={"video": [stoker.ops.RandomClip(T),
                                                 stoker.ops.Resize(SIZE),
                                                 stoker.ops.CenterCrop(SIZE)]})
    return time_stoker_loader(loader, shard_files, clips, "video", (T, 3, SIZE, SIZE))


def _decode_only(args):
    """Seek + decode one clip's frames with PyAV, nothing converted (the ceiling's unit)."""
    import av

    path, start = args
    with av.open(path) as c:
        st = c.streams.video[0]
        st.thread_type, st.thread_count = "SLICE", 1
        first = int(start / FPS / st.time_base)
        c.seek(first, stream=st, backward=True, any_frame=False)
        got = 0
        for f in c.decode(st):
            if f.pts >= first:
                got += 1
                if got == T:
                    break
    return got


def cpu_per_clip(paths, clips, repeats):
    """CPU ms per clip on one thread, the same clips for each (stoker's draw of
    RandomClip(16) over each file's record): stoker's decode + convert + Resize + CenterCrop
    (_core.decode_clip, what a loader worker runs), PyAV's seek + decode of those frames
    (nothing converted), and PyAV's seek + decode + to_ndarray(224) + crop (the DataLoader
    peer's work). CPU time, not wall time: what each costs, whatever the machine's load."""
    import av
    import stoker
    from stoker import _core
    from stoker._media_args import op_specs

    spec = stoker.ops.RandomClip(T).spec(op_specs([stoker.ops.Resize(SIZE),
                                                 stoker.ops.CenterCrop(SIZE)]))
    datas = [open(p, "rb").read() for p in paths]
    recs = [stoker.video().encode(d) for d in datas]
    work = []
    for i in range(clips):
        r = recs[i % len(recs)]
        ids = _core.clip_frames(r, spec, i)
        pts = _core.video_info(r)["pts"]
        work.append((i, r, paths[i % len(paths)], [float(pts[j]) for j in ids]))

    def pyav(path, times, convert):
        with av.open(path) as c:
            st = c.streams.video[0]
            st.thread_type, st.thread_count = "SLICE", 1
            want = {round(t / st.time_base) for t in times}
            c.seek(min(want), stream=st, backward=True, any_frame=False)
            frames = []
            for f in c.decode(st):
                if f.pts in want:
                    frames.append(f.to_ndarray(width=RW, height=SIZE, format="rgb24")
                                  if convert else f)
                    if len(frames) == len(want):
                        break
        assert len(frames) == len(want)
        return crop(np.stack(frames)) if convert else frames

    rows = {"stoker: decode + convert + resize + crop (1 thread)":
            lambda i, r, p, ts: _core.decode_clip(r, spec, i),
            "PyAV: decode alone (nothing converted)": lambda i, r, p, ts: pyav(p, ts, False),
            "PyAV: decode + to_ndarray(224) + crop": lambda i, r, p, ts: pyav(p, ts, True)}
    times = {k: [] for k in rows}
    for _ in range(repeats):
        for k, f in rows.items():  # interleaved, as the loaders
            t0 = time.thread_time()  # this thread's CPU (decode_clip runs in it)
            for w in work:
                f(*w)
            times[k].append((time.thread_time() - t0) / len(work) * 1e3)
    s_ms = statistics.median(times[next(iter(rows))])
    print(f"\nCPU per clip, one thread, the same {len(work)} clips (median of {repeats}):\n")
    print("| work | CPU ms a clip | this / stoker |")
    print("|---|---:|---:|")
    for k, v in times.items():
        ms = statistics.median(v)
        print(f"| {k} | {ms:.1f} | {ms / s_ms:.2f}x |")


def time_ceiling(paths, clips, procs):
    rng = random.Random(1)
    work = [(paths[rng.randrange(len(paths))], rng.randint(0, FPS * SECONDS - T))
            for _ in range(clips)]
    warm(paths)
    with mp.get_context("fork").Pool(procs) as pool, PeakPss() as mem:
        pool.map(_decode_only, work[:procs])  # start-up
        t0 = time.perf_counter()
        pool.map(_decode_only, work, chunksize=2)
        dt = time.perf_counter() - t0
    return clips / dt, mem.peak


def compare(stoker_run, peers, ceilings, paths, count, batch, cores, repeats, unit, digits):
    """The table of bench_video.py and bench_audio.py: stoker (`stoker_run(round)`), each
    peer's __getitem__ class in a DataLoader at num_workers 0, 1 and the cores (its best
    quoted), and the ceilings ((group, label, run(round))); medians of `repeats` rounds,
    the configurations interleaved in each, and the ratio of stoker to each row."""
    print(f"| loader | {unit} | peak PSS (MB) | stoker / this |")
    print("|---|---:|---:|---:|")
    # every configuration once per round, rounds interleaved: a shared machine's load
    # drifts, and each configuration then sees the same drift
    configs = [("stoker", f"stoker, {cores} threads", stoker_run)]
    for name, cls in peers:
        why = peer_ok(cls, paths[0])
        if why:
            print(f"| DataLoader + {name} | not run: {why} | | |")
            continue
        for workers in sorted({0, 1, cores}):
            configs.append((name, f"DataLoader + {name}, best num_workers={workers}",
                            lambda r, cls=cls, workers=workers: time_dataloader(
                                cls, paths, count, workers, batch)))
    configs += ceilings
    runs = {label: [] for _, label, _ in configs}
    for r in range(repeats):
        for _, label, f in configs:
            runs[label].append(f(r))
    best = {}
    for group, label, _ in configs:
        rate = statistics.median(x[0] for x in runs[label])
        mem = max(x[1] for x in runs[label])
        if group not in best or rate > best[group][1]:
            best[group] = (label, rate, mem)
    s_rate = best["stoker"][1]
    peer_rates = [v[1] for k, v in best.items() if k not in ("stoker", "ceiling")]
    for name, rate, mem in best.values():
        print(f"| {name} | {rate:.{digits}f} | {mem / 1e6:.0f} | {s_rate / rate:.2f}x |")
    if peer_rates:
        print(f"\nstoker / best DataLoader peer: {s_rate / max(peer_rates):.2f}x")


PEERS = (("pyav", PyAVClips), ("decord", DecordClips), ("torchcodec", TorchCodecClips))


def CEILINGS(paths, a, cores):
    return [("ceiling", f"decode alone (PyAV, {cores} processes, no conversion)",
             lambda r, paths=paths: time_ceiling(paths, a.clips, cores))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--videos", type=int, default=8)
    ap.add_argument("--clips", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--gop", type=int, default=60)
    ap.add_argument("--copies", type=int, default=16)
    ap.add_argument("--codecs", default="h264,av1")
    ap.add_argument("--cpu-clips", type=int, default=48,
                    help="clips of the one-thread CPU-time table")
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    os.environ.setdefault("SVT_LOG", "1")
    import stoker
    import torch

    torch.set_num_threads(1)
    cores = len(os.sched_getaffinity(0))
    tmp = a.dir or tempfile.mkdtemp(prefix="stoker-bench-video-")
    print(f"# {cores} cores; {a.videos} videos per codec, {W}x{H} {FPS} fps {SECONDS} s, key "
          f"frame every {a.gop} frames; clips of {T} frames at {SIZE}; batch {a.batch_size}; "
          f"{a.clips} clips per run, median of {a.repeats}; stoker._core media: "
          f"{stoker._core.build_info()['media']}")
    for codec in a.codecs.split(","):
        paths = []
        for i in range(a.videos):
            p = os.path.join(tmp, f"{codec}-{a.gop}-{i}.mp4")
            if not os.path.exists(p):
                with open(p, "wb") as f:
                    f.write(make_video(codec, i, a.gop))
            paths.append(p)
        root = os.path.join(tmp, f"ds-{codec}-{a.gop}-{a.copies}")
        if not os.path.exists(os.path.join(root, "index.json")):
            # each video `--copies` times: a dataset of videos x copies samples, as the
            # peers' index space is (a real dataset has thousands of videos)
            with stoker.ShardWriter(root, {"video": stoker.video()}, overwrite=True) as w:
                for _ in range(a.copies):
                    for p in paths:
                        w.write({"video": p})
        shard_files = [os.path.join(root, s["path"]) for s in stoker.Dataset(root).shards]
        mb = sum(os.path.getsize(p) for p in paths) / len(paths) / 1e6
        print(f"\n## {codec} ({mb:.1f} MB a video)\n")
        compare(lambda r, root=root, sf=shard_files: time_stoker(root, sf, a.clips, cores,
                                                                  a.batch_size, r),
                PEERS, CEILINGS(paths, a, cores), paths, a.clips, a.batch_size, cores,
                a.repeats, "clips/s", 1)
        cpu_per_clip(paths, a.cpu_clips, a.repeats)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
