"""Per-sample and per-batch random generators of the Python stage: a function of
(seed, epoch, index) only, the same on every thread, in every worker process and after
any resume (NOTE [ Python stage ] in stoker/_stage/__init__.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.random.bit_generator import ISeedSequence

__all__ = ["rng_keys", "rng_from_key", "sample_rng", "batch_rng"]



_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
# Domains of the keys: a sample's generator and a batch's never coincide.
_SAMPLE_DOMAIN = 0x5354_4B52_4E47_0001  # "STKRNG" 1
_BATCH_DOMAIN = 0x5354_4B52_4E47_0002


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over uint64 arrays (wrapping arithmetic), the mixer the C++
    engine uses for its seeds (csrc/sampler/permutation.h)."""
    with np.errstate(over="ignore"):
        z = z + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MUL1
        z = (z ^ (z >> np.uint64(27))) * _MUL2
    return z ^ (z >> np.uint64(31))


def _u64(value: int) -> np.uint64:
    return np.uint64(int(value) & 0xFFFFFFFFFFFFFFFF)


def rng_keys(seed: int, epoch: int, indices: Any, domain: int = _SAMPLE_DOMAIN) -> np.ndarray:
    """The 256-bit generator states of samples `indices` of `epoch`: uint64 [n, 4], a
    function of (seed, epoch, index) only. Vectorised: a chunk's keys cost one pass."""
    idx = np.asarray(indices, dtype=np.int64).astype(np.uint64)
    base = _mix(np.array([_u64(seed) ^ _u64(domain)], np.uint64))
    base = _mix(base ^ _u64(epoch))
    h = _mix(base ^ idx)
    out = np.empty((idx.shape[0], 4), np.uint64)
    out[:, 0] = h
    for i in range(1, 4):
        out[:, i] = _mix(h ^ np.uint64(i))
    return out


class _Key(ISeedSequence):
    """A precomputed state for a bit generator. NumPy's own SeedSequence costs 10-30 us
    per sample (it hashes, and a generator made without one reads OS entropy first); this
    hands PCG64 the words rng_keys made, which are well mixed already."""

    __slots__ = ("_words",)

    def __init__(self, words: np.ndarray):
        self._words = words

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        words = self._words
        if n_words == 4 and dtype is np.uint64:  # what PCG64 asks for
            return words
        if np.dtype(dtype) == np.uint32:
            words = words.view(np.uint32)
        return np.resize(words, n_words).astype(dtype, copy=False)


def rng_from_key(key: np.ndarray) -> np.random.Generator:
    """A ``numpy.random.Generator`` (PCG64) from one row of rng_keys."""
    return np.random.Generator(np.random.PCG64(_Key(key)))


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator ``map`` receives for dataset sample `index` in `epoch` of a loader
    with `seed`: the same in every run, on every thread, after any resume."""
    return rng_from_key(rng_keys(seed, epoch, [index])[0])


def batch_rng(seed: int, epoch: int, rank: int, world_size: int,
              batch: int) -> np.random.Generator:
    """The generator ``batch_map`` receives for batch `batch` (counted from the start of
    the epoch) of `rank` of `world_size` ranks."""
    lane = (int(rank) << 32) ^ int(world_size)
    keys = rng_keys(seed ^ lane, epoch, [batch], _BATCH_DOMAIN)
    return rng_from_key(keys[0])
