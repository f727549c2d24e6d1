"""Sequence packing on Arrow's buffers: a batch of token lists -> rows of ``seq_len`` tokens.

:class:`SequencePacker` turns each record batch of documents (a ``list<int>`` column)
into a record batch of packed rows (``pack_sequences``, see
:class:`~torch_dataloader_utils.config.SequencePack`); :class:`PackingConverter` puts it
in front of the usual :class:`~torch_dataloader_utils.convert.BatchConverter`, so it
runs where conversion runs: in the DataLoader workers, after the batch's rows were
read, shuffled and counted. Where each token goes is index arithmetic over the list's
offsets (:func:`~torch_dataloader_utils.plan.packing.pack_offsets`); the token values
move with one numpy fancy index, never row by row.

Since a batch is packed on its own, every document lies within one batch: the resume
state, equal batches and exactly-once reading work on documents as they do for any
column, and every token of every document read lands in exactly one packed row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from torch_dataloader_utils.config import PADDING_COLUMN, OutputConfig, SequencePack
from torch_dataloader_utils.convert import BatchConverter, FlatList
from torch_dataloader_utils.errors import ConfigError, ConversionError, UnknownColumnError
from torch_dataloader_utils.plan.packing import pack_offsets

__all__ = [
    "ATTENTION_MASK",
    "CU_SEQLENS",
    "POSITION_IDS",
    "PackingConverter",
    "SequencePacker",
    "batch_cu_seqlens",
    "converter_for",
]

CU_SEQLENS = "cu_seqlens"
"""Column of every packed row's segment boundaries (int32, from 0 to ``seq_len``)."""
POSITION_IDS = "position_ids"
"""Column of every token's position in its segment (int32; 0 where a document or a row starts)."""
ATTENTION_MASK = "attention_mask"
"""Column that is ``False`` on padding (``SequencePack(attention_mask=True)``)."""


class SequencePacker:
    """Packs the documents of each record batch (see :class:`~torch_dataloader_utils.config.SequencePack`).

    Args:
        config: The packing.
        schema: The schema of the batches it receives (the padding flag included).

    Raises:
        UnknownColumnError: the token column is not read.
        ConversionError: the token column is not a list of integers.
        ConfigError: ``pad_id`` does not fit the column's token type.
    """

    def __init__(self, config: SequencePack, schema: pa.Schema) -> None:
        name = config.column
        if name not in schema.names:
            raise UnknownColumnError(
                f"pack_sequences column {name!r} is not in the data read; columns: "
                f"{[n for n in schema.names if n != PADDING_COLUMN]} (add it to columns)"
            )
        t = schema.field(name).type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_integer(t.value_type):
            raise ConversionError(
                f"pack_sequences column {name!r} has type {t}; packing takes a list of integer token "
                "ids (list<int32> or list<int64>): cast the column when writing the data"
            )
        _check_pad_id(config, t.value_type)
        self.config = config
        self.value_type: pa.DataType = t.value_type
        fixed = config.seq_len
        fields: list[pa.Field[Any]] = [
            pa.field(name, pa.list_(t.value_type, fixed), nullable=False),
            pa.field(POSITION_IDS, pa.list_(pa.int32(), fixed), nullable=False),
            pa.field(CU_SEQLENS, pa.list_(pa.int32()), nullable=False),
        ]
        if config.attention_mask:
            fields.append(pa.field(ATTENTION_MASK, pa.list_(pa.bool_(), fixed), nullable=False))
        self.schema = pa.schema(fields)
        """The schema of the packed batches."""

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch``'s documents packed (rows flagged as padding by ``equal_batches='pad'`` left out)."""
        config = self.config
        column = batch.column(config.column)
        if PADDING_COLUMN in batch.schema.names:
            flags = batch.column(PADDING_COLUMN)
            if pc.any(flags).as_py():
                column = column.filter(pc.invert(flags))
        offsets, values = _list_buffers(column)
        packing = pack_offsets(offsets, config.seq_len, split=config.split, truncate=config.truncate)
        slots = packing.rows * config.seq_len
        kept = values if packing.source is None else values[packing.source]
        token_buffer, tokens = _allocate(slots, values.dtype)
        position_buffer, positions = _allocate(slots, np.dtype(np.int32))
        if packing.dest is None:  # end to end from slot 0: copies, no scatter
            tokens[: packing.kept] = kept
            tokens[packing.kept :] = config.pad_id
            positions[: packing.kept] = packing.position
            positions[packing.kept :] = 0
        else:
            tokens.fill(config.pad_id)
            tokens[packing.dest] = kept
            positions.fill(0)
            positions[packing.dest] = packing.position
        fixed = config.seq_len
        arrays: list[pa.Array[Any]] = [
            pa.FixedSizeListArray.from_arrays(
                pa.Array.from_buffers(self.value_type, slots, [None, token_buffer]), fixed
            ),
            pa.FixedSizeListArray.from_arrays(
                pa.Array.from_buffers(pa.int32(), slots, [None, position_buffer]), fixed
            ),
            pa.ListArray.from_arrays(pa.array(packing.cu_offsets), pa.array(packing.cu_values)),
        ]
        if config.attention_mask:
            mask = np.zeros(slots, dtype=np.bool_)
            mask[: packing.kept if packing.dest is None else 0] = True
            if packing.dest is not None:
                mask[packing.dest] = True
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(mask), fixed))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _check_pad_id(config: SequencePack, value_type: pa.DataType) -> None:
    """:class:`ConfigError` unless ``config.pad_id`` is a value of the token type.

    The padding is written into the tokens' own buffer: a value outside the type (uint16
    ``-100``, int16 ``70000``) would otherwise fail the first batch with numpy's bare
    ``OverflowError``.
    """
    dtype: np.dtype[Any] = np.dtype(value_type.to_pandas_dtype())
    info = np.iinfo(dtype)
    if not info.min <= config.pad_id <= info.max:
        raise ConfigError(
            f"SequencePack pad_id={config.pad_id} does not fit column {config.column!r}'s token type "
            f"{value_type} (values {info.min} to {info.max}): use a pad_id in that range (e.g. "
            "your tokenizer's pad token id), or write the column as a wider signed type (int32 or int64)"
        )


def _allocate(items: int, dtype: np.dtype[Any]) -> tuple[pa.Buffer, np.ndarray]:
    """A buffer of ``items`` values from Arrow's memory pool, and a writable numpy view of it.

    Packed batches are large (``rows * seq_len`` values) and of varying size: taken from
    the C allocator each would be fresh pages, faulted in one by one (measured 2/3 of
    the packer's CPU as system time); Arrow's pool keeps and reuses them.
    """
    buffer = pa.allocate_buffer(items * dtype.itemsize)
    return buffer, np.frombuffer(memoryview(buffer), dtype=dtype)


def _list_buffers(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets from 0, values)`` of a list column as numpy views (a null list is empty)."""
    if column.null_count:
        column = pc.if_else(column.is_null(), pa.scalar([], column.type), column)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    raw = column.offsets.to_numpy()
    lo, hi = int(raw[0]), int(raw[-1])
    values = column.values.slice(lo, hi - lo)
    if values.null_count:
        raise ConversionError(
            f"pack_sequences: {values.null_count} null token id(s) inside the lists; a token id "
            "must be a number (fill them when writing the data)"
        )
    return raw.astype(np.int64) - lo, values.to_numpy(zero_copy_only=True)


class PackingConverter:
    """Packs each batch (:class:`SequencePacker`), then converts it (:class:`BatchConverter`).

    Args:
        schema: The schema of the batches it receives.
        config: The output options; ``config.pack_sequences`` is set.
    """

    def __init__(self, schema: pa.Schema, config: OutputConfig) -> None:
        pack = config.pack_sequences
        if pack is None:
            raise ValueError("PackingConverter needs config.pack_sequences")
        self._packer = SequencePacker(pack, schema)
        self._inner = BatchConverter(self._packer.schema, config)

    @property
    def schema(self) -> pa.Schema:
        """The schema of the packed batches (before conversion)."""
        return self._packer.schema

    def __call__(self, batch: pa.RecordBatch) -> Any:
        """``batch`` packed and converted."""
        return self._inner(self._packer(batch))

    def convert_for_transfer(self, batch: pa.RecordBatch) -> Any:
        """``batch`` packed and converted for its way to the main process."""
        return self._inner.convert_for_transfer(self._packer(batch))


def converter_for(schema: pa.Schema, config: OutputConfig) -> BatchConverter | PackingConverter:
    """The converter of batches of ``schema``: packing first when ``pack_sequences`` is set."""
    if config.pack_sequences is not None:
        return PackingConverter(schema, config)
    return BatchConverter(schema, config)


def batch_cu_seqlens(cu_seqlens: Any, seq_len: int) -> torch.Tensor:
    """The ``cu_seqlens`` of a whole packed batch, flattened to ``rows * seq_len`` tokens.

    FlashAttention's varlen functions take the tokens of a batch as one sequence
    ``[rows * seq_len, ...]`` and the boundaries of all its segments as one int32 tensor
    ``[0, ..., rows * seq_len]``; this joins the rows' own boundaries (the
    ``cu_seqlens`` column of a packed batch, as a jagged tensor, a
    :class:`~torch_dataloader_utils.FlatList` with ``ragged='offsets'``, or a list of
    tensors) into it, vectorized.

    Args:
        cu_seqlens: The batch's ``cu_seqlens``.
        seq_len: The packing's ``seq_len``.
    """
    if isinstance(cu_seqlens, FlatList):
        values, offsets = torch.as_tensor(cu_seqlens.values), torch.as_tensor(cu_seqlens.offsets)
    elif isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.is_nested:
        values, offsets = cu_seqlens.values(), cu_seqlens.offsets()  # type: ignore[attr-defined]
    else:
        rows = [torch.as_tensor(r) for r in cu_seqlens]
        values = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int32)
        offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(torch.tensor([len(r) for r in rows], dtype=torch.int64), 0)
    offsets = offsets.to(torch.int64)
    lengths = offsets[1:] - offsets[:-1]
    row = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    flat = values.to(torch.int64) + row * seq_len
    keep = torch.ones(len(flat), dtype=torch.bool)
    keep[offsets[1:-1]] = False  # a row's 0 is the previous row's seq_len
    return flat[keep].to(torch.int32)
