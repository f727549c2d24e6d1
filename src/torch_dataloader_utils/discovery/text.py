"""CSV and JSONL metadata: compression, the CSV header, one schema, and record counts.

Per file, discovery reads only the head (the CSV header and a sample for type
inference). The schema is inferred once per file from that sample and unified across
the dataset, so every chunk of every file parses to the same types; a user ``schema``
replaces inference. Lines of the sample that do not parse are left out of inference
(they are bad data, for the reader to skip or raise under ``on_bad_data``).

On request (``count_rows=True``) a newline-count pass (numpy, no parsing) finds how
many records start in each fixed block of the file, which gives byte-range chunks
exact record counts. Counts are cached per (path, size, mtime) in
the process, and on disk when a cache directory is given.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson

from torch_dataloader_utils.config import FileFormat
from torch_dataloader_utils.discovery.listing import ListedFile
from torch_dataloader_utils.errors import CorruptFileError, SchemaError, SchemaMismatchError
from torch_dataloader_utils.plan.types import FileInfo, RecordIndex
from torch_dataloader_utils.storage.fs import FileSystemSpec
from torch_dataloader_utils.storage.records import (
    CR,
    LF,
    PIECE_BYTES,
    SAMPLE_BYTES,
    TextFileMeta,
    buffer_source,
    compression_of,
    iter_pieces,
    line_end_of,
    record_starts,
)

__all__ = [
    "COUNT_BLOCK_BYTES",
    "SAMPLE_BYTES",
    "TextDiscovery",
    "TextOptions",
    "clear_count_cache",
    "count_file",
    "discover_text",
]

COUNT_BLOCK_BYTES = 1024**2
"""Largest block of the record-count index (smaller when ``split_bytes`` is smaller)."""
_MAX_HEADER_BYTES = 64 * 1024**2
_THREADS = 16
_COUNT_CACHE: dict[tuple[object, ...], tuple[int, ...]] = {}


@dataclass(frozen=True, kw_only=True)
class TextOptions:
    """User options of text discovery.

    Attributes:
        schema: Column types for every file; ``None`` infers them from each file's head.
        quoted_newlines: CSV quoted fields may hold newlines: files are read whole.
        count_rows: Run the newline-count pass, so chunks carry exact record counts.
        count_cache_dir: Directory for a persistent cache of the counts, or ``None``.
        count_block_bytes: Block size of the count index.
    """

    schema: pa.Schema | None = None
    quoted_newlines: bool = False
    count_rows: bool = False
    count_cache_dir: str | None = None
    count_block_bytes: int = COUNT_BLOCK_BYTES


@dataclass(frozen=True)
class TextDiscovery:
    """What text discovery found: files, per-file text metadata, the dataset schema."""

    files: tuple[FileInfo, ...]
    meta: dict[str, TextFileMeta]
    schema: pa.Schema


def clear_count_cache() -> None:
    """Forget the in-process record counts (the on-disk cache is left alone)."""
    _COUNT_CACHE.clear()


def _head(fs: FileSystemSpec, path: str, compression: str | None) -> tuple[bytes, bool]:
    """The first ``SAMPLE_BYTES`` (more if the first line is longer) and whether that is all."""
    with fs.arrow().open_input_stream(path, compression=compression) as stream:
        head = stream.read(SAMPLE_BYTES)
        # Until the first line ends (with LF, or with a CR whose next byte is known).
        while LF not in head and CR not in head[:-1] and len(head) < _MAX_HEADER_BYTES:
            more = stream.read(SAMPLE_BYTES)
            if not more:
                return head, True
            head += more
        rest = stream.read(1)
        return head, not rest


def _parse_sample(data: bytes, is_csv: bool, names: Sequence[str]) -> pa.Table:
    """``data`` (whole lines) parsed with type inference, as one block."""
    block = max(len(data) + 1, 1 << 16)
    if is_csv:
        return pcsv.read_csv(
            buffer_source(data),
            read_options=pcsv.ReadOptions(column_names=list(names), use_threads=False, block_size=block),
        )
    return pjson.read_json(
        buffer_source(data), read_options=pjson.ReadOptions(use_threads=False, block_size=block)
    )


_SEARCH_PARSES = 2048
"""Most parses spent looking for the lines of a head that parse (about 0.3 s): a head
with lines that do not parse is searched from its start until then."""


def _lines_that_parse(
    data: bytes, is_csv: bool, names: Sequence[str], newline: bytes
) -> tuple[bytes, list[tuple[int, pa.ArrowException]]]:
    """The lines of ``data`` that parse, joined, and the offset and error of each that does not.

    Runs of lines are split in halves until each run parses or is one line, as the
    reader isolates bad lines; a line that does not parse on its own is left out. The
    search goes from the first line on, for at most :data:`_SEARCH_PARSES` parses (a
    file of another format, or one bad line in two, would take a parse per line).
    """
    starts = [int(s) for s in record_starts(data, 0, is_csv, newline)]
    ends = [*starts[1:], len(data)]
    good: list[bytes] = []
    bad: list[tuple[int, pa.ArrowException]] = []
    parses = [0]

    def visit(i: int, j: int) -> None:
        if parses[0] >= _SEARCH_PARSES:
            return
        parses[0] += 1
        run = data[starts[i] : ends[j - 1]]
        try:
            _parse_sample(run, is_csv, names)
        except pa.ArrowException as exc:
            if j - i == 1:
                bad.append((starts[i], exc))
                return
            visit(i, (i + j) // 2)
            visit((i + j) // 2, j)
            return
        good.append(run)

    if starts:
        visit(0, len(starts))
    return b"".join(good), bad


def _sample_schema(sample: bytes, is_csv: bool, display: str, meta: TextFileMeta) -> pa.Schema | None:
    """Column types inferred from ``sample`` (the head of a file, whole lines).

    Lines that do not parse on their own are bad data, left to the reader and its
    ``on_bad_data``: types are inferred from the other lines. Only a head in which no
    line parses, or whose lines parse alone but disagree on a column's type, is an error.

    Raises:
        CorruptFileError: no line parses (naming the file, the first line's number and
            byte offset, and ``format=`` / ``schema=``).
        SchemaMismatchError: the lines disagree on a column's type (pass ``schema=``).
    """
    data = sample[meta.data_start :]
    if not data.strip():
        return None
    names = meta.column_names
    try:
        table = _parse_sample(data, is_csv, names)
    except pa.ArrowException as exc:
        good, bad = _lines_that_parse(data, is_csv, names, meta.newline)
        if not good.strip():
            offset, first = bad[0] if bad else (0, exc)
            where = meta.data_start + offset
            line = sample.count(meta.newline, 0, where) + 1
            raise CorruptFileError(
                f"cannot infer column types from the first {len(sample)} bytes of {display!r}: none of "
                f"its {len(bad) or 1:,} first lines parses (line {line} at byte {where}: {first}); is the "
                "format right? Pass format= for its real format, or schema= to give the types"
            ) from exc
        try:
            table = _parse_sample(good, is_csv, names)
        except pa.ArrowException as conflict:
            raise SchemaMismatchError(
                f"cannot infer column types from the first {len(sample)} bytes of {display!r}: its "
                f"lines disagree on a column's type ({conflict}); pass schema= to give the types"
            ) from conflict
    # A column with only nulls in the sample says nothing about its type.
    return pa.schema([f.with_type(pa.string()) if pa.types.is_null(f.type) else f for f in table.schema])


def _cache_file(cache_dir: str, key: tuple[object, ...]) -> str:
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:32]
    return os.path.join(cache_dir, f"counts-{digest}.json")


def count_file(
    fs: FileSystemSpec,
    file: FileInfo,
    meta: TextFileMeta,
    *,
    is_csv: bool,
    quoted_newlines: bool,
    block_bytes: int,
    cache_dir: str | None = None,
) -> RecordIndex:
    """Records per block of ``file``, from the cache or a newline-count pass.

    Plain files are indexed per ``block_bytes``; files read whole (compressed, quoted
    newlines) get one block, the whole file. A CSV with quoted newlines is counted by
    parsing it (quotes decide where records end); everything else by counting lines.
    Results are cached when the file's modification time is known.
    """
    whole = meta.compression is not None or (quoted_newlines and is_csv)
    block = max(file.size, 1) if whole else block_bytes
    key: tuple[object, ...] = (
        fs.protocol,
        file.path,
        file.size,
        file.mtime,
        block,
        is_csv,
        whole and quoted_newlines,
        meta.data_start,
        meta.newline,
    )
    cacheable = file.mtime is not None
    counts = _COUNT_CACHE.get(key) if cacheable else None
    if counts is None and cacheable and cache_dir is not None:
        try:
            with open(_cache_file(cache_dir, key), encoding="utf-8") as fh:
                stored = json.load(fh)
            if stored.get("key") == repr(key):
                counts = tuple(int(c) for c in stored["counts"])
        except (OSError, ValueError, KeyError, TypeError):
            counts = None
    if counts is None:
        if whole and quoted_newlines and is_csv:
            counts = (_parse_count(fs, file.path, meta),)
        elif whole:
            counts = (_stream_count(fs, file.path, meta, is_csv),)
        else:
            counts = _block_counts(fs, file, meta, is_csv, block)
        if cacheable:
            _COUNT_CACHE[key] = counts
            if cache_dir is not None:
                os.makedirs(cache_dir, exist_ok=True)
                target = _cache_file(cache_dir, key)
                tmp = f"{target}.{os.getpid()}.tmp"
                with open(tmp, "w", encoding="utf-8") as fh:
                    json.dump({"key": repr(key), "counts": list(counts)}, fh)
                os.replace(tmp, target)
    return RecordIndex(block, counts)


def _block_counts(
    fs: FileSystemSpec, file: FileInfo, meta: TextFileMeta, is_csv: bool, block: int
) -> tuple[int, ...]:
    counts = np.zeros(math.ceil(file.size / block), dtype=np.int64)
    with fs.arrow().open_input_file(file.path) as f:
        f.seek(meta.data_start)
        for offset, piece in iter_pieces(f.read, meta.data_start, math.inf, PIECE_BYTES, meta.newline):
            starts = record_starts(piece, offset, is_csv, meta.newline)
            if len(starts):
                counts += np.bincount(starts // block, minlength=len(counts))[: len(counts)]
    return tuple(int(c) for c in counts)


def _stream_count(fs: FileSystemSpec, path: str, meta: TextFileMeta, is_csv: bool) -> int:
    total = 0
    with fs.arrow().open_input_stream(path, compression=meta.compression) as stream:
        stream.read(meta.data_start)
        for offset, piece in iter_pieces(stream.read, meta.data_start, math.inf, PIECE_BYTES, meta.newline):
            total += len(record_starts(piece, offset, is_csv, meta.newline))
    return total


def _parse_count(fs: FileSystemSpec, path: str, meta: TextFileMeta) -> int:
    first = meta.column_names[0]
    with fs.arrow().open_input_stream(path, compression=meta.compression) as stream:
        reader = pcsv.open_csv(
            cast(Any, stream),
            read_options=pcsv.ReadOptions(use_threads=False, block_size=PIECE_BYTES),
            parse_options=pcsv.ParseOptions(newlines_in_values=True),
            convert_options=pcsv.ConvertOptions(include_columns=[first], column_types={first: pa.string()}),
        )
        return sum(batch.num_rows for batch in reader)


def _inspect(
    fs: FileSystemSpec, listed: ListedFile, is_csv: bool, infer: bool
) -> tuple[TextFileMeta, pa.Schema | None]:
    display = fs.display(listed.path)
    compression = compression_of(listed.path)
    try:
        head, complete = _head(fs, listed.path, compression)
    except (OSError, pa.ArrowException) as exc:
        raise CorruptFileError(f"cannot read the head of {display!r} ({exc})") from exc
    if compression is None:
        _refuse_columnar(fs, listed, head, "CSV" if is_csv else "JSONL")
    names: tuple[str, ...] = ()
    data_start = 0
    newline = line_end_of(head)
    if is_csv:
        nl = head.find(newline)
        if nl < 0 and not complete:
            raise CorruptFileError(
                f"the first line of {display!r} is longer than {_MAX_HEADER_BYTES} bytes; "
                "is it a CSV file with a header line?"
            )
        header = head if nl < 0 else head[: nl + 1]
        if not header.strip():
            raise CorruptFileError(
                f"{display!r} has no header line (it is empty or starts with an empty line); "
                "CSV files need their column names on the first line"
            )
        try:
            line = header if header.endswith(newline) else header + newline
            names = tuple(pcsv.read_csv(buffer_source(line)).column_names)
        except UnicodeDecodeError as exc:
            raise CorruptFileError(
                f"the CSV header of {display!r} is not UTF-8 (byte {header[exc.start : exc.start + 1]!r} "
                f"at offset {exc.start}); CSV files must be UTF-8: convert the file, e.g. "
                "iconv -f latin1 -t utf-8 in.csv > out.csv"
            ) from exc
        except pa.ArrowException as exc:
            raise CorruptFileError(f"cannot parse the CSV header of {display!r} ({exc})") from exc
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise SchemaError(
                f"the CSV header of {display!r} names the columns {twice} more than once; columns "
                "are read by name, so rename them in the header to be unique"
            )
        data_start = len(header)
    meta = TextFileMeta(compression, data_start, names, newline)
    if not infer:
        return meta, None
    sample = head if complete else head[: head.rfind(newline) + 1]
    if is_csv and not sample[data_start:].strip():
        return meta, None  # header only: the names, but no types
    return meta, _sample_schema(sample, is_csv, display, meta)


_COLUMNAR_MAGIC = (
    ("parquet", "a Parquet", b"PAR1", slice(-4, None)),
    ("orc", "an ORC", b"ORC", slice(-4, -1)),
)
"""``(format, name, magic, where the magic sits in the last 4 bytes)``: Parquet files begin
and end with ``PAR1``; ORC files begin with ``ORC`` and their postscript, before its
length byte, ends with it."""


def _refuse_columnar(fs: FileSystemSpec, listed: ListedFile, head: bytes, as_format: str) -> None:
    """Raise if a file read as text is a Parquet or ORC file (its magic bytes, head and tail).

    Read as text, such a file gave a misleading error (a header that is "not UTF-8") or,
    for ORC as CSV, a silent row of garbage.

    Raises:
        CorruptFileError: naming the file, the format found and the ``format=`` to pass.
    """
    for name, label, magic, where in _COLUMNAR_MAGIC:
        if not head.startswith(magic) or listed.size < 2 * len(magic):
            continue
        try:
            tail = fs.read_range(listed.path, listed.size - 4, listed.size)
        except OSError:  # the text reader will name the file if it cannot be read
            return
        if tail[where] == magic:
            raise CorruptFileError(
                f"{fs.display(listed.path)!r} is {label} file (it begins and ends with the magic bytes "
                f"{magic.decode()!r}), not {as_format}: pass format={name!r}, or leave the file out of path"
            )


def _unify(schemas: Sequence[tuple[str, pa.Schema]]) -> pa.Schema:
    path0, schema = schemas[0]
    for path, other in schemas[1:]:
        try:
            schema = pa.unify_schemas([schema, other], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise SchemaMismatchError(
                f"the column types inferred for {path!r} do not fit those of {path0!r} ({exc}); "
                "pass schema= to give every file the same types"
            ) from exc
    return schema


def discover_text(
    fs: FileSystemSpec, format: FileFormat, listed: Sequence[ListedFile], options: TextOptions
) -> TextDiscovery:
    """Metadata of CSV / JSONL files: header, compression, one schema, optional counts.

    Raises:
        CorruptFileError: a file's head cannot be read or parsed (the file is named).
        SchemaMismatchError: inferred types of two files cannot be unified.
    """
    is_csv = format is FileFormat.CSV
    infer = options.schema is None

    def inspect(f: ListedFile) -> tuple[TextFileMeta, pa.Schema | None]:
        return _inspect(fs, f, is_csv, infer)

    with ThreadPoolExecutor(max_workers=max(1, min(_THREADS, len(listed)))) as pool:
        found = list(pool.map(inspect, listed))
    meta = {f.path: m for f, (m, _) in zip(listed, found, strict=True)}
    if options.schema is not None:
        schema = options.schema
    else:
        inferred = [(fs.display(f.path), s) for f, (_, s) in zip(listed, found, strict=True) if s is not None]
        if not inferred:
            if is_csv:
                first = next(iter(meta.values()))
                schema = pa.schema([pa.field(n, pa.string()) for n in first.column_names])
            else:
                raise CorruptFileError(
                    f"none of the {len(listed)} JSONL files holds a record to infer column types "
                    "from; pass schema="
                )
        else:
            schema = _unify(inferred)
    files = []
    for f in listed:
        m = meta[f.path]
        splittable = m.compression is None and not (options.quoted_newlines and is_csv)
        files.append(FileInfo(f.path, f.size, None, None, f.mtime, None, splittable, etag=f.etag))
    if options.count_rows:

        def count(info: FileInfo) -> FileInfo:
            index = count_file(
                fs,
                info,
                meta[info.path],
                is_csv=is_csv,
                quoted_newlines=options.quoted_newlines,
                block_bytes=options.count_block_bytes,
                cache_dir=options.count_cache_dir,
            )
            return FileInfo(info.path, info.size, None, None, info.mtime, index, info.splittable, info.etag)

        with ThreadPoolExecutor(max_workers=max(1, min(_THREADS, len(files)))) as pool:
            files = list(pool.map(count, files))
    return TextDiscovery(tuple(files), meta, schema)
