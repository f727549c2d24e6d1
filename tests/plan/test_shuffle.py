"""Shuffle: a pure permutation of ``(seed, epoch, *salt)`` that touches no global RNG."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.strategies import epochs, seeds
from torch_dataloader_utils.plan.shuffle import permutation, shuffled


@given(st.integers(0, 200), seeds, epochs, st.lists(st.integers(0, 2**40), max_size=2))
def test_permutation_is_a_deterministic_permutation(n: int, seed: int, epoch: int, salt: list[int]) -> None:
    p = permutation(n, seed, epoch, *salt)
    assert sorted(p.tolist()) == list(range(n))
    assert np.array_equal(p, permutation(n, seed, epoch, *salt))


@given(st.lists(st.integers(), max_size=50), seeds, epochs)
def test_shuffled_reorders_by_the_permutation(items: list[int], seed: int, epoch: int) -> None:
    got = shuffled(items, seed, epoch)
    assert got == [items[i] for i in permutation(len(items), seed, epoch)]
    assert sorted(got) == sorted(items)


def test_seed_and_epoch_do_not_add_up() -> None:
    assert not np.array_equal(permutation(100, 42, 1), permutation(100, 43, 0))
    assert not np.array_equal(permutation(100, 1, 0), permutation(100, 0, 1))


def test_large_seeds_do_not_collide_with_other_epochs() -> None:
    # A seed of 2**32 + 5 must not read as the words (5, 1), i.e. seed 5 epoch 1.
    assert not np.array_equal(permutation(100, 2**32 + 5, 0), permutation(100, 5, 1))
    assert not np.array_equal(permutation(100, 2**32, 0), permutation(100, 0, 1))
    assert not np.array_equal(permutation(100, 7, 2**32), permutation(100, 7, 0, 1))
    assert not np.array_equal(permutation(100, 2**64 + 3, 0), permutation(100, 3, 0, 1))


def test_salt_is_part_of_the_seed() -> None:
    assert not np.array_equal(permutation(100, 3, 4, 0), permutation(100, 3, 4))
    assert not np.array_equal(permutation(100, 3, 4, 0), permutation(100, 3, 4, 1))


def test_every_epoch_has_its_own_order() -> None:
    orders = {tuple(permutation(50, 42, e).tolist()) for e in range(20)}
    assert len(orders) == 20


def test_seeds_of_any_size_are_accepted() -> None:
    orders = {tuple(permutation(50, s, 0).tolist()) for s in (2**63, 2**64, 2**64 + 1, 2**100)}
    assert len(orders) == 4


@pytest.mark.parametrize("args", [(-1, 0), (0, -1), (0, 0, -2)])
def test_negative_values_are_rejected(args: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"seed, epoch and salt must be >= 0, got"):
        permutation(5, *args)


def test_global_random_state_is_untouched() -> None:
    np_state = np.random.get_state()
    py_state = random.getstate()
    permutation(1000, 1, 2, 3)
    after = np.random.get_state()
    assert all(np.array_equal(a, b) for a, b in zip(np_state[1:2], after[1:2], strict=True))
    assert np_state[0] == after[0]
    assert np_state[2:] == after[2:]
    assert random.getstate() == py_state


@given(st.integers(0, 3000), seeds, epochs)
def test_narrow_permutation_is_the_same_permutation(n: int, seed: int, epoch: int) -> None:
    narrow = permutation(n, seed, epoch, 3, narrow=True)
    assert narrow.dtype == np.int32
    assert np.array_equal(narrow, permutation(n, seed, epoch, 3))
