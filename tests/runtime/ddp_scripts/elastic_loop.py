"""Elastic order under torchrun: every rank's batch ``t`` gathered into global batch ``t``.

    python elastic_loop.py DATA_DIR OUT_DIR [STATE_FILE]

Each rank reads with ``canonical_ranks=6`` and a global batch of 24 rows (``batch_size =
24 / world``), ranks with different ``num_workers``. Rank 0 writes the global batches
(sorted ids) to OUT_DIR/batches.json. Without STATE_FILE, the merged state after 5
batches is written to OUT_DIR/state.json; with it, the ranks resume from it first.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from torch_dataloader_utils import StructuredDataset, gather_state

CANONICAL, GLOBAL_BATCH, SAVE_AFTER = 6, 24, 5


def main(data: str, out: Path, state_file: str | None) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    world, rank = dist.get_world_size(), dist.get_rank()
    loader, _ = StructuredDataset.create_dataloader(
        data,
        batch_size=GLOBAL_BATCH // world,
        canonical_ranks=CANONICAL,
        shuffle=True,
        shuffle_seed=4,
        split_rows=50,
        num_workers=2 if rank == 0 else 1,
    )
    if state_file is not None:
        loader.load_state_dict(json.loads(Path(state_file).read_text()))
    batches = []
    for step, batch in enumerate(loader, start=1):
        parts: list[list[int] | None] = [None] * world
        dist.all_gather_object(parts, batch["id"].tolist())
        batches.append(sorted(i for part in parts for i in part or []))
        if state_file is None and step == SAVE_AFTER:
            state = gather_state(loader)
            if rank == 0:
                (out / "state.json").write_text(json.dumps(state))
    if rank == 0:
        (out / "batches.json").write_text(json.dumps({"world": world, "batches": batches}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
