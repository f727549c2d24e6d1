"""A Lightning fit that records the ids it trains on; killed at a step, or resumed from a checkpoint.

Run as ``python fit.py DATA OUT DEVICES [--kill-at STEP | --resume CKPT]``. With 2 devices
Lightning's DDP launcher starts rank 1 by running this script again. Each rank appends
``{"phase", "epoch", "step", "ids"}`` lines to ``OUT/rank{R}.jsonl`` for every batch; a fit
that ends writes the warnings it raised to ``OUT/warnings-{phase}-rank{R}.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from torch_dataloader_utils.lightning import StructuredDataModule


class Model(pl.LightningModule):
    def __init__(self, out: Path, phase: str) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.out = out
        self.phase = phase

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        line = {
            "phase": self.phase,
            "epoch": self.current_epoch,
            "step": self.global_step,
            "ids": batch["id"].tolist(),
        }
        with open(self.out / f"rank{self.global_rank}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        return self.layer(batch["x"].float().unsqueeze(1)).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Kill(Callback):
    """Ends every process at once after ``step`` optimizer steps, as a preemption does."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step >= self.step:
            sys.stdout.flush()
            os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out", type=Path)
    parser.add_argument("devices", type=int)
    parser.add_argument("--kill-at", type=int)
    parser.add_argument("--resume")
    parser.add_argument("--every", type=int, default=5)
    args = parser.parse_args()
    phase = "resumed" if args.resume else "first"
    data = StructuredDataModule(args.data, batch_size=16, shuffle=True, shuffle_seed=3, num_workers=2)
    checkpoints = ModelCheckpoint(
        dirpath=args.out / "ckpt", filename="{step}", every_n_train_steps=args.every, save_top_k=-1
    )
    callbacks: list[Callback] = [checkpoints]
    if args.kill_at is not None:
        callbacks.append(Kill(args.kill_at))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=2,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Model(args.out, phase), datamodule=data, ckpt_path=args.resume)
    shown = [f"{w.category.__name__}: {w.message}" for w in caught]
    (args.out / f"warnings-{phase}-rank{trainer.global_rank}.json").write_text(json.dumps(shown))


if __name__ == "__main__":
    main()
