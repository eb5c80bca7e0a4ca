"""What ``stoker.Loader`` does with token data, until the loader core runs BatchProducers.

``token_loader()`` returns ``stoker.Loader`` when it takes ``seq_len`` (the core that
delegates batches to ``_core.TokenProducer`` has landed), else :class:`ShimLoader`: the
same arguments and behaviour (``len``, ``set_epoch``, iteration, ``state_dict`` /
``load_state_dict``, ``stats()["pad_fraction"]``) built on
``stoker.token_dataset._make_producer``, one batch at a time in this thread. Tests and
recipes written against it run unchanged on the real loader; the shim is also the
specification of the glue the loader needs.
"""

import inspect

import stoker
import torch
from stoker import token_dataset as td

_TOKEN_ARGS = ("seq_len", "packing", "token_dtype", "max_tokens", "stride", "pad_id",
               "ignore_index", "pack_fit", "pack_window", "overlong", "max_length",
               "pad_to_multiple_of", "attention_mask", "field")


def loader_has_tokens() -> bool:
    return "seq_len" in inspect.signature(stoker.Loader).parameters


def token_loader():
    return stoker.Loader if loader_has_tokens() else ShimLoader


class ShimLoader:
    def __init__(self, dataset, batch_size=None, shuffle=False, seed=0, drop_last=False,
                 num_threads=None, prefetch=None, rank=None, world_size=None, **token_kwargs):
        unknown = set(token_kwargs) - set(_TOKEN_ARGS)
        if unknown:
            raise TypeError(f"unexpected arguments {sorted(unknown)}")
        self.rank = 0 if rank is None else rank
        self.world_size = 1 if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside [0, world_size={self.world_size})")
        self.producer = td._make_producer(dataset, batch_size=batch_size, shuffle=shuffle,
                                          seed=seed, drop_last=drop_last, **token_kwargs)
        self.epoch = 0
        self._next_epoch = 0
        self._offset = 0       # resume point of the next iteration (global samples)
        self._yielded = 0      # batches yielded by the running iteration
        self._start = 0        # offset the running iteration started from
        self._running = None   # epoch of the running iteration

    def __len__(self):
        return self.producer.num_batches(self.rank, self.world_size)

    def set_epoch(self, epoch):
        self._next_epoch = epoch
        self._offset = 0

    @property
    def sampler(self):
        return self

    def __iter__(self):
        epoch, offset = self._next_epoch, self._offset
        plan = self.producer.plan_epoch(epoch, self.rank, self.world_size, offset)
        self.epoch, self._running, self._start, self._yielded = epoch, epoch, offset, 0
        # as the loader: the next iter() runs the epoch after the last started
        self._next_epoch, self._offset = epoch + 1, 0
        for k in range(plan.num_batches):
            batch = self.producer.batch(plan, k)
            self._yielded = k + 1
            yield {name: torch.from_numpy(v) for name, v in batch.items()}
        self._running = None

    def state_dict(self):
        if self._running is None:
            return {"epoch": self._next_epoch, "offset": self._offset}
        return {"epoch": self._running,
                "offset": self.producer.consumed_after(self._running, self.rank, self.world_size,
                                                       self._start, self._yielded)}

    def load_state_dict(self, state):
        self._next_epoch, self._offset = int(state["epoch"]), int(state["offset"])

    def stats(self):
        return {"pad_fraction": self.producer.pad_fraction,
                "unused_tokens": self.producer.unused_tokens}
