"""stoker.RayService on a Ray cluster of three simulated nodes (ray.cluster_utils.Cluster):
the batches equal the local loader's (images with random transforms, tokens, a Python
map, a map-style dataset), each exactly once per epoch when an actor is killed, an actor
joins or a node is lost mid-epoch, and a mid-epoch state resumes at another actor count
and another trainer world size (2 -> 1 and 1 -> 2 trainer processes).

Ray is not in README's test command (the `distributed` extra): there these tests skip,
saying so; .ci/run's "distributed engines" section installs Ray and runs them with
STOKER_REQUIRE_RAY=1, where a missing Ray fails them instead of skipping."""

import os
import sys
import warnings

import numpy as np
import pytest
import stoker
import torch
from conftest import write_dataset
from stoker import example_data

if os.environ.get("STOKER_REQUIRE_RAY"):
    import ray
else:
    ray = pytest.importorskip("ray", reason="Ray is the `distributed` extra (pip install "
                              "'stoker[distributed]'); .ci/run's distributed engines section "
                              "runs these tests")
from ray.cluster_utils import Cluster  # noqa: E402

# The actors unpickle this module's functions (map, the dataset class, the trainer task):
# by value, as a main script's are, since they cannot import it by name.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

# a cluster and actors that start in seconds each; the whole module takes about a minute
pytestmark = [pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # Ray's own
              pytest.mark.filterwarnings("ignore::ResourceWarning")]

TRANSFORMS = {"image": [stoker.ops.RandomResizedCrop(24), stoker.ops.RandomHorizontalFlip(),
                        stoker.ops.ColorJitter(0.4, 0.4)]}


@pytest.fixture(scope="module")
def cluster():
    """Three nodes (logical CPUs: the actors' threads share the machine's cores): actors
    spread over them, so batches cross between the nodes' object stores."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2,
                                                          "include_dashboard": False})
        nodes = [c.add_node(num_cpus=3) for _ in range(2)]
        ray.init(address=c.address, log_to_driver=False, configure_logging=False)
        c.wait_for_nodes()
    yield c, nodes
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def pool(cluster):
    svc = stoker.RayService(actors=3, cpus_per_actor=1)
    assert len({node for _, node, _ in svc.ready(timeout=60)}) == 3  # one on each node
    yield svc
    svc.shutdown()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("svc")
    example_data.write("images", str(root / "images"))
    example_data.write("tokens", str(root / "tokens"))
    write_dataset(root / "labels", 96, shard_size="2KB")  # label = index: coverage checks
    write_dataset(root / "more", 40, shard_size="2KB")
    return root


def noisy(sample, rng):
    """A map drawing from its per-sample generator."""
    return {"x": sample["x"].astype(np.float32) + rng.standard_normal(sample["x"].shape)
            .astype(np.float32), "label": sample["label"]}


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 37

    def __getitem__(self, i):
        return {"x": torch.arange(3.0) * i, "name": f"item-{i}"}


def make(data, kind, **kw):
    if kind == "images":
        return stoker.Loader(stoker.Dataset(data / "images"), batch_size=5, shuffle=True,
                             seed=3, transforms=TRANSFORMS, **kw)
    if kind == "tokens":
        return stoker.Loader(stoker.Dataset(data / "tokens"), batch_size=16, seq_len=64,
                             packing="document", shuffle=True, seed=1, **kw)
    if kind == "mixture":  # a schedule: the replica takes the loader's rows per step
        mix = stoker.Mix({"labels": stoker.Dataset(data / "labels"),
                          "more": stoker.Dataset(data / "more")},
                         weights=[(0, {"labels": 0.8, "more": 0.2}),
                                  (4, {"labels": 0.3, "more": 0.7})])
        return stoker.Loader(mix, batch_size=8, shuffle=True, seed=4, **kw)
    if kind == "map":
        return stoker.Loader(stoker.Dataset(data / "labels"), batch_size=8, shuffle=True,
                             seed=5, map=noisy, **kw)
    assert kind == "map-style"
    return stoker.Loader(Items(), batch_size=4, shuffle=True, seed=2, **kw)


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape \
            and a.stride() == b.stride() and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    return a == b


def same_batches(got, want):
    return len(got) == len(want) and all(map(same, got, want))


def epoch(loader, e):
    loader.set_epoch(e)
    return list(loader)


def refs_held():
    """Object refs this process holds (batches, parts in flight, pipeline specs)."""
    return len(ray._private.worker.global_worker.core_worker.get_all_reference_counts())


def test_batches_in_flight_are_bounded_and_released(data, pool):
    local, remote = make(data, "images"), make(data, "images", service=pool, prefetch=6)
    before = refs_held()
    remote.set_epoch(9)
    most, rows = 0, []
    for batch in remote:
        rows.append(len(batch["label"]))
        for _, seg, _ in remote._stage._segments.values():  # submitted, not yet taken
            most = max(most, seg.submitted - seg.taken)
    assert len(rows) == len(local) and sum(rows) == 48 and 1 <= most <= 6
    del batch
    # the batches, once dropped, and the parts are released: only the spec stays
    assert refs_held() <= before + 1


def test_batches_and_state_equal_the_local_loaders(data, pool):
    for kind in ("images", "tokens", "mixture", "map", "map-style"):
        local, remote = make(data, kind), make(data, kind, service=pool)
        assert same_batches(epoch(remote, 1), epoch(local, 1)), kind
        # mid-epoch: the same state after each batch
        for loader in (local, remote):
            loader.set_epoch(2)
        for k, (a, b) in enumerate(zip(local, remote)):
            assert same(a, b) and local.state_dict() == remote.state_dict(), (kind, k)
            if k == 3:
                break
    s = remote.stats()
    assert s["batches"] == len(remote) + 4 and s["samples"] == 37 + 16
    svc = s["service"]
    made = {a["node"] for a in svc["actors"].values() if a["batches"]}
    assert len(made) >= 2  # batches came from several nodes
    assert svc["transport_seconds"] > 0 and 0 <= s["data_stall"] <= 1
    assert svc["parts_resubmitted"] == 0


@ray.remote(num_cpus=0)
def trainer_rank(svc, root, rank, world, state, take):
    """A trainer process of rank `rank` of `world` (a Ray task, as a Ray Train worker):
    resumes `state` (if any), takes `take` batches (None: the epoch's rest), returns them
    and its state."""
    import stoker

    loader = stoker.Loader(stoker.Dataset(root), batch_size=8, shuffle=True, seed=5,
                           map=noisy, rank=rank, world_size=world, service=svc)
    if state is not None:
        loader.load_state_dict(state)
    else:
        loader.set_epoch(4)
    out = []
    for batch in loader:
        out.append({k: v.clone() for k, v in batch.items()})
        if len(out) == take:
            break
    return out, loader.state_dict()


def local_rest(data, rank, world, state):
    loader = make(data, "map", rank=rank, world_size=world)
    loader.load_state_dict(state)
    return list(loader)


def labels(batches):
    return [int(v) for b in batches for v in b["label"]]


def test_resume_at_another_trainer_world_size_and_actor_count(data, pool):
    root = str(data / "labels")
    # 2 trainer processes on the shared pool take 3 batches each ...
    runs = ray.get([trainer_rank.remote(pool, root, r, 2, None, 3) for r in range(2)])
    states = [s for _, s in runs]
    assert states[0] == states[1] and states[0]["position"] == 48
    for r, (got, _) in enumerate(runs):
        want = make(data, "map", rank=r, world_size=2)
        assert same_batches(got, epoch(want, 4)[:3])
    # ... and one process resumes on another pool of 1 actor: 2 -> 1
    one = stoker.RayService(actors=1, cpus_per_actor=1, name="one-actor")
    try:
        loader = make(data, "map", service=one)
        loader.load_state_dict(states[0])
        rest = list(loader)
        assert same_batches(rest, local_rest(data, 0, 1, states[0]))
        # every sample of the epoch exactly once across the two jobs
        assert sorted(labels(runs[0][0]) + labels(runs[1][0]) + labels(rest)) == \
            list(range(96))
        # 1 -> 2: one process takes 2 batches of epoch 6, two resume
        loader.set_epoch(6)
        first = []
        for b in loader:
            first.append(b)
            if len(first) == 2:
                break
        state = loader.state_dict()
        assert state["position"] == 16
    finally:
        one.shutdown()
    runs = ray.get([trainer_rank.remote(pool, root, r, 2, state, None) for r in range(2)])
    for r, (got, end) in enumerate(runs):
        assert same_batches(got, local_rest(data, r, 2, state))
        assert end["epoch"] == 7 and end["position"] == 0
    assert sorted(labels(first) + labels(runs[0][0]) + labels(runs[1][0])) == list(range(96))


def fresh_pool(n):
    svc = stoker.RayService(actors=n, cpus_per_actor=1)
    svc.ready(timeout=60)
    return svc


def test_an_actor_killed_mid_epoch(data, cluster):
    svc = fresh_pool(3)
    try:
        local, remote = make(data, "tokens"), make(data, "tokens", service=svc, prefetch=24)
        want = epoch(local, 3)
        remote.set_epoch(3)
        got, killed = [], None
        for b in remote:
            got.append(b)
            if len(got) == 5:
                # the actor of the next part in flight, killed with its batches to come
                (_, seg, _), = remote._stage._segments.values()
                killed = seg.parts[0].member
                ray.kill(killed.handle)
        assert same_batches(got, want)  # nothing lost, nothing twice, in order
        s = remote.stats()["service"]
        assert s["actors"][killed.label]["lost"] and s["lost"] == 1
        assert s["parts_resubmitted"] >= 1
        assert s["live_actors"] == 3  # replaced
        assert same_batches(epoch(remote, 4), epoch(local, 4))  # and the next epoch whole
    finally:
        svc.shutdown()


def test_an_actor_added_mid_epoch(data, cluster):
    svc = fresh_pool(1)
    try:
        local, remote = make(data, "tokens"), make(data, "tokens", service=svc, prefetch=16)
        want = epoch(local, 5)
        remote.set_epoch(5)
        got = []
        for b in remote:
            got.append(b)
            if len(got) == 3:
                svc.add(1)
        assert same_batches(got, want)
        actors = remote.stats()["service"]["actors"]
        assert len(actors) == 2 and all(a["batches"] > 0 for a in actors.values())
    finally:
        svc.shutdown()


def test_stoker_bench_on_the_service(data, cluster, capsys):
    """`stoker bench DATASET --ray-actors N`: the local loader and the service, side by
    side, with each actor's rate."""
    from stoker.bench.service import run_service

    rates = run_service(str(data / "images"), 1, batch_size=8, repeats=1, image_size=32,
                        max_batches=3, progress=False)
    assert len(rates) == 2 and all(r > 0 for r in rates.values())
    out = capsys.readouterr().out
    assert "service / local" in out and "actor actor-" in out


def test_a_node_lost_mid_epoch(data, cluster, pool):
    """Last: it takes a node away, the one whose actor holds the next part in flight. The
    actor dies with the batches it made (objects in that node's store): they are computed
    again."""
    c, nodes = cluster
    local = make(data, "images")
    remote = make(data, "images", service=pool, prefetch=12)  # 3 parts: one per actor
    want = epoch(local, 7) + epoch(local, 8)
    got = []
    remote.set_epoch(7)
    for b in remote:
        got.append(b)
        if len(got) == 2:
            (_, seg, _), = remote._stage._segments.values()
            node = next(n for n in nodes for p in seg.parts if p.member.node == n.node_id)
            c.remove_node(node)
    got += list(remote)
    assert same_batches(got, want)
    s = remote.stats()["service"]
    assert s["lost"] >= 1 and s["parts_resubmitted"] >= 1
