"""A Lightning run over stoker.Loaders, as a user writes it; every rank records the labels
of each batch it trains on, validates, tests and predicts (for tests/test_frameworks.py).

    python lightning_train.py DATASET OUT [--devices 2] [--max-epochs 3] [--max-steps N]
                              [--ckpt-dir DIR] [--every-n-steps K] [--resume CKPT] [--reload]
                              [--val EVALSET] [--val-check-interval F] [--limit-val-batches N]
                              [--evaluate] [--batch-size B] [--map]
"""

import argparse
import hashlib
import json
import os

import lightning as L
import numpy as np
import stoker
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

p = argparse.ArgumentParser()
p.add_argument("dataset")
p.add_argument("out")
p.add_argument("--devices", type=int, default=1)
p.add_argument("--max-epochs", type=int, default=3)
p.add_argument("--max-steps", type=int, default=-1)
p.add_argument("--batch-size", type=int, default=4)
p.add_argument("--ckpt-dir")
p.add_argument("--every-n-steps", type=int, default=0)
p.add_argument("--resume")
p.add_argument("--reload", action="store_true",
               help="a new Loader per epoch (reload_dataloaders_every_n_epochs=1)")
p.add_argument("--val", help="a validation (and test, predict) dataset")
p.add_argument("--val-check-interval", type=float, default=1.0)
p.add_argument("--limit-val-batches", type=int, default=None)
p.add_argument("--evaluate", action="store_true",
               help="after fit: trainer.validate, trainer.test, trainer.predict")
p.add_argument("--map", action="store_true",
               help="a Python stage in the training loader: map and batch_map with draws")
args = p.parse_args()


def jitter(sample, rng):
    # per-sample noise from the sample's generator: a resumed run must draw the same
    noise = rng.integers(-3, 4, sample["x"].shape)
    x = np.clip(sample["x"].astype(np.int16) + noise, 0, 255).astype(np.uint8)
    return {"x": x, "label": sample["label"]}


def tag(batch, rng):
    batch["tag"] = torch.from_numpy(rng.integers(0, 2**31, len(batch["label"])))
    return batch


def make_loader():
    # rank and world_size are not given: they come from the process group Lightning
    # creates later, when the loader is iterated
    hooks = dict(map=jitter, batch_map=tag) if args.map else {}
    return stoker.Loader(stoker.Dataset(args.dataset), batch_size=args.batch_size, shuffle=True,
                         seed=3, num_threads=1, **hooks)


def eval_loader():
    # evaluation: every sample once across ranks, a rank's last batch possibly shorter
    return stoker.Loader(args.val, batch_size=5, even_batches=False, num_threads=1)


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(48, 1)
        self.seen = []
        self.runs = 0  # evaluation runs so far: each one's batches are told apart
        self.rows = []  # a content hash of every row trained on

    def training_step(self, batch, batch_idx):
        self.seen.append([self.current_epoch, batch["label"].tolist()])
        # a row's hash is that of its pixels alone (tests compare it with hashes of the
        # written samples), with batch_map's tag appended only where there is one
        tags = [str(t).encode() for t in batch["tag"].tolist()] if "tag" in batch \
            else [b""] * len(batch["x"])
        self.rows += [hashlib.sha1(x.numpy().tobytes() + t).hexdigest()
                      for x, t in zip(batch["x"], tags)]
        return self.layer(batch["x"].float().flatten(1)).mean()

    def _eval(self, kind, batch):
        if self.trainer.sanity_checking:
            kind = "sanity"
        self.seen.append([kind, self.runs, batch["label"].tolist()])
        return self.layer(batch["x"].float().flatten(1)).mean()

    def on_validation_start(self):
        self.runs += 1

    def on_test_start(self):
        self.runs += 1

    def on_predict_start(self):
        self.runs += 1

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._eval("val", batch), batch_size=len(batch["label"]),
                 sync_dist=True)

    def test_step(self, batch, batch_idx):
        self._eval("test", batch)

    def predict_step(self, batch, batch_idx):
        return self._eval("predict", batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return make_loader()

    def val_dataloader(self):
        return eval_loader()

    def test_dataloader(self):
        return eval_loader()

    def predict_dataloader(self):
        return eval_loader()


if not args.val:  # no evaluation hooks at all, as in a training-only module
    for name in ("validation_step", "test_step", "predict_step", "val_dataloader",
                 "test_dataloader", "predict_dataloader"):
        delattr(Model, name)

callbacks = []
if args.ckpt_dir:
    callbacks.append(ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.every_n_steps,
                                     save_top_k=-1, filename="{step}"))
trainer = L.Trainer(accelerator="cpu", devices=args.devices,
                    strategy="ddp" if args.devices > 1 else "auto",
                    max_epochs=args.max_epochs, max_steps=args.max_steps, logger=False,
                    enable_checkpointing=bool(callbacks), callbacks=callbacks,
                    enable_progress_bar=False, enable_model_summary=False,
                    val_check_interval=args.val_check_interval,
                    limit_val_batches=args.limit_val_batches,
                    reload_dataloaders_every_n_epochs=1 if args.reload else 0)
model = Model()
if args.reload:
    trainer.fit(model, ckpt_path=args.resume)
else:
    trainer.fit(model, train_dataloaders=make_loader(), ckpt_path=args.resume)
if args.evaluate:
    trainer.validate(model)
    trainer.test(model)
    trainer.predict(model)
with open(f"{args.out}.{trainer.global_rank}", "w") as f:
    json.dump({"rank": trainer.global_rank, "world": trainer.world_size, "seen": model.seen,
               "rows": model.rows, "pid": os.getpid()}, f)
