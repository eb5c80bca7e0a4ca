"""torchrun with gloo over a map-style torch Dataset (no stoker dataset at all), with a
map= that uses its rng: each rank's share, batches and draws (for tests/test_python_stage.py).

    torchrun --nproc_per_node=2 torchrun_python_dataset.py OUT
"""

import json
import sys

import stoker
import torch
import torch.distributed as dist


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 45

    def __getitem__(self, i):
        return {"i": i, "x": torch.full((3,), float(i))}


def jitter(sample, rng):
    return {"i": sample["i"], "x": sample["x"] + float(rng.random())}


out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
loader = stoker.Loader(Items(), batch_size=4, shuffle=True, seed=7, map=jitter, num_threads=2)
seen = []
for epoch in range(2):
    loader.set_epoch(epoch)
    seen.append([{"i": b["i"].tolist(), "x": b["x"][:, 0].tolist()} for b in loader])
dist.barrier()
with open(f"{out}.{rank}", "w") as f:
    json.dump({"rank": rank, "world": dist.get_world_size(), "len": len(loader),
               "epochs": seen}, f)
dist.destroy_process_group()
