"""torchrun with gloo: a scheduled stoker.Mix whose loader is built before
init_process_group switches its weights at the schedule's step, counted in batches of the
whole job (for tests/test_frameworks.py).

    torchrun --nproc_per_node=2 torchrun_mix_schedule.py DATASET_A DATASET_B OUT
"""

import json
import sys

import stoker
import torch.distributed as dist

a, b, out = sys.argv[1:4]
mix = stoker.Mix({"a": stoker.Dataset(a), "b": stoker.Dataset(b)},
                 weights=[(0, {"a": 1, "b": 0}), (20, {"a": 0, "b": 1})], samples_per_epoch=400)
loader = stoker.Loader(mix, batch_size=4, shuffle=True, seed=0, num_threads=1)  # 1 rank yet
dist.init_process_group("gloo")
rank = dist.get_rank()
sources = [sorted(set(batch["source"].tolist())) for batch in loader]
dist.barrier()
with open(f"{out}.{rank}", "w") as f:
    json.dump({"rank": rank, "sources": sources, "batches": len(loader)}, f)
dist.destroy_process_group()
