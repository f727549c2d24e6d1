"""Configuration: enums, defaults, and small frozen config objects grouped by concern.

Strings are accepted at the public API edge only and turned into enums once, here, by
the ``coerce_*`` and ``parse_*`` helpers, which raise :class:`ConfigError` naming the
parameter, echoing the value and listing what is allowed.
"""

from __future__ import annotations

import contextlib
import enum
import math
import numbers
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

if TYPE_CHECKING:
    import torch

from torch_dataloader_utils.errors import (
    ConfigError,
    DistributedConfigError,
    IncompatibleOptionsError,
    OptionTypeError,
)
from torch_dataloader_utils.plan.mixing import DEFAULT_MIX_ROWS, RowMixing
from torch_dataloader_utils.plan.schedule import MixSchedule
from torch_dataloader_utils.plan.types import EqualBatches  # defined in pure plan/, coerced here
from torch_dataloader_utils.storage.redact import RedactedRepr, redact

__all__ = [
    "COMPRESSIONS",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_COMPRESSION",
    "DEFAULT_DATA_CACHE_SIZE",
    "DEFAULT_EQUAL_BATCHES",
    "DEFAULT_MIX_ROWS",
    "DEFAULT_RANK_TIMEOUT",
    "DEFAULT_READ_AHEAD_BYTES",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_RETRIES",
    "DEFAULT_RETRY_BACKOFF",
    "DEFAULT_ROW_GROUP_BYTES",
    "DEFAULT_SHUFFLE_SEED",
    "DEFAULT_SPLIT_BYTES",
    "DEFAULT_TARGET_FILE_SIZE",
    "BadDataConfig",
    "BadDataPolicy",
    "BatchConfig",
    "CacheConfig",
    "CountConfig",
    "DistributedConfig",
    "EqualBatches",
    "FeaturePack",
    "FetchConfig",
    "FileFormat",
    "FileSourceConfig",
    "MixConfig",
    "OnExhausted",
    "IcebergSourceConfig",
    "LoaderConfig",
    "OutputConfig",
    "OutputFormat",
    "PADDING_COLUMN",
    "ProgressConfig",
    "RESHARD_SOURCE_FORMATS",
    "RaggedLayout",
    "ReshardConfig",
    "ReshardSourceConfig",
    "SequencePack",
    "ShuffleConfig",
    "SplitConfig",
    "SplitKind",
    "StringLayout",
    "coerce_enum",
    "parse_size",
]

DEFAULT_BATCH_SIZE = 1024
"""Rows per batch when ``batch_size`` is not given."""
DEFAULT_SPLIT_BYTES = 64 * 1024**2
"""Target chunk size on disk: consecutive row groups are packed up to 64 MiB."""


class Unset(enum.Enum):
    """The value of an option that was not given (where ``None`` means something)."""

    UNSET = "unset"


UNSET = Unset.UNSET
"""An option not given (``row_mixing``: ``None`` there turns the row interleaving off)."""

DEFAULT_SHUFFLE_SEED = 0
"""Seed of the chunk shuffle when ``shuffle_seed`` is not given."""
DEFAULT_READ_AHEAD_BYTES = 256 * 1024**2
"""Bytes of upcoming chunks fetched ahead from remote storage while one is decoded."""
DEFAULT_RETRIES = 4
"""Retries of a remote read that failed with a transient error (after the first try)."""
DEFAULT_RETRY_BACKOFF = 0.2
"""Seconds before the first retry; doubled after each, capped at ``MAX_RETRY_BACKOFF``."""
MAX_RETRY_BACKOFF = 10.0
"""Upper bound of the wait between two retries, in seconds."""
DEFAULT_REQUEST_TIMEOUT = 30.0
"""Seconds one request to remote storage may take in all, its retries included."""
DEFAULT_DATA_CACHE_SIZE = 32 * 1024**3
"""Bytes the node-local ``data_cache`` may hold on disk when ``data_cache_size`` is not given."""


class FileFormat(enum.Enum):
    """Formats of data files."""

    PARQUET = "parquet"
    ORC = "orc"
    CSV = "csv"
    JSONL = "jsonl"


_FORMAT_ALIASES = {"json": "jsonl", "ndjson": "jsonl", "pq": "parquet"}


class OutputFormat(enum.Enum):
    """What each batch is.

    * ``TORCH``: ``dict[str, torch.Tensor]`` (strings as ``list[str]``).
    * ``NUMPY``: ``dict[str, numpy.ndarray]`` (strings as object arrays).
    * ``ARROW``: ``pyarrow.RecordBatch``.
    * ``DICT``: ``dict[str, list]`` of Python values.
    """

    TORCH = "torch"
    NUMPY = "numpy"
    ARROW = "arrow"
    DICT = "dict"


class RaggedLayout(enum.Enum):
    """How a variable-length list column (``list``, ``large_list``) reaches the loop.

    * ``JAGGED``: a jagged nested tensor ``[rows, j]`` over the flat values and offsets
      (``torch.nested.nested_tensor_from_jagged``, no copy); ``output_format='torch'`` only.
    * ``PADDED``: a :class:`~torch_dataloader_utils.PaddedList` ``(values, lengths)``:
      ``values`` is ``[rows, width]`` filled with ``pad_value`` past each list's end,
      ``width`` the longest list of the batch (at most ``max_length``).
    * ``OFFSETS``: a :class:`~torch_dataloader_utils.FlatList` ``(values, offsets)``:
      Arrow's layout, the flat values and ``rows + 1`` int64 offsets starting at 0.
    """

    JAGGED = "jagged"
    PADDED = "padded"
    OFFSETS = "offsets"


class StringLayout(enum.Enum):
    """How a string or binary column reaches the loop (``output_format`` torch or numpy).

    * ``LIST``: Python objects: ``list[str]`` (torch) or an object array (numpy); nulls
      are ``None``.
    * ``ARROW``: the ``pyarrow`` array itself (``StringArray``, ``BinaryArray``...), nulls
      kept; with workers it is rebuilt over the batch's transfer buffer without a copy.
    * ``BYTES``: a :class:`~torch_dataloader_utils.FlatList` ``(values, offsets)``: the
      UTF-8 (or raw) bytes as ``uint8`` and ``rows + 1`` int64 offsets starting at 0.
    """

    LIST = "list"
    ARROW = "arrow"
    BYTES = "bytes"


_PACK_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")


def _dtype_name(value: object) -> str:
    """``value`` (a name, a numpy dtype or a ``torch.dtype``) as a numpy dtype name."""
    if type(value).__name__ == "dtype" and type(value).__module__ == "torch":
        value = str(value).removeprefix("torch.")
    name: str | None = None
    if value is not None:
        with contextlib.suppress(TypeError):
            name = str(np.dtype(value).name)  # type: ignore[call-overload]
    if name not in _PACK_DTYPES:
        allowed = ", ".join(repr(d) for d in _PACK_DTYPES)
        raise ConfigError(
            f"FeaturePack dtype={value!r} is not supported; use one of {allowed} "
            "(a name, a numpy dtype or the torch dtype of the same name)"
        )
    return name


@dataclass(frozen=True)
class FeaturePack:
    """Numeric columns stacked into one ``[rows, F]`` tensor (or array) under ``key``.

    Pass it (or several) as ``pack_features``. The packed columns leave the batch; the
    other columns are converted as usual. Each column gives one feature, a
    ``fixed_size_list`` column ``size`` features, in the order of ``columns``.

    Args:
        columns: The columns to stack, in order (numbers, bool, or fixed-size lists of
            them).
        key: The batch key of the stacked tensor (default ``"features"``).
        dtype: Its dtype: a name such as ``"float32"`` (default), a numpy dtype or a
            ``torch.dtype``. Columns are cast as numpy's ``same_kind`` rule allows (ints
            to floats, wider to narrower of one kind); a float column into an int dtype
            is an error.

    Raises:
        ConfigError: an empty or repeated column list, an empty key, an unsupported dtype.
    """

    columns: Sequence[str]
    key: str = "features"
    dtype: str | np.dtype[Any] | torch.dtype = "float32"

    def __post_init__(self) -> None:
        cols = self.columns
        if isinstance(cols, str) or not isinstance(cols, Sequence) or not cols:
            raise ConfigError(
                f"FeaturePack columns={cols!r} must be a non-empty list of column names, "
                "e.g. FeaturePack(['f0', 'f1'])"
            )
        if not all(isinstance(c, str) for c in cols):
            raise ConfigError(f"FeaturePack columns={cols!r} must all be column names (str)")
        repeated = sorted({c for c in cols if list(cols).count(c) > 1})
        if repeated:
            raise ConfigError(f"FeaturePack columns={list(cols)!r} names {repeated} more than once")
        if not isinstance(self.key, str) or not self.key:
            raise ConfigError(f"FeaturePack key={self.key!r} must be a non-empty str (the batch key)")
        object.__setattr__(self, "columns", tuple(cols))
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """The stacked array's dtype (``dtype`` is kept as its numpy name, e.g. ``'float32'``)."""
        return np.dtype(str(self.dtype))


def coerce_packs(value: object) -> tuple[FeaturePack, ...]:
    """``pack_features`` (one :class:`FeaturePack`, a sequence of them, or ``None``) as a tuple.

    Raises:
        ConfigError: anything else, naming the parameter and echoing the value.
    """
    if value is None:
        return ()
    items = (value,) if isinstance(value, FeaturePack) else value
    if isinstance(items, (list, tuple)) and all(isinstance(p, FeaturePack) for p in items):
        return tuple(items)
    raise ConfigError(
        f"pack_features={value!r} must be a FeaturePack or a list of them, "
        "e.g. pack_features=FeaturePack(['f0', 'f1'], key='features', dtype='float32')"
    )


@dataclass(frozen=True)
class SequencePack:
    """Token lists packed into rows of exactly ``seq_len`` tokens (the ``pack_sequences`` option).

    Every batch's documents (its ``batch_size`` rows) are packed, greedily in stream
    order, into as many rows of ``seq_len`` tokens as they need; only the last row of a
    batch ends in padding. A packed batch has these columns (the batch's other columns
    are left out, since a packed row mixes several documents):

    * ``column``: the tokens, ``[rows, seq_len]``, padded with ``pad_id``;
    * ``position_ids``: int32 ``[rows, seq_len]``, each token's position in its segment:
      0 where a document starts and where a row starts (a document continued from the
      previous row counts from 0 again, as the row's attention cannot see its start), so
      always below ``seq_len``; padding is 0;
    * ``cu_seqlens``: int32 per row, the segment boundaries ``[0, ..., seq_len]`` as
      FlashAttention's varlen functions take them (padding is a segment of its own);
      :func:`~torch_dataloader_utils.packing.batch_cu_seqlens` joins a batch's rows;
    * ``attention_mask`` (with ``attention_mask=True``): bool ``[rows, seq_len]``,
      ``False`` on padding.

    Args:
        column: The ``list<int>`` column of token ids.
        seq_len: Tokens per packed row.
        split: A document may continue in the next row (default), so rows are full; with
            ``False`` a document that does not fit the rest of a row starts the next one
            (the rest is padding), and only documents longer than ``seq_len`` are cut.
        truncate: Keep only the first ``seq_len`` tokens of a longer document (the rest
            is left out); by default such a document is split over several rows.
        pad_id: The token id of padding.
        attention_mask: Add the ``attention_mask`` column.

    Raises:
        ConfigError: an empty column name, or ``seq_len`` / ``pad_id`` not an int.
    """

    column: str
    seq_len: int
    split: bool = True
    truncate: bool = False
    pad_id: int = 0
    attention_mask: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise ConfigError(
                f"SequencePack column={self.column!r} must be the name of a list<int> column of "
                "token ids, e.g. SequencePack('tokens', seq_len=2048)"
            )
        check_int(self.seq_len, "SequencePack seq_len", 1, hint=" (tokens per packed row)")
        check_bool(self.split, "SequencePack split")
        check_bool(self.truncate, "SequencePack truncate")
        check_bool(self.attention_mask, "SequencePack attention_mask")
        if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, int):
            raise ConfigError(f"SequencePack pad_id={self.pad_id!r} must be an int (the padding token id)")


def coerce_sequence_pack(value: object) -> SequencePack | None:
    """``pack_sequences`` (a :class:`SequencePack` or ``None``).

    Raises:
        ConfigError: anything else, naming the parameter and echoing the value.
    """
    if value is None or isinstance(value, SequencePack):
        return value
    raise ConfigError(
        f"pack_sequences={value!r} must be a SequencePack, e.g. "
        "pack_sequences=SequencePack('tokens', seq_len=2048)"
    )


class OnExhausted(enum.Enum):
    """Which source's epoch ends an epoch of a mix (``on_exhausted``): its *anchor*.

    * ``CYCLE``: the source that takes longest at its weight; every other source starts
      its next epoch when it runs out, and the mix goes on.
    * ``STOP``: the source that takes shortest at its weight (in the first epoch, the
      first to run out); a source that runs out before it (having started part-read)
      starts its next epoch.

    Every epoch of the mix reads its anchor's epoch once, so all have the same length,
    and the other sources go on where they stopped in the next one.
    """

    CYCLE = "cycle"
    STOP = "stop"


@dataclass(frozen=True, kw_only=True)
class MixConfig:
    """How the sources of :func:`~torch_dataloader_utils.create_mixed_dataloader` are mixed.

    Attributes:
        weights: One weight > 0 per source (its share of every batch's rows is ``weight /
            sum(weights)``), or a schedule of them (:class:`~torch_dataloader_utils.MixSchedule`;
            a list of ``(step, weights)`` pairs and a function of the step are made one).
        on_exhausted: What happens when a source has read its epoch (:class:`OnExhausted`).
        source_column: Add an int32 column of this name holding each row's source index
            (its position in ``sources``), or ``None``.
        allow_recipe_change: ``load_state_dict`` takes a state saved with other weights,
            or with sources added or removed (matched by name).
    """

    weights: tuple[float, ...] | MixSchedule
    on_exhausted: OnExhausted = OnExhausted.CYCLE
    source_column: str | None = None
    allow_recipe_change: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", _mix_weights(self.weights))
        object.__setattr__(self, "on_exhausted", coerce_enum(self.on_exhausted, OnExhausted, "on_exhausted"))
        column = self.source_column
        if column is not None and (not isinstance(column, str) or not column):
            raise ConfigError(
                f"source_column={column!r} must be a column name (str), e.g. source_column='source', or None"
            )
        if not isinstance(self.allow_recipe_change, bool):
            raise ConfigError(f"allow_recipe_change={self.allow_recipe_change!r} must be True or False")

    @property
    def schedule(self) -> MixSchedule:
        """The weights as a schedule (fixed weights: one stage from step 0)."""
        weights = self.weights
        return weights if isinstance(weights, MixSchedule) else MixSchedule.constant(weights)

    @property
    def num_sources(self) -> int | None:
        """Weights per stage (``None``: a function's, known when it is called)."""
        weights = self.weights
        return weights.num_sources if isinstance(weights, MixSchedule) else len(weights)


def _mix_weights(weights: object) -> tuple[float, ...] | MixSchedule:
    """``weights=`` of a mix: numbers (as a tuple), or a schedule (pairs and functions made one)."""
    if isinstance(weights, MixSchedule):
        return weights
    if callable(weights) and not isinstance(weights, type):
        return MixSchedule.of(weights)
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence) or not weights:
        raise ConfigError(
            f"weights={weights!r} must be a non-empty list of numbers > 0, one per source, e.g. "
            "weights=[0.5, 0.3, 0.2]; or a schedule: [(0, [0.6, 0.4]), (50_000, [0.4, 0.6])] (stages by "
            "step), MixSchedule(..., unit='rows'), or a function of the step"
        )
    if all(isinstance(w, Sequence) and not isinstance(w, (str, bytes)) for w in weights):
        return MixSchedule(weights)
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or float(w) <= 0:
            raise ConfigError(
                f"weights={list(weights)!r}: every weight must be a finite number > 0 (got {w!r}); "
                "leave a source out instead of giving it weight 0"
            )
    return tuple(int(w) if isinstance(w, numbers.Integral) else float(w) for w in weights)


DEFAULT_EQUAL_BATCHES = EqualBatches.DROP
"""Default of ``equal_batches``: equal batch counts, dropping < ``num_ranks`` rows per epoch."""
PADDING_COLUMN = "_is_padding"
"""Name of the boolean column added with ``equal_batches='pad'``: ``True`` on repeated rows."""


def coerce_equal_batches(value: object) -> EqualBatches:
    """``equal_batches`` as an :class:`EqualBatches` (``'drop'``, ``'pad'`` or ``'off'``).

    Raises:
        ConfigError: naming the parameter, echoing the value and listing the choices.
    """
    if isinstance(value, bool):
        raise ConfigError(f"equal_batches={value!r} is ambiguous; use 'drop' (default), 'pad' or 'off'")
    return coerce_enum(value, EqualBatches, "equal_batches")


class SplitKind(enum.Enum):
    """Built-in split strategies."""

    FILE = "file"
    ROW_GROUP = "row_group"
    BYTE_RANGE = "byte_range"


E = TypeVar("E", bound=enum.Enum)


def coerce_enum(value: object, enum_type: type[E], param: str, aliases: Mapping[str, str] | None = None) -> E:
    """Turn ``value`` (an enum member or its string value) into a member of ``enum_type``.

    Raises:
        ConfigError: naming ``param``, echoing ``value`` and listing the allowed values.
    """
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str):
        key = value.strip().lower()
        key = (aliases or {}).get(key, key)
        for member in enum_type:
            if member.value == key:
                return member
    allowed = ", ".join(repr(m.value) for m in enum_type)
    raise ConfigError(f"{param}={value!r} is not supported; use one of {allowed}")


def coerce_format(value: object) -> FileFormat:
    """``format`` as a :class:`FileFormat` (accepts 'json' and 'ndjson' for JSONL)."""
    return coerce_enum(value, FileFormat, "format", _FORMAT_ALIASES)


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024, "ki": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2, "mi": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "gi": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4, "ti": 1024**4,
}  # fmt: skip


def parse_size(value: object, param: str) -> int | None:
    """A byte size from an int or a string such as ``"128MiB"``, ``"64MB"``, ``"1.5GiB"``.

    Raises:
        ConfigError: the value is not a positive size.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{param}={value!r} is not a size; pass bytes as an int or a string like '128MiB'")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (m := _SIZE_RE.match(value)):
        size = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    else:
        raise ConfigError(
            f"{param}={value!r} is not a size; pass bytes as an int or a string like "
            "'128MiB', '64MB' or '1.5GiB'"
        )
    if size < 1:
        raise ConfigError(f"{param}={value!r} must be at least 1 byte")
    return size


def check_int(
    value: object,
    param: str,
    minimum: int,
    *,
    optional: bool = False,
    hint: str = "",
    error: type[ConfigError] = ConfigError,
) -> int | None:
    """``value`` as an int >= ``minimum`` (``None`` allowed when ``optional``).

    Raises:
        ConfigError: (or the given subclass ``error``) naming ``param`` and echoing ``value``.
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{param}={value!r} must be an int >= {minimum}{hint}")
    if value < minimum:
        raise error(f"{param}={value!r} must be >= {minimum}{hint}")
    return value


def check_bool(value: object, param: str) -> bool:
    """``value`` as a bool; anything but ``True``/``False`` is an error.

    A string such as ``"no"`` is truthy, so accepting it would silently mean ``True``.

    Raises:
        ConfigError: naming ``param`` and echoing ``value``.
    """
    if not isinstance(value, bool):
        raise ConfigError(f"{param}={value!r} must be True or False")
    return value


def _check_callable(value: object, param: str) -> None:
    if value is not None and not callable(value):
        raise ConfigError(f"{param}={value!r} must be callable")


@dataclass(frozen=True, kw_only=True)
class SplitConfig:
    """How files are cut into chunks (the keywords ``split_strategy``, ``split_bytes``, ``split_rows``).

    Attributes:
        split_strategy: A built-in :class:`SplitKind`, a custom strategy object, or
            ``None`` for the format's default (row groups / stripes for Parquet and ORC,
            byte ranges for CSV and JSONL).
        split_bytes: Target chunk size on disk in bytes, or ``None`` (64 MiB for the
            built-in strategies that take a size).
        split_rows: Target rows per chunk, or ``None``.
        verify_plan: Check a custom rank-aware strategy's chunks across ranks in worlds
            of more than 16 ranks too (smaller worlds are always checked); it calls the
            strategy for every rank once per epoch in each process that plans.
    """

    split_strategy: SplitKind | object | None = None
    split_bytes: int | None = None
    split_rows: int | None = None
    verify_plan: bool = False

    def __post_init__(self) -> None:
        if self.split_bytes is not None:
            check_int(self.split_bytes, "split_bytes", 1, hint=" (bytes, or a string like '128MiB')")
        check_int(self.split_rows, "split_rows", 1, optional=True)
        check_bool(self.verify_plan, "verify_plan")


@dataclass(frozen=True, kw_only=True)
class ShuffleConfig:
    """Shuffling: chunk order by ``(shuffle_seed, epoch)``, and rows mixed across chunks.

    Attributes:
        shuffle: Whether the order changes every epoch (chunk order, and rows of several
            chunks interleaved by ``row_interleave``).
        shuffle_seed: Seed of the permutation (the same on every rank).
        row_interleave: With ``shuffle=True``, rows per round of the row interleaving
            (every worker reads several chunks side by side and yields each round's rows
            in a seeded order), or ``None`` for chunk order only (default 32768). Ignored
            when ``row_shuffle_window`` or ``shuffle_buffer_size`` is set.
        row_mixing: ``row_interleave`` by its former name (0.7.0); giving both is an error.
        row_shuffle_window: Rows of whole consecutive chunks shuffled together, or
            ``None``. Needs ``shuffle=True``.
        shuffle_buffer_size: torch-dataloader-utils 0.2.0's row-level shuffle, mapped onto
            the same mechanism: rows mixed in windows of this many rows, independent of
            ``shuffle`` (which then only decides whether the chunk order changes).
    """

    shuffle: bool = False
    shuffle_seed: int = DEFAULT_SHUFFLE_SEED
    row_interleave: int | Unset | None = UNSET
    row_shuffle_window: int | None = None
    shuffle_buffer_size: int | None = None
    row_mixing: int | Unset | None = UNSET

    def __post_init__(self) -> None:
        check_bool(self.shuffle, "shuffle")
        check_int(self.shuffle_seed, "shuffle_seed", 0)
        hint = " (rows interleaved per round, or None for chunk order only)"
        rows, name = self.row_interleave, "row_interleave"
        if self.row_mixing is not UNSET:  # the former name
            if rows is not UNSET:
                raise IncompatibleOptionsError(
                    f"row_mixing={self.row_mixing!r} and row_interleave={rows!r} are the same option "
                    "(row_mixing is its former name); pass only row_interleave"
                )
            rows, name = self.row_mixing, "row_mixing"
        rows = DEFAULT_MIX_ROWS if rows is UNSET else rows
        check_int(rows, name, 1, optional=True, hint=hint)
        object.__setattr__(self, "row_interleave", rows)
        object.__setattr__(self, "row_mixing", rows)
        window = self.row_shuffle_window
        check_int(window, "row_shuffle_window", 1, optional=True, hint=" (rows shuffled together)")
        if window is not None and not self.shuffle:
            raise IncompatibleOptionsError(
                f"row_shuffle_window={window!r} mixes rows across chunks, which is a shuffle; "
                "pass shuffle=True too, or drop row_shuffle_window"
            )
        buffer = self.shuffle_buffer_size
        check_int(buffer, "shuffle_buffer_size", 1, optional=True, hint=" (rows per worker, or None)")
        if buffer is not None and window is not None:
            raise IncompatibleOptionsError(
                f"shuffle_buffer_size={buffer!r} and row_shuffle_window={window!r} both set the rows "
                "shuffled together; pass only one (shuffle_buffer_size is the 0.2.0 name)"
            )

    @property
    def row_window(self) -> int | None:
        """Rows shuffled together across chunks (either option), or ``None``."""
        return self.row_shuffle_window if self.row_shuffle_window is not None else self.shuffle_buffer_size

    @property
    def mixing(self) -> RowMixing | None:
        """The row interleaving in effect: with ``shuffle=True``, ``row_interleave`` set and no window."""
        rows = self.row_interleave
        if not self.shuffle or not isinstance(rows, int) or self.row_window is not None:
            return None
        return RowMixing(rows=rows)

    @property
    def rows_mixed(self) -> int | None:
        """Rows mixed across chunks (the window, or a round of the row mixing), or ``None``."""
        mixing = self.mixing
        return self.row_window if mixing is None else mixing.rows


@dataclass(frozen=True, kw_only=True)
class ProgressConfig:
    """Progress display of the batches the training loop receives.

    Attributes:
        show_progress: Show this rank's progress (rows, rows/s, the loop's stall
            percentage), updated in the main process as batches arrive: a ``tqdm`` bar
            on a terminal, log lines otherwise.
        progress_interval_sec: Seconds between two progress lines when standard error
            is not a terminal (>= 0); ``0`` writes a line for every batch (and redraws a
            bar at every batch), as 0.2.0's ``progress_interval_sec=0`` refreshed its bars
            at every batch.
        progress_all_ranks: Show progress on every rank (each line prefixed with its
            rank), not only on rank 0.
    """

    show_progress: bool = False
    progress_interval_sec: float = 120.0
    progress_all_ranks: bool = False

    def __post_init__(self) -> None:
        check_bool(self.show_progress, "show_progress")
        check_bool(self.progress_all_ranks, "progress_all_ranks")
        interval = self.progress_interval_sec
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 <= interval < 1e9:
            raise ConfigError(
                f"progress_interval_sec={interval!r} must be a number of seconds >= 0 (0: a line "
                "for every batch)"
            )


@dataclass(frozen=True, kw_only=True)
class BatchConfig:
    """How rows are grouped into batches, and how ranks are evened out.

    Attributes:
        batch_size: Rows per batch.
        drop_last: Drop each worker's last, short batch.
        equal_batches: The equal-batches policy across ranks.
        canonical_ranks: Elastic order: plan every epoch for this many canonical ranks,
            shared by the physical ranks (``None``: plan for the physical ranks).
    """

    batch_size: int = DEFAULT_BATCH_SIZE
    drop_last: bool = False
    equal_batches: EqualBatches = DEFAULT_EQUAL_BATCHES
    canonical_ranks: int | None = None

    def __post_init__(self) -> None:
        check_int(self.batch_size, "batch_size", 1, hint=" (rows per batch)")
        check_bool(self.drop_last, "drop_last")
        if not isinstance(self.equal_batches, EqualBatches):
            coerce_equal_batches(self.equal_batches)  # raises, naming the choices
        hint = " (canonical streams every epoch is planned for; any world size dividing it)"
        check_int(self.canonical_ranks, "canonical_ranks", 1, optional=True, hint=hint)
        if self.canonical_ranks is not None and self.equal_batches is EqualBatches.OFF:
            raise IncompatibleOptionsError(
                f"canonical_ranks={self.canonical_ranks} gives every canonical stream the same rows, "
                "which equal_batches='off' does not; pass equal_batches='drop' or 'pad'"
            )


@dataclass(frozen=True, kw_only=True)
class OutputConfig:
    """How batches are handed to the training loop.

    Attributes:
        output_format: Output type of each batch.
        null_fill: Value used for nulls in columns whose output type has no null: a
            scalar for every column or a mapping column -> value. ``None`` makes a null
            there an error.
        collate_fn: Applied to every converted batch, in the worker.
        ragged: Layout of variable-length list columns, or ``None`` for the output
            format's own (torch: ``JAGGED``; numpy: an object array of arrays).
        pad_value: With ``ragged=PADDED``: the value past each list's end (default 0).
        max_length: With ``ragged=PADDED``: lists are cut to their first ``max_length``
            items (``None``: no limit).
        strings: Layout of string and binary columns, or ``None`` (``LIST``).
        pack_features: Groups of numeric columns stacked into one ``[rows, F]`` tensor each.
        pack_sequences: Token lists packed into rows of ``seq_len`` tokens, or ``None``.
    """

    output_format: OutputFormat = OutputFormat.TORCH
    null_fill: Any = None
    collate_fn: Callable[[Any], Any] | None = None
    ragged: RaggedLayout | None = None
    pad_value: int | float | None = None
    max_length: int | None = None
    strings: StringLayout | None = None
    pack_features: tuple[FeaturePack, ...] = ()
    pack_sequences: SequencePack | None = None

    def __post_init__(self) -> None:
        # Built from code (not through the public edge), strings still become enums here.
        set_ = object.__setattr__
        set_(self, "output_format", coerce_enum(self.output_format, OutputFormat, "output_format"))
        _check_callable(self.collate_fn, "collate_fn")
        if self.ragged is not None:
            set_(self, "ragged", coerce_enum(self.ragged, RaggedLayout, "ragged"))
        if self.strings is not None:
            set_(self, "strings", coerce_enum(self.strings, StringLayout, "strings"))
        pad = self.pad_value
        if pad is not None and (isinstance(pad, bool) or not isinstance(pad, (int, float))):
            raise ConfigError(f"pad_value={pad!r} must be a number (the value past each list's end)")
        check_int(self.max_length, "max_length", 1, optional=True, hint=" (items kept per list)")
        set_(self, "pack_features", coerce_packs(self.pack_features))
        set_(self, "pack_sequences", coerce_sequence_pack(self.pack_sequences))
        self._check_combinations()

    def _check_combinations(self) -> None:
        output = self.output_format
        if output not in (OutputFormat.TORCH, OutputFormat.NUMPY):
            given = [
                f"{name}={value.value if isinstance(value, enum.Enum) else value!r}"
                for name, value in (("ragged", self.ragged), ("strings", self.strings))
                if value is not None
            ] + (["pack_features=..."] if self.pack_features else [])
            if given:
                raise IncompatibleOptionsError(
                    f"{', '.join(given)} applies to output_format 'torch' or 'numpy', but "
                    f"output_format={output.value!r} keeps every column as it is; drop it or "
                    "use output_format='torch'"
                )
        if self.ragged is RaggedLayout.JAGGED and output is OutputFormat.NUMPY:
            raise IncompatibleOptionsError(
                "ragged='jagged' makes torch nested tensors; with output_format='numpy' use "
                "ragged='padded' or 'offsets' (or output_format='torch')"
            )
        if self.ragged is not RaggedLayout.PADDED:
            for name, value in (("pad_value", self.pad_value), ("max_length", self.max_length)):
                if value is not None:
                    shown = "None" if self.ragged is None else repr(self.ragged.value)
                    raise IncompatibleOptionsError(
                        f"{name}={value!r} applies to padded lists, but ragged={shown}; "
                        f"pass ragged='padded' or drop {name}"
                    )
        keys: dict[str, int] = {}
        owner: dict[str, str] = {}
        for pack in self.pack_features:
            keys[pack.key] = keys.get(pack.key, 0) + 1
            for column in pack.columns:
                if column in owner:
                    raise IncompatibleOptionsError(
                        f"pack_features puts column {column!r} in two packs ({owner[column]!r} and "
                        f"{pack.key!r}); a column can be packed once"
                    )
                owner[column] = pack.key
        twice = sorted(k for k, n in keys.items() if n > 1)
        if twice:
            raise IncompatibleOptionsError(
                f"pack_features uses the key(s) {twice} for two packs; give each FeaturePack its own key"
            )


@dataclass(frozen=True, kw_only=True)
class CountConfig:
    """Exact row counts at construction, where the metadata does not hold them.

    Attributes:
        count_rows: ``True`` counts, ``False`` never counts, ``None`` counts when
            equal batches need exact counts (see :meth:`counts`).
        count_cache_dir: A directory keeping text-format counts across runs (implies
            counting).
    """

    count_rows: bool | None = None
    count_cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.count_rows is not None:
            check_bool(self.count_rows, "count_rows")
        if self.count_cache_dir is not None:
            if not isinstance(self.count_cache_dir, str):
                raise ConfigError(f"count_cache_dir={self.count_cache_dir!r} must be a directory path (str)")
            if self.count_rows is False:
                raise IncompatibleOptionsError(
                    f"count_cache_dir={self.count_cache_dir!r} caches the counts of count_rows=True; "
                    "set count_rows=True or drop count_cache_dir"
                )

    def counts(self, equalized: bool) -> bool:
        """Whether rows are counted at construction, given whether ranks are equalized."""
        if self.count_rows is not None:
            return self.count_rows
        return equalized or self.count_cache_dir is not None


@dataclass(frozen=True, kw_only=True)
class DistributedConfig:
    """The rank of this process among ``num_ranks`` (global rank, across nodes)."""

    num_ranks: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        hint = " (the world size, e.g. torch.distributed.get_world_size())"
        check_int(self.num_ranks, "num_ranks", 1, hint=hint, error=DistributedConfigError)
        hint = " (the global rank, e.g. torch.distributed.get_rank())"
        check_int(self.rank, "rank", 0, hint=hint, error=DistributedConfigError)
        if self.rank >= self.num_ranks:
            raise DistributedConfigError(
                f"rank={self.rank} must be < num_ranks={self.num_ranks}; pass the global rank "
                "(torch.distributed.get_rank()) and the world size (get_world_size())"
            )


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """Options passed through to ``torch.utils.data.DataLoader``, and where batches are handed over.

    ``num_workers=None`` means automatic: the dataset resolves it once (CPUs per rank,
    at most one per chunk, at most 8), before the loader is built. ``device`` (a
    ``torch.device``, resolved and checked at the edge from ``'cuda'``, ``'auto'``...):
    the loader copies batches there ahead of the loop (``None``: it does not). ``ledger``:
    a directory where every rank records each pass it starts (the training ledger,
    :mod:`torch_dataloader_utils.plan.ledger`), or ``None``.
    """

    num_workers: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    timeout: float = 0
    multiprocessing_context: Any = None
    device: torch.device | None = None
    ledger: str | None = None

    def __post_init__(self) -> None:
        check_int(self.num_workers, "num_workers", 0, optional=True, hint=" (or None for automatic)")
        if self.ledger is not None and (not isinstance(self.ledger, str) or not self.ledger.strip()):
            raise ConfigError(
                f"ledger={self.ledger!r} must be a directory (str or path), e.g. 'checkpoints/ledger', "
                "or a path holding '{rank}' for a directory per rank; or None"
            )
        check_bool(self.pin_memory, "pin_memory")
        if self.device is not None and type(self.device).__name__ != "device":
            raise ConfigError(
                f"device={self.device!r} must be a torch.device here; create_dataloader(device=...) "
                "also takes 'cuda', 'cuda:N', 'auto' and 'cpu'"
            )
        check_bool(self.persistent_workers, "persistent_workers")
        if self.num_workers == 0:  # (None: decided later, checked again then)
            if self.persistent_workers:
                raise IncompatibleOptionsError(
                    "persistent_workers=True needs num_workers >= 1 (got num_workers=0); "
                    "set num_workers or drop persistent_workers"
                )
            if self.prefetch_factor is not None:
                raise IncompatibleOptionsError(
                    f"prefetch_factor={self.prefetch_factor!r} needs num_workers >= 1 "
                    "(got num_workers=0); set num_workers or drop prefetch_factor"
                )
            if self.multiprocessing_context is not None:
                raise IncompatibleOptionsError(
                    f"multiprocessing_context={self.multiprocessing_context!r} needs num_workers >= 1 "
                    "(got num_workers=0); set num_workers or drop multiprocessing_context"
                )
        check_int(self.prefetch_factor, "prefetch_factor", 1, optional=True)
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or self.timeout < 0:
            raise ConfigError(f"timeout={self.timeout!r} must be a number of seconds >= 0")


def parse_read_ahead(value: object) -> int:
    """``read_ahead_bytes`` as an int >= 0 (``0`` or ``None`` turns read-ahead off).

    Raises:
        ConfigError: the value is not a size.
    """
    if isinstance(value, bool):
        raise ConfigError(f"read_ahead_bytes={value!r} is not a size; pass 0 to disable or e.g. '256MiB'")
    if value is None or value == 0 or (isinstance(value, str) and value.strip().lower() in ("0", "0b")):
        return 0
    if isinstance(value, int) and value < 0:
        raise ConfigError(f"read_ahead_bytes={value!r} must be >= 0 (0 disables read-ahead)")
    size = parse_size(value, "read_ahead_bytes")
    assert size is not None
    return size


@dataclass(frozen=True, kw_only=True)
class FetchConfig:
    """How bytes are fetched from remote storage, and whether batches are decoded ahead.

    Attributes:
        decode_ahead: Whether a process that reads its own batches decodes them on a
            background thread, a few batches ahead of the loop; ``None`` (automatic)
            does when the process has a CPU to spare.
        read_ahead_bytes: Memory bound of the bytes of upcoming chunks fetched while the
            current one is decoded; ``0`` fetches a chunk only when it is read.
        retries: Retries of a request that failed with a transient error (HTTP 500/503,
            connection reset, timeout); ``0`` fails at the first error.
        retry_backoff: Seconds before the first retry, doubled after each retry (capped
            at ``MAX_RETRY_BACKOFF``).
        request_timeout: Seconds one request (listing, a footer, a byte range) may take in
            all, retries and waits included: each attempt's connect and read timeouts are
            ``request_timeout / (retries + 1)``, and no retry starts that could not end in
            time. A storage endpoint that accepts connections and never answers fails
            within about this long, with an error naming the endpoint.
    """

    read_ahead_bytes: int = DEFAULT_READ_AHEAD_BYTES
    retries: int = DEFAULT_RETRIES
    retry_backoff: float = DEFAULT_RETRY_BACKOFF
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    decode_ahead: bool | None = None

    def __post_init__(self) -> None:
        if self.decode_ahead is not None and not isinstance(self.decode_ahead, bool):
            raise ConfigError(
                f"decode_ahead={self.decode_ahead!r} must be True, False or None (automatic: "
                "decode ahead when the reading process has a CPU to spare)"
            )
        if isinstance(self.read_ahead_bytes, bool) or not isinstance(self.read_ahead_bytes, int):
            raise ConfigError(f"read_ahead_bytes={self.read_ahead_bytes!r} must be an int number of bytes")
        if self.read_ahead_bytes < 0:
            raise ConfigError(
                f"read_ahead_bytes={self.read_ahead_bytes!r} must be >= 0 (0 disables read-ahead)"
            )
        check_int(self.retries, "retries", 0, hint=" (0 disables retries)")
        backoff = self.retry_backoff
        if isinstance(backoff, bool) or not isinstance(backoff, (int, float)) or not 0 <= backoff <= 60:
            raise ConfigError(
                f"retry_backoff={backoff!r} must be a number of seconds between 0 and 60, e.g. 0.2"
            )
        timeout = self.request_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400:
            raise ConfigError(
                f"request_timeout={timeout!r} must be a number of seconds > 0 (a request to remote "
                f"storage, retries included), e.g. {DEFAULT_REQUEST_TIMEOUT}"
            )

    @property
    def attempt_timeout(self) -> float:
        """Connect and read timeout of one attempt: the request's budget shared by its attempts."""
        return float(self.request_timeout) / (self.retries + 1)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        return float(min(MAX_RETRY_BACKOFF, self.retry_backoff * 2 ** (attempt - 1)))


class BadDataPolicy(enum.Enum):
    """What a reader does with a unit of data it cannot decode (``on_bad_data``).

    * ``RAISE``: stop with :class:`~torch_dataloader_utils.errors.BadDataError` naming the
      file and the position (the default).
    * ``SKIP``: drop the unit (a Parquet row group, an ORC stripe, a CSV / JSONL line),
      count it, log it at INFO.
    * ``QUARANTINE``: as ``SKIP``, and write where it is (file, unit, error) to
      ``quarantine.jsonl`` under ``quarantine_dir``.
    """

    RAISE = "raise"
    SKIP = "skip"
    QUARANTINE = "quarantine"


@dataclass(frozen=True, kw_only=True)
class BadDataConfig:
    """What happens to data a reader cannot decode (see ``docs/failure-modes.md``).

    Attributes:
        on_bad_data: The policy.
        quarantine_dir: The local directory of the quarantine report (``quarantine`` only).
    """

    on_bad_data: BadDataPolicy = BadDataPolicy.RAISE
    quarantine_dir: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.on_bad_data, BadDataPolicy):
            coerce_enum(self.on_bad_data, BadDataPolicy, "on_bad_data")  # raises, naming the choices
        directory = self.quarantine_dir
        if directory is not None and (not isinstance(directory, str) or not directory.strip()):
            raise ConfigError(
                f"quarantine_dir={directory!r} must be a local directory path (str), e.g. '/scratch/bad-rows'"
            )
        if self.on_bad_data is BadDataPolicy.QUARANTINE and directory is None:
            raise IncompatibleOptionsError(
                "on_bad_data='quarantine' writes where each undecodable unit is to a report; pass "
                "quarantine_dir='/some/local/dir', or on_bad_data='skip' to skip without a report"
            )
        if self.on_bad_data is not BadDataPolicy.QUARANTINE and directory is not None:
            raise IncompatibleOptionsError(
                f"quarantine_dir={directory!r} is only used with on_bad_data='quarantine' (got "
                f"on_bad_data={self.on_bad_data.value!r}); pass on_bad_data='quarantine' or drop "
                "quarantine_dir"
            )

    @property
    def skipping(self) -> bool:
        """Whether undecodable units are skipped (``skip`` or ``quarantine``)."""
        return self.on_bad_data is not BadDataPolicy.RAISE


def coerce_bad_data(value: object) -> BadDataPolicy:
    """``on_bad_data`` as a :class:`BadDataPolicy` (``'raise'``, ``'skip'`` or ``'quarantine'``).

    Raises:
        ConfigError: naming the parameter, echoing the value and listing the choices.
    """
    return coerce_enum(value, BadDataPolicy, "on_bad_data")


@dataclass(frozen=True, kw_only=True)
class CacheConfig:
    """The node-local cache of the byte ranges read from remote storage (``data_cache``).

    Attributes:
        data_cache: A local directory shared by every rank and worker of the node, or
            ``None`` (no cache). Local files are never cached.
        data_cache_size: Bytes the cache may hold on disk; the least recently used
            ranges are evicted beyond it.
        data_cache_prefetch: Chunks of the next epoch each worker warms into the cache
            while its fetch threads are idle (``0``: none).
    """

    data_cache: str | None = None
    data_cache_size: int = DEFAULT_DATA_CACHE_SIZE
    data_cache_prefetch: int = 0

    def __post_init__(self) -> None:
        directory = self.data_cache
        if directory is not None:
            if not isinstance(directory, str) or not directory.strip():
                raise ConfigError(
                    f"data_cache={directory!r} must be a local directory path (str), e.g. "
                    "'/local_nvme/tdu-cache'"
                )
            if "://" in directory and not directory.startswith("file://"):
                raise ConfigError(
                    f"data_cache={directory!r} must be a directory on this node's local disk, not a URL: "
                    "the cache keeps remote bytes close to the readers"
                )
        check_int(self.data_cache_size, "data_cache_size", 1, hint=" (bytes, or a string such as '100GiB')")
        check_int(self.data_cache_prefetch, "data_cache_prefetch", 0, hint=" (chunks of the next epoch)")
        if directory is None and self.data_cache_prefetch:
            raise IncompatibleOptionsError(
                f"data_cache_prefetch={self.data_cache_prefetch!r} warms the data_cache, but data_cache "
                "is None; pass data_cache='/local/dir' or drop data_cache_prefetch"
            )

    @property
    def enabled(self) -> bool:
        """Whether a cache directory is set."""
        return self.data_cache is not None

    @property
    def directory(self) -> str | None:
        """``data_cache`` as a plain path (a ``file://`` prefix removed, ``~`` expanded)."""
        if self.data_cache is None:
            return None
        return os.path.expanduser(self.data_cache.removeprefix("file://"))


METADATA_CACHE_CHECKS = ("listing", "on_open")
"""The values of ``metadata_cache_check``."""


def _check_filesystem(filesystem: object, storage_options: Mapping[str, Any] | None) -> None:
    """``filesystem=``: a filesystem instance, and no ``storage_options`` beside it.

    Raises:
        OptionTypeError: not an fsspec or pyarrow filesystem instance.
        IncompatibleOptionsError: ``storage_options`` given too (they would be ignored).
    """
    import fsspec
    import pyarrow.fs as pafs

    if not isinstance(filesystem, (fsspec.AbstractFileSystem, pafs.FileSystem)) and not hasattr(
        filesystem,
        "protocols",  # already wrapped by the library (storage.userfs.UserFileSystem)
    ):
        shown = (
            f"the class {filesystem.__name__}" if isinstance(filesystem, type) else type(filesystem).__name__
        )
        raise OptionTypeError(
            f"filesystem={filesystem!r} is not a filesystem instance ({shown}); pass an fsspec "
            "AbstractFileSystem (e.g. s3fs.S3FileSystem(...), fsspec.filesystem('memory')) or a "
            "pyarrow.fs.FileSystem (e.g. pyarrow.fs.S3FileSystem(...))"
        )
    if storage_options:
        raise IncompatibleOptionsError(
            f"filesystem={type(filesystem).__name__} and storage_options="
            f"{redact(dict(storage_options))!r} were both given: the filesystem object is used for "
            "every request, so storage_options would be ignored; configure the filesystem object "
            "instead, or drop filesystem="
        )


@dataclass(frozen=True, kw_only=True, repr=False)
class FileSourceConfig(RedactedRepr):
    """Which files are read, and how (the source options of :class:`StructuredDataset`).

    Attributes:
        format: The files' format.
        columns: Columns to return, in order, or ``None`` for all.
        filters: A ``pyarrow.compute.Expression`` applied to rows (and to row-group
            statistics and partition values for pruning), or ``None``.
        partitioning: ``"hive"`` to read ``key=value`` directories as columns, or ``None``.
        storage_options: Options of the fsspec filesystem (credentials, endpoint...).
        filesystem: A filesystem object (an fsspec ``AbstractFileSystem`` or a
            ``pyarrow.fs.FileSystem`` instance) used for every request instead of one the
            library builds from ``storage_options``, or ``None``.
        schema: CSV / JSONL: a ``pyarrow.Schema`` for every file, or ``None`` to infer.
        quoted_newlines: CSV: quoted fields may hold newlines (such files are read whole).
        metadata_cache: Parquet: a file (local path or URL) keeping the files' metadata
            across runs, so a restart reads no footers; ``None`` (default) keeps none.
        metadata_cache_check: How a warm ``metadata_cache`` is validated: ``"listing"``
            (default) lists the files and compares; ``"on_open"`` trusts the cached file
            set (no listing) and checks each file's size and modification time when it
            is opened.
        use_manifest: Parquet: read a resharded directory from its ``_manifest.json``
            (no listing, no footers). ``None`` uses it when ``path`` holds one, ``True``
            requires it, ``False`` lists the files instead.
    """

    format: FileFormat = FileFormat.PARQUET
    columns: Sequence[str] | None = None
    filters: Any = None
    partitioning: str | None = None
    storage_options: Mapping[str, Any] | None = None
    filesystem: Any = None
    schema: Any = None
    quoted_newlines: bool = False
    metadata_cache: str | None = None
    metadata_cache_check: str = "listing"
    use_manifest: bool | None = None

    def __post_init__(self) -> None:
        if self.metadata_cache_check not in METADATA_CACHE_CHECKS:
            raise ConfigError(
                f"metadata_cache_check={self.metadata_cache_check!r} is not supported; use "
                "'listing' (list the files and compare them with the cache) or 'on_open' (no "
                "listing: trust the cached files, each checked when it is opened)"
            )
        if self.metadata_cache is not None and (
            not isinstance(self.metadata_cache, str) or not self.metadata_cache.strip()
        ):
            raise ConfigError(
                f"metadata_cache={self.metadata_cache!r} must be a file path or URL (str), e.g. "
                "'/scratch/train-metadata.arrow' or 's3://bucket/cache/train.arrow', or None"
            )
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise ConfigError(
                f"storage_options={redact(self.storage_options)!r} must be a dict of filesystem "
                "options, e.g. {'key': ..., 'secret': ..., 'endpoint_url': ...}"
            )
        if self.filesystem is not None:
            _check_filesystem(self.filesystem, self.storage_options)
        check_bool(self.quoted_newlines, "quoted_newlines")
        if self.use_manifest is not None:
            check_bool(self.use_manifest, "use_manifest")
            if self.use_manifest and self.format is not FileFormat.PARQUET:
                raise IncompatibleOptionsError(
                    f"use_manifest=True reads the Parquet shards written by reshard, but "
                    f"format={self.format.value!r}; pass format='parquet' or drop use_manifest"
                )


@dataclass(frozen=True, kw_only=True, repr=False)
class IcebergSourceConfig(RedactedRepr):
    """Which Iceberg table, snapshot and rows are read (see :class:`IcebergDataset`).

    Attributes:
        table: ``"namespace.table"`` or ``"catalog.namespace.table"``.
        catalog_config: Properties for ``pyiceberg.catalog.load_catalog``.
        snapshot_id: Read this snapshot (time travel), or ``None`` for the current one.
        as_of: Read the snapshot current at this time (aware ``datetime`` or ms).
        columns: Columns to return, in order, or ``None`` for all.
        filters: A ``pyarrow.compute.Expression`` applied to rows (and used for pruning).
        scan_filter: A pyiceberg ``BooleanExpression`` used for pruning only.
        storage_options: As given; already merged into ``catalog_config`` as FileIO
            properties by the public edge.
        since_snapshot_id: Read only the rows the snapshot read has and this older
            snapshot (an ancestor) did not: an incremental epoch (docs/iceberg.md).
        continue_from: A resume state saved on an older snapshot: read the rest of its
            interrupted epoch, less the rows deleted since, and the rows added since.
    """

    table: str
    catalog_config: Mapping[str, Any] | None = None
    storage_options: Mapping[str, Any] | None = None
    snapshot_id: int | None = None
    as_of: Any = None
    columns: Sequence[str] | None = None
    filters: Any = None
    scan_filter: Any = None
    since_snapshot_id: int | None = None
    continue_from: Mapping[str, Any] | None = None


# -- reshard -------------------------------------------------------------------------------

DEFAULT_TARGET_FILE_SIZE = 256 * 1024**2
"""Size of every output shard but the last (256 MiB) when ``target_file_size`` is not given."""
DEFAULT_ROW_GROUP_BYTES = 32 * 1024**2
"""Size of a row group (32 MiB) when neither ``row_group_bytes`` nor ``row_group_rows`` is given:
several per shard, so the loader can split a shard among workers."""
DEFAULT_COMPRESSION = "zstd"
"""Parquet codec of the shards when ``compression`` is not given."""
COMPRESSIONS = ("none", "snappy", "gzip", "brotli", "lz4", "zstd")
"""The Parquet codecs ``compression`` accepts."""
DEFAULT_RANK_TIMEOUT = 24 * 3600.0
"""Seconds a rank waits for the others at a barrier, when ``reshard`` starts the process group."""
RESHARD_SOURCE_FORMATS = ("parquet", "orc", "csv", "jsonl", "iceberg")
"""What ``reshard``'s ``format`` accepts; ``"iceberg"`` makes ``src`` a table name."""


@dataclass(frozen=True, kw_only=True)
class ReshardConfig:
    """How a reshard job writes its output (built once from :func:`reshard`'s keywords).

    Attributes:
        target_file_size: Bytes of every shard but the last (and but each partition's last).
        row_group_bytes: Bytes per row group, or ``None`` when ``row_group_rows`` is set.
        row_group_rows: Rows per row group, or ``None`` (sized by ``row_group_bytes``).
        compression: Parquet codec, one of :data:`COMPRESSIONS`.
        sort_by: Columns each shard is sorted by.
        group_by: Columns whose rows stay together in one shard, contiguous.
        partition_by: Columns written as ``key=value`` directories.
        workers: Local worker processes per rank.
        verify: Compare row counts and checksums of source and output.
        rank_timeout: Seconds a rank waits at a barrier (process group started by reshard).
    """

    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    row_group_bytes: int | None = DEFAULT_ROW_GROUP_BYTES
    row_group_rows: int | None = None
    compression: str = DEFAULT_COMPRESSION
    sort_by: tuple[str, ...] = ()
    group_by: tuple[str, ...] = ()
    partition_by: tuple[str, ...] = ()
    workers: int = 1
    verify: bool = False
    rank_timeout: float = DEFAULT_RANK_TIMEOUT

    def __post_init__(self) -> None:
        check_int(self.target_file_size, "target_file_size", 1, hint=" (bytes, or a string like '256MiB')")
        check_int(self.row_group_bytes, "row_group_bytes", 1, optional=True)
        check_int(self.row_group_rows, "row_group_rows", 1, optional=True)
        if (self.row_group_bytes is None) == (self.row_group_rows is None):
            raise IncompatibleOptionsError(
                f"pass one of row_group_bytes and row_group_rows (got row_group_bytes="
                f"{self.row_group_bytes!r}, row_group_rows={self.row_group_rows!r})"
            )
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"compression={self.compression!r} is not supported; use one of "
                + ", ".join(repr(c) for c in COMPRESSIONS)
            )
        check_int(self.workers, "workers", 1, hint=" (worker processes per rank)")
        check_bool(self.verify, "verify")
        timeout = self.rank_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigError(f"rank_timeout={timeout!r} must be a number of seconds > 0")
        both = sorted(set(self.sort_by) & set(self.partition_by))
        if both:
            raise IncompatibleOptionsError(
                f"sort_by and partition_by both name {both}: a partition column is constant "
                "within a shard; drop it from sort_by"
            )

    @property
    def grouped(self) -> bool:
        """Whether the job runs a map and a reduce phase (``group_by`` or ``partition_by``)."""
        return bool(self.group_by or self.partition_by)

    def identity(self) -> dict[str, Any]:
        """The options that decide the output (a rerun must pass the same)."""
        return {
            "target_file_size": self.target_file_size,
            "row_group_bytes": self.row_group_bytes,
            "row_group_rows": self.row_group_rows,
            "compression": self.compression,
            "sort_by": list(self.sort_by),
            "group_by": list(self.group_by),
            "partition_by": list(self.partition_by),
        }


@dataclass(frozen=True, kw_only=True, repr=False)
class ReshardSourceConfig(RedactedRepr):
    """What a reshard job reads, as values (the loader's datasets open it).

    Attributes:
        src: Files, directories or globs (one or several), or an Iceberg table name.
        format: One of :data:`RESHARD_SOURCE_FORMATS`.
        columns: Columns to keep, or ``None`` for all.
        filters: A ``pyarrow.compute.Expression``: only rows passing it are written.
        storage_options: The source's filesystem options.
        partitioning: ``"hive"`` reads ``key=value`` directories as columns.
        schema: CSV / JSONL: the column types.
        catalog_config: Iceberg: ``pyiceberg.catalog.load_catalog`` properties.
        snapshot_id: Iceberg: the snapshot to read (default: the current one).
        filesystem: The source's filesystem object (fsspec or pyarrow), or ``None``.
    """

    src: str | tuple[str, ...]
    format: str = "parquet"
    columns: tuple[str, ...] | None = None
    filters: Any = None
    storage_options: Mapping[str, Any] | None = None
    partitioning: str | None = None
    schema: Any = None
    catalog_config: Mapping[str, Any] | None = None
    snapshot_id: int | None = None
    filesystem: Any = None

    def __post_init__(self) -> None:
        if self.format not in RESHARD_SOURCE_FORMATS:
            raise ConfigError(
                f"format={self.format!r} is not supported; use one of "
                + ", ".join(repr(f) for f in RESHARD_SOURCE_FORMATS)
            )
        iceberg = self.format == "iceberg"
        for name, value in (("catalog_config", self.catalog_config), ("snapshot_id", self.snapshot_id)):
            if value is not None and not iceberg:
                raise IncompatibleOptionsError(
                    f"{name}= applies to format='iceberg' (got format={self.format!r}); drop it"
                )
        if iceberg:
            for name, given in (
                ("partitioning", self.partitioning),
                ("schema", self.schema),
                ("filesystem", self.filesystem),
            ):
                if given is not None:
                    raise IncompatibleOptionsError(f"{name}= does not apply to format='iceberg'; drop it")
        if iceberg and not isinstance(self.src, str):
            raise ConfigError(
                f"format='iceberg' needs src= to be a table name like 'db.events', got {self.src!r}"
            )

    @property
    def first_path(self) -> str:
        """The first path of ``src`` (``""`` when there is none)."""
        return self.src if isinstance(self.src, str) else (self.src[0] if self.src else "")
