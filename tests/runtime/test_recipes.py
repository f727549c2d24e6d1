"""Mixed datasets end to end: proportions per window, each source once per its epoch, exact resume.

Every source's ids are ``source * SOURCE_ID_BASE + row``, so a batch says which source
and row each of its rows is. Ranks are played one after the other in this process
(``num_ranks``/``rank``); DataLoader workers are real where a test names them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.iceberg import commit_deletes, create_id_table, data_files, id_table, position_delete_file
from tests.fixtures.recipes import (
    SOURCE_ID_BASE,
    every_token,
    tokens_of,
    unpack,
    write_documents,
    write_source,
)
from torch_dataloader_utils import (
    ConfigError,
    FeaturePack,
    IncompatibleOptionsError,
    MixedDataLoader,
    MixedDataset,
    ResumeStateError,
    SchemaMismatchError,
    SequencePack,
    StateMismatchError,
    UnknownOptionError,
    create_mixed_dataloader,
    gather_state,
    merge_states,
)

SIZES = (400, 150, 61)
WEIGHTS = [0.5, 0.3, 0.2]


def make(
    paths: Sequence[str], weights: Sequence[float] = WEIGHTS, **options: Any
) -> tuple[MixedDataLoader, MixedDataset]:
    return create_mixed_dataloader([{"path": p} for p in paths], weights, **options)


def ids_of(batch: dict[str, torch.Tensor]) -> list[int]:
    """The ids of a batch's real rows (padding rows of ``equal_batches='pad'`` left out)."""
    ids = batch["id"]
    if "_is_padding" in batch:
        ids = ids[~batch["_is_padding"]]
    return [int(i) for i in ids.tolist()]


def per_source(ids: Sequence[int]) -> list[Counter[int]]:
    out: list[Counter[int]] = [Counter() for _ in SIZES]
    for i in ids:
        out[i // SOURCE_ID_BASE][i % SOURCE_ID_BASE] += 1
    return out


def assert_once_per_epoch(ids: Sequence[int]) -> list[int]:
    """At the end of passes every row of a source was read ``m`` or ``m + 1`` times: its epochs,
    each read exactly once, the last one partly. Returns the rows read per source."""
    totals = []
    for s, counts in enumerate(per_source(ids)):
        seen = [counts.get(i, 0) for i in range(SIZES[s])]
        assert max(seen) - min(seen) <= 1, f"source {s}: rows read {Counter(seen)} times"
        totals.append(sum(seen))
    return totals


def run_pass(loaders: Sequence[MixedDataLoader], stop: Sequence[int | None] | None = None) -> list[list[int]]:
    """Every rank's ids, batch by batch (rank ``r`` stops after ``stop[r]`` batches)."""
    out = []
    for r, loader in enumerate(loaders):
        batches = []
        for n, batch in enumerate(loader, start=1):
            batches.append(ids_of(batch))
            if stop is not None and stop[r] is not None and n == stop[r]:
                break
        out.append(batches)
    return out


def ranks(paths: Sequence[str], num_ranks: int, **options: Any) -> list[MixedDataLoader]:
    return [make(paths, num_ranks=num_ranks, rank=r, num_workers=0, **options)[0] for r in range(num_ranks)]


def test_a_batch_takes_every_source_by_weight_within_a_row(mix_sources: list[str]) -> None:
    weights = [0.55, 0.3, 0.15]  # a cycle of 20 slots, batches of 7: no batch is a whole cycle
    loader, dataset = make(
        mix_sources, weights, batch_size=7, num_workers=0, source_column="source", shuffle=True
    )
    counts = np.array([np.bincount(b["source"].numpy(), minlength=3) for b in loader])
    assert len(counts) == len(loader) == dataset.num_batches()
    assert (counts.sum(axis=1) == 7).all()
    share = np.array(weights)
    for window in (1, 7, 100):
        for first in range(len(counts) - window + 1):
            rows = counts[first : first + window].sum(axis=0)
            assert np.abs(rows - window * 7 * share).max() < 2, (window, first, rows)
    # The batch's rows of each source are its own: the source column agrees with the ids.
    batch = next(iter(loader))
    assert (batch["id"] // SOURCE_ID_BASE == batch["source"]).all()


@pytest.mark.parametrize("workers", [2])
def test_with_workers_the_delivered_windows_are_within_two_rows_per_lane(
    mix_sources: list[str], workers: int
) -> None:
    loader, _ = make(
        mix_sources, [0.55, 0.3, 0.15], batch_size=7, num_workers=workers, source_column="source"
    )
    counts = np.array([np.bincount(b["source"].numpy(), minlength=3) for b in loader])
    for first in range(len(counts) - 100 + 1):
        rows = counts[first : first + 100].sum(axis=0)
        assert np.abs(rows - 700 * np.array([0.55, 0.3, 0.15])).max() < 2 * workers


@pytest.mark.parametrize("workers", [0, 2])
def test_cycle_reads_the_longest_source_once_and_cycles_the_others(
    mix_sources: list[str], workers: int
) -> None:
    loader, dataset = make(mix_sources, batch_size=20, num_workers=workers, shuffle=True, equal_batches="pad")
    assert dataset.anchor == 0  # 400 rows at weight 0.5 take longest
    batches = list(loader)
    ids = [i for b in batches for i in ids_of(b)]
    read = assert_once_per_epoch(ids)
    assert read[0] == SIZES[0]  # the anchor's epoch, exactly once
    assert read[1] > SIZES[1]  # the others went round, once per their epoch
    assert read[2] > 2 * SIZES[2]
    received = Counter(int(i) // SOURCE_ID_BASE for b in batches for i in b["id"].tolist())  # padding too
    assert loader.metrics().rows_by_source == {n: received[s] for s, n in enumerate(dataset.source_names)}


def test_rows_by_source_counts_what_the_loop_received(mix_sources: list[str]) -> None:
    loader, dataset = make(mix_sources, batch_size=16, num_workers=0, source_column="source")
    counts = Counter()
    for n, batch in enumerate(loader):
        counts.update(batch["source"].tolist())
        if n == 9:
            break
    metrics = loader.metrics()
    assert metrics.rows_by_source == {dataset.source_names[s]: counts[s] for s in range(3)}
    assert metrics.as_dict()["rows_by_source"] == metrics.rows_by_source
    assert "rows by source" in str(metrics)
    dataset.set_epoch(1)
    assert loader.metrics().rows_by_source == dict.fromkeys(dataset.source_names, 0)


def test_stop_ends_the_epoch_when_a_source_runs_out(mix_sources: list[str]) -> None:
    loader, dataset = make(
        mix_sources, batch_size=20, num_workers=0, on_exhausted="stop", equal_batches="pad"
    )
    first = [i for b in loader for i in ids_of(b)]
    read = assert_once_per_epoch(first)
    assert read[2] == SIZES[2]  # the smallest at its weight ran out first
    assert read[0] < SIZES[0]
    assert read[1] < SIZES[1]
    # The next epoch goes on where the others stood; together each is read once.
    everything = list(first)
    for epoch in range(1, 4):
        dataset.set_epoch(epoch)
        everything += [i for b in loader for i in ids_of(b)]
        assert_once_per_epoch(everything)


@settings(max_examples=12)
@given(
    num_ranks=st.integers(1, 3),
    batch_size=st.integers(4, 40),
    on_exhausted=st.sampled_from(["cycle", "stop"]),
    shuffle=st.booleans(),
    row_mixing=st.sampled_from([None, 37]),
    weights=st.lists(st.integers(1, 9), min_size=3, max_size=3),
)
def test_each_source_once_per_its_epoch_with_equal_batches(
    mix_sources: list[str],
    num_ranks: int,
    batch_size: int,
    on_exhausted: str,
    shuffle: bool,
    row_mixing: int | None,
    weights: list[int],
) -> None:
    options = {
        "batch_size": batch_size,
        "on_exhausted": on_exhausted,
        "shuffle": shuffle,
        "row_mixing": row_mixing,
        "equal_batches": "pad",
        "shuffle_seed": 11,
    }
    loaders = [
        make(mix_sources, weights, num_ranks=num_ranks, rank=r, num_workers=0, **options)[0]
        for r in range(num_ranks)
    ]
    everything: list[int] = []
    for epoch in range(3):
        for loader in loaders:
            loader.dataset.set_epoch(epoch)
        batches = run_pass(loaders)
        assert len({len(b) for b in batches}) == 1  # every rank the same number of batches
        assert all(len(b) == len(loaders[0]) for b in batches)
        everything += [i for rank in batches for b in rank for i in b]
        assert_once_per_epoch(everything)


@settings(max_examples=10)
@given(
    before=st.integers(1, 3),
    after=st.integers(1, 3),
    stops=st.lists(st.integers(1, 12), min_size=3, max_size=3),
    on_exhausted=st.sampled_from(["cycle", "stop"]),
    shuffle=st.booleans(),
)
def test_resume_mid_mix_on_other_ranks_reads_each_source_once_per_epoch(
    mix_sources: list[str], before: int, after: int, stops: list[int], on_exhausted: str, shuffle: bool
) -> None:
    options = {"batch_size": 12, "on_exhausted": on_exhausted, "shuffle": shuffle, "equal_batches": "pad"}
    # Uninterrupted: epochs 0 and 1 on `before` ranks.
    loaders = ranks(mix_sources, before, **options)
    whole0 = run_pass(loaders)
    for loader in loaders:
        loader.dataset.set_epoch(1)
    whole1 = run_pass(loaders)
    anchor_whole = sorted(i for r in whole1 for b in r for i in b if i // SOURCE_ID_BASE == 0)
    # Interrupted in epoch 1 (each rank after its own number of batches), resumed on `after` ranks.
    loaders = ranks(mix_sources, before, **options)
    run_pass(loaders)  # epoch 0, as above
    for loader in loaders:
        loader.dataset.set_epoch(1)
    part = run_pass(loaders, stops[:before])
    state = merge_states([json.loads(json.dumps(loader.state_dict())) for loader in loaders])
    resumed = ranks(mix_sources, after, **options)
    for loader in resumed:
        loader.load_state_dict(state)
    assert len({len(loader) for loader in resumed}) == 1
    finished = resumed[0].dataset.epoch == 2  # every rank had read its whole pass
    if after == before and not finished:  # len() is the full epoch's batches, also after a resume
        assert len(resumed[0]) == len(whole1[0])
    left = [loader.remaining_batches for loader in resumed]
    rest = run_pass(resumed)
    assert len({len(r) for r in rest}) == 1  # equal batches after the resume too
    assert left == [len(r) for r in rest]
    assert [loader.remaining_batches for loader in resumed] == [0] * after
    flat = [i for run in (whole0, part, rest) for r in run for b in r for i in b]
    assert_once_per_epoch(flat)
    if on_exhausted == "cycle" and not finished:  # the epoch is the anchor's: its rows, as uninterrupted
        got = sorted(i for run in (part, rest) for r in run for b in r for i in b if i // SOURCE_ID_BASE == 0)
        assert got == anchor_whole == list(range(SIZES[0]))
    # The epoch after the resumed one is a normal one, from where the resumed pass ended.
    for loader in resumed:
        loader.dataset.set_epoch(3 if finished else 2)
    flat += [i for r in run_pass(resumed) for b in r for i in b]
    assert_once_per_epoch(flat)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_len_is_the_full_epoch_and_remaining_batches_the_rest(
    mix_sources: list[str], num_workers: int
) -> None:
    options = {"batch_size": 10, "shuffle": True, "num_workers": num_workers}
    loader, dataset = make(mix_sources, **options)
    loader.sampler.set_epoch(1)  # Lightning's call reaches the mix
    assert dataset.epoch == 1
    full = len(loader)
    assert full == dataset.num_batches() == loader.remaining_batches == len(list(loader))
    assert loader.remaining_batches == 0  # the pass ran to its end
    loader.set_epoch(1)  # HF Trainer's call
    assert loader.remaining_batches == full
    ids: list[int] = []
    taken = 0
    for taken, batch in enumerate(loader, start=1):
        ids += ids_of(batch)
        if taken == 3:
            assert loader.remaining_batches == full - 3
            break
    state = json.loads(json.dumps(loader.state_dict()))
    # Resumed twice (the second state is saved in a resumed pass): len() stays the full epoch's.
    for stop in (2, None):
        loader, dataset = make(mix_sources, **options)
        loader.load_state_dict(state)
        assert dataset.epoch == 1
        assert len(loader) == full
        left = loader.remaining_batches
        if num_workers == 0:  # one lane: the rest is the batches not taken
            assert left == full - taken
        n = 0
        for n, batch in enumerate(loader, start=1):
            ids += ids_of(batch)
            if n == stop:
                break
        assert loader.remaining_batches == left - n
        taken += n
        state = json.loads(json.dumps(loader.state_dict()))
    if num_workers == 0:
        assert taken == full
        again, _ = make(mix_sources, **options)
        again.set_epoch(1)
        assert sorted(ids) == sorted(i for b in again for i in ids_of(b))  # the epoch, exactly


def test_resume_with_workers_into_other_workers_and_ranks(mix_sources: list[str]) -> None:
    options = {"batch_size": 10, "shuffle": True, "equal_batches": "pad"}
    first: list[int] = []
    states = []
    for rank in range(2):
        loader, dataset = make(mix_sources, num_ranks=2, rank=rank, num_workers=2, **options)
        dataset.set_epoch(1)
        for n, batch in enumerate(loader, start=1):
            first += ids_of(batch)
            if n == 5 + rank:  # the two workers' batches arrive in groups: lanes stop apart
                break
        states.append(json.loads(json.dumps(loader.state_dict())))
    state = merge_states(states)
    assert len(json.dumps(state)) < 20_000
    rest: list[int] = []
    for rank in range(3):
        loader, dataset = make(mix_sources, num_ranks=3, rank=rank, num_workers=rank % 2, **options)
        loader.load_state_dict(state)
        assert dataset.epoch == 1
        rest += [i for b in loader for i in ids_of(b)]
    epoch0 = []  # read by the same job (2 ranks x 2 workers): positions carry over from it
    for rank in range(2):
        loader, _ = make(mix_sources, num_ranks=2, rank=rank, num_workers=2, **options)
        epoch0 += [i for b in loader for i in ids_of(b)]
    assert_once_per_epoch(epoch0 + first + rest)
    assert sorted(i for i in first + rest if i < SOURCE_ID_BASE) == list(range(SIZES[0]))


def test_persistent_workers_carry_positions_across_epochs(mix_sources: list[str]) -> None:
    loader, dataset = make(
        mix_sources, batch_size=16, num_workers=2, persistent_workers=True, equal_batches="pad", shuffle=True
    )
    everything: list[int] = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        everything += [i for b in loader for i in ids_of(b)]
        assert_once_per_epoch(everything)
    loader.load_state_dict(loader.state_dict())
    with pytest.raises(ResumeStateError, match="persistent workers"):
        next(iter(loader))


def test_state_of_a_finished_epoch_starts_the_next_one(mix_sources: list[str]) -> None:
    loader, dataset = make(mix_sources, batch_size=16, num_workers=0)
    list(loader)
    state = loader.dataset.state_dict()
    assert state["epoch"] == 1
    assert state["consumed"] == {}
    dataset.set_epoch(1)
    expected = [ids_of(b) for b in loader]
    again, _ = make(mix_sources, batch_size=16, num_workers=0)
    again.load_state_dict(state)
    assert [ids_of(b) for b in again] == expected
    assert gather_state(loader)["format"] == "torch_dataloader_utils.mix"  # no process group: this rank's


def test_sources_with_other_columns_are_read_through_the_shared_columns(
    mix_sources: list[str], tmp_path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    table = pa.table({"id": np.arange(30) + 2 * SOURCE_ID_BASE, "text": [str(i) for i in range(30)]})
    pq.write_table(table, other / "a.parquet")
    with pytest.raises(SchemaMismatchError, match="columns="):
        make([mix_sources[0], str(other)], [1, 1], num_workers=0)
    loader, dataset = make([mix_sources[0], str(other)], [1, 1], num_workers=0, columns=["id"], batch_size=8)
    assert dataset.schema.names == ["id"]
    assert next(iter(loader))["id"].shape == (8,)
    wide = tmp_path / "wide"
    wide.mkdir()
    pq.write_table(pa.table({"id": np.arange(30, dtype=np.int32)}), wide / "a.parquet")
    with pytest.raises(SchemaMismatchError, match="'id' is int32"):
        make([mix_sources[0], str(wide)], [1, 1], num_workers=0, columns=["id"])


@pytest.mark.parametrize(
    ("output", "check"),
    [
        ({"output_format": "numpy"}, lambda b: isinstance(b["id"], np.ndarray)),
        ({"output_format": "arrow"}, lambda b: isinstance(b, pa.RecordBatch) and b.num_rows == 10),
        ({"output_format": "dict"}, lambda b: isinstance(b["id"], list)),
        (
            {"pack_features": FeaturePack(["x", "label"], key="features")},
            lambda b: b["features"].shape == (10, 2) and "x" not in b,
        ),
    ],
)
def test_every_output_format(mix_sources: list[str], output: dict[str, Any], check: Any) -> None:
    loader, _ = make(mix_sources, batch_size=10, num_workers=0, **output)
    assert check(next(iter(loader)))


def test_packing_a_mix(tmp_path) -> None:
    lengths = np.random.default_rng(3).integers(0, 50, size=90)
    a = write_documents(tmp_path / "a", lengths)
    b = write_documents(tmp_path / "b", lengths)  # the same documents: counted twice per epoch
    pack = SequencePack("tokens", seq_len=24, pad_id=-1)
    loader, _dataset = create_mixed_dataloader(
        [{"path": a}, {"path": b}],
        [1, 1],
        batch_size=10,
        num_workers=0,
        ragged="offsets",
        pack_sequences=pack,
    )
    found = [s for batch in loader for s in unpack(batch, 24)]
    expected = every_token(lengths)
    assert tokens_of(found) == expected + expected  # each source's epoch read once, every token packed


def test_mix_errors(mix_sources: list[str]) -> None:
    with pytest.raises(ConfigError, match="one weight per source"):
        make(mix_sources, [1, 2], num_workers=0)
    with pytest.raises(ConfigError, match="weight 0"):
        make(mix_sources, [1, 0, 1], num_workers=0)
    with pytest.raises(ConfigError, match="non-empty list of source"):
        create_mixed_dataloader({"path": mix_sources[0]}, [1])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="'path'"):
        create_mixed_dataloader([{"columns": ["id"]}], [1])
    with pytest.raises(IncompatibleOptionsError, match=r"\['batch_size'\].*create_mixed_dataloader"):
        create_mixed_dataloader([{"path": mix_sources[0], "batch_size": 4}], [1])
    with pytest.raises(UnknownOptionError, match="on_exhausted"):
        make(mix_sources, on_exhaust="stop")  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="on_exhausted='never'"):
        make(mix_sources, num_workers=0, on_exhausted="never")
    with pytest.raises(IncompatibleOptionsError, match="equal_batches='off'"):
        make(mix_sources, num_ranks=2, rank=0, num_workers=0, equal_batches="off")
    with pytest.raises(IncompatibleOptionsError, match="source_column='id'"):
        make(mix_sources, num_workers=0, source_column="id")


def test_state_errors(mix_sources: list[str]) -> None:
    loader, _dataset = make(mix_sources, batch_size=10, num_workers=0)
    next(iter(loader))
    state = loader.dataset.state_dict()
    other, _ = make(mix_sources, [0.4, 0.4, 0.2], batch_size=10, num_workers=0)
    with pytest.raises(StateMismatchError, match="weights"):
        other.load_state_dict(state)
    with pytest.raises(ResumeStateError, match="not the resume state of a mixed dataset"):
        other.load_state_dict({"format": "torch_dataloader_utils.resume"})
    two = [make(mix_sources, batch_size=10, num_workers=0, num_ranks=2, rank=r)[0] for r in range(2)]
    for l2 in two:
        next(iter(l2))
    with pytest.raises(ResumeStateError, match="missing"):
        two[0].load_state_dict(two[1].state_dict())
    damaged = json.loads(json.dumps(state))
    damaged["consumed"]["0"] = [10_000]
    with pytest.raises(ResumeStateError, match="batch counts"):
        make(mix_sources, batch_size=10, num_workers=0)[0].load_state_dict(damaged)
    loaded, ds = make(mix_sources, batch_size=10, num_workers=0)
    ds.set_epoch(2)
    list(loaded)
    later = loaded.state_dict()
    fresh, ds2 = make(mix_sources, batch_size=10, num_workers=0)
    fresh.load_state_dict(later)
    with pytest.raises(ConfigError, match="precedes epoch 3"):
        ds2.set_epoch(1)


def test_an_iceberg_table_with_deletes_mixed_with_files(iceberg_catalog: Any, tmp_path: Any) -> None:
    config, catalog = iceberg_catalog
    table = create_id_table(catalog)
    table.append(id_table(SOURCE_ID_BASE, 90))  # the table is source 1: ids 100000...
    (path,) = data_files(table)
    table = commit_deletes(table, [position_delete_file(table, {path: [0, 5, 89]})])
    live = sorted(table.scan().to_arrow().column("id").to_pylist())
    files = write_source(tmp_path / "files", 0, 200)
    sources = [{"path": files}, {"table": "ns.t", "catalog_config": config, "name": "books"}]
    for workers in (0, 2):
        loader, dataset = create_mixed_dataloader(
            sources, [2, 1], columns=["id", "label"], batch_size=9, num_workers=workers, equal_batches="pad"
        )
        assert dataset.source_names == ("files", "books")
        ids = [i for b in loader for i in ids_of(b)]
        from_table = Counter(i for i in ids if i >= SOURCE_ID_BASE)
        assert set(from_table) == set(live)  # deleted rows never appear
        assert max(from_table.values()) - min(from_table.values()) <= 1  # once per its epoch
        assert sorted(i for i in ids if i < SOURCE_ID_BASE) == list(range(200))  # the anchor, once


def test_sources_given_as_a_path_names_the_parameter_the_value_and_the_fix(mix_sources: list[str]) -> None:
    with pytest.raises(
        ConfigError, match=r"sources='.*s0' is one path, not a list of sources: write sources=\[\{'path'"
    ):
        create_mixed_dataloader(mix_sources[0], [1])  # type: ignore[arg-type]
    with pytest.raises(
        ConfigError, match=r"sources\[1\]='.*s1' is a path; each source is a mapping.*write \{'path'"
    ):
        create_mixed_dataloader([{"path": mix_sources[0]}, mix_sources[1]], [1, 1])  # type: ignore[list-item]
