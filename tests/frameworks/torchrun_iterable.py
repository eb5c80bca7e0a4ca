"""torchrun with gloo over a webdataset-style IterableDataset that splits itself by rank
(RANK/WORLD_SIZE, as webdataset's split_by_node reads them) and by worker
(get_worker_info()): what each rank reads with DataLoader and with stoker.Loader given
DataLoader's arguments, and with stoker's own rank split (even_batches=True) over a
dataset that does not split itself (for tests/test_iterable_dataset.py).

    torchrun --nproc_per_node=2 torchrun_iterable.py OUT
"""

import json
import os
import sys
import warnings

import stoker
import torch
import torch.distributed as dist

N, SHARDS = 203, 7


class Shards(torch.utils.data.IterableDataset):
    """N samples in SHARDS shards; each rank reads its shards, each worker its part."""

    def __init__(self, split=True, ask_dist=False):
        self.split, self.ask_dist = split, ask_dist

    def __iter__(self):
        shards = [list(range(s, N, SHARDS)) for s in range(SHARDS)]
        if self.split:
            if self.ask_dist:  # the dataset's own torch.distributed calls
                rank, world = dist.get_rank(), dist.get_world_size()
            else:
                rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            shards = shards[rank::world]
        info = torch.utils.data.get_worker_info()
        if info is not None:
            shards = shards[info.id::info.num_workers]
        for shard in shards:
            yield from shard


def _seen(loader):
    return [b.tolist() for b in loader]


out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
res = {"rank": rank}
res["dataloader"] = _seen(torch.utils.data.DataLoader(Shards(), batch_size=8, num_workers=2))
res["stoker"] = _seen(stoker.Loader(Shards(), batch_size=8, num_workers=2))
res["stoker_0"] = _seen(stoker.Loader(Shards(), batch_size=8, num_workers=0))
# stoker's own split, asked for: over a dataset that does not split itself
res["even"] = _seen(stoker.Loader(Shards(split=False), batch_size=8, num_workers=2,
                                  even_batches=True))
# both splitting: said
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    _seen(stoker.Loader(Shards(ask_dist=True), batch_size=8, num_workers=2, even_batches=True))
res["warned"] = [str(w.message) for w in caught if "splits itself" in str(w.message)]
dist.barrier()
with open(f"{out}.{rank}", "w") as f:
    json.dump(res, f)
dist.destroy_process_group()
