"""``stoker bench DATASET --ray-actors N``: a user's dataset through stoker.RayService
(docs/service.md) beside the local loader (see :func:`run_service`)."""

from __future__ import annotations

import os
from typing import Dict, Optional

from .._progress import Progress
from ..dataset import Dataset
from ..loader import Loader
from ..service import RayService
from ._spread import Runs
from ._timing import _time_batches
from .dataset import _stoker_transforms


def run_service(path: str, actors: int, cpus_per_actor: int = 1, address: Optional[str] = None,
                batch_size: int = 256, repeats: int = 3, image_size: int = 224,
                max_batches: int = 50, progress: bool = True) -> Dict[str, float]:
    """Samples/s of the dataset at `path` (shuffled, RandomResizedCrop(image_size) and a
    flip for image fields) from a local loader on this machine's cores and from a
    RayService of `actors` actors of `cpus_per_actor` CPUs (joining the cluster at
    `address`, or a new local one), `repeats` runs of at most `max_batches` batches each;
    then the ratio, each actor's rate and the transport's cost per batch."""
    ds = Dataset(path)
    if len(ds) == 0:
        raise ValueError(f"{ds.path}: the dataset has no samples to benchmark")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    transforms = _stoker_transforms(ds, image_size)
    svc = RayService(actors=actors, cpus_per_actor=cpus_per_actor, address=address)
    svc.ready()
    limit = max(1, min(max_batches, len(ds) // batch_size or 1))
    print(f"{ds.path}: {len(ds)} samples; batch_size={batch_size}, shuffled, up to {limit} "
          f"batches per run, median of {repeats}; {svc.describe()}")
    kw = dict(batch_size=batch_size, shuffle=True, transforms=transforms, stall_warning=None)
    local = Loader(ds, num_threads=cores, **kw)
    remote = Loader(ds, service=svc, **kw)
    runs = {f"stoker, {cores} local thread(s)": Runs(), f"stoker on {svc.describe()}": Runs()}
    bar = Progress(2 * repeats, "stoker bench", unit="runs", enabled=progress)
    for loader in (local, remote):  # warm-up: threads started, the actors' replicas made
        loader.set_epoch(repeats)
        for _ in zip(range(2), loader):
            pass
    for epoch in range(repeats):
        for name, loader in zip(runs, (local, remote)):
            bar.update()
            loader.set_epoch(epoch)
            runs[name].add(_time_batches(lambda loader=loader: loader, ds.path, limit)[0])
    bar.close()
    for name, r in runs.items():
        print(f"  {name:<48} {r.text(unit='samples/s')}")
    (a, ra), (b, rb) = runs.items()
    print(f"  service / local: {rb.median / ra.median:.2f}x")
    s = remote.stats()["service"]
    for label, actor in s["actors"].items():
        print(f"  actor {label} (node {str(actor['node'])[:8]}): {actor['batches']} batches, "
              f"{actor['batches_per_second'] * batch_size:,.0f} samples/s while working")
    print(f"  per batch: the actors' store put {s['put_seconds_per_batch'] * 1e3:.2f} ms, this "
          f"process's get {s['transport_seconds_per_batch'] * 1e3:.2f} ms; the loop waited "
          f"{remote.stats()['data_stall']:.0%} of its time")
    svc.shutdown()
    return {a: ra.median, b: rb.median}
