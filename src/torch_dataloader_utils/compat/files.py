"""0.2.0's file metadata inputs: ``DataFileInfo`` and ``IcebergDataFileInfo``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch_dataloader_utils.errors import ConfigError

__all__ = ["DataFileInfo", "IcebergDataFileInfo", "file_paths"]


@dataclass
class DataFileInfo:
    """A data file, as 0.2.0 described one (``StructuredDataset(files=[...])``).

    Only ``path`` is used: sizes and row counts are read from the files' own metadata
    when the dataset is built, so stale values here cannot mislead the plan.

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

    Attributes:
        partition: Partition values, if known.
        snapshot_id: The snapshot the file was listed from, if known.
    """

    partition: dict[str, str] | None = None
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
