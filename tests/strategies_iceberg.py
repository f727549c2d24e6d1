"""Hypothesis strategies for Iceberg tables with deletes (shared by the Iceberg tests)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.compute as pc
from hypothesis import strategies as st


@dataclass(frozen=True)
class TableHistory:
    """A table's commits, in order.

    Attributes:
        appends: Rows of each appended data file (ids are consecutive across appends).
        row_group_limit: Rows per Parquet row group.
        position_deletes: For each append (by index), the file positions deleted after it.
        equality_deletes: ``(after_append, ids)``: equality deletes of ``ids`` committed
            right after that append (they spare files appended later).
    """

    appends: tuple[int, ...]
    row_group_limit: int
    position_deletes: tuple[frozenset[int], ...]
    equality_deletes: tuple[tuple[int, frozenset[int]], ...]


@st.composite
def table_histories(draw: st.DrawFn, max_appends: int = 3, max_rows: int = 40) -> TableHistory:
    """Random appends, row groups, position deletes and equality deletes."""
    appends = tuple(draw(st.lists(st.integers(1, max_rows), min_size=1, max_size=max_appends)))
    total = sum(appends)
    positions = tuple(frozenset(draw(st.sets(st.integers(0, n - 1), max_size=n))) for n in appends)
    equality = tuple(
        draw(
            st.lists(
                st.tuples(
                    st.integers(0, len(appends) - 1), st.frozensets(st.integers(0, total - 1), max_size=6)
                ),
                max_size=2,
            )
        )
    )
    return TableHistory(appends, draw(st.integers(1, 8)), positions, equality)


@dataclass(frozen=True)
class ReadSetup:
    """How a table is read: split size, ranks, workers, shuffle."""

    split_rows: int
    num_ranks: int
    num_workers: int
    shuffle: bool
    seed: int
    epoch: int


read_setups = st.builds(
    ReadSetup,
    split_rows=st.integers(1, 25),
    num_ranks=st.integers(1, 3),
    num_workers=st.integers(1, 3),
    shuffle=st.booleans(),
    seed=st.integers(0, 5),
    epoch=st.integers(0, 2),
)


@st.composite
def row_filters(draw: st.DrawFn, max_id: int = 120) -> pc.Expression | None:
    """``None`` or a pyarrow filter over :func:`tests.fixtures.iceberg.id_table`'s columns."""
    kind = draw(st.sampled_from(["none", "none", "id", "label_or_x", "s", "odd"]))
    if kind == "none":
        return None
    if kind == "id":
        return pc.field("id") >= draw(st.integers(0, max_id))
    if kind == "label_or_x":
        return (pc.field("label") < draw(st.integers(0, 7))) | (
            pc.field("x") >= draw(st.integers(0, max_id)) / 2
        )
    if kind == "s":
        return pc.field("s") >= f"row-{draw(st.integers(0, max_id))}"  # string order, not numeric
    return pc.field("id") > draw(st.integers(0, max_id)) + 0.5  # oddly typed: not used for pruning
