"""The contract every order keeps: one Hypothesis suite over all of them (the reader contract's twin).

Planned, elastic and mixed orders are driven through the same engine and the same
loader protocol (:mod:`tests.fixtures.orders`): ranks played one after the other,
DataLoader workers too, their groups pickled as between processes. Every order must:

* read every row exactly once per epoch (a mix: every row of every source once per
  that source's own epoch), leaving out only what ``equal_batches='drop'`` may;
* give every rank the same number of batches, ``len()`` of the dataset;
* resume from the merged state of ranks stopped at the same step into another world,
  with another number of workers, reading exactly the rest;
* round-trip its state: the typed value's JSON is the JSON it was parsed from, and a
  state saved right after loading one resumes into the same rest.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.orders import SOURCE_BASE, Planted, counts, planted_parquet, read_pass, resumed_run
from torch_dataloader_utils import StructuredDataset, create_mixed_dataloader
from torch_dataloader_utils.plan.mixposition import MixState
from torch_dataloader_utils.plan.state import ResumeState
from torch_dataloader_utils.runtime.dataset import OrderedDataset

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

CANONICAL = 6
GLOBAL_BATCH = 12
SIZES = ((130, 95, 160), (90, 40), (50, 33))
"""Files of the plain data (the first) and of a mix's three sources."""


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> list[Planted]:
    base = tmp_path_factory.mktemp("orders")
    return [planted_parquet(base / f"s{s}", sizes, start=s * SOURCE_BASE) for s, sizes in enumerate(SIZES)]


Build = Callable[[int, int, int], OrderedDataset]


def builder(kind: str, data: list[Planted], **options: Any) -> Build:
    """``build(num_ranks, rank, num_workers)`` of one order's dataset."""
    common = {"columns": ["id", "x"], **options}
    if kind == "planned":
        return lambda ranks, rank, workers: StructuredDataset(
            data[0].path, num_ranks=ranks, rank=rank, num_workers=workers, batch_size=5, **common
        )
    if kind == "elastic":
        return lambda ranks, rank, workers: StructuredDataset(
            data[0].path,
            num_ranks=ranks,
            rank=rank,
            num_workers=workers,
            batch_size=GLOBAL_BATCH // ranks,
            canonical_ranks=CANONICAL,
            **common,
        )
    sources = [{"path": d.path} for d in data]
    return lambda ranks, rank, workers: create_mixed_dataloader(
        sources, [3, 2, 1], num_ranks=ranks, rank=rank, num_workers=workers, batch_size=6, **common
    )[1]


def worlds(kind: str) -> st.SearchStrategy[tuple[int, int]]:
    """``(num_ranks, num_workers)`` an order can run on here."""
    ranks = st.sampled_from([1, 2, 3]) if kind == "elastic" else st.integers(1, 3)
    return st.tuples(ranks, st.integers(0, 2))


def check_plain_once(got: Counter[int], data: Planted, left_out: int) -> None:
    """Every row at most once, and at most ``left_out`` rows missing (``equal_batches='drop'``)."""
    assert max(got.values(), default=1) == 1, [i for i, n in got.items() if n > 1][:10]
    assert set(got) <= data.good
    assert len(data.good) - len(got) <= left_out


def check_per_source_epoch(got: Counter[int], data: list[Planted], policy: str) -> None:
    """Every row of every source read ``m`` or ``m + 1`` times: its epochs, each once, the last one partly.

    With ``'drop'`` each epoch of a source dealt over the lanes may leave out fewer rows than
    lanes (the same ones every epoch without shuffle): then no row is read more often than
    the source's epochs begun.
    """
    for planted in data:
        seen = [got.get(i, 0) for i in sorted(planted.good)]
        if policy == "pad":
            assert max(seen) - min(seen) <= 1, Counter(seen)
        else:
            assert max(seen) <= -(-sum(seen) // len(seen)) + 1, Counter(seen)


@settings(max_examples=30)
@given(
    kind=st.sampled_from(["planned", "elastic", "mixed"]),
    policy=st.sampled_from(["drop", "pad"]),
    shuffle=st.booleans(),
    data_=st.data(),
)
def test_every_order_keeps_the_contract(
    data: list[Planted], kind: str, policy: str, shuffle: bool, data_: Any
) -> None:
    options = {"equal_batches": policy, "shuffle": shuffle, "shuffle_seed": 5}
    build = builder(kind, data, **options)
    before = data_.draw(worlds(kind), label="before")
    after = data_.draw(worlds(kind), label="after")
    # A whole epoch: equal batches on every rank, len() of every rank.
    ranks, workers = before
    datasets = [build(ranks, r, workers) for r in range(ranks)]
    whole = [read_pass(ds, workers) for ds in datasets]
    assert {len(b) for b in whole} == {len(datasets[0])}
    # Interrupted at the same step on every rank, resumed into another world.
    stop = data_.draw(st.integers(1, max(1, len(whole[0]) - 1)), label="stop")
    first, rest, resumed = resumed_run(build, before, after, stop)
    assert len({len(b) for b in rest}) == 1  # equal batches after the resume too
    assert [len(b) for b in rest] == [len(b) for b in rest[:1]] * after[0]
    if kind == "mixed":
        check_per_source_epoch(counts([whole]), data, policy)
        check_per_source_epoch(counts([first, rest]), data, policy)
        # The epoch after the resumed one goes on where it ended: each source still once per its epoch.
        for ds in resumed:
            ds.set_epoch(ds.epoch + 1 if ds.remaining_batches == 0 else ds.epoch)
        later = [read_pass(ds, after[1]) for ds in resumed]
        check_per_source_epoch(counts([first, rest, later]), data, policy)
        return
    left_out = 0 if policy == "pad" else (CANONICAL if kind == "elastic" else ranks + after[0])
    check_plain_once(counts([whole]), data[0], left_out)
    check_plain_once(counts([first, rest]), data[0], left_out)


@settings(max_examples=8)
@given(
    kind=st.sampled_from(["planned", "elastic", "mixed"]), stop=st.integers(1, 9), workers=st.integers(0, 2)
)
def test_every_orders_state_round_trips(data: list[Planted], kind: str, stop: int, workers: int) -> None:
    build = builder(kind, data, shuffle=True, equal_batches="pad")
    ranks = 2
    saving = [build(ranks, r, workers) for r in range(ranks)]
    for ds in saving:
        read_pass(ds, workers, stop)
    states = [json.loads(json.dumps(ds.state_dict())) for ds in saving]
    for ds, state in zip(saving, states, strict=True):  # the typed value gives back its JSON
        typed = ds.order.state(ds.epoch)
        assert typed.to_json() == state
        if kind == "mixed":
            assert MixState.parse(state, ds.fingerprint()).to_json() == state
        else:
            assert ResumeState.parse(state, complete=False).to_json() == state
    from torch_dataloader_utils import merge_states

    merged = merge_states(states)
    once = [build(ranks, r, workers) for r in range(ranks)]
    for ds in once:
        ds.load_state_dict(merged)
    again = merge_states([json.loads(json.dumps(ds.state_dict())) for ds in once])  # saved before reading
    twice = [build(ranks, r, workers) for r in range(ranks)]
    for ds in twice:
        ds.load_state_dict(again)
    assert [read_pass(ds, workers) for ds in once] == [read_pass(ds, workers) for ds in twice]


def test_the_orders_are_values_of_one_protocol(data: list[Planted]) -> None:
    from torch_dataloader_utils.runtime.orders import Order
    from torch_dataloader_utils.runtime.orders.elastic import ElasticOrder
    from torch_dataloader_utils.runtime.orders.mixed import MixedOrder
    from torch_dataloader_utils.runtime.orders.planned import PlannedOrder

    for kind, cls in (("planned", PlannedOrder), ("elastic", ElasticOrder), ("mixed", MixedOrder)):
        order = builder(kind, data)(2, 0, 1).order
        assert type(order) is cls
        for name in Order.__dict__:
            if not name.startswith("_"):
                assert hasattr(order, name), (kind, name)
