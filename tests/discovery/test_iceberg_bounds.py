"""Which data files may hold twins of each other's rows, from their manifest column bounds."""

from __future__ import annotations

from typing import Any

from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record
from pyiceberg.types import DoubleType, LongType, StringType

from torch_dataloader_utils.discovery.iceberg_bounds import may_match

TYPES = {1: LongType(), 2: StringType(), 3: DoubleType()}


def data_file(
    path: str, bounds: dict[int, tuple[Any, Any]], nulls: dict[int, int], nans: dict[int, int]
) -> Any:
    """A real ``DataFile`` with lower and upper bounds (by field id) and null / NaN counts."""
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=10,
        file_size_in_bytes=100,
        lower_bounds={fid: to_bytes(TYPES[fid], lo) for fid, (lo, _) in bounds.items()},
        upper_bounds={fid: to_bytes(TYPES[fid], hi) for fid, (_, hi) in bounds.items()},
        null_value_counts=nulls,
        nan_value_counts=nans,
    )


def test_a_column_whose_ranges_do_not_meet_rules_out_twins() -> None:
    removed = {"r": data_file("r", {1: (100, 199), 2: ("a", "m")}, {1: 0, 2: 0}, {})}
    added = {
        "below": data_file("below", {1: (0, 99), 2: ("a", "z")}, {1: 0, 2: 0}, {}),
        "inside": data_file("inside", {1: (150, 160), 2: ("b", "c")}, {1: 0, 2: 0}, {}),
        "strings": data_file("strings", {1: (150, 160), 2: ("n", "z")}, {1: 0, 2: 0}, {}),
        "edge": data_file("edge", {1: (199, 300), 2: ("m", "z")}, {1: 0, 2: 0}, {}),
    }
    assert may_match(added, removed, TYPES) == {"inside", "edge"}
    assert may_match(removed, added, TYPES) == {"r"}
    assert may_match(added, {}, TYPES) == set()


def test_nulls_nan_and_missing_bounds_on_both_sides_keep_files() -> None:
    removed = {"r": data_file("r", {1: (100, 199), 3: (0.0, 1.0)}, {1: 2, 3: 0}, {3: 1})}
    null_ids = data_file("n", {1: (0, 9)}, {1: 1}, {})  # nulls in id on both sides: id does not separate
    nan_x = data_file("x", {1: (150, 160), 3: (5.0, 6.0)}, {1: 0, 3: 0}, {3: 2})  # NaN on both sides
    no_bounds = data_file("b", {}, {}, {})
    clean = data_file("c", {1: (0, 9)}, {1: 0}, {})  # no nulls here: id separates
    added = {"n": null_ids, "x": nan_x, "b": no_bounds, "c": clean}
    assert may_match(added, removed, TYPES) == {"n", "x", "b"}
