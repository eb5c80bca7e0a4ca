"""accelerate's save_state/load_state with a stoker loader, resumed at another world size
(for tests/test_frameworks.py): "save K" trains K batches of epoch 0 and saves the state;
"resume" (under torchrun, any number of processes) loads it and trains the rest of the
epoch. Every process writes the labels it trained on to OUT.<rank>.

    python accelerate_elastic.py DATASET STATE OUT save K
    torchrun --nproc_per_node=2 accelerate_elastic.py DATASET STATE OUT resume
"""

import json
import sys

import stoker
import torch
from accelerate import Accelerator

dataset, state, out, mode = sys.argv[1:5]
loader = stoker.Loader(dataset, batch_size=4, shuffle=True, seed=7, num_threads=1)
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(48, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = accelerator.prepare(model, optimizer)
accelerator.register_for_checkpointing(loader)
if mode == "resume":
    accelerator.load_state(state)
labels = []
for step, batch in enumerate(loader):
    accelerator.backward(model(batch["x"].float().flatten(1)).mean())
    optimizer.step()
    optimizer.zero_grad()
    labels += batch["label"].tolist()
    if mode == "save" and step + 1 == int(sys.argv[5]):
        accelerator.save_state(state)  # mid-epoch: the batches yielded so far are done
        break
with open(f"{out}.{accelerator.process_index}", "w") as f:
    json.dump({"labels": labels, "world": accelerator.num_processes}, f)
