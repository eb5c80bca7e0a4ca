"""Training and evaluation with HuggingFace accelerate over stoker.Loader, as a user writes
them; run under torchrun (for tests/test_frameworks.py).

    torchrun --nproc_per_node=2 accelerate_train.py DATASET EVALSET OUT
"""

import json
import sys

import stoker
import torch
from accelerate import Accelerator

dataset, evalset, out = sys.argv[1:4]
# made before the Accelerator (and its process group): ranks resolve when iterated
loader = stoker.Loader(dataset, batch_size=4, shuffle=True, seed=5, num_threads=1)
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
        labels.append(batch["label"].tolist())
        if epoch == 1 and step == 2:
            accelerator.save_state(out + ".state")  # mid-epoch checkpoint
    result["epochs"].append(labels)

# resume from the mid-epoch checkpoint into a fresh loader: the rest of epoch 1
fresh = stoker.Loader(dataset, batch_size=4, shuffle=True, seed=5, num_threads=1)
accelerator._custom_objects.clear()
accelerator.register_for_checkpointing(fresh)
accelerator.load_state(out + ".state")
result["resumed"] = [b["label"].tolist() for b in fresh]
result["skipped"] = [b["label"].tolist() for b in fresh.skip(2)]  # epoch 2 from batch 2

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
