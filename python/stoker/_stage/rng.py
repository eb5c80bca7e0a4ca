"""Per-sample and per-batch random generators of the Python stage: a function of
(seed, epoch, index) only, the same on every thread, in every worker process and after
any resume (NOTE [ Python stage ] in stoker/_stage/__init__.py)."""

from __future__ import annotations

import threading
from typing import Any, Callable, Tuple

import numpy as np
import torch
from numpy.random.bit_generator import ISeedSequence

__all__ = ["rng_keys", "key_words", "rng_from_key", "sample_rng", "batch_rng",
           "call_with_torch_seeded"]



_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
# Domains of the keys: a sample's generator and a batch's never coincide.
_SAMPLE_DOMAIN = 0x5354_4B52_4E47_0001  # "STKRNG" 1
_BATCH_DOMAIN = 0x5354_4B52_4E47_0002
_TORCH_DOMAIN = 0x5354_4B52_4E47_0003


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


_MASK = 0xFFFFFFFFFFFFFFFF


def _mix_int(z: int) -> int:
    """_mix on one Python int: the same values, without NumPy's per-call cost (a one-element
    array costs about 50 us a key; this, about 2)."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def key_words(seed: int, epoch: int, index: int, domain: int = 0x5354_4B52_4E47_0001
              ) -> Tuple[int, int, int, int]:
    """rng_keys(seed, epoch, [index], domain)[0] as four Python ints: one sample's key at
    the cost of a few integer operations (worker processes seed the global generators
    per sample with it)."""
    base = _mix_int((int(seed) & _MASK) ^ (int(domain) & _MASK))
    base = _mix_int(base ^ (int(epoch) & _MASK))
    h = _mix_int(base ^ (int(index) & _MASK))
    return (h, _mix_int(h ^ 1), _mix_int(h ^ 2), _mix_int(h ^ 3))


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


# NOTE [ torch's generator in batch_map ]
# kornia, torchvision.transforms.v2 on tensors and plain torch.rand draw from torch's global
# generators (the CPU's, and each CUDA device's), which are process-wide: their draws would
# depend on which batch_map call ran before, on which thread. Each call runs with the
# generators forked (torch.random.fork_rng: saved, then restored after) and seeded from
# (seed, epoch, rank, world size, batch), so its draws are a function of the batch alone.
# Two calls must not interleave on one generator, so they take turns (a lock): batch_map
# calls run one at a time, their tensor kernels still in parallel inside each.
_TORCH_LOCK = threading.Lock()


def batch_torch_seed(seed: int, epoch: int, rank: int, world_size: int, batch: int) -> int:
    """The seed of torch's generators for batch_map's call on `batch` (63 bits)."""
    lane = (int(rank) << 32) ^ int(world_size)
    key = rng_keys(seed ^ lane, epoch, [batch], _TORCH_DOMAIN)[0, 0]
    return int(key) >> 1


def call_with_torch_seeded(fn: Callable[..., Any], batch: Any, rng: np.random.Generator,
                           torch_seed: int, device: Any = None) -> Any:
    """``fn(batch, rng)`` with torch's CPU generator (and `device`'s, a CUDA device)
    forked and seeded with `torch_seed` (NOTE [ torch's generator in batch_map ])."""
    cuda = device is not None and torch.device(device).type == "cuda"
    devices = [torch.device(device)] if cuda else []
    with _TORCH_LOCK, torch.random.fork_rng(devices=devices):
        torch.random.default_generator.manual_seed(torch_seed)
        if cuda:
            with torch.cuda.device(devices[0]):
                torch.cuda.manual_seed(torch_seed)
        return fn(batch, rng)
