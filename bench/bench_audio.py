"""Audio benchmark: random 2 s crops at 16 kHz mono from 10 s 44.1 kHz stereo files.

    pip install av soundfile scipy      # the peers (bench only)
    python bench/bench_audio.py [--files 64] [--crops 512] [--repeats 3]

Makes `--files` files per format (FLAC, MP3; sines and noise), writes them as files and as a
stoker dataset (stoker.audio(sample_rate=16000, channels=1)), then measures, in one run on
the cores this process may use, crops/s and the peak PSS of the process tree for
  (a) stoker: Loader(transforms={"audio": RandomAudioCrop(2.0)}), num_threads = the cores;
  (b) DataLoader (num_workers 0, 1, 2: the best is quoted) over a map-style dataset whose
      __getitem__ reads a random 2 s of the file and resamples it to 16 kHz mono with
        - soundfile (libsndfile: seeks in FLAC and MP3) + scipy.signal.resample_poly;
        - PyAV: decode from the start to the crop's end, av.AudioResampler (libswresample);
        - torchaudio / torchcodec: only where they load (PyPI's wheels are built for
          CUDA torch and other torch versions, and do not load with the CPU build of torch
          2.13 this project tests against: skipped, the reason printed).
Every crop is [1, 32000] float32. Files and shards are read right before each timed run.
Prints each row's ratio to stoker.
"""

import argparse
import io
import os
import random
import tempfile

import numpy as np
from bench_video import compare, time_stoker_loader

RATE_IN, RATE, SECONDS, CROP = 44100, 16000, 10, 2.0
N = int(CROP * RATE)


def make_audio(fmt, seed):
    import av

    rng = np.random.default_rng(seed)
    n = RATE_IN * SECONDS
    t = np.arange(n) / RATE_IN
    sig = np.stack([0.3 * np.sin(2 * np.pi * (200 + 300 * rng.random() + 50 * c) * t) +
                    0.05 * rng.standard_normal(n) for c in range(2)]).astype(np.float32)
    codec, container, fmt_ = {"flac": ("flac", "flac", "s16"),
                              "mp3": ("libmp3lame", "mp3", "fltp")}[fmt]
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        s = out.add_stream(codec, rate=RATE_IN, layout="stereo")
        step = s.codec_context.frame_size or 4096
        for i in range(0, n, step):
            c = sig[:, i:i + step]
            data = (c.T.reshape(1, -1) * 32767).astype(np.int16) if fmt_ == "s16" else c
            f = av.AudioFrame.from_ndarray(np.ascontiguousarray(data), format=fmt_,
                                           layout="stereo")
            f.sample_rate, f.pts = RATE_IN, i
            for p in s.encode(f):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return buf.getvalue()


class SoundfileCrops:
    def __init__(self, paths, seed=0):
        self.paths, self.seed = paths, seed

    def __len__(self):
        return len(self.paths) * 1000

    def __getitem__(self, i):
        import soundfile as sf
        import torch
        from scipy.signal import resample_poly

        path = self.paths[i % len(self.paths)]
        rng = random.Random(self.seed * 7919 + i)
        with sf.SoundFile(path) as f:
            want = int(CROP * f.samplerate)
            f.seek(rng.randint(0, f.frames - want))
            x = f.read(want, dtype="float32", always_2d=True)
        mono = x.mean(1)
        y = resample_poly(mono, RATE, f.samplerate).astype(np.float32)[:N]
        return torch.from_numpy(y[None])


class PyAVCrops(SoundfileCrops):
    def __getitem__(self, i):
        import av
        import torch

        path = self.paths[i % len(self.paths)]
        rng = random.Random(self.seed * 7919 + i)
        start = rng.randint(0, int((SECONDS - CROP) * RATE))
        res = av.AudioResampler(format="flt", layout="mono", rate=RATE)
        chunks, got = [], 0
        with av.open(path) as c:
            for f in c.decode(audio=0):
                for r in res.resample(f):
                    a = r.to_ndarray().reshape(-1)
                    chunks.append(a)
                    got += a.size
                if got >= start + N:
                    break
        x = np.concatenate(chunks)[start:start + N]
        return torch.from_numpy(np.ascontiguousarray(x[None]))


class TorchaudioCrops(SoundfileCrops):
    def __getitem__(self, i):
        import torchaudio

        path = self.paths[i % len(self.paths)]
        rng = random.Random(self.seed * 7919 + i)
        info = torchaudio.info(path)
        want = int(CROP * info.sample_rate)
        x, sr = torchaudio.load(path, frame_offset=rng.randint(0, info.num_frames - want),
                                num_frames=want)
        return torchaudio.functional.resample(x.mean(0, keepdim=True), sr, RATE)[:, :N]


def time_stoker(root, shard_files, crops, threads, batch, epoch):
    import stoker

    loader = stoker.Loader(stoker.Dataset(root), batch_size=batch, shuffle=True, seed=epoch,
                           num_threads=threads,
                           transforms={"audio": stoker.ops.RandomAudioCrop(CROP)})
    return time_stoker_loader(loader, shard_files, crops, "audio", (1, N))


PEERS = (("soundfile + scipy", SoundfileCrops), ("pyav", PyAVCrops),
         ("torchaudio", TorchaudioCrops))


def CEILINGS(paths, a, cores):
    return []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=64)
    ap.add_argument("--crops", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--formats", default="flac,mp3")
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    import stoker
    import torch

    torch.set_num_threads(1)
    cores = len(os.sched_getaffinity(0))
    tmp = a.dir or tempfile.mkdtemp(prefix="stoker-bench-audio-")
    print(f"# {cores} cores; {a.files} files per format, {SECONDS} s {RATE_IN} Hz stereo; "
          f"random {CROP} s crops at {RATE} Hz mono; batch {a.batch_size}; {a.crops} crops "
          f"per run, median of {a.repeats}")
    for fmt in a.formats.split(","):
        paths = []
        for i in range(a.files):
            p = os.path.join(tmp, f"{i}.{fmt}")
            if not os.path.exists(p):
                with open(p, "wb") as f:
                    f.write(make_audio(fmt, i))
            paths.append(p)
        root = os.path.join(tmp, f"ds-{fmt}")
        if not os.path.exists(os.path.join(root, "index.json")):
            with stoker.ShardWriter(root, {"audio": stoker.audio(RATE, 1)},
                                    overwrite=True) as w:
                for p in paths:
                    w.write({"audio": p})
        shard_files = [os.path.join(root, s["path"]) for s in stoker.Dataset(root).shards]
        print(f"\n## {fmt}\n")
        compare(lambda r, root=root, sf=shard_files: time_stoker(root, sf, a.crops, cores,
                                                                  a.batch_size, r),
                PEERS, CEILINGS(paths, a, cores), paths, a.crops, a.batch_size, cores,
                a.repeats, "crops/s", 0)


if __name__ == "__main__":
    main()
