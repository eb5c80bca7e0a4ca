"""Your Python code in the pipeline: stoker's Python stage against DataLoader.

    python bench/bench_python.py [--repeats 3] [--images 512] [--boxes 2048] [--only a|b|c|d]

Four workloads, each loader timed over its first epoch (start-up included) and over
--epochs epochs after it (the steady state of a training run), in one run, configurations
interleaved, medians of --repeats:

  (a) GIL-releasing: JPEG -> 224x224 random resized crop -> albumentations ColorJitter,
      Rotate(20), GaussianBlur (OpenCV and NumPy: they release the GIL).
        stoker:      a stoker dataset of the JPEGs; decode + RandomResizedCrop(224) in C++,
                     the albumentations ops in map=
        DataLoader:  a torch Dataset reading the files: cv2.imdecode, albumentations'
                     RandomResizedCrop, the same ops
  (c) GIL-releasing, Pillow: the same JPEGs and crop, then Pillow's ImageEnhance
      brightness/contrast/saturation, rotate(±20, bilinear) and GaussianBlur, each factor
      drawn from the sample's generator.
        stoker:      decode + RandomResizedCrop(224) in C++, the Pillow ops in map=
        DataLoader:  a torch Dataset reading the files: Pillow decode, crop + resize to
                     224 with Pillow, the same ops
  (d) an IterableDataset: a stream of the same JPEG files, sharded by get_worker_info():
      read + cv2 decode in its __iter__, then albumentations' RandomResizedCrop(224),
      ColorJitter, Rotate(20) and GaussianBlur.
        stoker:      the stream decodes, the ops in map= (num_workers=2: two worker
                     processes, each iterating its share and mapping its rows; and the same
                     on two worker threads); and the drop-in: the stream doing the ops
                     itself, with exactly DataLoader's arguments
        DataLoader:  the stream doing the ops itself (DataLoader has no map)
  (b) pure Python: per-box label processing in Python loops (64 boxes per sample: to
      corners, clipped, small ones dropped, classes remapped, best of 9 anchors by IoU).
        stoker:      a stoker dataset of boxes and classes, the processing in map=
        DataLoader:  a torch Dataset over the same arrays, the processing in __getitem__,
                     a collate_fn that pads boxes as stoker does

Rows: first, the drop-in: stoker over the *same* torch Dataset with exactly DataLoader's
arguments (``num_workers=2, persistent_workers=True`` and, for (b), the same collate_fn:
one word changed, nothing stoker-specific); then stoker's default loader with no flags at
all (python_workers="auto": threads, processes once its Python is GIL-bound; workers tuned
online), stoker with threads and with process workers (num_threads=2), stoker over the
torch Dataset with no arguments beyond batch_size and shuffle, and DataLoader with
num_workers 0/1/2. Columns: the first epoch's samples/s (the loader made, its workers
started and one epoch read: what a training run's first epoch pays) and its ratio to the
best DataLoader's first epoch; the steady state's samples/s (the --epochs epochs after the
first) and its ratio to the best DataLoader's; time to the first batch; the peak PSS
of the whole process tree (the main process and its workers, from
/proc/<pid>/smaps_rollup, sampled in --repeats runs of each configuration apart from the
timed ones, reading it takes most of a core; the median of their peaks) and its peak
memory ("peak mem": the same, with each shared-memory object counted once whole, whether
or not a page table holds its pages: a DataLoader batch in /dev/shm that no process has
touched since its worker unmapped it is in no process's PSS, yet it is memory;
tree_memory()); and the tree's CPU time per batch in the steady state (every thread of
the main process and its workers, from /proc/<pid>/stat): what a batch costs the machine,
which holds when other work on the machine makes the timings noisy. Every loop reads each
batch it gets (a byte of every page: step()), as a training step's copy to the GPU reads
them all; a batch never read would be in no process's PSS where another process wrote it
and unmapped it.
"""

import argparse
import gc
import io
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

BATCH = 64
ANCHORS = [(10, 13), (16, 30), (33, 23), (30, 61), (62, 45), (59, 119), (116, 90),
           (156, 198), (373, 326)]
REMAP = {i: (i * 7) % 80 for i in range(80)}


# -- memory of the process tree --------------------------------------------------------

def _children(pid):
    """The children of process `pid`, forked from any of its threads."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _tree(pid):
    """`pid` and all its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


# What names a shared-memory object in /proc/<pid>/maps and /proc/<pid>/fd: a memfd
# (stoker's batch blocks and arenas), a /dev/shm file (DataLoader's batches), a shared
# anonymous mapping.
_SHMEM = ("/memfd:", "/dev/shm/", "/dev/zero", "/SYSV")


def _rollup(pid):
    """(Pss, Pss_Shmem) of process `pid`, bytes."""
    out = {"Pss": 0, "Pss_Shmem": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in out:
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out["Pss"], out["Pss_Shmem"]


def _shared_objects(pid, seen):
    """Adds to `seen` ((device, inode) -> bytes it holds) each shared-memory object that
    process `pid` maps or holds open. PSS counts a shared page only in the processes
    whose page tables have it: a batch that a DataLoader worker wrote into /dev/shm and
    unmapped, while the training process mapped it and has not read it yet, is in no
    process's PSS, yet it is memory. An object's size here is its allocated pages (holes
    punched by MADV_REMOVE excluded). Reading /proc/<pid>/map_files needs the same user
    (some kernels: CAP_SYS_ADMIN); objects that cannot be read are left out."""
    paths = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[1][3] == "s" and parts[5].startswith(_SHMEM):
                    paths.append(f"/proc/{pid}/map_files/{parts[0]}")
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(path).startswith(_SHMEM):
                paths.append(path)
        except OSError:
            pass
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512


def tree_memory(pid=None):
    """(PSS, memory) in bytes of `pid` and all its descendants. PSS: shared pages counted
    once in total, among the processes whose page tables hold them. Memory: the PSS of
    everything but shared memory, plus each shared-memory object the tree maps or holds
    open, counted once whole, whether or not a page table holds its pages (_shared_objects
    says why). A process forked while the tree is read would count the pages it shares
    twice (its parent's PSS read before the fork, its own after): the tree is read again
    until no process came or went meanwhile."""
    pid = pid or os.getpid()
    pss = mem = 0
    for _ in range(5):
        procs = _tree(pid)
        seen = {}
        pss = mem = 0
        for p in procs:
            total, shmem = _rollup(p)
            pss += total
            mem += total - shmem
            _shared_objects(p, seen)
        mem += sum(seen.values())
        if _tree(pid) == procs:
            break
    return pss, mem


def _cpu_of(pid):
    """CPU seconds (user + system, all its threads) process `pid` used so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def tree_cpu(pid=None):
    """CPU seconds used so far by `pid` and each of its live descendants, by pid."""
    return {p: _cpu_of(p) for p in _tree(pid or os.getpid())}


def tree_pss(pid=None):
    """PSS in bytes of `pid` and all its descendants (tree_memory's first figure)."""
    return tree_memory(pid)[0]


class PeakPss:
    """Samples the tree's PSS and memory (tree_memory) every 50 ms while a run goes on:
    their peaks, `peak` and `peak_memory`."""

    def __init__(self):
        self.peak = self.peak_memory = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(0.05)

    def _sample(self):
        pss, mem = tree_memory()
        self.peak = max(self.peak, pss)
        self.peak_memory = max(self.peak_memory, mem)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self._sample()


def timed_epochs(make, epochs):
    """(first epoch samples/s, steady samples/s, seconds to the first batch, CPU seconds
    per batch in the steady state) of one loader. The first epoch is timed from before
    the loader is made to its last batch: the start-up a training run's first epoch pays
    (DataLoader forks its workers at iter(), kept with persistent_workers=True; stoker
    starts its threads and any process workers). Then `epochs` epochs more, the steady
    state a training run sees. The steady state's CPU is the whole tree's (the loop's
    process and its workers, every thread): what the loader costs the machine per batch,
    which a loaded machine's timings hide. Nothing samples memory meanwhile (peak_pss()
    does, in runs of its own): reading a process's smaps_rollup costs 14-17 ms of a core
    here (a torch process maps about 1,400 regions), so a sampler every 50 ms would take
    most of a core from the loader it measures."""
    t0 = time.perf_counter()
    loader = make()
    first = None
    n0 = 0
    for batch in _epoch(loader, 0):
        if first is None:
            first = time.perf_counter() - t0
        n0 += step(batch)
    first_epoch = time.perf_counter() - t0
    cpu0 = tree_cpu()
    t0 = time.perf_counter()
    n = batches = 0
    for e in range(1, epochs + 1):
        for batch in _epoch(loader, e):
            n += step(batch)
            batches += 1
    wall = time.perf_counter() - t0
    cpu = sum(c - cpu0.get(p, 0.0) for p, c in tree_cpu().items())
    if hasattr(loader, "close"):
        loader.close()
    del loader, batch
    gc.collect()  # (a loader in a reference cycle: its memory is not the next run's)
    return n0 / first_epoch, n / wall, first, cpu / max(1, batches)


def peak_pss(make, epochs):
    """The process tree's peak PSS and peak memory (tree_memory) over the same run as
    timed_epochs() (made, a first epoch, `epochs` more), sampled every 50 ms; its
    timings are not kept."""
    batch = None
    with PeakPss() as mem:
        loader = make()
        for e in range(epochs + 1):
            for batch in _epoch(loader, e):
                step(batch)
    if hasattr(loader, "close"):
        loader.close()
    del loader, batch
    gc.collect()  # (a loader in a reference cycle: its memory is not the next run's)
    return mem.peak, mem.peak_memory


def _epoch(loader, e):
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(e)
    return iter(loader)


def _batch_len(batch):
    if isinstance(batch, dict):
        return len(next(iter(batch.values())))
    return len(batch[0])


def _tensors(x):
    import torch

    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)


def step(batch):
    """What a training step does with a batch, short of the model: it reads it (a byte of
    every page of each tensor, where a copy to the GPU reads them all), and counts its
    samples. Without the read, a batch whose pages another process wrote into shared
    memory and unmapped (DataLoader's /dev/shm batches) would be in no process's PSS
    while the loop holds it."""
    import torch

    for t in _tensors(batch):
        if t.numel():
            int(t.contiguous().reshape(-1).view(torch.uint8)[::4096].sum())
    return _batch_len(batch)


# -- (a) images, albumentations ---------------------------------------------------------

def augment():
    import albumentations as A

    return A.Compose([A.ColorJitter(0.4, 0.4, 0.4, 0.1, p=1.0), A.Rotate(limit=20, p=1.0),
                      A.GaussianBlur(blur_limit=(3, 7), p=1.0)])


AUG = None


def aug_map(sample, rng):
    """stoker's map for (a): the albumentations ops on the C++-cropped 224x224 image."""
    global AUG
    if AUG is None:
        AUG = augment()
    return {"image": AUG(image=sample["image"])["image"], "label": sample["label"]}


def pil_ops(img, rng):
    """(c): colour jitter, rotation and blur with Pillow (its C kernels release the GIL)."""
    from PIL import ImageEnhance, ImageFilter

    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        img = enhance(img).enhance(float(rng.uniform(0.6, 1.4)))
    img = img.rotate(float(rng.uniform(-20, 20)), resample=2)  # 2: bilinear
    return img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.1, 2.0))))


def pil_map(sample, rng):
    """stoker's map for (c): the Pillow ops on the C++-cropped 224x224 image."""
    from PIL import Image

    img = pil_ops(Image.fromarray(sample["image"]), rng)
    return {"image": np.asarray(img), "label": sample["label"]}


class PilFiles:
    """(c) for DataLoader: read, Pillow decode, a random resized crop and the same ops."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import torch
        from PIL import Image

        rng = np.random.default_rng()
        img = Image.open(self.paths[i]).convert("RGB")
        w, h = img.size
        side = int(min(w, h) * np.sqrt(rng.uniform(0.08, 1.0)))
        x0, y0 = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
        img = img.resize((224, 224), Image.BILINEAR, box=(x0, y0, x0 + side, y0 + side))
        img = pil_ops(img, rng)
        return {"image": torch.from_numpy(np.asarray(img).copy()), "label": i % 1000}


class JpegFiles:
    """(a) for DataLoader: read, cv2 decode, albumentations crop and the same ops."""

    def __init__(self, paths):
        self.paths = paths
        self.aug = None

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import albumentations as A
        import cv2
        import torch

        if self.aug is None:
            self.aug = A.Compose([A.RandomResizedCrop(size=(224, 224)), augment()])
        with open(self.paths[i], "rb") as f:
            data = np.frombuffer(f.read(), np.uint8)
        img = cv2.cvtColor(cv2.imdecode(data, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        return {"image": torch.from_numpy(self.aug(image=img)["image"]), "label": i % 1000}


def jpeg_stream(paths, aug):
    """(d): the JPEG files as an IterableDataset, each worker its share
    (get_worker_info()); `aug`: the crop and the ops in the stream itself (DataLoader's
    way), else decoded only (the ops in stoker's map=)."""
    import torch

    class JpegStream(torch.utils.data.IterableDataset):
        def __len__(self):
            return len(paths)

        def __iter__(self):
            import cv2

            info = torch.utils.data.get_worker_info()
            w, n = (0, 1) if info is None else (info.id, info.num_workers)
            for i in range(w, len(paths), n):
                with open(paths[i], "rb") as f:
                    data = np.frombuffer(f.read(), np.uint8)
                img = cv2.cvtColor(cv2.imdecode(data, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
                if aug:
                    img = torch.from_numpy(stream_ops()(image=img)["image"])
                yield {"image": img, "label": i % 1000}

    return JpegStream()


_STREAM_OPS = threading.local()


def stream_ops():
    """(d)'s crop and ops, one Compose per thread (albumentations draws from its own)."""
    ops = getattr(_STREAM_OPS, "ops", None)
    if ops is None:
        import albumentations as A

        ops = _STREAM_OPS.ops = A.Compose([A.RandomResizedCrop(size=(224, 224)), augment()])
    return ops


def stream_map(sample, rng):
    """stoker's map for (d): the crop and the ops on the decoded image."""
    return {"image": stream_ops()(image=sample["image"])["image"], "label": sample["label"]}


def make_images(tmp, n):
    import stoker
    from make_jpegs import make_image
    from PIL import Image

    os.makedirs(tmp, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(os.path.join(tmp, "img"), fields) as w:
        for i in range(n):
            buf = io.BytesIO()
            Image.fromarray(make_image(rng)).save(buf, "JPEG", quality=90)
            p = os.path.join(tmp, f"{i:05d}.jpg")
            with open(p, "wb") as f:
                f.write(buf.getvalue())
            paths.append(p)
            w.write({"image": buf.getvalue(), "label": i % 1000})
    return paths, os.path.join(tmp, "img")


# -- (b) boxes, pure Python -------------------------------------------------------------

def box_labels(boxes, classes, w=640.0, h=480.0):
    """YOLO-style label processing written the way such code is: Python loops per box."""
    out_boxes, out_cls, out_anchor = [], [], []
    for (cx, cy, bw, bh), c in zip(boxes.tolist(), classes.tolist()):
        x0 = max(0.0, min(w, (cx - bw / 2) * w))
        y0 = max(0.0, min(h, (cy - bh / 2) * h))
        x1 = max(0.0, min(w, (cx + bw / 2) * w))
        y1 = max(0.0, min(h, (cy + bh / 2) * h))
        if x1 - x0 < 2 or y1 - y0 < 2:
            continue
        best, best_iou = 0, -1.0
        for a, (aw, ah) in enumerate(ANCHORS):
            inter = min(aw, x1 - x0) * min(ah, y1 - y0)
            iou = inter / (aw * ah + (x1 - x0) * (y1 - y0) - inter)
            if iou > best_iou:
                best, best_iou = a, iou
        out_boxes.append([x0, y0, x1, y1])
        out_cls.append(REMAP.get(int(c), int(c)))
        out_anchor.append(best)
    return (np.array(out_boxes, np.float32).reshape(-1, 4), np.array(out_cls, np.int64),
            np.array(out_anchor, np.int64))


def box_map(sample, rng):
    b, c, a = box_labels(sample["boxes"], sample["classes"])
    return {"boxes": b, "classes": c, "anchor": a}


def box_fields():
    import stoker

    return {"boxes": stoker.ndarray("float32", (None, 4)),
            "classes": stoker.ndarray("int64", (None,)),
            "anchor": stoker.ndarray("int64", (None,))}


class BoxArrays:
    """(b) for DataLoader: the same arrays in memory, the processing in __getitem__."""

    def __init__(self, boxes, classes):
        self.boxes, self.classes = boxes, classes

    def __len__(self):
        return len(self.boxes)

    def __getitem__(self, i):
        b, c, a = box_labels(self.boxes[i], self.classes[i])
        return {"boxes": b, "classes": c, "anchor": a}


def pad_collate(samples):
    """What stoker's native batching gives: padded fields and their lengths."""
    import torch

    out = {}
    for k in samples[0]:
        vals = [torch.from_numpy(s[k]) for s in samples]
        longest = max(len(v) for v in vals)
        padded = vals[0].new_zeros((len(vals), longest) + tuple(vals[0].shape[1:]))
        for i, v in enumerate(vals):
            padded[i, :len(v)] = v
        out[k] = padded
        out[k + "_lengths"] = torch.tensor([len(v) for v in vals])
    return out


def make_boxes(tmp, n):
    import stoker

    rng = np.random.default_rng(1)
    boxes = [rng.random((64, 4), dtype=np.float32) * [1, 1, 0.3, 0.3] for _ in range(n)]
    classes = [rng.integers(0, 80, 64) for _ in range(n)]
    fields = {"boxes": stoker.ndarray("float32", (None, 4)),
              "classes": stoker.ndarray("int64", (None,))}
    with stoker.ShardWriter(os.path.join(tmp, "box"), fields) as w:
        for b, c in zip(boxes, classes):
            w.write({"boxes": b.astype(np.float32), "classes": c})
    return boxes, classes, os.path.join(tmp, "box")


# -- the table --------------------------------------------------------------------------

def has_process_workers():
    import inspect

    import stoker

    return "python_workers" in inspect.signature(stoker.Loader).parameters


def configs(workload, tmp, n_images, n_boxes):
    import stoker
    import torch

    if workload in ("a", "d"):
        # imported here, as a training script imports them at its top: otherwise the
        # configurations before the first that runs the ops in this process would each
        # import them in every worker (about 0.6 s), and the first repeat's timings of
        # only those would pay it
        import albumentations  # noqa: F401
        import cv2  # noqa: F401
    out = {}
    if workload == "d":
        paths, _ = make_images(os.path.join(tmp, workload), n_images)
        out["drop-in: stoker over the IterableDataset, DataLoader's arguments"] = lambda: \
            stoker.Loader(jpeg_stream(paths, aug=True), batch_size=BATCH, num_workers=2,
                          persistent_workers=True)
        out["stoker: the ops in map= (num_workers=2)"] = lambda: stoker.Loader(
            jpeg_stream(paths, aug=False), batch_size=BATCH, num_workers=2, map=stream_map,
            stall_warning=None)
        # the same on two threads of the training process (its GIL shared), where the
        # line above runs two worker processes
        out["stoker threads: the ops in map= (python_workers='thread', 2)"] = lambda: \
            stoker.Loader(jpeg_stream(paths, aug=False), batch_size=BATCH, num_workers=2,
                          map=stream_map, python_workers="thread", stall_warning=None)
        for w in (0, 1, 2):
            out[f"DataLoader num_workers={w}"] = (lambda w=w: torch.utils.data.DataLoader(
                jpeg_stream(paths, aug=True), batch_size=BATCH, num_workers=w,
                persistent_workers=w > 0))
        return out, paths
    if workload in ("a", "c"):
        paths, ds_path = make_images(os.path.join(tmp, workload), n_images)
        ds = stoker.Dataset(ds_path)
        crop = {"image": [stoker.ops.RandomResizedCrop(224)]}
        torch_ds = JpegFiles(paths) if workload == "a" else PilFiles(paths)
        stoker_kw = dict(transforms=crop, map=aug_map if workload == "a" else pil_map)
        dl_kw = {}
        zero_kw = {}
        warm = paths + [os.path.join(ds.path, s["path"]) for s in ds.shards]
    else:
        boxes, classes, ds_path = make_boxes(tmp, n_boxes)
        ds = stoker.Dataset(ds_path)
        torch_ds = BoxArrays(boxes, classes)
        stoker_kw = dict(map=box_map, map_fields=box_fields())
        dl_kw = dict(collate_fn=pad_collate)
        zero_kw = {}  # a dict value whose length varies is padded with its lengths
        warm = [os.path.join(ds.path, s["path"]) for s in ds.shards]

    def stoker_run(**kw):
        return lambda: stoker.Loader(ds, batch_size=BATCH, shuffle=True, seed=0, num_threads=2,
                                     stall_warning=None, **stoker_kw, **kw)

    # first: the drop-in, the torch Dataset with exactly DataLoader's best arguments
    out["drop-in: stoker over the torch Dataset, DataLoader's arguments"] = lambda: \
        stoker.Loader(torch_ds, batch_size=BATCH, shuffle=True, num_workers=2,
                      persistent_workers=True, **dl_kw)
    # the default loader over a stoker dataset, no flags at all (python_workers="auto",
    # workers tuned)
    out["stoker default (no flags)"] = lambda: stoker.Loader(
        ds, batch_size=BATCH, shuffle=True, **stoker_kw)
    out["stoker threads (python_workers='thread', 2)"] = stoker_run(python_workers="thread") \
        if has_process_workers() else stoker_run()
    if has_process_workers():
        out["stoker processes (python_workers='process', 2)"] = stoker_run(
            python_workers="process")
    out["stoker over the torch Dataset (no flags)"] = lambda: stoker.Loader(
        torch_ds, batch_size=BATCH, shuffle=True, **zero_kw)
    for w in (0, 1, 2):
        out[f"DataLoader num_workers={w}"] = (lambda w=w: torch.utils.data.DataLoader(
            torch_ds, batch_size=BATCH, shuffle=True, num_workers=w,
            persistent_workers=w > 0, **dl_kw))
    return out, warm


def warm_files(paths):
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 22):
                pass


def run(workload, title, args, tmp):
    runs, warm = configs(workload, tmp, args.images, args.boxes)
    results = {name: [] for name in runs}
    for _ in range(args.repeats):  # interleaved: drift hits every configuration alike
        for name, make in runs.items():
            warm_files(warm)  # the page cache may have dropped the data since the last run
            results[name].append(timed_epochs(make, args.epochs))
    # memory: runs of their own (timed_epochs says why), as many, interleaved too: one
    # run's peak moves by a batch's memory or two with the timing of the workers' chunks
    memory = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, make in runs.items():
            warm_files(warm)
            memory[name].append(peak_pss(make, args.epochs))
    med = {}
    for name, rs in results.items():
        first_rate, rate, first, cpu = (statistics.median(r[i] for r in rs) for i in range(4))
        peak = tuple(statistics.median(m[i] for m in memory[name]) for i in range(2))
        med[name] = (first_rate, rate, first, peak, cpu)
    dl = [k for k in med if k.startswith("DataLoader")]
    best_first = max(dl, key=lambda k: med[k][0])
    best_steady = max(dl, key=lambda k: med[k][1])
    print(f"\n({workload}) {title}")
    width = max(map(len, med))
    print(f"  {'':<{width}}  {'first epoch':>11}  {'vs best DL':>10}  {'steady':>9}  "
          f"{'vs best DL':>10}  {'first batch':>11}  {'peak PSS':>9}  {'peak mem':>9}  "
          f"{'CPU/batch':>9}")
    for name, (first_rate, rate, first, (pss, mem), cpu) in med.items():
        print(f"  {name:<{width}}  {first_rate:9.0f}/s  {first_rate / med[best_first][0]:9.2f}x"
              f"  {rate:7.0f}/s  {rate / med[best_steady][1]:9.2f}x  {first:10.3f}s  "
              f"{pss / 2**20:7.0f}MB  {mem / 2**20:7.0f}MB  {cpu * 1e3:7.0f}ms")
    print(f"  best DataLoader: {best_first} (first epoch), {best_steady} (steady state)")
    return med


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="runs per configuration (median)")
    p.add_argument("--images", type=int, default=512, help="JPEGs in workload (a)")
    p.add_argument("--boxes", type=int, default=2048, help="samples in workload (b)")
    p.add_argument("--only", choices=["a", "b", "c", "d"], default=None)
    p.add_argument("--epochs", type=int, default=2,
                   help="steady-state epochs per loader, after the first")
    args = p.parse_args()
    if args.epochs < 1:
        p.error("--epochs must be at least 1")
    import torch

    torch.set_num_threads(1)  # as DataLoader's workers do: the cores are the loaders'
    # Loops that do nothing with their batches are loader-bound by construction: the rows
    # with DataLoader's arguments (no stall_warning=None) would log the stall warning
    # between the tables. Quieted here, for the whole run; the loaders' arguments stay as
    # the rows say.
    import logging

    logging.getLogger("stoker").setLevel(logging.ERROR)
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores, batch {BATCH}, medians of {args.repeats}, "
          f"Python {sys.version.split()[0]}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory(prefix="stoker-bench-python-") as tmp:
        if args.only in (None, "a"):
            run("a", f"GIL-releasing: {args.images} JPEGs, crop 224 + ColorJitter + Rotate + "
                "GaussianBlur (albumentations)", args, tmp)
        if args.only in (None, "c"):
            run("c", f"GIL-releasing: {args.images} JPEGs, crop 224 + ImageEnhance x3 + rotate "
                "+ GaussianBlur (Pillow)", args, tmp)
        if args.only in (None, "d"):
            run("d", f"an IterableDataset: {args.images} JPEGs streamed, crop 224 + ColorJitter + "
                "Rotate + GaussianBlur (albumentations)", args, tmp)
        if args.only in (None, "b"):
            run("b", f"pure Python: {args.boxes} samples x 64 boxes, per-box loops", args, tmp)


if __name__ == "__main__":
    main()
