"""Writing the training ledger (``ledger=DIR``): one record per pass, the rest content-addressed.

The record format is in :mod:`torch_dataloader_utils.plan.ledger`. Here: the files a
ledger directory holds besides the rank files, and the writer the loader calls.

* ``config-<hash>.json``: the source (path or Iceberg table, pinned to the snapshot
  read) and every option that shapes the order or the conversion, as the keywords a
  user passes (:func:`recorded_keywords`), with the values of secret options
  (credentials in ``storage_options`` and ``catalog_config``, passwords in URLs) left
  out as ``"***"``; values a ledger cannot hold (a ``collate_fn``, a filesystem object,
  a custom split strategy) are recorded by name only. Also the plan's fingerprint (files
  digest, rows, bytes, the options a resume state is tied to) and the output schema.
* ``files-<files digest>.npz``: the dataset's files as the plan sees them (NumPy
  columns: paths, sizes, modification times, rows, row groups, text record counts,
  Iceberg deleted positions), written once per distinct files digest, so a million
  files are not repeated per pass. Replay plans from it without listing or footers.
* ``state-<hash>.json``: a resume state a pass started from (every rank's, merged),
  written once.

Files are written whole and atomically (a temporary file renamed over the name). In a
shared directory rank 0 writes the shared files; with a per-rank path (a ``{rank}`` in
``ledger``) every rank writes its own next to its records.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from torch_dataloader_utils.config import FeaturePack, SequencePack
from torch_dataloader_utils.errors import ConfigError, LedgerError
from torch_dataloader_utils.plan.ledger import (
    EndRecord,
    PassRecord,
    SkipRecord,
    parse_steps,
    rank_file,
    to_line,
)
from torch_dataloader_utils.plan.schedule import recorded_weights
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.storage.atomic import write_atomically
from torch_dataloader_utils.storage.redact import HIDDEN, is_secret, redact
from torch_dataloader_utils.upstream.pyarrow import expression_bytes, expression_from_bytes

__all__ = [
    "DROPPED_OPTIONS",
    "LedgerWriter",
    "PassLedger",
    "Unrecorded",
    "decode",
    "describe",
    "encode",
    "ledger_paths",
    "library_version",
    "merge_runs",
    "order_name",
    "pass_start",
    "read_json",
    "read_manifest",
    "recorded_keywords",
    "recorded_source",
    "source_config",
    "write_manifest",
]

DROPPED_OPTIONS = frozenset(
    {
        # Where the job kept things of its own, not what the rows or their order are.
        "metadata_cache",
        "metadata_cache_check",
        "count_cache_dir",
        "data_cache",
        "data_cache_size",
        "data_cache_prefetch",
        "quarantine_dir",
        "as_of",  # the snapshot read is recorded instead
        "decode_ahead",
        "verify_plan",
        "row_mixing",  # row_interleave by its former name (the same value)
    }
)
"""Options a config file does not record: they change neither the rows nor their order."""

_TAG = "$"


@dataclasses.dataclass(frozen=True)
class Unrecorded:
    """An option value a ledger cannot hold (a function, an object): recorded by name only.

    Attributes:
        name: The option.
        shown: Its ``repr`` (secrets hidden), for messages.
    """

    name: str
    shown: str


def encode(value: Any, name: str = "") -> Any:
    """An option value as JSON (see the module): secrets hidden, objects by name only."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return redact(value) if isinstance(value, str) else value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {
            str(k): HIDDEN if is_secret(k) and v is not None else encode(v, str(k)) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [encode(v, name) for v in value]
    if isinstance(value, (FeaturePack, SequencePack)):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if "dtype" in fields:
            fields["dtype"] = str(fields["dtype"]).removeprefix("torch.")
        return {_TAG: type(value).__name__, **{k: encode(v, k) for k, v in fields.items()}}
    if isinstance(value, pa.Schema):
        return {_TAG: "schema", "ipc": base64.b64encode(value.serialize().to_pybytes()).decode()}
    if type(value).__name__ == "Expression" and type(value).__module__.startswith("pyarrow"):
        data = base64.b64encode(expression_bytes(value)).decode()
        return {_TAG: "expression", "ipc": data, "text": str(value)}
    return {_TAG: "unrecorded", "name": name, "repr": str(redact(repr(value)))[:200]}


def decode(value: Any) -> Any:
    """The option value :func:`encode` recorded (an :class:`Unrecorded` for objects)."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(_TAG)
    if tag is None:
        return {k: decode(v) for k, v in value.items()}
    if tag == "schema":
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(value["ipc"])))
    if tag == "expression":
        return expression_from_bytes(base64.b64decode(value["ipc"]))
    if tag == "FeaturePack":
        return FeaturePack(**{k: decode(v) for k, v in value.items() if k != _TAG})
    if tag == "SequencePack":
        return SequencePack(**{k: decode(v) for k, v in value.items() if k != _TAG})
    if tag == "unrecorded":
        return Unrecorded(str(value.get("name", "")), str(value.get("repr", "")))
    raise LedgerError(
        f"a ledger config holds a value of unknown type {tag!r}; it was written by a newer release"
    )


_OPTION_GROUPS = ("split", "shuffle", "batching", "output", "counting", "fetch", "bad_data")
"""The config objects of :class:`~.options.Options` whose fields a config file records."""


def _changed(config: Any, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The fields of a config object that differ from their defaults, encoded."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        if f.name in DROPPED_OPTIONS or f.name in skip:
            continue
        value = getattr(config, f.name)
        if f.default is not dataclasses.MISSING and _same(value, f.default):
            continue
        if f.default_factory is not dataclasses.MISSING and _same(value, f.default_factory()):
            continue
        out[f.name] = encode(value, f.name)
    return out


def _same(value: object, default: object) -> bool:
    """``value == default`` where that is a plain bool (an expression compares into an expression)."""
    if value is None or default is None:
        return value is default
    try:
        same = value == default
    except Exception:
        return False
    return same if isinstance(same, bool) else False


def recorded_keywords(options: Any) -> dict[str, Any]:
    """The options that differ from their defaults, as the keywords a user passes (encoded).

    World and DataLoader options are left out (a pass record holds the world and the
    workers); so are :data:`DROPPED_OPTIONS`.
    """
    out: dict[str, Any] = {}
    for group in _OPTION_GROUPS:
        out.update(_changed(getattr(options, group)))
    return out


def recorded_source(path: Any, source: Any, snapshot_id: int | None = None) -> dict[str, Any]:
    """A source as a config file records it: ``{"type", "path" | "table", "keywords"}``.

    ``source`` is a ``FileSourceConfig`` or an ``IcebergSourceConfig``; an Iceberg table
    is pinned to ``snapshot_id``, the snapshot read (its ``storage_options`` are already
    in ``catalog_config``).
    """
    if hasattr(source, "table"):
        keywords = _changed(source, frozenset({"table", "storage_options", "snapshot_id"}))
        return {"type": "iceberg", "table": source.table, "snapshot_id": snapshot_id, "keywords": keywords}
    keywords = _changed(source, frozenset({"format"}))
    return {"type": "files", "path": encode(path), "format": source.format.value, "keywords": keywords}


def ledger_paths(ledger: str, rank: int) -> tuple[Path, Path, bool]:
    """``(rank file, directory of the shared files, whether this rank writes them)``.

    ``ledger`` is a directory (every rank's file in it; rank 0 writes the shared files),
    or a path holding ``{rank}`` (a directory or file per rank, each with its own).

    Raises:
        ConfigError: ``ledger`` is a URL (a ledger is appended to: a local or shared file system).
    """
    if "://" in ledger:
        raise ConfigError(
            f"ledger={redact(ledger)!r} is a URL; a ledger is appended to at every pass, which object "
            "stores cannot do: pass a local or shared directory (e.g. on the checkpoint volume)"
        )
    if "{rank}" in ledger:
        target = Path(ledger.replace("{rank}", str(rank)))
        if target.suffix == ".jsonl":
            return target, target.parent, True
        return target / rank_file(rank), target, True
    root = Path(ledger)
    return root / rank_file(rank), root, rank == 0


def merge_runs(runs: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """``(position, rows)`` runs sorted, the touching ones joined."""
    out: list[tuple[int, int]] = []
    for at, rows in sorted(runs):
        if out and at <= out[-1][0] + out[-1][1]:
            start = out[-1][0]
            out[-1] = (start, max(out[-1][0] + out[-1][1], at + rows) - start)
        elif rows > 0:
            out.append((at, rows))
    return tuple(out)


def _canonical(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def write_manifest(table: FileTable, path: Path) -> None:
    """Write ``table``'s columns to ``path`` (an uncompressed ``.npz``), atomically."""
    write_atomically(path, lambda f: np.savez(f, **table.to_arrays()))  # type: ignore[arg-type]


def read_manifest(path: Path) -> FileTable:
    """The files table a manifest holds.

    Raises:
        LedgerError: the manifest is missing or damaged.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        return FileTable.from_arrays(**arrays)
    except FileNotFoundError:
        raise LedgerError(
            f"the ledger's files manifest {str(path)!r} is missing: copy the whole ledger directory "
            "(the rank files, config-*, files-* and state-* files belong together)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LedgerError(f"the ledger's files manifest {str(path)!r} cannot be read: {exc}") from None


def read_json(path: Path) -> dict[str, Any]:
    """A config or state file of a ledger.

    Raises:
        LedgerError: missing or damaged.
    """
    try:
        value = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise LedgerError(
            f"the ledger's file {str(path)!r} is missing: copy the whole ledger directory"
        ) from None
    except ValueError as exc:
        raise LedgerError(f"the ledger's file {str(path)!r} is damaged: {exc}") from None
    if not isinstance(value, dict):
        raise LedgerError(f"the ledger's file {str(path)!r} is not a JSON object")
    return value


class LedgerWriter:
    """Appends one rank's records, and writes the shared files once (see the module).

    Args:
        ledger: The ``ledger`` option (a directory, or a path with ``{rank}``).
        rank: This rank.
    """

    def __init__(self, ledger: str, rank: int) -> None:
        self.rank = rank
        self.path, self.root, self.writes_shared = ledger_paths(ledger, rank)
        self._written: set[str] = set()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _shared(self, name: str, write: Any) -> str:
        """Write a shared file once (when this rank writes them and it is not there yet)."""
        if name not in self._written:
            target = self.root / name
            if self.writes_shared and not target.exists():
                write(target)
            self._written.add(name)
        return name

    def config(self, config: Mapping[str, Any]) -> str:
        """The name of the config file holding ``config`` (written once)."""
        data = _canonical(config)
        name = f"config-{hashlib.sha256(data).hexdigest()[:24]}.json"
        return self._shared(name, lambda p: write_atomically(p, data))

    def files(self, table: FileTable, digest: str) -> str:
        """The name of the manifest of ``table`` (whose files digest is ``digest``; written once)."""
        return self._shared(f"files-{digest}.npz", lambda p: write_manifest(table, p))

    def state(self, state: Mapping[str, Any]) -> str:
        """The name of the file holding the resume state ``state`` (written once)."""
        data = _canonical(state)
        name = f"state-{hashlib.sha256(data).hexdigest()[:24]}.json"
        return self._shared(name, lambda p: write_atomically(p, data))

    def _append(self, record: PassRecord | SkipRecord | EndRecord) -> None:
        line = to_line(record).encode()
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)

    def begin(
        self,
        *,
        config: Mapping[str, Any],
        tables: Sequence[tuple[FileTable, str]],
        num_ranks: int,
        num_workers: int,
        epoch: int,
        step: int,
        order: str,
        groups: int | None,
        start: Mapping[str, Any] | None,
        library: str,
    ) -> PassRecord:
        """A pass starts: its shared files written (once) and its record appended."""
        record = PassRecord(
            rank=self.rank,
            num_ranks=num_ranks,
            num_workers=num_workers,
            epoch=epoch,
            step=step,
            order=order,
            groups=groups,
            config=self.config(config),
            files=tuple(self.files(table, digest) for table, digest in tables),
            start=None if start is None else self.state(start),
            time=round(time.time(), 3),
            library=library,
        )
        self._append(record)
        return record

    def skipped(self, step: int, worker: int, runs: Sequence[tuple[int, int]]) -> None:
        """Worker ``worker``'s planned stream lost the ``(position, rows)`` runs (pass at ``step``)."""
        merged = merge_runs(runs)
        if merged:
            self._append(SkipRecord(rank=self.rank, step=step, worker=worker, runs=merged))

    def end(self, step: int, batches: int, completed: bool) -> None:
        """The pass that started at ``step`` ended after ``batches`` batches."""
        self._append(EndRecord(rank=self.rank, step=step, batches=batches, completed=completed))


def library_version() -> str:
    """The installed library's version (``"unknown"`` from a source tree not installed)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("torch_dataloader_utils")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def source_config(dataset: Any) -> dict[str, Any]:
    """What a config file records of one source (a ``PlannedDataset``): source, options, fingerprint."""
    return {
        "source": dataset.recorded_source,
        "options": recorded_keywords(dataset.options),
        "fingerprint": dataset.fingerprint(),
        "schema": encode(dataset.schema),
        "row_count_issue": dataset.source.row_count_issue,
    }


def describe(dataset: Any) -> tuple[dict[str, Any], list[tuple[FileTable, str]]]:
    """A dataset as a config file records it, and every source's files with their digest.

    One source (a ``PlannedDataset``), or a mix (a ``MixedDataset``): its sources', the
    mix's weights and options.
    """
    members = getattr(dataset, "source_names", None)
    if members is None:
        return source_config(dataset), [(dataset.file_table, dataset.fingerprint()["files_digest"])]
    sources = dataset.sources
    mix = dataset.mix
    config = {
        "sources": [source_config(m) for m in sources],
        "names": list(dataset.source_names),
        "mix": {
            "weights": recorded_weights(mix.weights),
            "on_exhausted": mix.on_exhausted.value,
            "source_column": mix.source_column,
        },
        "options": recorded_keywords(dataset.options),
        "schema": encode(dataset.schema),
    }
    return config, [(m.file_table, m.fingerprint()["files_digest"]) for m in sources]


def order_name(order: Any) -> str:
    """``"planned"``, ``"elastic"`` or ``"mixed"``: the order a dataset reads in."""
    name = type(order).__name__
    return {"PlannedOrder": "planned", "ElasticOrder": "elastic", "MixedOrder": "mixed"}.get(name, "planned")


def pass_start(order: Any, epoch: int, loaded: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What a pass over ``epoch`` starts from besides the plan: ``None`` for a fresh start.

    A planned or elastic order: the loaded state's segments of this epoch. A mix: the
    state it was loaded from (its epochs are counted from there).
    """
    if order_name(order) == "mixed":
        return None if loaded is None or not order.token else dict(loaded)
    segments = order.live(epoch)
    return {"epoch": epoch, "segments": [s.to_json() for s in segments]} if segments else None


class PassLedger:
    """One dataset's ledger in the main process: a record per pass it starts, and the step count.

    Args:
        ledger: The ``ledger`` option.
        rank: This rank.
    """

    def __init__(self, ledger: str, rank: int) -> None:
        self.writer = LedgerWriter(ledger, rank)
        self.steps = 0
        """Batches handed out before the current pass (the next pass's first step)."""
        self._described: tuple[dict[str, Any], list[tuple[FileTable, str]]] | None = None
        self._open: PassRecord | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_described"] = None  # workers need no copy of the files
        return state

    def begin(
        self, dataset: Any, epoch: int, num_workers: int, groups: int | None, loaded: Mapping[str, Any] | None
    ) -> PassRecord:
        """A pass of ``dataset`` over ``epoch`` starts: its record appended (the shared files written once).

        ``loaded``: the resume state the dataset last loaded, or ``None``.
        """
        if self._described is None:
            self._described = describe(dataset)
        config, tables = self._described
        order = order_name(dataset.order)
        self._open = self.writer.begin(
            config={"ledger": 1, "kind": "config", "order": order, **config},
            tables=tables,
            num_ranks=dataset.world.num_ranks,
            num_workers=num_workers,
            epoch=epoch,
            step=self.steps,
            order=order,
            groups=groups if num_workers > 0 else None,
            start=pass_start(dataset.order, epoch, loaded),
            library=library_version(),
        )
        return self._open

    def steps_at(self, taken: int) -> int:
        """The loader's step count once the loop took ``taken`` batches of the open pass (if any)."""
        return (self._open.step if self._open is not None else self.steps) + taken

    def resume_steps(self, state: Mapping[str, Any], world: Any) -> None:
        """Go on counting where a loaded resume state's ranks stopped (its ``steps``).

        In the world that saved it, each rank takes its own count; in another world every
        rank takes the largest (with equal batches every rank's count is the same).
        """
        steps = parse_steps(state.get("steps"), "state.steps") if isinstance(state, Mapping) else None
        if not steps:
            return
        segments = state.get("segments")
        saved = segments[-1] if isinstance(segments, list) and segments else state.get("world")
        if "num_ranks" in state:  # a mix's state
            saved = state
        same = isinstance(saved, Mapping) and saved.get("num_ranks") == world.num_ranks
        self.steps = steps[world.rank] if same and world.rank in steps else max(steps.values())

    def skipped(self, worker: int, runs: Sequence[tuple[int, int]]) -> None:
        """``(position, rows)`` runs of a worker's planned stream were removed in the open pass."""
        if self._open is not None:
            self.writer.skipped(self._open.step, worker, runs)

    def end(self, batches: int, completed: bool) -> None:
        """The open pass ended after ``batches`` batches; the next one starts after them."""
        record, self._open = self._open, None
        if record is None:
            return
        self.steps = record.step + batches
        self.writer.end(record.step, batches, completed)
