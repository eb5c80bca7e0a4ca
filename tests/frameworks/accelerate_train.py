"""Training and evaluation with HuggingFace accelerate over stoker.Loader, as a user writes
them; run under torchrun (for tests/test_frameworks.py).

    torchrun --nproc_per_node=2 accelerate_train.py DATASET EVALSET OUT [map]

With ``map``, the training loader has a Python stage (map drawing per-sample noise), and
each batch's pixel sum is recorded with its labels.
"""

import json
import sys

import numpy as np
import stoker
import torch
from accelerate import Accelerator

dataset, evalset, out = sys.argv[1:4]
with_map = sys.argv[4:] == ["map"]


def jitter(sample, rng):
    x = sample["x"].astype(np.int64) + rng.integers(0, 1000, sample["x"].shape)
    return {"x": x, "label": sample["label"]}


def train_loader():
    hooks = dict(map=jitter, num_threads=2) if with_map else dict(num_threads=1)
    return stoker.Loader(dataset, batch_size=4, shuffle=True, seed=5, **hooks)


def seen(batch):
    if with_map:
        return [batch["label"].tolist(), int(batch["x"].sum())]
    return batch["label"].tolist()


# made before the Accelerator (and its process group): ranks resolve when iterated
loader = train_loader()
accelerator = Accelerator(cpu=True)
rank, world = accelerator.process_index, accelerator.num_processes
model = torch.nn.Linear(48, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = accelerator.prepare(model, optimizer)
accelerator.register_for_checkpointing(loader)  # the one line: loader state in save_state

result = {"rank": rank, "world": world, "epochs": [], "resumed": None}
for epoch in range(2):
    loader.set_epoch(epoch)
    labels = []
    for step, batch in enumerate(loader):
        loss = model(batch["x"].float().flatten(1)).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        labels.append(seen(batch))
        if epoch == 1 and step == 2:
            accelerator.save_state(out + ".state")  # mid-epoch checkpoint
    result["epochs"].append(labels)

# resume from the mid-epoch checkpoint into a fresh loader: the rest of epoch 1
fresh = train_loader()
accelerator._custom_objects.clear()
accelerator.register_for_checkpointing(fresh)
accelerator.load_state(out + ".state")
result["resumed"] = [seen(b) for b in fresh]
result["skipped"] = [seen(b) for b in fresh.skip(2)]  # epoch 2 from batch 2

# evaluation: every sample exactly once across ranks
evaluator = stoker.Loader(evalset, batch_size=10, even_batches=False, num_threads=1)
gathered = []
for batch in evaluator:
    preds = (batch["label"] * 10).tolist()  # stands for a model's outputs
    # a rank's last batch may be shorter (or empty): gather as objects, not as tensors
    gathered += accelerator.gather_for_metrics(preds, use_gather_object=True)
result["eval"] = gathered
result["eval_batches"] = len(evaluator)
with open(f"{out}.{rank}", "w") as f:
    json.dump(result, f)
