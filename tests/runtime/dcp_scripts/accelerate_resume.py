"""Accelerate's save_state / load_state with GatheredState: killed mid-epoch, resumed (2 processes).

``accelerate launch ... accelerate_resume.py DATA OUT PHASE``. Phase ``first`` trains 4
batches per rank, saves the state (model, optimizer, loader), trains 2 more and is killed
(``os._exit``). Phase ``resumed`` loads the state and trains the rest of epoch 0 and all of
epoch 1. Each rank appends ``{"phase", "epoch", "ids"}`` lines to ``OUT/rank{R}.jsonl``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

from torch_dataloader_utils import GatheredState, create_dataloader

SAVE_AFTER, KILL_AFTER = 4, 6


def main() -> None:
    data, out, phase = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    accelerator = Accelerator(cpu=True)
    loader, dataset = create_dataloader(data, batch_size=16, shuffle=True, num_workers=2)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(GatheredState(loader))
    state_dir = out / "state"
    log = out / f"rank{accelerator.process_index}.jsonl"
    start_epoch = 0
    if phase == "resumed":
        accelerator.load_state(str(state_dir))
        start_epoch = dataset.epoch
    for epoch in range(start_epoch, 2):
        dataset.set_epoch(epoch)
        for step, batch in enumerate(loader):
            with open(log, "a") as f:
                f.write(json.dumps({"phase": phase, "epoch": epoch, "ids": batch["id"].tolist()}) + "\n")
            loss = model(batch["x"].float().unsqueeze(1)).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if phase == "first" and step + 1 == SAVE_AFTER:
                accelerator.save_state(str(state_dir))
            if phase == "first" and step + 1 == KILL_AFTER:
                accelerator.wait_for_everyone()
                os._exit(0)


if __name__ == "__main__":
    main()
