"""Filesystems for Iceberg tables, built per process from the catalog's properties.

An :class:`IcebergFileSystem` is a picklable value (the table's FileIO properties:
``s3.endpoint``, ``s3.access-key-id``, ...). Every process (each DataLoader worker)
builds its own pyarrow filesystems from it on first use, so credentials given only in
``catalog_config`` reach every worker, and no client crosses a fork.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from torch_dataloader_utils.storage.redact import RedactedRepr
from torch_dataloader_utils.upstream.pyiceberg import arrow_filesystem, parse_location

__all__ = ["IcebergFileSystem"]

_CLIENTS: dict[tuple[int, str, str, str], pafs.FileSystem] = {}


@dataclass(frozen=True, repr=False)
class IcebergFileSystem(RedactedRepr):
    """Resolves Iceberg locations (``file://``, ``s3://``, ...) to a pyarrow filesystem and path.

    Attributes:
        properties: The table's FileIO properties (catalog config, table properties and
            any credentials the catalog vended).
    """

    properties: Mapping[str, str] = field(default_factory=dict)

    def resolve(self, location: str) -> tuple[pafs.FileSystem, str]:
        """This process's filesystem for ``location`` and the path inside it."""
        scheme, netloc, path = parse_location(location, self.properties)
        key = (os.getpid(), scheme, netloc, repr(sorted(self.properties.items())))
        client = _CLIENTS.get(key)
        if client is None:
            client = arrow_filesystem(scheme, netloc, self.properties)
            _CLIENTS[key] = client
        return client, path

    def __repr__(self) -> str:
        # Never print credentials.
        return f"IcebergFileSystem(<{len(self.properties)} properties>)"
