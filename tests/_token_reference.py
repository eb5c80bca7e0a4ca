"""A slow, plain-Python statement of what every token batch holds.

The C++ producer (``csrc/producers/token_producer.h``) is checked against this module in
the tests: for the same documents and options, batch k of (epoch, rank, world_size,
offset) must be equal, array for array. It is written for clarity, not speed: windows
are slices of the concatenated stream, packing is a loop over documents, budgets a
sort. The pseudo-random orders are the same keyed permutations (a Feistel network with
splitmix64 round functions) with the same keys (``csrc/sampler/token_keys.h``).

Usage::

    ds, kw = stoker.token_dataset._producer_args(ds, seq_len=128, batch_size=8, ...)
    ref = Reference([np.asarray(d) for d in ds], **kw)
    ref.batch(epoch=0, rank=0, world_size=1, offset=0, k=3)   # dict of numpy arrays
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

_M64 = (1 << 64) - 1


def mix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def hash_combine(a: int, b: int) -> int:
    return mix64(a ^ mix64(b))


class Permutation:
    """The sampler's keyed bijection of [0, n) (csrc/sampler/permutation.h)."""

    def __init__(self, n: int, key: int):
        self.n = n
        hb = 1
        while hb < 32 and (1 << (2 * hb)) < n:
            hb += 1
        self.hb, self.mask = hb, (1 << hb) - 1
        self.keys = []
        k = key
        for _ in range(6):
            k = mix64(k)
            self.keys.append(k)

    def _encrypt(self, x: int) -> int:
        left, right = x >> self.hb, x & self.mask
        for rk in self.keys:
            left, right = right, left ^ (mix64(right ^ rk) & self.mask)
        return (left << self.hb) | right

    def __call__(self, i: int) -> int:
        if self.n <= 1:
            return i
        x = self._encrypt(i)
        while x >= self.n:
            x = self._encrypt(x)
        return x


def epoch_key(seed: int, epoch: int) -> int:
    return hash_combine(seed, epoch)


def pack_key(seed: int) -> int:
    return hash_combine(seed, 0x7061636B2D646F63)


def bucket_key(seed: int, epoch: int, g: int) -> int:
    return hash_combine(hash_combine(hash_combine(seed, epoch), 0x6275636B6574), g)


class Split:
    """Rank r of w takes global positions offset + r, offset + r + w, ... (wrapping; without
    `even`, only the real ones, in as many batches as every rank has)."""

    def __init__(self, n: int, offset: int, rank: int, world: int, batch: int, drop_last: bool,
                 even: bool = True):
        self.n, self.offset, self.rank, self.world, self.batch = n, offset, rank, world, batch
        left = n - offset
        self.per_rank = left // world if drop_last else -(-left // world)
        self.share = self.per_rank if even or drop_last else \
            len(range(offset + rank, n, world))
        self.batches = self.per_rank // batch if drop_last else -(-self.per_rank // batch)

    def positions(self, k: int) -> List[int]:
        count = max(0, min(self.batch, self.share - k * self.batch))
        out = []
        for j in range(count):
            q = self.offset + self.rank + (k * self.batch + j) * self.world
            out.append(q % self.n)
        return out

    def consumed_after(self, k: int) -> int:
        return min(self.n, self.offset + min(self.per_rank, k * self.batch) * self.world)


def pack_rows(lengths: Sequence[int], seq_len: int, fit: str, window: int, overlong: str,
              shuffle: bool, seed: int) -> List[List[Tuple[int, int, int]]]:
    """Rows of (doc, offset, length) pieces, in closing order (sampler/pack_plan.h)."""
    D = len(lengths)
    perm = Permutation(D, pack_key(seed)) if shuffle and D > 1 else None
    rows: List[List[Tuple[int, int, int]]] = []
    open_rows: List[list] = []  # [free, pieces], in opening order

    def place(piece):
        if piece[2] == seq_len:
            rows.append([piece])
            return
        chosen = None
        for i, (free, _) in enumerate(open_rows):
            if free >= piece[2] and (chosen is None or (fit == "best_fit"
                                                        and free < open_rows[chosen][0])):
                chosen = i
                if fit == "first_fit":
                    break
        if chosen is None:
            if len(open_rows) >= window:
                rows.append(open_rows.pop(0)[1])
            open_rows.append([seq_len, []])
            chosen = len(open_rows) - 1
        open_rows[chosen][0] -= piece[2]
        open_rows[chosen][1].append(piece)
        if open_rows[chosen][0] == 0:
            rows.append(open_rows.pop(chosen)[1])

    for i in range(D):
        d = perm(i) if perm else i
        n = lengths[d]
        if n == 0:
            continue
        if n <= seq_len:
            place((d, 0, n))
        elif overlong == "error":
            raise ValueError(f"document {d} is longer than seq_len")
        elif overlong == "truncate":
            place((d, 0, seq_len))
        else:
            off = 0
            while off + seq_len <= n:
                place((d, off, seq_len))
                off += seq_len
            if off < n:
                place((d, off, n - off))
    rows.extend(r[1] for r in open_rows)
    return rows


class Reference:
    """What the token producer must yield; arguments as ``_core.TokenProducer``'s."""

    def __init__(self, docs: Sequence[np.ndarray], *, mode: str, prompts: Sequence[int] = (),
                 seq_len: int = 0,
                 stride: int = 0, batch_size: int = 1, max_tokens: int = 0, max_length: int = 0,
                 pad_to_multiple_of: int = 1, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, token_dtype: str = "int64", pad_id: int = 0,
                 ignore_index: int = -100, pack_fit: str = "best_fit", pack_window: int = 64,
                 overlong: str = "split", vocab_size: int = 0, attention_mask: bool = True,
                 unshifted: bool = False, even_batches: bool = True):
        self.docs = [np.asarray(d).astype(np.int64) for d in docs]
        self.prompts = list(prompts) or [0] * len(self.docs)  # leading tokens with no label
        self.mode, self.L, self.B = mode, seq_len, batch_size
        self.stride = stride or seq_len
        self.shuffle, self.seed, self.drop_last = shuffle, seed % 2**64, drop_last
        self.even = even_batches
        self.dtype = np.dtype(token_dtype)
        self.pad_id, self.ignore = pad_id, ignore_index
        self.attention_mask = attention_mask
        self.unshifted = unshifted  # HF's labels: the tokens themselves, the model shifts
        lengths = [len(d) for d in self.docs]
        self.stream = np.concatenate(self.docs) if self.docs else np.zeros(0, np.int64)
        self.starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        N = len(self.stream)
        if mode == "windows":
            self.n = (N - seq_len - 1) // self.stride + 1
        elif mode == "concat":
            self.n = N // seq_len
        elif mode == "document":
            self.rows = pack_rows(lengths, seq_len, pack_fit, pack_window, overlong, shuffle,
                                  self.seed)
            self.n = len(self.rows)
        elif mode == "budget":
            used = [min(n, max_length) if max_length else n for n in lengths]
            m = pad_to_multiple_of
            width = [-(-u // m) * m for u in used]
            keep = [d for d in range(len(lengths)) if lengths[d] > 0]
            self.sorted = sorted(keep, key=lambda d: (width[d], d))
            self.used = used
            w = [width[d] for d in self.sorted]
            self.buckets = [i for i in range(len(w)) if i == 0 or w[i] != w[i - 1]] + [len(w)]
            self.batches: List[Tuple[int, int, int]] = []
            b = 0
            for i in range(len(w)):
                rows = i - b + 1
                if rows * w[i] > max_tokens or (batch_size and rows > batch_size):
                    self.batches.append((b, i, w[i - 1]))
                    b = i
            if w:
                self.batches.append((b, len(w), w[-1]))
            self.n = len(keep)
        else:
            raise ValueError(mode)

    # -- epoch bookkeeping ---------------------------------------------------

    def epoch_samples(self) -> int:
        return self.n

    def _order(self, count: int, epoch: int):
        perm = Permutation(count, epoch_key(self.seed, epoch)) if self.shuffle and count > 1 \
            else None
        return (lambda q: perm(q)) if perm else (lambda q: q)

    def _budget_split(self, epoch: int, rank: int, world: int, offset: int):
        order = self._order(len(self.batches), epoch)
        g, seen = 0, 0
        while seen < offset and g < len(self.batches):
            b = self.batches[order(g)]
            seen += b[1] - b[0]
            g += 1
        assert seen == offset, "offset not at a batch boundary"
        return order, Split(len(self.batches), g, rank, world, 1, self.drop_last)

    def num_batches(self, rank: int = 0, world: int = 1) -> int:
        if self.mode == "budget":
            return Split(len(self.batches), 0, rank, world, 1, self.drop_last).batches
        return Split(self.n, 0, rank, world, self.B, self.drop_last, self.even).batches

    def consumed_after(self, epoch: int, rank: int, world: int, offset: int, batches: int) -> int:
        if self.mode != "budget":
            return Split(self.n, offset, rank, world, self.B, self.drop_last, self.even) \
                .consumed_after(batches)
        order, split = self._budget_split(epoch, rank, world, offset)
        end = split.consumed_after(batches)
        out = offset
        for g in range(split.offset, end):
            b = self.batches[order(g)]
            out += b[1] - b[0]
        return min(out, self.n)

    # -- batches -------------------------------------------------------------

    def _doc_at(self, epoch: int, i: int) -> int:
        if not self.shuffle:
            return self.sorted[i]
        g = max(j for j in range(len(self.buckets) - 1) if self.buckets[j] <= i)
        b0, size = self.buckets[g], self.buckets[g + 1] - self.buckets[g]
        return self.sorted[b0 + Permutation(size, bucket_key(self.seed, epoch, g))(i - b0)]

    def _row_pieces(self, row: int) -> List[Tuple[int, int, int]]:
        if self.mode == "document":
            return self.rows[row]
        t0, pieces, used = row * self.L, [], 0
        d = int(np.searchsorted(self.starts, t0, side="right")) - 1
        while used < self.L:
            off = t0 + used - int(self.starts[d])
            take = min(len(self.docs[d]) - off, self.L - used)
            if take > 0:
                pieces.append((d, off, take))
                used += take
            d += 1
        return pieces

    def _fill_row(self, pieces, width: int, packed: bool) -> Dict[str, np.ndarray]:
        x = np.full(width, self.pad_id, np.int64)
        y = np.full(width, self.ignore, np.int64)
        pos = np.zeros(width, np.int64)
        loss = np.zeros(width, bool)
        seqs = []
        c = 0
        for d, off, p in pieces:
            doc = self.docs[d]
            x[c:c + p] = doc[off:off + p]
            if self.unshifted:
                # every token of the sequence but its first, and but the prompt's
                for i in range(1, p):
                    if off + i >= self.prompts[d]:
                        y[c + i] = doc[off + i]
            else:
                nxt = doc[off + 1:off + p + 1]  # the next token of the same document, if any
                y[c:c + len(nxt)] = nxt
                loss[c:c + len(nxt)] = True
                for i in range(len(nxt)):  # the next token is part of the prompt: no target
                    if off + i + 1 < self.prompts[d]:
                        y[c + i] = self.ignore
                        loss[c + i] = False
            pos[c:c + p] = np.arange(p)
            seqs.append(p)
            c += p
        if c < width:
            pos[c:] = np.arange(width - c)
            seqs.append(width - c)
        return {"x": x, "y": y, "pos": pos, "loss": loss, "seqs": seqs, "used": c}

    def batch(self, epoch: int, rank: int, world: int, offset: int, k: int) \
            -> Dict[str, np.ndarray]:
        dt = self.dtype
        if self.mode == "budget":
            order, split = self._budget_split(epoch, rank, world, offset)
            begin, end, width = self.batches[order(split.positions(k)[0])]
            rows = [self._fill_row([(d, 0, self.used[d])], width, False)
                    for d in (self._doc_at(epoch, i) for i in range(begin, end))]
            out = {"input_ids": np.stack([r["x"] for r in rows]).astype(dt),
                   "labels": np.stack([r["y"] for r in rows]).astype(dt)}
            if not self.unshifted:
                out["loss_mask"] = np.stack([r["loss"] for r in rows])
            if self.attention_mask:
                am = np.zeros((len(rows), width), np.int64)
                for i, r in enumerate(rows):
                    am[i, :r["used"]] = 1
                out["attention_mask"] = am.astype(dt)
            return out
        split = Split(self.n, offset, rank, world, self.B, self.drop_last, self.even)
        order = self._order(self.n, epoch)
        ids = [order(q) for q in split.positions(k)]
        L = self.L
        if self.mode == "windows":
            win = [self.stream[i * self.stride:i * self.stride + L + 1] for i in ids]
            if self.unshifted:  # a window is one sequence
                y = [np.concatenate([[self.ignore], w[1:L]]) for w in win]
            else:
                y = [w[1:] for w in win]
            return {"input_ids": np.stack([w[:L] for w in win]).astype(dt),
                    "labels": np.stack(y).astype(dt)}
        rows = [self._fill_row(self._row_pieces(i), L, True) for i in ids]
        lengths = [s for r in rows for s in r["seqs"]]
        if self.unshifted:  # HF's names; the longest sequence as the shape of an empty array
            cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            return {"input_ids": np.stack([r["x"] for r in rows]).astype(dt),
                    "labels": np.stack([r["y"] for r in rows]).astype(dt),
                    "position_ids": np.stack([r["pos"] for r in rows]).astype(dt),
                    "cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
                    "max_length": np.zeros((max(lengths), 0), np.int32)}
        return {"input_ids": np.stack([r["x"] for r in rows]).astype(dt),
                "labels": np.stack([r["y"] for r in rows]).astype(dt),
                "position_ids": np.stack([r["pos"] for r in rows]).astype(dt),
                "cu_seqlens": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
                "max_seqlen": np.array(max(lengths), np.int32),
                "loss_mask": np.stack([r["loss"] for r in rows])}

    def pad_fraction(self) -> float:
        if self.mode == "document":
            return 1 - sum(p for r in self.rows for _, _, p in r) / (len(self.rows) * self.L)
        if self.mode == "budget":
            total = sum((e - b) * w for b, e, w in self.batches)
            return 1 - sum(self.used[d] for d in self.sorted) / total
        return 0.0
