"""DCP checkpoints of a 2-rank job resumed by a 3-rank job (run under torchrun).

``python -m torch.distributed.run --nproc_per_node=N resize.py DATA CKPT OUT PHASE``:
``save`` (2 ranks) reads 3 batches per rank and saves two checkpoints, ``CKPT/loader``
with the loader itself as the entry and ``CKPT/gathered`` with ``GatheredState(loader)``;
``load`` (3 ranks) loads ``CKPT/loader`` (a rank the saving job did not have has no entry:
the error is recorded) and then ``CKPT/gathered``, and reads the rest of the epoch.
``OUT/{phase}{R}.json`` holds the ids read and the error.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from torch_dataloader_utils import GatheredState, create_dataloader
from torch_dataloader_utils.config import PADDING_COLUMN


def ids(batches: object) -> list[int]:
    """The ids of the batches, rows flagged as padding left out."""
    out = []
    for b in batches:  # type: ignore[attr-defined]
        pad = b.get(PADDING_COLUMN)
        out += [int(i) for k, i in enumerate(b["id"]) if pad is None or not pad[k]]
    return out


def main() -> None:
    data, ckpt, out, phase = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    # pad: the rows a 3-rank job cannot deal out evenly arrive as well (flagged padding fills in)
    loader, _ = create_dataloader(data, batch_size=10, shuffle=True, num_workers=0, equal_batches="pad")
    record: dict[str, object] = {}
    if phase == "save":
        it = iter(loader)
        record["seen"] = ids(next(it) for _ in range(3))
        dcp.save({"data": loader}, checkpoint_id=str(ckpt / "loader"))
        dcp.save({"data": GatheredState(loader)}, checkpoint_id=str(ckpt / "gathered"))
    else:
        try:
            dcp.load({"data": loader}, checkpoint_id=str(ckpt / "loader"))
        except CheckpointException as exc:  # a BaseException: what DCP raises is the record
            record["error"] = f"{type(exc).__name__}: {exc}"
        dcp.load({"data": GatheredState(loader)}, checkpoint_id=str(ckpt / "gathered"))
        record["resumed"] = ids(loader)
    (out / f"{phase}{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
