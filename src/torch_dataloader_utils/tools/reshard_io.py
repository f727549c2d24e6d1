"""What ``reshard`` writes: atomic files on any filesystem, Parquet shards, map-phase spills.

A reader never sees a partial shard, marker or manifest. On an object store (S3, GCS,
Azure) an object becomes visible only once its upload completed, so files are written
in place. Elsewhere a file goes first to a unique temporary name under
``_reshard/tmp/`` (hidden from listings: names starting with ``_`` are skipped) and is
renamed to its final name when complete (a local rename is atomic).

A job claims its destination with :meth:`Destination.create_exclusive` (a file that
only one writer can create: a hard link on a local disk, a conditional ``PUT`` with
``If-None-Match: *`` on S3), so two jobs started on one destination at the same moment
cannot both write there. A write that fails (a full disk, a quota, a permission) is a
:class:`ReshardError` naming the file (:func:`writing`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from torch_dataloader_utils.errors import ReshardError
from torch_dataloader_utils.storage.fs import FileSystemSpec

__all__ = ["STATE_DIR", "Destination", "ShardWriter", "conform", "writing"]

STATE_DIR = "_reshard"
"""The job's own files under the destination: job, done markers, temporary files, spills."""
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl"})
"""Protocols whose uploads are atomic (an object appears only when complete)."""


@dataclass(frozen=True)
class Destination:
    """The output directory of a job, on any filesystem (paths relative to its root)."""

    fs: FileSystemSpec
    root: str

    def path(self, rel: str) -> str:
        """The filesystem path of ``rel``."""
        return posixpath.join(self.root, rel) if rel else self.root

    def display(self, rel: str = "") -> str:
        """``rel`` as the user would write it (with the scheme)."""
        return self.fs.display(self.path(rel))

    @property
    def arrow(self) -> pafs.FileSystem:
        """This process's pyarrow filesystem."""
        return self.fs.arrow()

    def _mkdirs(self, rel: str) -> None:
        if self.fs.is_local:
            os.makedirs(posixpath.dirname(self.path(rel)), exist_ok=True)

    def kind(self, rel: str = "") -> pafs.FileType:
        """Whether ``rel`` is a file, a directory or missing."""
        return self.arrow.get_file_info(self.path(rel)).type

    def read(self, rel: str) -> bytes | None:
        """The bytes of ``rel``, or ``None`` when it does not exist."""
        try:
            with self.arrow.open_input_stream(self.path(rel)) as f:
                return bytes(f.read())
        except FileNotFoundError:
            return None
        except OSError as exc:
            if self.kind(rel) == pafs.FileType.NotFound:
                return None
            raise ReshardError(f"cannot read {self.display(rel)!r}: {exc}") from exc

    def read_json(self, rel: str) -> Any:
        """The JSON document at ``rel``, or ``None`` when it does not exist."""
        data = self.read(rel)
        return None if data is None else json.loads(data)

    def entries(self, rel: str = "") -> list[str]:
        """Names directly under ``rel`` (``[]`` when it does not exist)."""
        selector = pafs.FileSelector(self.path(rel), allow_not_found=True, recursive=False)
        return sorted(posixpath.basename(i.path.rstrip("/")) for i in self.arrow.get_file_info(selector))

    @property
    def atomic_uploads(self) -> bool:
        """Whether a file written in place is invisible until complete (object stores)."""
        return self.fs.protocol in OBJECT_STORES

    def temp(self, name: str) -> str:
        """Where to write ``name`` before :meth:`commit` (itself on an object store)."""
        if self.atomic_uploads:
            return name
        stem = posixpath.basename(name)
        return f"{STATE_DIR}/tmp/{uuid.uuid4().hex[:12]}-{stem}"

    def open_output(self, rel: str) -> Any:
        """A writable stream at ``rel`` (parent directories created)."""
        self._mkdirs(rel)
        return self.arrow.open_output_stream(self.path(rel))

    def commit(self, temp: str, rel: str) -> None:
        """Rename the complete ``temp`` to ``rel`` (replacing it), atomically where possible."""
        if temp == rel:
            return
        self._mkdirs(rel)
        self.arrow.move(self.path(temp), self.path(rel))

    def write_atomic(self, rel: str, data: bytes) -> None:
        """Write ``data`` to ``rel`` through a temporary name."""
        temp = self.temp(rel)
        with self.open_output(temp) as out:
            out.write(data)
        self.commit(temp, rel)

    def write_json(self, rel: str, doc: Any) -> None:
        """Write a JSON document atomically."""
        with writing(self, rel):
            self.write_atomic(rel, json.dumps(doc, indent=1).encode("utf-8"))

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Write ``data`` at ``rel`` only if nothing is there; whether it was written.

        Atomic against another writer doing the same: on a local disk the complete file
        is hard-linked to its name (``link`` fails when the name exists); on an object
        store with conditional writes (S3's ``If-None-Match: *``) the upload is refused
        when the object exists. Elsewhere it checks, then writes (a narrow race remains:
        :func:`~torch_dataloader_utils.tools.reshard` reads the file back to see who won).
        """
        if self.fs.is_local:
            return self._link_exclusive(rel, data)
        if self.atomic_uploads:
            try:
                self.fs.fsspec().pipe_file(self.path(rel), data, mode="create")
                return True
            except FileExistsError:
                return False
            except (TypeError, NotImplementedError):
                pass  # no conditional writes in this client: check, then write
            except OSError:
                if self.kind(rel) != pafs.FileType.NotFound:
                    return False  # the condition failed (some servers answer 400, not 412)
                raise
        if self.kind(rel) != pafs.FileType.NotFound:
            return False
        self.write_atomic(rel, data)
        return True

    def _link_exclusive(self, rel: str, data: bytes) -> bool:
        temp = self.temp(rel)
        with self.open_output(temp) as out:
            out.write(data)
        self._mkdirs(rel)
        try:
            os.link(self.path(temp), self.path(rel))
            return True
        except FileExistsError:
            return False
        except OSError as exc:  # no hard links here (some network file systems): O_EXCL
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                raise
            try:
                fd = os.open(self.path(rel), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return True
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.path(temp))

    def remove_tree(self, rel: str) -> None:
        """Delete the directory ``rel`` and everything under it (missing is fine)."""
        try:
            if not self.fs.is_local:  # fsspec: no directory marker is left behind
                self.fs.fsspec().rm(self.path(rel), recursive=True)
                return
            self.arrow.delete_dir(self.path(rel))
        except FileNotFoundError:
            pass
        except OSError:
            if self.kind(rel) != pafs.FileType.NotFound:
                raise


_ADVICE = {
    errno.ENOSPC: "the storage is full: free space on it or choose another dst",
    errno.EDQUOT: "a disk quota is exceeded: free space or choose another dst",
    errno.EFBIG: "the file is larger than this process or file system may write: lower target_file_size",
    errno.EROFS: "the file system is read-only: choose another dst",
    errno.EACCES: "permission denied: choose a dst this process may write",
    errno.ENAMETOOLONG: "a name is longer than the file system allows (a long partition value?)",
}


@contextlib.contextmanager
def writing(dest: Destination, rel: str) -> Iterator[None]:
    """Turn an ``OSError`` while writing ``rel`` into a :class:`ReshardError` naming it.

    The message says what the error means (a full disk, a quota, a read-only file
    system) and that the same command resumes the job once it is fixed.
    """
    try:
        yield
    except OSError as exc:
        advice = _ADVICE.get(exc.errno or 0, "check that dst is writable")
        raise ReshardError(
            f"writing {dest.display(rel)!r} failed ({type(exc).__name__}: {exc}): {advice}; then run the "
            "same command again: it keeps the shards already written"
        ) from exc


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with exactly ``schema``'s columns and types (in that order)."""
    if batch.schema.equals(schema):
        return batch
    columns = [batch.column(name) for name in schema.names]
    out = pa.RecordBatch.from_arrays(columns, names=schema.names)
    return out if out.schema.equals(schema) else out.cast(schema)


class ShardWriter:
    """Writes batches into one Parquet file in row groups of exactly ``row_group_rows`` rows.

    Incoming batches of any size are buffered up to one row group (the last one takes the
    rest), so a shard made of many small source files still gets full row groups.

    Args:
        sink: A writable stream.
        schema: The file's schema.
        compression: A Parquet codec name (``"none"`` for none).
        row_group_rows: Rows per row group.
        sorting: Columns the rows are sorted by (recorded in the footer), or ``()``.
    """

    def __init__(
        self,
        sink: Any,
        schema: pa.Schema,
        *,
        compression: str,
        row_group_rows: int,
        sorting: Sequence[str] = (),
    ) -> None:
        self._schema = schema
        self._row_group_rows = max(1, row_group_rows)
        self._collected: list[pq.FileMetaData] = []
        sorting_columns = (
            [pq.SortingColumn(schema.get_field_index(name)) for name in sorting] if sorting else None
        )
        self._writer = pq.ParquetWriter(
            sink,
            schema,
            compression=compression,  # type: ignore[arg-type]
            sorting_columns=sorting_columns,
            metadata_collector=self._collected,
        )
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        """Add rows; full row groups are written as they fill."""
        if batch.num_rows == 0:
            return
        self._buffer.append(conform(batch, self._schema))
        self._buffered += batch.num_rows
        self.rows += batch.num_rows
        if self._buffered >= self._row_group_rows:
            self._flush(final=False)

    def write_table(self, table: pa.Table) -> None:
        """Add every row of ``table``."""
        for batch in table.to_batches():
            self.write(batch)

    def _flush(self, final: bool) -> None:
        if not self._buffer:
            return
        table = pa.Table.from_batches(self._buffer, schema=self._schema)
        whole = table.num_rows if final else table.num_rows - table.num_rows % self._row_group_rows
        if whole:
            self._writer.write_table(table.slice(0, whole), row_group_size=self._row_group_rows)
        rest = table.slice(whole)
        self._buffer = rest.combine_chunks().to_batches() if rest.num_rows else []
        self._buffered = rest.num_rows

    def close(self) -> pq.FileMetaData:
        """Write the last row group and the footer; the file's metadata."""
        self._flush(final=True)
        self._writer.close()
        return self._collected[-1]


def write_spill(dest: Destination, rel: str, schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> int:
    """Write ``batches`` as an Arrow IPC file at ``rel`` (atomically); its size in bytes."""
    temp = dest.temp(rel)
    with writing(dest, rel):
        with dest.open_output(temp) as out:
            with pa.ipc.new_file(out, schema) as writer:
                for batch in batches:
                    writer.write_batch(batch)
            size = int(out.tell())
        dest.commit(temp, rel)
    return size


def read_spill(
    dest: Destination, rel: str, indices: Sequence[tuple[int, int, int]]
) -> Iterator[pa.RecordBatch]:
    """Rows ``[offset, offset + rows)`` of the given record batches of a spill file."""
    with dest.arrow.open_input_file(dest.path(rel)) as f:
        reader = pa.ipc.open_file(f)
        for index, offset, rows in indices:
            batch = reader.get_batch(index)
            yield batch.slice(offset, rows)
