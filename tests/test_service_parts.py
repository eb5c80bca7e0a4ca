"""What stoker.RayService is built on, without Ray (NOTE [ Disaggregated loading ] in
stoker/service/__init__.py): a replica's run_part gives the local loader's batches for
every kind of pipeline, a loader over placeholders with a service keeps the local loader's
epochs, skip, resume and state_dict, batches cross the wire with their shapes, strides and
dtypes, and service= is checked by the plan. tests/test_service.py runs the same on Ray."""

import collections
import pickle
import sys

import numpy as np
import pytest
import stoker
import torch
from conftest import corrupt_record, write_dataset
from stoker import example_data
from stoker.service import Service
from stoker.service.base import Delivery
from stoker.service.wire import decode, encode

TRANSFORMS = {"image": [stoker.ops.RandomResizedCrop(24), stoker.ops.RandomHorizontalFlip(),
                        stoker.ops.ColorJitter(0.4, 0.4)]}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    path = tmp_path_factory.mktemp("svc") / "images"
    example_data.write("images", str(path))
    return stoker.Dataset(path)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    path = tmp_path_factory.mktemp("svc") / "tokens"
    example_data.write("tokens", str(path))
    return stoker.Dataset(path)


def noisy(sample, rng):
    """A map that draws from its generator and changes the sample's shape."""
    return {"image": sample["image"][::2], "noise": rng.standard_normal(3).astype(np.float32),
            "label": sample["label"]}


class Items(torch.utils.data.Dataset):
    """A map-style dataset whose items hold a tensor, an int and a string."""

    def __len__(self):
        return 37

    def __getitem__(self, i):
        return {"x": torch.arange(3.0) * i, "i": i, "name": f"item-{i}"}


def pipelines(images, tokens):
    return {
        "images": lambda **kw: stoker.Loader(images, batch_size=5, shuffle=True, seed=3,
                                             transforms=TRANSFORMS, num_threads=2, **kw),
        "map": lambda **kw: stoker.Loader(images, batch_size=5, shuffle=True, seed=3,
                                          transforms=TRANSFORMS, map=noisy, num_threads=2,
                                          **kw),
        "tokens": lambda **kw: stoker.Loader(tokens, batch_size=8, seq_len=32, shuffle=True,
                                             seed=1, **kw),
        "packed": lambda **kw: stoker.Loader(tokens, batch_size=8, seq_len=64,
                                             packing="document", shuffle=True, seed=1, **kw),
        "map-style": lambda **kw: stoker.Loader(Items(), batch_size=4, shuffle=True, seed=1,
                                                **kw),
    }


def same(a, b):
    """Equal batches: the same structure, tensors equal in dtype, shape, strides, values."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape \
            and a.stride() == b.stride() and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


def same_batches(got, want):
    return len(got) == len(want) and all(map(same, got, want))


# -- parts: any batch of any segment, made by another loader ------------------------------

@pytest.mark.parametrize("kind", ["images", "map", "tokens", "packed", "map-style"])
def test_a_replica_makes_any_part_of_any_segment(images, tokens, kind):
    make = pipelines(images, tokens)[kind]
    replica = make(rank=0, world_size=1)
    for world, resumed in ((1, False), (3, False), (3, True)):
        for rank in range(world):
            local = make(rank=rank, world_size=world)
            local.set_epoch(2)
            if resumed:  # a state of 2 ranks, resumed on 3: padding restarts at position 12
                local.load_state_dict({**local.state_dict(), "epoch": 2, "position": 12,
                                       "world_size": 2})
            it = iter(local)
            want = list(it)
            key = it._it.key
            assert key[:3] == (2, rank, world) and key[3:] == ((12, 12) if resumed else (0, 0))
            n = len(want)
            for first, count in {(0, n), (1, 2), (n - 1, 1), (n // 2, n - n // 2)}:
                replica._rank, replica._world_size = rank, world
                replica._core.run_part(key, first, count)
                got = list(replica)
                assert same_batches(got, want[first:first + count]), (kind, key, first)


def test_a_part_outside_its_segment_is_refused(images):
    loader = stoker.Loader(images, batch_size=5)
    with pytest.raises(ValueError, match="outside the segment"):
        loader._core.run_part((0, 0, 1, 0, 0), 9, 2)
    with pytest.raises(ValueError, match="rank 2 outside"):
        loader._core.run_part((0, 2, 2, 0, 0), 0, 1)


# -- a loader with a service: the local loader's epochs and state ------------------------

class LocalService(Service):
    """A service whose one producer is a replica in this process: each batch is made
    alone by run_part and crosses a pickle, as batches cross Ray's store."""

    threads_per_producer = 1
    producers = 1

    def __init__(self):
        self.made = collections.Counter()  # (key, batch) -> times made

    def _fetcher(self, spec, window):
        return LocalFetcher(self, spec)


class LocalFetcher:
    part = 1

    def __init__(self, service, spec):
        self.service, self.spec, self.window = service, spec, 1
        self.replicas = {}  # variant -> a replica, as an actor keeps them

    def open(self, key, first, total, variant=None):
        replica = self.replicas.get(repr(variant))
        if replica is None:
            replica = stoker.Loader(self.spec.dataset, **self.spec.arguments)
            if variant:
                replica._mix.load(variant["mix"])
            self.replicas[repr(variant)] = replica
        return LocalSegment(self, key, replica)


class LocalSegment:
    def __init__(self, f, key, replica):
        self.f, self.key, self.replica = f, key, replica

    def take(self, j, deadline):
        r = self.replica
        r._rank, r._world_size = self.key[1], self.key[2]
        r._core.run_part(self.key, j, 1)
        self.f.service.made[self.key, j] += 1
        try:
            batch = next(iter(r))
        except stoker.Error as e:
            return Delivery(j, 0, e, None, 0.0, 0.0)
        wire = pickle.loads(pickle.dumps(encode(batch), protocol=5))
        return Delivery(j, len(batch["label"]), None, wire, 0.0, 0.0)

    def close(self):
        pass


def test_a_service_loader_keeps_the_local_epochs_and_state(images):
    svc = LocalService()
    make = pipelines(images, None)["images"]
    local, remote = make(), make(service=svc)
    assert "service: LocalService" in str(remote.plan)
    assert len(remote) == len(local) == 10
    for loader in (local, remote):
        loader.set_epoch(4)
    # an epoch, step by step: the same batches and the same state after each
    for a, b in zip(local, remote):
        assert same(a, b)
        assert local.state_dict() == remote.state_dict()
    assert local.state_dict() == remote.state_dict() and remote.epoch == 5
    # skip(n), a break, then the next epoch whole
    for loader in (local, remote):
        loader.skip(3)
    got, want = [], []
    for loader, out in ((local, want), (remote, got)):
        for k, b in enumerate(loader):
            out.append(b)
            if k == 2:
                state = loader.state_dict()
                break
    assert same_batches(got, want) and remote.state_dict() == local.state_dict() == state
    assert same_batches(list(remote), list(local))
    # a mid-epoch state resumed at another world size, on a new loader with a service
    for rank in range(2):
        a, b = make(rank=rank, world_size=2), make(rank=rank, world_size=2, service=svc)
        a.load_state_dict(state)
        b.load_state_dict(state)
        assert same_batches(list(b), list(a))
    # every batch was made once (the loader asked each once)
    assert max(svc.made.values()) == 1


def test_a_scheduled_mixture_resumed_at_another_world_size(tmp_path):
    """A schedule's weights follow the rows of a step, fixed by the world (or by a resumed
    state): each part carries them, and the replica takes them."""
    a = write_dataset(tmp_path / "a", 60, shard_size="2KB")
    b = write_dataset(tmp_path / "b", 40, shard_size="2KB")
    mix = stoker.Mix({"a": a, "b": b}, weights=[(0, {"a": 0.9, "b": 0.1}),
                                                (6, {"a": 0.2, "b": 0.8})])
    svc = LocalService()

    def make(**kw):
        return stoker.Loader(mix, batch_size=6, shuffle=True, seed=2, **kw)

    states = []
    for rank in range(2):
        local, remote = make(rank=rank, world_size=2), make(rank=rank, world_size=2,
                                                            service=svc)
        for loader in (local, remote):
            loader.set_epoch(1)
        got = [b for _, b in zip(range(3), remote)]
        assert same_batches(got, [b for _, b in zip(range(3), local)])
        assert remote.state_dict() == local.state_dict()
        states.append(remote.state_dict())
    local, remote = make(rank=0, world_size=1), make(rank=0, world_size=1, service=svc)
    for loader in (local, remote):
        loader.load_state_dict(states[0])
    assert same_batches(list(remote), list(local))


def test_a_failed_batch_raises_at_its_place_and_the_epoch_goes_on(tmp_path):
    ds = write_dataset(tmp_path / "ds", 40, shard_size="2KB")
    corrupt_record(ds, 7)
    local, remote = (stoker.Loader(ds, batch_size=4, **kw) for kw in ({}, {"service":
                                                                           LocalService()}))
    for loader in (local, remote):
        it = iter(loader)
        assert next(it)["label"].tolist() == [0, 1, 2, 3]
        with pytest.raises(stoker.DataError, match="record 7"):
            next(it)
        assert loader.state_dict()["position"] == 8
        assert [b["label"][0].item() for b in it] == list(range(8, 40, 4))


# -- batches on the wire -----------------------------------------------------------------

Pair = collections.namedtuple("Pair", "a b")


def test_batches_cross_the_wire_with_their_layout():
    hwc = torch.arange(2 * 5 * 4 * 3, dtype=torch.uint8).reshape(2, 5, 4, 3)
    batch = {
        "image": hwc.permute(0, 3, 1, 2),  # an NCHW view of HWC memory (channels_last)
        "half": torch.randn(3, 4).to(torch.bfloat16),
        "strided": torch.arange(20.0)[::2],  # not dense: sent as its values
        "t": torch.arange(6).reshape(2, 3).t(),
        "names": ["a", "b"],
        "pair": Pair(torch.ones(2, dtype=torch.int32), 7),
        "nested": [(torch.zeros(1), "x")],
    }
    wire = pickle.loads(pickle.dumps(encode(batch), protocol=5))
    got = decode(wire)
    assert same(got, {**batch, "strided": batch["strided"].contiguous()})
    assert got["image"].is_contiguous(memory_format=torch.channels_last)
    # arrays travel out of band (Ray's zero-copy path): one buffer per tensor
    buffers = []
    pickle.dumps(encode(batch), protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 6


# -- service= in the plan -----------------------------------------------------------------

class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10))


def test_service_is_checked_by_the_plan(images):
    svc = LocalService()
    with pytest.raises(TypeError, match="stoker.RayService"):
        stoker.Loader(images, service="ray")
    with pytest.raises(ValueError, match="IterableDataset"):
        stoker.Loader(Stream(), batch_size=2, service=svc)
    with pytest.raises(ValueError, match="sampler="):
        stoker.Loader(images, sampler=list(range(10)), service=svc)
    with pytest.raises(ValueError, match="device='cpu'"):
        stoker.Loader(images, device="cuda", service=svc)


def test_ray_service_without_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if not installed
    with pytest.raises(ImportError, match=r"pip install 'stoker\[distributed\]'"):
        stoker.RayService(actors=1)
