"""0.2.0's file metadata inputs: ``DataFileInfo`` and ``IcebergDataFileInfo``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch_dataloader_utils.errors import ConfigError
from torch_dataloader_utils.plan.types import FileInfo

__all__ = ["DataFileInfo", "IcebergDataFileInfo", "file_paths"]


class _FileInfoKind(type):
    """``isinstance`` for 0.2.0's file types also recognizes this library's file metadata.

    Custom split strategies receive this library's :class:`FileInfo` (it has 0.2.0's
    ``file_size`` and ``record_count``), and for an Iceberg table a subclass with
    ``partition`` and ``snapshot_id``; a 0.2.0 strategy that checks
    ``isinstance(f, IcebergDataFileInfo)`` to read ``f.partition`` keeps working.
    """

    def __instancecheck__(cls, obj: object) -> bool:
        if type.__instancecheck__(cls, obj):
            return True
        if not isinstance(obj, FileInfo):
            return False
        if cls.__name__ == "IcebergDataFileInfo":
            return hasattr(obj, "snapshot_id") and hasattr(obj, "partition")
        return True


@dataclass
class DataFileInfo(metaclass=_FileInfoKind):
    """A data file, as 0.2.0 described one (``StructuredDataset(files=[...])``).

    Only ``path`` is used: sizes and row counts are read from the files' own metadata
    when the dataset is built, so stale values here cannot mislead the plan.

    ``isinstance(f, DataFileInfo)`` is also true of the file metadata a custom split
    strategy receives (this library's ``FileInfo``, with ``path``, ``file_size`` and
    ``record_count``).

    Attributes:
        path: The file's path or URL.
        file_size: Size in bytes, if known (informative).
        record_count: Rows, if known (informative).
    """

    path: str
    file_size: int | None = None
    record_count: int | None = None


@dataclass
class IcebergDataFileInfo(DataFileInfo):
    """A data file of an Iceberg table, with its partition and snapshot (0.2.0).

    ``isinstance(f, IcebergDataFileInfo)`` is also true of the files an
    ``IcebergDataset`` passes to a custom split strategy, whose ``partition`` maps each
    partition field's name to the file's value (``None`` when unpartitioned).

    Attributes:
        partition: Partition values by partition field name, if known.
        snapshot_id: The snapshot the file was listed from, if known.
    """

    partition: Mapping[str, Any] | None = None
    snapshot_id: int | None = None


def file_paths(files: Sequence[object]) -> list[str]:
    """The paths of ``files``: ``DataFileInfo`` objects (or anything with a ``path``) or strings.

    Raises:
        ConfigError: an item is neither a path string nor has a string ``path``.
    """
    if isinstance(files, (str, bytes)) or not isinstance(files, Sequence):
        raise ConfigError(
            f"files={files!r} must be a list of DataFileInfo (or paths); pass a single path as path="
        )
    paths = []
    for item in files:
        path = item if isinstance(item, str) else getattr(item, "path", None)
        if not isinstance(path, str):
            raise ConfigError(f"files= holds {item!r}; expected DataFileInfo(path=...) or a path string")
        paths.append(path)
    if not paths:
        raise ConfigError("files=[] holds no file; pass at least one DataFileInfo(path=...)")
    return paths
