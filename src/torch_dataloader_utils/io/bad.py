"""Data a reader cannot decode: an error naming it, or a unit skipped, counted and reported.

With ``on_bad_data='raise'`` (the default) a unit that does not decode stops the read
with :class:`~torch_dataloader_utils.errors.BadDataError` naming the file and the unit
(row group, stripe, byte range of a line). With ``'skip'`` or ``'quarantine'`` the
reader drops the smallest unit its format allows (a Parquet row group, an ORC stripe, a
CSV / JSONL line, a line whose value does not convert to the declared type), and:

* yields a **stand-in** in its place: a batch of as many rows as the unit held in the
  chunk, zeros of every column, marked in its schema metadata (:func:`is_standin`). The
  stand-in keeps every row's position in the plan, so the worker's cursors, the resume
  state, windows and mixes stay exact; the runtime flags its rows in the padding column
  (``equal_batches='pad'``: they reach the loop, masked like padding, and every rank keeps
  its batch count) or removes them (otherwise: the rows vanish). Where positions count
  rows after an uncounted row filter, the stand-in has no rows (the unit's passing rows
  are unknown); positions are then counted as emitted anyway.
* counts the unit and its rows per file, in the reader's own counters
  (:meth:`BadData.totals`, read by the metrics of the loader that owns the reader: two
  loaders of one process never count each other's), logs it at INFO, and with
  ``'quarantine'`` appends it to ``quarantine.jsonl`` in ``quarantine_dir`` — once per
  unit, whichever rank, worker or resumed run meets it again (:class:`Quarantine`).

**What is bad data.** Only a unit that fails to decode *deterministically, on bytes read
completely*: when a unit does not decode, the reader reads its bytes again from storage
(never from the ``data_cache``, whose entries for them are dropped) and decodes it once
more (:func:`decode_again`). Bytes damaged in transit (a cut or altered response), an
I/O error the decoder reported as its own, or a cache entry holding damaged bytes then
decode, and the unit's rows are read, not skipped. A read that fails again is a storage
failure: :class:`~torch_dataloader_utils.errors.ReadError` after the retries
(``retries``, ``request_timeout``), whatever ``on_bad_data`` says. A memory error
(``MemoryError``, pyarrow's ``ArrowMemoryError``) is raised as it is: a unit that did
not fit in memory is not bad. A read that fails because the file changed or disappeared
is never bad data either: the reader checks the file against the plan first
(:class:`~torch_dataloader_utils.errors.FileChangedError`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from torch_dataloader_utils.config import BadDataConfig, BadDataPolicy
from torch_dataloader_utils.errors import BadDataError, ConfigError, ReadError
from torch_dataloader_utils.storage.cached import RangeFile
from torch_dataloader_utils.storage.fs import FileSystemSpec
from torch_dataloader_utils.storage.identity import FileChecks

__all__ = [
    "QUARANTINE_FILE",
    "STANDIN_KEY",
    "BadData",
    "BadUnit",
    "Quarantine",
    "confirm_unchanged",
    "agreed_bytes",
    "decode_again",
    "describe",
    "is_standin",
    "standin_batch",
]

T = TypeVar("T")

log = logging.getLogger(__name__)

STANDIN_KEY = b"tdu:standin"
"""Schema metadata key marking a stand-in batch (the rows of a unit that did not decode)."""
QUARANTINE_FILE = "quarantine.jsonl"
"""The report ``on_bad_data='quarantine'`` writes in ``quarantine_dir``: one JSON object per unit."""


# -- stand-ins --------------------------------------------------------------------------
def _zero(t: pa.DataType) -> Any:
    """A plain value of type ``t`` (0, False, "", [], ...), or ``None`` where there is none."""
    if pa.types.is_boolean(t):
        return False
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return ""
    if pa.types.is_fixed_size_binary(t):
        return b"\0" * t.byte_width
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return b""
    if pa.types.is_fixed_size_list(t):
        item = _zero(t.value_type)
        return None if item is None else [item] * t.list_size
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        return []
    if pa.types.is_struct(t):
        items = {t.field(i).name: _zero(t.field(i).type) for i in range(t.num_fields)}
        return None if any(v is None for v in items.values()) else items
    if pa.types.is_dictionary(t):
        return _zero(t.value_type)
    if pa.types.is_null(t):
        return None
    return 0


def _zeros(t: pa.DataType, rows: int) -> Any:
    """``rows`` values of :func:`_zero` (nulls for a type without one), as an Arrow array."""
    value = _zero(t)
    arrow: Any = pa
    if value is not None:
        with contextlib.suppress(pa.ArrowException, TypeError, ValueError):
            if pa.types.is_dictionary(t):
                return arrow.repeat(pa.scalar(value, t.value_type), rows).dictionary_encode().cast(t)
            return arrow.repeat(pa.scalar(value, t), rows)
    return arrow.nulls(rows, t)


def standin_batch(schema: pa.Schema, rows: int) -> pa.RecordBatch:
    """``rows`` stand-in rows of ``schema`` (zeros; marked by :data:`STANDIN_KEY`)."""
    metadata = {**(schema.metadata or {}), STANDIN_KEY: b"1"}
    arrays = [_zeros(f.type, rows) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema.with_metadata(metadata))


def is_standin(batch: pa.RecordBatch | pa.Table) -> bool:
    """Whether ``batch`` is a stand-in (:func:`standin_batch`)."""
    metadata = batch.schema.metadata
    return metadata is not None and STANDIN_KEY in metadata


# -- units ------------------------------------------------------------------------------
@dataclass(frozen=True)
class BadUnit:
    """One unit of a file that did not decode, and where it is.

    Attributes:
        file: The file, as a URL (or a local path).
        unit: ``"row_group"``, ``"stripe"``, ``"line"`` or ``"file"``.
        index: The row group's or stripe's index in the file, or ``None``.
        rows: The unit's rows in the file, ``(first, stop)``, or ``None`` (text lines).
        byte_range: The unit's bytes in the file, ``(start, stop)``, or ``None``.
        error: What the decoder said.
        lost: Rows of the unit the reading chunk lost (a chunk may hold part of a unit).
    """

    file: str
    unit: str
    index: int | None
    rows: tuple[int, int] | None
    byte_range: tuple[int, int] | None
    error: str
    lost: int = 0

    def where(self) -> str:
        """``"row group 3 (rows [196608, 262144))"``, ``"line at bytes [10, 42)"``..."""
        parts = [self.unit.replace("_", " ")]
        if self.index is not None:
            parts.append(str(self.index))
        if self.rows is not None:
            parts.append(f"(rows [{self.rows[0]}, {self.rows[1]}))")
        if self.byte_range is not None:
            parts.append(f"at bytes [{self.byte_range[0]}, {self.byte_range[1]})")
        return " ".join(parts)

    def identity(self) -> str:
        """What makes two reports the same unit (the error text aside)."""
        return json.dumps([self.file, self.unit, self.index, self.rows, self.byte_range])

    def record(self) -> dict[str, Any]:
        """The quarantine report's JSON object."""
        return {
            "file": self.file,
            "unit": self.unit,
            "index": self.index,
            "rows": None if self.rows is None else list(self.rows),
            "bytes": None if self.byte_range is None else list(self.byte_range),
            "error": self.error,
        }


def _identity_of(record: Mapping[str, Any]) -> str:
    rows, nbytes = record.get("rows"), record.get("bytes")
    return json.dumps(
        [
            record.get("file"),
            record.get("unit"),
            record.get("index"),
            None if rows is None else tuple(rows),
            None if nbytes is None else tuple(nbytes),
        ]
    )


# -- what decides bad data ---------------------------------------------------------------
READS_TO_AGREE = 4
"""Reads of a unit's bytes, at most, until two in a row agree (:func:`decode_again`)."""


def _read_again_failed(fresh: RangeFile) -> BaseException:
    """The error to raise for a read again that failed (its own fetch's error)."""
    failed = fresh.error
    assert failed is not None
    if isinstance(failed, (ReadError, MemoryError)):
        return failed
    return ReadError(f"reading the bytes again failed: {type(failed).__name__}: {failed}")


def _disagree(what: str, first: BaseException) -> ReadError:
    return ReadError(
        f"{what} did not decode ({describe(first)}), and its bytes differed at each of "
        f"{READS_TO_AGREE} reads again from storage: the storage or the network returns damaged "
        "data; it is not counted as bad data. Check the endpoint (a proxy, a faulty disk or "
        "NIC) and read again"
    )


def decode_again(
    first: BaseException,
    open_fresh: Callable[[], RangeFile],
    decode: Callable[[Any], T],
    what: str = "a unit",
    check: Callable[[], None] | None = None,
) -> T | BaseException:
    """Decode a unit again from bytes read again from storage (see the module docstring).

    The bytes are read anew (never from the cache) and decoded. When that decode fails
    too, they are read and decoded once more: a unit is bad data only when two reads in a
    row return the same bytes and they do not decode. So bytes damaged in transit, even
    twice in a row, are never taken for bad data; a truly bad unit costs two more reads
    of its bytes.

    Args:
        first: The error of the first decode.
        open_fresh: Opens the file so that every read is fetched from storage now
            (:meth:`~torch_dataloader_utils.storage.cached.RemoteReads.fresh`).
        decode: Decodes the unit from a file (a ``pyarrow.PythonFile``).
        what: The unit, for messages (``"row group 3 of 's3://b/x.parquet'"``).
        check: Raises when the file is no longer the planned one
            (:func:`confirm_unchanged`): run first, as a changed file is never bad data.

    Returns:
        The unit decoded (the first error was the storage's), or the decoder's error
        when it fails on the same bytes read twice: the unit is bad data.

    Raises:
        FileChangedError: from ``check``.
        MemoryError: ``first`` or a decode again ran out of memory.
        ReadError: reading the bytes again failed (after the retries), or they differed at
            every read (:data:`READS_TO_AGREE`).
    """
    if isinstance(first, MemoryError):
        raise first
    if check is not None:
        check()
    seen: bytes | None = None
    for _ in range(READS_TO_AGREE):
        fresh = open_fresh()
        try:
            value = decode(pa.PythonFile(fresh, mode="r"))
        except MemoryError:
            raise
        except (OSError, pa.ArrowException) as exc:
            if fresh.error is not None:
                raise _read_again_failed(fresh) from exc
            digest = fresh.digest()
            if digest == seen:
                return exc  # the same bytes twice, and they do not decode: bad data
            seen = digest
            continue
        log.warning(
            "%s did not decode (%s) and decoded from its bytes read again: the first bytes were "
            "damaged or cut in transit, or their read failed; its rows are read",
            what,
            describe(first),
        )
        return value
    raise _disagree(what, first) from first


def agreed_bytes(first: bytes, read: Callable[[], bytes], what: str, error: BaseException) -> bytes | None:
    """``first`` checked against the same bytes read again: ``None`` when they agree, else storage's bytes.

    Bytes that differ are read until two reads in a row agree (:data:`READS_TO_AGREE`);
    ``what`` names them and ``error`` is what their decoder said, for the error.

    Raises:
        ReadError: a read failed (after its retries), or no two reads agreed.
    """
    previous = first
    for _ in range(READS_TO_AGREE):
        data = read()
        if data == previous:
            return None if data is first else data
        previous = data
    raise _disagree(what, error) from error


def _unusable(directory: str) -> str | None:
    """Why ``directory`` cannot hold the quarantine report (``None``: it can; created if missing)."""
    try:
        os.makedirs(directory, exist_ok=True)
        if not os.path.isdir(directory):
            return "it is not a directory"
        fd = os.open(os.path.join(directory, QUARANTINE_FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.close(fd)
    except FileExistsError:
        return "it is a file, not a directory"
    except NotADirectoryError:
        return "a part of its path is a file, not a directory"
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno is not None else str(exc)
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            why += " (read-only, immutable, or not this user's)"
        return f"{QUARANTINE_FILE} cannot be written there: {why}"
    return None


# -- the report ---------------------------------------------------------------------------
class Quarantine:
    """``quarantine.jsonl`` in a local directory, shared by every process that writes to it.

    Each unit is written once: under an exclusive ``flock`` of the file, a writer reads
    the records appended since its last look and appends its unit only if no record names
    it. So ranks, workers and a resumed run that meet a unit again add nothing.

    Args:
        directory: The ``quarantine_dir`` (``~`` expanded; created, and the report
            opened once, at once: an unusable directory fails when the loader is built).

    Raises:
        ConfigError: the directory cannot hold the report (a file, under a file,
            read-only or immutable), naming ``quarantine_dir`` and why.
    """

    def __init__(self, directory: str) -> None:
        self.directory = os.path.expanduser(directory)
        self.path = os.path.join(self.directory, QUARANTINE_FILE)
        why = _unusable(self.directory)
        if why is not None:
            raise ConfigError(
                f"quarantine_dir={directory!r} cannot hold the quarantine report: {why}; pass a "
                "directory this process can create and write (a local path), or on_bad_data='skip'"
            )
        self._seen: set[str] = set()
        self._offset = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["directory"])  # type: ignore[misc]

    def add(self, unit: BadUnit) -> bool:
        """Append ``unit`` unless the report names it already: whether it was written."""
        if self._pid != os.getpid():  # a forked worker: its own lock, the same view of the file
            self._pid, self._lock = os.getpid(), threading.Lock()
        identity = unit.identity()
        line = (json.dumps(unit.record(), sort_keys=True) + "\n").encode()
        with self._lock:
            if identity in self._seen:
                return False
            os.makedirs(self.directory, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._catch_up(fd)
                if identity in self._seen:
                    return False
                os.write(fd, line)
                self._offset += len(line)
                self._seen.add(identity)
                return True
            finally:
                os.close(fd)  # releases the lock

    def _catch_up(self, fd: int) -> None:
        """Read the records appended since the last look (under the lock)."""
        size = os.fstat(fd).st_size
        if size < self._offset:  # the report was truncated or replaced: read it all again
            self._seen, self._offset = set(), 0
        if size == self._offset:
            return
        data = os.pread(fd, size - self._offset, self._offset)
        end = data.rfind(b"\n") + 1
        for raw in data[:end].splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(raw)
                if isinstance(record, dict):
                    self._seen.add(_identity_of(record))
        self._offset += end


# -- a reader's policy ------------------------------------------------------------------
class BadData:
    """One reader's handling of units it cannot decode (see the module docstring).

    A picklable value (each process keeps its own counters and report handle): the
    counters are this reader's, so the metrics of one loader never count the units of
    another loader of the same process.

    Args:
        config: The ``on_bad_data`` options.

    Raises:
        ConfigError: ``quarantine_dir`` cannot hold the report (see :class:`Quarantine`).
    """

    def __init__(self, config: BadDataConfig | None = None) -> None:
        self.config = config or BadDataConfig()
        directory = self.config.quarantine_dir
        self._quarantine = Quarantine(directory) if directory is not None else None
        self._counts: dict[str, list[int]] = {}
        self._standins = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "_quarantine": self._quarantine}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._counts = {}  # each process counts what it skips
        self._standins = 0
        self._lock = threading.Lock()

    def totals(self) -> tuple[int, int]:
        """``(units, rows)`` this reader skipped in this process so far (cumulative)."""
        with self._lock:
            return (sum(c[0] for c in self._counts.values()), sum(c[1] for c in self._counts.values()))

    def files(self) -> dict[str, int]:
        """Rows this reader skipped per file in this process so far."""
        with self._lock:
            return {path: c[1] for path, c in self._counts.items()}

    def standin_rows(self) -> int:
        """Stand-in rows this reader yielded in this process for units of chunks that are not padding.

        With ``equal_batches='pad'`` they reach the loop flagged ``_is_padding``; the
        metrics count them as ``bad_rows``, not as ``rows_padded``.
        """
        with self._lock:
            return self._standins

    def yielded(self, rows: int) -> None:
        """Count ``rows`` stand-in rows yielded for units of a chunk that is not padding."""
        with self._lock:
            self._standins += rows

    def count(self, file: str, units: int, rows: int) -> None:
        """Count ``units`` skipped units of ``file`` holding ``rows`` rows."""
        with self._lock:
            counts = self._counts.setdefault(file, [0, 0])
            counts[0] += units
            counts[1] += rows

    @property
    def skipping(self) -> bool:
        """Whether units that do not decode are skipped (else raised)."""
        return self.config.skipping

    def error(self, unit: BadUnit, reading: str, hint: str = "") -> BadDataError:
        """The error of ``on_bad_data='raise'`` for ``unit`` (raise it from the decoder's error).

        Args:
            unit: What does not decode.
            reading: What was being read, e.g. ``"'x.parquet' rows [0, 100)"``.
            hint: A sentence of advice for this format, or ``""``.
        """
        return BadDataError(
            f"reading {reading} failed: {unit.where()} of {unit.file!r} cannot be decoded ({unit.error}). "
            f"{hint}Pass on_bad_data='skip' to skip such units (counted in loader.metrics()), or "
            "on_bad_data='quarantine' with quarantine_dir= to also list them in a report"
        )

    def skip(self, unit: BadUnit, *, padding: bool = False, counted: bool = True) -> None:
        """Count ``unit`` as skipped (unless read as ``padding``, or not ``counted``), log it, report it.

        ``counted=False``: the caller counts it (:meth:`count`) once it knows the unit is
        its own (a text range shared by readers parses lines outside its records).
        """
        if counted and not padding:
            self.count(unit.file, 1, unit.lost)
        written = self._quarantine.add(unit) if self._quarantine is not None else False
        log.info(
            "on_bad_data=%r: skipped %s of %r, %d row(s)%s: %s",
            self.config.on_bad_data.value,
            unit.where(),
            unit.file,
            unit.lost,
            f" (reported in {self._quarantine.path})" if written and self._quarantine else "",
            unit.error,
        )

    @property
    def policy(self) -> BadDataPolicy:
        """The policy."""
        return self.config.on_bad_data

    def resolve(
        self,
        unit: BadUnit,
        cause: BaseException,
        *,
        reading: str,
        padding: bool,
        schema: pa.Schema | None,
        hint: str = "",
        counted: bool = True,
    ) -> pa.RecordBatch | None:
        """A unit that did not decode: raise (``'raise'``), or skip it and return its stand-in.

        The caller has checked first that the file is still the planned one (a changed
        file is never bad data). Returns ``unit.lost`` stand-in rows of ``schema``, or
        ``None`` when the unit lost no rows (or ``schema`` is unknown).

        Args:
            unit: What did not decode.
            cause: The decoder's error (the ``BadDataError`` is raised from it).
            reading: What was being read, for the error (see :meth:`error`).
            padding: The chunk repeats rows read elsewhere (``equal_batches='pad'``): not counted.
            schema: The reader's output schema.
            hint: Advice for this format in the error.
            counted: Count the unit here (see :meth:`skip`).

        Raises:
            BadDataError: with ``on_bad_data='raise'``.
        """
        if not self.skipping:
            raise self.error(unit, reading, hint) from cause
        self.skip(unit, padding=padding, counted=counted)
        if not unit.lost or schema is None:
            return None
        if not padding:
            self.yielded(unit.lost)
        return standin_batch(schema, unit.lost)


def confirm_unchanged(fs: FileSystemSpec, path: str, planned: Any, manifest: str | None = None) -> None:
    """Raise :class:`FileChangedError` if ``path`` is no longer the ``planned`` file (size, mtime).

    Called before a failure to decode is taken for bad data. ``manifest``: the reshard
    manifest the file was planned from, if any (its advice goes in the error).
    """
    FileChecks(fs, {path: planned}, manifest=manifest).check(path, planned.size, planned.mtime)


def describe(exc: BaseException) -> str:
    """One line of what a decoder said (``"ArrowInvalid: ..."``), at most 500 characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 500 else text[:497] + "..."
