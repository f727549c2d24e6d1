"""Reading CSV and JSONL by byte range (record scanning: :mod:`torch_dataloader_utils.storage.records`).

A byte-range chunk ``[start, stop)`` owns exactly the records whose first byte lies in
it. A record starts at the file's first data byte (after the CSV header) and after
every newline byte that is followed by a non-empty line. The reader

1. seeks to ``start - 1`` and skips to just after the next newline (unless the range
   begins at or before the first data byte),
2. reads whole lines in pieces of about ``piece_bytes`` until it has finished the line
   holding byte ``stop - 1``, reading past ``stop`` when a line crosses it,
3. parses each piece with pyarrow (the CSV header and the dataset's one schema are
   given, so every chunk of every file types its columns the same way), and
4. checks that each piece parsed into exactly as many records as it has non-empty
   lines. A mismatch means a record spans lines (a newline inside a quoted CSV
   field): :class:`RecordBoundaryError` is raised, naming the file, the byte offset
   and the option to set, instead of yielding split or duplicated records.

Lines end with LF or CR LF, or with a lone CR in files that use CR alone (the newline
byte is found per file by discovery). Multi-byte UTF-8 characters never contain the
newline byte, so cutting at a newline never splits a character.

Compressed files (``.gz``, ``.bz2``, ``.zst``, ``.lz4``) are streamed whole; a CSV
declared to hold newlines in quoted fields (``quoted_newlines=True``) is read whole
by pyarrow's streaming CSV reader, which follows quotes across lines.

A piece that does not parse (a line that is not JSON, a CSV line with too many fields,
a value that does not convert to the declared type) is split in halves until the lines
that do not parse are found: with ``on_bad_data='raise'`` the first one is named (its
byte range) in :class:`BadDataError`; with ``'skip'`` / ``'quarantine'`` each such line
is dropped and replaced by a one-record stand-in (:mod:`~torch_dataloader_utils.io.bad`),
so record counts and positions stay exact. A quoted-newline CSV cannot be resumed after
an error inside pyarrow's stream: there the rest of the file is the unit skipped.

Two kinds of line are never bad data, under any ``on_bad_data``:

* a record that spans lines (pieces whose records and lines disagree, a CSV line that
  ends inside a quoted field) raises :class:`RecordBoundaryError`: skipping its lines
  would deliver the record's other lines as made-up records;
* with types inferred from the files' heads, a line that parses once some columns get
  a wider type (``200000.5`` in a column inferred as int64) raises
  :class:`InferredSchemaError`, naming the columns and the ``schema=`` to pass: every
  reader keeps the one schema decided at discovery.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson

from torch_dataloader_utils.config import FileFormat
from torch_dataloader_utils.errors import (
    FileChangedError,
    InferredSchemaError,
    ReadError,
    RecordBoundaryError,
)
from torch_dataloader_utils.io.bad import (
    BadUnit,
    agreed_bytes,
    confirm_unchanged,
    describe,
    is_standin,
    standin_batch,
)
from torch_dataloader_utils.io.base import ReaderBase, ReaderCounts, ReadRequest
from torch_dataloader_utils.io.prefetch import FetchStats, Warmer
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit
from torch_dataloader_utils.storage.cached import BLOCK_BYTES
from torch_dataloader_utils.storage.identity import FileChecks
from torch_dataloader_utils.storage.records import (
    PIECE_BYTES,
    SAMPLE_BYTES,
    TextFileMeta,
    buffer_source,
    count_records,
    ends_inside_quotes,
    iter_pieces,
    next_line_start,
    record_starts,
)

__all__ = ["TextReader"]

_NOT_UTF8 = (
    "is not valid UTF-8; text files must be UTF-8: convert the file (e.g. iconv -f latin1 -t "
    "utf-8 in > out), or pass schema= with pyarrow.binary() for a column of raw bytes"
)


class TextReader(ReaderBase):
    """A :class:`ChunkReader` for CSV and JSONL, by byte range (see the module docstring).

    Args:
        request: What to read (files, columns, filter, batch size).
        meta: Text metadata (compression, header) by path.
        format: ``FileFormat.CSV`` or ``FileFormat.JSONL``.
        schema: The dataset's data schema: every chunk is parsed to these types.
        quoted_newlines: CSV quoted fields may hold newlines (files are read whole).
        strict_fields: JSONL: a key missing from ``schema`` is an error (else ignored).
        inferred: ``schema`` was inferred from the files' heads: a line whose value fits
            only a wider type raises :class:`InferredSchemaError` (it is not bad data).
        piece_bytes: Bytes parsed at once.
    """

    def __init__(
        self,
        request: ReadRequest,
        meta: Mapping[str, TextFileMeta],
        *,
        format: FileFormat,
        schema: pa.Schema,
        quoted_newlines: bool = False,
        strict_fields: bool = True,
        inferred: bool = False,
        piece_bytes: int = PIECE_BYTES,
    ) -> None:
        if format not in (FileFormat.CSV, FileFormat.JSONL):
            raise ValueError(f"TextReader reads CSV and JSONL, not {format.value!r}")
        self._fs = request.fs
        self._files = request.files
        self._meta = meta
        self._csv = format is FileFormat.CSV
        self._schema = schema
        self._data_columns = list(request.data_columns)
        self._finish = request.finisher()
        self._batch_size = request.batch_size
        self._quoted = quoted_newlines and self._csv
        self._strict = strict_fields
        self._inferred = inferred
        self._piece = piece_bytes
        self._stats = FetchStats()
        self._checks = FileChecks(request.fs, request.files)  # never read a rewritten file
        self._reads = request.reads()
        self._warmer = Warmer()
        self._bad = request.bad()
        self._out_schema = request.output_schema
        self._exact = request.filters is None  # a skipped line's stand-in keeps its row

    def io_totals(self) -> tuple[int, int, int, int, float]:
        """``(bytes_fetched, bytes_needed, requests, retries, wait_sec)`` of this process so far.

        Bytes read from the files: each chunk's range plus the line that crosses its end
        (a compressed or quoted-newline file: its size). Requests are not counted.
        """
        return self._stats.totals()

    def counts(self) -> ReaderCounts:
        """This reader's ``data_cache`` reads and skipped data in this process so far."""
        return ReaderCounts.of(self._reads, self._bad)

    def schedule(self, chunks: Sequence[Chunk]) -> None:
        """Announce the chunks this process reads next: remote files are checked meanwhile."""
        self._checks.schedule(() if self._reads.active else (c.path for c in chunks))

    def warm(self, chunks: Sequence[Chunk]) -> None:
        """Fetch ``chunks`` into the node-local cache on an idle thread (``data_cache_prefetch``).

        The blocks of each chunk's byte range and of its next byte (where the record
        crossing its end goes on), or of the whole file when it is read whole
        (compressed, quoted newlines). Nothing happens without a cache.
        """
        if self._reads.active:
            self._warmer.submit([functools.partial(self._warm_one, c) for c in chunks])

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Wait for the chunks given to :meth:`warm` so far (tests, benchmarks)."""
        return self._warmer.wait(timeout)

    def _warm_one(self, chunk: Chunk) -> None:
        info = self._files[chunk.path]
        meta = self._meta[chunk.path]
        whole = self._quoted or meta.compression is not None or not info.splittable
        lo, hi = (0, info.size) if whole else (chunk.start, min(info.size, chunk.stop + 1))
        opened = self._reads.open(
            chunk.path, size=info.size, version=info.mtime, before_fetch=self._before_fetch(chunk.path)
        )
        with opened as f:
            f.seek(lo - lo % BLOCK_BYTES)
            while f.tell() < hi and f.read(BLOCK_BYTES):
                pass

    def read(self, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        """Yield the records whose first byte lies in the chunk (filtered, projected)."""
        info = self._files[chunk.path]
        meta = self._meta[chunk.path]
        if chunk.unit is not ChunkUnit.BYTES:
            raise ReadError(f"text chunks are byte ranges; got a {chunk.unit.value} chunk of {chunk.path!r}")
        whole = chunk.start == 0 and chunk.stop >= info.size
        if not whole and (not info.splittable or meta.compression is not None):
            raise ReadError(
                f"{self._fs.display(chunk.path)!r} can only be read whole (compressed, or "
                f"quoted_newlines=True), but the plan asks for bytes [{chunk.start}, {chunk.stop}); "
                "use split_strategy='byte_range' or 'file'"
            )
        if not self._reads.active:
            self._checks.check(chunk.path, info.size, info.mtime)
        try:
            if self._quoted or meta.compression is not None:
                self._stats.read(info.size, info.size)
            if self._quoted:
                yield from self._read_quoted(chunk, meta)
                return
            raw: Iterator[pa.RecordBatch] = (
                batch
                for table in self._tables(chunk, meta)
                for batch in table.to_batches(max_chunksize=self._batch_size)
            )
            if chunk.windowed:
                raw = self._window(raw, chunk)
            for batch in raw:
                if is_standin(batch):
                    if chunk.windowed and not chunk.padding:  # a bad line of this chunk's records
                        self._bad.count(self._fs.display(chunk.path), batch.num_rows, batch.num_rows)
                    if self._exact and self._out_schema is not None:
                        if not chunk.padding:
                            self._bad.yielded(batch.num_rows)
                        yield standin_batch(self._out_schema, batch.num_rows)
                    continue
                yield self._finish(batch, chunk.path)
        except MemoryError:
            raise  # records that do not fit in memory are not bad data, nor a read error
        except (OSError, pa.ArrowException) as exc:
            where = f"{self._fs.display(chunk.path)!r} bytes [{chunk.start}, {chunk.stop})"
            if "utf8" in str(exc).lower():
                raise ReadError(f"{where} {_NOT_UTF8} ({exc})") from exc
            hint = (
                "if quoted CSV fields hold newlines, pass quoted_newlines=True"
                if self._csv
                else "JSONL needs one JSON object per line"
            )
            raise ReadError(
                f"reading {where} failed: {exc}. If a column's type is wrong for later rows, pass "
                f"schema=; {hint}"
            ) from exc

    def _window(self, batches: Iterator[pa.RecordBatch], chunk: Chunk) -> Iterator[pa.RecordBatch]:
        """Records ``[skip, skip + num_rows)`` of the range, before any filter.

        Raises:
            ReadError: the range holds fewer records than were counted (the file changed).
        """
        skip, take = chunk.skip, chunk.num_rows or 0
        seen = 0
        for batch in batches:
            lo, hi = max(skip - seen, 0), min(skip + take - seen, batch.num_rows)
            seen += batch.num_rows
            if hi > lo:
                yield batch.slice(lo, hi - lo)
            if seen >= skip + take:
                return
        raise ReadError(
            f"{self._fs.display(chunk.path)!r} bytes [{chunk.start}, {chunk.stop}) hold {seen} records, "
            f"but {skip + take} were counted when the dataset was built; the file changed since then: "
            "build the dataset again"
        )

    # -- bytes -----------------------------------------------------------------
    def _before_fetch(self, path: str) -> Callable[[], None]:
        info = self._files[path]
        return lambda: self._checks.check(path, info.size, info.mtime)

    def _open_stream(self, path: str, compression: str | None) -> Any:
        info = self._files[path]
        return self._reads.open_stream(
            path,
            size=info.size,
            version=info.mtime,
            compression=compression,
            before_fetch=self._before_fetch(path),
        )

    def _pieces(self, chunk: Chunk, meta: TextFileMeta) -> Iterator[tuple[int, bytes]]:
        info = self._files[chunk.path]
        if meta.compression is not None:
            with self._open_stream(chunk.path, meta.compression) as stream:
                stream.read(meta.data_start)
                yield from iter_pieces(stream.read, meta.data_start, float("inf"), self._piece, meta.newline)
            return
        opened = self._reads.open(
            chunk.path, size=info.size, version=info.mtime, before_fetch=self._before_fetch(chunk.path)
        )
        with opened as f:
            if chunk.start <= meta.data_start:
                first = meta.data_start
            else:
                f.seek(chunk.start - 1)
                first = next_line_start(f.read, chunk.start - 1, meta.newline)
            if first >= chunk.stop:
                return
            f.seek(first)
            for offset, piece in iter_pieces(f.read, first, chunk.stop, self._piece, meta.newline):
                self._stats.read(len(piece), len(piece))
                yield offset, piece

    # -- parsing ---------------------------------------------------------------
    def _tables(self, chunk: Chunk, meta: TextFileMeta) -> Iterator[pa.Table]:
        """The chunk's pieces parsed; a piece that does not parse is searched for its bad lines.

        A piece that does not parse is read again from storage first: bytes that differ
        were damaged or cut in transit, and the piece read again is parsed instead
        (:mod:`~torch_dataloader_utils.io.bad`: only what fails on the bytes storage
        holds is bad data).
        """
        checked: list[bool] = []
        for offset, first in self._pieces(chunk, meta):
            piece = first
            table, failed = self._try_parse(piece, chunk.path, offset, meta)
            if failed is not None:
                if not checked:  # once per chunk: a changed file is never bad data
                    confirm_unchanged(self._fs, chunk.path, self._files[chunk.path])
                    checked.append(True)
                again = self._read_again(chunk, meta, offset, piece, failed)
                if again is not None:  # damaged in transit: parse what storage holds
                    piece = again
                    table, failed = self._try_parse(piece, chunk.path, offset, meta)
            if failed is None:
                assert table is not None
                yield table
                continue
            if isinstance(failed, RecordBoundaryError):
                raise failed from None  # never bad data: skipping a record's lines would make rows up
            if not self._bad.skipping and isinstance(failed, ReadError):
                raise failed from None  # UTF-8: its own error names the fix
            yield from self._isolate(piece, chunk, offset, meta, checked)

    def _try_parse(
        self, piece: bytes, path: str, offset: int, meta: TextFileMeta
    ) -> tuple[pa.Table | None, BaseException | None]:
        """``(table, None)``, or ``(None, error)`` when the piece does not parse (other errors raise)."""
        try:
            return self._parse(piece, path, offset, meta), None
        except (FileChangedError, MemoryError):
            raise
        except (pa.ArrowException, ReadError) as exc:
            return None, exc

    def _read_again(
        self, chunk: Chunk, meta: TextFileMeta, offset: int, piece: bytes, error: BaseException
    ) -> bytes | None:
        """The piece at ``offset`` read again from storage, when it differs from ``piece`` (else ``None``).

        Bytes that differ are read until two reads agree (:func:`~.bad.agreed_bytes`).
        Compressed files are streamed (``offset`` counts decompressed bytes): not read again.
        """
        if meta.compression is not None:
            return None
        info = self._files[chunk.path]

        def read() -> bytes:
            fresh = self._reads.fresh(chunk.path, size=info.size, version=info.mtime)
            fresh.seek(offset)
            return fresh.read(len(piece))

        where = f"the lines at bytes [{offset}, {offset + len(piece)}) of {self._fs.display(chunk.path)!r}"
        return agreed_bytes(piece, read, where, error)

    def _isolate(
        self, piece: bytes, chunk: Chunk, offset: int, meta: TextFileMeta, checked: list[bool]
    ) -> Iterator[pa.Table]:
        """A piece that does not parse, as parsed runs of lines and stand-ins of its bad lines.

        Lines are split in halves until each run parses or is one line (about two parses
        of the piece's bytes per bad line). With ``on_bad_data='raise'`` the first bad
        line raises.
        """
        starts = record_starts(piece, 0, self._csv, meta.newline)
        ends = [*(int(s) for s in starts[1:]), len(piece)]

        def runs(i: int, j: int) -> Iterator[pa.Table]:
            data = piece[int(starts[i]) : ends[j - 1]]
            try:
                table = self._parse(data, chunk.path, offset + int(starts[i]), meta)
            except (FileChangedError, RecordBoundaryError):
                raise
            except (pa.ArrowException, ReadError) as exc:
                if j - i == 1:
                    yield self._bad_line(piece, chunk, offset, int(starts[i]), meta, exc, checked)
                    return
                mid = (i + j) // 2
                yield from runs(i, mid)
                yield from runs(mid, j)
                return
            yield table

        if len(starts):
            yield from runs(0, len(starts))

    def _bad_line(
        self,
        piece: bytes,
        chunk: Chunk,
        offset: int,
        start: int,
        meta: TextFileMeta,
        exc: BaseException,
        checked: list[bool],
    ) -> pa.Table:
        """A line that does not parse: raise, or its one-record stand-in (skip).

        Raises:
            FileChangedError: the file is no longer the planned one (never bad data).
            RecordBoundaryError: a CSV line ends inside a quoted field (never bad data).
            InferredSchemaError: the line fits a wider type than the inferred one (never
                bad data).
            BadDataError: with ``on_bad_data='raise'``.
        """
        if not checked:  # once per chunk
            confirm_unchanged(self._fs, chunk.path, self._files[chunk.path])
            checked.append(True)
        nl = piece.find(meta.newline, start)
        stop = len(piece) if nl < 0 else nl + 1
        where = (offset + start, offset + stop)
        self._not_bad_data(piece[start:stop], chunk.path, where, meta)
        unit = BadUnit(self._fs.display(chunk.path), "line", None, None, where, describe(exc), 1)
        fix = (
            "if quoted CSV fields hold newlines, pass quoted_newlines=True. "
            if self._csv
            else "JSONL needs one JSON object per line. "
        )
        hint = f"If a column's type is wrong for later rows, pass schema=; {fix}"
        if "utf8" in str(exc).lower():
            hint = f"The line {_NOT_UTF8}. "
        self._bad.resolve(
            unit,
            exc,
            reading=f"{self._fs.display(chunk.path)!r} bytes [{chunk.start}, {chunk.stop})",
            padding=chunk.padding,
            schema=None,  # the record stays (its stand-in below); read() decides what the loop sees
            hint=hint,
            counted=not chunk.windowed,  # a range shared by readers: counted if in this chunk's window
        )
        return _line_standin(1)

    def _not_bad_data(self, line: bytes, path: str, where: tuple[int, int], meta: TextFileMeta) -> None:
        """Raise for a line that does not parse for a reason other than its own bytes.

        Raises:
            RecordBoundaryError: a CSV line ends inside a quoted field: its record goes on
                to the next line, and skipping the line would deliver the rest as made-up
                records.
            InferredSchemaError: the schema was inferred and the line parses once some
                columns get a wider type (int64 -> double, a struct with one more field).
        """
        at = f"{self._fs.display(path)!r}: the line at bytes [{where[0]}, {where[1]})"
        if self._csv and ends_inside_quotes(line.rstrip(b"\r\n")):
            raise RecordBoundaryError(
                f"{at} ends inside a quoted field, so its record goes on past the line end (a newline "
                "inside a quoted CSV field, or a line cut short). Such a line is never skipped as bad "
                "data: its record's other lines would be read as made-up records. Pass "
                "quoted_newlines=True to read files whose quoted fields hold newlines"
            )
        wider = self._wider_types(line, meta) if self._inferred else None
        if not wider:
            return
        changes = ", ".join(f"{n!r} from {self._schema.field(n).type} to {t}" for n, t in wider.items())
        schema = _widened(self._schema, wider)
        raise InferredSchemaError(
            f"{at} holds a value that fits only a wider type than the one inferred from the first "
            f"{SAMPLE_BYTES} bytes of each file: column {changes}. It is valid data, not bad data, so it "
            f"is not skipped. Pass schema= with the wider types, e.g. schema={_schema_literal(schema)}"
        )

    def _wider_types(self, line: bytes, meta: TextFileMeta) -> dict[str, pa.DataType]:
        """The columns whose type must widen for ``line`` to parse (empty if none would do)."""
        try:
            if self._csv:
                alone = pcsv.read_csv(
                    buffer_source(line),
                    read_options=pcsv.ReadOptions(column_names=list(meta.column_names), use_threads=False),
                )
            else:
                alone = pjson.read_json(
                    buffer_source(line), read_options=pjson.ReadOptions(use_threads=False)
                )
        except pa.ArrowException:
            return {}
        wider: dict[str, pa.DataType] = {}
        for field in alone.schema:
            if field.name not in self._schema.names or pa.types.is_null(field.type):
                continue
            have = self._schema.field(field.name).type
            try:
                both = pa.unify_schemas(
                    [pa.schema([(field.name, have)]), pa.schema([field])], promote_options="permissive"
                )
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                return {}  # no wider type holds both: the value is bad for this column
            if both.field(0).type != have:
                wider[field.name] = both.field(0).type
        if not wider:
            return {}
        try:
            self._parse(line, "", 0, meta, _widened(self._schema, wider))
        except (pa.ArrowException, ReadError):
            return {}  # something else is wrong with the line too: bad data
        return wider

    def _parse(
        self, piece: bytes, path: str, offset: int, meta: TextFileMeta, schema: pa.Schema | None = None
    ) -> pa.Table:
        """``piece`` (whole lines) parsed to ``schema`` (default: the dataset's), checked with its lines."""
        schema = self._schema if schema is None else schema
        expected = count_records(piece, self._csv, meta.newline)
        if expected == 0:
            return schema.empty_table().select(self._data_columns)
        source = buffer_source(piece)
        block = max(len(piece) + 1, 1 << 16)
        if self._csv:
            table = pcsv.read_csv(
                source,
                read_options=pcsv.ReadOptions(
                    column_names=list(meta.column_names), use_threads=False, block_size=block
                ),
                convert_options=self._csv_convert(meta, schema),
            )
        else:
            table = pjson.read_json(
                source,
                read_options=pjson.ReadOptions(use_threads=False, block_size=block),
                parse_options=pjson.ParseOptions(
                    explicit_schema=schema,
                    unexpected_field_behavior="error" if self._strict else "ignore",
                ),
            ).select(self._data_columns)
        if table.num_rows != expected:
            where = f"{self._fs.display(path)!r}: the lines at bytes [{offset}, {offset + len(piece)})"
            if not self._csv:
                raise RecordBoundaryError(
                    f"{where} parsed into {table.num_rows} JSON records but hold {expected} non-empty "
                    "lines, so a record spans lines (a pretty-printed object?). JSONL needs one "
                    "JSON object per line: rewrite the file with one object per line (e.g. "
                    "jq -c . in.json > out.jsonl)"
                )
            raise RecordBoundaryError(
                f"{where} parsed into {table.num_rows} records but hold {expected} non-empty lines, "
                "so a record spans lines (a newline inside a quoted CSV field?). Splitting this "
                "file by bytes would split or duplicate records, and skipping its lines as bad data "
                "would make records up: pass quoted_newlines=True to read such files whole"
            )
        if not self._csv:
            self._check_utf8(table, path, offset, piece)
        return table

    def _check_utf8(self, table: pa.Table, path: str, offset: int, piece: bytes) -> None:
        """Pyarrow's JSON reader does not check that strings are UTF-8: check them here.

        Raises:
            ReadError: naming the file and the byte offset of the first invalid byte.
        """
        for name, column in zip(table.column_names, table.columns, strict=True):
            if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
                continue
            try:
                column.validate(full=True)
            except pa.ArrowInvalid:
                try:
                    piece.decode("utf-8")
                    at = ""
                except UnicodeDecodeError as exc:
                    at = f" at byte {offset + exc.start}"
                raise ReadError(f"{self._fs.display(path)!r} column {name!r}{at} {_NOT_UTF8}") from None

    def _csv_convert(self, meta: TextFileMeta, schema: pa.Schema | None = None) -> pcsv.ConvertOptions:
        schema = self._schema if schema is None else schema
        types = {n: schema.field(n).type for n in meta.column_names if n in schema.names}
        return pcsv.ConvertOptions(column_types=types, include_columns=self._data_columns)

    def _read_quoted(self, chunk: Chunk, meta: TextFileMeta) -> Iterator[pa.RecordBatch]:
        path = chunk.path
        emitted = 0
        try:
            with self._open_stream(path, meta.compression) as stream:
                reader = pcsv.open_csv(
                    cast(Any, stream),
                    read_options=pcsv.ReadOptions(use_threads=False, block_size=self._piece),
                    parse_options=pcsv.ParseOptions(newlines_in_values=True),
                    convert_options=self._csv_convert(meta),
                )
                for batch in reader:
                    table = pa.Table.from_batches([batch])
                    for piece in table.to_batches(max_chunksize=self._batch_size):
                        emitted += piece.num_rows
                        yield self._finish(piece, path)
        except MemoryError:
            raise
        except pa.ArrowException as exc:
            if not self._bad.skipping:
                raise
            yield from self._bad_rest(chunk, emitted, exc)

    def _bad_rest(self, chunk: Chunk, emitted: int, exc: BaseException) -> Iterator[pa.RecordBatch]:
        """A quoted-newline CSV that stopped parsing: the rest of its records is the unit skipped."""
        info = self._files[chunk.path]
        confirm_unchanged(self._fs, chunk.path, info)
        total = chunk.num_rows if chunk.num_rows is not None else info.num_rows
        lost = max(0, total - emitted) if total is not None and self._exact else 0
        rows = (emitted, total) if total is not None else None
        unit = BadUnit(self._fs.display(chunk.path), "records", None, rows, None, describe(exc), lost)
        standin = self._bad.resolve(
            unit,
            exc,
            reading=f"{self._fs.display(chunk.path)!r}",
            padding=chunk.padding,
            schema=self._out_schema,
        )
        if standin is not None:
            yield standin


def _widened(schema: pa.Schema, wider: Mapping[str, pa.DataType]) -> pa.Schema:
    return pa.schema([(f.name, wider.get(f.name, f.type)) for f in schema])


def _schema_literal(schema: pa.Schema) -> str:
    """``schema`` as Python to paste: ``pyarrow.schema([("id", "int64"), ...])`` where types have names."""
    fields = []
    for field in schema:
        try:
            named = cast(Any, pa.type_for_alias)(str(field.type)) == field.type
        except ValueError:
            named = False
        if not named:
            return "pyarrow.schema([...]) with " + ", ".join(f"{f.name}: {f.type}" for f in schema)
        fields.append(f"({field.name!r}, {str(field.type)!r})")
    return f"pyarrow.schema([{', '.join(fields)}])"


def _line_standin(rows: int) -> pa.Table:
    """Where a line that did not parse was: ``rows`` records marked as a stand-in (no data)."""
    batch = standin_batch(pa.schema([("__standin", pa.null())]), rows)
    return pa.Table.from_batches([batch])
