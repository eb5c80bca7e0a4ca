"""Behaviour that needs processes of its own: torch.distributed ranks, peak memory."""

import json
import os
import subprocess
import sys
import textwrap

from conftest import write_dataset

# Each rank, or each measured run, is a fresh interpreter: a process group is per process,
# and peak RSS (ru_maxrss) is only meaningful for a process that did nothing else.


def _run(script: str, timeout: float = 120) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


RANK_SCRIPT = """
    import json, torch.distributed as dist, stoker
    dist.init_process_group("gloo", init_method={init!r}, rank={rank}, world_size={world})
    loader = stoker.Loader(stoker.Dataset({path!r}), batch_size=8, shuffle=True, seed=3)
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        epochs.append([b["label"].tolist() for b in loader])
    # every rank must yield the same number of batches, or collectives would deadlock:
    # a barrier after the epoch only returns if all ranks got there
    dist.barrier()
    print(json.dumps({{"rank": loader.rank, "world": loader.world_size, "len": len(loader),
                      "epochs": epochs}}))
    dist.destroy_process_group()
"""


def test_rank_and_world_size_come_from_torch_distributed(tmp_path):
    ds = write_dataset(tmp_path / "d", 103)
    world = 3
    init = f"file://{tmp_path / 'pg'}"
    # gloo over loopback: a CI machine's hostname need not resolve
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    procs = [subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(RANK_SCRIPT.format(
            init=init, rank=r, world=world, path=ds.path))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for r in range(world)]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:  # a failed rank leaves the others waiting in a collective: end them
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [(r["rank"], r["world"]) for r in results] == [(r, world) for r in range(world)]
    assert {r["len"] for r in results} == {5}  # ceil(ceil(103 / 3) / 8)
    for epoch in range(2):
        per_rank = [sum(r["epochs"][epoch], []) for r in results]
        assert all(len(labels) == 35 for labels in per_rank)  # ceil(103 / 3)
        assert set(sum(per_rank, [])) == set(range(103))
        # the same split as asking for the rank explicitly in one process
        import stoker
        for rank, labels in enumerate(per_rank):
            loader = stoker.Loader(ds, batch_size=8, shuffle=True, seed=3, rank=rank,
                                   world_size=world)
            loader.set_epoch(epoch)
            assert labels == sum([b["label"].tolist() for b in loader], [])
    assert results[0]["epochs"][0] != results[0]["epochs"][1]


PEAK_SCRIPT = """
    import json, resource, stoker
    loader = stoker.Loader(stoker.Dataset({path!r}), batch_size=64, shuffle=True,
                           num_threads={threads})
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:
            pass
    print(json.dumps({{"peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "slots": loader.stats()["host_blocks"]}}))
"""


def test_memory_does_not_grow_with_the_thread_count(tmp_path):
    """Workers share one mmap and one batch window: 16 threads cost what 1 does, plus stacks.

    DataLoader's per-worker copies are what this guards against; the data here (32 MiB)
    would show up many times over if each thread held its own."""
    import numpy as np
    import stoker

    ds = write_dataset(tmp_path / "d", 2048, shard_size="8MB",
                       fields={"x": stoker.ndarray("uint8", (16384,)),
                               "label": stoker.scalar("int64")},
                       make=lambda i: {"x": np.full(16384, i % 251, np.uint8), "label": i})
    peak = {t: _run(PEAK_SCRIPT.format(path=ds.path, threads=t)) for t in (1, 16)}
    # the window is prefetch batches (4 by default) plus the two at hand, not per thread
    assert all(p["slots"] <= 4 + 2 for p in peak.values()), peak
    grew = (peak[16]["peak_kib"] - peak[1]["peak_kib"]) * 1024
    assert grew < 16 * 2**20, f"16 threads took {grew / 2**20:.1f} MiB more than 1"
