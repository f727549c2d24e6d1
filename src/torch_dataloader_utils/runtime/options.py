"""The public edge: flat keyword options, turned into config objects once.

Every option is declared once, here, as a key of a ``TypedDict`` (its public type and
its documentation), and once as a field of the config object of its concern in
:mod:`torch_dataloader_utils.config` (its internal type, its one default and its
checks). The public functions take ``**options: Unpack[...]`` of these dicts, so type
checkers and IDEs know every keyword and reject a misspelled one, and
:func:`build_options` rejects it at run time with the closest valid name. Nothing below
this module takes loose option keywords: it receives an :class:`Options`.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypedDict, TypeVar

import pyarrow as pa
import torch

from torch_dataloader_utils.config import (
    DEFAULT_COMPRESSION,
    DEFAULT_RANK_TIMEOUT,
    DEFAULT_ROW_GROUP_BYTES,
    DEFAULT_SPLIT_BYTES,
    DEFAULT_TARGET_FILE_SIZE,
    BadDataConfig,
    BadDataPolicy,
    BatchConfig,
    CacheConfig,
    CountConfig,
    EqualBatches,
    FeaturePack,
    FetchConfig,
    FileFormat,
    FileSourceConfig,
    IcebergSourceConfig,
    LoaderConfig,
    OnExhausted,
    OutputConfig,
    OutputFormat,
    ProgressConfig,
    RaggedLayout,
    ReshardConfig,
    ReshardSourceConfig,
    SequencePack,
    ShuffleConfig,
    SplitConfig,
    SplitKind,
    StringLayout,
    coerce_bad_data,
    coerce_enum,
    coerce_equal_batches,
    coerce_format,
    coerce_packs,
    coerce_sequence_pack,
    parse_read_ahead,
    parse_size,
)
from torch_dataloader_utils.discovery.columns import check_filter_type
from torch_dataloader_utils.errors import (
    ConfigError,
    DestinationConflictError,
    IncompatibleOptionsError,
    UnknownOptionError,
)
from torch_dataloader_utils.plan.elastic import Canonical
from torch_dataloader_utils.plan.splits import (
    ByteRangeSplit,
    FileSplit,
    LegacySplitStrategy,
    RankAwareStrategy,
    RowGroupSplit,
    SplitStrategy,
    Splitter,
    resolve_strategy,
)
from torch_dataloader_utils.plan.types import World
from torch_dataloader_utils.runtime import env
from torch_dataloader_utils.runtime.device import resolve_device
from torch_dataloader_utils.runtime.iceberg_props import catalog_properties
from torch_dataloader_utils.storage.fs import FileSystemSpec, resolve
from torch_dataloader_utils.storage.userfs import UserFileSystem

__all__ = [
    "MIX_ONLY",
    "FileLoaderOptions",
    "FileReadOptions",
    "IcebergLoaderOptions",
    "IcebergReadOptions",
    "LoaderOptions",
    "MixedLoaderOptions",
    "Options",
    "ReadOptions",
    "ReshardKeywords",
    "ReshardRequest",
    "build_options",
    "reshard_request",
]


class ReadOptions(TypedDict, total=False):
    """Options of every dataset (files and Iceberg tables)."""

    columns: Sequence[str] | None
    """Columns to return, in order; ``None`` (default) returns all."""
    filters: Any
    """A ``pyarrow.compute.Expression``: row groups (and partitions, Iceberg files) whose
    statistics exclude it are never read, and rows are filtered exactly."""
    batch_size: int
    """Rows per batch (default 1024). Every batch has exactly this many rows except the
    last of each worker (and none is short with equal batches on several ranks)."""
    drop_last: bool
    """Drop each worker's last, short batch (default ``False``)."""
    shuffle: bool
    """Shuffle every epoch, by ``(shuffle_seed, epoch)``: the order of chunks, and rows of
    several chunks interleaved (``row_interleave``) (default ``False``)."""
    shuffle_seed: int
    """Seed of the shuffle, an int >= 0, the same on every rank (default 0)."""
    row_interleave: int | None
    """With ``shuffle=True``, how rows of several chunks are interleaved: each worker reads
    8 of its chunks (or parts of chunks) side by side and yields them in rounds of about
    this many rows, each round in an order seeded by ``(shuffle_seed, epoch, ...)``, so
    every batch draws rows from several files. More rows per round interleave more widely
    and hold more memory (one round, plus a decoded batch per chunk read). ``None``
    shuffles chunk order only (rows of a chunk stay in file order). Default 32768. Exactly
    once and resumable; ignored when ``row_shuffle_window`` or ``shuffle_buffer_size`` is set."""
    row_mixing: int | None
    """The former name of ``row_interleave`` (0.7.0), still taken: the same option."""
    row_shuffle_window: int | None
    """With ``shuffle=True``, also mix rows across chunks: each worker reads runs of
    consecutive chunks of up to this many rows together and yields their rows in a
    permutation seeded by ``(shuffle_seed, epoch, ...)``. Memory holds at most
    ``max(row_shuffle_window, largest chunk)`` rows per worker. ``None`` (default) keeps
    file order inside chunks."""
    shuffle_buffer_size: int | None
    """Row-level shuffle under torch-dataloader-utils 0.2.0's name: each worker mixes
    rows across chunks in windows of up to this many rows, seeded by ``(shuffle_seed,
    epoch, ...)``, exactly once and resumable (the ``row_shuffle_window`` mechanism, but
    without needing ``shuffle=True``). ``None`` (default) is off."""
    show_progress: bool
    """Show this rank's progress — rows, rows/s and the loop's stall percentage — fed in
    the main process from the batches the loop receives: a ``tqdm`` bar on a terminal,
    log lines of the ``torch_dataloader_utils.progress`` logger otherwise (default
    ``False``)."""
    progress_interval_sec: float
    """Seconds between two progress lines when standard error is not a terminal
    (default 120; a line is also written at the end of each pass); ``0`` writes a line
    for every batch (and redraws a bar at every batch, as 0.2.0 did)."""
    progress_all_ranks: bool
    """Show progress on every rank, each prefixed with its rank (default ``False``:
    rank 0 only)."""
    split_strategy: str | SplitKind | SplitStrategy | LegacySplitStrategy | None
    """``"row_group"`` (Parquet / ORC default), ``"byte_range"`` (CSV / JSONL default),
    ``"file"``, or an object with ``generate(...)`` (see :mod:`~torch_dataloader_utils.plan.splits`)."""
    split_bytes: int | str | None
    """Target chunk size on disk, an int or a string such as ``"128MiB"`` (default 64 MiB
    for the built-in strategies that take a size)."""
    split_rows: int | None
    """Target rows per chunk."""
    verify_plan: bool
    """Check a custom rank-aware ``split_strategy`` across ranks (no row on two ranks) in
    worlds of more than 16 ranks too; smaller worlds are always checked. It calls the
    strategy for every rank once per epoch in each process that plans (default ``False``)."""
    output_format: str | OutputFormat
    """``"torch"`` (default), ``"numpy"``, ``"arrow"`` or ``"dict"``."""
    null_fill: Any
    """Value (or mapping column -> value) replacing nulls in columns whose output type
    has no null; by default a null there is an error."""
    collate_fn: Callable[[Any], Any] | None
    """Applied to each converted batch inside the worker."""
    ragged: str | RaggedLayout | None
    """Variable-length list columns (``list``, ``large_list``, nested one level:
    ``list<fixed_size_list>``): ``"jagged"`` (a jagged nested tensor ``[rows, j]``, no
    copy), ``"padded"`` (a ``PaddedList(values [rows, width], lengths)``) or ``"offsets"``
    (a ``FlatList(values, offsets)``, Arrow's layout). ``None`` (default): ``"jagged"``
    for ``output_format="torch"``, an object array of arrays for ``"numpy"``.
    Fixed-size lists are always a dense ``[rows, size]`` tensor."""
    pad_value: int | float | None
    """With ``ragged="padded"``: the value past each list's end (default 0)."""
    max_length: int | None
    """With ``ragged="padded"``: keep at most this many items per list (``None``: all);
    the width is the longest list of the batch, at most ``max_length``."""
    strings: str | StringLayout | None
    """String and binary columns: ``"list"`` (default: ``list[str]``, or an object array
    with numpy), ``"arrow"`` (the ``pyarrow`` array, nulls kept) or ``"bytes"`` (a
    ``FlatList(values uint8, offsets int64)``; nulls need ``null_fill``)."""
    pack_features: FeaturePack | Sequence[FeaturePack] | None
    """Stack numeric columns into one ``[rows, F]`` tensor of a given dtype under a key,
    e.g. ``FeaturePack(["f0", "f1", "f2"], key="features", dtype="float32")``; the packed
    columns leave the batch (default: none)."""
    pack_sequences: SequencePack | None
    """Pack the token lists of a ``list<int>`` column into rows of exactly ``seq_len``
    tokens, e.g. ``SequencePack("tokens", seq_len=2048)``: each batch's ``batch_size``
    documents become as many packed rows as they need (only the batch's last row ends
    in padding), with ``position_ids``, ``cu_seqlens`` (FlashAttention's varlen
    boundaries) and optionally an ``attention_mask``; the other columns are left out
    (default: no packing). See ``docs/recipes.md``."""
    num_ranks: int | None
    """Number of ranks (world size); default from ``torch.distributed`` or ``WORLD_SIZE``."""
    rank: int | None
    """Global rank of this process; default from ``torch.distributed`` or ``RANK``."""
    num_workers: int | None
    """DataLoader worker processes; ``None`` picks CPUs per rank, capped by this rank's
    chunk count and 8; 0 reads in the main process. Default: ``None`` for
    ``create_dataloader``; 0 for a dataset built on its own (see :func:`build_options`)."""
    equal_batches: str | EqualBatches
    """``"drop"`` (default), ``"pad"`` or ``"off"``: with more than one rank, ``"drop"``
    and ``"pad"`` give every rank exactly the same number of batches every epoch (any
    ``num_workers``), so a DDP loop cannot hang on uneven data. ``"drop"`` leaves out
    fewer than ``num_ranks`` rows per epoch; ``"pad"`` repeats fewer than ``num_ranks``
    rows and adds a bool column ``_is_padding`` to mask them; ``"off"`` reads chunks
    whole, with uneven batch counts. See ``docs/distributed.md``."""
    canonical_ranks: int | None
    """Elastic order: plan every epoch for this many canonical ranks (streams) that the
    ranks share, ``num_ranks`` dividing it; each rank draws every batch evenly from its
    ``canonical_ranks / num_ranks`` streams, so the rows of global batch ``t`` are the same
    for any ``num_ranks`` and ``num_workers`` at the same global batch size (``batch_size *
    num_ranks``), and a resumed job may have another ``num_ranks``. Needs ``equal_batches``
    ``"drop"`` or ``"pad"`` and ``batch_size`` a multiple of ``canonical_ranks / num_ranks``.
    ``None`` (default): plans follow the ranks. See ``docs/distributed.md``."""
    count_rows: bool | None
    """Count rows exactly at construction where the metadata does not hold them (CSV /
    JSONL records, rows a row filter drops), so every chunk carries its exact row count
    (needed by equal batches on several ranks, and by ``len()``). ``None`` (default)
    counts when equal batches need it; ``False`` never counts (then such a setup is a
    clear error)."""
    data_cache: str | os.PathLike[str] | None
    """A directory on this node's local disk (e.g. NVMe) keeping the byte ranges read from
    remote storage (Parquet column chunks and footers, ORC stripes, text byte ranges,
    Iceberg data files), shared by every rank and worker of the node: later epochs read
    them from there. Keyed by each file's URL, size and modification time, so a rewritten
    file is never served old bytes. ``None`` (default): no cache. See
    ``docs/object-storage.md``."""
    data_cache_size: int | str
    """Bytes ``data_cache`` may hold on disk, an int or a string such as ``"200GiB"``
    (default 32 GiB); the least recently used ranges are evicted beyond it."""
    data_cache_prefetch: int
    """Chunks of the next epoch each worker fetches into ``data_cache`` while its fetch
    threads are idle (Parquet), so the next epoch starts from the cache (default 0)."""
    on_bad_data: Literal["raise", "skip", "quarantine"] | BadDataPolicy
    """A unit of data that does not decode (a Parquet row group, an ORC stripe, a CSV or
    JSONL line, a value that does not convert to the declared type): ``"raise"``
    (default) stops with ``BadDataError`` naming the file and the position; ``"skip"``
    drops the unit, counts it per file in ``loader.metrics()`` and logs it at INFO;
    ``"quarantine"`` also writes where it is to ``quarantine.jsonl`` in
    ``quarantine_dir``. With ``equal_batches='pad'`` the unit's rows are replaced by rows
    flagged in ``_is_padding`` (every rank keeps its batch count); see
    ``docs/failure-modes.md``."""
    quarantine_dir: str | os.PathLike[str] | None
    """With ``on_bad_data="quarantine"``: the local directory of the report (default ``None``)."""
    decode_ahead: bool | None
    """Whether a process that reads its own batches (the main process with
    ``num_workers=0``, or each worker) decodes them on a background thread, at most 2
    decoded batches ahead, so that decoding overlaps the conversion and the training
    step. ``None`` (default): when the process has a CPU to spare (the main process
    with 2+ CPUs per rank; workers fewer than the rank's CPUs). Batches, their order
    and the resume state are the same either way."""


class FileReadOptions(ReadOptions, total=False):
    """Options of :class:`~torch_dataloader_utils.StructuredDataset` (files)."""

    storage_options: Mapping[str, Any] | None
    """Filesystem options (credentials, endpoint), used for listing, footers and reading."""
    filesystem: Any
    """A filesystem object used for every request (listing, footers, file checks, reads,
    the ``metadata_cache``): an fsspec ``AbstractFileSystem`` (``s3fs.S3FileSystem(...)``,
    ``gcsfs``, ``adlfs``, ``memory``...) or a ``pyarrow.fs.FileSystem`` instance. The
    library then builds no filesystem of its own (``storage_options`` must be left out);
    ``path`` is on it, with its scheme or none. DataLoader workers rebuild it from its
    pickle. Bytes take pyarrow's native client only where it provably reaches the same
    storage with the same credentials, else the object itself (logged at INFO; see
    docs/object-storage.md). Default ``None``."""
    partitioning: str | None
    """``"hive"`` reads ``key=value`` directories as typed columns."""
    schema: pa.Schema | None
    """CSV / JSONL: column types for every file; by default inferred per file and unified."""
    quoted_newlines: bool
    """CSV: quoted fields may hold newlines; such files are read whole (one chunk each).
    Without it, a record found spanning lines raises ``RecordBoundaryError``."""
    count_cache_dir: str | os.PathLike[str] | None
    """Also keep text counts in this directory across processes and runs."""
    metadata_cache: str | os.PathLike[str] | None
    """Parquet: a file (local path or URL such as ``"s3://bucket/cache/train.arrow"``)
    keeping the files' metadata (rows, row groups) across runs, so a restarted job reads
    no footers. Valid while the listing (paths, sizes, modification times, ETags)
    matches it; otherwise it is ignored with a warning and rewritten. Not used for a
    directory read from its reshard manifest (``use_manifest``), which needs neither
    listing nor footers. Default ``None``."""
    metadata_cache_check: Literal["listing", "on_open"]
    """How a warm ``metadata_cache`` is validated. ``"listing"`` (default): rank 0 lists
    the files and compares the listing with the cache (a file added, removed or changed
    makes it stale). ``"on_open"``: no listing, for datasets that do not change between
    runs (a start costs one read of the cache): the files are the cached ones, and each
    is checked when it is opened (its size and modification time), so a file rewritten
    or deleted since stops the read with ``FileChangedError`` naming it; a file added
    since is not read. A cache that cannot be used this way (missing, stale, written for
    another path or by an older version) falls back to ``"listing"``."""
    use_manifest: bool | None
    """Parquet: plan a directory written by ``reshard`` from its ``_manifest.json`` (one
    request: no listing, no footer reads). ``None`` (default) uses the manifest when
    ``path`` is a directory holding one, ``True`` requires it, ``False`` lists the files."""
    read_ahead_bytes: int | str | None
    """Remote storage only: memory bound of the bytes of upcoming chunks fetched while one
    is decoded (default ``"256MiB"`` per worker; ``0`` disables read-ahead)."""
    retries: int
    """Remote storage only: retries of a request that failed with a transient error
    (HTTP 5xx, connection reset, timeout); ``0`` disables them (default 4)."""
    retry_backoff: float
    """Seconds before the first retry, doubled after each (max 10 s; default 0.2)."""
    request_timeout: float
    """Remote storage only: seconds one request (a listing, a footer, a byte range) may
    take in all, retries included (default 30). Each attempt's connect and read timeouts
    are ``request_timeout / (retries + 1)``, so an endpoint that accepts connections and
    never answers fails within about this long, with an error naming it."""


class IcebergReadOptions(ReadOptions, total=False):
    """Options of :class:`~torch_dataloader_utils.IcebergDataset` (beside ``table``)."""

    catalog_config: Mapping[str, Any] | None
    """Properties for ``pyiceberg.catalog.load_catalog`` (``type``, ``uri``, ``warehouse``,
    ``s3.endpoint``, ...); they also configure the storage every worker reads from."""
    snapshot_id: int | None
    """Read this snapshot (time travel)."""
    as_of: datetime | int | None
    """Read the snapshot current at this time: an aware ``datetime`` or ms since the epoch."""
    scan_filter: Any
    """A pyiceberg ``BooleanExpression`` used for pruning only."""
    since_snapshot_id: int | None
    """An incremental epoch: read only the rows the snapshot read (``snapshot_id``, ``as_of``
    or the current one) has and this older snapshot, one of its ancestors, did not. Rows
    appended since are new; rows of files rewritten since (overwrite, compaction) are new
    only when no row of the files those commits removed has the same content
    (docs/iceberg.md, "Incremental epochs")."""
    continue_from: Mapping[str, Any] | None
    """A resume state saved on an older snapshot of the table (``loader.state_dict()``):
    the epoch it interrupted goes on over the snapshot read, with its unread rows less those
    deleted since, and the rows added since. The explicit opt-in for a state whose snapshot
    differs; ``load_state_dict`` refuses such a state."""
    storage_options: Mapping[str, Any] | None
    """The file datasets' filesystem options, translated into the catalog's FileIO
    properties (``key`` -> ``s3.access-key-id``, ``secret``, ``token``, ``endpoint_url``
    -> ``s3.endpoint``, ``region_name``; dotted pyiceberg keys pass unchanged) and merged
    into ``catalog_config``; a key set in both to different values is an error."""


class LoaderOptions(TypedDict, total=False):
    """Options passed to ``torch.utils.data.DataLoader``."""

    pin_memory: bool
    """Batches in page-locked memory, for asynchronous copies to a GPU. With workers and
    CUDA, the workers' shared-memory segments are page-locked once and batches are built
    over them (no copy, no pin thread); otherwise torch's DataLoader pins them (a copy)."""
    persistent_workers: bool
    """DataLoader passthrough; ``set_epoch`` still reaches them."""
    prefetch_factor: int | None
    """DataLoader passthrough (needs ``num_workers >= 1``)."""
    timeout: float
    """DataLoader passthrough."""
    multiprocessing_context: Any
    """DataLoader passthrough (``"fork"``, ``"spawn"``...)."""
    device: str | torch.device | None
    """Hand batches over on this device: ``"cuda"`` (the current GPU), ``"cuda:N"``, a
    ``torch.device``, ``"auto"`` (the GPU of this process's ``LOCAL_RANK``, the CPU
    without CUDA) or ``"cpu"`` (batches stay where they are). The loader copies each
    batch (with workers, each group of batches, in one transfer) to the GPU on a CUDA
    stream of its own while the training step runs, and hands it over safe to use on
    the current stream. Strings stay on the host. With CUDA and workers it page-locks
    the workers' shared memory, as ``pin_memory=True`` does. ``None`` (default): no
    device stage."""
    ledger: str | os.PathLike[str] | None
    """The training ledger: a local or shared directory (e.g. next to the checkpoints)
    where every rank appends one small record when a pass starts, and nothing per step,
    so that ``torch-dataloader-utils replay DIR --step N`` (or ``Ledger(DIR)``) can say
    which rows any step saw and read its batch again, and ``torch-dataloader-utils
    ledger DIR --where "id = 123"`` which steps saw a row. A path holding ``{rank}`` gives
    every rank its own. ``None`` (default): no ledger. See ``docs/lineage.md``."""


class FileLoaderOptions(FileReadOptions, LoaderOptions, total=False):
    """Keywords of :func:`~torch_dataloader_utils.create_dataloader` (files)."""


class IcebergLoaderOptions(IcebergReadOptions, LoaderOptions, total=False):
    """Keywords of :meth:`~torch_dataloader_utils.IcebergDataset.create_dataloader`."""


class MixedLoaderOptions(FileReadOptions, LoaderOptions, total=False):
    """Keywords of :func:`~torch_dataloader_utils.create_mixed_dataloader`.

    Batching, shuffling, output, ranks and workers are the mix's; a read option
    (``columns``, ``split_bytes``, ``storage_options``, ...) is the default of every
    source, which its own mapping may override.
    """

    on_exhausted: str | OnExhausted
    """Which source's epoch ends an epoch of the mix (its anchor): ``"cycle"`` (default),
    the source that takes longest at its weight; ``"stop"``, the one that takes shortest.
    Every epoch of the mix reads its anchor once (so all have the same length); a source
    that runs out before it starts its next epoch, and every source goes on where it
    stopped in the next epoch of the mix, so each is read exactly once per its own epoch."""
    source_column: str | None
    """Add an int32 column of this name holding each row's source index (its position
    in ``sources``); default: none."""
    allow_recipe_change: bool
    """``load_state_dict`` takes a state saved with other weights (or schedule), or with
    sources added or removed, matched by name: every source that goes on continues where
    it stood in its own epoch, an added one starts its first epoch, a removed one's
    position is kept in the state (adding it back resumes it). Default ``False``: such a
    state raises ``StateMismatchError`` naming this option."""


MIX_ONLY = frozenset(
    {
        "batch_size",
        "drop_last",
        "shuffle",
        "shuffle_seed",
        "equal_batches",
        "num_ranks",
        "rank",
        "num_workers",
        "output_format",
        "null_fill",
        "collate_fn",
        "ragged",
        "pad_value",
        "max_length",
        "strings",
        "pack_features",
        "pack_sequences",
        "show_progress",
        "progress_interval_sec",
        "progress_all_ranks",
        "decode_ahead",
        "on_exhausted",
        "source_column",
        "allow_recipe_change",
    }
)
"""Options of the mix as a whole: they cannot differ between sources."""


@dataclasses.dataclass(frozen=True)
class Options:
    """Every option except the source's, checked and coerced: what the edge hands inward.

    Attributes:
        split: How files are cut (as given).
        strategy: The split strategy built from ``split`` for the source's format.
        shuffle: Chunk and row shuffling.
        batching: Batch size, ``drop_last``, equal batches.
        output: Output format, nulls, ``collate_fn``.
        counting: Row counting at construction.
        fetch: Remote reads: read-ahead, retries.
        loader: DataLoader options (``num_workers=None``: automatic).
        progress: Progress bars.
        world: The ranks to plan for (resolved from the arguments or the runtime).
        cache: The node-local cache of remote bytes (``data_cache``).
        bad_data: What readers do with data that does not decode (``on_bad_data``).
    """

    split: SplitConfig
    strategy: Splitter | RankAwareStrategy
    shuffle: ShuffleConfig
    batching: BatchConfig
    output: OutputConfig
    counting: CountConfig
    fetch: FetchConfig
    loader: LoaderConfig
    progress: ProgressConfig
    world: World
    cache: CacheConfig = dataclasses.field(default_factory=CacheConfig)
    bad_data: BadDataConfig = dataclasses.field(default_factory=BadDataConfig)

    def __post_init__(self) -> None:
        if self.canonical is not None:
            Canonical(self.canonical, self.world.num_ranks, self.batching.batch_size)  # raises when unfit

    @property
    def canonical(self) -> int | None:
        """The canonical ranks of elastic order, or ``None``."""
        return self.batching.canonical_ranks

    @property
    def equalized(self) -> bool:
        """Whether ranks (canonical ones in elastic order) are given equal row counts."""
        return self.batching.equal_batches.acts_on(self.canonical or self.world.num_ranks)

    @property
    def counts_rows(self) -> bool:
        """Whether rows the metadata does not count are counted at construction."""
        return self.counting.counts(self.equalized)


def _fspath(value: object) -> object:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


# Options whose public type is wider than their config field's (strings for enums and sizes).
_COERCE: dict[str, Callable[[Any], object]] = {
    "equal_batches": coerce_equal_batches,
    "output_format": lambda v: coerce_enum(v, OutputFormat, "output_format"),
    "ragged": lambda v: None if v is None else coerce_enum(v, RaggedLayout, "ragged"),
    "strings": lambda v: None if v is None else coerce_enum(v, StringLayout, "strings"),
    "pack_features": coerce_packs,
    "pack_sequences": coerce_sequence_pack,
    "split_bytes": lambda v: parse_size(v, "split_bytes"),
    "read_ahead_bytes": parse_read_ahead,
    "count_cache_dir": _fspath,
    "metadata_cache": _fspath,
    "data_cache": _fspath,
    "ledger": _fspath,
    "data_cache_size": lambda v: parse_size(v, "data_cache_size"),
    "quarantine_dir": _fspath,
    "on_bad_data": coerce_bad_data,
    "device": resolve_device,
}

C = TypeVar("C")


def _pick(config: type[C], values: Mapping[str, object], **fixed: object) -> C:
    """``config`` built from the keys of ``values`` that are its fields."""
    names = {f.name for f in dataclasses.fields(config)}  # type: ignore[arg-type]
    return config(**{k: v for k, v in values.items() if k in names}, **fixed)


def check_keywords(given: Mapping[str, object], allowed: type, caller: str) -> None:
    """Reject any key of ``given`` that is not a key of the TypedDict ``allowed``.

    Raises:
        UnknownOptionError: naming the keyword, its value and the closest valid one.
    """
    keys: frozenset[str] = allowed.__required_keys__ | allowed.__optional_keys__  # type: ignore[attr-defined]
    for name in given:
        if name in keys:
            continue
        close = difflib.get_close_matches(name, sorted(keys), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UnknownOptionError(
            f"{caller}() got an unknown option {name}={given[name]!r}; {hint}"
            f"the options are listed in {allowed.__name__} (docs/user-guide.md)"
        )


def build_options(
    given: Mapping[str, object], allowed: type, caller: str, format: FileFormat, *, standalone: bool = False
) -> Options:
    """Check and coerce the flat keywords ``given`` (keys of the TypedDict ``allowed``) once.

    Args:
        given: The keywords as the user passed them (unset ones are absent).
        allowed: The TypedDict of the calling function's keywords.
        caller: The public function's name, for error messages.
        format: The source's file format (it decides the default split strategy).
        standalone: A dataset built without a loader: it is read by the process that
            iterates it, so ``num_workers`` defaults to 0 rather than automatic.

    Raises:
        UnknownOptionError: a keyword is not an option of ``caller``.
        ConfigError: a value is invalid (named, echoed, with the fix).
    """
    check_keywords(given, allowed, caller)
    values = {k: _COERCE[k](v) if k in _COERCE else v for k, v in given.items()}
    if standalone:
        values.setdefault("num_workers", 0)
    batching = _pick(BatchConfig, values)
    split = _pick(SplitConfig, values)
    world = env.resolve_world(values.get("num_ranks"), values.get("rank"))  # type: ignore[arg-type]
    output = _pick(OutputConfig, values)
    loader = _pick(LoaderConfig, values)
    _check_device(loader, output, given)
    return Options(
        split=split,
        strategy=build_strategy(split, format, shown=given),
        shuffle=_pick(ShuffleConfig, values),
        batching=batching,
        output=output,
        counting=_pick(CountConfig, values),
        fetch=_pick(FetchConfig, values),
        loader=loader,
        progress=_pick(ProgressConfig, values),
        world=world,
        cache=_pick(CacheConfig, values),
        bad_data=_pick(BadDataConfig, values),
    )


def _check_device(loader: LoaderConfig, output: OutputConfig, given: Mapping[str, object]) -> None:
    """``device`` hands over torch tensors: other output formats have none.

    Any ``device`` (``"cpu"`` and ``"auto"`` too) with another output format is refused,
    so the same options behave the same on a machine with a GPU and one without.

    Raises:
        IncompatibleOptionsError: ``device`` is set and ``output_format`` is not ``'torch'``.
    """
    if loader.device is None or output.output_format is OutputFormat.TORCH:
        return
    raise IncompatibleOptionsError(
        f"device={given.get('device')!r} hands over torch tensors on a device, but "
        f"output_format={output.output_format.value!r} gives no tensors; use output_format='torch' "
        "or leave device unset"
    )


def file_source(format: object, given: Mapping[str, object]) -> FileSourceConfig:
    """The source options of a file dataset, from the flat keywords.

    Raises:
        OptionTypeError: ``filters`` is not an expression (before any file is listed).
    """
    check_filter_type(given.get("filters"))
    names = {f.name for f in dataclasses.fields(FileSourceConfig)}
    values = {k: _COERCE[k](v) if k in _COERCE and k in names else v for k, v in given.items()}
    return _pick(FileSourceConfig, values, format=coerce_format(format))


def iceberg_source(table: str, given: Mapping[str, object]) -> IcebergSourceConfig:
    """The source options of an Iceberg dataset, from the flat keywords."""
    if not isinstance(table, str) or not table.strip():
        raise ConfigError(f"table={table!r} must be a table name such as 'db.events'")
    check_filter_type(given.get("filters"))
    props = catalog_properties(given.get("catalog_config"), given.get("storage_options"))  # type: ignore[arg-type]
    return _pick(IcebergSourceConfig, {**given, "catalog_config": props}, table=table)


_DEFAULT_STRATEGY = {
    FileFormat.PARQUET: SplitKind.ROW_GROUP,
    FileFormat.ORC: SplitKind.ROW_GROUP,
    FileFormat.CSV: SplitKind.BYTE_RANGE,
    FileFormat.JSONL: SplitKind.BYTE_RANGE,
}


def build_strategy(
    split: SplitConfig, format: FileFormat, shown: Mapping[str, object] | None = None
) -> Splitter | RankAwareStrategy:
    """The split strategy for the user's options (a built-in name or a custom object).

    ``shown`` holds the values as the user wrote them (``"1MiB"``), echoed in errors.

    Raises:
        ConfigError: an unknown strategy name, or an object without ``generate``.
        IncompatibleOptionsError: the strategy does not fit the format or the sizes.
    """
    size, rows, given = split.split_bytes, split.split_rows, split.split_strategy
    shown_bytes = (shown or {}).get("split_bytes", size)
    if given is None or isinstance(given, (str, SplitKind)):
        kind = _DEFAULT_STRATEGY[format] if given is None else coerce_enum(given, SplitKind, "split_strategy")
        if kind is SplitKind.FILE:
            if size is not None or rows is not None:
                raise IncompatibleOptionsError(
                    "split_strategy='file' reads every file as one chunk; drop split_bytes / "
                    f"split_rows (got split_bytes={shown_bytes!r}, split_rows={rows!r}) "
                    "or use split_strategy='row_group'"
                )
            return FileSplit()
        if kind is SplitKind.ROW_GROUP:
            if format not in (FileFormat.PARQUET, FileFormat.ORC):
                raise IncompatibleOptionsError(
                    f"split_strategy='row_group' needs format='parquet' or 'orc', got "
                    f"format={format.value!r}; use 'byte_range' or 'file'"
                )
            if size is None and rows is None:
                size = DEFAULT_SPLIT_BYTES
            return RowGroupSplit(split_bytes=size, split_rows=rows)
        if kind is SplitKind.BYTE_RANGE:
            if format not in (FileFormat.CSV, FileFormat.JSONL):
                raise IncompatibleOptionsError(
                    f"split_strategy='byte_range' needs format='csv' or 'jsonl', got "
                    f"format={format.value!r}; use 'row_group' or 'file'"
                )
            if rows is not None:
                raise IncompatibleOptionsError(
                    f"split_rows={rows!r} cannot size byte ranges (a row's position in a "
                    "text file is unknown before parsing); pass split_bytes instead"
                )
            return ByteRangeSplit(split_bytes=size if size is not None else DEFAULT_SPLIT_BYTES)
        raise ConfigError(f"split_strategy={kind.value!r} is not implemented yet for format={format.value!r}")
    if size is not None or rows is not None:
        raise IncompatibleOptionsError(
            "split_bytes / split_rows configure the built-in strategies; a custom "
            f"split_strategy ({type(given).__name__}) sizes its own chunks"
        )
    return resolve_strategy(given)


# -- reshard ---------------------------------------------------------------------------


class ReshardKeywords(TypedDict, total=False):
    """Keywords of :func:`~torch_dataloader_utils.reshard` (beside ``src`` and ``dst``)."""

    format: str
    """The source's format: ``"parquet"`` (default), ``"orc"``, ``"csv"``, ``"jsonl"``, or
    ``"iceberg"`` (``src`` is then a table name)."""
    columns: Sequence[str] | None
    """Columns to keep (default: all)."""
    filters: Any
    """A ``pyarrow.compute.Expression``: only rows passing it are written."""
    storage_options: Mapping[str, Any] | None
    """The source's filesystem options (credentials, endpoint); also used for ``dst`` when
    it is on the same kind of filesystem."""
    partitioning: str | None
    """``"hive"`` reads the source's ``key=value`` directories as columns."""
    schema: pa.Schema | None
    """CSV / JSONL: the column types."""
    catalog_config: Mapping[str, Any] | None
    """Iceberg: ``pyiceberg.catalog.load_catalog`` properties."""
    snapshot_id: int | None
    """Iceberg: the snapshot to read (default: the current one)."""
    dst_storage_options: Mapping[str, Any] | None
    """The output's filesystem options, when they differ from the source's."""
    target_file_size: int | str
    """Bytes of every shard but the last (an int, or ``"256MiB"``, the default). Shards come
    within about 10% of it when rows have similar sizes; with ``group_by`` a shard holds
    whole groups, with ``partition_by`` each partition has its own last shard."""
    row_group_bytes: int | str | None
    """Bytes per row group (default 32 MiB), e.g. ``"16MiB"``."""
    row_group_rows: int | None
    """Rows per row group, instead of ``row_group_bytes``."""
    compression: str
    """``"zstd"`` (default), ``"snappy"``, ``"lz4"``, ``"gzip"``, ``"brotli"`` or ``"none"``."""
    sort_by: str | Sequence[str] | None
    """Column(s) each shard is sorted by (the shard is sorted in memory)."""
    group_by: str | Sequence[str] | None
    """Column(s) whose equal values stay in one shard, in consecutive rows."""
    partition_by: str | Sequence[str] | None
    """Column(s) written as ``key=value`` directories (not in the files); integers,
    strings, booleans or dates."""
    workers: int | None
    """Worker processes per rank (default 1; ``None``: the CPUs of this rank)."""
    verify: bool
    """After writing, read source and output again and compare row counts, an
    order-independent checksum of every column and one of whole rows."""
    rank_timeout: float
    """Seconds a rank waits for the others at a barrier, when reshard starts the process
    group itself (torchrun without one; default 24 hours)."""
    filesystem: Any
    """The source's filesystem object (an fsspec or pyarrow filesystem instance, as the
    loader's ``filesystem=``) instead of ``storage_options``; also used for ``dst`` when
    ``dst`` has no scheme or the filesystem's."""
    dst_filesystem: Any
    """The output's filesystem object, when it differs from the source's."""


@dataclasses.dataclass(frozen=True)
class ReshardRequest:
    """A reshard job's keywords, checked and coerced: what the edge hands to the job.

    Attributes:
        source: What is read.
        job: How the output is written.
        dst_fs: The output's filesystem.
        dst_root: The output directory on it (no trailing slash).
    """

    source: ReshardSourceConfig
    job: ReshardConfig
    dst_fs: FileSystemSpec
    dst_root: str


def _reshard_size(value: object, param: str) -> int:
    size = parse_size(value, param)
    if size is None:
        raise ConfigError(f"{param}=None is not a size; pass bytes as an int or a string like '256MiB'")
    return size


def _reshard_codec(value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(
            f"compression={value!r} must be one of 'none', 'snappy', 'gzip', 'brotli', 'lz4', 'zstd'"
        )
    name = value.strip().lower()
    return "none" if name == "uncompressed" else name


def _column_names(value: object, param: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        if len(set(value)) != len(value):
            raise ConfigError(f"{param}={list(value)!r} names a column twice")
        return tuple(value)
    raise ConfigError(f"{param}={value!r} must be a column name or a list of column names")


def _protocol(path: str) -> str:
    return path.split("://", 1)[0].lower() if "://" in path else "file"


def _reshard_source(src: object, given: Mapping[str, Any]) -> ReshardSourceConfig:
    columns = given.get("columns")
    if isinstance(columns, str):
        raise ConfigError(f"columns={columns!r} must be a list of column names, e.g. ['{columns}']")
    if isinstance(src, (list, tuple)):
        value: str | tuple[str, ...] = tuple(src)
    elif isinstance(src, str):
        value = src
    else:
        raise ConfigError(f"src={src!r} must be a path, a URL, a list of them, or an Iceberg table name")
    fmt = given.get("format", "parquet")
    check_filter_type(given.get("filters"))
    return ReshardSourceConfig(
        src=value,
        format=fmt.strip().lower() if isinstance(fmt, str) else fmt,
        columns=None if columns is None else tuple(columns),
        filters=given.get("filters"),
        storage_options=given.get("storage_options"),
        partitioning=given.get("partitioning"),
        schema=given.get("schema"),
        catalog_config=given.get("catalog_config"),
        snapshot_id=given.get("snapshot_id"),
        filesystem=given.get("filesystem"),
    )


def _reshard_job(given: Mapping[str, Any]) -> ReshardConfig:
    rows = given.get("row_group_rows")
    group_bytes = given.get("row_group_bytes")
    if rows is None or group_bytes is not None:
        group_bytes = _reshard_size(
            group_bytes if group_bytes is not None else DEFAULT_ROW_GROUP_BYTES, "row_group_bytes"
        )
    workers = given.get("workers", 1)
    return ReshardConfig(
        target_file_size=_reshard_size(
            given.get("target_file_size", DEFAULT_TARGET_FILE_SIZE), "target_file_size"
        ),
        row_group_bytes=group_bytes,
        row_group_rows=rows,
        compression=_reshard_codec(given.get("compression", DEFAULT_COMPRESSION)),
        sort_by=_column_names(given.get("sort_by"), "sort_by"),
        group_by=_column_names(given.get("group_by"), "group_by"),
        partition_by=_column_names(given.get("partition_by"), "partition_by"),
        workers=env.cpus_per_rank() if workers is None else workers,
        verify=given.get("verify", False),
        rank_timeout=given.get("rank_timeout", DEFAULT_RANK_TIMEOUT),
    )


def reshard_request(src: object, dst: object, given: Mapping[str, Any]) -> ReshardRequest:
    """Check and coerce :func:`~torch_dataloader_utils.reshard`'s arguments once.

    ``dst_storage_options`` defaults to ``storage_options`` when the output is on the
    same kind of filesystem as the source (not for Iceberg, whose storage is the
    catalog's).

    Raises:
        UnknownOptionError: a keyword is not an option of ``reshard``.
        ConfigError: a value is invalid (named, echoed, with the fix).
        IncompatibleOptionsError: options that do not go together.
    """
    check_keywords(given, ReshardKeywords, "reshard")
    job = _reshard_job(given)
    source = _reshard_source(src, given)
    if not isinstance(dst, str) or not dst:
        raise ConfigError(f"dst={dst!r} must be a directory path or URL")
    dst_options = given.get("dst_storage_options")
    dst_given = _destination_filesystem(dst, source.filesystem, given.get("dst_filesystem"), dst_options)
    if dst_options is None and _protocol(dst) == _protocol(source.first_path) and source.format != "iceberg":
        dst_options = source.storage_options
    fs, root = resolve(dst, dst_options, filesystem=dst_given)
    root = root.rstrip("/") or "/"
    _check_apart(source, job, fs, root)
    return ReshardRequest(source=source, job=job, dst_fs=fs, dst_root=root)


def _destination_filesystem(
    dst: str, filesystem: Any, dst_filesystem: Any, dst_storage_options: Mapping[str, Any] | None
) -> UserFileSystem | None:
    """The user's filesystem object for ``dst``: ``dst_filesystem``, else ``filesystem`` on its scheme."""
    if dst_filesystem is not None:
        if dst_storage_options:
            raise IncompatibleOptionsError(
                "dst_filesystem and dst_storage_options were both given; configure the filesystem "
                "object instead, or drop dst_filesystem"
            )
        return UserFileSystem(dst_filesystem)
    if filesystem is None or dst_storage_options is not None:
        return None
    wrapped = UserFileSystem(filesystem)
    scheme, sep, _ = dst.partition("://")
    return wrapped if not sep or scheme in wrapped.protocols else None


def _directory_of(path: str) -> str:
    """The directory a source path lists: itself, or for a glob the part before its first wildcard."""
    cut = min((path.find(ch) for ch in "*?[" if ch in path), default=-1)
    if cut < 0:
        return path.rstrip("/") or "/"
    return path[:cut].rsplit("/", 1)[0] or "/"


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _glob_matches(pattern: list[str], parts: list[str]) -> bool:
    """Whether ``/``-separated ``parts`` match ``pattern`` (``*`` within a part, ``**`` across)."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_glob_matches(pattern[1:], parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _glob_matches(pattern[1:], parts[1:])


def _lists(src: str, shard: str) -> bool:
    """Whether listing ``src`` (a directory, recursively, or a glob) would find ``shard``."""
    if not any(ch in src for ch in "*?["):
        return _inside(shard, src)
    return _glob_matches(src.split("/"), shard.split("/"))


def _check_apart(
    source: ReshardSourceConfig, job: ReshardConfig, dst_fs: FileSystemSpec, dst_root: str
) -> None:
    """Refuse a destination whose shards the source would list, or a source inside the destination.

    The source would then read the shards too (every row twice, on a rerun or for the
    loader), or the shards would be written among the source's files.

    Raises:
        DestinationConflictError: naming both paths and the fix.
    """
    if source.format == "iceberg":
        return
    paths = [source.src] if isinstance(source.src, str) else list(source.src)
    dst = os.path.realpath(dst_root) if dst_fs.is_local else dst_root
    # A shard as it will be named: dst/[key=value/...]part-00000.parquet.
    shard = "/".join([dst, *(f"{name}=v" for name in job.partition_by), "part-00000.parquet"])
    for given in paths:
        user = None if source.filesystem is None else UserFileSystem(source.filesystem)
        fs, stripped = resolve(given, source.storage_options, filesystem=user)
        if fs.protocol != dst_fs.protocol:
            continue
        src = os.path.realpath(stripped) if fs.is_local and stripped == _directory_of(stripped) else stripped
        if _lists(src, shard):
            where = "inside the source"
        elif _inside(_directory_of(src), dst):
            where = "a directory that holds the source"
        else:
            continue
        raise DestinationConflictError(
            f"dst={dst_fs.display(dst_root)!r} is {where} (src={given!r}): the source would then "
            "list the shards too, and its rows would be read twice; choose a dst outside the "
            "source (e.g. a sibling directory)"
        )
