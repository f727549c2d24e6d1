"""CSV, JSONL and ORC through a real DataLoader with 0 and 2 workers: every row once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pytest

from torch_dataloader_utils import create_dataloader

ROWS = 3000


def write(tmp_path: Path, fmt: str) -> Path:
    if fmt == "csv":
        path = tmp_path / "d.csv"
        path.write_text("id,x,s\r\n" + "".join(f'{i},{i * 0.5},"é,{i}"\r\n' for i in range(ROWS)))
    elif fmt == "jsonl":
        path = tmp_path / "d.jsonl"
        path.write_text(
            "".join(json.dumps({"id": i, "x": i * 0.5, "s": f"é{i}"}) + "\n" for i in range(ROWS))
        )
    else:
        path = tmp_path / "d.orc"
        ids = np.arange(ROWS)
        with orc.ORCWriter(str(path), stripe_size=1, batch_size=1 << 20) as writer:
            for lo, hi in ((0, 400), (400, 2500), (2500, ROWS)):
                writer.write(pa.table({"id": ids[lo:hi], "x": ids[lo:hi] * 0.5}))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "jsonl", "orc"])
@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_reads_every_row_once(tmp_path: Path, fmt: str, workers: int) -> None:
    path = write(tmp_path, fmt)
    split = {"split_bytes": 4096} if fmt != "orc" else {"split_rows": 1000}
    loader, ds = create_dataloader(
        str(path),
        format=fmt,
        num_workers=workers,
        batch_size=256,
        columns=["id", "x"],
        count_rows=fmt != "orc",
        multiprocessing_context="fork" if workers else None,
        timeout=60 if workers else 0,
        **split,  # type: ignore[arg-type]
    )
    ids = []
    sizes = []
    for batch in loader:
        ids += batch["id"].tolist()
        sizes.append(len(batch["id"]))
        assert batch["x"].tolist() == [i * 0.5 for i in batch["id"].tolist()]
    assert sorted(ids) == list(range(ROWS))
    plan = ds.plan(0, num_workers=max(1, workers))
    assert sum(plan.rows_for(0, w) or 0 for w in range(max(1, workers))) == ROWS
    # every batch is full except the last of each worker
    assert sum(1 for s in sizes if s != 256) <= max(1, workers)


def test_a_text_state_resumes_only_where_its_rows_are_counted_alike(tmp_path: Path) -> None:
    """Text chunks and cursors come from the row counts: a state of one rank (rows not counted)
    resumed on two ranks (counted for equal batches) read rows twice; now it says what to do."""
    from torch_dataloader_utils import IncompatibleOptionsError, StructuredDataset, merge_states

    root = tmp_path / "text"
    root.mkdir()
    for f, n in enumerate((70, 55, 90)):
        first = sum((70, 55, 90)[:f])
        (root / f"p{f}.jsonl").write_text(
            "".join(json.dumps({"id": i}) + "\n" for i in range(first, first + n))
        )
    options = {"format": "jsonl", "batch_size": 6, "shuffle": True, "equal_batches": "pad", "num_workers": 0}
    one = StructuredDataset(str(root), **options)
    next(iter(one))
    state = one.state_dict()
    two = StructuredDataset(str(root), num_ranks=2, rank=0, **options)
    with pytest.raises(IncompatibleOptionsError, match=r"rows not counted .* save states .* count_rows=True"):
        two.load_state_dict(merge_states([state]))
    again = StructuredDataset(str(root), **options)  # one rank, not counted either: the rest, once
    again.load_state_dict(state)
    seen = [i for b in again for i in b["id"].tolist()]
    assert len(seen) == len(set(seen)) == 215 - 6
