"""transformers' Trainer over a stoker token loader, as docs/frameworks.md's recipe writes
it: a tiny GPT-2 (random weights, no download). It records the rows of every batch it
trains on; --kill-at N kills the process (SIGKILL) after step N, a checkpoint having been
saved before; --resume CKPT resumes (for tests/test_frameworks.py).

    python hf_trainer.py TOKENS OUTDIR RECORD [--save-steps K] [--kill-at N] [--resume CKPT]
"""

import argparse
import json
import os
import signal

import stoker
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("tokens")
p.add_argument("output_dir")
p.add_argument("record")
p.add_argument("--save-steps", type=int, default=1000)
p.add_argument("--kill-at", type=int, default=0)
p.add_argument("--resume")
p.add_argument("--labels", default="unshifted")
args = p.parse_args()


class StokerTrainer(Trainer):
    def get_train_dataloader(self):
        return stoker.Loader(stoker.TokenDataset(args.tokens, dtype="uint16"), batch_size=2,
                             seq_len=16, shuffle=True, seed=self.args.seed, num_threads=1,
                             labels=args.labels)

    def training_step(self, model, inputs, num_items_in_batch=None):
        seen.append(inputs["input_ids"].tolist())
        return super().training_step(model, inputs, num_items_in_batch)


class KillAfter(TrainerCallback):
    def on_step_end(self, targs, state, control, **kwargs):
        if state.global_step == args.kill_at:
            save()
            os.kill(os.getpid(), signal.SIGKILL)  # no clean shutdown: as a lost machine


def save():
    with open(args.record, "w") as f:
        json.dump(seen, f)


seen = []
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1,
                                   n_head=2))
targs = TrainingArguments(args.output_dir, num_train_epochs=2, gradient_accumulation_steps=2,
                          learning_rate=1e-3, save_steps=args.save_steps, logging_steps=1000,
                          report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
trainer = StokerTrainer(model=model, args=targs, callbacks=[KillAfter()])
trainer.train(resume_from_checkpoint=args.resume)
save()
