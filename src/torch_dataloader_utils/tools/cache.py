"""``cache``: what a node-local ``data_cache`` holds, and clearing it.

``show`` lists the cached files (URL, size, version as planned), their entries and bytes,
and the total against an optional limit; ``clear`` removes every entry. Both are safe
while jobs read the cache: a job only misses what was removed, and fetches it again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from torch_dataloader_utils.errors import ConfigError
from torch_dataloader_utils.runtime.report import size
from torch_dataloader_utils.storage.cache import RangeCache

__all__ = ["CacheFile", "CacheReport", "clear_cache", "inspect_cache"]


@dataclass(frozen=True)
class CacheFile:
    """One file version in the cache.

    Attributes:
        url: The file.
        size: Its size, as planned.
        version: Its modification time or ETag, as planned.
        store: The store its bytes came from (endpoint, account or filesystem; no secrets).
        entries: Ranges cached.
        disk_bytes: Bytes they take on disk.
        last_used: Seconds since the epoch of the latest use of any of its ranges.
    """

    url: str
    size: int | None
    version: str | None
    store: str | None
    entries: int
    disk_bytes: int
    last_used: float


@dataclass(frozen=True)
class CacheReport:
    """What a cache directory holds (:func:`inspect_cache`)."""

    directory: str
    files: tuple[CacheFile, ...] = ()
    recorded_bytes: int = 0
    limit: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def entries(self) -> int:
        """Ranges cached, all files together."""
        return sum(f.entries for f in self.files)

    @property
    def disk_bytes(self) -> int:
        """Bytes the entries take on disk."""
        return sum(f.disk_bytes for f in self.files)

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON-ready)."""
        return {
            "directory": self.directory,
            "files": [f.__dict__ for f in self.files],
            "entries": self.entries,
            "disk_bytes": self.disk_bytes,
            "recorded_bytes": self.recorded_bytes,
            "limit": self.limit,
        }

    def describe(self, top: int = 20) -> str:
        """A readable report: totals, then the ``top`` largest files."""
        if not self.files:
            return f"data_cache {self.directory!r}: empty"
        limit = (
            ""
            if self.limit is None
            else f" of {size(self.limit)} ({100 * self.disk_bytes / self.limit:.1f}%)"
        )
        lines = [
            f"data_cache {self.directory!r}: {len(self.files):,} files, {self.entries:,} ranges, "
            f"{size(self.disk_bytes)} on disk{limit}",
        ]
        largest = sorted(self.files, key=lambda f: f.disk_bytes, reverse=True)[:top]
        for f in largest:
            store = f"  ({f.store})" if f.store else ""
            lines.append(f"  {size(f.disk_bytes):>10}  {f.entries:>6} ranges  {f.url}{store}")
        if len(self.files) > top:
            lines.append(f"  ... and {len(self.files) - top:,} more files")
        return "\n".join(lines)


def _open(directory: str) -> RangeCache:
    directory = os.path.expanduser(directory)
    if not os.path.isdir(directory):
        raise ConfigError(f"data_cache directory {directory!r} does not exist; pass the data_cache= of a job")
    return RangeCache(directory, limit=1)


def inspect_cache(directory: str, limit: int | None = None) -> CacheReport:
    """What ``directory`` (a ``data_cache``) holds; ``limit``: its ``data_cache_size``, for the share used.

    Raises:
        ConfigError: the directory does not exist.
    """
    cache = _open(directory)
    files = []
    for source, entries in cache.entries():
        if not entries:
            continue
        files.append(
            CacheFile(
                url=str(source.get("url", "?")),
                size=source.get("size"),
                version=source.get("version"),
                store=source.get("store"),
                entries=len(entries),
                disk_bytes=sum(e.disk_bytes for e in entries),
                last_used=max(e.mtime for e in entries),
            )
        )
    files.sort(key=lambda f: f.url)
    return CacheReport(cache.directory, tuple(files), cache.recorded_usage(), limit)


def clear_cache(directory: str) -> int:
    """Remove every entry of ``directory`` (a ``data_cache``); returns the bytes they took.

    Raises:
        ConfigError: the directory does not exist, or holds no cache.
    """
    return _open(directory).clear()


def run_cache(directory: str, action: str, *, limit: int | None = None, as_json: bool = False) -> str:
    """The ``cache`` command's output for ``action`` (``"show"`` or ``"clear"``)."""
    if action == "clear":
        freed = clear_cache(directory)
        if as_json:
            return json.dumps({"directory": directory, "cleared_bytes": freed})
        return f"data_cache {directory!r}: cleared {size(freed)}"
    report = inspect_cache(directory, limit)
    return json.dumps(report.as_dict(), indent=2) if as_json else report.describe()
