"""pyiceberg (pinned to 0.12): scan planning with equality deletes, and filesystems.

* ``DataScan.plan_files()`` raises ``ValueError`` on a snapshot with equality deletes,
  which this library resolves itself; the manifest entries it plans from (already
  pruned by partition and column statistics) are reachable only through the private
  ``DataScan._plan_manifest_entries()``. An incremental scan reads some commits'
  manifests itself and prunes their entries with the scan planner's private
  evaluators (``entry_filter``).
* The public ``FileIO.new_input(location).open()`` returns a stream, but the readers need
  a pyarrow ``FileSystem`` and a path (footers, ranged reads, ``ParquetFile``);
  ``PyArrowFileIO.parse_location`` and ``fs_by_scheme`` map a location and the catalog's
  properties (endpoint, credentials, region) to exactly that.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow.fs as pafs

__all__ = [
    "arrow_filesystem",
    "entry_filter",
    "manifest_entries",
    "manifest_entries_with_deleted",
    "parse_location",
]


def manifest_entries(scan: Any, manifests: Sequence[Any] | None = None) -> list[Any]:
    """The live manifest entries of a pyiceberg ``DataScan`` (data and delete files).

    ``manifests``: plan from these manifest files of the scan's snapshot only (pruned by
    the scan's filter as usual), instead of all of them.
    """
    if manifests is None:
        groups = scan._plan_manifest_entries()
    else:
        groups = scan._manifest_planner.plan_manifest_entries(list(manifests))
    return [entry for group in groups for entry in group]


def entry_filter(scan: Any) -> Callable[[Any], bool]:
    """The test a pyiceberg ``DataScan`` applies to every data file of a manifest it reads.

    Partition values against the scan's filter projected on the file's partition spec,
    then column metrics (bounds, null counts); ``True`` when the file may hold a row the
    filter keeps.
    """
    planner = scan._manifest_planner
    metrics = planner._build_metrics_evaluator()
    partitions: dict[int, Callable[[Any], bool]] = {}

    def keep(data_file: Any) -> bool:
        spec_id = data_file.spec_id
        if spec_id not in partitions:
            partitions[spec_id] = planner._build_partition_evaluator(spec_id)
        return bool(partitions[spec_id](data_file) and metrics(data_file))

    return keep


def manifest_entries_with_deleted(manifest: Any, io: Any) -> list[Any]:
    """Every entry of one manifest file, those of files it marks deleted included."""
    return list(manifest.fetch_manifest_entry(io, discard_deleted=False))


def parse_location(location: str, properties: Mapping[str, str]) -> tuple[str, str, str]:
    """``(scheme, netloc, path)`` of an Iceberg ``location`` under the catalog's ``properties``."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    scheme, netloc, path = PyArrowFileIO.parse_location(location, dict(properties))
    return scheme, netloc, path


def arrow_filesystem(scheme: str, netloc: str, properties: Mapping[str, str]) -> pafs.FileSystem:
    """A new pyarrow filesystem for ``scheme://netloc`` configured by the catalog's ``properties``."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    return PyArrowFileIO(dict(properties)).fs_by_scheme(scheme, netloc)
