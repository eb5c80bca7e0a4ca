"""The loader: :class:`Loader`."""

from __future__ import annotations

import atexit
import operator
import os
import threading
import time
import warnings
import weakref
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Union

import torch

from . import _core
from .dataset import Dataset
from .fields import Image
from .ops import Op, _specs

__all__ = ["Loader"]

_STATE_VERSION = 1
_DEFAULT_MAX_PIXELS = 100_000_000

# Every live iterator, and every loader that may hold a next-epoch prefetch, so that
# interpreter exit stops worker threads before teardown.
_live_iterators: "weakref.WeakSet[_LoaderIter]" = weakref.WeakSet()
_live_loaders: "weakref.WeakSet[Loader]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for it in list(_live_iterators):
        it.close()
    for loader in list(_live_loaders):
        loader._drop_ahead()


def _available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _check_int(name: str, value: Any, low: int, high: int = 2**63 - 1,
               what: Optional[str] = None) -> int:
    """`value` as an int in [low, high], else a ValueError naming `name`. Integer types
    (NumPy's, a 0-d integer tensor) are taken; bools and floats are not."""
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < low:
        if what is None:
            what = "a positive int" if low == 1 else "a non-negative int" if low == 0 else "an int"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    if number > high:
        raise ValueError(f"{name} must be at most {high}, got {value!r}")
    return number


def _dist_defaults() -> tuple:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return 0, 1


class Loader:
    """Batches of a :class:`stoker.Dataset` as dicts of ``torch.Tensor``.

    A drop-in for ``torch.utils.data.DataLoader`` over stoker datasets: C++ worker threads
    read, verify, decode and transform samples straight into batch buffers, and each batch
    reaches Python without a copy (DLPack). Example::

        ds = stoker.Dataset("out/train")
        loader = stoker.Loader(ds, batch_size=256, shuffle=True, seed=0,
                               transforms={"image": [stoker.ops.RandomResizedCrop(224),
                                                     stoker.ops.RandomHorizontalFlip()]})
        for epoch in range(10):
            loader.set_epoch(epoch)
            for batch in loader:   # {"image": uint8[256, 224, 224, 3], "label": int64[256]}
                ...

    Guarantees:
      * ``len(loader)`` batches per epoch, always: ``ceil(n / batch_size)`` (``floor`` with
        ``drop_last``) where n is this rank's share; never dependent on ``num_threads``.
      * The same (data, seed, epoch, rank, world_size, batch_size, drop_last) gives the
        same batches, bit for bit, for any ``num_threads`` and ``prefetch``.
      * ``state_dict()`` mid-epoch, then ``load_state_dict()`` on a new loader (any thread
        count): the next iteration yields exactly the batches not yet yielded.
      * A bad sample raises :class:`stoker.DataError` naming the shard file and record in
        the iterating thread, when its batch is reached (or, with ``on_error="skip"``, is
        replaced by the next valid sample, counted in ``stats()`` and reported by a warning).

    Args:
        dataset: a :class:`stoker.Dataset` or a path to one.
        batch_size: samples per batch.
        shuffle: a new permutation each epoch, from (seed, epoch); sequential if False.
        seed: the shuffling and augmentation seed.
        drop_last: drop the last incomplete batch (and the remainder of the rank split).
        num_threads: worker threads; None = the cores available to this process.
        prefetch: batches in flight; None = automatic.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``: where batches are delivered.
        pin_memory: page-lock the batch buffers; None = True when device is CUDA.
        rank, world_size: this process's share; None = from torch.distributed if
            initialised, else 0 and 1. Every rank gets the same number of batches (the
            order wraps around to pad, as DistributedSampler does, unless drop_last).
        transforms: ``{field: [op, ...]}`` with ops from :mod:`stoker.ops` (image fields).
        on_error: ``"raise"`` (default) or ``"skip"``.
        max_image_pixels: images whose header declares more pixels are refused.
        prefetch_next_epoch: start loading the next epoch's first batches while this
            epoch's last ones are handed out, so that an epoch's first batch does not wait
            for workers starting from cold (see below).

    Each ``iter(loader)`` runs one epoch: the epoch given by ``set_epoch``, or else the one
    after the last started (like DataLoader, which reshuffles on every pass). Starting a
    new iterator stops the previous one.

    NOTE [ Next-epoch prefetch ]: the epoch that the next ``iter()`` will run
    (``set_epoch``'s, or the one after) starts loading before that call, so that its first
    batch does not wait for workers starting from cold. It starts once this epoch's workers
    are done and fewer than ``prefetch`` of its batches are left to hand out, and it gets
    the window of ``prefetch`` batches one batch at a time as this epoch's are handed out:
    the two together never hold more than ``prefetch`` batches, so batch k+1 of the new
    epoch is assembled just as it would have been within one epoch. The next ``iter()``
    takes it over if it runs that epoch from its start; anything else (``set_epoch`` to
    another epoch, ``load_state_dict``) drops it. Batches are functions of (seed, epoch,
    batch), so this changes no batch. ``close()`` (or dropping the loader) stops those
    workers.
    """

    def __init__(
        self,
        dataset: Union[Dataset, str, os.PathLike],
        batch_size: int = 1,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        num_threads: Optional[int] = None,
        prefetch: Optional[int] = None,
        device: Union[str, torch.device] = "cpu",
        pin_memory: Optional[bool] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        transforms: Optional[Mapping[str, Sequence[Op]]] = None,
        on_error: str = "raise",
        max_image_pixels: int = _DEFAULT_MAX_PIXELS,
        prefetch_next_epoch: bool = True,
        _fake_device: bool = False,
    ):
        if not isinstance(dataset, Dataset):
            dataset = Dataset(dataset)
        self.dataset = dataset
        batch_size = _check_int("batch_size", batch_size, 1)
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        # a seed is 64 bits: negative seeds are taken modulo 2**64, larger ones refused
        # rather than silently aliased to a smaller one
        seed = _check_int("seed", seed, -2**63, 2**64 - 1)
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.drop_last = bool(drop_last)
        self.on_error = on_error
        self.prefetch_next_epoch = bool(prefetch_next_epoch)

        if num_threads is None:
            num_threads = _available_cores()
        num_threads = _check_int("num_threads", num_threads, 1, 4096, "a positive int or None")
        self.num_threads = num_threads
        if prefetch is None:
            prefetch = 4
        prefetch = _check_int("prefetch", prefetch, 1, 2**31 - 1, "a positive int or None")
        self.prefetch = prefetch

        d_rank, d_world = _dist_defaults()
        self.world_size = _check_int("world_size", d_world if world_size is None else world_size,
                                     1)
        self.rank = _check_int("rank", d_rank if rank is None else rank, 0)
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is outside [0, world_size={self.world_size})")

        self.device = torch.device(device)
        is_cuda = self.device.type == "cuda"
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
        if is_cuda:
            available, count, reason = _core.cuda_status()
            if not available:
                raise RuntimeError(f"device={str(self.device)!r} requested but CUDA is not "
                                   f"usable here: {reason}")
            index = self.device.index
            if index is None:
                index = torch.cuda.current_device() if torch.cuda.is_available() else 0
            if index >= count:
                raise RuntimeError(f"device={str(self.device)!r}: only {count} CUDA device(s)")
            self.device = torch.device("cuda", index)
        self.pin_memory = is_cuda if pin_memory is None else bool(pin_memory)

        self.transforms = self._check_transforms(transforms or {})
        images = {}
        for name, f in dataset.fields.items():
            if isinstance(f, Image):
                images[name] = (f.layout, _specs(self.transforms.get(name, [])),
                                int(max_image_pixels))

        allocator = None
        self._fake_device = bool(_fake_device)
        if is_cuda and self.pin_memory:
            allocator = _core.pinned_allocator(self.device.index)
        elif self._fake_device and self.pin_memory:
            allocator = _core.fake_pinned_allocator()
        elif self.pin_memory and _core.cuda_status()[0]:
            allocator = _core.pinned_allocator(0)  # CPU delivery into page-locked slots
        # The device and its buffer pool serve every epoch: ending one never waits for
        # the GPU, and the next reuses the buffers (NOTE [ Pool across epochs ]).
        self._device_context = None
        if is_cuda or self._fake_device:
            self._device_context = _core.DeviceContext(
                self.device.index if is_cuda else 0, prefetch + 2, fake=self._fake_device)
        if self.pin_memory and not is_cuda and not _core.cuda_status()[0]:
            warnings.warn("pin_memory=True but no CUDA device is available; batches use "
                          "pageable memory", RuntimeWarning, stacklevel=2)
        self._engine = _core.Engine(
            dataset._core, batch_size, self.shuffle, seed & 0xFFFFFFFFFFFFFFFF,
            self.drop_last, self.rank, self.world_size, num_threads, prefetch,
            on_error == "skip", images, allocator)
        self._pid = os.getpid()
        self._epoch = 0            # the epoch the next iterator runs
        self._resume: Optional[tuple] = None   # (epoch, first batch) from load_state_dict
        self._last: Optional[weakref.ref] = None
        self._last_state: Optional[tuple] = None  # (epoch, yielded, finished) of last iterator
        self._ahead: Optional[_Ahead] = None  # NOTE [ Next-epoch prefetch ]
        self._skipped_reported = 0
        self._lock = threading.RLock()  # close() takes it, also from __iter__ and __del__
        # Counters of the host-to-device transfers of finished epochs (see stats()).
        self._transfer_totals: Dict[str, float] = {}
        self._run_seconds = 0.0  # summed over closed iterators (see stats())

    def _check_transforms(self, transforms: Mapping[str, Sequence[Op]]) -> Dict[str, list]:
        if not isinstance(transforms, Mapping):
            raise TypeError(f"transforms must be a dict {{field name: [ops]}}, got "
                            f"{type(transforms).__name__}")
        out = {}
        for name, ops in transforms.items():
            if name not in self.dataset.fields:
                raise ValueError(f"transforms: no field {name!r} in the dataset "
                                 f"(fields: {', '.join(self.dataset.fields)})")
            if not isinstance(self.dataset.fields[name], Image):
                raise ValueError(f"transforms: field {name!r} is not an image field; ops apply "
                                 "to stoker.image() fields")
            if isinstance(ops, Op):
                ops = [ops]
            ops = list(ops)
            for op in ops:
                if not isinstance(op, Op):
                    raise ValueError(f"transforms[{name!r}]: expected stoker.ops objects, got "
                                     f"{type(op).__name__}")
            out[name] = ops
        return out

    # -- epochs and length ----------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        return self._engine.num_batches

    @property
    def num_samples(self) -> int:
        """Samples per epoch for this rank (including wrap-around padding)."""
        return self._engine.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch the next iteration runs (its permutation and augmentations).
        A pending resume from ``load_state_dict`` is kept when it is for this epoch."""
        epoch = _check_int("epoch", epoch, 0)
        with self._lock:
            self._epoch = epoch
            if self._resume is not None and self._resume[0] != epoch:
                self._resume = None
            if self._ahead is not None and self._ahead.epoch != epoch:
                self._drop_ahead()

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will run."""
        return self._resume[0] if self._resume is not None else self._epoch

    def __iter__(self) -> "_LoaderIter":
        if os.getpid() != self._pid:
            raise RuntimeError("this Loader was created in another process (before os.fork()); "
                               "create a new Loader in this process")
        with self._lock:
            prev = self._last() if self._last is not None else None
            if prev is not None:
                prev.close()
            if self._resume is not None:
                epoch, first = self._resume
                self._resume = None
            else:
                epoch, first = self._epoch, 0
            started = None
            if self._ahead is not None:
                if self._ahead.epoch == epoch and first == 0:
                    started = self._adopt_ahead()
                else:
                    self._drop_ahead()
            self._epoch = epoch + 1
            it = _LoaderIter(self, epoch, first, started)
            self._last = weakref.ref(it)
            self._last_state = (epoch, first, first >= len(self))
            return it

    # -- resume ---------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader stands: the rest of the current epoch after
        ``load_state_dict`` is exactly the batches not yet yielded."""
        if self._resume is not None:
            epoch, done = self._resume
        elif self._last_state is not None and not self._last_state[2]:
            epoch, done = self._last_state[0], self._last_state[1]
        else:
            epoch, done = self._epoch, 0
        return {
            "version": _STATE_VERSION,
            "epoch": epoch,
            "batches_yielded": done,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "rank": self.rank,
            "world_size": self.world_size,
            "num_records": len(self.dataset),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from ``state_dict()``: the next iteration continues that epoch.
        The thread count and prefetch may differ; the data and sampling settings may not."""
        if not isinstance(state, Mapping):
            raise TypeError(f"load_state_dict takes the dict of state_dict(), got "
                            f"{type(state).__name__}")
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported loader state version {state.get('version')!r}")
        mine = self.state_dict()
        for key in ("seed", "shuffle", "batch_size", "drop_last", "rank", "world_size",
                    "num_records"):
            if state.get(key) != mine[key]:
                raise ValueError(f"cannot resume: state has {key}={state.get(key)!r} but this "
                                 f"loader has {key}={mine[key]!r}")
        epoch = _check_int("state's epoch", state.get("epoch"), 0)
        done = _check_int("state's batches_yielded", state.get("batches_yielded"), 0)
        if not 0 <= done <= len(self):
            raise ValueError(f"cannot resume: batches_yielded={done} outside [0, {len(self)}]")
        if done == len(self):
            epoch, done = epoch + 1, 0
        with self._lock:
            self._resume = (epoch, done)
            self._epoch = epoch
            self._last_state = None
            if self._ahead is not None and (self._ahead.epoch, 0) != (epoch, done):
                self._drop_ahead()

    # -- threads --------------------------------------------------------------

    def close(self) -> None:
        """Stops every worker thread of this loader: the live iterator's (as its
        ``close()`` does) and a next-epoch prefetch. Batches already yielded stay valid, and
        the loader stays usable: the next ``iter()`` starts its workers again."""
        with self._lock:
            it = self._last() if self._last is not None else None
            if it is not None:
                it.close()
            self._drop_ahead()

    def _after_yield(self, it: "_LoaderIter") -> None:
        """NOTE [ Next-epoch prefetch ]: `it` has just handed out a batch."""
        remaining = it._end - it._yielded  # batches of `it` still in flight, at most
        if remaining >= self.prefetch or not self.prefetch_next_epoch:
            return  # mid-epoch: nothing to do
        with self._lock:
            if self._last is None or self._last() is not it:
                return
            ahead = self._ahead
            if ahead is None:
                if self._resume is not None or (remaining > 0 and it._it.live_workers > 0):
                    return  # `it`'s workers are still busy: do not compete with them
                try:
                    ahead = _Ahead(self._epoch, self._engine.start(self._epoch, 0, remaining))
                except Exception:
                    return  # only a head start: the next iter() starts (or fails) as usual
                self._ahead = ahead
                _live_loaders.add(self)
            if ahead.it.held > remaining:  # hand over the window as `it` frees it
                ahead.it.release_held(ahead.it.held - remaining)
            if remaining == 0 and ahead.transfer is None:
                # With a device, copies start once `it`'s last batch is out, so that device
                # buffers in flight stay within prefetch too.
                try:
                    ahead.transfer = self._start_transfer(ahead.it)
                except Exception:
                    self._drop_ahead()

    def _adopt_ahead(self) -> tuple:
        """Takes the prefetched epoch over (call with the lock): (iteration, transfer).
        Its whole window is free now, also when the epoch before was left early."""
        ahead, self._ahead = self._ahead, None
        ahead.it.release_held(ahead.it.held)
        if ahead.transfer is None:
            try:
                ahead.transfer = self._start_transfer(ahead.it)
            except BaseException:
                ahead.it.stop()
                raise
        return ahead.it, ahead.transfer

    def _drop_ahead(self) -> None:
        with self._lock:
            ahead, self._ahead = self._ahead, None
        if ahead is not None and os.getpid() == self._pid:
            _stop_threads(ahead.it, ahead.transfer)

    def _start_threads(self, epoch: int, first: int) -> tuple:
        """Starts an epoch's workers, and with a device its copy thread:
        (engine iteration, transfer or None)."""
        it = self._engine.start(epoch, first)
        try:
            return it, self._start_transfer(it)
        except BaseException:
            it.stop()
            raise

    def _start_transfer(self, it):
        """The copy thread of an epoch's batches to the device; None without a device."""
        if self._device_context is None:
            return None
        return _core.CudaTransfer(it, self._device_context, self.prefetch)

    # -- introspection --------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """Counters since creation: batches, samples, bytes read, skipped samples,
        seconds per stage (read+verify, decode, prepare), consumer wait seconds,
        worker idle seconds, the current queue depth, run_seconds (the time iterators
        were open, all epochs) and samples_per_second over it. With a device, also
        ``transfer``: copies (completed), bytes, copy_seconds (device time), wait_seconds (the
        iterating thread blocked in ``next``), copy_gbps, and the device buffers alive
        (pool_buffers, pool_bytes: idle in the loader's pool, or held by batches)."""
        s = self._engine.stats()
        it = self._last() if self._last is not None else None
        s["queue_depth"] = it._queue_depth() if it is not None else 0
        with self._lock:
            live = it._transfer_stats() if it is not None else None
            if live is not None or self._transfer_totals:
                s["transfer"] = _add_transfer_stats(self._transfer_totals, live or {})
                s["transfer"].update(self._device_context.stats())
            seconds = self._run_seconds + (it._live_seconds() if it is not None else 0.0)
        s["live_workers"] = it._live_workers() if it is not None else 0
        s["run_seconds"] = seconds
        s["samples_per_second"] = s["samples"] / seconds if seconds > 0 else 0.0
        if getattr(self.dataset, "remote", None) is not None:  # a dataset read from a URL
            s["network"] = self.dataset.remote.stats()
        return s

    def _report_skipped(self) -> None:
        skipped = self._engine.stats()["skipped"]
        new = skipped - self._skipped_reported
        if new > 0:
            self._skipped_reported = skipped
            warnings.warn(f"stoker: replaced {new} unreadable sample(s) with the next valid "
                          "one (on_error='skip'); see loader.stats()['skipped']",
                          RuntimeWarning, stacklevel=3)

    def __repr__(self) -> str:
        return (f"stoker.Loader({len(self.dataset)} samples, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, num_threads={self.num_threads}, "
                f"device={str(self.device)!r})")


class _Ahead:
    """An epoch started before its iter() (NOTE [ Next-epoch prefetch ])."""

    __slots__ = ("epoch", "it", "transfer")

    def __init__(self, epoch: int, it) -> None:
        self.epoch, self.it, self.transfer = epoch, it, None


def _stop_threads(it, transfer) -> None:
    if transfer is not None:
        transfer.stop()  # stops `it` first, then the copy thread
    it.stop()


def _add_transfer_stats(done: Dict[str, float], live: Dict[str, Any]) -> Dict[str, float]:
    """Finished epochs' transfer counters plus the live epoch's."""
    out = {}
    for k in ("copies", "bytes", "copy_seconds", "wait_seconds"):
        out[k] = done.get(k, 0) + live.get(k, 0)
    out["copy_gbps"] = out["bytes"] / out["copy_seconds"] / 1e9 if out["copy_seconds"] else 0.0
    return out


class _LoaderIter(Iterator[Dict[str, torch.Tensor]]):
    """One epoch of a Loader. Closing it (or dropping it) stops its threads."""

    def __init__(self, loader: Loader, epoch: int, first: int, started=None):
        self._loader = loader
        self._epoch = epoch
        self._yielded = first
        self._end = len(loader)
        self._pid = os.getpid()
        self._done = False
        self._counted = False  # this epoch's counters moved into the loader's (close())
        self._t0 = time.perf_counter()
        # `started`: this epoch's threads, already running (NOTE [ Next-epoch prefetch ])
        self._it, self._transfer = started or loader._start_threads(epoch, first)
        self._device = loader.device if loader.device.type == "cuda" else None
        _live_iterators.add(self)

    def __iter__(self) -> "_LoaderIter":
        return self

    def __len__(self) -> int:
        return self._end - self._yielded

    def __next__(self) -> Dict[str, torch.Tensor]:
        if self._done:
            raise StopIteration
        if os.getpid() != self._pid:
            raise RuntimeError("this loader iterator was started in another process (before "
                               "os.fork()); create a new Loader in this process")
        try:
            if self._transfer is None:
                caps = self._it.next()
            elif self._device is not None:
                # The batch belongs to the stream current now (docs/gpu.md).
                caps = self._transfer.next(torch.cuda.current_stream(self._device).cuda_stream)
            else:
                caps = self._transfer.next(0)
        except BaseException:
            self.close()
            raise
        if caps is None:
            self.close()
            self._loader._report_skipped()
            raise StopIteration
        self._yielded += 1
        self._record_state()
        batch = {name: torch.from_dlpack(cap) for name, cap in caps}
        self._loader._after_yield(self)
        return batch

    def _record_state(self) -> None:
        loader = self._loader
        if loader._last is not None and loader._last() is self:
            loader._last_state = (self._epoch, self._yielded, self._yielded >= self._end)

    def _elapsed(self) -> float:
        """Seconds since this epoch started."""
        return time.perf_counter() - self._t0

    def _live_seconds(self) -> float:
        """Run time not yet in the loader's totals (call with the loader's lock)."""
        return 0.0 if self._counted else self._elapsed()

    def _queue_depth(self) -> int:
        return 0 if self._done else self._it.ready_batches

    def _live_workers(self) -> int:
        return 0 if self._done else self._it.live_workers

    def _transfer_stats(self) -> Optional[Dict[str, float]]:
        """Transfer counters not yet in the loader's totals (call with the loader's lock)."""
        if self._transfer is None or self._counted:
            return None
        return self._transfer.stats()

    def close(self) -> None:
        """Stops the worker threads; batches already yielded stay valid."""
        if self._done:
            return
        self._done = True
        if os.getpid() != self._pid:
            return  # forked child: the threads live in the parent
        loader = self._loader
        _stop_threads(self._it, self._transfer)
        with loader._lock:  # moves this epoch's counters into the loader's totals, at once
            if self._transfer is not None:
                loader._transfer_totals = _add_transfer_stats(loader._transfer_totals,
                                                              self._transfer.stats())
            loader._run_seconds += self._elapsed()
            self._counted = True

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
