"""Mixture benchmark: three token sources blended by weight, with document packing.

    python bench/bench_mix.py [--tokens 12e6] [--repeats 5]

Three sources of documents with different length distributions (web: median ~300 tokens,
code: ~900, math: ~120; random uint16 ids), blended 60/30/10 in tokens into rows of
--seq-len (1024) tokens, --batch (16) rows per batch, whole documents per row
(packing="document"), shuffled. Real (non-pad) tokens/s, median of --repeats, for
  (a) stoker.Loader(stoker.Mix(...), packing="document") on --threads (2) threads, and,
      interleaved with it in the same run, stoker.Loader over one dataset holding all
      three sources' documents (the same bytes and the same packing, no mixing): the cost
      of mixing (target: within 10%);
  (b) a NumPy implementation of the same blend: every source packed once (first fit in
      a window of 64 open rows), a shuffled row order per pass, rows chosen by Megatron's
      rule (the source lagging its token target most), batches assembled with NumPy;
  (c) HF datasets' interleave_datasets(probabilities=...) over the three (iterable
      datasets with a shuffle buffer; probabilities per document, set from the token
      weights and the sources' mean document lengths), packed by a Python first-fit
      packer into the same rows;
  (d) LitData's CombinedStreamingDataset(weights=...) over the three (written with
      litdata.optimize), through StreamingDataLoader, packed the same way; skipped when
      litdata is not installed.
Resume at a late step (--resume-step, 90% of the epoch by default): for stoker the time of
load_state_dict (the arithmetic of a resume; target: under a millisecond) and of it plus
the next 3 batches, checked equal to the uninterrupted run's; NumPy replays its
allocation rule to the step; HF and LitData load their states (taken halfway: they run
out of documents near the epoch's end) and yield a batch.
Last, the realised token ratio of stoker's packed mixture over an epoch
(loader.stats()["sources"]) and the peers' over their timed batches.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

WEIGHTS = {"web": 0.6, "code": 0.3, "math": 0.1}
MEDIANS = {"web": 300, "code": 900, "math": 120}
SHARES = {"web": 0.55, "code": 0.35, "math": 0.10}  # of --tokens: math is read ~once


def make_docs(name, tokens, seed, max_len):
    rng = np.random.default_rng(seed)
    docs, n = [], 0
    while n < tokens:
        length = int(min(max_len, max(1, rng.lognormal(np.log(MEDIANS[name]), 0.9))))
        docs.append(rng.integers(0, 50000, length, dtype=np.int64).astype(np.uint16))
        n += length
    return docs


def median(xs):
    return statistics.median(xs)


def page_in(paths):
    """Reads every file once: the machine pages out idle cache, and every contender must
    start from memory."""
    for root in paths:
        for dirpath, _, files in os.walk(root):
            for f in files:
                with open(os.path.join(dirpath, f), "rb") as fh:
                    while fh.read(1 << 24):
                        pass


# --- the Python first-fit packer shared by the HF and LitData pipelines -------------

class Packer:
    """Whole documents into rows of seq_len, first fit among `window` open rows (a longer
    document is cut into seq_len pieces); yields batches as stoker packs them:
    input_ids, labels, position_ids [B, L], cu_seqlens, and each row's source."""

    def __init__(self, seq_len, batch, window=8):
        self.L, self.B, self.window = seq_len, batch, window

    def batches(self, docs):
        import torch

        L, B = self.L, self.B
        open_rows = []  # [free, [(ids, source)]]
        full = []
        for ids, src in docs:
            for off in range(0, len(ids), L):
                piece = ids[off:off + L]
                for row in open_rows:
                    if row[0] >= len(piece):
                        break
                else:
                    if len(open_rows) == self.window:
                        full.append(open_rows.pop(0)[1])
                    row = [L, []]
                    open_rows.append(row)
                row[0] -= len(piece)
                row[1].append((piece, src))
                if row[0] == 0:
                    open_rows.remove(row)
                    full.append(row[1])
            while len(full) >= B:
                rows, full = full[:B], full[B:]
                yield self.emit(rows, torch)

    def emit(self, rows, torch):
        L = self.L
        ids = np.zeros((len(rows), L), np.int64)
        labels = np.full((len(rows), L), -100, np.int64)
        pos = np.zeros((len(rows), L), np.int64)
        cu, source, real = [0], [], 0
        for r, row in enumerate(rows):
            c = 0
            for piece, _ in row:
                n = len(piece)
                ids[r, c:c + n] = piece
                labels[r, c:c + n - 1] = piece[1:]
                pos[r, c:c + n] = np.arange(n)
                c += n
                cu.append(r * L + c)
            real += c
            if c < L:
                pos[r, c:] = np.arange(L - c)
                cu.append((r + 1) * L)
            source.append(row[0][1])
        return {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels),
                "position_ids": torch.from_numpy(pos),
                "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
                "source": torch.tensor(source), "real_tokens": real,
                "tokens_by_source": _tokens_by_source(rows)}


def _tokens_by_source(rows):
    out = {}
    for row in rows:
        for piece, src in row:
            out[src] = out.get(src, 0) + len(piece)
    return out


# --- (b) the same blend in NumPy ---------------------------------------------------------

def first_fit_rows(docs, L, window=64):
    """Rows of (doc, offset, length) pieces, first fit among `window` open rows."""
    rows, open_rows = [], []
    for d, doc in enumerate(docs):
        for off in range(0, len(doc), L):
            n = min(L, len(doc) - off)
            for row in open_rows:
                if row[0] >= n:
                    break
            else:
                if len(open_rows) == window:
                    rows.append(open_rows.pop(0)[1])
                row = [L, []]
                open_rows.append(row)
            row[0] -= n
            row[1].append((d, off, n))
            if row[0] == 0:
                open_rows.remove(row)
                rows.append(row[1])
    rows += [r[1] for r in open_rows]
    return rows


class NumpyBlend:
    """Packed rows of each source, blended by Megatron's rule in tokens."""

    def __init__(self, sources, weights, seq_len, batch, seed=0):
        self.names = list(sources)
        self.docs = [sources[n] for n in self.names]
        self.w = np.array([weights[n] for n in self.names], float)
        self.L, self.B, self.seed = seq_len, batch, seed
        self.rows = [first_fit_rows(d, seq_len) for d in self.docs]
        self.row_tokens = [np.array([sum(p[2] for p in r) for r in rows]) for rows in self.rows]
        self.state = None

    def reset(self):
        k = len(self.names)
        self.tokens = np.zeros(k)     # tokens taken per source
        self.taken = np.zeros(k, int)  # rows taken per source
        self.orders = {}

    def order(self, s, p):
        if (s, p) not in self.orders:
            rng = np.random.default_rng([self.seed, s, p])
            self.orders[(s, p)] = rng.permutation(len(self.rows[s]))
        return self.orders[(s, p)]

    def pick(self):
        total = self.tokens.sum()
        s = int(np.argmax(self.w * max(total, 1) - self.tokens))
        n = len(self.rows[s])
        p, i = divmod(self.taken[s], n)
        r = int(self.order(s, p)[i])
        self.taken[s] += 1
        self.tokens[s] += self.row_tokens[s][r]
        return s, r

    def skip(self, steps):
        """A resume: the rule is sequential, so the allocation is replayed."""
        self.reset()
        for _ in range(steps * self.B):
            self.pick()

    def batch(self):
        import torch

        L, B = self.L, self.B
        ids = np.zeros((B, L), np.int64)
        labels = np.full((B, L), -100, np.int64)
        pos = np.zeros((B, L), np.int64)
        cu, source, by_source = [0], np.zeros(B, np.int64), {}
        for b in range(B):
            s, r = self.pick()
            source[b] = s
            c = 0
            for d, off, n in self.rows[s][r]:
                doc = self.docs[s][d]
                ids[b, c:c + n] = doc[off:off + n]
                have = min(n, len(doc) - off - 1)
                labels[b, c:c + have] = doc[off + 1:off + 1 + have]
                pos[b, c:c + n] = np.arange(n)
                c += n
                cu.append(b * L + c)
            if c < L:
                pos[b, c:] = np.arange(L - c)
                cu.append((b + 1) * L)
            by_source[self.names[s]] = by_source.get(self.names[s], 0) + c
        return {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels),
                "position_ids": torch.from_numpy(pos),
                "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
                "source": torch.from_numpy(source), "tokens_by_source": by_source}


# --- (c) HF datasets --------------------------------------------------------------------

def hf_pipeline(hf_sources, probabilities, seed):
    from datasets import interleave_datasets

    return interleave_datasets(hf_sources, probabilities=probabilities, seed=seed,
                               stopping_strategy="all_exhausted")


def hf_docs(stream):
    for ex in stream:
        yield np.asarray(ex["input_ids"], np.uint16), ex["source"]


# --- (d) LitData ------------------------------------------------------------------------

def _lit_item(item):
    return {"ids": item[0], "source": item[1]}


def lit_sources(tmp, docs_by_name):
    import litdata

    out = {}
    for i, (name, docs) in enumerate(docs_by_name.items()):
        d = os.path.join(tmp, f"lit_{name}")
        litdata.optimize(fn=_lit_item, inputs=[(x, i) for x in docs], output_dir=d,
                         chunk_bytes="16MB", num_workers=1, mode="overwrite")
        out[name] = d
    return out


def lit_docs(loader):
    for x in loader:
        yield np.asarray(x["ids"]), int(x["source"])


def lit_loader(dirs, probabilities, seed):
    import litdata

    sets = [litdata.StreamingDataset(d, shuffle=True, seed=seed) for d in dirs.values()]
    combined = litdata.CombinedStreamingDataset(sets, weights=probabilities, seed=seed,
                                                iterate_over_all=False)
    return litdata.StreamingDataLoader(combined, batch_size=1, num_workers=0,
                                       collate_fn=_first)


def _first(items):
    return items[0]


# --- timing helpers ---------------------------------------------------------------------

def rate(batches_iter, count, by_source=None):
    """Real tokens/s over `count` batches (the first one not timed); adds each source's
    real tokens to `by_source`."""
    first = next(batches_iter)
    del first
    t0 = time.perf_counter()
    real = 0
    for _ in range(count):
        b = next(batches_iter)
        for src, n in b["tokens_by_source"].items():
            real += n
            if by_source is not None:
                by_source[src] = by_source.get(src, 0) + n
    return real / (time.perf_counter() - t0)


def stoker_rate(loader, count, epoch):
    import itertools

    loader.set_epoch(epoch)
    it = iter(loader)
    next(it)
    s0 = loader.stats()
    t0 = time.perf_counter()
    n = sum(1 for _ in itertools.islice(it, count))
    secs = time.perf_counter() - t0
    s1 = loader.stats()
    it.close()
    if "sources" in s1:  # a mixture counts its real tokens per source
        real = sum(v["tokens"] for v in s1["sources"].values()) - \
            sum(v["tokens"] for v in s0["sources"].values())
    else:  # one dataset: its rows' positions less the plan's padding
        rows = s1["samples"] - s0["samples"]
        real = rows * loader.dataset_seq_len * (1 - s1["pad_fraction"])
    return n, secs, real


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=float, default=12e6, help="tokens of the three sources")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batches", type=int, default=300, help="stoker batches per timing")
    p.add_argument("--peer-batches", type=int, default=40, help="peer batches per timing")
    p.add_argument("--resume-step", type=int, default=None,
                   help="step to resume at (default: 90%% of the epoch)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    import stoker
    import torch

    L, B = args.seq_len, args.batch
    with tempfile.TemporaryDirectory(prefix="stoker-bench-mix-") as tmp:
        docs = {n: make_docs(n, int(args.tokens * SHARES[n]), i, 4 * L)
                for i, n in enumerate(WEIGHTS)}
        fields = {"tokens": stoker.tokens("uint16")}
        for n, ds in docs.items():
            with stoker.ShardWriter(os.path.join(tmp, n), fields, shard_size="32MB") as w:
                for d in ds:
                    w.write({"tokens": d})
        with stoker.ShardWriter(os.path.join(tmp, "all"), fields, shard_size="32MB") as w:
            for n in WEIGHTS:
                for d in docs[n]:
                    w.write({"tokens": d})
        sources = {n: stoker.TokenDataset(os.path.join(tmp, n)) for n in WEIGHTS}
        mix = stoker.Mix(sources, weights=WEIGHTS)
        single = stoker.TokenDataset(os.path.join(tmp, "all"))
        stats = {n: (len(d), sum(map(len, d))) for n, d in docs.items()}
        print("sources: " + ", ".join(f"{n} {c:,} docs / {t / 1e6:.1f} M tokens (median "
                                       f"{int(np.median([len(x) for x in docs[n]]))})"
                                       for n, (c, t) in stats.items()))
        print(f"weights (tokens) {WEIGHTS}; rows of {L}, {B} rows per batch, packing="
              f"'document', shuffled; {args.threads} stoker threads; real tokens/s, median "
              f"of {args.repeats}")

        kw = dict(batch_size=B, seq_len=L, packing="document", shuffle=True, seed=0,
                  num_threads=args.threads, prefetch=8, stall_warning=None)
        mixed = stoker.Loader(mix, **kw)
        one = stoker.Loader(single, **kw)
        one.dataset_seq_len = L
        epoch_batches = len(mixed)
        count = min(args.batches, epoch_batches - 1, len(one) - 1)
        res = {"stoker Mix": [], "stoker single dataset": []}
        epochs = iter(range(10**6))
        for _ in range(args.repeats):  # interleaved: the machine's noise hits both
            for name, loader in (("stoker Mix", mixed), ("stoker single dataset", one)):
                page_in([tmp])
                n, secs, real = stoker_rate(loader, count, next(epochs))
                res[name].append(real / secs)

        # (b) NumPy
        t0 = time.perf_counter()
        nb = NumpyBlend(docs, WEIGHTS, L, B)
        numpy_setup = time.perf_counter() - t0
        res["NumPy blend (Megatron rule)"] = []
        ratios = {k: {} for k in ("NumPy blend", "HF interleave_datasets", "LitData")}
        for _ in range(args.repeats):
            nb.reset()
            it = iter(lambda: nb.batch(), None)
            res["NumPy blend (Megatron rule)"].append(
                rate(it, args.peer_batches, ratios["NumPy blend"]))

        # (c) HF interleave_datasets
        from datasets import Dataset as HFDataset

        mean_len = {n: stats[n][1] / stats[n][0] for n in WEIGHTS}
        doc_p = np.array([WEIGHTS[n] / mean_len[n] for n in WEIGHTS])
        doc_p = list(doc_p / doc_p.sum())
        names = list(WEIGHTS)
        hf_sets = []
        for i, n in enumerate(names):
            h = HFDataset.from_dict({"input_ids": [d.tolist() for d in docs[n]],
                                     "source": [i] * len(docs[n])})
            hf_sets.append(h.to_iterable_dataset(num_shards=4).shuffle(seed=0,
                                                                     buffer_size=1000))
        packer = Packer(L, B)
        res["HF interleave_datasets + packer"] = []
        for _ in range(args.repeats):
            stream = hf_pipeline(hf_sets, doc_p, 0)
            it = packer.batches(hf_docs(stream))
            res["HF interleave_datasets + packer"].append(
                rate(it, args.peer_batches, ratios["HF interleave_datasets"]))

        # (d) LitData
        try:
            import litdata  # noqa: F401
            lit_dirs = lit_sources(tmp, docs)
        except ImportError:
            lit_dirs = None
        if lit_dirs:
            res["LitData CombinedStreamingDataset + packer"] = []
            for _ in range(args.repeats):
                ld = lit_loader(lit_dirs, doc_p, 0)
                it = packer.batches(lit_docs(ld))
                res["LitData CombinedStreamingDataset + packer"].append(
                    rate(it, args.peer_batches, ratios["LitData"]))

        width = max(map(len, res))
        print(f"\n{'':<{width}}  real tokens/s")
        for k, v in res.items():
            print(f"  {k:<{width}}  {median(v):14,.0f}")
        m, s = median(res["stoker Mix"]), median(res["stoker single dataset"])
        print(f"  stoker Mix / single dataset: {m / s:.1%} (target >= 90%)")
        for k in res:
            if not k.startswith("stoker"):
                print(f"  stoker Mix / {k}: {m / median(res[k]):.1f}x")
        print(f"  (NumPy setup, packing every source in Python: {numpy_setup:.1f} s)")

        # --- resume at a late step
        step = args.resume_step or int(0.9 * epoch_batches)
        print(f"\nresume at step {step} of {epoch_batches} (epoch 0): seconds to the first "
              "batch from a saved state")
        ref = stoker.Loader(mix, **kw)
        ref.set_epoch(0)
        it = iter(ref)
        for _ in range(step):
            next(it)
        state = ref.state_dict()
        expect = [next(it) for _ in range(3)]
        it.close()
        loads, firsts = [], []
        for _ in range(args.repeats):
            fresh = stoker.Loader(mix, **kw)
            t0 = time.perf_counter()
            fresh.load_state_dict(state)
            t1 = time.perf_counter()
            it = iter(fresh)
            got = [next(it) for _ in range(3)]
            t2 = time.perf_counter()
            it.close()
            loads.append(t1 - t0)
            firsts.append(t2 - t0)
            same = all(torch.equal(a[k], b[k]) for a, b in zip(expect, got) for k in a)
            assert same, "a resumed stoker loader gave other batches"
        rres = {"stoker load_state_dict": median(loads),
                "stoker load_state_dict + 3 batches": median(firsts)}
        t0 = time.perf_counter()
        nb.skip(step)
        nb.batch()
        rres[f"NumPy blend: replay + 1 batch (step {step})"] = time.perf_counter() - t0
        # HF and LitData: their states after `peer_step` packed batches (they run out of
        # documents at about the epoch's end), loaded by new pipelines (the packer's open
        # rows are not in their states: a resume drops them)
        peer_step = min(step, epoch_batches // 2)
        stream = hf_pipeline(hf_sets, doc_p, 0)
        it = packer.batches(hf_docs(stream))
        for _ in range(peer_step):
            next(it)
        hf_state = stream.state_dict()
        t0 = time.perf_counter()
        again = hf_pipeline(hf_sets, doc_p, 0)
        again.load_state_dict(hf_state)
        next(packer.batches(hf_docs(again)))
        rres[f"HF load_state_dict + 1 batch (step {peer_step})"] = time.perf_counter() - t0
        if lit_dirs:
            ld = lit_loader(lit_dirs, doc_p, 0)
            it = packer.batches(lit_docs(ld))
            for _ in range(peer_step):
                next(it)
            lit_state = ld.state_dict()
            t0 = time.perf_counter()
            ld2 = lit_loader(lit_dirs, doc_p, 0)
            ld2.load_state_dict(lit_state)
            next(packer.batches(lit_docs(ld2)))
            rres[f"LitData load_state_dict + 1 batch (step {peer_step})"] = \
                time.perf_counter() - t0
        width = max(map(len, rres))
        for k, v in rres.items():
            print(f"  {k:<{width}}  {v * 1e3:10.3f} ms")
        print("  stoker's resumed batches equal the uninterrupted run's: yes")

        # --- realised token ratio
        ratio_loader = stoker.Loader(mix, **kw)
        for _ in ratio_loader:
            pass
        src = ratio_loader.stats()["sources"]
        total = sum(v["tokens"] for v in src.values())
        print(f"\nrealised token ratio over one epoch ({len(ratio_loader)} batches, "
              f"{total / 1e6:.1f} M real tokens):")
        for n in WEIGHTS:
            print(f"  {n:<5} {src[n]['tokens'] / total:.4f} (weight {WEIGHTS[n]}), "
                  f"{src[n]['samples']:,} rows")
        print(f"the peers' over their timed batches ({args.repeats} x {args.peer_batches}):")
        for peer, by in ratios.items():
            if not by:
                continue
            tot = sum(by.values())
            got = {n: by.get(n, by.get(i, 0)) / tot for i, n in enumerate(WEIGHTS)}
            print(f"  {peer:<22} " + ", ".join(f"{n} {v:.4f}" for n, v in got.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
