"""Every combination of features keeps the promise, or is refused naming the fix (docs/distributed.md).

One property draws a combination: the order (planned, elastic, mixed, a mix in elastic
order), the row shuffle (row interleaving, a window, none), packing on or off,
``on_bad_data='skip'`` with 0-2 bad units, ``equal_batches`` drop or pad, 1-4 ranks and
0-2 workers, an interruption resumed on another number of ranks and workers, and the
data (Parquet, JSONL, an Iceberg table with position deletes). Either the datasets are
refused with an :class:`IncompatibleOptionsError` whose message says what to do — and
the combination is one the table of refused combinations lists (:func:`refused`) — or
every rank yields the same number of batches and every good row (or, packed, every token
of every good document) arrives exactly once per epoch (a mix: once per its source's
epoch), leaving out only what ``equal_batches='drop'`` may.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.iceberg import commit_deletes, data_files, position_delete_file
from tests.fixtures.orders import (
    JSONL_SCHEMA,
    SEQ_LEN,
    SOURCE_BASE,
    Planted,
    counts,
    planted_jsonl,
    planted_parquet,
    resumed_run,
)
from torch_dataloader_utils import (
    IcebergDataset,
    IncompatibleOptionsError,
    SequencePack,
    StructuredDataset,
    create_mixed_dataloader,
)
from torch_dataloader_utils.runtime.dataset import OrderedDataset

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ICEBERG = "iceberg-table"
"""The path of the Iceberg table's :class:`Planted` (it is read as table ``ns.m``)."""
CANONICAL = 12
GLOBAL_BATCH = 24
SIZES = ((70, 55, 90), (60, 45), (40, 37))


def refused(combo: dict[str, Any], ranks: int) -> str | None:
    """The fix the library names for a combination it refuses on ``ranks`` ranks, else ``None``.

    The table of docs/distributed.md ("Combinations that are refused"), as code.
    """
    mixed, elastic = combo["order"].startswith("mixed"), combo["order"].endswith("elastic")
    if mixed and elastic:
        return "Drop canonical_ranks"
    skipping = combo["format"] != "iceberg"  # on_bad_data='skip' is on (0 to 2 units bad)
    if skipping and combo["policy"] == "drop" and not mixed and (elastic or ranks > 1):
        return "Pass equal_batches='pad'"
    return None


def refused_resume(combo: dict[str, Any], before: int, after: int) -> str | None:
    """The fix named when a state of ``before`` ranks cannot be loaded on ``after`` ranks.

    Text rows are counted when equal batches act on several ranks (``count_rows`` left to
    the library), and a text file's chunks and cursors depend on it: a state saved with
    them counted resumes only where they are, and the other way round.
    """
    if combo["format"] == "jsonl" and combo["order"] == "planned" and (before > 1) != (after > 1):
        return "count_rows=True"
    return None


def good_units(planted: Planted, packed: bool) -> set[int]:
    if not packed:
        return set(planted.good)
    return {i * 1000 + p for i in planted.good for p in range(i % 4)}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], list[Planted]]:
    """Every source of every format, with 0, 1 or 2 bad units."""
    base = tmp_path_factory.mktemp("matrix")
    out = {}
    for bad in range(3):
        out[("parquet", bad)] = [
            planted_parquet(base / f"pq{bad}-{s}", sizes, start=s * SOURCE_BASE, bad=bad)
            for s, sizes in enumerate(SIZES)
        ]
        out[("jsonl", bad)] = [
            planted_jsonl(base / f"js{bad}-{s}", sizes, start=s * SOURCE_BASE, bad=bad)
            for s, sizes in enumerate(SIZES)
        ]
    return out


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Planted]:
    """An Iceberg table of ids 0-159 (two data files) with position deletes."""
    from tests.fixtures.iceberg import make_catalog, sql_catalog_config

    root = tmp_path_factory.mktemp("matrix-iceberg")
    config = sql_catalog_config(root / "iceberg")
    catalog = make_catalog(config)  # with its namespace "ns"
    ids = np.arange(160, dtype=np.int64)
    rows = pa.table(
        {
            "id": ids,
            "x": (ids % 97).astype(np.float32),
            "tokens": pa.array(
                [[int(i) * 1000 + p for p in range(int(i) % 4)] for i in ids], pa.list_(pa.int64())
            ),
        }
    )
    t = catalog.create_table("ns.m", schema=rows.schema, properties={"write.parquet.row-group-limit": "20"})
    t.append(rows.slice(0, 90))
    t.append(rows.slice(90))
    paths = data_files(t)
    deleted = {paths[0]: [3, 4, 50], paths[1]: [0, 69]}
    t = commit_deletes(t, [position_delete_file(t, deleted)])
    live = set(t.scan().to_arrow().column("id").to_pylist())
    return config, Planted(Path(ICEBERG), live, set(range(160)) - live)


Build = Callable[[int, int, int], OrderedDataset]


def builder(combo: dict[str, Any], sources: list[Planted], config: dict[str, str] | None) -> Build:
    packed = combo["pack"]
    options: dict[str, Any] = {
        "equal_batches": combo["policy"],
        "shuffle": combo["shuffle"] != "none",
        "shuffle_seed": 3,
        "columns": ["id", "tokens"] if packed else ["id", "x"],
    }
    if combo["shuffle"] == "window":
        options["row_shuffle_window"] = 64
    if packed:
        options.update(ragged="offsets", pack_sequences=SequencePack("tokens", seq_len=SEQ_LEN, pad_id=-1))
    if combo["format"] != "iceberg":
        options["on_bad_data"] = "skip"
    if combo["format"] == "jsonl":
        options["schema"] = JSONL_SCHEMA
    elastic = combo["order"].endswith("elastic")
    if elastic:
        options["canonical_ranks"] = CANONICAL

    def batch(ranks: int) -> int:
        return GLOBAL_BATCH // ranks if elastic else 6

    def spec(planted: Planted) -> dict[str, Any]:
        if planted.path == ICEBERG:
            return {"table": "ns.m", "catalog_config": config}
        return {"path": planted.path, "format": "jsonl" if combo["format"] == "jsonl" else "parquet"}

    if combo["order"].startswith("mixed"):
        specs = [spec(p) for p in sources]
        extra = {k: v for k, v in options.items() if k != "schema"}
        if combo["format"] == "jsonl":
            specs = [{**s, "schema": JSONL_SCHEMA} for s in specs]
        return lambda ranks, rank, workers: create_mixed_dataloader(
            specs,
            [3, 2, 1][: len(specs)],
            num_ranks=ranks,
            rank=rank,
            num_workers=workers,
            batch_size=batch(ranks),
            **extra,
        )[1]
    first = spec(sources[0])
    if "table" in first:
        return lambda ranks, rank, workers: IcebergDataset(
            first["table"],
            catalog_config=config,
            num_ranks=ranks,
            rank=rank,
            num_workers=workers,
            batch_size=batch(ranks),
            **options,
        )
    return lambda ranks, rank, workers: StructuredDataset(
        first["path"],
        format=first["format"],
        num_ranks=ranks,
        rank=rank,
        num_workers=workers,
        batch_size=batch(ranks),
        **options,
    )


ranks_of = st.sampled_from([1, 2, 3, 4])


@settings(max_examples=30)
@given(
    order=st.sampled_from(["planned", "elastic", "mixed", "mixed+elastic"]),
    shuffle=st.sampled_from(["interleave", "window", "none"]),
    pack=st.booleans(),
    bad=st.integers(0, 2),
    policy=st.sampled_from(["drop", "pad"]),
    fmt=st.sampled_from(["parquet", "jsonl", "iceberg"]),
    before=st.tuples(ranks_of, st.integers(0, 2)),
    after=st.tuples(ranks_of, st.integers(0, 2)),
    stop=st.integers(1, 6),
)
def test_every_combination_keeps_the_promise_or_is_refused(
    files: dict[tuple[str, int], list[Planted]],
    table: tuple[dict[str, str], Planted],
    order: str,
    shuffle: str,
    pack: bool,
    bad: int,
    policy: str,
    fmt: str,
    before: tuple[int, int],
    after: tuple[int, int],
    stop: int,
) -> None:
    bad = 0 if fmt == "iceberg" else bad
    combo = {"order": order, "shuffle": shuffle, "pack": pack, "bad": bad, "policy": policy, "format": fmt}
    config, iceberg = table
    # Iceberg: the table, mixed with Parquet sources.
    sources = [iceberg, *files[("parquet", 0)][1:]] if fmt == "iceberg" else files[(fmt, bad)]
    build = builder(combo, sources, config)
    for ranks in (before[0], after[0]):
        why = refused(combo, ranks)
        if why is not None:
            with pytest.raises(IncompatibleOptionsError, match=why):
                build(ranks, 0, 0)
            return
    why = refused_resume(combo, before[0], after[0])
    if why is not None:
        with pytest.raises(IncompatibleOptionsError, match=why):
            resumed_run(build, before, after, stop, packed=pack)
        return
    first, rest, _ = resumed_run(build, before, after, stop, packed=pack)
    assert len({len(b) for b in first}) == 1  # equal batches: every rank the same
    assert len({len(b) for b in rest}) == 1
    got = counts([first, rest])
    if order.startswith("mixed"):
        for planted in sources:
            units = good_units(planted, pack)
            seen = [got.get(u, 0) for u in sorted(units)]
            assert not set(got) & good_units(Planted(Path(planted.path), set(planted.bad), set()), pack)
            if policy == "pad":
                assert max(seen) - min(seen) <= 1, (planted.path, Counter(seen))
            else:
                assert max(seen) <= -(-sum(seen) // len(seen)) + 1, (planted.path, Counter(seen))
        return
    units = good_units(sources[0], pack)
    assert max(got.values(), default=1) == 1, [u for u, n in got.items() if n > 1][:10]
    assert set(got) <= units
    budget = 0 if policy == "pad" else (CANONICAL if order == "elastic" else before[0] + after[0])
    missing = len(units) - len(got)
    assert missing <= budget * (3 if pack else 1), (missing, budget)
