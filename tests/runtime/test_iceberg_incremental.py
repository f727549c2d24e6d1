"""Incremental Iceberg epochs (``since_snapshot_id``) and epochs continued onto a newer snapshot
(``continue_from``), on a real table grown over four snapshots.

The oracle is the ``id`` column read by an independent reader (DataFusion + iceberg-rust)
at each snapshot: an incremental epoch from Sa to Sb must read exactly the ids live at
Sb and not at Sa (every id is unique, except ids an overwrite wrote again unchanged).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.fixtures.iceberg import (
    GrownTable,
    grow_table,
    id_table,
    make_catalog,
    oracle_ids_at,
    sql_catalog_config,
)
from torch_dataloader_utils import IcebergDataset, merge_states
from torch_dataloader_utils.errors import (
    ConfigError,
    IncompatibleOptionsError,
    ResumeStateError,
    StateMismatchError,
)


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], GrownTable]:
    config = sql_catalog_config(Path(tmp_path_factory.mktemp("grown")) / "iceberg")
    return config, grow_table(make_catalog(config))


def epoch_ids(config: dict[str, str], **kwargs: Any) -> list[int]:
    kwargs.setdefault("num_workers", 0)
    loader, _ = IcebergDataset.create_dataloader(
        "ns.grown", catalog_config=config, output_format="numpy", batch_size=7, **kwargs
    )
    return sorted(int(i) for batch in loader for i in batch["id"])


def dropped_ids(ds: IcebergDataset) -> set[int]:
    """The ids equal batches leave out of the dataset's current epoch (the same on every rank)."""
    return {i for c in ds.plan().dropped for b in ds.read_chunk(c) for i in b.column("id").to_pylist()}


@pytest.mark.parametrize(("since", "until"), [(1, 4), (2, 4), (3, 4), (1, 2), (2, 3), (1, 3)])
def test_incremental_epoch_reads_exactly_the_rows_the_newer_snapshot_gained(
    grown: tuple[dict[str, str], GrownTable], since: int, until: int
) -> None:
    config, g = grown
    expected = sorted(set(g.oracle(until)) - set(g.oracle(since)))
    got = epoch_ids(config, snapshot_id=g.snapshots[until - 1], since_snapshot_id=g.snapshots[since - 1])
    assert got == expected


@pytest.mark.parametrize("num_ranks", [1, 2])
def test_incremental_epoch_with_a_row_filter(
    grown: tuple[dict[str, str], GrownTable], num_ranks: int
) -> None:
    """``filters`` prunes the files added since (pyiceberg's evaluators) and, counted, keeps counts exact."""
    config, g = grown
    expected = sorted(i for i in set(g.oracle(4)) - set(g.oracle(1)) if 250 <= i < 400)
    got, ds = read_world(
        config,
        num_ranks,
        0,
        snapshot_id=g.snapshots[3],
        since_snapshot_id=g.snapshots[0],
        filters=(pc.field("id") >= 250) & (pc.field("id") < 400),
        count_rows=True,
        batch_size=4,
        output_format="numpy",
    )
    assert sorted(got + list(dropped_ids(ds))) == expected
    assert len(ds.files) == 3  # of the 5 files added since S1, B's rewrite and F are pruned by their ids


def test_rows_an_overwrite_moved_or_wrote_again_are_not_new(grown: tuple[dict[str, str], GrownTable]) -> None:
    """Since the commit that appended D: the rewrites of B and D moved their rows, and E's
    append wrote D's ids 390..394 again unchanged; only E's ids 400..409 are new."""
    config, g = grown
    ids = [s for s, _ in g.commits]
    after_d, s3 = ids[4], g.snapshots[2]
    expected = sorted(set(g.oracle_of(s3)) - set(g.oracle_of(after_d)))
    assert expected == list(range(400, 410))
    loader, ds = IcebergDataset.create_dataloader(
        "ns.grown",
        catalog_config=config,
        snapshot_id=s3,
        since_snapshot_id=after_d,
        output_format="numpy",
        num_workers=0,
    )
    assert sorted(int(i) for b in loader for i in b["id"]) == expected
    delta = ds.scan.delta
    assert delta is not None
    assert (delta.since_snapshot_id, delta.snapshot_id) == (after_d, s3)
    assert [op for _, op in delta.snapshots] == ["overwrite", "overwrite", "append"]
    assert len(delta.removed) == 2  # B and D as they were after D's append
    assert delta.removed_rows == 200
    assert delta.moved_rows == 100 - 2 + 100 - 11 + 5  # B less 120, 121; D less 310, 390..399; 390..394
    assert delta.files_read == 5  # every file's ids overlap a file of the other side
    assert ds.since_snapshot_id == after_d


def test_files_whose_bounds_rule_out_a_twin_are_not_read(grown: tuple[dict[str, str], GrownTable]) -> None:
    """S1 -> S4: B was rewritten; of the files added since, only B's rewrite has ids in B's range."""
    config, g = grown
    _, ds = IcebergDataset.create_dataloader(
        "ns.grown", catalog_config=config, snapshot_id=g.snapshots[3], since_snapshot_id=g.snapshots[0]
    )
    delta = ds.scan.delta
    assert delta is not None
    assert (len(delta.removed), len(delta.appended) + len(delta.rewritten)) == (1, 5)
    assert delta.files_read == 2
    assert delta.moved_rows == 97  # B less 120, 121 (copy-on-write) and 150 (equality delete)


def test_appends_and_deletes_only_read_no_data_to_plan(grown: tuple[dict[str, str], GrownTable]) -> None:
    config, g = grown
    _, ds = IcebergDataset.create_dataloader(
        "ns.grown", catalog_config=config, snapshot_id=g.snapshots[3], since_snapshot_id=g.snapshots[2]
    )
    delta = ds.scan.delta
    assert delta is not None
    assert (delta.removed, delta.files_read, delta.moved_rows) == ((), 0, 0)
    assert len(delta.appended) == len(ds.files) == 1  # F


def read_world(
    config: dict[str, str], num_ranks: int, num_workers: int, **kwargs: Any
) -> tuple[list[int], IcebergDataset]:
    """The ids every rank of a world reads (real DataLoaders), checking equal batches; the last dataset."""
    got: list[int] = []
    counts = set()
    for rank in range(num_ranks):
        loader, ds = IcebergDataset.create_dataloader(
            "ns.grown",
            catalog_config=config,
            num_ranks=num_ranks,
            rank=rank,
            num_workers=num_workers,
            **({"timeout": 60} if num_workers else {}),
            **kwargs,
        )
        if ds.continued is None:
            ds.set_epoch(1)
        batches = list(loader)
        assert len(batches) == len(loader)
        counts.add(len(batches))
        got.extend(int(i) for b in batches for i in b["id"])
    assert len(counts) == 1  # equal batches on every rank
    assert len(got) == len(set(got))  # exactly once
    return got, ds


@pytest.mark.parametrize("num_ranks", [1, 2, 3])
@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_incremental_epoch_exactly_once_with_equal_batches_over_ranks_and_workers(
    grown: tuple[dict[str, str], GrownTable], num_ranks: int, num_workers: int
) -> None:
    config, g = grown
    expected = sorted(set(g.oracle(4)) - set(g.oracle(1)))
    got, ds = read_world(
        config,
        num_ranks,
        num_workers,
        snapshot_id=g.snapshots[3],
        since_snapshot_id=g.snapshots[0],
        split_rows=10,
        batch_size=8,
        shuffle=True,
        shuffle_seed=3,
        output_format="numpy",
    )
    dropped = dropped_ids(ds)
    assert len(dropped) < num_ranks
    assert sorted(got + list(dropped)) == expected


def test_since_snapshot_errors_name_the_option(grown: tuple[dict[str, str], GrownTable]) -> None:
    config, g = grown
    s1, s2, _, s4 = g.snapshots
    with pytest.raises(ConfigError, match=rf"since_snapshot_id={s4} is not an ancestor of snapshot {s2}"):
        IcebergDataset("ns.grown", catalog_config=config, snapshot_id=s2, since_snapshot_id=s4)
    with pytest.raises(ConfigError, match=r"since_snapshot_id=12345 is not a snapshot of the table"):
        IcebergDataset("ns.grown", catalog_config=config, since_snapshot_id=12345)
    with pytest.raises(ConfigError, match=r"since_snapshot_id=True must be an int snapshot id"):
        IcebergDataset("ns.grown", catalog_config=config, since_snapshot_id=True)  # type: ignore[typeddict-item]
    assert epoch_ids(config, snapshot_id=s1, since_snapshot_id=s1) == []


def test_incremental_state_is_tied_to_its_since_snapshot(grown: tuple[dict[str, str], GrownTable]) -> None:
    config, g = grown
    s1, s2, s3, _ = g.snapshots
    common: dict[str, Any] = {"catalog_config": config, "snapshot_id": s3, "batch_size": 8, "num_workers": 0}
    loader, _ = IcebergDataset.create_dataloader("ns.grown", since_snapshot_id=s1, **common)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    for since in (s2, None):
        other, _ = IcebergDataset.create_dataloader(
            "ns.grown", **({} if since is None else {"since_snapshot_id": since}), **common
        )
        with pytest.raises(StateMismatchError, match="since_snapshot_id"):
            other.load_state_dict(state)


CONTINUE = {"output_format": "numpy", "batch_size": 8, "split_rows": 10, "shuffle": True, "shuffle_seed": 5}


def interrupted(
    config: dict[str, str], g: GrownTable, since: int | None, epoch: int = 3
) -> tuple[dict[str, Any], set[int], set[int]]:
    """An epoch on S2 over 2 ranks x 2 workers, interrupted after 4 and 5 batches.

    Returns the merged state, the ids consumed, and the ids equal batches left out.
    """
    states, consumed, dropped = [], set(), set()
    extra = {} if since is None else {"since_snapshot_id": since}
    for rank in range(2):
        loader, ds = IcebergDataset.create_dataloader(
            "ns.grown",
            catalog_config=config,
            snapshot_id=g.snapshots[1],
            num_ranks=2,
            rank=rank,
            num_workers=2,
            timeout=60,
            **extra,
            **CONTINUE,
        )
        ds.set_epoch(epoch)
        batches = iter(loader)
        for _ in range(4 + rank):
            consumed.update(int(i) for i in next(batches)["id"])
        states.append(loader.state_dict())
        dropped |= dropped_ids(ds)
    return merge_states(states), consumed, dropped


@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize(("num_ranks", "num_workers"), [(1, 0), (2, 1), (3, 2)])
def test_resume_continued_from_s2_onto_s4_reads_exactly_the_oracles_rows(
    grown: tuple[dict[str, str], GrownTable], incremental: bool, num_ranks: int, num_workers: int
) -> None:
    """The rest of an epoch of S2 (full, or incremental since S1) less the rows deleted by S4,
    then the rows S4 gained: every one once, equal batches, over other ranks and workers."""
    config, g = grown
    o1, o2, o4 = (set(g.oracle(k)) for k in (1, 2, 4))
    state, consumed, dropped = interrupted(config, g, g.snapshots[0] if incremental else None)
    left = (o2 - o1 if incremental else o2) - consumed - dropped
    expected = (left & o4) | (o4 - o2)
    got, ds = read_world(
        config, num_ranks, num_workers, snapshot_id=g.snapshots[3], continue_from=state, **CONTINUE
    )
    assert ds.epoch == 3
    late = dropped_ids(ds)
    assert len(late) < num_ranks
    assert sorted(got + list(late)) == sorted(expected)
    continued = ds.continued
    assert continued is not None
    assert continued.epoch == 3
    assert (continued.from_snapshot_id, continued.snapshot_id) == (g.snapshots[1], g.snapshots[3])
    assert continued.from_since_snapshot_id == (g.snapshots[0] if incremental else None)
    assert continued.rows_left == len(left)
    assert continued.rows_deleted == len(left - o4)
    assert continued.rows_new == len(o4 - o2)
    if not incremental:
        assert continued.rows_deleted > 0  # S3 and S4 deleted rows the epoch had left


def test_a_continued_pass_resumes_and_refuses_other_epochs(grown: tuple[dict[str, str], GrownTable]) -> None:
    config, g = grown
    state, _, _ = interrupted(config, g, None)
    build: dict[str, Any] = {
        "catalog_config": config,
        "snapshot_id": g.snapshots[3],
        "num_workers": 0,
        **CONTINUE,
    }
    loader, ds = IcebergDataset.create_dataloader("ns.grown", continue_from=state, **build)
    everything = sorted(int(i) for b in loader for i in b["id"])
    loader, ds = IcebergDataset.create_dataloader("ns.grown", continue_from=state, **build)
    batches = iter(loader)
    first = [int(i) for _ in range(3) for i in next(batches)["id"]]
    again = loader.state_dict()
    loader, ds = IcebergDataset.create_dataloader("ns.grown", continue_from=state, **build)
    loader.load_state_dict(again)
    rest = [int(i) for b in loader for i in b["id"]]
    assert sorted(first + rest) == everything
    with pytest.raises(ConfigError, match=r"set_epoch\(4\) on a dataset that continues epoch 3"):
        ds.set_epoch(4)
    # A state of the continued pass is tied to it: not to the snapshot's own dataset ...
    plain, _ = IcebergDataset.create_dataloader("ns.grown", **build)
    with pytest.raises(StateMismatchError, match="continued_from"):
        plain.load_state_dict(again)
    # ... and it cannot be continued once more.
    with pytest.raises(ResumeStateError, match="while continuing an epoch"):
        IcebergDataset("ns.grown", catalog_config=config, continue_from=again)


def test_a_state_of_an_older_snapshot_names_continue_from(grown: tuple[dict[str, str], GrownTable]) -> None:
    config, g = grown
    state, _, _ = interrupted(config, g, None)
    loader, _ = IcebergDataset.create_dataloader(
        "ns.grown", catalog_config=config, num_ranks=2, rank=0, **CONTINUE
    )
    with pytest.raises(StateMismatchError, match=r"snapshot_id.*build the dataset with continue_from=state"):
        loader.load_state_dict(state)
    with pytest.raises(IncompatibleOptionsError, match=r"since_snapshot_id=\d+ both say.*pass one"):
        IcebergDataset(
            "ns.grown", catalog_config=config, continue_from=state, since_snapshot_id=g.snapshots[0]
        )
    with pytest.raises(IncompatibleOptionsError, match=r"elastic order \(canonical_ranks=2\)"):
        IcebergDataset("ns.grown", catalog_config=config, continue_from=state, canonical_ranks=2, **CONTINUE)
    with pytest.raises(ResumeStateError, match=r"continue_from=\[1, 2\] must be a resume state"):
        IcebergDataset("ns.grown", catalog_config=config, continue_from=[1, 2])  # type: ignore[typeddict-item]


def test_a_partition_overwritten_with_its_own_rows_gains_only_the_added_ones(
    iceberg_catalog: tuple[dict[str, str], Any],
) -> None:
    """A partitioned table (identity ``label``) whose partition 3 is overwritten by its own
    rows and 4 more: only those 4 are new, and only partition 3's files are compared."""
    from pyiceberg.expressions import EqualTo
    from pyiceberg.transforms import IdentityTransform

    config, catalog = iceberg_catalog
    schema = id_table(0, 1).schema
    t = catalog.create_table("ns.parts", schema=schema)
    with t.update_spec() as spec:
        spec.add_field("label", IdentityTransform(), "label")
    t = t.refresh()
    t.append(id_table(0, 70))
    t = t.refresh()
    s1 = t.current_snapshot().snapshot_id
    first = t.metadata_location
    again = id_table(0, 70).filter(pc.field("label") == 3)
    extra = id_table(1000, 28).filter(pc.field("label") == 3)
    t.overwrite(pa.concat_tables([again, extra]), overwrite_filter=EqualTo("label", 3))
    t = t.refresh()
    expected = sorted(set(oracle_ids_at(t, t.metadata_location)) - set(oracle_ids_at(t, first)))
    assert expected == extra.column("id").to_pylist()
    loader, ds = IcebergDataset.create_dataloader(
        "ns.parts", catalog_config=config, since_snapshot_id=s1, output_format="numpy", num_workers=0
    )
    assert sorted(int(i) for b in loader for i in b["id"]) == expected
    delta = ds.scan.delta
    assert delta is not None
    assert (len(delta.removed), delta.moved_rows, delta.files_read) == (1, len(again), 2)


def test_continuing_an_epoch_not_started_reads_the_newer_snapshot(
    grown: tuple[dict[str, str], GrownTable],
) -> None:
    """A state saved before any batch: its whole epoch of S2 less what S4 deleted, and what S4 gained."""
    config, g = grown
    loader, _ = IcebergDataset.create_dataloader(
        "ns.grown", catalog_config=config, snapshot_id=g.snapshots[1], num_workers=0, **CONTINUE
    )
    state = loader.state_dict()
    got, ds = read_world(config, 1, 0, continue_from=state, **CONTINUE)
    assert sorted(got) == g.oracle(4)
    assert ds.continued is not None
    assert ds.continued.rows_left == len(g.oracle(2))


def test_the_docs_incremental_example_runs_as_written(grown: tuple[dict[str, str], GrownTable]) -> None:
    """docs/iceberg.md "Incremental epochs": its block run as written, on this table.

    Only the values a reader replaces are replaced: the two snapshot ids, the table's name
    and its catalog. Every epoch reads exactly the ids S4 has and S1 had not.
    """
    import re

    text = (Path(__file__).resolve().parents[2] / "docs" / "iceberg.md").read_text()
    section = text[text.index("## Incremental epochs") :]
    block = section[section.index("```python\n") + len("```python\n") :]
    code = block[: block.index("```")]
    config, g = grown
    code, n = re.subn(r"^s1, s2 = .*$", f"s1, s2 = {g.snapshots[0]}, {g.snapshots[3]}", code, flags=re.M)
    assert n == 1
    code, n = re.subn(r"catalog_config=\{.*\},", "catalog_config=CONFIG,", code)
    assert n == 1
    code = code.replace('"db.events"', '"ns.grown"')
    seen: list[list[int]] = []
    code = code.replace("        ...\n", "        seen[-1].extend(int(i) for i in batch['id'])\n")
    epoch_line = "    dataset.set_epoch(epoch)\n"
    code = code.replace(epoch_line, epoch_line + "    seen.append([])\n")
    namespace: dict[str, Any] = {"IcebergDataset": IcebergDataset, "CONFIG": config, "seen": seen}
    exec(compile(code, "docs/iceberg.md", "exec"), namespace)
    expected = sorted(set(g.oracle(4)) - set(g.oracle(1)))
    assert len(seen) == 2
    assert all(sorted(ids) == expected for ids in seen)
    delta = namespace["delta"]
    # B, rewritten since S1 (100 rows at S1), is the one file removed; most of its rows moved.
    assert (len(delta.removed), delta.removed_rows) == (1, 100)
    assert 0 < delta.moved_rows < 100
