"""The resume state as plain JSON values: its format, fingerprint, checks and merging.

A state is ``{"format", "version", "fingerprint", "epoch", "seed", "world", "segments"}``;
each segment is one interrupted pass over the epoch: ``{"num_ranks", "ranks": {rank:
{"num_workers", "cursors", "done"}}}``. What the segments mean for planning is in
:mod:`.resume`.
"""

from __future__ import annotations

import hashlib
import json
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from torch_dataloader_utils.errors import CheckpointMismatchError, ResumeStateError, StateMismatchError
from torch_dataloader_utils.plan.mixstate import is_mix_state, merge_mixed_states
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import FileInfo

__all__ = [
    "MAX_RANKS",
    "MAX_SEGMENTS",
    "MAX_WORKERS",
    "MAX_WORKER_SLOTS",
    "STATE_FORMAT",
    "STATE_SCHEMA",
    "STATE_VERSION",
    "check_shape",
    "check_state",
    "fingerprint",
    "legacy_files_sha256",
    "merge_states",
    "normalize",
]

STATE_FORMAT = "torch_dataloader_utils.resume"
"""Value of ``state["format"]``."""
STATE_VERSION = 1
"""Value of ``state["version"]``; loading another version is an error."""


def fingerprint(files: Sequence[FileInfo] | FileTable, options: Mapping[str, Any]) -> dict[str, Any]:
    """What a state is tied to: a digest of the files plus the options that shape the plan.

    The files enter as a SHA-256 of their paths, sizes, modification times and row
    counts, computed over the columns of a :class:`~.table.FileTable` (``files_digest``;
    a fraction of a second for a million files), with their number, rows and bytes in
    clear for messages; ``options`` must be JSON values.
    """
    table = files if isinstance(files, FileTable) else FileTable.from_infos(files)
    live = table.live
    return {
        "files_digest": table.digest(),
        "num_files": len(table),
        "rows": int(live[live > 0].sum()),
        "bytes": int(table.size.sum()),
        "options": dict(options),
    }


def legacy_files_sha256(files: Sequence[FileInfo] | FileTable) -> str:
    """The files' digest as states of earlier versions recorded it (``files_sha256``).

    One JSON record per file: computed only to check such a state.
    """
    infos = files.infos if isinstance(files, FileTable) else files
    digest = hashlib.sha256()
    for f in infos:
        digest.update(json.dumps([f.path, f.size, f.mtime, f.num_rows, f.live_rows]).encode())
    return digest.hexdigest()


# -- the schema ---------------------------------------------------------------------------
# A state is validated against this schema before anything is planned or allocated: types
# exactly (no bool for an int, no "yes" for a bool), ranges, and sizes, so a hand-edited or
# damaged state is a ResumeStateError and never a re-read, a skip or a memory blow-up. A
# new field is one line in the object that holds it.

MAX_INT = 2**62
"""Largest integer anywhere in a state (epochs, cursors, counts: well inside int64)."""
MAX_RANKS = 65_536
"""Most ranks a state may describe."""
MAX_WORKERS = 1_024
"""Most DataLoader workers of one rank a state may describe."""
MAX_SEGMENTS = 1_024
"""Most interrupted passes over one epoch a state may hold."""
MAX_WORKER_SLOTS = 2**20
"""Most ``(rank, worker)`` plan slots re-planning a segment may build (ranks x distinct
worker counts): bounds the memory a state can make the planner allocate."""


class _Check:
    """One rule of the schema: ``check(value, where)`` raises :class:`ResumeStateError`."""

    what = "a value"

    def check(self, value: object, where: str) -> None:
        if not self.accepts(value):
            self.fail(value, where)

    def accepts(self, value: object) -> bool:
        return True

    def fail(self, value: object, where: str, what: str | None = None) -> NoReturn:
        raise ResumeStateError(
            f"resume state field {where} must be {what or self.what}, got {_shown(value)}; the "
            "state was edited or damaged: pass what loader.state_dict() returned, unchanged"
        )


class _Int(_Check):
    def __init__(self, lo: int = 0, hi: int = MAX_INT) -> None:
        self.lo, self.hi = lo, hi
        self.what = f"an int in [{lo}, {hi}]"

    def accepts(self, value: object) -> bool:
        return type(value) is int and self.lo <= value <= self.hi


class _Bool(_Check):
    what = "true or false"

    def accepts(self, value: object) -> bool:
        return type(value) is bool


class _Str(_Check):
    what = "a string"

    def accepts(self, value: object) -> bool:
        return type(value) is str and len(value) <= 4096


class _Const(_Check):
    def __init__(self, value: object) -> None:
        self.value = value
        self.what = repr(value)

    def accepts(self, value: object) -> bool:
        return type(value) is type(self.value) and value == self.value


class _Any(_Check):
    """Any JSON value (compared with the dataset's as a whole, e.g. the options)."""


class _List(_Check):
    def __init__(self, item: _Check, max_len: int, length: int | None = None) -> None:
        self.item, self.max_len, self.length = item, max_len, length
        self.what = (
            f"a list of {length} items" if length is not None else f"a list of at most {max_len} items"
        )

    def check(self, value: object, where: str) -> None:
        if not isinstance(value, list) or len(value) > self.max_len:
            self.fail(value, where)
        if self.length is not None and len(value) != self.length:
            self.fail(value, where)
        for i, item in enumerate(value):
            self.item.check(item, f"{where}[{i}]")


class _Object(_Check):
    def __init__(self, required: Mapping[str, _Check], optional: Mapping[str, _Check] | None = None) -> None:
        self.required, self.optional = dict(required), dict(optional or {})
        self.what = "an object with keys " + ", ".join(sorted(self.required))

    def check(self, value: object, where: str) -> None:
        if not isinstance(value, dict):
            self.fail(value, where)
        missing = [k for k in self.required if k not in value]
        if missing:
            self.fail(value, where, f"{self.what} (missing {missing})")
        unknown = [k for k in value if k not in self.required and k not in self.optional]
        if unknown:
            allowed = sorted([*self.required, *self.optional])
            self.fail(value, where, f"an object with keys among {allowed} (unknown {_shown(unknown)})")
        for key, rule in (*self.required.items(), *self.optional.items()):
            if key in value:
                rule.check(value[key], f"{where}.{key}")


class _Ranks(_Check):
    """``{"0": entry, "1": entry, ...}``: keys are ranks written as plain decimals."""

    def __init__(self, entry: _Check) -> None:
        self.entry = entry
        self.what = f"an object of at most {MAX_RANKS} ranks ('0', '1', ...)"

    def check(self, value: object, where: str) -> None:
        if not isinstance(value, dict) or len(value) > MAX_RANKS:
            self.fail(value, where)
        for key, entry in value.items():
            if not (type(key) is str and key.isdigit() and key == str(int(key))):
                self.fail(key, f"{where} key", "a rank written as a plain decimal ('0', '1', ...)")
            self.entry.check(entry, f"{where}[{key!r}]")


_CURSOR = _List(_Int(), 2, length=2)
_ENTRY = _Object(
    {"num_workers": _Int(1, MAX_WORKERS), "cursors": _List(_CURSOR, MAX_WORKERS)},
    {"done": _Bool(), "left": _List(_Int(), MAX_WORKERS)},
)
_SEGMENT = _Object(
    {"num_ranks": _Int(1, MAX_RANKS), "ranks": _Ranks(_ENTRY)},
    {"index": _Int(0, MAX_SEGMENTS)},
)
STATE_SCHEMA = _Object(
    {
        "format": _Const(STATE_FORMAT),
        "version": _Const(STATE_VERSION),
        "fingerprint": _Object(
            {"num_files": _Int(), "rows": _Int(), "bytes": _Int(), "options": _Any()},
            {"files_digest": _Str(), "files_sha256": _Str()},  # exactly one (files_sha256: older states)
        ),
        "epoch": _Int(0, MAX_INT - 1),
        "segments": _List(_SEGMENT, MAX_SEGMENTS),
    },
    {
        "seed": _Int(),
        "world": _Object({"num_ranks": _Int(1, MAX_RANKS), "rank": _Int(0, MAX_RANKS - 1)}),
    },
)
"""The resume state's schema (``format`` and ``version`` are checked first)."""


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 2, 60, 60


def _shown(value: object) -> str:
    return _REPR.repr(value)


def _same(a: object, b: object) -> bool:
    """JSON equality that tells ``true`` from ``1`` and ``1.0`` from ``1``."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def check_shape(state: object, *, complete: bool = True) -> dict[str, Any]:
    """Validate ``state`` against :data:`STATE_SCHEMA` and the rules between its fields.

    Checks every type and range, that every segment lists each of its ranks once with one
    cursor per worker, that segments are in order (no duplicated segment), and that
    re-planning it allocates a bounded number of ``(rank, worker)`` slots. Nothing is
    planned here. The dataset is not consulted (see :func:`check_state`).

    Args:
        state: The value to check.
        complete: Every segment must hold every rank (``False`` for one rank's own state,
            before :func:`merge_states`).

    Raises:
        CheckpointMismatchError: a checkpoint of torch-dataloader-utils 0.2.0.
        ResumeStateError: anything else that is not a valid state.
    """
    if isinstance(state, dict) and "completed_shards" in state and "format" not in state:
        raise CheckpointMismatchError(
            "this is a checkpoint of torch-dataloader-utils 0.2.0 (keys 'epoch', '_num_workers', "
            "'completed_shards': whole worker shards finished), which cannot be converted exactly: "
            "0.2.0 did not record the rows consumed of unfinished shards, and its shards are not "
            "this library's plan. Restart the epoch it names with dataset.set_epoch("
            f"{state.get('epoch')!r}) (or the next one), then save new checkpoints with "
            "loader.state_dict(); see docs/migrating-from-0.2.md"
        )
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ResumeStateError(
            f"not a torch_dataloader_utils resume state (expected a dict with format={STATE_FORMAT!r}, "
            f"got {type(state).__name__}); pass what loader.state_dict() returned"
        )
    if not _same(state.get("version"), STATE_VERSION):
        raise ResumeStateError(
            f"resume state version {_shown(state.get('version'))} is not supported (this library reads "
            f"version {STATE_VERSION}); resume with the library version that saved it"
        )
    STATE_SCHEMA.check(state, "state")
    digests = [k for k in ("files_digest", "files_sha256") if k in state["fingerprint"]]
    if len(digests) != 1:
        raise ResumeStateError(
            "resume state field state.fingerprint must hold one digest of the files ('files_digest'), "
            f"got {digests}; the state was edited or damaged: pass what loader.state_dict() returned, "
            "unchanged"
        )
    for position, segment in enumerate(state["segments"]):
        _check_segment(segment, position, complete)
    return state


def check_state(state: object, expected: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a loaded state's shape and that it belongs to the dataset ``expected`` describes.

    Args:
        state: What ``json.load`` (or a checkpoint) gave back.
        expected: The dataset's :func:`fingerprint`.

    Returns:
        The state as a dict.

    Raises:
        ResumeStateError: the value is not a valid state of this format and version
            (:func:`check_shape`), or its cursors point past the dataset's rows.
        StateMismatchError: it was saved for other data or other options; the
            message says what changed.
    """
    state = check_shape(state)
    saved = state["fingerprint"]
    changes = []
    for key in ("num_files", "rows", "bytes"):
        if not _same(saved[key], expected[key]):
            changes.append(f"{key}: {_shown(saved[key])} in the state, {expected[key]!r} now")
    digest_key = "files_digest" if "files_digest" in saved else "files_sha256"
    if not changes and saved[digest_key] != expected.get(digest_key):
        changes.append(
            "the files' paths, sizes or modification times differ (same number of files, rows and bytes)"
        )
    old_opts, new_opts = saved["options"], expected["options"]
    if not isinstance(old_opts, dict):
        changes.append(f"options: {_shown(old_opts)} in the state")
        old_opts = {}
    for key in sorted(set(old_opts) | set(new_opts), key=str):
        if not _same(old_opts.get(key), new_opts.get(key)):
            changes.append(
                f"option {key}: {_shown(old_opts.get(key))} in the state, {new_opts.get(key)!r} now"
            )
    if changes:
        raise StateMismatchError(
            "the resume state was saved for different data or options: "
            + "; ".join(changes)
            + ". Resume with the same files and options, or start the epoch afresh without the state"
        )
    # Rows consumed of one piece cannot exceed the dataset's rows (or bytes, for text
    # pieces whose rows are uncounted): a bound from the dataset itself.
    most = max(int(expected["rows"]), int(expected["bytes"]))
    for i, segment in enumerate(state["segments"]):
        for rank, entry in segment["ranks"].items():
            for w, (_, offset) in enumerate(entry["cursors"]):
                if offset > most:
                    raise ResumeStateError(
                        f"resume state segment {i} rank {rank} worker {w} has consumed {offset} rows of "
                        f"one piece, more than the dataset holds ({most}); the state was edited or "
                        "damaged: pass what loader.state_dict() returned, unchanged"
                    )
            for w, left in enumerate(entry.get("left", ())):
                if left > most:
                    raise ResumeStateError(
                        f"resume state segment {i} rank {rank} worker {w} has {left} rows left, more "
                        f"than the dataset holds ({most}); the state was edited or damaged: pass what "
                        "loader.state_dict() returned, unchanged"
                    )
    return state


def _check_segment(segment: dict[str, Any], position: int, complete: bool) -> None:
    num_ranks = segment["num_ranks"]
    index = segment.get("index", position)
    if index != position:
        raise ResumeStateError(
            f"resume state segment {position} says it is segment {index}: segments are duplicated "
            "or out of order (each one continues the one before it); pass what "
            "loader.state_dict() returned, unchanged"
        )
    present = sorted(int(r) for r in segment["ranks"])
    if present and present[-1] >= num_ranks:
        raise ResumeStateError(
            f"resume state segment {position} holds rank {present[-1]} of a {num_ranks}-rank job; the "
            "state was edited or damaged: pass what loader.state_dict() returned, unchanged"
        )
    if complete and present != list(range(num_ranks)):
        missing = sorted(set(range(num_ranks)) - set(present))
        raise ResumeStateError(
            f"the resume state holds ranks {present[:20]} of a {num_ranks}-rank job (missing "
            f"{missing[:20]}); merge the states of all ranks first (merge_states, or gather_state "
            "under torch.distributed)"
        )
    workers = set()
    for rank, entry in segment["ranks"].items():
        if len(entry["cursors"]) != entry["num_workers"]:
            raise ResumeStateError(
                f"resume state segment {position} rank {rank} has num_workers={entry['num_workers']} "
                f"but {len(entry['cursors'])} cursors (one per worker is needed); the state was "
                "edited or damaged: pass what loader.state_dict() returned, unchanged"
            )
        if "left" in entry and len(entry["left"]) != entry["num_workers"]:
            raise ResumeStateError(
                f"resume state segment {position} rank {rank} has num_workers={entry['num_workers']} "
                f"but {len(entry['left'])} counts of rows left (one per worker is needed); the state "
                "was edited or damaged: pass what loader.state_dict() returned, unchanged"
            )
        workers.add(entry["num_workers"])
    slots = num_ranks * sum(workers)
    if slots > MAX_WORKER_SLOTS:
        raise ResumeStateError(
            f"resume state segment {position} describes {num_ranks} ranks with worker counts "
            f"{sorted(workers)[:10]}: re-planning it would build {slots} plan slots, more than "
            f"{MAX_WORKER_SLOTS}; such a state was not saved by this library"
        )


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Combine the states saved by every rank of a job into one loadable state.

    Every rank's ``state_dict()`` holds only its own cursors; the states must come from
    the same dataset, epoch and step (e.g. all saved after the same batch of a DDP
    loop). The result can be loaded on any number of ranks.

    Raises:
        ResumeStateError: the states disagree (fingerprint, epoch, earlier segments,
            world size) or a rank appears twice.
    """
    if not states:
        raise ResumeStateError("merge_states needs at least one state")
    if is_mix_state(states[0]):  # a mixed loader's states (create_mixed_dataloader)
        return merge_mixed_states(states)
    for state in states:
        check_shape(state, complete=False)
    first = states[0]
    for other in states[1:]:
        for key in ("format", "version", "fingerprint", "epoch"):
            if not _same(other.get(key), first.get(key)):
                raise ResumeStateError(
                    f"cannot merge states with different {key}: {first.get(key)!r} and {other.get(key)!r}; "
                    "merge the states every rank saved at the same step"
                )
        if not _same(other["segments"][:-1], first["segments"][:-1]):
            raise ResumeStateError("cannot merge states that resumed from different checkpoints")
    merged = {k: v for k, v in first.items() if k != "segments"}
    if not first["segments"]:
        merged["segments"] = []
        return merged
    last: dict[str, Any] = {"num_ranks": first["segments"][-1]["num_ranks"], "ranks": {}}
    if "index" in first["segments"][-1]:
        last["index"] = first["segments"][-1]["index"]
    for state in states:
        if not state["segments"]:
            raise ResumeStateError("cannot merge a state at the start of an epoch with one in its middle")
        segment = state["segments"][-1]
        if segment["num_ranks"] != last["num_ranks"]:
            raise ResumeStateError(
                f"cannot merge states of {segment['num_ranks']} and {last['num_ranks']} ranks"
            )
        for rank, entry in segment["ranks"].items():
            if rank in last["ranks"] and not _same(last["ranks"][rank], entry):
                raise ResumeStateError(f"rank {rank} appears twice, with different cursors")
            last["ranks"][rank] = entry
    merged["segments"] = [*first["segments"][:-1], last]
    return normalize(merged)


def normalize(state: dict[str, Any]) -> dict[str, Any]:
    """A complete state whose last segment has every rank done becomes the next epoch's start."""
    segments = state["segments"]
    if segments:
        last = segments[-1]
        entries = last["ranks"]
        if len(entries) == last["num_ranks"] and all(e.get("done") for e in entries.values()):
            return {**state, "epoch": state["epoch"] + 1, "segments": []}
    return state
