"""torchrun with gloo: a loader built before init_process_group shards by the group's
rank once it exists, and a world that changes under a running epoch is an error
(for tests/test_frameworks.py).

    torchrun --nproc_per_node=2 torchrun_world.py DATASET OUT
"""

import json
import sys

import stoker
import torch.distributed as dist

dataset, out = sys.argv[1:3]
loader = stoker.Loader(dataset, batch_size=5, shuffle=True, seed=1, num_threads=1)
before = len(loader)  # no process group yet: the whole dataset
running = iter(loader)
next(running)  # an epoch running at world size 1
dist.init_process_group("gloo")
rank = dist.get_rank()
try:
    next(running)
    changed = None
except RuntimeError as e:
    changed = str(e)
labels = [b["label"].tolist() for b in loader]
dist.barrier()
with open(f"{out}.{rank}", "w") as f:
    json.dump({"rank": rank, "before": before, "after": len(loader), "labels": labels,
               "changed": changed}, f)
dist.destroy_process_group()
