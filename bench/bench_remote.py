"""Remote datasets and TFRecord conversion.

    python bench/bench_remote.py [--data raw|jpeg] [--samples 8000] [--repeats 3]
                                 [--records 20000]

1. An epoch (shuffled, batch 256, all cores) of a dataset served by nginx on loopback,
   read through stoker's shard cache, with the cache cold (a fresh cache directory: the
   dataset opens from index.json alone and every shard downloads, is checked and renamed
   while the epoch reads, the shards its batches wait for first, the records of the first
   batches by range meanwhile) and warm (every shard found in the cache), against the same
   epoch from local disk (page cache), in one run. Also: time to the first batch with a
   cold cache, the network ceiling (plain GETs of every shard, bytes discarded), and an
   epoch through a cache a quarter of the dataset (shard_window) against the same order
   locally. Medians of --repeats runs. ``--data raw`` reads arrays (nothing to decode:
   the network's worst case), ``--data jpeg`` photo-like JPEGs with RandomResizedCrop.
2. With --transports: whole-shard GETs through stoker's clients (urllib, boto3) and
   fsspec's (aiohttp, s3fs) where installed, against nginx and moto's S3 server.
3. TFRecord -> stoker conversion throughput (records/s) with 1 and 2 processes, against
   the parse-only ceiling (framing + CRC-32C + tf.train.Example parsing, no writing) and,
   where TensorFlow is installed, reading the same files with tf.data.

nginx must be installed (apt-get install nginx).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import stoker  # noqa: E402
from remote_servers import Nginx  # noqa: E402


def epoch(ds, batch_size=256, **kw):
    loader = stoker.Loader(ds, batch_size=batch_size, shuffle=True, seed=0, **kw)
    t0 = time.perf_counter()
    first = None
    n = 0
    for b in loader:
        if first is None:
            first = time.perf_counter() - t0
        n += len(b["label"])
    return time.perf_counter() - t0, first, n


def make_dataset(args, root):
    """``--data raw``: uint8[3,64,64] arrays (the fastest local epoch, so the network shows
    most); ``--data jpeg``: photo-like JPEGs (bench/make_jpegs.py), read with a training
    run's RandomResizedCrop + flip, where decoding rather than reading sets the pace."""
    rng = np.random.default_rng(0)
    if args.data == "raw":
        fields = {"x": stoker.ndarray("uint8", (3, 64, 64)), "label": stoker.scalar("int64")}
        with stoker.ShardWriter(root, fields, shard_size=args.shard_size) as w:
            for i in range(args.samples):
                w.write({"x": rng.integers(0, 256, (3, 64, 64), dtype=np.uint8), "label": i})
        return {}
    import io

    from make_jpegs import make_image
    from PIL import Image

    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(root, fields, shard_size=args.shard_size) as w:
        for i in range(args.samples):
            buf = io.BytesIO()
            Image.fromarray(make_image(rng)).save(buf, format="JPEG", quality=90)
            w.write({"image": buf.getvalue(), "label": i})
    return {"transforms": {"image": [stoker.ops.RandomResizedCrop(args.image_size),
                                     stoker.ops.RandomHorizontalFlip()]}}


def bench_remote(args, work):
    www = os.path.join(work, "www")
    kw = make_dataset(args, os.path.join(www, "ds"))
    local = stoker.Dataset(os.path.join(www, "ds"))
    total = sum(s["bytes"] for s in local.shards)
    print(f"dataset ({args.data}): {len(local)} samples, {len(local.shards)} shards, "
          f"{total / 1e6:.1f} MB; nginx on loopback")
    server = Nginx(www, os.path.join(work, "nginx"))
    url = f"{server.url}/ds"
    # The bounded runs: a cache a quarter of the dataset, shuffled a window of shards at a
    # time (the largest window of which two fit the cache), against the same order locally.
    limit = total // 4
    window = max(1, int(limit // 2 // max(s["bytes"] for s in local.shards)))
    try:
        epoch(local, **kw)  # page cache, warm-up
        shards, samples = local.shards, len(local)
        del local
        names = ("local_open", "local", "cold_open", "cold", "warm_open", "warm", "ceiling",
                 "first_local", "first_cold", "first_warm", "local_window", "bounded",
                 "range_records")
        res = {k: [] for k in names}
        for r in range(args.repeats):
            # each run opens its dataset anew, as the remote runs do (fresh mappings)
            t0 = time.perf_counter()
            local = stoker.Dataset(os.path.join(www, "ds"))
            opened = time.perf_counter() - t0
            secs, first, n = epoch(local, **kw)
            assert n == samples
            res["local_window"].append(epoch(local, shard_window=window, **kw)[0])
            del local
            res["local_open"].append(opened)
            res["local"].append(secs)
            res["first_local"].append(opened + first)

            t0 = time.perf_counter()
            for s in shards:
                with urllib.request.urlopen(f"{url}/{s['path']}") as resp:
                    while resp.read1(1 << 20):
                        pass
            res["ceiling"].append(time.perf_counter() - t0)

            cache = os.path.join(work, f"cache{r}")
            for kind in ("cold", "warm"):
                t0 = time.perf_counter()
                ds = stoker.Dataset(url, cache_dir=cache)
                opened = time.perf_counter() - t0
                secs, first, n = epoch(ds, **kw)
                st = ds.remote.stats()
                assert n == samples
                assert st["downloads" if kind == "cold" else "cache_hits"] == len(shards)
                if kind == "cold":
                    res["range_records"].append(st["range_records"])
                res[f"{kind}_open"].append(opened)
                res[kind].append(secs)
                res[f"first_{kind}"].append(opened + first)
                ds.remote.close()
                del ds
            shutil.rmtree(cache)
            ds = stoker.Dataset(url, cache_dir=cache, cache_limit=limit)
            res["bounded"].append(epoch(ds, shard_window=window, **kw)[0])
            ds.remote.close()
            del ds
            shutil.rmtree(cache)
    finally:
        server.stop()
    med = {k: statistics.median(v) for k, v in res.items()}
    ms = {k: v * 1e3 for k, v in med.items()}
    print(f"\nmedians of {args.repeats} runs, ms (samples/s of the epoch):")
    print(f"  {'':<26}{'open':>8}{'epoch':>9}{'total':>9}{'first batch':>13}")
    for k, name in (("local", "local disk (page cache)"), ("cold", "HTTP, cache cold"),
                    ("warm", "HTTP, cache warm")):
        op = ms[f"{k}_open"]
        print(f"  {name:<26}{op:8.1f}{ms[k]:9.1f}{op + ms[k]:9.1f}{ms['first_' + k]:13.1f}"
              f"   ({samples / med[k]:,.0f}/s)")
    gbps = total / med["ceiling"] / 1e9
    print(f"  network ceiling: plain GETs of every shard, one at a time: {ms['ceiling']:.1f} ms "
          f"({gbps:.2f} GB/s)")
    print(f"  cold: {med['range_records']:.0f} records came by range ahead of their shards")
    local_total = med["local_open"] + med["local"]
    print(f"  ratios: warm / local (open + epoch) "
          f"{(med['warm_open'] + med['warm']) / local_total:.3f}; warm / local epoch "
          f"{med['warm'] / med['local']:.3f}; cold / local (open + epoch) "
          f"{(med['cold_open'] + med['cold']) / local_total:.2f}   (targets: warm within 5%, "
          f"cold within 1.5x)")
    print(f"  cache_limit a quarter of the dataset ({limit / 1e6:.1f} MB), shard_window={window}:"
          f" epoch {ms['bounded']:.1f} ms against {ms['local_window']:.1f} ms locally in the "
          f"same order: {med['bounded'] / med['local_window']:.2f}x")
    return med


def bench_transports(args, work):
    """Whole-shard GETs through stoker's clients and fsspec's (aiohttp, s3fs), where
    installed: the reason stoker uses plain clients for http(s) and s3."""
    try:
        import fsspec
    except ImportError:
        print("\ntransports: fsspec is not installed")
        return
    from remote_servers import S3Server
    from stoker.remote.transport import open_source

    www = os.path.join(work, "www")
    with open(os.path.join(www, "ds", "index.json")) as f:
        shards = json.load(f)["shards"]
    total = sum(s["bytes"] for s in shards)

    def timed(name, fn):
        ts = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        m = statistics.median(ts)
        print(f"  {name:<28}{m * 1e3:8.1f} ms {total / m / 1e9:6.2f} GB/s")

    def drain(fs, paths):
        for p in paths:
            with fs.open(p, "rb", block_size=8 << 20) as f:
                while f.read(1 << 20):
                    pass

    print(f"\ntransports: all {len(shards)} shards, one at a time (median of {args.repeats}):")
    server = Nginx(www, os.path.join(work, "nginx-t"))
    try:
        src = open_source(f"{server.url}/ds")
        timed("stoker http (urllib)", lambda: [src.stream(s["path"], len) for s in shards])
        try:
            fs = fsspec.filesystem("http")
            timed("fsspec http (aiohttp)",
                  lambda: drain(fs, [f"{server.url}/ds/{s['path']}" for s in shards]))
        except ImportError:
            print("  fsspec http: aiohttp is not installed")
    finally:
        server.stop()
    try:
        import boto3  # noqa: F401
        import moto  # noqa: F401
    except ImportError:
        print("  s3: boto3, moto[s3], flask and flask-cors are needed")
        return
    s3 = S3Server()
    try:
        s3.upload_dir(os.path.join(www, "ds"), "bucket", "ds")
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ.setdefault(k, "testing")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        src = open_source("s3://bucket/ds", storage_options={"endpoint_url": s3.endpoint})
        timed("stoker s3 (boto3)", lambda: [src.stream(s["path"], len) for s in shards])
        try:
            fs = fsspec.filesystem("s3", endpoint_url=s3.endpoint)
            timed("fsspec s3 (s3fs)", lambda: drain(fs, [f"bucket/ds/{s['path']}"
                                                         for s in shards]))
        except ImportError:
            print("  fsspec s3: s3fs is not installed")
    finally:
        s3.stop()


def _varint(v):
    v &= 2**64 - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _ld(field, payload):
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _example(image, label, emb):
    def entry(name, feature):
        return _ld(1, _ld(1, name) + _ld(2, feature))
    feats = (entry(b"image", _ld(1, _ld(1, image)))
             + entry(b"label", _ld(3, _ld(1, _varint(label))))
             + entry(b"emb", _ld(2, _ld(1, emb.astype("<f4").tobytes()))))
    return _ld(1, feats)


def bench_tfrecord(args, work):
    import google_crc32c
    from stoker.convert import convert_tfrecord
    from stoker.convert._example_proto import parse_example
    from stoker.convert.tfrecord import read_records

    def masked(d):
        c = google_crc32c.value(d)
        return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    src = os.path.join(work, "tfrecords")
    os.makedirs(src)
    rng = np.random.default_rng(0)
    jpeg = b"\xff\xd8\xff\xe0" + rng.integers(0, 256, 4000, dtype=np.uint8).tobytes()
    per = args.records // 4
    for f in range(4):
        with open(os.path.join(src, f"train-{f:05d}.tfrecord"), "wb") as out:
            for i in range(per):
                data = _example(jpeg, f * per + i, rng.standard_normal(16))
                head = struct.pack("<Q", len(data))
                out.write(head + struct.pack("<I", masked(head)) + data
                          + struct.pack("<I", masked(data)))
    n = per * 4
    files = sorted(os.path.join(src, f) for f in os.listdir(src))
    mb = sum(os.path.getsize(f) for f in files) / 1e6
    print(f"\nTFRecord: {n} Examples (4 KB bytes feature, int64 label, 16 floats) in 4 files, "
          f"{mb:.0f} MB")
    times = {}
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        k = 0
        for f in files:
            for _, _, data in read_records(f):
                parse_example(data)
                k += 1
        times.setdefault("parse", []).append(time.perf_counter() - t0)
        for workers in (1, 2):
            out = os.path.join(work, f"tfout{workers}")
            t0 = time.perf_counter()
            st = convert_tfrecord(src, out, workers=workers, progress=False, overwrite=True,
                                  features="image:blob,label:int64,emb:float32[16]")
            times.setdefault(f"convert{workers}", []).append(time.perf_counter() - t0)
            assert st["records"] == n
    try:
        import tensorflow as tf
    except ImportError:
        tf = None
    if tf is not None:
        spec = {"image": tf.io.FixedLenFeature([], tf.string),
                "label": tf.io.FixedLenFeature([], tf.int64),
                "emb": tf.io.FixedLenFeature([16], tf.float32)}
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            ds = tf.data.TFRecordDataset(files).map(
                lambda x: tf.io.parse_single_example(x, spec))
            for _ in ds:
                pass
            times.setdefault("tf.data", []).append(time.perf_counter() - t0)
    print(f"records/s (median of {args.repeats}):")
    for k in ("parse", "convert1", "convert2", "tf.data"):
        if k in times:
            rate = n / statistics.median(times[k])
            label = {"parse": "read+CRC+parse only (ceiling)", "convert1": "convert, 1 process",
                     "convert2": "convert, 2 processes", "tf.data": "tf.data read+parse"}[k]
            print(f"  {label:<32} {rate:>10,.0f}")
    if tf is None:
        print("  tf.data: TensorFlow is not installed")
    best = min(statistics.median(times["convert1"]), statistics.median(times["convert2"]))
    print(f"  ratio: best convert / parse-only ceiling (1 process) = "
          f"{statistics.median(times['parse']) / best:.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--samples", type=int, default=8000)
    p.add_argument("--data", choices=("raw", "jpeg"), default="raw")
    p.add_argument("--image-size", type=int, default=128,
                   help="--data jpeg: RandomResizedCrop size")
    p.add_argument("--shard-size", default="8MB")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--records", type=int, default=20000)
    p.add_argument("--skip-tfrecord", action="store_true")
    p.add_argument("--transports", action="store_true",
                   help="also compare stoker's HTTP/S3 clients with fsspec's (aiohttp, s3fs)")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="stoker-bench-remote-")
    try:
        bench_remote(args, work)
        if args.transports:
            bench_transports(args, work)
        if not args.skip_tfrecord:
            bench_tfrecord(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
