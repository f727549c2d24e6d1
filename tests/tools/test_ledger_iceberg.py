"""The ledger over an Iceberg table: replay pinned to the snapshot read, and the audit of later deletes.

The table grows over four snapshots (appends, position deletes, a copy-on-write delete, an
overwrite that writes some rows again, equality deletes: ``tests.fixtures.iceberg.grow_table``).
The audit's oracle is an independent reader (DataFusion + iceberg-rust): the rows a later
snapshot deleted are the ids live at the snapshot trained on and not at the later one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.fixtures.iceberg import GrownTable, grow_table, make_catalog, sql_catalog_config
from torch_dataloader_utils import IcebergDataset, Ledger, LedgerError

pytestmark = pytest.mark.filterwarnings("ignore:shuffle=True mixes the rows")


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], GrownTable]:
    config = sql_catalog_config(Path(tmp_path_factory.mktemp("grown")) / "iceberg")
    return config, grow_table(make_catalog(config))


def train(
    config: dict[str, str], snapshot: int, ledger: Path, stop: int | None = None, **options: Any
) -> list[Any]:
    loader, _ = IcebergDataset.create_dataloader(
        "ns.grown", catalog_config=config, snapshot_id=snapshot, batch_size=16, ledger=str(ledger), **options
    )
    out = []
    for batch in loader:
        out.append(batch)
        if stop is not None and len(out) == stop:
            break
    return out


@pytest.mark.parametrize("later", [2, 3, 4])
def test_the_audit_lists_exactly_the_deleted_rows_that_were_trained_on(
    grown: tuple[dict[str, str], GrownTable], tmp_path: Path, later: int
) -> None:
    config, table = grown
    ledger = tmp_path / "ledger"
    batches = train(config, table.snapshots[0], ledger, shuffle=True, num_workers=1)
    trained = {int(i) for b in batches for i in b["id"]}
    assert trained == set(table.oracle(1))
    expected = set(table.oracle(1)) - set(table.oracle(later))
    found = Ledger(ledger).deleted(table.snapshots[later - 1])
    assert {_id(batches, s.step, s.position) for s in found} == expected
    assert len(found) == len(expected)  # each trained on once, in one epoch


def test_the_audit_leaves_out_rows_the_loop_never_received(
    grown: tuple[dict[str, str], GrownTable], tmp_path: Path
) -> None:
    config, table = grown
    ledger = tmp_path / "ledger"
    batches = train(config, table.snapshots[0], ledger, stop=5)
    trained = {int(i) for b in batches for i in b["id"]}
    expected = (set(table.oracle(1)) - set(table.oracle(4))) & trained
    found = Ledger(ledger).deleted(table.snapshots[3])
    assert {_id(batches, s.step, s.position) for s in found} == expected
    assert len(expected) < len(set(table.oracle(1)) - set(table.oracle(4)))


def _id(batches: list[Any], step: int, position: int) -> int:
    return int(batches[step]["id"][position])


def test_replay_reads_the_snapshot_trained_on(
    grown: tuple[dict[str, str], GrownTable], tmp_path: Path
) -> None:
    config, table = grown
    ledger = tmp_path / "ledger"
    batches = train(config, table.snapshots[1], ledger, shuffle=True)
    book = Ledger(ledger)
    for step in (0, len(batches) // 2, len(batches) - 1):
        got = book.rows(step)
        for name, value in batches[step].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(got[name], value)
            else:
                assert got[name] == value
    assert all(name.startswith(("config-", "files-", "rank-")) for name in (p.name for p in ledger.iterdir()))
    assert "sqlite" in (next(ledger.glob("config-*")).read_text())  # the catalog is recorded


def test_the_audit_of_a_files_ledger_is_refused(tmp_path: Path) -> None:
    from tests.fixtures.data import write_parquet_files
    from torch_dataloader_utils import create_dataloader

    write_parquet_files(tmp_path / "data", [50])
    loader, _ = create_dataloader(str(tmp_path / "data"), batch_size=10, ledger=str(tmp_path / "ledger"))
    list(loader)
    with pytest.raises(LedgerError, match="--deleted audits an Iceberg table"):
        Ledger(tmp_path / "ledger").deleted(1)
