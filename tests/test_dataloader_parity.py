"""Drop-in for DataLoader: the same batches as ``torch.utils.data.DataLoader`` for the same
dataset and arguments, compared batch by batch (structure, types, dtypes, shapes,
values) over a corpus of datasets of every type default_collate handles."""

import collections
from collections import OrderedDict

import numpy as np
import pytest
import stoker
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

Point = collections.namedtuple("Point", "x y")


def same(a, b, where="batch"):
    """Asserts that `a` (stoker's) is `b` (DataLoader's): the same structure and types,
    tensors of the same dtype, shape and values."""
    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor), (where, type(a))
        assert a.dtype == b.dtype, (where, a.dtype, b.dtype)
        assert a.shape == b.shape, (where, a.shape, b.shape)
        assert torch.equal(a, b), where
        return
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(b, dict):
        assert list(a.keys()) == list(b.keys()), (where, list(a), list(b))
        for k in b:
            same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(b, (list, tuple)):
        assert len(a) == len(b), (where, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


class Items(Dataset):
    """A dataset whose item i is make(i)."""

    def __init__(self, n, make):
        self.n, self.make = n, make

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.make(i)


class Batched(Items):
    """A dataset with __getitems__ (as HF datasets have): DataLoader calls it per batch."""

    def __getitems__(self, indices):
        return [self.make(i) for i in indices]


def _rng(i):
    return np.random.default_rng(i)


CORPUS = {
    "tensor_dataset": TensorDataset(torch.randn(13, 3, 4), torch.arange(13)),
    "tuple_numpy": Items(13, lambda i: (_rng(i).random((2, 3)).astype(np.float32), i)),
    "list": Items(13, lambda i: [torch.full((2,), i), i * 0.5, f"s{i}"]),
    "namedtuple": Items(13, lambda i: Point(torch.tensor([i, i]), np.int16(i))),
    "bare_tensor": Items(13, lambda i: torch.arange(4) * i),
    "bare_number": Items(13, lambda i: i * 1.5),
    "bare_int": Items(13, lambda i: i),
    "bare_string": Items(13, lambda i: f"item {i}"),
    "bytes": Items(13, lambda i: {"raw": bytes([i, i + 1]), "y": i}),
    "dict": Items(13, lambda i: {"x": torch.randn(2, 2, generator=torch.Generator().manual_seed(i)),
                                  "label": i, "w": 0.25 * i,
                                  "flag": i % 2 == 0}),
    "ordered_dict": Items(13, lambda i: OrderedDict(b=i, a=torch.tensor(float(i)))),
    "nested": Items(13, lambda i: {"img": torch.arange(6).view(2, 3) + i,
                                   "meta": {"id": i, "name": str(i),
                                            "p": Point(i, [i, 2.0])},
                                   "pair": (np.float64(i), np.arange(3, dtype=np.uint8))}),
    "views": Items(13, lambda i: {"chw": torch.arange(24, dtype=torch.uint8).view(2, 3, 4)
                                  .permute(2, 0, 1) + i,       # pil_to_tensor's layout
                                  "strided": np.arange(20.0)[::2] + i,
                                  "t": torch.arange(6).view(2, 3).t()}),
    "numpy_scalars": Items(13, lambda i: (np.float32(i), np.int8(i), np.bool_(i % 2),
                                          np.array(i, dtype=np.int32))),
    "bf16_complex": Items(13, lambda i: (torch.full((2,), i, dtype=torch.bfloat16),
                                         torch.full((2,), i, dtype=torch.complex64))),
    "getitems": Batched(13, lambda i: {"x": torch.full((3,), float(i)), "i": i}),
    "list_of_tensors": Items(13, lambda i: {"boxes": [torch.ones(4) * i, torch.zeros(4)]}),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
@pytest.mark.parametrize("batch_size, drop_last", [(4, False), (4, True), (1, False)])
def test_the_same_batches_as_dataloader(name, batch_size, drop_last):
    ds = CORPUS[name]
    want = list(DataLoader(ds, batch_size=batch_size, drop_last=drop_last))
    got = list(stoker.Loader(ds, batch_size=batch_size, drop_last=drop_last, num_threads=2))
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        same(a, b, f"{name} batch {k}")


@pytest.mark.parametrize("name", ["dict", "nested", "tuple_numpy", "bare_tensor"])
def test_the_same_batches_with_process_workers(name):
    ds = CORPUS[name]
    want = list(DataLoader(ds, batch_size=4))
    got = list(stoker.Loader(ds, batch_size=4, num_threads=2, python_workers="process"))
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        same(a, b, f"{name} batch {k}")


@pytest.mark.parametrize("name", ["dict", "nested", "tuple_numpy", "bare_number", "views"])
def test_unbatched_as_dataloader(name):
    """batch_size=None: each sample as default_convert makes it, as DataLoader does."""
    ds = CORPUS[name]
    want = list(DataLoader(ds, batch_size=None))
    got = list(stoker.Loader(ds, batch_size=None, num_threads=2))
    assert len(got) == len(want) == len(ds)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        same(a, b, f"{name} sample {k}")


def test_for_x_y_in_loader():
    ds = CORPUS["tensor_dataset"]
    seen = 0
    for x, y in stoker.Loader(ds, batch_size=5):
        assert x.shape[1:] == (3, 4) and y.dtype == torch.int64
        seen += len(y)
    assert seen == len(ds)


# more workers than this machine may have cores: DataLoader's warning, not this test's
@pytest.mark.filterwarnings("ignore:.*excessive worker creation:UserWarning")
def test_a_varying_first_dimension_is_padded_in_a_dict():
    """A dict value whose first dimension varies within a batch is padded in that batch,
    with its lengths (DataLoader would fail to stack it); a batch where it does not vary
    is stacked as DataLoader stacks it. Each batch depends on its own samples only."""
    ds = Items(12, lambda i: {"boxes": np.ones((1 + (4 <= i < 8) * i, 4), np.float32) * i,
                              "label": i})
    for threads in (1, 2, 3):
        batches = list(stoker.Loader(ds, batch_size=4, num_workers=threads))
        assert len(batches) == 3
        for k in (0, 2):
            assert batches[k]["boxes"].shape == (4, 1, 4) and "boxes_lengths" not in batches[k]
        b = batches[1]
        assert b["boxes"].shape == (4, 8, 4)
        assert b["boxes_lengths"].tolist() == [5, 6, 7, 8]
        for j, n in enumerate([5, 6, 7, 8]):
            assert torch.equal(b["boxes"][j, :n], torch.full((n, 4), 4.0 + j))
            assert not b["boxes"][j, n:].any()


def test_a_varying_shape_inside_a_tuple_is_an_error_naming_it():
    ds = Items(8, lambda i: (np.zeros((1 + i, 2)), i))
    with pytest.raises(ValueError, match=r"\[0\].*shape|shape.*\[0\]|field 0 has shape"):
        list(stoker.Loader(ds, batch_size=4))


def test_names_still_give_a_dict():
    ds = CORPUS["tensor_dataset"]
    batch = next(iter(stoker.Loader(ds, batch_size=4, names=("x", "y"))))
    assert list(batch) == ["x", "y"] and batch["x"].shape == (4, 3, 4)


def test_subscripted_in_annotations_as_dataloader():
    """DataLoader is generic: ``DataLoader[List[Tensor]]`` in an annotation is valid, and so
    is ``Loader[...]`` (where a Loader stands in for DataLoader)."""
    from typing import List

    alias = stoker.Loader[List[torch.Tensor]]
    assert alias.__origin__ is stoker.Loader and alias.__args__ == (List[torch.Tensor],)

    def make(train: bool) -> stoker.Loader[List[torch.Tensor]]:
        return stoker.Loader(CORPUS["bare_tensor"], batch_size=4)

    assert isinstance(make(True), stoker.Loader)


def test_what_the_loader_reads_is_fixed_after_init_as_dataloader():
    """DataLoader refuses to set batch_size, sampler, batch_sampler, drop_last, dataset and
    persistent_workers after __init__ (ValueError); so does a Loader, whose plan and C++
    order were made from them. Its other attributes stay settable."""
    ds = CORPUS["bare_int"]
    for cls in (DataLoader, stoker.Loader):
        loader = cls(ds, batch_size=4)
        for attr in ("batch_size", "sampler", "batch_sampler", "drop_last", "dataset",
                     "persistent_workers"):
            with pytest.raises(ValueError, match=f"{attr} attribute should not be set after"):
                setattr(loader, attr, {})
        loader.worker_init_fn = None
    loader = stoker.Loader(ds, batch_size=4)
    assert [b.tolist() for b in loader][0] == [0, 1, 2, 3] and loader.batch_size == 4


def test_nested_tensors_need_a_collate_fn_as_with_dataloader():
    """default_collate refuses a batch of nested tensors with a RuntimeError saying to give
    a collate_fn; so does native batching, and with one they load."""
    ds = [torch.nested.nested_tensor([torch.full((3,), float(i))], layout=torch.jagged)
          for i in range(4)]
    words = "not currently supported by the default collate_fn"
    with pytest.raises(RuntimeError, match=words):
        next(iter(DataLoader(ds, batch_size=1)))
    with pytest.raises(RuntimeError, match=words):
        next(iter(stoker.Loader(ds, batch_size=1, num_workers=1)))
    got = list(stoker.Loader(ds, batch_size=1, num_workers=1, collate_fn=_clone))
    assert all(torch.equal(b[0].values(), ds[i].values()) for i, b in enumerate(got))


def _clone(batch):
    return [x.clone() for x in batch]


class _Holder:  # a namedtuple class reached through another class: pickle cannot find it
    Pair = collections.namedtuple("Pair", "x noise")


class _Drawing(Dataset):
    """Draws from torch's global generator and returns such a namedtuple (as PyTorch's
    NamedTupleDataset does)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return _Holder.Pair(i, torch.randn(3))


def test_samples_that_draw_and_cannot_be_pickled_stay_on_threads():
    """DataLoader with num_workers=0 never pickles a sample. python_workers='auto' moves
    a __getitem__ that draws from the global generators to worker processes, unless its
    samples cannot be pickled: then it stays on threads, and says what that costs."""
    import pickle

    with pytest.raises(pickle.PicklingError):
        pickle.dumps(_Holder.Pair(0, 1))
    want = [b.x.tolist() for b in DataLoader(_Drawing(), batch_size=2)]
    with pytest.warns(RuntimeWarning, match="cannot be pickled"):
        got = list(stoker.Loader(_Drawing(), batch_size=2, num_threads=2))
    assert all(isinstance(b, _Holder.Pair) and b.noise.shape == (2, 3) for b in got)
    assert [b.x.tolist() for b in got] == want
    # DataLoader's num_workers=2 means worker processes, which must send the sample back
    # (DataLoader's own workers then hang on the pickling error; stoker says it)
    with pytest.raises(TypeError, match="cannot leave the worker process"):
        list(stoker.Loader(_Drawing(), batch_size=2, num_workers=2))


class _DrawingTuples(_Drawing):
    def __getitem__(self, i):
        return (i, torch.randn(3))


def test_samples_that_draw_and_can_be_pickled_go_to_processes():
    loader = stoker.Loader(_DrawingTuples(), batch_size=2, num_threads=2)
    for _ in range(2):  # the second epoch on the processes the first one switched to
        assert [b[0].tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert loader._stage.processes
    loader.close()
