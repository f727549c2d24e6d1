"""Property: any table history, any delete set, any split / ranks / workers -> the live rows, each once."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from pyiceberg.catalog.sql import SqlCatalog

from tests.fixtures.iceberg import (
    commit_deletes,
    create_id_table,
    data_files,
    equality_delete_file,
    id_table,
    oracle_ids,
    position_delete_file,
)
from tests.strategies_iceberg import ReadSetup, TableHistory, read_setups, table_histories
from torch_dataloader_utils import IcebergDataset


def build(catalog: SqlCatalog, history: TableHistory) -> tuple[str, set[int]]:
    """Commit ``history``; return the table name and the ids that must survive (brute force)."""
    name = f"ns.t{uuid.uuid4().hex[:8]}"
    t = create_id_table(catalog, name, row_group_limit=history.row_group_limit)
    start = 0
    live: set[int] = set()
    firsts = []
    for i, n in enumerate(history.appends):
        before = set(data_files(t))
        t.append(id_table(start, n))
        (path,) = set(data_files(t)) - before
        firsts.append(start)
        live |= set(range(start, start + n))
        if history.position_deletes[i]:
            t = commit_deletes(t, [position_delete_file(t, {path: history.position_deletes[i]})])
            live -= {start + p for p in history.position_deletes[i]}
        for after, ids in history.equality_deletes:
            if after == i and ids:
                t = commit_deletes(t, [equality_delete_file(t, {"id": sorted(ids)})])
                live -= {x for x in ids if x < start + n}  # only files appended so far
        start += n
    return name, live


@pytest.mark.filterwarnings("ignore:num_workers=:UserWarning")
@settings(max_examples=25)
@given(history=table_histories(), setup=read_setups)
def test_every_live_row_once(tmp_path: Path, iceberg_catalog: tuple[dict[str, str], SqlCatalog],
                             history: TableHistory, setup: ReadSetup) -> None:  # fmt: skip
    """Default equal batches: every rank the same rows; all live rows once, less < num_ranks dropped."""
    config, catalog = iceberg_catalog
    name, live = build(catalog, history)
    seen: list[int] = []
    rank_rows = set()
    for rank in range(setup.num_ranks):
        ds = IcebergDataset(
            name, catalog_config=config, split_rows=setup.split_rows, num_ranks=setup.num_ranks, rank=rank,
            num_workers=setup.num_workers, shuffle=setup.shuffle, shuffle_seed=setup.seed, columns=["id"],
        )  # fmt: skip
        assert ds.exact_row_counts
        plan = ds.plan(setup.epoch)
        rows_of_rank = 0
        for worker in range(setup.num_workers):
            for chunk in plan.chunks_for(rank, worker):
                rows = [i for b in ds._reader.read(chunk) for i in b.column("id").to_pylist()]
                assert len(rows) == chunk.num_rows  # counts are exact, equality deletes included
                seen.extend(rows)
                rows_of_rank += len(rows)
        rank_rows.add(rows_of_rank)
        dropped = [i for c in plan.dropped for b in ds._reader.read(c) for i in b.column("id").to_pylist()]
        assert len(dropped) == sum(c.num_rows for c in plan.dropped) < setup.num_ranks
    assert len(rank_rows) == 1  # every rank reads the same number of rows
    assert len(seen) == len(set(seen))
    assert not set(seen) & set(dropped)
    assert sorted(seen + dropped) == sorted(live)
    assert sorted(live) == oracle_ids(catalog.load_table(name))
