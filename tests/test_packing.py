"""Sequence packing end to end: every token of every document in exactly one packed row.

Token ids encode where they come from (``document * 1000 + position``), so a packed row
split at its ``cu_seqlens`` tells which document each segment is and where in it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.recipes import DOCS, every_token, tokens_of, unpack
from torch_dataloader_utils import (
    ConfigError,
    ConversionError,
    SequencePack,
    StructuredDataset,
    UnknownColumnError,
    batch_cu_seqlens,
    create_dataloader,
    merge_states,
)

PACK = SequencePack("tokens", seq_len=32, pad_id=-1, attention_mask=True)
OPTIONS: dict[str, Any] = {"batch_size": 20, "ragged": "offsets", "pack_sequences": PACK}


@pytest.mark.parametrize("workers", [0, 2])
def test_every_token_once_with_workers(corpus: str, workers: int) -> None:
    loader, _ = create_dataloader(corpus, num_workers=workers, shuffle=True, **OPTIONS)
    found = [s for batch in loader for s in unpack(batch, 32)]
    assert tokens_of(found) == every_token()
    # Rows are full but each batch's last: padding is under one row per batch.
    metrics = loader.metrics()
    assert metrics.total.rows_read == DOCS  # rows counted are documents read


@settings(max_examples=12)
@given(
    num_ranks=st.integers(1, 3),
    seq_len=st.integers(5, 70),
    split=st.booleans(),
    truncate=st.booleans(),
    batch_size=st.integers(3, 40),
    equal=st.sampled_from(["drop", "pad"]),
)
def test_every_token_once_across_ranks(
    corpus: str, num_ranks: int, seq_len: int, split: bool, truncate: bool, batch_size: int, equal: str
) -> None:
    pack = SequencePack("tokens", seq_len=seq_len, split=split, truncate=truncate, pad_id=-1)
    found: list[tuple[int, int, int]] = []
    counts = set()
    for rank in range(num_ranks):
        loader, _ = create_dataloader(
            corpus,
            num_workers=0,
            num_ranks=num_ranks,
            rank=rank,
            shuffle=True,
            shuffle_seed=3,
            batch_size=batch_size,
            equal_batches=equal,
            ragged="offsets",
            pack_sequences=pack,
        )
        batches = list(loader)
        counts.add(len(batches))
        for batch in batches:
            segs = unpack(batch, seq_len)
            if not split:  # whole documents: only those longer than a row are cut, at seq_len
                assert all(first % seq_len == 0 and (first == 0 or n <= seq_len) for _, first, n in segs)
            found += segs
    assert len(counts) == 1  # equal batches on every rank
    expected = every_token(truncate_at=seq_len if truncate else None)
    got = tokens_of(found)
    assert max(got.values(), default=1) == 1  # 'pad' repeats documents, but not into packed rows
    assert set(got) <= set(expected)
    # 'drop' leaves out fewer than num_ranks documents; 'pad' repeats fewer than num_ranks.
    missing = {d for d, _ in set(expected) - set(got)}
    assert len(missing) < num_ranks
    if equal == "pad":
        assert not missing


def test_resume_on_other_ranks_and_workers_reads_every_token_once(corpus: str, tmp_path: Path) -> None:
    opts = {**OPTIONS, "shuffle": True, "equal_batches": "pad"}
    first: list[tuple[int, int, int]] = []
    states = []
    # Every rank of a job with the same num_workers (the split the row mixing chooses
    # depends on it; under a process group every rank takes rank 0's).
    for rank in range(2):
        loader, _ = create_dataloader(corpus, num_workers=2, num_ranks=2, rank=rank, **opts)
        for n, batch in enumerate(loader, start=1):
            first += unpack(batch, 32)
            if n == 3 + rank:
                break
        states.append(json.loads(json.dumps(loader.state_dict())))
    state = merge_states(states)
    rest: list[tuple[int, int, int]] = []
    for rank in range(3):
        loader, _ = create_dataloader(corpus, num_workers=rank % 2, num_ranks=3, rank=rank, **opts)
        loader.load_state_dict(state)
        rest += [s for batch in loader for s in unpack(batch, 32)]
    # With 'pad' the repeated documents are left out of the packed rows.
    assert tokens_of(first + rest) == every_token()


def test_packed_batches_in_every_output_format(corpus: str) -> None:
    pack = SequencePack("tokens", seq_len=16)
    arrow = next(
        iter(
            create_dataloader(
                corpus, num_workers=0, batch_size=8, output_format="arrow", pack_sequences=pack
            )[0]
        )
    )
    assert isinstance(arrow, pa.RecordBatch)
    assert arrow.schema.names == ["tokens", "position_ids", "cu_seqlens"]
    assert arrow.schema.field("tokens").type == pa.list_(pa.int32(), 16)
    numpy = next(
        iter(
            create_dataloader(
                corpus,
                num_workers=0,
                batch_size=8,
                output_format="numpy",
                ragged="offsets",
                pack_sequences=pack,
            )[0]
        )
    )
    assert numpy["tokens"].shape == (arrow.num_rows, 16)
    assert numpy["tokens"].dtype == np.int32
    as_dict = next(
        iter(
            create_dataloader(corpus, num_workers=0, batch_size=8, output_format="dict", pack_sequences=pack)[
                0
            ]
        )
    )
    assert as_dict["cu_seqlens"] == arrow.column("cu_seqlens").to_pylist()
    torch_batch = next(iter(create_dataloader(corpus, num_workers=0, batch_size=8, pack_sequences=pack)[0]))
    assert torch_batch["tokens"].shape == (arrow.num_rows, 16)
    assert torch_batch["cu_seqlens"].is_nested  # jagged by default


def test_batch_cu_seqlens_joins_the_rows(corpus: str) -> None:
    pack = SequencePack("tokens", seq_len=16)
    flat = next(
        iter(create_dataloader(corpus, num_workers=0, batch_size=8, ragged="offsets", pack_sequences=pack)[0])
    )
    jagged = next(iter(create_dataloader(corpus, num_workers=0, batch_size=8, pack_sequences=pack)[0]))
    rows = flat["tokens"].shape[0]
    per_row = [
        flat["cu_seqlens"].values[a:b]
        for a, b in zip(flat["cu_seqlens"].offsets[:-1], flat["cu_seqlens"].offsets[1:], strict=True)
    ]
    expected = sorted({int(v) + r * 16 for r, row in enumerate(per_row) for v in row})
    for given_cu in (flat["cu_seqlens"], jagged["cu_seqlens"], per_row):
        cu = batch_cu_seqlens(given_cu, 16)
        assert cu.dtype == torch.int32
        assert cu.tolist() == expected
        assert cu[0] == 0
        assert cu[-1] == rows * 16


def test_pack_sequences_errors(corpus: str) -> None:
    with pytest.raises(UnknownColumnError, match="'text'"):
        StructuredDataset(corpus, pack_sequences=SequencePack("text", seq_len=8))
    with pytest.raises(ConversionError, match="list of integer"):
        StructuredDataset(corpus, pack_sequences=SequencePack("id", seq_len=8))
    with pytest.raises(UnknownColumnError, match="'tokens'"):
        StructuredDataset(corpus, columns=["id"], pack_sequences=SequencePack("tokens", seq_len=8))
    with pytest.raises(ConfigError, match="pack_sequences="):
        StructuredDataset(corpus, pack_sequences="tokens")  # type: ignore[typeddict-item]
    with pytest.raises(ConfigError, match="seq_len"):
        SequencePack("tokens", seq_len=0)
    with pytest.raises(ConfigError, match="column"):
        SequencePack("", seq_len=8)
    with pytest.raises(ConfigError, match="pad_id"):
        SequencePack("tokens", seq_len=8, pad_id=1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("token_type", "pad_id", "bounds"),
    [
        (pa.uint16(), -100, "0 to 65535"),
        (pa.int16(), 70_000, "-32768 to 32767"),
        (pa.uint8(), 256, "0 to 255"),
    ],
)
def test_pad_id_outside_the_token_type_is_refused_when_built(
    tmp_path: Path, token_type: pa.DataType, pad_id: int, bounds: str
) -> None:
    """Issue 33, item 17: numpy's bare ``OverflowError`` at the first batch, now a ConfigError at build."""
    tokens = pa.array([[1, 2, 3], [4]], pa.list_(token_type))
    pq.write_table(pa.table({"id": [0, 1], "tokens": tokens}), tmp_path / "t.parquet")
    pack = SequencePack("tokens", seq_len=8, pad_id=pad_id)
    with pytest.raises(ConfigError) as caught:
        StructuredDataset(str(tmp_path), pack_sequences=pack)
    message = str(caught.value)
    for words in (f"pad_id={pad_id}", "'tokens'", str(token_type), bounds, "int32"):
        assert words in message
    # The bounds themselves are accepted: padding is the pad_id.
    low, high = (int(x) for x in bounds.split(" to "))
    for edge in (low, high):
        loader, _ = create_dataloader(
            str(tmp_path), batch_size=2, pack_sequences=SequencePack("tokens", seq_len=8, pad_id=edge)
        )
        (batch,) = list(loader)
        assert batch["tokens"][0].tolist() == [1, 2, 3, 4] + [edge] * 4


@settings(max_examples=10)
@given(
    before=st.integers(1, 3),
    after=st.integers(1, 3),
    stops=st.lists(st.integers(1, 6), min_size=3, max_size=3),
    split=st.booleans(),
    shuffle=st.booleans(),
)
def test_resume_mid_epoch_is_exact(
    corpus: str, before: int, after: int, stops: list[int], split: bool, shuffle: bool
) -> None:
    pack = SequencePack("tokens", seq_len=40, split=split, pad_id=-1)
    opts: dict[str, Any] = {
        "batch_size": 9,
        "ragged": "offsets",
        "pack_sequences": pack,
        "shuffle": shuffle,
        "equal_batches": "pad",
        "num_workers": 0,
    }
    first: list[tuple[int, int, int]] = []
    states = []
    for rank in range(before):
        loader, _ = create_dataloader(corpus, num_ranks=before, rank=rank, **opts)
        for n, batch in enumerate(loader, start=1):
            first += unpack(batch, 40)
            if n == stops[rank]:
                break
        states.append(json.loads(json.dumps(loader.state_dict())))
    rest: list[tuple[int, int, int]] = []
    for rank in range(after):
        loader, _ = create_dataloader(corpus, num_ranks=after, rank=rank, **opts)
        loader.load_state_dict(merge_states(states))
        rest += [s for batch in loader for s in unpack(batch, 40)]
    assert tokens_of(first + rest) == every_token()
