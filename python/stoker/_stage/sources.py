"""Where the Python stage's samples come from: a stoker dataset through the C++ path
(read, verify, decode, the loader's image ops; the GIL released), or any map-style
dataset's ``__getitem__``."""

from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .. import _core
from .._media_fields import Video
from ..fields import Blob, Image, NDArray, Scalar, Tokens
from .telemetry import native_times

__all__ = ["normalize_item", "MapStyleSource", "DatasetSource", "tuple_item",
           "hwc_images"]



def normalize_item(item: Any, names: Optional[Sequence[Hashable]], where: Any) -> Any:
    """A map-style dataset's item as the stage batches it: as it is (batched in
    default_collate's structure), or with `names` a dict: a tuple or list's values under
    those names, any other value (a tensor, an array, a number) under ``names[0]``.
    `where` names the item in errors (a str, or a callable making it)."""
    if names is None:
        return item
    if callable(where):
        where = where()
    if isinstance(item, Mapping):
        if names is not None:
            raise TypeError(f"{where}: names= applies to datasets whose items are tuples or "
                            "single values; this item is a dict (its keys are the names)")
        return item if isinstance(item, dict) else dict(item)
    values = list(item) if isinstance(item, (tuple, list)) else [item]
    if len(names) != len(values):
        raise ValueError(f"{where}: the item has {len(values)} value(s) but names= gives "
                         f"{len(names)} ({', '.join(map(repr, names))})")
    return dict(zip(names, values))


class MapStyleSource:
    """Samples of any object with ``__len__`` and ``__getitem__`` (a
    ``torch.utils.data.Dataset``): ``obj[j]`` on the stage's threads."""

    def __init__(self, obj: Any, names: Optional[Sequence[Hashable]] = None):
        self.obj = obj
        self.names = None if names is None else list(names)
        # epoch -> a user sampler's items where they are not indices (the order holds
        # their positions: stoker/_samplers.py); None: indices
        self.keys: Optional[Dict[int, List[Any]]] = None
        if self.names is not None and len(set(self.names)) != len(self.names):
            raise ValueError(f"names= has repeated names: {self.names}")

    def __len__(self) -> int:
        return len(self.obj)

    def describe(self, index: int) -> str:
        if self.keys is not None:
            return f"the sampler's item {index} of its epoch"
        return f"dataset index {index}"

    def _key(self, index: int, epoch: int) -> Any:
        return index if self.keys is None else self.keys[epoch][index]

    def raw(self, index: int, epoch: int) -> Any:
        """The item as the dataset returns it (what collate_fn receives without map)."""
        return self.obj[self._key(index, epoch)]

    def sample(self, index: int, epoch: int) -> Dict:
        return normalize_item(self.obj[self._key(index, epoch)], self.names,
                              lambda: self.describe(index))


class DatasetSource:
    """Samples of a stoker dataset for the stage, fetched by the C++ path
    (``_core.SampleFetcher``: read, verify, decode, the loader's image ops with the
    loader's draws) with the GIL released: what ``map`` receives."""

    def __init__(self, dataset: Any, options: Any):
        self.dataset = dataset
        self._options = options  # _core.RecordOptions: images, transforms, the seed
        self._fetcher = _core.SampleFetcher(dataset._core, options)
        finish: List[Tuple[str, Callable[[Any], Any]]] = []
        # a transform group's array masks come at their transformed size
        grouped = {n for t in options.transforms if len(t.fields) > 1 for n in t.fields}
        for name, f in dataset.fields.items():
            if isinstance(f, Scalar):
                finish.append((name, _first))
            elif isinstance(f, NDArray) and len(f.shape) != 1 and \
                    not (name in grouped and not f.variable):
                finish.append((name, _reshaper(tuple(-1 if d is None else d for d in f.shape))))
            elif isinstance(f, Image):
                finish.append((name, _same))
            else:  # 1-D arrays, tokens, blobs (bytes); a video's frames, audio's samples
                finish.append((name, _same))
        # after the fields: each video's frame times (SampleFetcher::outputs)
        finish += [(name + "_pts", _same) for name, f in dataset.fields.items()
                   if isinstance(f, Video)]
        self._finish = finish
        # a dataset with as_tuple: what collate_fn receives is its tuple (tuple_item)
        self._names = getattr(dataset, "as_tuple", None)
        self._hwc = tuple(n for n, spec in options.images.items() if spec.layout == "HWC")
        # A stored variable-length field or blob that map passes on is batched as the
        # loader batches it without map: padded, with "<name>_lengths".
        self.default_layout: Dict[str, Any] = {}
        for name, f in dataset.fields.items():
            if isinstance(f, NDArray) and f.variable:
                self.default_layout[name] = f
            elif isinstance(f, Tokens):
                self.default_layout[name] = NDArray(f.dtype, (None,))
            elif isinstance(f, Blob):
                self.default_layout[name] = f

    def reopened(self) -> "DatasetSource":
        """The same source over the dataset opened again (a worker process's own)."""
        import copy
        import pickle

        other = copy.copy(self)
        other.dataset = pickle.loads(pickle.dumps(self.dataset))  # by path and identity
        other._fetcher = _core.SampleFetcher(other.dataset._core, self._options)
        return other

    def __len__(self) -> int:
        return len(self.dataset)

    def describe(self, index: int) -> str:
        shard, record = self.dataset._core.locate(index)
        return f"sample {index} ({self.dataset._core.shard_path(shard)}: record {record})"

    def sample(self, index: int, epoch: int) -> Dict:
        if self.dataset._core.deferred:
            # A remote dataset: the stage's threads are not the loader's workers, which
            # wait for a shard in C++; the shard is made local and kept while it is read,
            # as ds[i] does (NOTE [ Deferred shards ] in csrc/format/shard_gate.h).
            with self.dataset.remote.holding([self.dataset._core.locate(index)[0]]):
                values, read_ns, decode_ns, ops_ns, nbytes = self._fetcher.fetch(index, epoch)
        else:
            values, read_ns, decode_ns, ops_ns, nbytes = self._fetcher.fetch(index, epoch)
        t = native_times
        t.read_ns += read_ns
        t.decode_ns += decode_ns
        t.ops_ns += ops_ns
        t.native_ns += read_ns + decode_ns + ops_ns
        t.bytes += nbytes
        return {name: fin(v) for (name, fin), v in zip(self._finish, values)}

    def raw(self, index: int, epoch: int) -> Any:
        """What collate_fn receives without map: the sample, or the dataset's as_tuple item
        (a torch Dataset's tuple)."""
        sample = self.sample(index, epoch)
        return sample if self._names is None else tuple_item(sample, self._names, self._hwc)


def tuple_item(sample: Mapping[str, Any], names: Sequence[str],
               hwc: Sequence[str]) -> Tuple[Any, ...]:
    """A stoker sample (``ds.sample``'s dict) as a torch Dataset's item: the fields named
    by ``as_tuple``, in that order; an image decoded HWC (the fields `hwc`) as a uint8
    ``[C, H, W]`` tensor (a view, as ``pil_to_tensor`` gives), arrays as tensors, a
    scalar as a 0-d tensor (TensorDataset's), blobs as bytes."""
    import torch

    out = []
    for name in names:
        v = sample[name]
        if isinstance(v, (np.ndarray, np.generic)):
            t = torch.from_numpy(np.asarray(v))
            out.append(t.permute(2, 0, 1) if name in hwc and t.dim() == 3 else t)
        else:
            out.append(v)
    return tuple(out)


def hwc_images(fields: Mapping[str, Any]) -> Tuple[str, ...]:
    """The image fields decoded HWC by default (the stored layout)."""
    return tuple(n for n, f in fields.items() if isinstance(f, Image) and f.layout == "HWC")


def _first(a: np.ndarray) -> Any:
    return a[0]


def _same(a: Any) -> Any:
    return a


def _reshaper(shape: Tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    return lambda a: a.reshape(shape)
