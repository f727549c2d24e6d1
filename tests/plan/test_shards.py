"""Resharding plans (plan/shards.py): every source row in exactly one shard, shards sized exactly."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.strategies import chunk_cells, layouts, live_row_ids, more_examples
from torch_dataloader_utils.plan.shards import Run, cut_shards, pack_sizes, plan_reduce
from torch_dataloader_utils.plan.types import Chunk, FileInfo


def _row_cells(chunks: list[Chunk], files: dict[str, FileInfo]) -> Counter[tuple[str, int]]:
    return Counter((path, row) for c in chunks for path, _, row in chunk_cells(c, files))


@more_examples()
@given(files=layouts(), shard_rows=st.integers(1, 90), ranks=st.integers(1, 4))
def test_cut_shards_puts_every_row_in_exactly_one_shard(
    files: tuple[FileInfo, ...], shard_rows: int, ranks: int
) -> None:
    by_path = {f.path: f for f in files}
    chunks = [Chunk.rows(f) for f in files]
    shards = cut_shards(chunks, by_path, shard_rows)
    every = [c for shard in shards for c in shard]
    assert _row_cells(every, by_path) == Counter(live_row_ids(files))
    sizes = [sum(c.num_rows or 0 for c in shard) for shard in shards]
    assert all(size == shard_rows for size in sizes[:-1])  # exact, except the last
    assert 0 <= sizes[-1] <= shard_rows
    # Ranks take shards [rank::ranks]: their shares partition the shards.
    shares = [shards[r::ranks] for r in range(ranks)]
    assert sorted(id(s) for share in shares for s in share) == sorted(id(s) for s in shards)


def test_cut_shards_cuts_inside_a_chunk_and_keeps_unknown_counts_whole() -> None:
    f = FileInfo("a", size=1000, num_rows=100)
    t = FileInfo("t.csv", size=500)
    shards = cut_shards([Chunk.rows(f), Chunk.bytes(t)], {"a": f, "t.csv": t}, 40, rows_of=lambda c: 30)
    assert [[(c.path, c.start, c.stop) for c in s] for s in shards] == [
        [("a", 0, 40)],
        [("a", 40, 80)],
        [("a", 80, 100), ("t.csv", 0, 500)],  # 20 + ~30 estimated rows, the text chunk whole
    ]
    assert cut_shards([], {}, 10) == [()]  # an empty source still makes one (empty) shard
    with pytest.raises(ValueError, match="shard_rows"):
        cut_shards([], {}, 0)


@given(sizes=st.lists(st.integers(0, 50), max_size=40), target=st.integers(1, 120))
def test_pack_sizes_keeps_items_whole_and_bins_near_the_target(sizes: list[int], target: int) -> None:
    bins = pack_sizes(sizes, target)
    assert [i for b in bins for i in b] == list(range(len(sizes)))
    largest = max(sizes, default=0)
    for b in bins[:-1]:
        total = sum(sizes[i] for i in b)
        # Within half an item of the target, unless the bin is one item larger than it.
        assert abs(total - target) <= largest / 2 or sum(1 for i in b if sizes[i]) == 1


runs_strategy = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 7), st.integers(0, 40)),  # partition, bucket, rows
    max_size=30,
)


@more_examples()
@given(raw=runs_strategy, tasks=st.integers(1, 4), shard_rows=st.integers(1, 60), whole=st.booleans())
def test_plan_reduce_covers_every_row_once_and_never_mixes_partitions(
    raw: list[tuple[int, int, int]], tasks: int, shard_rows: int, whole: bool
) -> None:
    runs = [Run(i % tasks, i // tasks, p, b, n) for i, (p, b, n) in enumerate(raw)]
    by_key = {(r.task, r.index): r for r in runs}
    shards = plan_reduce(runs, shard_rows, whole_buckets=whole)
    seen: Counter[tuple[int, int, int]] = Counter()
    bucket_home: dict[tuple[int, int], int] = {}
    for number, shard in enumerate(shards):
        assert shard.rows > 0
        for seg in shard.segments:
            run = by_key[(seg.task, seg.index)]
            assert run.partition == shard.partition  # one partition per shard
            assert 0 <= seg.offset <= seg.offset + seg.rows <= run.rows
            seen.update((seg.task, seg.index, row) for row in range(seg.offset, seg.offset + seg.rows))
            if whole:  # a bucket (a group key's rows) never spans two shards
                assert bucket_home.setdefault((run.partition, run.bucket), number) == number
    assert seen == Counter((r.task, r.index, row) for r in runs for row in range(r.rows))
    if not whole:
        for partition in {s.partition for s in shards}:
            sizes = [s.rows for s in shards if s.partition == partition]
            assert all(size == shard_rows for size in sizes[:-1])
