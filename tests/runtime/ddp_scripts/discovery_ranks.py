"""Metadata read by every rank, launched by torchrun in the tests.

    python discovery_ranks.py DATA_DIR CORRUPT_DIR MISMATCH_DIR OUT_DIR

Every rank builds the dataset over ``latency://DATA_DIR`` (requests counted per rank),
records a digest of the metadata table it ended with and the ids it reads; then builds
datasets over directories where one file in another rank's share is corrupt, or has
another schema, and records the error it got. A final all_reduce proves every rank came
through (none left waiting in a collective). Each rank writes OUT_DIR/rank<N>.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # testsupport/

import testsupport.latency_fs as latency
import torch
import torch.distributed as dist

from torch_dataloader_utils import DataLoaderUtilsError, StructuredDataset
from torch_dataloader_utils.discovery.metadata import to_ipc


def digest(dataset: StructuredDataset) -> str:
    table = dataset.discovered.metadata
    assert table is not None
    return hashlib.sha256(to_ipc(table)).hexdigest()


def error_of(url: str) -> list[str] | None:
    try:
        StructuredDataset(url, storage_options={"stats_key": uuid.uuid4().hex})
    except DataLoaderUtilsError as exc:
        return [type(exc).__name__, str(exc)]
    return None


def main() -> None:
    data, corrupt, mismatch, out = sys.argv[1:5]
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    key = uuid.uuid4().hex
    dataset = StructuredDataset(
        f"latency://{data}", storage_options={"stats_key": key}, split_rows=300, equal_batches="off"
    )
    requests = latency.stats(key).requests
    ids = [int(i) for batch in dataset for i in batch["id"].tolist()]
    result = {
        "rank": rank,
        "world": world,
        "requests": requests,
        "digest": digest(dataset),
        "files": [f.path for f in dataset.files],
        "ids": ids,
        "corrupt": error_of(f"latency://{corrupt}"),
        "mismatch": error_of(f"latency://{mismatch}"),
    }
    one = torch.ones(1)
    dist.all_reduce(one)  # every rank is still in step after the errors
    result["all_reduce"] = int(one.item())
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
