"""A DDP-style job with a training ledger: it writes out every batch, checkpoints, is killed, resumes.

    python train.py DATA_DIR OUT_DIR first   # 2 ranks: save every EVERY batches, then slow down
    python train.py DATA_DIR OUT_DIR second  # 3 ranks: resume from the last step all ranks saved

Every batch the loop receives is appended to ``batches_rank<R>.jsonl`` as ``{"step", "id",
"x"}`` (the trainer's step: the checkpoint's step, counted on), so the test can compare
what the ledger replays with what the job saw.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from torch_dataloader_utils import StructuredDataset, merge_states

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "runtime", "ddp_scripts")
)
from resume_loop import last_complete_step, save  # the resume test's checkpoint helpers

EVERY = 4
OPTIONS = {"batch_size": 24, "split_rows": 150, "shuffle": True, "shuffle_seed": 5, "row_interleave": 64}


def main() -> None:
    data, out, phase = sys.argv[1:4]
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    workers = 2 if phase == "first" else rank % 3
    loader, dataset = StructuredDataset.create_dataloader(
        data, num_workers=workers, ledger=os.path.join(out, "ledger"), **OPTIONS
    )
    step = 0
    if phase == "second":
        step = last_complete_step(out, 2)
        states = []
        for r in range(2):
            with open(os.path.join(out, f"step{step}_rank{r}.json")) as f:
                states.append(json.load(f)["state"])
        loader.load_state_dict(merge_states(states))
    else:
        dataset.set_epoch(1)
    epochs = [dataset.epoch] if phase == "first" else [dataset.epoch, dataset.epoch + 1]
    with open(os.path.join(out, f"batches_{phase}_rank{rank}.jsonl"), "a") as written:
        for epoch in epochs:
            dataset.set_epoch(epoch)
            for batch in loader:
                one = torch.ones(1)
                dist.all_reduce(one)  # lockstep, like DDP's gradient sync
                written.write(
                    json.dumps({"step": step, "id": batch["id"].tolist(), "x": batch["x"].tolist()}) + "\n"
                )
                written.flush()
                step += 1
                if phase == "first":
                    if step % EVERY == 0:
                        save(os.path.join(out, f"step{step}_rank{rank}.json"), {"state": loader.state_dict()})
                    if step == 2 * EVERY:
                        save(os.path.join(out, f"ready_rank{rank}"), {})
                    if step > 2 * EVERY:
                        time.sleep(1.0)  # the test kills the job here, between checkpoints
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
