"""Split strategies: how files are cut into chunks.

Built-in strategies return every chunk of the dataset; the planner shuffles them and
deals them out to ranks and workers. Users can plug in their own strategy, an object
with a ``generate`` method (no base class needed), in one of two signatures:

* current: ``generate(files, num_workers, epoch, *, num_ranks, rank)`` returns the
  chunks of *this* rank. The strategy shards; the planner checks, for every rank, that
  no two ranks share a row.
* older: ``generate(files, num_workers, epoch)`` returns the chunks of the whole
  dataset. The planner gives every rank its share ``[rank::num_ranks]`` itself (and
  says so once in a warning), so an older strategy can never make every rank read
  the whole dataset.

The signature is detected with :func:`inspect.signature`.

Strategies written for torch-dataloader-utils 0.2.0 run unchanged: what they return
besides ``Chunk`` objects (``Shard`` and ``Split``) is turned into chunks by the compat
layer (:data:`ITEM_ADAPTERS`), then checked like any other chunk.
"""

from __future__ import annotations

import inspect
import itertools
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch_dataloader_utils.errors import ConfigError, OverlappingChunksError, PlanError, user_stacklevel
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, FileInfo, RowGroup

__all__ = [
    "ITEM_ADAPTERS",
    "ByteRangeSplit",
    "FileSplit",
    "LegacySplitStrategy",
    "RankAwareStrategy",
    "RowGroupSplit",
    "SplitStrategy",
    "Splitter",
    "check_no_overlap",
    "normalize_chunks",
    "resolve_strategy",
]


@runtime_checkable
class SplitStrategy(Protocol):
    """A custom split strategy (current signature): returns this rank's chunks."""

    def generate(
        self,
        files: Sequence[FileInfo],
        num_workers: int,
        epoch: int,
        *,
        num_ranks: int,
        rank: int,
    ) -> Sequence[Chunk]:
        """Cut ``files`` into chunks and return the ones rank ``rank`` should read."""
        ...


@runtime_checkable
class LegacySplitStrategy(Protocol):
    """A custom split strategy in the older signature: returns every chunk."""

    def generate(self, files: Sequence[FileInfo], num_workers: int, epoch: int) -> Sequence[Chunk]:
        """Cut ``files`` into chunks covering the whole dataset."""
        ...


class Splitter(Protocol):
    """What the planner calls for strategies that return every chunk of the dataset."""

    @property
    def name(self) -> str:
        """Name used in messages."""
        ...

    def split(self, files: Sequence[FileInfo], *, num_workers: int, epoch: int) -> list[Chunk]:
        """Every chunk of the dataset, in a deterministic order."""
        ...


@dataclass(frozen=True)
class FileSplit:
    """One chunk per file."""

    name: str = "file"

    def split(self, files: Sequence[FileInfo], *, num_workers: int = 1, epoch: int = 0) -> list[Chunk]:
        """One chunk per file: its row range when rows are known, else its byte range."""
        chunks = []
        for f in files:
            if f.num_rows is not None:
                if f.live_rows == 0:
                    continue
                chunks.append(Chunk.rows(f))
            elif f.size > 0 and (f.records is None or f.records.total > 0):
                chunks.append(Chunk.bytes(f))
        return chunks


@dataclass(frozen=True)
class ByteRangeSplit:
    """Line-delimited text (CSV, JSONL) cut into byte ranges of about ``split_bytes``.

    A chunk ``[start, stop)`` owns exactly the records whose first byte lies inside it:
    the reader skips the partial line at ``start`` and reads past ``stop`` to finish
    its last record, so consecutive ranges neither lose nor repeat a record.

    Files marked unsplittable (compressed, or a CSV declared to hold newlines inside
    quoted fields) are one chunk each. When discovery counted the records
    (``FileInfo.records``), range ends are rounded to its blocks, so every chunk
    carries its exact record count, and ranges holding no record start are dropped.
    Files with row counts but no byte layout (columnar formats) are one row chunk each.
    """

    split_bytes: int
    name: str = "byte_range"

    def __post_init__(self) -> None:
        size = self.split_bytes
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"split_bytes={self.split_bytes!r} must be an int >= 1 for byte_range")

    def split(self, files: Sequence[FileInfo], *, num_workers: int = 1, epoch: int = 0) -> list[Chunk]:
        """Byte-range chunks, file by file, in file order."""
        chunks: list[Chunk] = []
        whole = FileSplit()
        for f in files:
            if f.num_rows is not None or not f.splittable or f.size <= self.split_bytes:
                chunks.extend(whole.split([f]))
                continue
            step = self.split_bytes
            if f.records is not None:
                block = f.records.block_bytes
                step = max(1, step // block) * block
            for start in range(0, f.size, step):
                chunk = Chunk.bytes(f, start, min(f.size, start + step))
                if chunk.num_rows != 0:
                    chunks.append(chunk)
        return chunks


@dataclass(frozen=True)
class RowGroupSplit:
    """Consecutive row groups (Parquet) or stripes (ORC) packed up to a target size.

    A chunk closes before the group that would take it past ``split_bytes`` (bytes on
    disk) or ``split_rows``; a single group larger than the target is a chunk of its
    own, since a group cannot be decoded in part. With neither target every group is a
    chunk. Files without row-group metadata fall back to one chunk per file.
    """

    split_bytes: int | None = None
    split_rows: int | None = None
    name: str = "row_group"

    def split(self, files: Sequence[FileInfo], *, num_workers: int = 1, epoch: int = 0) -> list[Chunk]:
        """Chunks of packed row groups, file by file, in file order."""
        chunks: list[Chunk] = []
        whole = FileSplit()
        for f in files:
            if f.row_groups is None:
                chunks.extend(whole.split([f]))
                continue
            for run in self._runs(f.row_groups):
                chunks.append(
                    Chunk(
                        f.path,
                        run[0].first_row,
                        run[-1].stop_row,
                        ChunkUnit.ROWS,
                        sum(g.num_rows for g in run),
                        sum(g.num_bytes for g in run),
                    )
                )
        return chunks

    def _runs(self, groups: Iterable[RowGroup]) -> Iterable[list[RowGroup]]:
        run: list[RowGroup] = []
        run_bytes = run_rows = 0
        for g in groups:
            if g.num_rows == 0:
                continue
            full = (self.split_bytes is not None and run_bytes + g.num_bytes > self.split_bytes) or (
                self.split_rows is not None and run_rows + g.num_rows > self.split_rows
            )
            if run and (full or (self.split_bytes is None and self.split_rows is None)):
                yield run
                run, run_bytes, run_rows = [], 0, 0
            run.append(g)
            run_bytes += g.num_bytes
            run_rows += g.num_rows
        if run:
            yield run


@dataclass(frozen=True)
class LegacyAdapter:
    """Wraps an older-signature strategy so the planner can shard its chunks."""

    strategy: LegacySplitStrategy
    name: str = "legacy"

    def split(self, files: Sequence[FileInfo], *, num_workers: int, epoch: int) -> list[Chunk]:
        """The strategy's chunks for the whole dataset, flattened."""
        return _flatten(self.strategy.generate(files, num_workers, epoch), self.name, _by_path(files))


@dataclass(frozen=True)
class RankAwareStrategy:
    """Wraps a current-signature strategy: it returns one rank's chunks."""

    strategy: SplitStrategy
    name: str = "custom"

    def split_rank(
        self, files: Sequence[FileInfo], *, num_workers: int, epoch: int, num_ranks: int, rank: int
    ) -> list[Chunk]:
        """The strategy's chunks for ``rank``."""
        out = self.strategy.generate(files, num_workers, epoch, num_ranks=num_ranks, rank=rank)
        return _flatten(out, self.name, _by_path(files))


def _by_path(files: Sequence[FileInfo]) -> dict[str, FileInfo]:
    return {f.path: f for f in files}


ItemAdapter = Callable[[object, Mapping[str, FileInfo], str], "list[Chunk] | None"]

ITEM_ADAPTERS: list[ItemAdapter] = []
"""What turns items a strategy returned besides :class:`Chunk` objects into chunks:
``adapt(item, files_by_path, strategy_name)`` gives the chunks, or ``None`` when the item
is not its kind. The compat layer registers 0.2.0's ``Shard`` and ``Split`` here."""


def _flatten(out: object, name: str, files: Mapping[str, FileInfo]) -> list[Chunk]:
    if not isinstance(out, Iterable):
        raise PlanError(f"split strategy {name!r} must return a sequence of Chunk, got {out!r}")
    chunks: list[Chunk] = []
    for item in out:
        if isinstance(item, Chunk):
            chunks.append(item)
        elif isinstance(item, (list, tuple)):
            # Older strategies sometimes return one list per worker.
            chunks.extend(_flatten(item, name, files))
        else:
            adapted = next(
                (c for adapt in ITEM_ADAPTERS if (c := adapt(item, files, name)) is not None), None
            )
            if adapted is None:
                raise PlanError(
                    f"split strategy {name!r} returned {item!r}; expected Chunk objects "
                    "(build them with Chunk.rows(file, start, stop) or Chunk.bytes(file, start, stop))"
                )
            chunks.extend(adapted)
    return chunks


def resolve_strategy(strategy: object) -> Splitter | RankAwareStrategy:
    """Turn a user's strategy object into what the planner calls.

    Raises:
        ConfigError: ``strategy`` has no ``generate`` method of a known signature.
    """
    if callable(getattr(strategy, "split", None)) and isinstance(getattr(strategy, "name", None), str):
        return strategy  # type: ignore[return-value]  # a built-in Splitter (or a compat strategy)
    generate = getattr(strategy, "generate", None)
    name = type(strategy).__name__
    if not callable(generate):
        raise ConfigError(
            f"split_strategy={strategy!r} is not a known strategy name and has no generate() "
            "method. Pass 'file', 'row_group' or 'byte_range', or an object with "
            "generate(files, num_workers, epoch, *, num_ranks, rank)."
        )
    try:
        sig = inspect.signature(generate)
    except (TypeError, ValueError) as exc:  # builtins without a signature
        raise ConfigError(f"split_strategy {name}.generate has no inspectable signature: {exc}") from exc
    params = sig.parameters
    has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    rank_aware = ("num_ranks" in params and "rank" in params) or has_var_kw
    try:
        if rank_aware:
            sig.bind([], 1, 0, num_ranks=1, rank=0)
        else:
            sig.bind([], 1, 0)
    except TypeError as exc:
        raise ConfigError(
            f"split_strategy {name}.generate{sig} matches neither supported signature: "
            "generate(files, num_workers, epoch, *, num_ranks, rank) (current) or "
            "generate(files, num_workers, epoch) (older)."
        ) from exc
    if rank_aware:
        return RankAwareStrategy(strategy, name=name)  # type: ignore[arg-type]
    warnings.warn(
        f"split_strategy {name} uses the older generate(files, num_workers, epoch) signature: "
        "it returns chunks for the whole dataset, so torch_dataloader_utils gives each rank "
        "the share [rank::num_ranks] itself. Add keyword parameters num_ranks and rank to "
        "generate() to shard yourself.",
        UserWarning,
        stacklevel=user_stacklevel(),
    )
    return LegacyAdapter(strategy, name=name)  # type: ignore[arg-type]


def normalize_chunks(
    chunks: Sequence[Chunk], files_by_path: Mapping[str, FileInfo], strategy_name: str
) -> list[Chunk]:
    """Validate chunks from a strategy and fill in row counts it left out.

    Raises:
        PlanError: a chunk names an unknown file, or its range is empty or out of bounds.
    """
    out = []
    for c in chunks:
        f = files_by_path.get(c.path)
        if f is None:
            raise PlanError(
                f"split strategy {strategy_name!r} returned a chunk of {c.path!r}, "
                "which is not one of the dataset's files"
            )
        bound = f.num_rows if c.unit is ChunkUnit.ROWS else f.size
        if bound is None:
            raise PlanError(
                f"split strategy {strategy_name!r} returned a row-range chunk of {c.path!r}, "
                "whose row count is unknown; use byte ranges (Chunk.bytes) for this format"
            )
        if not 0 <= c.start < c.stop <= bound:
            raise PlanError(
                f"split strategy {strategy_name!r} returned chunk {c.path!r} "
                f"[{c.start}, {c.stop}) {c.unit.value}, outside the file's [0, {bound})"
            )
        if c.unit is ChunkUnit.ROWS:
            rows = f.rows_in(c.start, c.stop)
            if c.num_rows != rows:
                c = Chunk(c.path, c.start, c.stop, c.unit, rows, c.num_bytes or _bytes_of(f, c))
        out.append(c)
    return out


def _bytes_of(f: FileInfo, c: Chunk) -> int:
    if not f.num_rows:
        return 0
    return f.size * (c.stop - c.start) // f.num_rows


def check_no_overlap(chunks: Iterable[Chunk], what: str = "the plan") -> None:
    """Raise if two chunks cover the same rows (or bytes) of a file.

    Padding chunks (deliberate repeats, see ``equal_batches='pad'``) are not checked.

    Raises:
        OverlappingChunksError: naming both chunks.
    """
    ranges: dict[tuple[str, int, int, ChunkUnit], list[Chunk]] = {}
    for c in chunks:
        if not c.padding:
            ranges.setdefault((c.path, c.start, c.stop, c.unit), []).append(c)
    for (path, start, stop, _), same in ranges.items():
        if len(same) == 1:
            continue
        # One byte range shared by record windows (a cut byte range): windows must be disjoint.
        if any(not c.windowed for c in same):
            raise OverlappingChunksError(
                f"{what} reads rows twice: chunk [{start}, {stop}) of {path!r} appears {len(same)} times"
            )
        windows = sorted((c.skip, c.skip + (c.num_rows or 0)) for c in same)
        for (_, a_stop), (b_start, _) in itertools.pairwise(windows):
            if b_start < a_stop:
                raise OverlappingChunksError(
                    f"{what} reads records twice: windows of bytes [{start}, {stop}) of {path!r} overlap"
                )
    ordered = sorted((same[0] for same in ranges.values()), key=lambda c: (c.path, c.start, c.stop))
    for prev, cur in itertools.pairwise(ordered):
        if prev.path != cur.path:
            continue
        if prev.unit is not cur.unit:
            raise OverlappingChunksError(f"{what} mixes row-range and byte-range chunks of {cur.path!r}")
        if cur.start < prev.stop:
            raise OverlappingChunksError(
                f"{what} reads rows twice: chunks [{prev.start}, {prev.stop}) and "
                f"[{cur.start}, {cur.stop}) of {cur.path!r} overlap"
            )
