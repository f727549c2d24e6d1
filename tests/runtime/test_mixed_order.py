"""The mixed order with workers, ``stop`` epochs and resume (issue 32).

* Every lane's last batch (the one that takes what the anchor has left, filled up by
  weight: off the weights) comes at the end of the epoch, not in its middle: the main
  process hands the lanes' batches on in the plan's order (batch ``t`` of every lane,
  then ``t + 1``), whatever order their groups arrived in.
* ``on_exhausted="stop"`` epochs all have the length of the source whose epoch is
  shortest at its weight, and ``len(loader)`` says it.
* A resume in the same world (ranks and workers) hands on the same batches, in the same
  order, as the uninterrupted run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.orders import SOURCE_BASE, Planted, planted_parquet, read_pass
from tests.hostile.test_bad_data import plant_parquet
from torch_dataloader_utils import create_mixed_dataloader

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[Planted]:
    base = tmp_path_factory.mktemp("mixed-order")
    sizes = ((2400, 2400, 2400), (900, 900, 900), (1000, 1000))
    return [
        planted_parquet(base / f"s{s}", n, start=s * SOURCE_BASE, group_rows=400) for s, n in enumerate(sizes)
    ]


def make(sources: Sequence[Planted], weights: Sequence[float] = (60, 30, 10), **options: Any) -> Any:
    return create_mixed_dataloader(
        [{"path": s.path} for s in sources], list(weights), columns=["id", "x"], **options
    )


def on_weight(counts: np.ndarray, weights: Sequence[float], batch: int) -> np.ndarray:
    """Whether every batch holds every source's share of its rows within one row."""
    share = np.asarray(weights, dtype=float) / sum(weights) * batch
    return np.abs(counts - share).max(axis=1) < 1


def test_every_lanes_last_batch_comes_at_the_end(sources: list[Planted]) -> None:
    """Batch 128, weights 60/30/10, 2 workers: the off-weight batches were in the middle (issue 32)."""
    loader, dataset = make(sources, batch_size=128, num_workers=2, source_column="source", shuffle=True)
    batches = list(loader)
    for b in batches:  # joined in the workers' transfer buffers: every row beside its own source
        assert (b["id"] // SOURCE_BASE == b["source"]).all()
    counts = np.array([np.bincount(b["source"].numpy(), minlength=3) for b in batches])
    assert len(counts) == len(loader) == 2 * dataset.pass_plan().batches
    off = np.flatnonzero(~on_weight(counts, (60, 30, 10), 128))
    assert off.tolist() == [len(counts) - 2, len(counts) - 1]  # the two lanes' last batches, last


def test_stop_epochs_have_the_length_of_the_shortest_source(sources: list[Planted]) -> None:
    """``stop`` epochs had other lengths (300, 200, 100, 300, ...): now each is the shortest source's."""
    loader, dataset = make(
        sources, (5, 3, 2), batch_size=30, num_workers=0, on_exhausted="stop", shuffle=True
    )
    assert dataset.anchor == 1  # 2,700 rows at weight 3 is the shortest epoch (7,200 at 5, 2,000 at 2)
    lengths = []
    for epoch in range(6):
        dataset.set_epoch(epoch)
        said = len(loader)
        got = sum(1 for _ in loader)
        assert said == got
        lengths.append(got)
    assert max(lengths) - min(lengths) <= 1, lengths
    assert abs(lengths[0] - 2700 / 9) <= 1  # its rows over its rows per batch (9 of every 30)


@settings(max_examples=12)
@given(workers=st.integers(0, 2), ranks=st.integers(1, 2), shuffle=st.booleans(), data=st.data())
def test_a_resume_in_the_same_world_hands_on_the_same_batches(
    sources: list[Planted], workers: int, ranks: int, shuffle: bool, data: Any
) -> None:
    """Every lane goes on with the same pass from its own batch; the loop gets the uninterrupted batches."""
    options = {"batch_size": 16, "shuffle": shuffle, "shuffle_seed": 2, "num_ranks": ranks}

    def build(rank: int) -> Any:
        return make(sources, num_workers=workers, rank=rank, **options)[1]

    whole = [read_pass(build(r), workers) for r in range(ranks)]
    stop = data.draw(st.integers(1, len(whole[0]) - 1), label="stop")
    saving = [build(r) for r in range(ranks)]
    before = [read_pass(ds, workers, stop) for ds in saving]
    from torch_dataloader_utils import merge_states

    state = merge_states([json.loads(json.dumps(ds.state_dict())) for ds in saving])
    resumed = [build(r) for r in range(ranks)]
    for ds in resumed:
        ds.load_state_dict(state)
        assert ds.remaining_batches == len(whole[0]) - stop
        assert len(ds) == len(whole[0])
    after = [read_pass(ds, workers) for ds in resumed]
    assert [b + a for b, a in zip(before, after, strict=True)] == whole


@pytest.mark.parametrize("workers", [0, 2])
def test_real_workers_resume_batch_identically(sources: list[Planted], workers: int) -> None:
    """Through the loader of create_mixed_dataloader with real workers: the next batches are the same rows."""
    options = {"batch_size": 32, "num_workers": workers, "shuffle": True, "shuffle_seed": 4}
    loader, _ = make(sources, **options)
    whole = [b["id"].tolist() for b in loader]
    for stop in (1, 7, 40):
        loader, _ = make(sources, **options)
        for n, _batch in enumerate(loader, start=1):
            if n == stop:
                break
        state = json.loads(json.dumps(loader.state_dict()))
        again, _ = make(sources, **options)
        again.load_state_dict(state)
        assert [b["id"].tolist() for b in again] == whole[stop:], stop


def test_a_mix_counts_the_bad_data_of_every_source_once(tmp_path: Path) -> None:
    """The metrics add up the counts of the mix's readers (each reader counts its own)."""
    bad = plant_parquet(tmp_path / "bad", [400], 100, {(0, 1)})
    clean = plant_parquet(tmp_path / "clean", [400], 100, set())
    loader, _ = create_mixed_dataloader(
        [{"path": str(clean.root)}, {"path": str(bad.root)}], [1, 1], batch_size=50,
        on_bad_data="skip", equal_batches="pad", on_exhausted="stop", output_format="arrow",
    )  # fmt: skip
    flagged = sum(sum(b.column("_is_padding").to_pylist()) for b in loader)
    total = loader.metrics().total
    assert (total.bad_units, total.bad_rows) == (1, 100)
    assert (flagged, total.rows_padded) == (100, 0)  # the stand-ins are flagged, but bad rows
