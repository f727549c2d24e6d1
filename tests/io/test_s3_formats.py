"""CSV, JSONL and ORC on a real S3 server: credentials only in storage_options, 2 ranks x 2 workers."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.orc as po
import pytest

from tests.fixtures.s3 import S3Server
from torch_dataloader_utils import create_dataloader

pytestmark = pytest.mark.slow

ROWS = [2400, 900, 1700]
TOTAL = sum(ROWS)


def _write(tmp_path, fmt: str) -> list:
    paths, start = [], 0
    for i, n in enumerate(ROWS):
        ids = range(start, start + n)
        path = tmp_path / f"part-{i}.{fmt}"
        if fmt == "csv":
            path.write_text("id,x,s\n" + "".join(f'{j},{j * 0.5},"t, {j}"\n' for j in ids))
        elif fmt == "jsonl":
            path.write_text("".join(json.dumps({"id": j, "x": j * 0.5, "s": f"t {j}"}) + "\n" for j in ids))
        else:
            table = pa.table({"id": np.arange(start, start + n), "x": np.arange(start, start + n) * 0.5})
            po.write_table(table, path, stripe_size=4096)  # several stripes per file
        paths.append(path)
        start += n
    return paths


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "orc"])
def test_text_and_orc_on_s3_every_row_once(s3_server: S3Server, tmp_path, fmt: str) -> None:
    prefix = s3_server.new_prefix()
    fs = s3_server.fs()
    for p in _write(tmp_path, fmt):
        fs.put_file(str(p), f"{prefix}/{p.name}")
    split = {"split_bytes": 9000} if fmt != "orc" else {"split_rows": 500}
    seen, counts = [], []
    for rank in range(2):
        loader, dataset = create_dataloader(
            f"s3://{prefix}",
            format=fmt,
            storage_options=s3_server.options(),
            num_ranks=2,
            rank=rank,
            num_workers=2,
            batch_size=128,
            columns=["id", "x"],
            multiprocessing_context="fork",
            timeout=60,
            **split,  # type: ignore[arg-type]
        )
        assert len(dataset.plan(0).all_chunks()) > len(ROWS)  # really split inside files
        batches = list(loader)
        counts.append(len(batches))
        seen.append(np.concatenate([b["id"].numpy() for b in batches]))
    ids = np.concatenate(seen)
    assert counts[0] == counts[1]  # equal batches (default "drop"): counted on S3 too
    assert len(ids) == len(np.unique(ids)) == TOTAL - TOTAL % 2
    assert set(ids.tolist()) <= set(range(TOTAL))
