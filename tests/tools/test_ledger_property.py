"""The ledger's promise as a property: for every step of every rank, replay gives the delivered batch.

Random runs — ranks 1-4, workers 0-2, shuffle with row interleaving or a window or
neither, one source or a mix of 2-3, elastic order or not, packing on or off — are
interrupted and resumed 0-3 times, each time into another world with other workers.
Every rank is iterated in this process, one after the other (each knows its world from
``num_ranks`` / ``rank``), so no process group is needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tools.test_ledger import assert_same
from torch_dataloader_utils import (
    Ledger,
    SequencePack,
    create_dataloader,
    create_mixed_dataloader,
    merge_states,
)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

GLOBAL_BATCH = 48  # elastic order: the same global batch on 1, 2 or 4 ranks (canonical_ranks=4)
SOURCES = (430, 190, 87)  # rows of the mix's sources (the first is the single source)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Sources of documents: a unique ``id`` and a list of tokens of 0-20 tokens."""
    base = tmp_path_factory.mktemp("ledger-property")
    rng = np.random.default_rng(3)
    out = []
    for s, rows in enumerate(SOURCES):
        root = base / f"s{s}"
        root.mkdir()
        ids = np.arange(rows, dtype=np.int64) + 100_000 * s
        for f in range(3):
            part = ids[f::3]
            tokens = [
                list(range(i % 1000, i % 1000 + int(n)))
                for i, n in zip(part, rng.integers(0, 21, len(part)), strict=True)
            ]
            table = pa.table(
                {
                    "id": part,
                    "x": (part % 89).astype(np.float32),
                    "tokens": pa.array(tokens, pa.list_(pa.int32())),
                }
            )
            pq.write_table(table, root / f"part-{f}.parquet", row_group_size=32)
        out.append(str(root))
    return out


@st.composite
def runs(draw: st.DrawFn) -> dict[str, Any]:
    """Options, and the worlds of the run's parts: ``(ranks, workers, batches before the stop)``."""
    kind = draw(st.sampled_from(["planned", "elastic", "mixed"]))
    order = draw(st.sampled_from(["none", "interleave", "window"]))
    options: dict[str, Any] = {
        "shuffle": order != "none" or draw(st.booleans()),
        "shuffle_seed": draw(st.integers(0, 5)),
    }
    if order == "interleave":
        options["row_interleave"] = draw(st.sampled_from([16, 64, 200]))
    if order == "window":
        options["row_shuffle_window"] = draw(st.sampled_from([50, 300]))
    if draw(st.booleans()):
        options["pack_sequences"] = SequencePack("tokens", seq_len=24, pad_id=-1)
    if kind == "elastic":
        options["canonical_ranks"] = 4
    if kind == "mixed":
        weights = draw(st.sampled_from([[0.7, 0.3], [0.5, 0.3, 0.2], [1, 1, 2]]))
        options["weights"] = weights
    ranks = st.sampled_from([1, 2, 4]) if kind == "elastic" else st.integers(1, 4)
    parts = [
        (draw(ranks), draw(st.integers(0, 2)), draw(st.integers(1, 6)))
        for _ in range(draw(st.integers(0, 3)))
    ]
    parts.append((draw(ranks), draw(st.integers(0, 2)), None))
    return {"kind": kind, "options": options, "parts": parts}


def loader_of(
    run: dict[str, Any], sources: list[str], ranks: int, rank: int, workers: int, ledger: Path
) -> Any:
    options = dict(run["options"])
    world = {"num_ranks": ranks, "rank": rank, "num_workers": workers, "ledger": str(ledger)}
    if run["kind"] == "mixed":
        weights = options.pop("weights")
        specs = [{"path": s} for s in sources[: len(weights)]]
        return create_mixed_dataloader(specs, weights, batch_size=16, **world, **options)
    batch = GLOBAL_BATCH // ranks if run["kind"] == "elastic" else 16
    return create_dataloader(sources[0], batch_size=batch, **world, **options)


@settings(max_examples=12)
@given(runs())
def test_every_step_of_every_rank_replays_the_delivered_batch(
    sources: list[str], tmp_path_factory: Any, run: Any
) -> None:
    ledger = tmp_path_factory.mktemp("ledger")
    delivered: dict[tuple[int, int], Any] = {}
    state = None
    step = 0  # the trainer's step: every batch is a step
    for ranks, workers, stop in run["parts"]:
        saved, taken = [], 0
        for rank in range(ranks):
            loader, dataset = loader_of(run, sources, ranks, rank, workers, ledger)
            if state is not None:
                loader.load_state_dict(state)
            epochs = [dataset.epoch] if stop is not None else [dataset.epoch, dataset.epoch + 1]
            taken = 0
            for epoch in epochs:
                dataset.set_epoch(epoch)
                for batch in loader:
                    delivered[(rank, step + taken)] = batch
                    taken += 1
                    if stop is not None and taken == stop:
                        saved.append(loader.state_dict())
                        break
                if stop is not None and taken == stop:
                    break
            if stop is not None and len(saved) == rank:  # the epoch ended first: its end is the checkpoint
                saved.append(loader.state_dict())
        if stop is None:
            break
        state = merge_states([json.loads(v) for s in saved for v in s.values()])
        step += taken
    book = Ledger(ledger)
    for (rank, at), batch in delivered.items():
        assert_same(book.rows(at, rank), batch)
