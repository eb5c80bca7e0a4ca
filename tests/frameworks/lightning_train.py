"""A Lightning training run over a stoker.Loader, as a user writes it; every rank records
the labels of each batch it trains on (for tests/test_frameworks.py).

    python lightning_train.py DATASET OUT [--devices 2] [--max-epochs 3] [--max-steps N]
                              [--ckpt-dir DIR] [--every-n-steps K] [--resume CKPT] [--reload]
"""

import argparse
import json
import os

import lightning as L
import stoker
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

p = argparse.ArgumentParser()
p.add_argument("dataset")
p.add_argument("out")
p.add_argument("--devices", type=int, default=1)
p.add_argument("--max-epochs", type=int, default=3)
p.add_argument("--max-steps", type=int, default=-1)
p.add_argument("--ckpt-dir")
p.add_argument("--every-n-steps", type=int, default=0)
p.add_argument("--resume")
p.add_argument("--reload", action="store_true",
               help="a new Loader per epoch (reload_dataloaders_every_n_epochs=1)")
args = p.parse_args()


def make_loader():
    # rank and world_size are not given: they come from the process group Lightning
    # creates later, when the loader is iterated
    return stoker.Loader(stoker.Dataset(args.dataset), batch_size=4, shuffle=True, seed=3,
                         num_threads=1)


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(48, 1)
        self.seen = []

    def training_step(self, batch, batch_idx):
        self.seen.append([self.current_epoch, batch["label"].tolist()])
        return self.layer(batch["x"].float().flatten(1)).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return make_loader()


callbacks = []
if args.ckpt_dir:
    callbacks.append(ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.every_n_steps,
                                     save_top_k=-1, filename="{step}"))
trainer = L.Trainer(accelerator="cpu", devices=args.devices,
                    strategy="ddp" if args.devices > 1 else "auto",
                    max_epochs=args.max_epochs, max_steps=args.max_steps, logger=False,
                    enable_checkpointing=bool(callbacks), callbacks=callbacks,
                    enable_progress_bar=False, enable_model_summary=False,
                    reload_dataloaders_every_n_epochs=1 if args.reload else 0)
model = Model()
if args.reload:
    trainer.fit(model, ckpt_path=args.resume)
else:
    trainer.fit(model, train_dataloaders=make_loader(), ckpt_path=args.resume)
with open(f"{args.out}.{trainer.global_rank}", "w") as f:
    json.dump({"rank": trainer.global_rank, "world": trainer.world_size, "seen": model.seen,
               "pid": os.getpid()}, f)
