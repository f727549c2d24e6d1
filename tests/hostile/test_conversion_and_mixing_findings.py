"""Findings 12 and 17 of the search for trouble (issue 28), end to end through ``create_dataloader``.

- 12: ``pack_features`` narrowed integers with no range check (int64 ``2**31 + 5`` in an
  int32 pack read as ``-2147483643``; uint64 above int64's max wrapped negative).
- 17: ``row_mixing`` took memory by the option, not the data (``10**8`` over 3,000 rows:
  4.3 GB; ``10**9``: numpy's ``MemoryError``).
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils import ConversionError, FeaturePack, create_dataloader


@pytest.mark.parametrize(
    ("values", "arrow_type", "dtype"),
    [
        ([1, 2**31 + 5, 3], pa.int64(), "int32"),
        ([0, 2**63 + 7, 1], pa.uint64(), "int64"),
    ],
)
def test_finding_12_pack_features_narrowing_an_integer_that_does_not_fit(
    tmp_path: Path, values: list[int], arrow_type: pa.DataType, dtype: str
) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": pa.array(values, arrow_type), "f": [1, 2, 3]}), path)
    loader, _ = create_dataloader(
        str(path), num_workers=0, pack_features=FeaturePack(["f", "id"], key="x", dtype=dtype)
    )
    expected = rf"column 'id' holds the value {values[1]}, which does not fit"
    with pytest.raises(ConversionError, match=expected):
        list(loader)


def test_finding_12_pack_features_narrowing_values_that_fit_reads_them_exactly(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    ids = [-(2**31), 0, 2**31 - 1]
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), path)
    loader, _ = create_dataloader(
        str(path), num_workers=0, pack_features=FeaturePack(["id"], key="x", dtype="int32")
    )
    assert [v for batch in loader for v in batch["x"][:, 0].tolist()] == ids


@pytest.mark.parametrize("row_mixing", [10**7, 10**9])
def test_finding_17_row_mixing_memory_is_sized_by_the_rows_in_the_round(
    tmp_path: Path, row_mixing: int
) -> None:
    for i in range(3):
        ids = np.arange(i * 1000, (i + 1) * 1000, dtype=np.int64)
        pq.write_table(pa.table({"id": ids}), tmp_path / f"part-{i}.parquet", row_group_size=250)
    loader, _ = create_dataloader(
        str(tmp_path), num_workers=0, batch_size=256, shuffle=True, row_mixing=row_mixing
    )
    tracemalloc.start()
    try:
        seen = [v for batch in loader for v in batch["id"].tolist()]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sorted(seen) == list(range(3000))  # every row exactly once
    assert seen != sorted(seen)
    assert peak < 100 << 20, f"{peak / 2**20:.0f} MiB for 3,000 rows"
