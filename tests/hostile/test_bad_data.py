"""Hostile case: data that does not decode — raised with its position, or skipped with exact accounting.

Datasets are planted with known bad units: Parquet row groups whose ``id`` column chunk
is overwritten with garbage (the footer intact, the size and modification time kept),
CSV lines with a field too many or a value that does not convert to the declared type,
JSONL lines that are not JSON or hold a string where the schema says int. They are read
with ``on_bad_data="skip"`` and ``"quarantine"`` over ranks, workers and a resume into
another world; every good row must arrive exactly once (its ``id``), no stand-in may
pass as data, every rank must yield the same number of batches (``equal_batches='pad'``),
and the quarantine report must equal the planted set, each unit once.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.e2e import column_chunk_range, corrupt
from torch_dataloader_utils import (
    BadDataError,
    FileChangedError,
    IcebergDataset,
    IncompatibleOptionsError,
    StructuredDataset,
    UnknownLengthError,
    create_dataloader,
    merge_states,
)
from torch_dataloader_utils.config import PADDING_COLUMN

pytestmark = pytest.mark.filterwarnings("ignore:num_workers=:UserWarning", "ignore:.*worker.*:UserWarning")

TEXT_SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.int64())])


# -- planting -------------------------------------------------------------------------
@dataclass(frozen=True)
class Planted:
    """A dataset with bad units: the ids that must arrive, and the units that must be reported."""

    root: Path
    format: str
    good: frozenset[int]
    units: frozenset[tuple[str, str, int | None, tuple[int, int] | None]]
    """``(file, unit, index, bytes)``: row groups by index; lines by byte range."""
    bad_rows: int


def plant_parquet(root: Path, files: list[int], group_rows: int, bad: set[tuple[int, int]]) -> Planted:
    """Parquet files of ``files[i]`` rows in groups of ``group_rows``; groups ``bad`` made undecodable."""
    root.mkdir(parents=True, exist_ok=True)
    good: set[int] = set()
    units = set()
    first = 0
    bad_rows = 0
    for i, n in enumerate(files):
        path = root / f"part-{i}.parquet"
        ids = np.arange(first, first + n, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), path, row_group_size=group_rows)
        groups = -(-n // group_rows)
        broken = sorted(g for f, g in bad if f == i and g < groups)
        for g in range(groups):
            rows = ids[g * group_rows : (g + 1) * group_rows]
            if g in broken:
                units.add((str(path), "row_group", g, None))
                bad_rows += len(rows)
            else:
                good.update(int(v) for v in rows)
        corrupt(path, [column_chunk_range(path, g, "id") for g in broken])
        first += n
    return Planted(root, "parquet", frozenset(good), frozenset(units), bad_rows)


BAD_CSV = ("{i},{i},{i}", "{i},not-a-number", "{i},1.5")
BAD_JSONL = ('{{"id": {i}, "v": ', '{{"id": {i}, "v": "not-a-number"}}', "[{i}]", '{{"id": {i}, "v": {i}}} x')


def plant_text(root: Path, fmt: str, files: list[int], bad: set[tuple[int, int]]) -> Planted:
    """CSV / JSONL files of ``files[i]`` lines; lines ``bad`` replaced by lines that do not parse."""
    root.mkdir(parents=True, exist_ok=True)
    good: set[int] = set()
    units = set()
    first = 0
    for i, n in enumerate(files):
        path = root / f"part-{i}.{fmt}"
        data = bytearray(b"id,v\n" if fmt == "csv" else b"")
        for j in range(n):
            k = first + j
            if (i, j) in bad:
                shapes = BAD_CSV if fmt == "csv" else BAD_JSONL
                line = shapes[j % len(shapes)].format(i=k)
                units.add((str(path), "line", None, (len(data), len(data) + len(line) + 1)))
            else:
                line = f"{k},{k * 3}" if fmt == "csv" else json.dumps({"id": k, "v": k * 3})
                good.add(k)
            data += line.encode() + b"\n"
        path.write_bytes(bytes(data))
        first += n
    return Planted(root, fmt, frozenset(good), frozenset(units), len(units))


def report(quarantine: Path) -> list[tuple[str, str, int | None, tuple[int, int] | None]]:
    """The quarantine report's units, as many times as written."""
    path = quarantine / "quarantine.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        assert r["error"], r
        out.append((r["file"], r["unit"], r["index"], None if r["bytes"] is None else tuple(r["bytes"])))
    return [(f, u, i, b if u == "line" else None) for f, u, i, b in out]


def good_ids(batch: pa.RecordBatch) -> list[int]:
    """The ids of ``batch`` that are data (rows flagged as padding left out)."""
    ids = batch.column("id").to_pylist()
    if PADDING_COLUMN not in batch.schema.names:
        return ids  # type: ignore[no-any-return]
    return [i for i, pad in zip(ids, batch.column(PADDING_COLUMN).to_pylist(), strict=True) if not pad]


def options(planted: Planted, **kwargs: Any) -> dict[str, Any]:
    extra = {"schema": TEXT_SCHEMA} if planted.format in ("csv", "jsonl") else {}
    return {"format": planted.format, "output_format": "arrow", **extra, **kwargs}


# -- raise: the error names the file and the position ---------------------------------
def test_raise_names_the_row_group(tmp_path: Path) -> None:
    planted = plant_parquet(tmp_path / "d", [400], 100, {(0, 2)})
    loader, _ = create_dataloader(str(planted.root), num_workers=0, batch_size=64, output_format="arrow")
    path = planted.root / "part-0.parquet"
    expected = (
        rf"reading '{path}' rows \[0, 400\) failed: row group 2 \(rows \[200, 300\)\) at bytes \[\d+, \d+\)"
    )
    with pytest.raises(BadDataError, match=expected) as exc:
        list(loader)
    assert "cannot be decoded" in str(exc.value)
    assert "on_bad_data='skip'" in str(exc.value)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_raise_names_the_line(tmp_path: Path, fmt: str) -> None:
    planted = plant_text(tmp_path / "d", fmt, [300], {(0, 201)})
    ((file, _, _, (start, stop)),) = planted.units
    loader, _ = create_dataloader(str(planted.root), **options(planted, num_workers=0, batch_size=50))
    with pytest.raises(
        BadDataError, match=rf"line at bytes \[{start}, {stop}\) of '{file}' cannot be decoded"
    ):
        list(loader)


def test_drop_on_several_ranks_is_refused(tmp_path: Path) -> None:
    planted = plant_parquet(tmp_path / "d", [100], 50, set())
    with pytest.raises(
        IncompatibleOptionsError, match=r"on_bad_data='skip' with equal_batches='drop' on 2 ranks"
    ):
        StructuredDataset(str(planted.root), on_bad_data="skip", num_ranks=2, rank=0)
    with pytest.raises(IncompatibleOptionsError, match=r"pass\s+quarantine_dir="):
        StructuredDataset(str(planted.root), on_bad_data="quarantine")
    with pytest.raises(IncompatibleOptionsError, match=r"quarantine_dir=.* is only used with"):
        StructuredDataset(str(planted.root), quarantine_dir=str(tmp_path))
    StructuredDataset(str(planted.root), on_bad_data="skip", num_ranks=2, rank=0, equal_batches="pad")


@pytest.mark.parametrize("workers", [0, 2])
def test_elastic_order_pads_skipped_units(tmp_path: Path, workers: int) -> None:
    """canonical_ranks: a skipped row group's rows reach the loop as padding; drop is refused."""
    planted = plant_parquet(tmp_path / "d", [100, 60], 10, {(0, 3), (1, 0)})
    with pytest.raises(
        IncompatibleOptionsError, match=r"on_bad_data='skip' with equal_batches='drop' on canonical_ranks=2"
    ):
        StructuredDataset(str(planted.root), on_bad_data="skip", canonical_ranks=2, batch_size=4)
    ids: list[int] = []
    for rank in range(2):
        loader, _ = create_dataloader(
            str(planted.root),
            **options(
                planted,
                num_ranks=2,
                rank=rank,
                num_workers=workers,
                canonical_ranks=4,
                batch_size=6,
                equal_batches="pad",
                shuffle=True,
                on_bad_data="skip",
            ),
        )
        batches = list(loader)
        assert len(batches) == len(loader)
        ids += [i for b in batches for i in good_ids(b)]
    assert Counter(ids) == Counter(planted.good)


# -- skip, quarantine: exact accounting ------------------------------------------------
def read_job(
    planted: Planted,
    *,
    num_ranks: int,
    num_workers: int,
    stop_after: int | None,
    state: dict[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[list[int], list[int], list[dict[str, Any]], list[int]]:
    """Every rank of a job, one after the other.

    Returns ``(good ids, batches per rank, states, batches left before reading)``.
    """
    ids: list[int] = []
    batches: list[int] = []
    states: list[dict[str, Any]] = []
    lengths: list[int] = []
    for rank in range(num_ranks):
        loader, _ = create_dataloader(
            str(planted.root),
            **options(planted, num_ranks=num_ranks, rank=rank, num_workers=num_workers, **kwargs),
        )
        if state is not None:
            loader.load_state_dict(state)
        try:
            lengths.append(loader.remaining_batches)  # len(loader) is a full pass, also after a load
        except UnknownLengthError:  # text, not counted, on one rank without equal batches
            lengths.append(-1)
        count = 0
        for batch in loader:
            ids += good_ids(batch)
            count += 1
            if count == stop_after:
                break
        batches.append(count)
        states.append(json.loads(json.dumps(loader.state_dict())))
    return ids, batches, states, lengths


@dataclass(frozen=True)
class Setup:
    ranks: int
    workers: int
    ranks_after: int
    workers_after: int
    stop_after: int
    batch_size: int
    split_rows: int | None
    shuffle: bool
    quarantine: bool
    pad: bool = True
    count: bool = False


setups = st.builds(
    Setup,
    ranks=st.integers(1, 3),
    workers=st.just(0),
    ranks_after=st.integers(1, 3),
    workers_after=st.just(0),
    stop_after=st.integers(1, 6),
    batch_size=st.integers(5, 40),
    split_rows=st.sampled_from([None, 30, 55]),
    shuffle=st.booleans(),
    quarantine=st.booleans(),
    pad=st.booleans(),
    count=st.booleans(),
)


def check_job(planted: Planted, setup: Setup, tmp: Path) -> None:
    quarantine = tmp / "quarantine"
    policy: dict[str, Any] = (
        {"on_bad_data": "quarantine", "quarantine_dir": str(quarantine)}
        if setup.quarantine
        else {"on_bad_data": "skip"}
    )
    shared = dict(
        batch_size=setup.batch_size,
        shuffle=setup.shuffle,
        shuffle_seed=3,
        equal_batches="pad" if setup.pad else "off",
        **({"split_rows": setup.split_rows} if setup.split_rows and planted.format == "parquet" else {}),
        **({"split_bytes": 700} if planted.format != "parquet" else {}),
        # Text: counted (exact positions, record windows), or read in whole byte ranges.
        **({"count_rows": True} if (setup.count or setup.pad) and planted.format != "parquet" else {}),
        **policy,
    )
    first, batches, states, lengths = read_job(
        planted, num_ranks=setup.ranks, num_workers=setup.workers, stop_after=setup.stop_after, **shared
    )
    if setup.pad:
        assert len(set(lengths)) == 1  # equal batches, planned
        assert batches == [min(lengths[0], setup.stop_after)] * setup.ranks
    state = merge_states(states)
    if state["epoch"] != 0:  # the first run read the whole epoch: nothing to resume
        assert all(b < setup.stop_after for b in batches)
        rest: list[int] = []
    else:
        rest, batches_after, _, lengths_after = read_job(
            planted,
            num_ranks=setup.ranks_after,
            num_workers=setup.workers_after,
            stop_after=None,
            state=state,
            **shared,
        )
    if setup.pad and state["epoch"] == 0:
        assert batches_after == lengths_after  # every rank yields the batches it said were left ...
        assert len(set(batches_after)) == 1  # ... the same number
    assert Counter(first + rest) == Counter(planted.good)  # every good row once; no stand-in as data
    if setup.quarantine:
        reported = report(quarantine)
        assert len(reported) == len(set(reported))  # each unit once, however often it was met
        assert set(reported) == planted.units


bad_groups = st.sets(st.tuples(st.integers(0, 2), st.integers(0, 5)), min_size=1, max_size=4)


@settings(max_examples=40)
@given(
    files=st.lists(st.integers(60, 260), min_size=1, max_size=3),
    group_rows=st.sampled_from([40, 50, 75]),
    bad=bad_groups,
    setup=setups,
)
def test_parquet_bad_row_groups_every_good_row_once(
    tmp_path_factory: pytest.TempPathFactory,
    files: list[int],
    group_rows: int,
    bad: set[tuple[int, int]],
    setup: Setup,
) -> None:
    tmp = tmp_path_factory.mktemp("bad")
    check_job(plant_parquet(tmp / "data", files, group_rows, bad), setup, tmp)


@settings(max_examples=30)
@given(
    fmt=st.sampled_from(["csv", "jsonl"]),
    files=st.lists(st.integers(40, 160), min_size=1, max_size=2),
    bad=st.sets(st.tuples(st.integers(0, 1), st.integers(0, 159)), min_size=1, max_size=8),
    setup=setups,
)
def test_text_bad_lines_every_good_row_once(
    tmp_path_factory: pytest.TempPathFactory,
    fmt: str,
    files: list[int],
    bad: set[tuple[int, int]],
    setup: Setup,
) -> None:
    tmp = tmp_path_factory.mktemp("bad")
    check_job(plant_text(tmp / "data", fmt, files, bad), setup, tmp)


@pytest.mark.parametrize(
    ("fmt", "before", "after"),
    [("parquet", (2, 2), (3, 1)), ("jsonl", (1, 2), (2, 2))],
)
def test_real_workers_and_resume(
    tmp_path: Path, fmt: str, before: tuple[int, int], after: tuple[int, int]
) -> None:
    """DataLoader worker processes (fork) on every rank, before and after the resume."""
    if fmt == "parquet":
        planted = plant_parquet(tmp_path / "data", [300, 180, 250], 40, {(0, 1), (0, 5), (2, 0), (2, 6)})
    else:
        planted = plant_text(tmp_path / "data", fmt, [200, 150], {(0, 3), (0, 150), (1, 0), (1, 149)})
    setup = Setup(before[0], before[1], after[0], after[1], 3, 16, 60, True, True)
    check_job(planted, setup, tmp_path)


# -- metrics, logs, padding ----------------------------------------------------------------
def test_skipped_rows_counted_per_file_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    planted = plant_parquet(tmp_path / "d", [300, 200], 50, {(0, 1), (0, 4), (1, 3)})
    loader, _ = create_dataloader(
        str(planted.root), num_workers=0, batch_size=64, output_format="arrow", on_bad_data="skip"
    )
    with caplog.at_level(logging.INFO, logger="torch_dataloader_utils"):
        ids = [i for b in loader for i in good_ids(b)]
    assert sorted(ids) == sorted(planted.good)
    total = loader.metrics().total
    assert total.bad_units == 3
    assert total.bad_rows == 150
    assert total.bad_rows_by_file == {
        str(planted.root / "part-0.parquet"): 100,
        str(planted.root / "part-1.parquet"): 50,
    }
    lines = [
        r.getMessage() for r in caplog.records if "on_bad_data='skip': skipped row group" in r.getMessage()
    ]
    assert len(lines) == 3
    assert any("row group 4 (rows [200, 250))" in m and "part-0.parquet" in m for m in lines)
    # Without padding (one rank, equal_batches off by default), the rows are gone: 350 rows.
    assert sum(b.num_rows for b in loader) == 350


def test_pad_keeps_the_batch_count_and_flags_the_rows(tmp_path: Path) -> None:
    planted = plant_parquet(tmp_path / "d", [300], 50, {(0, 2)})
    loader, _ = create_dataloader(
        str(planted.root),
        num_workers=0,
        batch_size=64,
        output_format="arrow",
        on_bad_data="skip",
        equal_batches="pad",
    )
    batches = list(loader)
    assert len(batches) == len(loader) == 5
    assert sum(b.num_rows for b in batches) == 300
    flagged = sum(sum(b.column(PADDING_COLUMN).to_pylist()) for b in batches)
    assert flagged == 50
    assert loader.metrics().total.bad_rows == 50  # not rows_padded: test_counts_and_filesystems.py


def test_a_file_changed_mid_epoch_is_not_bad_data(tmp_path: Path) -> None:
    planted = plant_parquet(tmp_path / "d", [400], 100, set())
    dataset = StructuredDataset(
        str(planted.root), split_rows=200, output_format="arrow", on_bad_data="skip", batch_size=50
    )
    chunks = dataset.plan(0).all_chunks()
    assert len(chunks) == 2
    reader = dataset.reader
    assert len([b for b in reader.read(chunks[0])]) > 0  # checked against the plan: unchanged
    path = planted.root / "part-0.parquet"
    data = bytearray(path.read_bytes())
    data[4:-1000] = b"\x00" * (len(data) - 1004)  # rewritten in place: the same size, garbage
    path.write_bytes(bytes(data))
    with pytest.raises(FileChangedError, match="changed after the dataset was built"):
        list(reader.read(chunks[1]))  # a decode error, but the file changed: never skipped
    path.unlink()
    with pytest.raises(FileChangedError, match="was deleted"):
        list(reader.read(chunks[1]))


def test_quarantine_is_written_once_across_runs(tmp_path: Path) -> None:
    planted = plant_text(tmp_path / "d", "csv", [120], {(0, 7), (0, 70)})
    kwargs = options(
        planted, num_workers=0, batch_size=10, on_bad_data="quarantine", quarantine_dir=str(tmp_path / "q")
    )
    for _ in range(3):  # three epochs, or three jobs: the report names each unit once
        loader, _ = create_dataloader(str(planted.root), **kwargs)
        assert sorted(i for b in loader for i in good_ids(b)) == sorted(planted.good)
    assert sorted(report(tmp_path / "q")) == sorted(planted.units)


def plant_orc(root: Path) -> tuple[Planted, int]:
    """An ORC file of 5 stripes with garbage in two places; pyarrow itself says which stripes fail.

    Returns the planted dataset (good ids: those of the stripes pyarrow reads) and the
    first stripe that fails.
    """
    import pyarrow.orc as orc

    root.mkdir(parents=True)
    path = root / "a.orc"
    rows = 200_000
    table = pa.table({"id": np.arange(rows), "x": np.random.default_rng(0).random(rows)})
    orc.write_table(table, str(path), stripe_size=256 * 1024, compression="zlib")
    content = orc.ORCFile(str(path)).content_length
    corrupt(path, [(int(content * share), int(content * share) + 2000) for share in (0.1, 0.6)])
    reader = orc.ORCFile(str(path))
    good: set[int] = set()
    bad = set()
    for i in range(reader.nstripes):
        try:
            good.update(reader.read_stripe(i).column("id").to_pylist())
        except (OSError, pa.ArrowException):
            bad.add((str(path), "stripe", i, None))
    assert 0 < len(bad) < reader.nstripes  # the garbage hit some stripes, not all
    first = min(u[2] for u in bad)
    return Planted(root, "orc", frozenset(good), frozenset(bad), rows - len(good)), first


def test_orc_bad_stripes(tmp_path: Path) -> None:
    planted, first = plant_orc(tmp_path / "d")
    loader, _ = create_dataloader(str(planted.root), format="orc", num_workers=0, output_format="arrow")
    with pytest.raises(
        BadDataError, match=rf"stripe {first} \(rows \[\d+, \d+\)\) of '.*a\.orc' cannot be decoded"
    ):
        list(loader)
    quarantine = tmp_path / "q"
    lost = 0
    for rank in range(2):
        loader, _ = create_dataloader(
            str(planted.root), format="orc", num_workers=0, output_format="arrow", num_ranks=2, rank=rank,
            equal_batches="pad", split_rows=20_000, on_bad_data="quarantine", quarantine_dir=str(quarantine),
        )  # fmt: skip
        ids = [i for b in loader for i in good_ids(b)]
        lost += loader.metrics().total.bad_rows
        assert set(ids) <= planted.good
        assert len(ids) == len(set(ids))
        if rank == 0:
            first_ids = ids
    assert sorted(first_ids + ids) == sorted(planted.good)
    assert lost == planted.bad_rows  # counted once, padding aside
    assert set(report(quarantine)) == planted.units
    assert len(report(quarantine)) == len(planted.units)


def test_iceberg_bad_row_group(tmp_path: Path, iceberg_catalog: tuple[dict[str, str], Any]) -> None:
    from urllib.parse import urlparse

    from tests.fixtures.iceberg import (
        commit_deletes,
        create_id_table,
        data_files,
        id_table,
        position_delete_file,
    )

    config, catalog = iceberg_catalog
    table = create_id_table(catalog, row_group_limit=50)
    table.append(id_table(0, 200))
    (path,) = data_files(table)
    table = commit_deletes(table, [position_delete_file(table, {path: [10, 120, 121]})])
    local = Path(urlparse(path).path)
    corrupt(local, [column_chunk_range(local, 2, "id")])  # rows [100, 150), two of them deleted
    good = set(range(200)) - set(range(100, 150)) - {10}
    with pytest.raises(BadDataError, match=r"row group 2 \(rows \[100, 150\)\) of '.*' cannot be decoded"):
        list(IcebergDataset("ns.t", catalog_config=config, output_format="arrow"))
    seen: list[int] = []
    batches = []
    quarantine = tmp_path / "q"
    for rank in range(2):
        ds = IcebergDataset(
            "ns.t", catalog_config=config, output_format="arrow", num_ranks=2, rank=rank, split_rows=40,
            batch_size=16, equal_batches="pad", on_bad_data="quarantine", quarantine_dir=str(quarantine),
        )  # fmt: skip
        got = list(ds)
        batches.append((len(got), len(ds)))
        seen += [i for b in got for i in good_ids(b)]
    assert sorted(seen) == sorted(good)
    assert batches[0] == batches[1]
    assert batches[0][0] == batches[0][1]
    assert report(quarantine) == [(path, "row_group", 2, None)]


def test_counts_per_file_travel_from_workers(tmp_path: Path) -> None:
    planted = plant_parquet(tmp_path / "d", [300, 200], 50, {(0, 1), (1, 3)})
    loader, _ = create_dataloader(
        str(planted.root), num_workers=2, batch_size=64, output_format="arrow", on_bad_data="skip",
        split_rows=100, multiprocessing_context="fork",
    )  # fmt: skip
    assert sorted(i for b in loader for i in good_ids(b)) == sorted(planted.good)
    total = loader.metrics().total
    assert total.bad_rows_by_file == {
        str(planted.root / "part-0.parquet"): 50,
        str(planted.root / "part-1.parquet"): 50,
    }
    assert (total.bad_units, total.bad_rows) == (2, 100)
