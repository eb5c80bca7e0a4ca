"""Where the drop-in's time goes, against DataLoader's, on the same cores.

    python bench/bench_dropin.py [--only a|b|c] [--repeats 3] [--images 256] [--boxes 1024]

The same torch Dataset of bench_python.py's workloads (a) albumentations, (b) pure Python,
(c) Pillow, read by ``stoker.Loader`` and by ``DataLoader`` with the same arguments
(``batch_size=64, shuffle=True, num_workers=2, persistent_workers=True``, and (b)'s
collate_fn), one first epoch (the loader made, its workers started) and --epochs epochs
after it, the two loaders taking turns, medians of --repeats. Per loader:

  user CPU/sample    thread CPU time inside the Dataset's ``__getitem__``, in the workers:
                     the same code in both loaders, so a difference here is the worker
                     process's own (its caches, its preemptions), not the loader's code
  loader CPU/sample  CPU of the whole process tree (the training process and the workers)
                     less the user's: what the loader itself spends per sample delivered,
                     over the first epoch (start-up included) and over the steady epochs.
                     stoker's workers run ahead into the next epoch; the samples they map
                     early count in the user's CPU, so they fall out of this column
  between samples    a worker's wall time from the end of one ``__getitem__`` call to the
                     start of its next, where under a millisecond (not a wait for work):
                     the loader's own code per sample in the worker (stoker seeds the
                     global generators there), its caches cold after the user's code
  1st sample         seconds from making the loader to the first sample a worker returned
  1st batch          seconds from making the loader to its first batch
  wake-ups/batch     voluntary context switches of the training process's threads per
                     batch (on 2 cores each wake-up takes a core from a worker)
  peak PSS           of the process tree: the training process's anonymous and shared
                     memory (stoker's arenas, DataLoader's batches in shared memory) and
                     the workers', over the first epoch of a run of its own: sampling it
                     takes most of a core, so the timed runs do not
  peak memory        the same, with each shared-memory object counted once whole, mapped
                     or not (bench_python.tree_memory): a DataLoader batch in /dev/shm that
                     its worker unmapped and the training process has not read yet is in
                     no process's PSS, yet it is memory (every loop reads each batch it
                     gets, as a training step does: bench_python.step)

and, timed alone, what stoker's per-sample seeding of the global generators costs (random,
numpy.random and torch, seeded from (seed, epoch, index) before each sample: the same
batches for a seed, whatever the workers do: NOTE [ Global random generators ] in
stoker/_stage/workers.py).
"""

import argparse
import ctypes
import gc
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_python as bp  # noqa: E402  (the workloads, shared)

_TICK = os.sysconf("SC_CLK_TCK")


class Timed:
    """The user's Dataset with its ``__getitem__`` timed (thread CPU) in each worker,
    into memory shared with the training process (slot 1 + worker id; 0: the training
    process), and the time of each worker's first call."""

    def __init__(self, inner, cpu, first, gaps):
        self.inner, self.cpu, self.first = inner, cpu, first
        self.gaps = gaps  # per slot: [last end, gap ns, gaps] (between samples)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        import torch

        t0 = time.monotonic_ns()
        c0 = time.thread_time_ns()
        try:
            return self.inner[i]
        finally:
            info = torch.utils.data.get_worker_info()
            slot = 0 if info is None else 1 + info.id
            g = self.gaps
            if g[3 * slot] and t0 - g[3 * slot] < 1_000_000:
                g[3 * slot + 1] += t0 - g[3 * slot]
                g[3 * slot + 2] += 1
            g[3 * slot] = time.monotonic_ns()
            self.cpu[slot] += time.thread_time_ns() - c0
            if self.first[slot] == 0:
                self.first[slot] = time.monotonic_ns()


def _stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _wakeups(pid, skip=None):
    """Voluntary context switches of `pid`'s threads (but thread `skip`)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        if skip is not None and int(tid) == skip:
            continue
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        total += int(line.split(":")[1])
        except OSError:
            pass
    return total


def _pss(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("Pss", "Pss_Anon", "Pss_Shmem"):
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


class Peak:
    """The process tree's peak PSS (sampled every 20 ms), split at the peak into the
    training process's anonymous and shared memory and the workers'. Its own thread's
    CPU time and wake-ups are left out of the loader's (`cpu`, `tid`)."""

    def __init__(self):
        self.best = (0, 0, 0, 0)
        self.memory = 0  # peak of bench_python.tree_memory()'s memory
        self.cpu = 0.0
        self.tid = None
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        me = os.getpid()
        self.tid = threading.get_native_id()
        c0 = time.thread_time()
        while not self._stop.is_set():
            self.cpu = time.thread_time() - c0
            procs = bp._tree(me)
            mine = _pss(me)
            workers = sum(_pss(k).get("Pss", 0) for k in procs[1:])
            if bp._tree(me) != procs:  # a fork meanwhile: shared pages read twice
                continue
            total = mine.get("Pss", 0) + workers
            if total > self.best[0]:
                self.best = (total, mine.get("Pss_Anon", 0), mine.get("Pss_Shmem", 0), workers)
            self.memory = max(self.memory, bp.tree_memory(me)[1])
            self._stop.wait(0.02)

    def __enter__(self):
        self._t.start()
        while self.tid is None:
            time.sleep(0.001)
        return self

    def __exit__(self, *exc):
        self.wakes = peak_wakeups(self)
        self._stop.set()
        self._t.join()


def peak_wakeups(peak):
    """The sampler thread's own voluntary context switches so far."""
    try:
        with open(f"/proc/{os.getpid()}/task/{peak.tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    return int(line.split(":")[1])
    except OSError:
        pass
    return getattr(peak, "wakes", 0)


def tree_cpu():
    t = os.times()
    return t.user + t.system + sum(_stat(k) for k in bp._children(os.getpid()))


class _NoPeak:
    """Peak's place in a timed run: nothing samples (run_one() says why)."""

    cpu = 0.0
    wakes = 0
    best = (0, 0, 0, 0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def run_one(make, inner, epochs, memory=False):
    """One loader's first epoch and `epochs` more: the row's numbers. The timed runs
    sample no memory: reading a process's smaps_rollup costs 14-17 ms of a core here (a
    torch process maps about 1,400 regions), so a sampler every 20 ms takes most of a core
    from the loaders it measures, and their first epochs' times with it. `memory`: a run
    for the peak PSS only (the same steps, sampled; its timings are not kept)."""
    cpu = multiprocessing.RawArray(ctypes.c_int64, 8)
    first = multiprocessing.RawArray(ctypes.c_int64, 8)
    gaps = multiprocessing.RawArray(ctypes.c_int64, 24)
    ds = Timed(inner, cpu, first, gaps)
    me = os.getpid()
    with (Peak() if memory else _NoPeak()) as peak:
        wake0, cpu0 = _wakeups(me), tree_cpu()
        t0 = time.monotonic_ns()
        loader = make(ds)
        n0 = batches0 = 0
        first_batch = None
        for batch in bp._epoch(loader, 0):
            if first_batch is None:
                first_batch = (time.monotonic_ns() - t0) / 1e9
            n0 += bp.step(batch)
            batches0 += 1
        first_epoch = (time.monotonic_ns() - t0) / 1e9
        tree0, user0 = tree_cpu() - cpu0 - peak.cpu, sum(cpu) / 1e9
        wake1 = _wakeups(me) - (peak_wakeups(peak) if memory else 0)
    t1 = time.monotonic_ns()
    n = batches = 0
    for e in range(1, epochs + 1):
        for batch in bp._epoch(loader, e):
            n += bp.step(batch)
            batches += 1
    steady = (time.monotonic_ns() - t1) / 1e9 / epochs
    tree1, user1 = tree_cpu() - cpu0 - peak.cpu, sum(cpu) / 1e9
    wake2 = _wakeups(me) - peak.wakes
    starts = [f for f in first[1:] if f]
    gap_n = sum(gaps[3 * k + 2] for k in range(1, 8))
    if hasattr(loader, "close"):
        loader.close()
    del loader, batch
    gc.collect()  # (a loader in a reference cycle: its memory is not the next run's)
    if memory:
        return {"peak PSS MB": peak.best[0] / 2**20,
                "  parent anon MB": peak.best[1] / 2**20,
                "  parent shared MB": peak.best[2] / 2**20,
                "  workers MB": peak.best[3] / 2**20,
                "peak memory MB": peak.memory / 2**20}, wake1
    return {
        "first epoch s": first_epoch,
        "steady s/epoch": steady,
        "user us/sample": 1e6 * user1 / (n0 + n),
        "loader us/sample, first": 1e6 * (tree0 - user0) / n0,
        "loader us/sample, steady": 1e6 * ((tree1 - user1) - (tree0 - user0)) / n,
        "between samples us": sum(gaps[3 * k + 1] for k in range(1, 8)) / gap_n / 1e3
        if gap_n else float("nan"),
        "1st sample s": (min(starts) - t0) / 1e9 if starts else float("nan"),
        "1st batch s": first_batch,
        "wake-ups/batch": (wake2 - wake0) / (batches0 + batches),
    }, wake1


def workload(name, tmp, args):
    """(the torch Dataset, extra loader arguments, files to warm) of a bench_python
    workload."""
    if name in ("a", "c"):
        # imported by the training process, as a script that imports its transforms does
        # (the Dataset imports them again in __getitem__, where they are already there)
        import albumentations  # noqa: F401
        import cv2  # noqa: F401
        from PIL import ImageEnhance, ImageFilter  # noqa: F401

        paths, _ = bp.make_images(os.path.join(tmp, name), args.images)
        return (bp.JpegFiles(paths) if name == "a" else bp.PilFiles(paths)), {}, paths
    boxes, classes, _ = bp.make_boxes(os.path.join(tmp, name), args.boxes)
    return bp.BoxArrays(boxes, classes), {"collate_fn": bp.pad_collate}, []


def seeding_cost(n=20000):
    """Microseconds per sample of stoker's seeding of the three global generators, as a
    worker seeds them (a chunk's keys made at once), with the caches warm (between a
    user's samples they are not: the "between samples" row has that)."""
    from stoker._stage import workers

    t = time.perf_counter()
    for lo in range(0, n, 32):
        workers.prepare_chunk(0, 1, list(range(lo, lo + 32)))
        for i in range(lo, lo + 32):
            workers.seed_globals(0, 1, i)
    return 1e6 * (time.perf_counter() - t) / (-(-n // 32) * 32)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["a", "b", "c"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--images", type=int, default=256)
    p.add_argument("--boxes", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    import stoker
    import torch

    torch.set_num_threads(1)
    print(f"{len(os.sched_getaffinity(0))} cores, batch {bp.BATCH}, medians of {args.repeats}; "
          f"stoker's seeding of random + numpy.random + torch per sample: "
          f"{seeding_cost():.1f} us")
    titles = {"a": "(a) albumentations", "b": "(b) pure Python", "c": "(c) Pillow"}
    with tempfile.TemporaryDirectory(prefix="stoker-bench-dropin-") as tmp:
        for name in ("a", "c", "b"):
            if args.only not in (None, name):
                continue
            inner, kw, warm = workload(name, tmp, args)
            common = dict(batch_size=bp.BATCH, shuffle=True, num_workers=2,
                          persistent_workers=True, **kw)
            makers = {"stoker (drop-in)": lambda ds, kw=common: stoker.Loader(ds, **kw),
                      "DataLoader": lambda ds, kw=common: torch.utils.data.DataLoader(ds, **kw)}
            rows = {k: [] for k in makers}
            for _ in range(args.repeats):
                for k, make in makers.items():
                    bp.warm_files(warm)
                    rows[k].append(run_one(make, inner, args.epochs)[0])
            med = {k: {m: statistics.median(r[m] for r in rs) for m in rs[0]}
                   for k, rs in rows.items()}
            for k, make in makers.items():  # the memory: one run each, of its own
                bp.warm_files(warm)
                med[k].update(run_one(make, inner, args.epochs, memory=True)[0])
            print(f"\n{titles[name]}")
            print(f"  {'':26}" + "".join(f"{k:>18}" for k in med) + f"{'ratio':>10}")
            s, d = med["stoker (drop-in)"], med["DataLoader"]
            for m in s:
                ratio = s[m] / d[m] if d[m] else float("nan")
                print(f"  {m:26}{s[m]:18.3f}{d[m]:18.3f}{ratio:9.2f}x")


if __name__ == "__main__":
    main()
