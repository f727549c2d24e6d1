"""0.2.0's multi-process examples under torchrun (gloo on CPU), run by tests/compat/test_examples_launch.py.

    torchrun --nproc_per_node=2 ddp_examples.py CONFIG_JSON OUT_DIR

CONFIG_JSON holds the local data's paths and the SQLite ``catalog_config`` (standing in
for the examples' buckets and Glue catalog). Each example's loop is the docs' loop; the
``model`` is wrapped in DistributedDataParallel, so a rank with fewer batches than the
others would leave them waiting in the gradient all_reduce (30 s timeout: a failure,
not a hang). Each rank writes OUT_DIR/rank<N>.json: the ids each example read.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pyarrow.compute as pc
import torch
import torch.distributed as dist

from torch_dataloader_utils import IcebergDataset, StructuredDataset

TIMEOUT = timedelta(seconds=30)


class Model(torch.nn.Module):
    """The examples' ``model``: a scalar loss; notes the ids it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[int] = []

    def forward(self, features: Any, label: Any = None) -> torch.Tensor:
        ids = features["feature_a"] if isinstance(features, dict) else features
        self.seen.extend(int(i) for i in ids)
        return (self.w * torch.as_tensor(ids, dtype=torch.float32)).mean()


def ddp_model() -> tuple[Any, Model, torch.optim.Optimizer]:
    inner = Model()
    model = torch.nn.parallel.DistributedDataParallel(inner)
    return model, inner, torch.optim.SGD(model.parameters(), lr=0.01)


def drain(inner: Model) -> list[int]:
    seen, inner.seen = inner.seen, []
    return seen


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    out = sys.argv[2]
    train, catalog_config = cfg["train"], cfg["catalog_config"]
    results: dict[str, Any] = {}

    # distributed.md "Horovod": global rank and size passed in, no torch.distributed group
    # (Horovod cannot be built here; this stand-in gives its hvd.size() / hvd.rank()).
    hvd = SimpleNamespace(size=lambda: int(os.environ["WORLD_SIZE"]), rank=lambda: int(os.environ["RANK"]))
    loader, dataset = StructuredDataset.create_dataloader(
        path=train,
        format="parquet",
        num_workers=4,
        batch_size=64,
        shuffle=True,
        num_ranks=hvd.size(),
        rank=hvd.rank(),
    )
    dataset.set_epoch(0)
    batches = list(loader)
    results["horovod"] = {"batches": len(batches), "ids": [int(i) for b in batches for i in b["feature_a"]]}

    # README "DDP / Multi-Rank Usage" (backend "nccl": "gloo" on CPU).
    dist.init_process_group(backend="gloo", timeout=TIMEOUT)
    model, inner, optimizer = ddp_model()
    loader, dataset = StructuredDataset.create_dataloader(
        path=train,
        format="parquet",
        num_workers=4,
        num_ranks=dist.get_world_size(),
        rank=dist.get_rank(),
    )
    for batch in loader:
        model(batch).backward()
    results["readme_ddp"] = drain(inner)

    # distributed.md "PyTorch DDP".
    num_epochs = 2
    loader, dataset = StructuredDataset.create_dataloader(
        path=train,
        format="parquet",
        num_workers=4,
        batch_size=64,
        shuffle=True,
        shuffle_seed=42,
        num_ranks=dist.get_world_size(),
        rank=dist.get_rank(),
    )
    for epoch in range(num_epochs):
        dataset.set_epoch(epoch)
        for batch in loader:
            optimizer.zero_grad()
            loss = model(batch["feature_a"], batch["label"])
            loss.backward()
            optimizer.step()
        results[f"docs_ddp/{epoch}"] = drain(inner)

    # distributed.md "Iceberg Tables with DDP" (Glue catalog: the SQLite catalog).
    loader, dataset = IcebergDataset.create_dataloader(
        table="my_db.events",
        catalog_config=catalog_config,
        num_workers=4,
        batch_size=64,
        shuffle=True,
        filters=pc.field("region_id") >= 5,
        num_ranks=dist.get_world_size(),
        rank=dist.get_rank(),
    )
    for epoch in range(num_epochs):
        dataset.set_epoch(epoch)
        for batch in loader:
            model(batch).backward()
        results[f"iceberg_ddp/{epoch}"] = drain(inner)

    # distributed.md "Global Rank vs Local Rank": the environment's RANK / WORLD_SIZE.
    loader, dataset = StructuredDataset.create_dataloader(
        path=train, format="parquet", num_ranks=int(os.environ["WORLD_SIZE"]), rank=int(os.environ["RANK"])
    )
    for batch in loader:
        model(batch).backward()
    results["env_ranks"] = drain(inner)

    # checkpoint.md "DDP / Multi-rank", Option A (one file) and Option B (a file per rank):
    # a crash after 3 steps of epoch 0, then a resume that reads the rest of the epoch.
    for option in ("A", "B"):
        loader, dataset = StructuredDataset.create_dataloader(
            path=train, format="parquet", num_workers=2, batch_size=32, shuffle=True, split_rows=50
        )
        dataset.set_epoch(0)
        epoch, step = 0, 0
        for step, batch in enumerate(loader):
            optimizer.zero_grad()
            model(batch).backward()
            optimizer.step()
            if step == 2:
                break
        before = drain(inner)
        ckpt_dir = os.path.join(out, f"option{option}")
        os.makedirs(ckpt_dir, exist_ok=True)
        if option == "A":
            dataset_state = dataset.state_dict()
            all_dataset_states = [None] * dist.get_world_size()
            dist.all_gather_object(all_dataset_states, dataset_state)
            if dist.get_rank() == 0:
                torch.save(
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "dataset_states": all_dataset_states,
                        "epoch": epoch,
                        "step": step,
                    },
                    os.path.join(ckpt_dir, "checkpoint.pt"),
                )
            dist.barrier()
        else:
            torch.save(
                {"model": model.state_dict(), "dataset": dataset.state_dict()},
                os.path.join(ckpt_dir, f"ckpt_rank{dist.get_rank()}_{step}.pt"),
            )

        # Resume (a new process would start here).
        model, inner, optimizer = ddp_model()
        loader, dataset = StructuredDataset.create_dataloader(
            path=train, format="parquet", num_workers=2, batch_size=32, shuffle=True, split_rows=50
        )
        if option == "A":
            if dist.get_rank() == 0:
                ckpt = torch.load(os.path.join(ckpt_dir, "checkpoint.pt"), weights_only=False)
            else:
                ckpt = None
            ckpt_list = [ckpt]
            dist.broadcast_object_list(ckpt_list, src=0)
            ckpt = ckpt_list[0]
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            dataset.load_state_dict(ckpt["dataset_states"][dist.get_rank()])
        else:
            ckpt = torch.load(
                os.path.join(ckpt_dir, f"ckpt_rank{dist.get_rank()}_{step}.pt"), weights_only=False
            )
            model.load_state_dict(ckpt["model"])
            dataset.load_state_dict(ckpt["dataset"])
        for batch in loader:
            model(batch).backward()
        results[f"checkpoint_{option}"] = {"before": before, "after": drain(inner)}

    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
