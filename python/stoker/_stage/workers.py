"""DataLoader's worker protocol inside stoker's workers, and the global random generators.

* ``torch.utils.data.get_worker_info()`` answers in every worker as in DataLoader's: in a
  worker process it is the process's (``_utils.worker._worker_info``, which DataLoader's
  workers set too); in a worker thread, stoker's own answer for that thread (torch's
  function is replaced once, in torch.utils.data and in every module that imported the
  name, by one that looks at the calling thread first, then asks torch's), and None in
  the loop's thread.
* ``worker_init_fn(worker_id)`` runs once in each worker, after its info is set.
* NOTE [ Global random generators ]
  Code written for DataLoader draws from Python's ``random``, NumPy's global generator and
  torch's default generator (torchvision's transforms do). In a worker process stoker seeds
  all three before each sample from (seed, epoch, index), so the draws of a sample are the
  same whatever worker runs it and however many there are, and a resume is exact (random
  and torch from 64 bits of the sample's key, numpy.random from 32: its legacy seeding
  of an int costs a fifth of an array's; the keys of a chunk made in one pass). Threads
  share one set of globals, so which sample gets which draw depends on timing: the first
  sample a stage thread runs is watched, run as a worker process would run it
  (``seeded_call``: the globals seeded for it, the process's own states put back after,
  one such call at a time) while the other threads wait for the answer; if it drew, the
  threads take no more work and the stage goes to processes at once
  (python_workers="auto"), the threads running the rest of the chunks they hold the same
  seeded way, so that every sample's draws are a worker process's and the batches the
  same run to run; or it warns once (python_workers="thread", or samples that cannot be
  pickled), and the threads then never run ahead of the loop into an epoch it has not
  started (the user's process is left alone between epochs: a validation loader's draws
  stay its own). The loader's own thread (DataLoader's num_workers=0: ``inline``) runs
  the dataset as DataLoader's does, unseeded, in the loop's order.
"""

from __future__ import annotations

import random
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.utils.data

from .rng import _MASK, _mix_int, rng_keys

__all__ = ["set_thread_worker_info", "set_process_worker_info", "seed_globals",
           "prepare_chunk", "draws_globals", "seeded_call", "worker_info_wanted"]

_GLOBAL_DOMAIN = 0x5354_4B52_4E47_0003  # "STKRNG" 3: a sample's global generators
_local = threading.local()
_patch_lock = threading.Lock()
_original: Optional[Callable[[], Any]] = None


def _get_worker_info() -> Any:
    """torch.utils.data.get_worker_info, answering in stoker's worker threads too."""
    info = getattr(_local, "info", None)
    if info is not None:
        return info
    assert _original is not None
    return _original()


def _install() -> None:
    global _original
    with _patch_lock:
        if _original is not None:
            return
        import torch.utils.data._utils.worker as worker

        _original = worker.get_worker_info
        worker.get_worker_info = _get_worker_info
        torch.utils.data.get_worker_info = _get_worker_info
        # modules that imported the name itself (from torch.utils.data import
        # get_worker_info) hold torch's function: theirs is replaced too
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if isinstance(namespace, dict) and namespace.get("get_worker_info") is _original:
                namespace["get_worker_info"] = _get_worker_info


def _info(worker_id: int, num_workers: int, seed: int, dataset: Any) -> Any:
    from torch.utils.data._utils.worker import WorkerInfo

    return WorkerInfo(id=worker_id, num_workers=num_workers,
                      seed=(int(seed) + worker_id) & 0xFFFFFFFFFFFFFFFF, dataset=dataset)


def set_thread_worker_info(worker_id: int, num_workers: int, seed: int, dataset: Any) -> None:
    """The calling thread is worker `worker_id` of `num_workers`."""
    _install()
    _local.info = _info(worker_id, num_workers, seed, dataset)


def set_process_worker_info(worker_id: int, num_workers: int, seed: int, dataset: Any) -> None:
    """This process is worker `worker_id` of `num_workers` (as DataLoader's workers)."""
    import torch.utils.data._utils.worker as worker

    worker._worker_info = _info(worker_id, num_workers, seed, dataset)


def worker_info_wanted(source: Any) -> bool:
    """Whether the stage's threads need get_worker_info() without a worker_init_fn (an
    IterableDataset shards by it)."""
    return bool(getattr(source, "wants_worker_info", False))


# (seed, epoch) -> key_words' base for them: a worker seeds every sample of an epoch with
# one, so each sample's key costs four mixes, not six
_bases: Tuple[int, int, int] = (-1, -1, 0)


def _global_key(seed: int, epoch: int, index: int) -> Tuple[int, int, int, int]:
    """key_words(seed, epoch, index, _GLOBAL_DOMAIN), its (seed, epoch) part kept."""
    global _bases
    s, e, base = _bases
    if s != seed or e != epoch:
        base = _mix_int(_mix_int((int(seed) & _MASK) ^ _GLOBAL_DOMAIN) ^ (int(epoch) & _MASK))
        _bases = (seed, epoch, base)
    h = _mix_int(base ^ (int(index) & _MASK))
    return h, _mix_int(h ^ 1), _mix_int(h ^ 2), _mix_int(h ^ 3)


# (seed, epoch, {index: key}) of the chunk a worker process runs (prepare_chunk)
_chunk: Tuple[int, int, Dict[int, List[int]]] = (-1, -1, {})


def prepare_chunk(seed: int, epoch: int, indices: Sequence[int]) -> None:
    """A worker process about to run samples `indices` of `epoch`: their keys for
    seed_globals in one vectorised pass (per sample in Python, with the caches cold
    after the user's code, a key cost about 30 us)."""
    global _chunk
    keys = rng_keys(seed, epoch, indices, _GLOBAL_DOMAIN).tolist()
    _chunk = (seed, epoch, dict(zip(indices, keys)))


def seed_globals(seed: int, epoch: int, index: int) -> None:
    """Seeds random, numpy.random and torch's default generator for sample `index` of
    `epoch` (NOTE [ Global random generators ])."""
    s, e, keys = _chunk
    key = keys.get(index) if s == seed and e == epoch else None
    k0, k1, _, k3 = _global_key(seed, epoch, index) if key is None else key
    random.seed(k0)
    # 32 bits: NumPy's legacy seeding of an int is one call, where an array of words
    # goes through several array checks (about 50 us a sample after the user's code,
    # against 10)
    np.random.seed(k1 & 0xFFFFFFFF)
    # torch's CPU generator alone: torch.manual_seed also queues a seed for every CUDA
    # device (formatting a stack each time: 130 us a sample), and a forked worker process
    # cannot use CUDA
    torch.default_generator.manual_seed(k3 & 0x7FFFFFFFFFFFFFFF)


def _snapshot() -> Any:
    return (random.getstate(), np.random.get_state(), torch.random.get_rng_state())


def _restore(state: Any) -> None:
    random.setstate(state[0])
    np.random.set_state(state[1])
    torch.random.set_rng_state(state[2])


# One seeded call at a time: the globals are the process's, shared by every thread.
_SEEDED = threading.Lock()


def seeded_call(seed: int, epoch: int, index: int, run: Callable[[], Any]) -> Tuple[bool, Any]:
    """(whether `run()` drew from the global generators, what it returned), run with them
    seeded for sample `index` of `epoch` as a worker process seeds them (so its draws are
    a worker's), and the process's own states put back after (NOTE [ Global random
    generators ])."""
    with _SEEDED:
        saved = _snapshot()
        try:
            seed_globals(seed, epoch, index)
            before = _snapshot()
            out = run()
            after = _snapshot()
        finally:
            _restore(saved)
    return _drew(before, after), out


def draws_globals(run: Callable[[], Any]) -> Tuple[bool, Any]:
    """(whether `run()` (one sample) drew from random, numpy.random or torch's default
    generator, what it returned)."""
    before = _snapshot()
    out = run()
    return _drew(before, _snapshot()), out


def _drew(before: Any, after: Any) -> bool:
    return (before[0] != after[0] or not _same_np(before[1], after[1])
            or not torch.equal(before[2], after[2]))


def _same_np(a: Any, b: Any) -> bool:
    return a[2] == b[2] and np.array_equal(a[1], b[1])
