"""Packing as index arithmetic: the packed rows, split at their boundaries, are the documents."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.strategies_recipes import document_lengths, offsets_of
from torch_dataloader_utils.plan.packing import pack_offsets


def segments(lengths: list[int], seq_len: int, split: bool, truncate: bool) -> list[tuple[int, int, int]]:
    """Every segment of the packed rows as ``(document, first position, tokens)`` (padding left out)."""
    offsets = offsets_of(lengths)
    packing = pack_offsets(offsets, seq_len, split=split, truncate=truncate)
    slots = packing.rows * seq_len
    source = np.arange(packing.kept) if packing.source is None else packing.source
    dest = np.arange(packing.kept) if packing.dest is None else packing.dest
    doc_of_token = np.repeat(np.arange(len(lengths)), lengths)
    doc = np.full(slots, -1)
    doc[dest] = doc_of_token[source]
    position = np.full(slots, -1)
    position[dest] = packing.position
    in_document = np.full(slots, -1)
    in_document[dest] = source - offsets[doc_of_token[source]]
    out = []
    for r in range(packing.rows):
        cu = packing.cu_values[packing.cu_offsets[r] : packing.cu_offsets[r + 1]]
        assert cu[0] == 0
        assert cu[-1] == seq_len
        assert (np.diff(cu) > 0).all()
        for a, b in itertools.pairwise(cu):
            at = slice(r * seq_len + a, r * seq_len + b)
            d, p = doc[at], in_document[at]
            if d[0] == -1:
                assert (d == -1).all()  # padding is a segment of its own
                continue
            assert (d == d[0]).all()
            assert (np.diff(p) == 1).all()  # the document's tokens, in order
            # position_ids count from 0 in every segment: where a document or a row starts.
            assert position[at].tolist() == list(range(b - a))
            out.append((int(d[0]), int(p[0]), int(b - a)))
    return out


@given(document_lengths, st.integers(1, 50), st.booleans())
def test_split_packing_concatenates_to_the_documents(
    lengths: list[int], seq_len: int, truncate: bool
) -> None:
    packing = pack_offsets(offsets_of(lengths), seq_len, split=True, truncate=truncate)
    kept = [min(n, seq_len) if truncate else n for n in lengths]
    assert packing.rows == max(1, -(-sum(kept) // seq_len))  # every row full but the last
    found = segments(lengths, seq_len, True, truncate)
    # Joined in order, the segments are every document's (kept) tokens, once, in order.
    rebuilt: dict[int, int] = {}
    for d, first, n in found:
        assert first == rebuilt.get(d, 0)  # a split document continues where it stopped
        rebuilt[d] = first + n
    assert rebuilt == {d: n for d, n in enumerate(kept) if n}
    assert [d for d, _, _ in found] == sorted(d for d, _, _ in found)  # stream order


@given(document_lengths, st.integers(1, 50), st.booleans())
def test_next_fit_keeps_documents_whole_unless_longer_than_a_row(
    lengths: list[int], seq_len: int, truncate: bool
) -> None:
    found = segments(lengths, seq_len, False, truncate)
    kept = [min(n, seq_len) if truncate else n for n in lengths]
    pieces: dict[int, list[tuple[int, int]]] = {}
    for d, first, n in found:
        pieces.setdefault(d, []).append((first, n))
    assert {d: sum(n for _, n in p) for d, p in pieces.items()} == {d: n for d, n in enumerate(kept) if n}
    for d, parts in pieces.items():
        # A document is cut only into seq_len-token pieces (the last may be shorter).
        assert all(n == seq_len for _, n in parts[:-1])
        assert [first for first, _ in parts] == [i * seq_len for i in range(len(parts))]
        assert len(parts) == max(1, -(-kept[d] // seq_len))


def test_a_batch_without_tokens_packs_into_one_row_of_padding() -> None:
    packing = pack_offsets(np.array([0, 0, 0]), 4)
    assert packing.rows == 1
    assert packing.kept == 0
    assert packing.cu_values.tolist() == [0, 4]


def test_rows_and_boundaries_of_a_small_batch() -> None:
    split = pack_offsets(np.array([0, 3, 3, 8, 9]), 4)
    assert split.rows == 3
    assert split.cu_values.tolist() == [0, 3, 4, 0, 4, 0, 1, 4]
    # Issue 33, item 18: the continued document counts from 0 in its new row (was 1, 2, 3, 4).
    assert split.position.tolist() == [0, 1, 2, 0, 0, 1, 2, 3, 0]
    whole = pack_offsets(np.array([0, 3, 3, 8, 9]), 4, split=False)
    assert whole.dest.tolist() == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert whole.cu_values.tolist() == [0, 3, 4, 0, 4, 0, 1, 2, 4]
    assert whole.position.tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 0]
    cut = pack_offsets(np.array([0, 10]), 4, split=False)  # one document longer than a row
    assert cut.position.tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]


def test_seq_len_must_be_positive() -> None:
    with pytest.raises(ValueError, match="seq_len"):
        pack_offsets(np.array([0, 1]), 0)
