"""Token benchmark: windows over a token stream, packed rows, and the cost of a resume.

    python bench/bench_tokens.py [--tokens 50000000] [--repeats 5]

Windows (a --tokens uint16 stream, seq_len 1024, batch 64, int64 output, shuffled),
windows/s for
  (a) stoker.Loader(ds, seq_len=..., shuffle=True) on 1 and 2 threads (the loader core
      running the token producer, csrc/producers/token_producer.h), batches as tensors;
  (b) nanoGPT's get_batch (train.py, CPU path: a fresh np.memmap per call, torch.randint
      starts, per-window astype(int64) + torch.stack, for x and for y);
  (c) a NumPy window gather: np.stack of the seq_len + 1 slices, then astype(int64);
  (d) torch DataLoader over a map-style window dataset (x, y from the memmap), shuffled,
      num_workers 0, 1, 2 (best reported; workers started before timing);
  (e) the ceiling: output bytes (input_ids + labels) over single-thread memcpy bandwidth.
Packing (documents with log-normal lengths, median ~250 tokens, cut at 2048 tokens,
random ids; rows of 1024, batches of 64 rows): real tokens/s for
  (f) stoker.Loader with packing="document" (best fit, window 64) over a stoker token
      dataset (records checksummed on read), 1 and 2 threads, and packing="concat";
  (g) HuggingFace's DataCollatorWithFlattening (transformers, if installed; otherwise
      a line-for-line re-implementation of its __call__, said in the output) on lists of
      ids, with return_flash_attn_kwargs, batches of ~64k tokens;
  (h) a plain Python greedy packer (next fit into rows of 1024, pad, position ids,
      cu_seqlens, to tensors).
Resume: time of plan_epoch + the first batch at offsets 0, 50 %, 99.9 % of an epoch for
every mode: constant, whatever the position.
All numbers are medians of --repeats runs; data is in page cache.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

SEQ, BATCH = 1024, 64


def median(f, repeats):
    return statistics.median(f() for _ in range(repeats))


# --- windows -------------------------------------------------------------------------

def nanogpt_get_batch(path, block_size, batch_size):
    import torch

    # nanoGPT train.py: "we recreate np.memmap every batch to avoid a memory leak"
    data = np.memmap(path, dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy((data[i:i + block_size]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64))
                     for i in ix])
    return x, y


def numpy_gather(data, rng, block_size, batch_size):
    ix = rng.integers(0, len(data) - block_size, batch_size)
    a = np.stack([data[i:i + block_size + 1] for i in ix]).astype(np.int64)
    return a[:, :-1], a[:, 1:]


class WindowDataset:
    def __init__(self, path, block_size):
        self.path, self.block = path, block_size
        self.data = None
        self.n = (os.path.getsize(path) // 2 - block_size - 1) // block_size + 1

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        if self.data is None:  # opened in the worker
            self.data = np.memmap(self.path, dtype=np.uint16, mode="r")
        s = i * self.block
        w = self.data[s:s + self.block + 1].astype(np.int64)
        return torch.from_numpy(w[:-1]), torch.from_numpy(w[1:])


def time_calls(f, batches):
    t0 = time.perf_counter()
    for _ in range(batches):
        f()
    return batches * BATCH / (time.perf_counter() - t0)


def time_dataloader(path, workers, batches):
    import torch

    loader = torch.utils.data.DataLoader(WindowDataset(path, SEQ), batch_size=BATCH,
                                         shuffle=True, num_workers=workers)
    it = iter(loader)
    for _ in range(3):  # workers up and running
        next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    rate = batches * BATCH / (time.perf_counter() - t0)
    del it
    return rate


def memcpy_bandwidth(nbytes, total=1 << 30):
    """Single-thread memcpy bytes/s between two buffers of `nbytes` (a batch's size: the
    destination stays in cache as a reused batch slot does; or large: memory-bound)."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    reps = max(1, total // nbytes)
    t0 = time.perf_counter()
    for _ in range(reps):
        np.copyto(dst, src)
    return reps * nbytes / (time.perf_counter() - t0)


def loader_batches_per_second(loader, batches, epoch):
    """Batches/s of `batches` batches of `epoch` (all of it if fewer), the loader's
    workers already running (its first batch is not timed)."""
    import itertools

    loader.set_epoch(epoch)
    it = iter(loader)
    next(it)
    t0 = time.perf_counter()
    n = sum(1 for _ in itertools.islice(it, batches))
    secs = time.perf_counter() - t0
    it.close()
    return n / secs


# --- packing -------------------------------------------------------------------------

def make_docs(total_tokens, seed=0):
    rng = np.random.default_rng(seed)
    docs, n = [], 0
    while n < total_tokens:
        length = int(min(2048, max(1, rng.lognormal(np.log(250), 0.9))))
        docs.append(rng.integers(0, 50000, length, dtype=np.int64).astype(np.uint16))
        n += length
    return docs


def flattening_collator():
    """transformers' DataCollatorWithFlattening, or its __call__ written out."""
    try:
        from transformers import DataCollatorWithFlattening

        return DataCollatorWithFlattening(return_flash_attn_kwargs=True), "transformers"
    except ImportError:
        import torch

        def collate(features):  # DataCollatorWithFlattening.__call__, return_tensors="pt"
            batch = {"input_ids": [], "labels": [], "position_ids": []}
            cu, max_len = [0], 0
            for sample in features:
                ids = sample["input_ids"]
                batch["input_ids"] += ids
                batch["labels"] += [-100] + ids[1:]
                batch["position_ids"] += list(range(len(ids)))
                cu.append(cu[-1] + len(ids))
                max_len = max(max_len, len(ids))
            out = {k: torch.tensor([v], dtype=torch.int64) for k, v in batch.items()}
            out["cu_seq_lens_q"] = out["cu_seq_lens_k"] = torch.tensor(cu, dtype=torch.int32)
            out["max_length_q"] = out["max_length_k"] = max_len
            return out

        return collate, "re-implementation (transformers not installed)"


def python_greedy_packer(docs, seq_len, rows_per_batch):
    """Next fit into rows of seq_len; yields tensors like stoker's packed batches."""
    import torch

    def emit(rows):
        ids, labels, pos, cu = [], [], [], [0]
        for row in rows:
            r_ids, r_lab, r_pos = [], [], []
            for d in row:
                r_ids += d
                r_lab += d[1:] + [-100]
                r_pos += list(range(len(d)))
                cu.append(cu[-1] + len(d))
            pad = seq_len - len(r_ids)
            if pad:
                r_ids += [0] * pad
                r_lab += [-100] * pad
                r_pos += list(range(pad))
                cu.append(cu[-1] + pad)
            ids.append(r_ids)
            labels.append(r_lab)
            pos.append(r_pos)
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels),
                "position_ids": torch.tensor(pos),
                "cu_seqlens": torch.tensor(cu, dtype=torch.int32)}

    rows, row, used = [], [], 0
    for d in docs:
        for off in range(0, len(d), seq_len):
            piece = d[off:off + seq_len]
            if used + len(piece) > seq_len:
                rows.append(row)
                row, used = [], 0
                if len(rows) == rows_per_batch:
                    yield emit(rows)
                    rows = []
            row.append(piece)
            used += len(piece)
    if row:
        rows.append(row)
    if rows:
        yield emit(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=float, default=50e6, help="stream length (windows)")
    p.add_argument("--pack-tokens", type=float, default=4e6, help="tokens of the packing docs")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batches", type=int, default=100, help="stoker batches per timing")
    p.add_argument("--peer-batches", type=int, default=20, help="peer batches per timing")
    p.add_argument("--skip-dataloader", action="store_true")
    args = p.parse_args()

    import stoker
    from stoker import token_dataset as td

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with tempfile.TemporaryDirectory(prefix="stoker-bench-tokens-") as tmp:
        path = os.path.join(tmp, "train.bin")
        n_tok = int(args.tokens)
        rng = np.random.default_rng(0)
        for start in range(0, n_tok, 1 << 24):  # write in pieces: bounded memory
            rng.integers(0, 50257, min(1 << 24, n_tok - start), dtype=np.int64) \
                .astype(np.uint16).tofile(open(path, "ab"))
        data = np.memmap(path, dtype=np.uint16, mode="r")
        _ = int(data.sum(dtype=np.uint64))  # page cache
        print(f"windows: {n_tok / 1e6:.0f} M uint16 tokens, seq_len {SEQ}, batch {BATCH}, "
              f"int64 out, {cores} cores; windows/s, median of {args.repeats}")
        ds = stoker.TokenDataset(path, dtype="uint16")
        prod = td._make_producer(ds, batch_size=BATCH, seq_len=SEQ, shuffle=True, seed=0)
        res = {}
        epochs = iter(range(10**6))
        for t in (1, 2):
            loader = stoker.Loader(ds, batch_size=BATCH, seq_len=SEQ, shuffle=True, seed=0,
                                   num_threads=t, prefetch=4, stall_warning=None)

            def run(loader=loader):
                return loader_batches_per_second(loader, args.batches, next(epochs)) * BATCH
            res[f"stoker Loader, {t} thread(s)"] = median(run, args.repeats)
            loader.close()
        res["nanoGPT get_batch"] = median(
            lambda: time_calls(lambda: nanogpt_get_batch(path, SEQ, BATCH), args.peer_batches),
            args.repeats)
        res["NumPy gather (np.stack + astype)"] = median(
            lambda: time_calls(lambda: numpy_gather(data, rng, SEQ, BATCH), args.peer_batches),
            args.repeats)
        if not args.skip_dataloader:
            for w in (0, 1, 2):
                res[f"DataLoader workers={w}"] = median(
                    lambda w=w: time_dataloader(path, w, args.peer_batches),
                    max(1, args.repeats // 2))
        out_bytes = 2 * SEQ * 8  # input_ids + labels per window
        bw = median(lambda: memcpy_bandwidth(BATCH * out_bytes), args.repeats)
        bw_big = median(lambda: memcpy_bandwidth(1 << 28), max(1, args.repeats // 2))
        res["ceiling: memcpy of the output"] = bw / out_bytes
        res["  (memcpy at 256 MiB, memory-bound)"] = bw_big / out_bytes
        width = max(map(len, res))
        for k, v in res.items():
            print(f"  {k:<{width}}  {v:12,.0f}")
        s = max(res["stoker Loader, 1 thread(s)"], res["stoker Loader, 2 thread(s)"])
        s1 = res["stoker Loader, 1 thread(s)"]
        print(f"  memcpy bandwidth, one thread: {bw / 1e9:.1f} GB/s between batch-sized "
              f"buffers, {bw_big / 1e9:.1f} GB/s between 256 MiB buffers")
        print(f"  stoker best / NumPy gather: {s / res['NumPy gather (np.stack + astype)']:.1f}x "
              "(target >= 2x)")
        print(f"  stoker best / nanoGPT get_batch: {s / res['nanoGPT get_batch']:.1f}x "
              "(target >= 15x)")
        if not args.skip_dataloader:
            dl = max(v for k, v in res.items() if k.startswith("DataLoader"))
            print(f"  stoker best / best DataLoader: {s / dl:.1f}x")
        ceiling = res["ceiling: memcpy of the output"]
        print(f"  stoker 1 thread / ceiling (1 thread): {s1 / ceiling:.0%}")

        # --- packing
        docs = make_docs(int(args.pack_tokens))
        real = sum(len(d) for d in docs)
        with stoker.ShardWriter(os.path.join(tmp, "docs"), {"tokens": stoker.tokens("uint16")},
                                shard_size="64MB") as w:
            for d in docs:
                w.write({"tokens": d})
        tds = stoker.TokenDataset(os.path.join(tmp, "docs"))
        print(f"\npacking: {len(docs):,} documents, {real / 1e6:.1f} M tokens (median "
              f"{int(np.median([len(d) for d in docs]))}), rows of {SEQ}, {BATCH} rows per "
              f"batch; real tokens/s, median of {args.repeats}")
        t0 = time.perf_counter()
        packed = td._make_producer(tds, batch_size=BATCH, seq_len=SEQ, packing="document",
                                   shuffle=True)
        plan_ms = (time.perf_counter() - t0) * 1e3
        concat = td._make_producer(tds, batch_size=BATCH, seq_len=SEQ, packing="concat",
                                   shuffle=True)
        pres = {}
        for name, prod_p in (("document", packed), ("concat", concat)):
            used = real - prod_p.unused_tokens if name == "document" else prod_p.epoch_rows * SEQ
            for t in (1, 2):
                loader = stoker.Loader(tds, batch_size=BATCH, seq_len=SEQ, packing=name,
                                       shuffle=True, num_threads=t, prefetch=4,
                                       stall_warning=None)
                nb = len(loader)

                def run(loader=loader, nb=nb, used=used):
                    # real tokens per second over the epoch's batches after the first
                    return loader_batches_per_second(loader, nb, next(epochs)) * used / nb
                pres[f"stoker packing={name!r}, {t} thread(s)"] = median(run, args.repeats)
                loader.close()
        lists = [d.tolist() for d in docs]
        collate, which = flattening_collator()
        per_call = max(1, int(BATCH * SEQ / (real / len(docs))))

        def hf():
            t0 = time.perf_counter()
            for i in range(0, len(lists), per_call):
                collate([{"input_ids": x} for x in lists[i:i + per_call]])
            return real / (time.perf_counter() - t0)

        def greedy():
            t0 = time.perf_counter()
            for _ in python_greedy_packer(lists, SEQ, BATCH):
                pass
            return real / (time.perf_counter() - t0)

        pres[f"HF DataCollatorWithFlattening ({which})"] = median(hf, max(1, args.repeats // 2))
        pres["plain Python greedy packer"] = median(greedy, max(1, args.repeats // 2))
        width = max(map(len, pres))
        for k, v in pres.items():
            print(f"  {k:<{width}}  {v:14,.0f}")
        sp = max(pres["stoker packing='document', 1 thread(s)"],
                 pres["stoker packing='document', 2 thread(s)"])
        peer = max(v for k, v in pres.items() if not k.startswith("stoker"))
        print(f"  pad fraction (document): {packed.pad_fraction:.2%}; packing plan built in "
              f"{plan_ms:.0f} ms")
        print(f"  stoker document packing / faster peer: {sp / peer:.1f}x (target >= 10x)")

        # --- resume cost
        print("\nresume: plan_epoch + first batch at a position of the epoch, ms (median)")
        budget = td._make_producer(tds, max_tokens=BATCH * SEQ, shuffle=True)
        for name, prod_r in (("windows, 50M stream", prod), ("concat", concat),
                             ("document", packed), ("max_tokens", budget)):
            nb = prod_r.num_batches(0, 1)
            cells = []
            for frac in (0.0, 0.5, 0.999):
                k = int(frac * nb)
                off = prod_r.consumed_after(3, 0, 1, 0, k)

                def resume(off=off, prod_r=prod_r):
                    t0 = time.perf_counter()
                    plan = prod_r.plan_epoch(3, 0, 1, off)
                    prod_r.run_batches(plan, 0, 1, 1)
                    return (time.perf_counter() - t0) * 1e3
                cells.append(f"{frac:>6.1%}: {median(resume, args.repeats):7.2f}")
            print(f"  {name:<20} " + "   ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
