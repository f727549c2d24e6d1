"""A DDP-style loop that checkpoints its data state, is killed, and resumes elsewhere.

    python resume_loop.py DATA_DIR OUT_DIR first   # save every EVERY batches, then slow down
    python resume_loop.py DATA_DIR OUT_DIR second  # resume from the last step all ranks saved

Each rank saves ``step<S>_rank<R>.json`` (atomically: write, then rename) holding its
loader state and the ids it consumed so far, as a training job saves a checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from torch_dataloader_utils import StructuredDataset, gather_state, merge_states

EVERY = 4
OPTIONS = {
    "batch_size": 32,
    "split_rows": 150,
    "shuffle": True,
    "shuffle_seed": 11,
    "row_shuffle_window": 400,
}


def save(path: str, value: object) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def last_complete_step(out: str, world: int) -> int:
    steps: dict[int, int] = {}
    for name in os.listdir(out):
        if m := re.fullmatch(r"step(\d+)_rank\d+\.json", name):
            steps[int(m.group(1))] = steps.get(int(m.group(1)), 0) + 1
    return max(s for s, n in steps.items() if n == world)


def main() -> None:
    data, out, phase = sys.argv[1:4]
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, _world = dist.get_rank(), dist.get_world_size()
    workers = 2 if phase == "first" else rank + 1
    loader, dataset = StructuredDataset.create_dataloader(data, num_workers=workers, **OPTIONS)
    dataset.set_epoch(1)
    seen: list[int] = []
    if phase == "second":
        with open(os.path.join(out, "first_world.txt")) as f:
            first_world = int(f.read())
        step = last_complete_step(out, first_world)
        states = []
        for r in range(first_world):
            with open(os.path.join(out, f"step{step}_rank{r}.json")) as f:
                states.append(json.load(f)["state"])
        loader.load_state_dict(merge_states(states))
    expected = loader.remaining_batches
    batches = 0
    for batch in loader:
        one = torch.ones(1)
        dist.all_reduce(one)  # lockstep, like DDP's gradient sync
        seen.extend(batch["id"].tolist())
        batches += 1
        if phase == "first":
            if batches % EVERY == 0:
                save(
                    os.path.join(out, f"step{batches}_rank{rank}.json"),
                    {"state": loader.state_dict(), "ids": seen},
                )
            if batches == 2 * EVERY:
                save(os.path.join(out, f"ready_rank{rank}"), {})
            if batches > 2 * EVERY:
                time.sleep(1.0)  # the test kills the job here, between checkpoints
        elif batches == 3:
            gathered = gather_state(loader)
            if rank == 0:
                save(os.path.join(out, "gathered.json"), gathered)
    if phase == "second":
        save(os.path.join(out, f"second_rank{rank}.json"), {"ids": seen, "batches": batches, "len": expected})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
