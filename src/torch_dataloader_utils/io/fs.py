"""Filesystem resolution: fsspec for URLs, listing and ``storage_options``; pyarrow for bytes.

A :class:`FileSystemSpec` is a picklable value (protocol + storage options). Clients are
built from it lazily, once per process: a client created in the parent is never used
in a forked DataLoader worker (s3fs, for one, refuses to be used after fork).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pyarrow.fs as pafs

__all__ = ["FileSystemSpec", "resolve"]

_LOCAL = frozenset({"file", "local"})
_CLIENTS: dict[tuple[int, str, str], Any] = {}


@dataclass(frozen=True)
class FileSystemSpec:
    """Which filesystem to use, as plain values.

    Attributes:
        protocol: fsspec protocol (``"file"``, ``"s3"``, ``"memory"``, ...).
        storage_options: Keyword arguments for the fsspec filesystem.
    """

    protocol: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_local(self) -> bool:
        """Whether paths are on the local disk."""
        return self.protocol in _LOCAL

    def _key(self, kind: str) -> tuple[int, str, str]:
        return (os.getpid(), kind, repr((self.protocol, sorted(self.storage_options.items()))))

    def fsspec(self) -> fsspec.AbstractFileSystem:
        """This process's fsspec filesystem (listing, ``open``)."""
        key = self._key("fsspec")
        client = _CLIENTS.get(key)
        if client is None:
            # skip_instance_cache: never reuse an instance that came over a fork.
            client = fsspec.filesystem(self.protocol, skip_instance_cache=True, **self.storage_options)
            _CLIENTS[key] = client
        return client

    def arrow(self) -> pafs.FileSystem:
        """This process's pyarrow filesystem, for reading data and footers."""
        key = self._key("arrow")
        client = _CLIENTS.get(key)
        if client is None:
            if self.is_local:
                client = pafs.LocalFileSystem()
            else:
                client = pafs.PyFileSystem(pafs.FSSpecHandler(self.fsspec()))  # type: ignore[abstract]
            _CLIENTS[key] = client
        return client

    def display(self, path: str) -> str:
        """``path`` as a URL a user recognizes (with its scheme when not local)."""
        if self.is_local:
            return path
        return f"{self.protocol}://{path}"


def resolve(path: str, storage_options: Mapping[str, Any] | None = None) -> tuple[FileSystemSpec, str]:
    """Split a path or URL into its filesystem spec and the filesystem's own path."""
    options = dict(storage_options or {})
    fs, stripped = fsspec.core.url_to_fs(path, **options)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in _LOCAL:
        stripped = os.path.abspath(stripped)
        protocol = "file"
    return FileSystemSpec(protocol, options), stripped
