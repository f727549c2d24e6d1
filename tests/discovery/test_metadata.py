"""Metadata as columns: tables round-trip to FileInfo; shares and their errors travel as bytes."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fixtures.data import write_parquet_files
from tests.strategies import layouts
from torch_dataloader_utils.config import FileFormat, FileSourceConfig
from torch_dataloader_utils.discovery import discover
from torch_dataloader_utils.discovery.exchange import LOCAL, Exchange
from torch_dataloader_utils.discovery.listing import ListedFile
from torch_dataloader_utils.discovery.metadata import (
    FILES_SCHEMA,
    FileRows,
    SharedError,
    decode_share,
    encode_share,
    file_columns,
    file_infos,
    files_table,
    from_ipc,
    listed_files,
    listing_table,
    to_ipc,
)
from torch_dataloader_utils.errors import (
    CorruptFileError,
    DiscoveryError,
    SchemaMismatchError,
    UnknownColumnError,
)
from torch_dataloader_utils.plan.types import FileInfo, RowGroup


def _rows(files: tuple[FileInfo, ...], mtimes: list[float | None]) -> list[FileRows]:
    return [
        FileRows(
            ListedFile(f.path, f.size, m, "/base", "etag" if m is None else None),
            f.num_rows or 0,
            f.row_groups or (),
            None if i % 3 else b"schema",
        )
        for i, (f, m) in enumerate(zip(files, mtimes, strict=True))
    ]


def _from_columns(table: pa.Table) -> tuple[FileInfo, ...]:
    """The files of :func:`file_columns`, read back one by one (the reference)."""
    c = file_columns(table)
    out = []
    for i in range(len(c["size"])):
        path = bytes(c["paths_blob"][c["path_offsets"][i] : c["path_offsets"][i + 1]]).decode()
        lo, hi = c["group_offsets"][i], c["group_offsets"][i + 1]
        groups = tuple(
            RowGroup(
                int(c["group_index"][g]),
                int(c["group_first_row"][g]),
                int(c["group_rows"][g]),
                int(c["group_bytes"][g]),
            )
            for g in range(lo, hi)
        )
        mtime = float(c["mtime"][i])
        out.append(
            FileInfo(path, int(c["size"][i]), int(c["rows"][i]), groups, None if math.isnan(mtime) else mtime)
        )
    return tuple(out)


@given(layouts(), st.data())
def test_files_table_round_trips_to_file_infos(files: tuple[FileInfo, ...], data: st.DataObject) -> None:
    mtimes = data.draw(st.lists(st.none() | st.floats(0, 2e9), min_size=len(files), max_size=len(files)))
    rows = _rows(files, mtimes)
    table = files_table(rows)
    assert table.schema.equals(FILES_SCHEMA)
    expected = tuple(
        dataclasses.replace(f, row_groups=f.row_groups or (), num_rows=f.num_rows or 0, mtime=m)
        for f, m in zip(files, mtimes, strict=True)
    )
    assert file_infos(table) == expected
    assert file_infos(from_ipc(to_ipc(table))) == expected
    # Any slice of the table (a rank's share) converts to the same files.
    cut = data.draw(st.integers(0, len(files)))
    assert file_infos(table.slice(cut)) == expected[cut:]
    # The same files as numpy columns, whole or sliced (Arrow offsets rebased).
    assert _from_columns(table) == expected
    stop = data.draw(st.integers(cut, len(files)))
    assert _from_columns(table.slice(cut, stop - cut)) == expected[cut:stop]


def test_listing_table_round_trips() -> None:
    listed = [
        ListedFile("/d/a.parquet", 10, 1.5, "/d", None),
        ListedFile("/d/x=1/b.parquet", 20, None, "/d", "abc"),
        ListedFile("/e/c.parquet", 30, 2.0, None, None),
    ]
    table = from_ipc(to_ipc(listing_table(listed)))
    assert listed_files(table) == listed
    assert listed_files(table, 1, 3) == listed[1:]


@pytest.mark.parametrize(
    ("error", "cls"),
    [
        (SharedError(7, "CorruptFileError", "cannot read x"), CorruptFileError),
        (SharedError(1, "SchemaMismatchError", "field 'a'"), SchemaMismatchError),
        (SharedError(2, "ValueError", "odd"), ValueError),
        (SharedError(3, "SomethingOdd", "odd"), DiscoveryError),
    ],
)
def test_a_share_carries_its_first_error(error: SharedError, cls: type[Exception]) -> None:
    table, got = decode_share(encode_share(files_table([]), error))
    assert got == error
    assert table.num_rows == 0
    raised = got.exception()
    assert type(raised) is cls
    assert error.message in str(raised)
    table, got = decode_share(encode_share(files_table([])))
    assert got is None


class _TwoRanks:
    """An exchange standing for one rank of two, the other rank's share given."""

    def __init__(self, rank: int, other: bytes | None = None) -> None:
        self._rank = rank
        self.other = other
        self.sent: bytes | None = None

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return 2

    def from_rank0(self, read):  # type: ignore[no-untyped-def]
        return read()

    def all_gather(self, payload: bytes) -> list[bytes]:
        self.sent = payload
        empty = files_table([]).drop_columns(["path", "size", "mtime", "etag"])
        other = self.other if self.other is not None else encode_share(empty)
        return [payload, other] if self._rank == 0 else [other, payload]


def test_each_rank_reads_its_share_and_the_shares_join(tmp_path: Path) -> None:
    write_parquet_files(tmp_path, [30, 20, 10, 40, 50], row_group_size=10)
    source = FileSourceConfig(format=FileFormat.PARQUET)
    alone = discover(str(tmp_path), source, share=LOCAL)
    one = _TwoRanks(1)
    assert isinstance(one, Exchange)
    with pytest.raises(DiscoveryError, match="rank 0 of 2 sent the footers of 0 files, not the 2"):
        discover(str(tmp_path), source, share=one)  # rank 0's share is missing here
    assert one.sent is not None
    share1, error = decode_share(one.sent)
    assert error is None
    assert share1.column("num_rows").to_pylist() == [f.num_rows for f in alone.files[2:]]  # [5*1//2, 5)
    assert "path" not in share1.column_names  # every rank has the listing: not sent again
    zero = _TwoRanks(0, other=one.sent)
    found = discover(str(tmp_path), source, share=zero)
    assert found.files == alone.files
    # A small dataset's footers travel with the shares, for the readers of every rank.
    assert list(found.footers or ()) == [f.path for f in alone.files]
    assert found.metadata is not None
    assert alone.metadata is not None
    assert found.metadata.equals(alone.metadata)


def test_an_error_in_the_other_share_is_raised_here(tmp_path: Path) -> None:
    write_parquet_files(tmp_path, [30, 20, 10], row_group_size=10)
    source = FileSourceConfig(format=FileFormat.PARQUET)
    empty = files_table([]).drop_columns(["path", "size", "mtime", "etag"])
    other = encode_share(empty, SharedError(2, "CorruptFileError", "cannot read part-0002"))
    with pytest.raises(CorruptFileError, match="cannot read part-0002"):
        discover(str(tmp_path), source, share=_TwoRanks(0, other=other))


def test_a_bad_request_travels_too_so_no_rank_waits(tmp_path: Path) -> None:
    """Every rank resolves the request from the first footer; its error goes through the exchange."""
    write_parquet_files(tmp_path, [30, 20, 10], row_group_size=10)
    one = _TwoRanks(1)
    with pytest.raises(UnknownColumnError, match="nope"):
        discover(str(tmp_path), FileSourceConfig(format=FileFormat.PARQUET, columns=["nope"]), share=one)
    assert one.sent is not None  # it took part in the all-gather before raising
    _, error = decode_share(one.sent)
    assert error is not None
    assert (error.index, error.kind) == (-1, "UnknownColumnError")
    (tmp_path / "part-0000.parquet").write_bytes(b"x" * 100)  # the first file is the schema
    one = _TwoRanks(1)
    with pytest.raises(CorruptFileError, match=r"part-0000\.parquet"):
        discover(str(tmp_path), FileSourceConfig(format=FileFormat.PARQUET), share=one)
    assert one.sent is not None
    _, error = decode_share(one.sent)
    assert error is not None
    assert (error.index, error.kind) == (0, "CorruptFileError")


def test_the_planner_table_is_built_from_the_columns(tmp_path: Path) -> None:
    """Parquet: the planner's file table comes from discovery's columns, equal to one built
    from the FileInfo objects; counted filters change the files, so the columns are dropped."""
    import numpy as np
    import pyarrow.compute as pc

    from torch_dataloader_utils import StructuredDataset
    from torch_dataloader_utils.plan.table import FileTable

    write_parquet_files(tmp_path, [300, 200, 50], row_group_size=[100, 60, 50])
    ds = StructuredDataset(str(tmp_path), split_rows=70, shuffle=False)
    assert ds.discovered.metadata is not None
    table, ref = ds.file_table, FileTable.from_infos(ds.files)
    assert table.digest() == ref.digest()
    for name in ("size", "rows", "live", "group_offsets", "group_first_row", "group_rows", "path_offsets"):
        assert np.array_equal(getattr(table, name), getattr(ref, name)), name
    assert [table.info(i) for i in range(len(table))] == list(ds.files)
    ids = np.concatenate([b["id"].numpy() for b in ds])
    assert np.array_equal(np.sort(ids), np.arange(550))
    counted = StructuredDataset(str(tmp_path), filters=pc.field("id") < 130, count_rows=True, shuffle=False)
    assert counted.discovered.metadata is None
    ref = FileTable.from_infos(counted.files)
    assert counted.file_table.digest() == ref.digest()
    assert np.array_equal(counted.file_table.live, ref.live)  # the counted rows, not the footers'
    assert int(counted.file_table.live.sum()) == 130
    assert np.array_equal(np.sort(np.concatenate([b["id"].numpy() for b in counted])), np.arange(130))
