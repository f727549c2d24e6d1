"""The training ledger's records: their JSON lines, version 1, parsed once into frozen values.

A ledger is a directory (``ledger=DIR``). Every rank appends JSON lines to a file of
its own, ``rank-<rank>.jsonl`` (5 digits), and nothing per step:

* ``{"ledger": 1, "kind": "pass", ...}`` (:class:`PassRecord`) when a pass starts: which
  rows every later batch of the pass holds follows from it (:mod:`.lineage`);
* ``{"ledger": 1, "kind": "skip", ...}`` (:class:`SkipRecord`) when a reading process
  removed the rows of units that did not decode (``on_bad_data='skip'`` without padding),
  before the loop receives a batch after them: the rows that follow shift;
* ``{"ledger": 1, "kind": "end", ...}`` (:class:`EndRecord`) when a pass ends, with the
  batches the loop received.

What passes share is written once, content-addressed, next to the rank files and named
by the records: a ``config-<hash>.json`` (the source and the options, secrets left out),
a ``files-<digest>.npz`` per files digest (the files' identities and row layout), and a
``state-<hash>.json`` per resume state a pass started from.

A reader of version 1 ignores keys it does not know (later releases may add some); a
record of another version is an error. Pure: stdlib only.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, NoReturn

from torch_dataloader_utils.errors import LedgerError, ResumeStateError

__all__ = [
    "LEDGER_VERSION",
    "ORDERS",
    "EndRecord",
    "PassRecord",
    "Record",
    "SkipRecord",
    "merged_steps",
    "pack_runs",
    "parse_steps",
    "parse_record",
    "rank_file",
    "to_line",
    "unpack_runs",
]

LEDGER_VERSION = 1
"""Value of every record's ``"ledger"`` key."""

ORDERS = ("planned", "elastic", "mixed")
"""The orders a pass may be read in (:mod:`torch_dataloader_utils.runtime.orders`)."""


def rank_file(rank: int) -> str:
    """The name of rank ``rank``'s record file in a ledger directory."""
    return f"rank-{rank:05d}.jsonl"


def _fail(where: str, what: str, value: object) -> NoReturn:
    raise LedgerError(f"ledger record {where}: {what}, got {value!r:.80}")


def _int(value: object, where: str, lo: int = 0) -> int:
    if type(value) is not int or value < lo:
        _fail(where, f"must be an int >= {lo}", value)
    return value


def _opt_int(value: object, where: str, lo: int = 0) -> int | None:
    return None if value is None else _int(value, where, lo)


def _str(value: object, where: str) -> str:
    if not isinstance(value, str):
        _fail(where, "must be a string", value)
    return value


def _names(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        _fail(where, "must be a list of strings", value)
    return tuple(value)


@dataclass(frozen=True, slots=True)
class PassRecord:
    """A pass started on one rank: enough to know every batch it delivers.

    Attributes:
        rank: The rank.
        num_ranks: Ranks of the job.
        num_workers: DataLoader workers reading the pass (0: the main process).
        epoch: The epoch read.
        step: The loader's count of batches handed out before the pass (its first batch
            is this step).
        order: ``"planned"``, ``"elastic"`` or ``"mixed"``.
        groups: Most batches a worker sends in one hand-off group (``None``: no workers).
        config: The config file: the source and the options.
        files: The files manifest of every source (one file per distinct files digest).
        start: The resume state the pass started from (``None``: the epoch's start).
        time: Seconds since the Unix epoch when the pass started.
        library: The library version that wrote it.
    """

    KIND: ClassVar[str] = "pass"

    rank: int
    num_ranks: int
    num_workers: int
    epoch: int
    step: int
    order: str
    groups: int | None
    config: str
    files: tuple[str, ...]
    start: str | None
    time: float
    library: str

    @classmethod
    def parse(cls, value: Mapping[str, Any], where: str) -> PassRecord:
        """Check and read a record's JSON value."""
        order = _str(value.get("order"), f"{where} order")
        if order not in ORDERS:
            _fail(f"{where} order", f"must be one of {', '.join(ORDERS)}", order)
        start = value.get("start")
        time = value.get("time")
        if not isinstance(time, (int, float)) or isinstance(time, bool):
            _fail(f"{where} time", "must be a number", time)
        record = cls(
            rank=_int(value.get("rank"), f"{where} rank"),
            num_ranks=_int(value.get("num_ranks"), f"{where} num_ranks", 1),
            num_workers=_int(value.get("num_workers"), f"{where} num_workers"),
            epoch=_int(value.get("epoch"), f"{where} epoch"),
            step=_int(value.get("step"), f"{where} step"),
            order=order,
            groups=_opt_int(value.get("groups"), f"{where} groups", 1),
            config=_str(value.get("config"), f"{where} config"),
            files=_names(value.get("files"), f"{where} files"),
            start=None if start is None else _str(start, f"{where} start"),
            time=float(time),
            library=_str(value.get("library", ""), f"{where} library"),
        )
        if record.rank >= record.num_ranks:
            _fail(f"{where} rank", f"must be below num_ranks={record.num_ranks}", record.rank)
        return record


@dataclass(frozen=True, slots=True)
class SkipRecord:
    """Rows a reading process removed from its planned stream (units that did not decode).

    In JSON one run is ``"at"`` and ``"rows"``; several (a row mix scatters a unit's rows
    over many places) are ``"runs"``: the positions' gaps and the runs' lengths as
    little-endian unsigned varints, alternately, zlib-compressed, in base64 (a few bytes a
    run).

    Attributes:
        rank: The rank.
        step: The step the pass started at (which pass of the rank).
        worker: The reading process (DataLoader worker id; 0 in the main process).
        runs: ``(position, rows)`` of every run removed, sorted: the position of its first
            row in the worker's planned stream of the pass, and its rows.
    """

    KIND: ClassVar[str] = "skip"

    rank: int
    step: int
    worker: int
    runs: tuple[tuple[int, int], ...]

    @classmethod
    def parse(cls, value: Mapping[str, Any], where: str) -> SkipRecord:
        """Check and read a record's JSON value."""
        if "runs" in value:
            runs = unpack_runs(_str(value.get("runs"), f"{where} runs"), f"{where} runs")
        else:
            runs = ((_int(value.get("at"), f"{where} at"), _int(value.get("rows"), f"{where} rows", 1)),)
        return cls(
            rank=_int(value.get("rank"), f"{where} rank"),
            step=_int(value.get("step"), f"{where} step"),
            worker=_int(value.get("worker"), f"{where} worker"),
            runs=runs,
        )

    def to_json(self) -> dict[str, Any]:
        """The record's JSON fields (one run in clear, several packed)."""
        out: dict[str, Any] = {"rank": self.rank, "step": self.step, "worker": self.worker}
        if len(self.runs) == 1:
            out["at"], out["rows"] = self.runs[0]
        else:
            out["runs"] = pack_runs(self.runs)
        return out


def _varints(values: list[int]) -> bytes:
    out = bytearray()
    for v in values:
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def pack_runs(runs: Sequence[tuple[int, int]]) -> str:
    """``(position, rows)`` runs, sorted, as :class:`SkipRecord` packs them."""
    flat: list[int] = []
    end = 0
    for at, rows in runs:
        flat.extend((at - end, rows))
        end = at + rows
    return base64.b64encode(zlib.compress(_varints(flat), 9)).decode()


def unpack_runs(text: str, where: str = "runs") -> tuple[tuple[int, int], ...]:
    """The runs :func:`pack_runs` packed.

    Raises:
        LedgerError: not such a value.
    """
    try:
        data = zlib.decompress(base64.b64decode(text, validate=True))
    except (ValueError, zlib.error):
        _fail(where, "must be runs packed by pack_runs", text)
    flat: list[int] = []
    value = shift = 0
    for byte in data:
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            flat.append(value)
            value = shift = 0
    if shift or len(flat) % 2:
        _fail(where, "must be runs packed by pack_runs", text)
    runs, end = [], 0
    for gap, rows in zip(flat[::2], flat[1::2], strict=True):
        runs.append((end + gap, rows))
        end += gap + rows
    return tuple(runs)


@dataclass(frozen=True, slots=True)
class EndRecord:
    """A pass ended (ran to its end, or was left early).

    Attributes:
        rank: The rank.
        step: The step the pass started at.
        batches: Batches the loop received in the pass.
        completed: It ran to its end.
    """

    KIND: ClassVar[str] = "end"

    rank: int
    step: int
    batches: int
    completed: bool

    @classmethod
    def parse(cls, value: Mapping[str, Any], where: str) -> EndRecord:
        """Check and read a record's JSON value."""
        completed = value.get("completed")
        if type(completed) is not bool:
            _fail(f"{where} completed", "must be true or false", completed)
        return cls(
            rank=_int(value.get("rank"), f"{where} rank"),
            step=_int(value.get("step"), f"{where} step"),
            batches=_int(value.get("batches"), f"{where} batches"),
            completed=completed,
        )


Record = PassRecord | SkipRecord | EndRecord
_KINDS: dict[str, type[PassRecord] | type[SkipRecord] | type[EndRecord]] = {
    k.KIND: k for k in (PassRecord, SkipRecord, EndRecord)
}


def to_line(record: Record) -> str:
    """The record as one JSON line (with its newline)."""
    if isinstance(record, SkipRecord):
        fields_ = record.to_json()
    else:
        fields_ = asdict(record)
        for f in fields(record):
            if isinstance(fields_[f.name], tuple):
                fields_[f.name] = list(fields_[f.name])
    value = {"ledger": LEDGER_VERSION, "kind": record.KIND, **fields_}
    return json.dumps(value, separators=(",", ":"), allow_nan=False) + "\n"


def parse_record(line: str, where: str) -> Record:
    """One line of a rank file, checked.

    Raises:
        LedgerError: not a record of this version, or a field of the wrong type.
    """
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise LedgerError(f"ledger record {where} is not JSON ({exc}); the file was damaged") from None
    if not isinstance(value, dict):
        _fail(where, "must be a JSON object", value)
    version = value.get("ledger")
    if version != LEDGER_VERSION:
        raise LedgerError(
            f"ledger record {where} has version {version!r}; this release reads version {LEDGER_VERSION} "
            "(read it with the release that wrote it)"
        )
    kind = _KINDS.get(value.get("kind"))  # type: ignore[arg-type]
    if kind is None:
        _fail(f"{where} kind", f"must be one of {', '.join(sorted(_KINDS))}", value.get("kind"))
    return kind.parse(value, where)


def parse_steps(value: object, where: str) -> dict[int, int] | None:
    """A resume state's ``steps``: ``{"<rank>": batches handed out}`` (``None`` when absent).

    The training ledger's step count of every saving rank (a resumed job counts on).

    Raises:
        ResumeStateError: not such a mapping.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ResumeStateError(f"resume state field {where} must map ranks to steps, got {value!r:.60}")
    out: dict[int, int] = {}
    for key, n in value.items():
        if not isinstance(key, str) or not key.isdigit() or type(n) is not int or n < 0:
            raise ResumeStateError(
                f"resume state field {where} must map ranks to steps >= 0, got {key!r}: {n!r:.30}"
            )
        out[int(key)] = n
    return out


def merged_steps(parts: Sequence[Mapping[int, int] | None]) -> dict[int, int] | None:
    """Every saving rank's ``steps``, united (``None`` when no state had them)."""
    if all(p is None for p in parts):
        return None
    out: dict[int, int] = {}
    for part in parts:
        out.update(part or {})
    return out
