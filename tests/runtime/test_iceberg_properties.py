"""Property: any table history, any delete set, any split / ranks / workers -> the live rows, each once."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from pyiceberg.catalog.sql import SqlCatalog

from tests.fixtures.iceberg import (
    commit_deletes,
    create_id_table,
    data_files,
    equality_delete_file,
    id_table,
    oracle_filtered_ids,
    oracle_ids,
    position_delete_file,
)
from tests.strategies_iceberg import ReadSetup, TableHistory, read_setups, row_filters, table_histories
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
@given(history=table_histories(), setup=read_setups, expr=row_filters())
def test_every_live_row_once(
    tmp_path: Path,
    iceberg_catalog: tuple[dict[str, str], SqlCatalog],
    history: TableHistory,
    setup: ReadSetup,
    expr: pc.Expression | None,
) -> None:
    """Default equal batches: every rank the same rows; all live rows once, less < num_ranks dropped.

    With a filter, the live rows that pass it (counted at discovery: on several ranks by
    default, on one rank with ``count_rows=True``).
    """
    config, catalog = iceberg_catalog
    name, live = build(catalog, history)
    assert sorted(live) == oracle_ids(catalog.load_table(name))  # the brute force agrees
    if expr is not None:
        ids = sorted(live)
        rows = id_table(0, 0) if not ids else pa.concat_tables([id_table(i, 1) for i in ids])
        live = set(rows.filter(expr).column("id").to_pylist())
    seen: list[int] = []
    rank_rows = set()
    for rank in range(setup.num_ranks):
        ds = IcebergDataset(
            name, catalog_config=config, split_rows=setup.split_rows, num_ranks=setup.num_ranks, rank=rank,
            num_workers=setup.num_workers, shuffle=setup.shuffle, shuffle_seed=setup.seed, columns=["id"],
            filters=expr, count_rows=None if setup.num_ranks > 1 else True,
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
    if expr is not None:
        assert sorted(live) == oracle_filtered_ids(catalog.load_table(name), expr)
