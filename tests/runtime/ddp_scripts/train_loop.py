"""A DDP-style training loop launched by torchrun or accelerate in the tests.

    python train_loop.py DATA_DIR OUT_DIR (torchrun|accelerate|accelerate-prepared)

Every batch does one all_reduce, as a DDP backward pass would: a rank that runs out of
batches early would leave the others waiting until the (short) process-group timeout.
Each rank writes what it read to OUT_DIR/rank<N>.json for the test to check.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from torch_dataloader_utils import StructuredDataset, gather_metrics
from torch_dataloader_utils.errors import DistributedConfigError

TIMEOUT = timedelta(seconds=30)
BATCH_SIZE = 64
CONFIGS = [  # (name, options, epochs)
    ("drop", {"shuffle": True, "shuffle_seed": 3}, [0, 1]),
    ("pad", {"equal_batches": "pad"}, [0]),
]


def local_rank_check(data: str) -> str | None:
    """Before the group exists: passing LOCAL_RANK as the rank must be refused."""
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if rank == local:
        return None
    try:
        StructuredDataset(data, num_ranks=int(os.environ["WORLD_SIZE"]), rank=local)
    except DistributedConfigError as exc:
        return str(exc)
    return "no error"


def run_loop(loader, dataset, epoch: int, world: int, accelerator=None) -> dict[str, object]:
    dataset.set_epoch(epoch)
    try:
        expected = len(loader)
    except TypeError:
        expected = None
    ids: list[int] = []
    pads: list[int] = []
    batches = 0
    for batch in loader:
        one = torch.ones(1)
        dist.all_reduce(one)  # one collective per batch, like DDP's gradient sync
        assert int(one.item()) == world
        flag = batch.get("_is_padding")
        if flag is None:
            ids.extend(batch["id"].tolist())
        else:
            ids.extend(batch["id"][~flag].tolist())
            pads.extend(batch["id"][flag].tolist())
        batches += 1
    # Every rank's metrics, gathered (a collective: every rank calls it here).
    gathered = gather_metrics(dataset)
    metrics = [[r.rank, r.total.rows_read, r.total.batches_read, r.total.rows_padded] for r in gathered.ranks]
    return {"batches": batches, "len": expected, "ids": ids, "pads": pads, "metrics": metrics}


def main() -> None:
    data, out, launcher = sys.argv[1:4]
    accelerator = None
    checks: dict[str, object] = {}
    if launcher.startswith("accelerate"):
        from accelerate import Accelerator
        from accelerate.utils import InitProcessGroupKwargs

        accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=TIMEOUT)])
        checks["accelerate"] = [accelerator.process_index, accelerator.num_processes]
    else:
        checks["local_rank_error"] = local_rank_check(data)
        dist.init_process_group("gloo", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    results: dict[str, object] = {"rank": rank, "world": world, "checks": checks}
    workers = rank % 3  # ranks run different numbers of DataLoader workers
    for name, options, epochs in CONFIGS:
        # No rank arguments: they come from the initialized process group.
        loader, dataset = StructuredDataset.create_dataloader(
            data, num_workers=workers, batch_size=BATCH_SIZE, split_rows=150, **options
        )
        if launcher == "accelerate-prepared":
            loader = accelerator.prepare(loader)
        for epoch in epochs:
            results[f"{name}/{epoch}"] = run_loop(loader, dataset, epoch, world, accelerator)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    # Accelerate's documented end of a script; without it the gloo group is torn down at
    # interpreter exit, where its threads may abort the process ("terminate called ...").
    if accelerator is not None:
        accelerator.end_training()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
