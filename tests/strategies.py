"""Shared Hypothesis strategies and oracles for the planning core.

Strategies build *values* only (``FileInfo``, split configs, world sizes), so every
test that plans can be shrunk by Hypothesis. The oracles expand chunks and files into
the exact cells (``(path, row)`` or ``(path, byte)``) they stand for, so properties can
compare multisets instead of trusting the code under test.

Custom split strategies for tests:

* :class:`HalfFileLegacy` has the older ``generate(files, num_workers, epoch)``
  signature and returns every chunk of the dataset (two halves per file).
* :class:`HalfFileSharded` has the current signature and returns only its rank's share.
* :class:`EveryChunkOnEveryRank` has the current signature but forgets to shard: every
  rank gets every chunk (the planner must refuse it with ``OverlappingChunksError``).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

from torch_dataloader_utils.plan.mixing import MixSchedule, RowMixing
from torch_dataloader_utils.plan.pieces import Piece, ReadMode
from torch_dataloader_utils.plan.shuffle import permutation
from torch_dataloader_utils.plan.splits import ByteRangeSplit, FileSplit, RowGroupSplit, resolve_strategy
from torch_dataloader_utils.plan.table import FileWithDeletes
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, FileInfo, RecordIndex, RowGroup

__all__ = [
    "file_infos",
    "piece_rows",
    "layouts",
    "live_row_ids",
    "Cell",
    "EveryChunkOnEveryRank",
    "HalfFileLegacy",
    "HalfFileSharded",
    "builtin_splits",
    "chunk_cells",
    "clone_files",
    "clone_strategy",
    "epochs",
    "file_layouts",
    "half_file_chunks",
    "live_cells",
    "more_examples",
    "num_ranks",
    "num_workers",
    "quiet_resolve",
    "rich_layouts",
    "rich_splits",
    "seeds",
    "split_strategies",
]

Cell = tuple[str, str, int]
"""``(path, unit, position)``: one row (unit ``"rows"``) or one byte (``"bytes"``) of a file."""

# ---------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------


@st.composite
def _row_group_file(draw: st.DrawFn, path: str) -> FileInfo:
    """A columnar file: random row groups (some empty), some pruned by statistics."""
    n_groups = draw(st.integers(0, 6))
    rows = draw(st.lists(st.integers(0, 40), min_size=n_groups, max_size=n_groups))
    sizes = draw(st.lists(st.integers(0, 600), min_size=n_groups, max_size=n_groups))
    kept = draw(st.lists(st.booleans(), min_size=n_groups, max_size=n_groups))
    groups, first = [], 0
    for i, (n, b) in enumerate(zip(rows, sizes, strict=True)):
        groups.append(RowGroup(i, first, n, b))
        first += n
    live = tuple(g for g, keep in zip(groups, kept, strict=True) if keep)
    # num_rows counts every row of the file, pruned groups included.
    return FileInfo(path, size=sum(sizes) + 8, num_rows=first, row_groups=live)


@st.composite
def _rows_only_file(draw: st.DrawFn, path: str) -> FileInfo:
    """A file whose row count is known but which has no row-group metadata."""
    n = draw(st.integers(0, 80))
    return FileInfo(path, size=draw(st.integers(n, 4 * n + 16)), num_rows=n)


@st.composite
def _bytes_only_file(draw: st.DrawFn, path: str) -> FileInfo:
    """A text file before any count pass: only its size is known."""
    return FileInfo(path, size=draw(st.integers(0, 200)))


@st.composite
def file_layouts(draw: st.DrawFn, min_files: int = 0, max_files: int = 6) -> list[FileInfo]:
    """A dataset's files in sorted path order, mixing the three kinds of metadata."""
    n = draw(st.integers(min_files, max_files))
    files = []
    for i in range(n):
        path = f"data/part-{i:03d}.parquet"
        kind = draw(st.sampled_from(["row_groups", "row_groups", "rows_only", "bytes_only"]))
        if kind == "row_groups":
            files.append(draw(_row_group_file(path)))
        elif kind == "rows_only":
            files.append(draw(_rows_only_file(path)))
        else:
            files.append(draw(_bytes_only_file(path)))
    return files


@st.composite
def row_group_files(draw: st.DrawFn, max_files: int = 6) -> list[FileInfo]:
    """Files that all carry row-group metadata (for packing properties)."""
    n = draw(st.integers(1, max_files))
    return [draw(_row_group_file(f"rg/part-{i:03d}.parquet")) for i in range(n)]


@st.composite
def _text_file(draw: st.DrawFn, path: str) -> FileInfo:
    """A text file: counted in blocks (a ``RecordIndex``) or not, splittable or not."""
    size = draw(st.integers(0, 400))
    records = None
    if draw(st.booleans()):
        block = draw(st.integers(1, 90))
        n = -(-size // block)
        records = RecordIndex(block, tuple(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))))
    return FileInfo(path, size=size, records=records, splittable=draw(st.booleans()))


@st.composite
def _deleted_rows_file(draw: st.DrawFn, path: str) -> FileInfo:
    """A columnar file with deleted positions (Iceberg position / equality deletes)."""
    base = draw(_row_group_file(path))
    assert base.num_rows is not None
    live = [r for g in base.row_groups or () for r in range(g.first_row, g.stop_row)]
    deleted = sorted(set(draw(st.lists(st.sampled_from(live), max_size=12)))) if live else []
    if not deleted:
        return base
    return FileWithDeletes(
        path, base.size, base.num_rows, base.row_groups, deleted=np.array(deleted, dtype=np.int64)
    )


@st.composite
def rich_layouts(draw: st.DrawFn, min_files: int = 0, max_files: int = 6) -> list[FileInfo]:
    """:func:`file_layouts` plus counted text files and files with deleted positions."""
    n = draw(st.integers(min_files, max_files))
    files = []
    for i in range(n):
        path = f"data/part-{i:03d}"
        kind = draw(st.sampled_from(["row_groups", "rows_only", "bytes_only", "text", "deletes"]))
        if kind == "row_groups":
            files.append(draw(_row_group_file(path)))
        elif kind == "rows_only":
            files.append(draw(_rows_only_file(path)))
        elif kind == "bytes_only":
            files.append(draw(_bytes_only_file(path)))
        elif kind == "text":
            files.append(draw(_text_file(path)))
        else:
            files.append(draw(_deleted_rows_file(path)))
    return files


def rich_splits() -> st.SearchStrategy[FileSplit | RowGroupSplit | ByteRangeSplit]:
    """Every built-in strategy, with and without size targets."""
    return st.one_of(builtin_splits(), st.builds(ByteRangeSplit, split_bytes=st.integers(1, 300)))


def clone_files(files: Iterable[FileInfo]) -> list[FileInfo]:
    """Equal files built again from their values: no object is shared with ``files``."""
    return [
        FileInfo(
            str(f.path),
            int(f.size),
            None if f.num_rows is None else int(f.num_rows),
            None
            if f.row_groups is None
            else tuple(RowGroup(g.index, g.first_row, g.num_rows, g.num_bytes) for g in f.row_groups),
            f.mtime,
        )
        for f in files
    ]


# ---------------------------------------------------------------------------------------
# Split strategies
# ---------------------------------------------------------------------------------------


def half_file_chunks(files: Sequence[FileInfo]) -> list[Chunk]:
    """Every file cut in two halves: by rows when known, else by bytes."""
    out = []
    for f in files:
        n = f.num_rows if f.num_rows is not None else f.size
        make = Chunk.rows if f.num_rows is not None else Chunk.bytes
        mid = n // 2
        out.extend(make(f, a, b) for a, b in ((0, mid), (mid, n)) if a < b)
    return out


class HalfFileLegacy:
    """Older signature: returns every chunk of the dataset, whatever the rank."""

    def generate(self, files: Sequence[FileInfo], num_workers: int, epoch: int) -> list[Chunk]:
        return half_file_chunks(files)


class HalfFileSharded:
    """Current signature, sharding correctly: rank ``r`` gets chunks ``[r::num_ranks]``."""

    def generate(
        self, files: Sequence[FileInfo], num_workers: int, epoch: int, *, num_ranks: int, rank: int
    ) -> list[Chunk]:
        return half_file_chunks(files)[rank::num_ranks]


class EveryChunkOnEveryRank:
    """Current signature, buggy: ignores ``rank`` and returns every chunk on every rank."""

    def generate(
        self, files: Sequence[FileInfo], num_workers: int, epoch: int, *, num_ranks: int, rank: int
    ) -> list[Chunk]:
        return half_file_chunks(files)


def builtin_splits() -> st.SearchStrategy[FileSplit | RowGroupSplit]:
    """``FileSplit()`` or ``RowGroupSplit`` with or without byte and row targets."""
    return st.one_of(
        st.just(FileSplit()),
        st.builds(
            RowGroupSplit,
            split_bytes=st.none() | st.integers(1, 1500),
            split_rows=st.none() | st.integers(1, 120),
        ),
    )


def split_strategies() -> st.SearchStrategy[Any]:
    """What a user may pass: a built-in split or a custom strategy of either signature."""
    return st.one_of(builtin_splits(), st.just(HalfFileLegacy()), st.just(HalfFileSharded()))


def clone_strategy(strategy: Any) -> Any:
    """An equal strategy object built again from its values."""
    if isinstance(strategy, RowGroupSplit):
        return RowGroupSplit(split_bytes=strategy.split_bytes, split_rows=strategy.split_rows)
    return type(strategy)()


def quiet_resolve(strategy: Any) -> Any:
    """``resolve_strategy`` without the older-signature warning (tested on its own)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return resolve_strategy(strategy)


# ---------------------------------------------------------------------------------------
# World and epochs
# ---------------------------------------------------------------------------------------

num_ranks = st.integers(1, 16)
"""Ranks in the job."""
num_workers = st.integers(0, 8).map(lambda n: max(n, 1))
"""Workers a plan is made for: a DataLoader with ``num_workers=0`` plans one worker."""
epochs = st.integers(0, 1000)
seeds = st.integers(0, 2**70) | st.integers(0, 50)


def more_examples(factor: int = 4) -> settings:
    """Settings for the central properties: ``factor`` times the active profile's examples."""
    return settings(max_examples=factor * settings.default.max_examples)


# ---------------------------------------------------------------------------------------
# Oracles
# ---------------------------------------------------------------------------------------


def live_cells(files: Iterable[FileInfo]) -> Counter[Cell]:
    """Every row an epoch must yield (rows of unpruned groups), or every byte when rows are unknown."""
    cells: Counter[Cell] = Counter()
    for f in files:
        if f.row_groups is not None:
            cells.update((f.path, "rows", r) for g in f.row_groups for r in range(g.first_row, g.stop_row))
        elif f.num_rows is not None:
            cells.update((f.path, "rows", r) for r in range(f.num_rows))
        else:
            cells.update((f.path, "bytes", b) for b in range(f.size))
    return cells


def chunk_cells(chunk: Chunk, files_by_path: dict[str, FileInfo]) -> list[Cell]:
    """The rows (or bytes) a reader yields for ``chunk``: pruned groups yield nothing."""
    f = files_by_path[chunk.path]
    if chunk.unit is ChunkUnit.BYTES:
        return [(f.path, "bytes", b) for b in range(chunk.start, chunk.stop)]
    if f.row_groups is None:
        assert f.num_rows is not None
        return [(f.path, "rows", r) for r in range(max(chunk.start, 0), min(chunk.stop, f.num_rows))]
    return [
        (f.path, "rows", r)
        for g in f.row_groups
        for r in range(max(chunk.start, g.first_row), min(chunk.stop, g.stop_row))
    ]


# Strategies of the equal-batches properties (tests/plan/test_equal_batches.py).


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


def piece_rows(piece: Piece, files: Mapping[str, FileInfo]) -> list[tuple[str, int, bool]]:
    """Every row a piece emits, in order, as ``(path, file row, padding)`` (for checks).

    Only for chunks counted in rows; a window is its chunks' rows in a permutation by
    its key, a mix its streams' rows in the rounds of its schedule, restricted to
    ``[lo, hi)``.
    """
    if piece.mode is ReadMode.MIX and piece.mix is not None and piece.key is not None:
        streams = [_chunk_rows(c, files) for c in piece.chunks]
        schedule = MixSchedule([c.weight for c in piece.chunks], piece.mix.rows, piece.key)
        counts = [len(s) for s in streams]
        mixed: list[tuple[str, int, bool]] = []
        taken = [0] * len(streams)
        for index in range(schedule.num_rounds(counts)):
            lengths = schedule.round_lengths(index, counts)
            pool = [row for c, n in enumerate(lengths) for row in streams[c][taken[c] : taken[c] + int(n)]]
            taken = [t + int(n) for t, n in zip(taken, lengths, strict=True)]
            mixed.extend(pool[i] for i in schedule.order(index, lengths))
        return mixed[piece.lo : piece.hi]
    rows = [row for chunk in piece.chunks for row in _chunk_rows(chunk, files)]
    if piece.key is not None:
        order = permutation(len(rows), piece.key[0], piece.key[1], *piece.key[2:])
        rows = [rows[i] for i in order]
    return rows[piece.lo : piece.hi]


def _chunk_rows(chunk: Chunk, files: Mapping[str, FileInfo]) -> list[tuple[str, int, bool]]:
    rows: list[tuple[str, int, bool]] = []
    info = files[chunk.path]
    if info.row_groups is None:
        stop = min(chunk.stop, info.num_rows or 0)
        rows.extend((chunk.path, i, chunk.padding) for i in range(chunk.start, stop))
    else:
        for g in info.groups_in(chunk.start, chunk.stop):
            lo, hi = max(chunk.start, g.first_row), min(chunk.stop, g.stop_row)
            rows.extend((chunk.path, i, chunk.padding) for i in range(lo, hi))
    deleted = set(getattr(info, "deleted", None) if getattr(info, "deleted", None) is not None else ())
    return [r for r in rows if r[1] not in deleted]


@st.composite
def cut_pieces(draw: st.DrawFn) -> tuple[Piece, dict[str, FileInfo]]:
    """A file-order piece, a window or a mix over chunks of random files (some with deletes).

    Cut to a random ``[lo, hi)``.
    """
    files = {}
    for f in draw(layouts(max_files=4)):
        live = [row for _, row in live_row_ids((f,))]
        if live and draw(st.booleans()):  # deleted positions lie in live row groups only
            deleted = sorted(draw(st.sets(st.sampled_from(live), max_size=len(live))))
            f = FileWithDeletes(
                f.path, f.size, f.num_rows, f.row_groups, deleted=np.asarray(deleted, np.int64)
            )
        files[f.path] = f
    chunks = []
    for f in files.values():
        n = f.num_rows or 0
        cut = draw(st.integers(0, n))
        chunks.extend(Chunk.rows(f, a, b) for a, b in ((0, cut), (cut, n)) if a < b)
    chunks = [c for c in chunks if draw(st.booleans())] or chunks[:1]
    if not chunks:
        chunks = [Chunk.rows(next(iter(files.values())), 0, 0)]
    kind = draw(st.sampled_from(["file", "window", "mix"]))
    key = (draw(st.integers(0, 9)), draw(st.integers(0, 3)), 0, draw(st.integers(0, 2)))
    if kind == "file":
        piece = Piece.file(chunks[0])
    elif kind == "window":
        piece = Piece.window(chunks, key)
    else:
        piece = Piece.mixed(chunks, key, RowMixing(rows=draw(st.integers(1, 40)), streams=len(chunks)))
    total = sum(c.num_rows or 0 for c in piece.chunks)
    lo = draw(st.integers(0, total))
    hi = draw(st.none() | st.integers(lo, total + 3))
    return Piece(piece.chunks, piece.key, lo, hi, piece.mix), files
