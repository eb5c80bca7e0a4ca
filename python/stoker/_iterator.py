"""One epoch of a Loader: :class:`LoaderIter`, what ``iter(loader)`` returns. It takes
batches from the C++ core (or the Python stage) and hands them to the loop as tensors
(DLPack, no copy)."""

from __future__ import annotations

import os
import threading
import time
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from ._stage.processes import WorkerDied
from ._stage.stage import END

__all__ = ["LoaderIter"]

# A DLPack capsule as a tensor: torch.from_dlpack's own path for a capsule, without the
# checks for objects with __dlpack__ (a few microseconds per tensor at every batch).
_tensor_from_capsule = getattr(torch._C, "_from_dlpack", None) or torch.from_dlpack


class _WorkerHandle:
    """A stage thread as DataLoader's ``_workers`` lists a worker process."""

    def __init__(self, thread: threading.Thread):
        self._thread = thread

    def join(self, timeout: Optional[float] = None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def exitcode(self) -> Optional[int]:
        return None if self._thread.is_alive() else 0

    def terminate(self) -> None:
        """Nothing: a stage thread ends when its iterator or loader closes."""


# NOTE [ After a failed batch ]
# A batch that fails (a corrupt record with on_error="raise", the user's exception in
# map, batch_map or __getitem__) raises at its place in the order and is consumed:
# state_dict() counts it, and next() on the same iterator goes on with the batch after
# it, as DataLoader's iterator does (a loop that catches the error and goes on loses that
# batch only, never the rest of the epoch in silence). An error that leaves nothing behind
# it (the device's) comes again at every call; a worker process that died ends the
# iterator (DataLoader's ends too: its workers are gone). A loop that leaves on the error
# and starts a new iterator starts the next epoch, as after a break: Loader.__iter__
# closes the failed iterator (the exception's traceback may keep it alive).
class LoaderIter(Iterator[Dict[str, torch.Tensor]]):
    """One epoch of a Loader. Closing it (or dropping it) stops its threads."""

    def __init__(self, loader: Any, it: Any, world: Tuple[int, int]):
        self._loader = loader
        self._it = it
        self._world = world
        self._follow_dist = loader._rank is None or loader._world_size is None
        self._pid = os.getpid()
        self._stream_device = loader._stream_device
        self._hf_lengths = loader._hf_lengths
        self._nchw_views = loader._nchw_views
        self._timeout = loader.timeout
        self._unbatched = loader.plan.sampling.unbatched
        self._as_tuple = loader.plan.delivery.as_tuple
        self._len_reported = loader._iterable_len  # as len() said when this iterator began
        self._yielded = 0

    def __iter__(self) -> "LoaderIter":
        return self

    def __len__(self) -> int:
        return self._it.remaining

    def __next__(self) -> Dict[str, torch.Tensor]:
        try:
            return self._next()
        except StopIteration:
            raise
        except BaseException as e:
            # NOTE [ After a failed batch ]: this iterator goes on with the next batch if
            # it is asked (DataLoader's behaviour); a new iterator of the loader closes it.
            # A worker process that died ends it (as it ends DataLoader's).
            if isinstance(e, WorkerDied):
                self.close()
            else:
                self._loader._failed_iter = weakref.ref(self)
            raise

    def _next(self) -> Dict[str, torch.Tensor]:
        entered = time.perf_counter_ns()
        if os.getpid() != self._pid:
            raise RuntimeError("this loader iterator was started in another process (before "
                               "os.fork()); create a new Loader in this process")
        if self._follow_dist and self._it.claimed:
            now = self._loader._world()
            if now != self._world:
                self.close()
                raise RuntimeError(
                    f"the distributed world changed while an epoch was running (rank, "
                    f"world_size) {self._world} -> {now}; start a new iterator")
        # The batch belongs to the stream current now (docs/gpu.md).
        stream = None if self._stream_device is None else \
            torch.cuda.current_stream(self._stream_device).cuda_stream
        stage = self._loader._stage
        if stage is not None:  # NOTE [ Python stage ] in stoker/_stage/__init__.py
            batch = stage.next(self._it, stream, entered, self._timeout, self._loader._core)
            if batch is END:
                self._loader._report_skipped()
                raise StopIteration
            stage.follow(self._loader._core.active_threads)
            if self._len_reported is not None:
                self._yielded += 1
                if self._yielded > self._len_reported:
                    self._warn_past_len()
            return self._in_order(batch) if self._as_tuple else batch
        calling = time.perf_counter_ns()
        caps = self._it.next(stream or 0) if self._timeout <= 0 else self._timed(stream or 0)
        if caps is None:
            self._loader._report_skipped()
            raise StopIteration
        t0 = time.perf_counter_ns()
        batch = {name: _tensor_from_capsule(cap) for name, cap in caps}
        # Images decoded HWC (libjpeg-turbo's interleaved RGB) reach the loop in
        # PyTorch's NCHW shape: the same memory, with channels_last strides.
        for name in self._nchw_views:
            batch[name] = batch[name].permute(0, 3, 1, 2)
        if self._unbatched:  # batch_size=None: the sample alone, as DataLoader's
            batch = {name: t[0] for name, t in batch.items()}
        if self._hf_lengths:
            batch["max_length_q"] = batch["max_length_k"] = batch.pop("max_length").shape[0]
        # The loop's time in next() outside the C++ next(): counted with its wait.
        self._it.note_handoff(calling - entered + time.perf_counter_ns() - t0)
        return self._in_order(batch) if self._as_tuple else batch

    def _in_order(self, batch: Any) -> Any:
        """A dataset's as_tuple: the batch as default_collate batches tuple items (a list
        in that order; the sample's tuple itself with batch_size=None)."""
        if not isinstance(batch, dict):
            return batch  # batch_map gave something else: the user's
        missing = [n for n in self._as_tuple if n not in batch]
        if missing:
            raise KeyError(f"the dataset's as_tuple names {missing}, which the batch lacks "
                           f"(its keys: {list(batch)}): map or batch_map dropped them")
        values = [batch[n] for n in self._as_tuple]
        return tuple(values) if self._unbatched else values

    def _warn_past_len(self) -> None:
        """DataLoader's warning, in its words: an IterableDataset yields more batches than
        len(loader) said (its __len__ is wrong, or each worker yields the whole dataset)."""
        loader = self._loader
        msg = (f"Length of IterableDataset {loader.dataset} was reported to be "
               f"{self._len_reported} (when accessing len(dataloader)), but {self._yielded} "
               "samples have been fetched. ")
        if loader.num_workers > 0:
            msg += ("For multiprocessing data-loading, this could be caused by not properly "
                    "configuring the IterableDataset replica at each worker (stoker: each "
                    "worker thread iterates the dataset, sharded by get_worker_info()). Please "
                    "see https://pytorch.org/docs/stable/data.html#torch.utils.data."
                    "IterableDataset for examples.")
        warnings.warn(msg, UserWarning, stacklevel=3)

    def _timed(self, stream: int) -> Any:
        """The core's next batch within DataLoader's timeout, else an error."""
        got = self._it.next(stream, timeout_ms=int(self._timeout * 1000))
        if got is False:
            raise RuntimeError(f"DataLoader timed out after {self._timeout:g} seconds (stoker: "
                               f"no batch came within timeout={self._timeout:g} seconds)")
        return got

    @property
    def epoch(self) -> int:
        return self._it.epoch

    @property
    def _workers(self) -> List["_WorkerHandle"]:
        """DataLoader's name (its tests join them): the threads of the Python stage that
        run the user's code, each with multiprocessing.Process's join/is_alive/exitcode.
        With python_workers="process" these are the threads that drive the processes; the
        C++ core's threads are not listed."""
        threads = getattr(self._it, "workers", None)  # an IterableDataset's epoch
        if threads is None:
            stage = self._loader._stage
            pool = getattr(stage, "pool", None)
            threads = list(getattr(pool, "_threads", None) or [])
        return [_WorkerHandle(t) for t in threads if t is not None]

    def close(self) -> None:
        """Stops this iterator's threads; batches already yielded stay valid."""
        if os.getpid() == self._pid:
            self._it.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
