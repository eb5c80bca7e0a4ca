"""A training loop whose host cores are taken, fed by stoker.RayService from another core.

    python bench/bench_service.py [--images 768] [--batch-size 32] [--batches 16] [--repeats 5]

Two cores of this machine stand for two hosts: the TRAIN core runs the training loop and
the SERVICE core stands for the CPU hosts of a disaggregated job (Ray's processes and the
service's one actor are pinned to it, the trainer process to the other). The data: JPEGs
of ImageNet-like sizes (bench/make_jpegs.py), shuffled, RandomResizedCrop + flip, the
batches of a vision training run. The step is a fixed amount of CPU work on the TRAIN core
(single-threaded matrix products), calibrated to the loader's time per batch on one core:
it stands for a host whose cores are busy with the training step (kernel launches, the
optimizer on CPU, a framework's Python), the case the service is for.

Printed, in one run (medians of --repeats, with their extremes):

  producing batches alone, equal cores (one core makes batches, the loop on the other
  core takes them and does nothing else):
    local     stoker.Loader(num_threads=1), its worker on the SERVICE core
    service   stoker.RayService(actors=1, cpus_per_actor=1) on the SERVICE core
  -> the service's transport overhead per batch: its time per batch over the local
     loader's, minus one (goal: under 10%), with the actor's store puts and the
     trainer's gets per batch, and the CPU per batch of each side (the actor and its
     node's raylet against the local worker thread), steadier than wall time on a busy
     machine. Ray's object store is written through once first (--store-mb): the first
     pass over its memory costs a page fault per page to whoever writes or maps it, a
     training run pays it in its first gigabytes only; that pass's rate is printed too;

  the training loop (steps/s):
    (a) local     stoker.Loader(num_threads=1) on the TRAIN core, beside the step
    (b) service   the same loader with service=: its actor on the SERVICE core
    (c) DataLoader(num_workers=1) with its worker process on the SERVICE core, PIL
        decodes (the one-machine way to move decoding off the loop's core)
  -> (b) / (a) (goal: at least 1.6x) and (b) / (c);

  and a projection, on paper, for N CPU hosts from the measured per-actor rate and the
  trainer's transport cost per batch.
"""

import argparse
import io
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import stoker
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_jpegs import make_image  # noqa: E402


def write_dataset(path, n, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(path, fields, shard_size="32MB", overwrite=True) as w:
        for i in range(n):
            buf = io.BytesIO()
            Image.fromarray(make_image(rng)).save(buf, format="JPEG", quality=90)
            w.write({"image": buf.getvalue(), "label": i % 1000})


def read_files(path):
    """The dataset's files into page cache, right before each timed run."""
    for root, _, names in os.walk(path):
        for name in sorted(names):
            with open(os.path.join(root, name), "rb") as f:
                while f.read(1 << 24):
                    pass


def pin_threads(cpu, names=None):
    """Pins this process's threads (those whose name starts with one of `names`, or all)
    to `cpu`."""
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
            if names is None or comm.startswith(names):
                os.sched_setaffinity(int(tid), {cpu})
        except OSError:
            pass  # the thread ended meanwhile


def allowed_cpus(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list"):
                return line.split(":")[1].strip()
    return "?"


class Step:
    """A fixed amount of CPU work on the calling thread: single-threaded matmuls."""

    def __init__(self, seconds):
        torch.set_num_threads(1)
        self.a = torch.randn(192, 192)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.3:
            self.a @ self.a
            n += 1
        self.iters = max(1, round(seconds * n / (time.perf_counter() - t0)))

    def __call__(self):
        for _ in range(self.iters):
            self.a @ self.a


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(stat_path):
    """CPU seconds (user + system) of a process or thread, from its /proc stat file."""
    try:
        with open(stat_path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def faults_of(pid):
    """Minor page faults of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def threads_cpu(prefix):
    """CPU seconds of this process's threads whose name starts with `prefix`."""
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if not f.read().startswith(prefix):
                    continue
        except OSError:
            continue
        total += cpu_of(f"/proc/self/task/{tid}/stat")
    return total


def timed(batches_of, path, warmup, batches, step=None, producer_cpu=None, epoch=None):
    """Seconds per batch over `batches` batches after `warmup`, each followed by `step`.
    With `producer_cpu` (CPU seconds of what makes the batches, now), the iterator then
    runs to the end of its epoch of `epoch` batches, so that what was made was taken, and
    the figures are per batch over the whole epoch, its start included: seconds, and
    CPU seconds of the producer and of this process's other threads (the loop)."""
    read_files(path)
    p0, c0 = (producer_cpu(), time.process_time()) if producer_cpu else (0, 0)
    start = time.perf_counter()
    it = iter(batches_of())
    for _ in range(warmup):
        next(it)
        if step:
            step()
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
        if step:
            step()
    secs = (time.perf_counter() - t0) / batches
    if producer_cpu is None:
        del it
        return secs
    for _ in it:  # the epoch's rest: nothing made beyond what is taken
        pass
    whole = (time.perf_counter() - start) / epoch
    made = producer_cpu() - p0
    mine = time.process_time() - c0
    if producer_cpu is _local_workers:  # the producer's threads are this process's
        mine -= made
    del it
    return whole, made / epoch, mine / epoch


def _local_workers():
    return threads_cpu("stoker-worker")


def med(xs):
    return statistics.median(xs), min(xs), max(xs)


def fmt_rate(secs):
    m, lo, hi = med([1 / s for s in secs])
    return f"{m:7.2f} /s  ({lo:.2f}-{hi:.2f})"


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=768)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--size", type=int, default=224, help="RandomResizedCrop size")
    p.add_argument("--batches", type=int, default=16, help="timed batches per run")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--data", default=None, help="directory to keep the dataset in")
    p.add_argument("--no-dataloader", action="store_true", help="skip (c)")
    p.add_argument("--part", type=int, default=4, help="RayService(part_batches=)")
    p.add_argument("--ops", choices=("rrc", "timm"), default="rrc",
                   help="rrc: RandomResizedCrop + flip; timm: + TrivialAugmentWide and "
                        "ColorJitter(0.4, 0.4, 0.4)")
    p.add_argument("--store-mb", type=int, default=256,
                   help="Ray's object store (MB), written through once before timing")
    p.add_argument("--host-cores", type=int, default=32, help="projection: cores per host")
    p.add_argument("--nic-gbps", type=float, default=25.0, help="projection: trainer NIC")
    args = p.parse_args()

    import ray

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("needs two cores: one for the training loop, one for the service")
    train, serve = cores[0], cores[1]
    root = args.data or tempfile.mkdtemp(prefix="stoker-service-bench-")
    path = os.path.join(root, "images")
    if not os.path.exists(os.path.join(path, "index.json")):
        write_dataset(path, args.images)
    ds = stoker.Dataset(path)
    tr = [stoker.ops.RandomResizedCrop(args.size), stoker.ops.RandomHorizontalFlip()]
    if args.ops == "timm":  # timm's ImageNet recipe: + TrivialAugmentWide, ColorJitter(0.4)
        tr += [stoker.ops.TrivialAugmentWide(), stoker.ops.ColorJitter(0.4, 0.4, 0.4)]
    tr = {"image": tr}
    batches_per_epoch = len(ds) // args.batch_size
    need = args.warmup + args.batches + 1
    assert need <= batches_per_epoch, "more batches asked than an epoch has"

    # Ray's processes start from a thread pinned to the SERVICE core, and inherit it; then
    # every thread of this process (Ray's driver threads: the trainer's transport) moves
    # to the TRAIN core.
    pin_threads(serve)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             configure_logging=False, object_store_memory=args.store_mb << 20)
    svc = stoker.RayService(actors=1, cpus_per_actor=1, part_batches=args.part)
    (_, _, actor_pid), = svc.ready(timeout=120)
    with open(f"/proc/{actor_pid}/stat") as f:
        raylet_pid = int(f.read().rsplit(")", 1)[1].split()[1])  # the actor's parent

    def service_cpu():  # the actor, and the raylet, which holds the node's object store
        return cpu_of(f"/proc/{actor_pid}/stat") + cpu_of(f"/proc/{raylet_pid}/stat")

    def sides():  # CPU of the actor and the raylet, the actor's page faults, apart
        return (cpu_of(f"/proc/{actor_pid}/stat"), cpu_of(f"/proc/{raylet_pid}/stat"),
                faults_of(actor_pid))
    pin_threads(train)
    more = " + TrivialAugmentWide + ColorJitter" if args.ops == "timm" else ""
    print(f"{len(ds)} JPEGs, batch_size={args.batch_size}, RandomResizedCrop("
          f"{args.size}) + flip{more}; {args.batches} timed batches per run after "
          f"{args.warmup} (training loop), median of {args.repeats} (extremes in brackets)")
    print(f"TRAIN core {train}: this process (cpus {allowed_cpus(os.getpid())}); SERVICE "
          f"core {serve}: the actor (pid {actor_pid}, cpus {allowed_cpus(actor_pid)})")

    def loader(**kw):
        kw = {"prefetch": 4, **kw}
        return stoker.Loader(ds, batch_size=args.batch_size, shuffle=True, seed=0,
                             transforms=tr, num_threads=1, stall_warning=None, **kw)

    epoch = [0]

    def local_on(cpu):
        def batches():
            lo = loader()
            lo.set_epoch(epoch[0])
            epoch[0] += 1
            it = iter(lo)
            next(it)  # its worker started: pinned where it belongs
            pin_threads(cpu, ("stoker-",))
            return _Chain(it)
        return batches

    remote = loader(service=svc, prefetch=2 * args.part)  # two parts in flight
    looped = loader(service=svc, prefetch=2 * args.part)  # the same, for the loop's stats

    def service(of=remote):
        def batches():
            of.set_epoch(epoch[0])
            epoch[0] += 1
            return of
        return batches

    # The object store's memory is new to the processes that write and map it until it
    # has been written through once: each page costs a fault (about 4 us, ~1,200 per MB)
    # the first time only. A training run is past that within its first gigabytes; the
    # timed runs start there too.
    cold = timed(service(), path, 0, args.warmup + args.batches)
    batch_bytes = remote._stage._batch_bytes
    written = (args.warmup + args.batches) * batch_bytes
    while written < 1.5 * (args.store_mb << 20):
        timed(service(), path, 0, args.warmup + args.batches)
        written += (args.warmup + args.batches) * batch_bytes

    # -- producing alone, equal cores ------------------------------------------------------
    alone = {"local": [], "service": []}
    cpu = {"local": [], "service": []}
    s0 = sides()
    for _ in range(args.repeats):
        secs, made, mine = timed(local_on(serve), path, args.warmup, args.batches,
                                 producer_cpu=_local_workers, epoch=batches_per_epoch)
        alone["local"].append(secs)
        cpu["local"].append((made, mine))
        secs, made, mine = timed(service(), path, args.warmup, args.batches,
                                 producer_cpu=service_cpu, epoch=batches_per_epoch)
        alone["service"].append(secs)
        cpu["service"].append((made, mine))
    s1 = sides()
    served = args.repeats * batches_per_epoch
    actor_cpu, raylet_cpu, faults = ((b - a) / served for a, b in zip(s0, s1))
    per_local = statistics.median(alone["local"])
    per_service = statistics.median(alone["service"])
    made_local = statistics.median(c[0] for c in cpu["local"])
    made_service = statistics.median(c[0] for c in cpu["service"])
    loop_local = statistics.median(c[1] for c in cpu["local"])
    loop_service = statistics.median(c[1] for c in cpu["service"])
    s = remote.stats()["service"]
    (actor,) = s["actors"].values()
    put = actor["put_seconds_per_batch"]
    get = s["transport_seconds_per_batch"]
    batch_mb = remote._stage._batch_bytes / 1e6
    print("\nproducing batches alone, whole epochs (one core makes them, the loop takes them "
          "on the other):")
    print(f"  local   stoker.Loader(num_threads=1)          {fmt_rate(alone['local'])} batches")
    print(f"  service RayService(actors=1, cpus_per_actor=1) {fmt_rate(alone['service'])} "
          "batches")
    overhead = per_service / per_local - 1
    print(f"  (the store's first pass, its pages new: {1 / cold:.2f} batches/s)")
    print(f"  service / local time per batch: {per_service / per_local:.3f} -> transport "
          f"overhead {overhead:+.1%} (goal: under 10%)")
    print(f"  per batch ({batch_mb:.2f} MB): actor's store put {put * 1e3:.2f} ms, trainer's "
          f"get + views {get * 1e3:.2f} ms, compute {per_local * 1e3:.1f} ms")
    print(f"  CPU per batch (less sensitive to other load on the machine): making it "
          f"{made_local * 1e3:.1f} ms local, {made_service * 1e3:.1f} ms service (actor + "
          f"raylet) -> {made_service / made_local - 1:+.1%}; the loop's "
          f"{loop_local * 1e3:.2f} ms local, {loop_service * 1e3:.2f} ms service")
    print(f"  the service's side: actor {actor_cpu * 1e3:.1f} ms, raylet {raylet_cpu * 1e3:.1f} "
          f"ms of CPU and {faults:.0f} page faults in the actor per batch")

    # -- the training loop -----------------------------------------------------------------
    step = Step(per_local)
    print(f"\ntraining loop: a step of {per_local * 1e3:.0f} ms of CPU on the TRAIN core "
          "(the local loader's time per batch)")
    loops = {"(a) local, TRAIN core": [], "(b) service, SERVICE core": []}
    if not args.no_dataloader:
        from stoker.bench.dataset import PythonDataset, collate

        peer = PythonDataset(path, args.size)
        loops["(c) DataLoader, worker on SERVICE core"] = []
    for _ in range(args.repeats):
        loops["(a) local, TRAIN core"].append(
            timed(local_on(train), path, args.warmup, args.batches, step))
        loops["(b) service, SERVICE core"].append(
            timed(service(looped), path, args.warmup, args.batches, step))
        if not args.no_dataloader:
            import functools

            loops["(c) DataLoader, worker on SERVICE core"].append(timed(
                lambda: torch.utils.data.DataLoader(
                    peer, batch_size=args.batch_size, shuffle=True, num_workers=1,
                    prefetch_factor=4, collate_fn=functools.partial(collate, ds.fields),
                    worker_init_fn=functools.partial(_pin_worker, serve)),
                path, args.warmup, args.batches, step))
    t0 = time.perf_counter()
    for _ in range(10):
        step()
    step_time = (time.perf_counter() - t0) / 10
    ideal = 1 / step_time
    for name, secs in loops.items():
        print(f"  {name:<40} {fmt_rate(secs)} steps")
    print(f"  {'the step alone (no data)':<40} {ideal:7.2f} /s")
    a = statistics.median(loops["(a) local, TRAIN core"])
    b = statistics.median(loops["(b) service, SERVICE core"])
    print(f"  (b) / (a): {a / b:.2f}x steps/s (goal: at least 1.6x)")
    if not args.no_dataloader:
        c = statistics.median(loops["(c) DataLoader, worker on SERVICE core"])
        print(f"  (b) / (c): {c / b:.2f}x")
    st = looped.stats()
    print(f"  (b)'s loop waited for data {st['data_stall']:.1%} of its time (stats()["
          "'data_stall'])")

    # -- on paper: N CPU hosts ----------------------------------------------------------------
    per_core = 1 / per_service  # batches/s one actor core makes, transport included
    trainer_cap = 1 / get if get > 0 else float("inf")
    nic = args.nic_gbps * 1e9 / 8 / (batch_mb * 1e6)
    print(f"\nprojection (paper): N CPU hosts of {args.host_cores} cores, one actor per core "
          f"at the measured {per_core:.2f} batches/s each; one trainer process takes at most "
          f"{trainer_cap:.0f} batches/s (its get + views, {get * 1e3:.2f} ms each) and its "
          f"{args.nic_gbps:g} Gbit/s NIC {nic:.0f} batches/s of {batch_mb:.2f} MB")
    for hosts in (1, 2, 4, 8, 16):
        made = hosts * args.host_cores * per_core
        got = min(made, trainer_cap, nic)
        limit = "actors" if got == made else "trainer's gets" if got == trainer_cap else "NIC"
        print(f"  {hosts:>2} host(s): {made:9.0f} batches/s made, {got:9.0f} delivered to one "
              f"trainer ({limit}); {got * args.batch_size:10.0f} images/s")
    svc.shutdown()
    ray.shutdown()


def _pin_worker(cpu, worker_id):
    os.sched_setaffinity(0, {cpu})


class _Chain:
    """An iterator whose first batch was already taken (to pin the loader's worker)."""

    def __init__(self, it):
        self.it = it

    def __iter__(self):
        return self.it


if __name__ == "__main__":
    main()
