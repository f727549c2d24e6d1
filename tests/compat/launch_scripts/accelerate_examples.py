"""0.2.0's Accelerate examples under ``accelerate launch`` (2 CPU processes), run by test_examples_launch.py.

    accelerate launch --multi_gpu --num_processes 2 ... accelerate_examples.py CONFIG_JSON OUT_DIR

The examples' ``Accelerator()`` becomes ``Accelerator(cpu=True)`` (without CUDA a plain
``Accelerator()`` starts independent single-process copies) with a 30 s process-group
timeout; their ``s3://bucket/...`` paths become the local data of CONFIG_JSON. Each
process writes OUT_DIR/rank<N>.json: the ids each example's loop received.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from torch.utils.data import DataLoader

from torch_dataloader_utils import DataFileInfo, StructuredDataset


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


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    out = sys.argv[2]
    train = cfg["train"]
    results: dict[str, Any] = {}
    timeout = InitProcessGroupKwargs(timeout=timedelta(seconds=30))
    accelerator = Accelerator(cpu=True, kwargs_handlers=[timeout])
    results["world"] = [accelerator.process_index, accelerator.num_processes]
    inner = Model()
    model, optimizer = accelerator.prepare(inner, torch.optim.SGD(inner.parameters(), lr=0.01))

    def drain() -> list[int]:
        seen, inner.seen = inner.seen, []
        return seen

    # README "DDP / Multi-Rank Usage", HuggingFace Accelerate.
    loader, dataset = StructuredDataset.create_dataloader(
        path=train,
        format="parquet",
        num_workers=4,
        num_ranks=accelerator.num_processes,
        rank=accelerator.process_index,
    )
    loader = accelerator.prepare(loader)
    results["readme_prepared_is_loader"] = type(loader).__name__
    for batch in loader:
        accelerator.backward(model(batch))
    results["readme_accelerate"] = drain()

    # distributed.md "HuggingFace Accelerate".
    num_epochs = 2
    loader, dataset = StructuredDataset.create_dataloader(
        path=train,
        format="parquet",
        num_workers=4,
        batch_size=64,
        shuffle=True,
        num_ranks=accelerator.num_processes,
        rank=accelerator.process_index,
    )
    loader = accelerator.prepare(loader)
    for epoch in range(num_epochs):
        dataset.set_epoch(epoch)
        for batch in loader:
            optimizer.zero_grad()
            loss = model(batch["feature_a"], batch["label"])
            accelerator.backward(loss)
            optimizer.step()
        results[f"docs_accelerate/{epoch}"] = drain()

    # training.md "With HuggingFace Accelerate" (``...``: path and format; ranks detected).
    loader, dataset = StructuredDataset.create_dataloader(path=train, format="parquet", batch_size=64)
    loader = accelerator.prepare(loader)
    for epoch in range(num_epochs):
        dataset.set_epoch(epoch)
        for batch in loader:
            accelerator.backward(model(batch))
        results[f"training_accelerate/{epoch}"] = drain()

    # README "Advanced Usage (Escape Hatch)" and structured.md "Direct Constructor": a plain
    # DataLoader over the dataset, then accelerator.prepare(loader). ``...``: numeric columns
    # (Accelerate broadcasts tensors only) and split_rows=50.
    files = [DataFileInfo(os.path.join(train, name)) for name in sorted(os.listdir(train))]
    columns = ["feature_a", "feature_b", "label"]
    for name, ds in (
        ("escape_hatch", StructuredDataset(path=train, format="parquet", columns=columns, split_rows=50)),
        (
            "direct_constructor",
            StructuredDataset(files=files, format="parquet", columns=columns, split_rows=50),
        ),
    ):
        loader = DataLoader(ds, batch_size=None, num_workers=4)
        loader = accelerator.prepare(loader)
        for batch in loader:
            accelerator.backward(model(batch))
        results[name] = drain()

    with open(os.path.join(out, f"rank{accelerator.process_index}.json"), "w") as f:
        json.dump(results, f)
    accelerator.wait_for_everyone()
    accelerator.end_training()  # the group torn down here, not by gloo's threads at exit


if __name__ == "__main__":
    main()
