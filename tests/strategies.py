"""Shared Hypothesis strategies: file layouts with row groups (some pruned) and worlds."""

from __future__ import annotations

from hypothesis import strategies as st

from torch_dataloader_utils.plan.types import FileInfo, RowGroup


@st.composite
def file_infos(draw: st.DrawFn, max_files: int = 8, max_groups: int = 6, max_rows: int = 60) -> FileInfo:
    """One file with 0..max_groups row groups of random sizes; some groups may be pruned."""
    index = draw(st.integers(0, 10_000))
    sizes = draw(st.lists(st.integers(0, max_rows), min_size=0, max_size=max_groups))
    groups = []
    first = 0
    for i, n in enumerate(sizes):
        groups.append(RowGroup(i, first, n, num_bytes=n * 8))
        first += n
    keep = draw(st.lists(st.booleans(), min_size=len(groups), max_size=len(groups)))
    live = tuple(g for g, k in zip(groups, keep, strict=True) if k)
    with_groups = draw(st.booleans())
    return FileInfo(
        f"f{index:05d}.parquet",
        size=first * 8,
        num_rows=first,
        row_groups=live if with_groups else None,
    )


@st.composite
def layouts(draw: st.DrawFn, max_files: int = 8) -> tuple[FileInfo, ...]:
    """A dataset: files with distinct paths, sorted by path."""
    files = draw(st.lists(file_infos(), min_size=1, max_size=max_files, unique_by=lambda f: f.path))
    return tuple(sorted(files, key=lambda f: f.path))


def live_row_ids(files: tuple[FileInfo, ...]) -> list[tuple[str, int]]:
    """Every live row of the dataset as ``(path, file row position)``."""
    out = []
    for f in files:
        if f.row_groups is None:
            out.extend((f.path, i) for i in range(f.num_rows or 0))
        else:
            for g in f.row_groups:
                out.extend((f.path, i) for i in range(g.first_row, g.stop_row))
    return out
