"""Changing a mix's recipe at a checkpoint (issue 36): other weights, added and removed sources.

A job reads a mix of 2 to 4 of the :data:`~tests.fixtures.recipes.POOL` sources, is
interrupted at a random batch (every rank at the same step), and goes on with another
recipe, on another number of ranks and workers, with ``allow_recipe_change=True``; then
again. Across every change each source's epochs are read exactly once (a source that
continues goes on where it stood, an added one from its start, one added back where it
stood when it was removed), and the batches after a change hold the new weights, per
batch and per window, as fixed weights do. Ranks and workers are played in this process
(:func:`tests.fixtures.orders.read_pass`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.fixtures.orders import read_pass
from tests.fixtures.recipes import POOL, SOURCE_ID_BASE, check_shares, compositions, marked, once_per_epoch
from torch_dataloader_utils import (
    MixedDataset,
    ResumeStateError,
    StateMismatchError,
    create_mixed_dataloader,
    merge_states,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # few chunks per lane, for shuffling

INDEX = {name: s for s, name in enumerate(POOL)}
worlds = st.tuples(st.integers(1, 2), st.integers(0, 2))
"""(ranks, workers per rank)."""


def build(
    pool: dict[str, str], names: Sequence[str], weights: Sequence[int], world: tuple[int, int], **options: Any
) -> list[MixedDataset]:
    """Every rank's mixed dataset of ``names`` (sources of ``pool``) at ``weights``."""
    ranks, workers = world
    sources = [{"path": pool[n]} for n in names]
    return [
        create_mixed_dataloader(
            sources, list(weights), num_ranks=ranks, rank=r, num_workers=workers, **options
        )[1]
        for r in range(ranks)
    ]


def read(datasets: list[MixedDataset], workers: int, stop: int | None) -> list[list[list[int]]]:
    """Every rank's batches of the current pass, up to ``stop`` (every rank at the same step)."""
    return [read_pass(ds, workers, stop, unit=marked) for ds in datasets]


def saved(datasets: list[MixedDataset]) -> dict[str, Any]:
    """The job's state, merged from every rank's, through JSON (as a checkpoint holds it)."""
    return merge_states([json.loads(json.dumps(ds.state_dict())) for ds in datasets])


def check_weights(
    batches: list[list[list[int]]], names: Sequence[str], weights: Sequence[int], readers: int
) -> None:
    """Every rank's batches of a pass hold ``weights`` (the last round left out), per batch and window."""
    columns = [INDEX[n] for n in names]
    for rank in batches:
        if not rank:
            continue
        counts = compositions(rank, len(POOL))[:, columns]
        assert not compositions(rank, len(POOL)).sum() - counts.sum()  # no row of a source out of the mix
        check_shares(counts, 0, [(0, weights)], readers, int(counts[0].sum()))


@st.composite
def changes(
    draw: st.DrawFn, names: list[str], weights: list[int], removed: list[str]
) -> tuple[str, list[str], list[int]]:
    """A recipe change of ``names`` at ``weights``: ``(kind, names, weights)``."""
    kinds = ["weights"]
    if len(names) < 4:
        kinds.append("add")
    if len(names) > 2:
        kinds.append("remove")
    # A source removed by the change before is added back (else the case is rare).
    kind = "add back" if removed and len(names) < 4 else draw(st.sampled_from(kinds), label="kind")
    if kind == "weights":
        new = draw(st.lists(st.integers(1, 9), min_size=len(names), max_size=len(names)), label="weights")
        return kind, names, new
    if kind == "remove":
        gone = draw(st.sampled_from(names), label="removed")
        return (
            kind,
            [n for n in names if n != gone],
            [w for n, w in zip(names, weights, strict=True) if n != gone],
        )
    pool = removed if kind == "add back" else [n for n in POOL if n not in names and n not in removed]
    if not pool:
        return "weights", names, weights
    added = draw(st.sampled_from(pool), label="added")
    at = draw(st.integers(0, len(names)), label="at")
    return kind, [*names[:at], added, *names[at:]], [*weights[:at], draw(st.integers(1, 9)), *weights[at:]]


@pytest.mark.slow
@settings(max_examples=25)
@given(
    data=st.data(),
    names=st.lists(st.sampled_from(list(POOL)), min_size=2, max_size=4, unique=True),
    batch_size=st.integers(8, 16),
    shuffle=st.booleans(),
    first=worlds,
)
def test_a_recipe_changed_at_a_checkpoint_goes_on_where_every_source_stood(
    mix_pool: dict[str, str],
    data: Any,
    names: list[str],
    batch_size: int,
    shuffle: bool,
    first: tuple[int, int],
) -> None:
    options = {
        "batch_size": batch_size,
        "shuffle": shuffle,
        "shuffle_seed": 11,
        "equal_batches": "pad",
        "allow_recipe_change": True,
    }
    weights = data.draw(
        st.lists(st.integers(1, 9), min_size=len(names), max_size=len(names)), label="weights"
    )
    ids: list[int] = []
    removed: list[str] = []
    state = None
    world = first
    for hop in range(3):  # the first recipe, then two changes
        if hop:
            kind, new_names, weights = data.draw(changes(names, weights, removed), label=f"change {hop}")
            event(kind)
            removed = [n for n in [*removed, *names] if n not in new_names]
            names = new_names
            world = data.draw(worlds, label=f"world {hop}")
        datasets = build(mix_pool, names, weights, world, **options)
        if state is not None:
            for ds in datasets:
                ds.load_state_dict(state)
        readers = max(1, world[1])
        for _ in range(data.draw(st.integers(0, 1), label=f"whole passes {hop}")):
            batches = read(datasets, world[1], None)
            check_weights(batches, names, weights, readers)
            ids += [i for rank in batches for b in rank for i in b]
            for ds in datasets:
                ds.set_epoch(ds.epoch + 1)
        left = len(datasets[0]) if state is None else datasets[0].remaining_batches
        stop = data.draw(st.integers(1, max(1, left // readers - 1)), label=f"stop {hop}") * readers
        batches = read(datasets, world[1], stop)
        assert {len(rank) for rank in batches} == {min(stop, left)}  # equal batches on every rank
        check_weights(batches, names, weights, readers)
        ids += [i for rank in batches for b in rank for i in b]
        state = saved(datasets)
        assert sorted(state["removed"]) == sorted(removed)  # a removed source's position is kept
    # The job goes on to the end of two passes; every source's epochs were read once each.
    datasets = build(mix_pool, names, weights, world, **options)
    for ds in datasets:
        ds.load_state_dict(state)
    for _ in range(2):
        ids += [i for rank in read(datasets, world[1], None) for b in rank for i in b]
        for ds in datasets:
            ds.set_epoch(ds.epoch + 1)
    real = [i for i in ids if i >= 0]
    once_per_epoch(
        real, {INDEX[n]: POOL[n] for n in POOL if any(i // SOURCE_ID_BASE == INDEX[n] for i in real)}
    )


def _interrupted(
    pool: dict[str, str], names: Sequence[str], weights: Sequence[int], stop: int
) -> dict[str, Any]:
    """The state of one rank of ``names`` at ``weights`` after ``stop`` batches of 10 rows."""
    datasets = build(pool, names, weights, (1, 0), batch_size=10)
    read(datasets, 0, stop)
    return saved(datasets)


@pytest.mark.parametrize(
    ("names", "weights", "what"),
    [
        (["web", "code", "math"], [3, 1, 1], r"other weights"),
        (["web", "code"], [1, 1], r"removed \['math'\]"),
        (["web", "code", "math", "books"], [1, 1, 1, 1], r"added \['books'\]"),
    ],
)
def test_a_changed_recipe_without_the_opt_in_raises_naming_it(
    mix_pool: dict[str, str], names: list[str], weights: list[int], what: str
) -> None:
    state = _interrupted(mix_pool, ["web", "code", "math"], [1, 1, 1], 3)
    (ds,) = build(mix_pool, names, weights, (1, 0), batch_size=10)
    with pytest.raises(StateMismatchError, match=rf"the recipe: .*{what}.*pass allow_recipe_change=True"):
        ds.load_state_dict(state)
    (ds,) = build(mix_pool, names, weights, (1, 0), batch_size=10, allow_recipe_change=True)
    ds.load_state_dict(state)  # with the opt-in it loads


def _of(batches: list[list[list[int]]], name: str) -> list[int]:
    """The ids of source ``name`` in every rank's batches, in order."""
    return [i for rank in batches for b in rank for i in b if i >= 0 and i // SOURCE_ID_BASE == INDEX[name]]


def test_a_renamed_source_is_a_removed_one_and_an_added_one(mix_pool: dict[str, str]) -> None:
    """Sources are matched by name: ``web`` under another name starts its first epoch; ``web`` is kept."""
    datasets = build(mix_pool, ["web", "code"], [1, 1], (1, 0), batch_size=10)
    before = read(datasets, 0, 20)  # 100 rows of each
    state = saved(datasets)
    sources = [{"path": mix_pool["web"], "name": "web-v2"}, {"path": mix_pool["code"]}]
    _, ds = create_mixed_dataloader(sources, [1, 1], batch_size=10, num_workers=0, allow_recipe_change=True)
    ds.load_state_dict(state)
    assert ds.state_dict()["removed"].keys() == {"web"}
    after = read([ds], 0, 20)
    assert _of(after, "web") == _of(before, "web")  # from its start: the same rows in the same order
    code = _of(after, "code")
    assert sorted(_of(before, "code") + code[:50]) == [INDEX["code"] * SOURCE_ID_BASE + i for i in range(150)]


def test_a_source_added_back_resumes_where_it_was_removed(mix_pool: dict[str, str]) -> None:
    """``books`` removed after 60 of its 90 rows, the mix read without it, added back: its epoch goes on."""
    datasets = build(mix_pool, ["web", "books"], [1, 1], (1, 0), batch_size=10)
    before = read(datasets, 0, 12)  # 60 rows of each
    state = saved(datasets)
    (ds,) = build(mix_pool, ["web"], [1], (1, 0), batch_size=10, allow_recipe_change=True)
    ds.load_state_dict(state)
    alone = read([ds], 0, 5)
    assert len(_of(alone, "web")) == 50
    state = saved([ds])
    assert list(state["removed"]) == ["books"]
    datasets = build(mix_pool, ["books", "web"], [1, 1], (2, 1), batch_size=10, allow_recipe_change=True)
    for d in datasets:
        d.load_state_dict(state)
    after = read(datasets, 1, 3)  # 2 ranks: 30 rows of books
    assert not datasets[0].state_dict()["removed"]
    books = _of(before, "books") + _of(after, "books")
    assert sorted(books) == [INDEX["books"] * SOURCE_ID_BASE + i for i in range(90)]  # its epoch, once
    web = _of(before, "web") + _of(alone, "web") + _of(after, "web")
    assert len(set(web)) == len(web) == 140  # web went on through both changes


def _version_1(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as 0.7.0 wrote it: version 1, without the fields version 2 added."""
    old = {
        k: v for k, v in state.items() if k not in ("at", "epoch_at", "anchor", "batches", "taken", "removed")
    }
    return {**old, "version": 1}


def test_a_state_of_0_7_0_loads_and_a_recipe_change_from_it_names_the_way(mix_pool: dict[str, str]) -> None:
    datasets = build(mix_pool, ["web", "code"], [2, 1], (1, 0), batch_size=9, shuffle=True)
    whole = read(datasets, 0, None)
    datasets = build(mix_pool, ["web", "code"], [2, 1], (1, 0), batch_size=9, shuffle=True)
    part = read(datasets, 0, 7)
    old = _version_1(saved(datasets))
    datasets = build(mix_pool, ["web", "code"], [2, 1], (1, 0), batch_size=9, shuffle=True)
    datasets[0].load_state_dict(old)
    assert part[0] + read(datasets, 0, None)[0] == whole[0]  # the same pass goes on
    (changed,) = build(
        mix_pool, ["web", "code"], [1, 1], (1, 0), batch_size=9, shuffle=True, allow_recipe_change=True
    )
    with pytest.raises(
        ResumeStateError, match=r"saved by 0\.7\.0 \(version 1\) in the middle of a pass.*save again"
    ):
        changed.load_state_dict(old)
