"""DCP save/load of {"model": ..., "data": loader} on every rank (run under torchrun).

``python -m torch.distributed.run --nproc_per_node=2 roundtrip.py DATA CKPT OUT MODE``:
each rank reads 3 batches, saves a DCP checkpoint, reads the rest of the epoch (the ids a
resumed job must read); then a fresh loader and model load the checkpoint and read the
rest of the epoch. ``MODE`` is ``loader`` (the loader itself is the entry) or ``gathered``
(``GatheredState(loader)``). ``OUT/rank{R}.json`` holds the lists of ids, whether the
model's weights came back, and the checkpoint's entry keys.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

from torch_dataloader_utils import GatheredState, create_dataloader


def ids(batches: object) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]  # type: ignore[attr-defined]


def main() -> None:
    data, ckpt, out, mode = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    entry = (lambda x: x) if mode == "loader" else GatheredState
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    loader, _ = create_dataloader(data, batch_size=10, shuffle=True, num_workers=2)
    assert isinstance(loader, Stateful)
    torch.manual_seed(0)  # the same model on every rank, as DDP keeps it
    model = torch.nn.Linear(2, 2)
    it = iter(loader)
    seen = ids(next(it) for _ in range(3))
    dcp.save({"model": model, "data": entry(loader)}, checkpoint_id=ckpt)
    expected = ids(it)
    weights = [p.detach().clone() for p in model.parameters()]

    fresh, _ = create_dataloader(data, batch_size=10, shuffle=True, num_workers=2)
    torch.manual_seed(1)
    fresh_model = torch.nn.Linear(2, 2)
    dcp.load({"model": fresh_model, "data": entry(fresh)}, checkpoint_id=ckpt)
    resumed = ids(fresh)
    same = all(torch.equal(a, b) for a, b in zip(weights, fresh_model.parameters(), strict=True))
    keys = sorted(dcp.FileSystemReader(ckpt).read_metadata().state_dict_metadata)
    (out / f"rank{rank}.json").write_text(
        json.dumps({"seen": seen, "expected": expected, "resumed": resumed, "weights": same, "keys": keys})
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
