"""Metadata read by every rank (torchrun, gloo): shares, identical tables, errors everywhere."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fixtures.data import write_parquet_files
from tests.runtime.test_ddp_launch import bin_of, free_port, launch
from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.discovery.metadata import to_ipc

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("ddp_scripts") / "discovery_ranks.py"
ROWS = [1300, 170, 940, 55, 610, 333, 20]
WORLD = 3
SHARES = [(7 * r // WORLD, 7 * (r + 1) // WORLD) for r in range(WORLD)]  # [0,2) [2,4) [4,7)


def test_every_rank_reads_its_share_and_all_get_the_same_metadata(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_parquet_files(data, ROWS, row_group_size=[200, 50, 300, 55, 100, 111, 20])
    corrupt = tmp_path / "corrupt"
    write_parquet_files(corrupt, ROWS)
    (corrupt / "part-0006.parquet").write_bytes(b"not parquet at all" * 10)  # rank 2's share
    mismatch = tmp_path / "mismatch"
    write_parquet_files(mismatch, ROWS)
    pq.write_table(
        pa.table({"id": [1], "x": [0.5], "label": [1], "s": ["a"]}), mismatch / "part-0003.parquet"
    )
    (mismatch / "part-0005.parquet").write_bytes(b"garbage" * 10)  # later in file order: not raised
    out = tmp_path / "out"
    out.mkdir()
    cmd = [
        bin_of("torchrun"),
        f"--nproc_per_node={WORLD}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(SCRIPT),
        str(data),
        str(corrupt),
        str(mismatch),
        str(out),
    ]
    launch([cmd], tmp_path)
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert [r["rank"] for r in results] == list(range(WORLD))
    assert all(r["all_reduce"] == WORLD for r in results)

    # One process reading everything itself ends with the very same metadata table.
    alone = StructuredDataset(str(data), split_rows=300, equal_batches="off")
    assert alone.discovered.metadata is not None
    expected = hashlib.sha256(to_ipc(alone.discovered.metadata)).hexdigest()
    assert [r["digest"] for r in results] == [expected] * WORLD
    assert all(r["files"] == [f.path for f in alone.files] for r in results)

    # Each rank read the footers of its share, and the first file's (the dataset's schema);
    # rank 0 also listed (one page: no HEAD before it).
    for rank in (1, 2):
        lo, hi = SHARES[rank]
        assert results[rank]["requests"] == 1 + hi - lo
    assert results[0]["requests"] == 1 + SHARES[0][1]

    # The ranks' rows together are the rows of one process, each exactly once.
    ids = np.sort(np.concatenate([np.asarray(r["ids"], dtype=np.int64) for r in results]))
    single = np.sort(np.concatenate([b["id"].numpy() for b in alone]))
    assert np.array_equal(ids, single)
    assert np.array_equal(ids, np.arange(sum(ROWS)))

    # A footer error in one rank's share is raised, the same, on every rank.
    kinds = {tuple(r["corrupt"]) for r in results}
    assert len(kinds) == 1
    kind, message = kinds.pop()
    assert kind == "CorruptFileError"
    assert "part-0006.parquet" in message
    # The first error in file order wins everywhere (a schema mismatch before a corrupt file).
    kinds = {tuple(r["mismatch"]) for r in results}
    assert len(kinds) == 1
    kind, message = kinds.pop()
    assert kind == "SchemaMismatchError"
    assert "part-0000.parquet" in message
    assert "part-0003.parquet" in message
