"""The resume state: its JSON format, parsed once into frozen values; fingerprint, checks, merging.

A state is ``{"format", "version", "fingerprint", "epoch", "seed", "world", "segments"}``;
each segment is one interrupted pass over the epoch: ``{"num_ranks", "index", "ranks":
{rank: {"num_workers", "cursors", "done", "left"}}}``. :meth:`ResumeState.parse` checks
every type, range and size of such a value before anything is planned or allocated (no
bool for an int, no ``"yes"`` for a bool, bounded lists), so a hand-edited or damaged
state is a :class:`ResumeStateError` and never a re-read, a skip or a memory blow-up;
nothing outside this module reads the JSON. What the segments mean for planning is in
:mod:`.resume`.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

from torch_dataloader_utils.errors import CheckpointMismatchError, ResumeStateError, StateMismatchError
from torch_dataloader_utils.plan.ledger import merged_steps, parse_steps
from torch_dataloader_utils.plan.mixstate import is_mix_state, merge_mixed_states
from torch_dataloader_utils.plan.state_kind import PLAIN_FORMAT, RANK_KEY, not_a_state
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import FileInfo

__all__ = [
    "MAX_RANKS",
    "MAX_SEGMENTS",
    "MAX_WORKERS",
    "MAX_WORKER_SLOTS",
    "STATE_FORMAT",
    "STATE_VERSION",
    "RankEntry",
    "ResumeState",
    "Segment",
    "check_state",
    "fingerprint",
    "keyed_state",
    "merge_states",
    "plain_state",
    "rank_states",
    "saved_options",
    "segments_of",
]

STATE_FORMAT = PLAIN_FORMAT
"""Value of ``state["format"]``."""
STATE_VERSION = 2
"""Value of ``state["version"]``; loading another version is an error. Version 2 (0.6):
a fresh epoch's dropped and padding rows are a span of the shares one after another."""

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

_EDITED = "the state was edited or damaged: pass what loader.state_dict() returned, unchanged"
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 2, 60, 60


def _shown(value: object) -> str:
    return _REPR.repr(value)


def _fail(value: object, where: str, what: str) -> NoReturn:
    raise ResumeStateError(f"resume state field {where} must be {what}, got {_shown(value)}; {_EDITED}")


def _int(value: object, where: str, lo: int = 0, hi: int = MAX_INT) -> int:
    if type(value) is not int or not lo <= value <= hi:
        _fail(value, where, f"an int in [{lo}, {hi}]")
    return value


_ENTRY_KEYS = (
    frozenset({"num_workers", "cursors"}),
    frozenset({"num_workers", "cursors", "done", "left", "digest"}),
)
"""The keys a rank's entry must have, and those it may have."""


def _ints(values: list[Any]) -> bool:
    """Every value is an int in ``[0, MAX_INT]`` (a bool is not an int)."""
    return all(type(v) is int and 0 <= v <= MAX_INT for v in values)


def _bool(value: object, where: str) -> bool:
    if type(value) is not bool:
        _fail(value, where, "true or false")
    return value


def _str(value: object, where: str) -> str:
    if type(value) is not str or len(value) > 4096:
        _fail(value, where, "a string")
    return value


def _list(value: object, where: str, most: int, length: int | None = None) -> list[Any]:
    what = f"a list of {length} items" if length is not None else f"a list of at most {most} items"
    if not isinstance(value, list) or len(value) > most or (length is not None and len(value) != length):
        _fail(value, where, what)
    return value


def _object(
    value: object, where: str, required: Sequence[str], optional: Sequence[str] = ()
) -> dict[str, Any]:
    what = "an object with keys " + ", ".join(sorted(required))
    if not isinstance(value, dict):
        _fail(value, where, what)
    missing = [k for k in required if k not in value]
    if missing:
        _fail(value, where, f"{what} (missing {missing})")
    unknown = [k for k in value if k not in required and k not in optional]
    if unknown:
        allowed = sorted([*required, *optional])
        _fail(value, where, f"an object with keys among {allowed} (unknown {_shown(unknown)})")
    return value


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


# -- the values ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankEntry:
    """What one rank consumed of one pass.

    Attributes:
        num_workers: Workers of the rank in that pass.
        cursors: ``(piece, offset)`` of every worker: its pieces before ``piece`` and the
            first ``offset`` rows of ``piece`` were consumed.
        done: The rank finished its pass (``None``: the state did not say, so not).
        left: Rows every worker had left, when the rank knew them (saves re-planning it).
        digest: A custom split strategy's digest of the chunks of the rank's plan (first
            pass only), so a resume with a strategy that returns other chunks is refused.
    """

    num_workers: int
    cursors: tuple[tuple[int, int], ...]
    done: bool | None = None
    left: tuple[int, ...] | None = None
    digest: int | None = None

    @classmethod
    def parse(cls, value: object, where: str) -> RankEntry:
        """Check and parse one rank's entry (``where`` names it in errors)."""
        if (
            type(value) is dict and _ENTRY_KEYS[0] <= value.keys() <= _ENTRY_KEYS[1]
        ):  # the usual case, at once
            workers, cursors = value["num_workers"], value["cursors"]
            done, left, digest = value.get("done", False), value.get("left", []), value.get("digest", 0)
            if (
                type(workers) is int
                and 1 <= workers <= MAX_WORKERS
                and type(cursors) is list
                and len(cursors) <= MAX_WORKERS
                and all(type(c) is list and len(c) == 2 and _ints(c) for c in cursors)
                and type(done) is bool
                and type(left) is list
                and len(left) <= MAX_WORKERS
                and _ints(left)
                and type(digest) is int
                and 0 <= digest <= 2**63
            ):
                return cls(
                    workers,
                    tuple((c[0], c[1]) for c in cursors),
                    value.get("done"),
                    tuple(left) if "left" in value else None,
                    value.get("digest"),
                )
        entry = _object(value, where, ("num_workers", "cursors"), ("done", "left", "digest"))
        workers = _int(entry["num_workers"], f"{where}.num_workers", 1, MAX_WORKERS)
        cursors = _list(entry["cursors"], f"{where}.cursors", MAX_WORKERS)
        pairs = []
        for i, c in enumerate(cursors):
            pair = _list(c, f"{where}.cursors[{i}]", 2, length=2)
            pairs.append(
                (_int(pair[0], f"{where}.cursors[{i}][0]"), _int(pair[1], f"{where}.cursors[{i}][1]"))
            )
        done = _bool(entry["done"], f"{where}.done") if "done" in entry else None
        left = None
        if "left" in entry:
            counts = _list(entry["left"], f"{where}.left", MAX_WORKERS)
            left = tuple(_int(n, f"{where}.left[{i}]") for i, n in enumerate(counts))
        digest = _int(entry["digest"], f"{where}.digest", 0, 2**63) if "digest" in entry else None
        return cls(workers, tuple(pairs), done, left, digest)

    def to_json(self) -> dict[str, Any]:
        """The entry as JSON values."""
        out: dict[str, Any] = {"num_workers": self.num_workers, "cursors": [list(c) for c in self.cursors]}
        if self.done is not None:
            out["done"] = self.done
        if self.left is not None:
            out["left"] = list(self.left)
        if self.digest is not None:
            out["digest"] = self.digest
        return out

    def check_digest(self, digest: int | None, rank: int) -> None:
        """Refuse a resume whose strategy returns other chunks than when the state was saved.

        Raises:
            StateMismatchError: the digests differ.
        """
        if self.digest is not None and digest != self.digest:
            raise StateMismatchError(
                f"the resume state was saved for different data or options: the custom split strategy "
                f"returns other chunks for rank {rank} of the saved world than when the state was saved "
                "(its parameters differ?). Resume with the same files and options, or start the epoch "
                "afresh without the state"
            )


@dataclass(frozen=True, slots=True)
class Segment:
    """One interrupted pass over an epoch: every rank's :class:`RankEntry`.

    Attributes:
        num_ranks: Ranks of the pass.
        ranks: Entries by rank (every rank, once states are merged).
        index: Position of the segment in its state (``None`` in states that did not say).
    """

    num_ranks: int
    ranks: Mapping[int, RankEntry]
    index: int | None = None

    def __hash__(self) -> int:
        return hash((self.num_ranks, self.index, tuple(sorted(self.ranks.items()))))

    @classmethod
    def parse(cls, value: object, where: str = "segment") -> Segment:
        """Check and parse one segment (``where`` names it in errors)."""
        segment = _object(value, where, ("num_ranks", "ranks"), ("index",))
        num_ranks = _int(segment["num_ranks"], f"{where}.num_ranks", 1, MAX_RANKS)
        entries = segment["ranks"]
        if not isinstance(entries, dict) or len(entries) > MAX_RANKS:
            _fail(entries, f"{where}.ranks", f"an object of at most {MAX_RANKS} ranks ('0', '1', ...)")
        ranks = {}
        for key, entry in entries.items():
            if not (type(key) is str and key.isdigit() and key == str(int(key))):
                _fail(key, f"{where}.ranks key", "a rank written as a plain decimal ('0', '1', ...)")
            ranks[int(key)] = RankEntry.parse(entry, f"{where}.ranks[{key!r}]")
        index = _int(segment["index"], f"{where}.index", 0, MAX_SEGMENTS) if "index" in segment else None
        return cls(num_ranks, ranks, index)

    def workers_of(self, rank: int) -> int:
        """Workers of ``rank`` in this pass."""
        try:
            return self.ranks[rank].num_workers
        except KeyError:
            raise ResumeStateError(f"the resume state has no entry of rank {rank}") from None

    def to_json(self) -> dict[str, Any]:
        """The segment as JSON values."""
        out: dict[str, Any] = {
            "num_ranks": self.num_ranks,
            "ranks": {str(r): e.to_json() for r, e in self.ranks.items()},
        }
        if self.index is not None:
            out["index"] = self.index
        return out

    def check(self, position: int, complete: bool) -> None:
        """The rules between the segment's fields (``complete``: every rank is there)."""
        index = position if self.index is None else self.index
        if index != position:
            raise ResumeStateError(
                f"resume state segment {position} says it is segment {index}: segments are duplicated "
                "or out of order (each one continues the one before it); pass what "
                "loader.state_dict() returned, unchanged"
            )
        present = sorted(self.ranks)
        if present and present[-1] >= self.num_ranks:
            raise ResumeStateError(
                f"resume state segment {position} holds rank {present[-1]} of a {self.num_ranks}-rank "
                f"job; {_EDITED}"
            )
        if complete and present != list(range(self.num_ranks)):
            missing = sorted(set(range(self.num_ranks)) - set(present))
            raise ResumeStateError(
                f"the resume state holds ranks {present[:20]} of a {self.num_ranks}-rank job (missing "
                f"{missing[:20]}); merge the states of all ranks first (merge_states, or gather_state "
                "under torch.distributed; a DCP checkpoint of the loader itself resumes only on as "
                "many ranks as saved it, GatheredState(loader) on any number)"
            )
        for rank, entry in self.ranks.items():
            where = f"resume state segment {position} rank {rank} has num_workers={entry.num_workers} but"
            if len(entry.cursors) != entry.num_workers:
                raise ResumeStateError(
                    f"{where} {len(entry.cursors)} cursors (one per worker is needed); {_EDITED}"
                )
            if entry.left is not None and len(entry.left) != entry.num_workers:
                raise ResumeStateError(
                    f"{where} {len(entry.left)} counts of rows left (one per worker is needed); {_EDITED}"
                )
        workers = {e.num_workers for e in self.ranks.values()}
        slots = self.num_ranks * sum(workers)
        if slots > MAX_WORKER_SLOTS:
            raise ResumeStateError(
                f"resume state segment {position} describes {self.num_ranks} ranks with worker counts "
                f"{sorted(workers)[:10]}: re-planning it would build {slots} plan slots, more than "
                f"{MAX_WORKER_SLOTS}; such a state was not saved by this library"
            )

    @property
    def finished(self) -> bool:
        """Every rank of the pass is there and done."""
        return len(self.ranks) == self.num_ranks and all(e.done for e in self.ranks.values())


@dataclass(frozen=True, slots=True)
class ResumeState:
    """A resume state, parsed: the epoch, what it is tied to, and its interrupted passes.

    Attributes:
        epoch: The epoch it resumes.
        fingerprint: The files digest and options it was saved for (JSON values).
        segments: The interrupted passes over the epoch, in order.
        seed: The shuffle seed it was saved with.
        world: ``(num_ranks, rank)`` of the rank that saved it, ``None`` if unsaid.
        steps: Batches the loader of each saving rank had handed out over its life (the
            training ledger's step, :mod:`.ledger`), by rank; ``None`` if unsaid.
    """

    epoch: int
    fingerprint: Mapping[str, Any]
    segments: tuple[Segment, ...] = ()
    seed: int | None = None
    world: tuple[int, int] | None = field(default=None, compare=False)
    steps: Mapping[int, int] | None = field(default=None, compare=False)

    @classmethod
    def parse(cls, value: object, *, complete: bool = True) -> ResumeState:
        """Check ``value`` (what ``json.load`` gave) and parse it; nothing is planned here.

        Args:
            value: The value to check.
            complete: Every segment must hold every rank (``False`` for one rank's own
                state, before :func:`merge_states`).

        Raises:
            CheckpointMismatchError: a checkpoint of torch-dataloader-utils 0.2.0.
            ResumeStateError: anything else that is not a valid state of this version.
        """
        state = _header(value)
        fp = _object(
            state["fingerprint"],
            "state.fingerprint",
            ("num_files", "rows", "bytes", "options"),
            ("files_digest", "files_sha256"),
        )
        for key in ("num_files", "rows", "bytes"):
            _int(fp[key], f"state.fingerprint.{key}")
        digests = [k for k in ("files_digest", "files_sha256") if k in fp]
        for key in digests:
            _str(fp[key], f"state.fingerprint.{key}")
        epoch = _int(state["epoch"], "state.epoch", 0, MAX_INT - 1)
        raw = _list(state["segments"], "state.segments", MAX_SEGMENTS)
        segments = tuple(Segment.parse(s, f"state.segments[{i}]") for i, s in enumerate(raw))
        seed = _int(state["seed"], "state.seed") if "seed" in state else None
        world = None
        if "world" in state:
            w = _object(state["world"], "state.world", ("num_ranks", "rank"))
            world = (
                _int(w["num_ranks"], "state.world.num_ranks", 1, MAX_RANKS),
                _int(w["rank"], "state.world.rank", 0, MAX_RANKS - 1),
            )
        if len(digests) != 1:
            raise ResumeStateError(
                "resume state field state.fingerprint must hold one digest of the files "
                f"('files_digest'), got {digests}; {_EDITED}"
            )
        for position, segment in enumerate(segments):
            segment.check(position, complete)
        return cls(epoch, fp, segments, seed, world, parse_steps(state.get("steps"), "state.steps"))

    def to_json(self) -> dict[str, Any]:
        """The state as JSON values (what ``state_dict()`` returns)."""
        out: dict[str, Any] = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "fingerprint": dict(self.fingerprint),
            "epoch": self.epoch,
        }
        if self.seed is not None:
            out["seed"] = self.seed
        if self.world is not None:
            out["world"] = {"num_ranks": self.world[0], "rank": self.world[1]}
        out["segments"] = [s.to_json() for s in self.segments]
        if self.steps is not None:
            out["steps"] = {str(rank): n for rank, n in sorted(self.steps.items())}
        return out

    def normalized(self) -> ResumeState:
        """A complete state whose last pass every rank finished is the next epoch's start."""
        if self.segments and self.segments[-1].finished:
            return replace(self, epoch=self.epoch + 1, segments=())
        return self

    def check_against(self, expected: Mapping[str, Any]) -> ResumeState:
        """Check that the state belongs to the dataset ``expected`` (its :func:`fingerprint`) describes.

        Raises:
            StateMismatchError: saved for other data or options; the message says what changed.
            ResumeStateError: its cursors or counts point past the dataset's rows.
        """
        saved = self.fingerprint
        changes = [
            f"{key}: {_shown(saved[key])} in the state, {expected[key]!r} now"
            for key in ("num_files", "rows", "bytes")
            if not _same(saved[key], expected[key])
        ]
        digest = "files_digest" if "files_digest" in saved else "files_sha256"
        if not changes and saved[digest] != expected.get(digest):
            changes.append(
                "the files' paths, sizes or modification times differ (same number of files, rows and bytes)"
            )
        old, new = saved["options"], expected["options"]
        if not isinstance(old, dict):
            changes.append(f"options: {_shown(old)} in the state")
            old = {}
        for key in sorted(set(old) | set(new), key=str):
            if not _same(old.get(key), new.get(key)):
                changes.append(f"option {key}: {_shown(old.get(key))} in the state, {new.get(key)!r} now")
        if changes:
            raise StateMismatchError(
                "the resume state was saved for different data or options: "
                + "; ".join(changes)
                + ". Resume with the same files and options, or start the epoch afresh without the state"
            )
        # Rows consumed of one piece cannot exceed the dataset's rows (or bytes, for text
        # pieces whose rows are uncounted): a bound from the dataset itself.
        most = max(int(expected["rows"]), int(expected["bytes"]))
        for i, segment in enumerate(self.segments):
            for rank, entry in segment.ranks.items():
                for w, (_, offset) in enumerate(entry.cursors):
                    if offset > most:
                        raise ResumeStateError(
                            f"resume state segment {i} rank {rank} worker {w} has consumed {offset} rows "
                            f"of one piece, more than the dataset holds ({most}); {_EDITED}"
                        )
                for w, left in enumerate(entry.left or ()):
                    if left > most:
                        raise ResumeStateError(
                            f"resume state segment {i} rank {rank} worker {w} has {left} rows left, more "
                            f"than the dataset holds ({most}); {_EDITED}"
                        )
        return self


def saved_options(state: object) -> Mapping[str, Any] | None:
    """The options a state's fingerprint records (what it was saved with), or ``None`` if it has none.

    Read before a state is checked, to adopt what the library chose for it (the split it
    was saved with); anything malformed is left to :meth:`ResumeState.parse` to refuse.
    """
    fingerprint = state.get("fingerprint") if isinstance(state, Mapping) else None
    options = fingerprint.get("options") if isinstance(fingerprint, Mapping) else None
    return options if isinstance(options, Mapping) else None


def segments_of(values: Sequence[Segment | Mapping[str, Any]]) -> tuple[Segment, ...]:
    """Segments, parsed where they are still JSON values (e.g. written by hand in a test)."""
    return tuple(v if isinstance(v, Segment) else Segment.parse(v) for v in values)


def _integral_floats(state: Mapping[str, Any], shown: int = 3) -> list[str]:
    """Where ``state`` holds whole-number floats (up to ``shown`` places), as ``field=value``.

    A real state holds no float at all; the fingerprint's options (the user's own
    values) are left out. Iterative and bounded in depth, so a hostile state cannot
    recurse without end here.
    """
    found: list[str] = []
    stack: list[tuple[object, str, int]] = [(state, "state", 0)]
    while stack and len(found) < shown:
        value, where, depth = stack.pop()
        if isinstance(value, float) and value.is_integer():
            found.append(f"{where}={value!r}")
        elif depth >= 8:
            continue
        elif isinstance(value, Mapping):
            items = [
                (k, v) for k, v in value.items() if not (where == "state.fingerprint" and k == "options")
            ]
            stack.extend((v, f"{where}.{k}", depth + 1) for k, v in reversed(items))
        elif isinstance(value, list):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in reversed(list(enumerate(value))))
    return found


def _header(value: object) -> dict[str, Any]:
    """The state's outer object, once its format and version are this library's."""
    if isinstance(value, dict) and "completed_shards" in value and "format" not in value:
        raise CheckpointMismatchError(
            "this is a checkpoint of torch-dataloader-utils 0.2.0 (keys 'epoch', '_num_workers', "
            "'completed_shards': whole worker shards finished), which cannot be converted exactly: "
            "0.2.0 did not record the rows consumed of unfinished shards, and its shards are not "
            "this library's plan. Restart the epoch it names with dataset.set_epoch("
            f"{value.get('epoch')!r}) (or the next one), then save new checkpoints with "
            "loader.state_dict(); see docs/migrating-from-0.2.md"
        )
    if not isinstance(value, dict) or value.get("format") != STATE_FORMAT:
        raise not_a_state(value, STATE_FORMAT)
    floats = _integral_floats(value)
    if floats:
        raise ResumeStateError(
            f"the resume state's integers became floats ({', '.join(floats)}): it went through a "
            "tool that stores every number as a float (a JSON library of another language, a YAML "
            "or config store). Save it as loader.state_dict() returned it (json.dump, torch.save), "
            "or turn whole-number floats back into ints before loading"
        )
    version = value.get("version")
    if _same(version, 1):
        raise ResumeStateError(
            f"resume state version 1 was saved by torch-dataloader-utils 0.5 or earlier, whose plans "
            f"leave out or repeat other rows of an epoch with equal batches (this library reads version "
            f"{STATE_VERSION}), so its cursors cannot be resumed exactly: finish epoch "
            f"{_shown(value.get('epoch'))} with the version that saved it, or restart that epoch "
            "afresh (dataset.set_epoch) and save new states"
        )
    if not _same(version, STATE_VERSION):
        raise ResumeStateError(
            f"resume state version {_shown(version)} is not supported (this library reads version "
            f"{STATE_VERSION}); resume with the library version that saved it"
        )
    return _object(
        value, "state", ("format", "version", "fingerprint", "epoch", "segments"), ("seed", "world", "steps")
    )


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


def check_state(state: object, expected: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a loaded state and that it belongs to the dataset ``expected`` describes.

    Args:
        state: What ``json.load`` (or a checkpoint) gave back.
        expected: The dataset's :func:`fingerprint`.

    Returns:
        The state as JSON values.

    Raises:
        ResumeStateError: the value is not a valid state of this format and version, or
            its cursors point past the dataset's rows.
        StateMismatchError: it was saved for other data or other options; the
            message says what changed.
    """
    return ResumeState.parse(state).check_against(expected).to_json()


def _merge(states: Sequence[ResumeState], first: ResumeState) -> ResumeState:
    last = first.segments[-1]
    entries: dict[int, RankEntry] = {}
    for state in states:
        if not state.segments:
            raise ResumeStateError("cannot merge a state at the start of an epoch with one in its middle")
        segment = state.segments[-1]
        if segment.num_ranks != last.num_ranks:
            raise ResumeStateError(f"cannot merge states of {segment.num_ranks} and {last.num_ranks} ranks")
        for rank, entry in segment.ranks.items():
            if rank in entries and entries[rank] != entry:
                raise ResumeStateError(f"rank {rank} appears twice, with different cursors")
            entries[rank] = entry
    merged = Segment(last.num_ranks, entries, last.index)
    steps = merged_steps([s.steps for s in states])
    return replace(first, segments=(*first.segments[:-1], merged), steps=steps).normalized()


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
    states = [part for state in states for part in rank_states(state) or (state,)]
    if is_mix_state(states[0]):  # a mixed loader's states (create_mixed_dataloader)
        return merge_mixed_states(states)
    parsed = [ResumeState.parse(s, complete=False) for s in states]
    first = parsed[0]
    for raw, other in zip(states[1:], parsed[1:], strict=True):
        for key, get in _MERGE_KEYS.items():
            if not _same(get(other), get(first)):
                raise ResumeStateError(
                    f"cannot merge states with different {key}: {states[0].get(key)!r} and {raw.get(key)!r}; "
                    "merge the states every rank saved at the same step"
                )
        if other.segments[:-1] != first.segments[:-1]:
            raise ResumeStateError("cannot merge states that resumed from different checkpoints")
    if not first.segments:
        return replace(first, steps=merged_steps([s.steps for s in parsed])).to_json()
    return _merge(parsed, first).to_json()


_MERGE_KEYS: dict[str, Callable[[ResumeState], object]] = {
    "fingerprint": lambda s: dict(s.fingerprint),
    "epoch": lambda s: s.epoch,
}
"""What the states merged must agree on (format and version are checked by parsing)."""


# -- a loader's state: each rank's under a key of its own ------------------------------------------


def keyed_state(state: Mapping[str, Any], rank: int) -> dict[str, str]:
    """``state`` (one rank's) as a loader's ``state_dict()`` holds it: ``{"rank<rank>": "<JSON>"}``.

    A checkpointer that stores entries by key (``torch.distributed.checkpoint`` keeps one
    copy of an entry whose key is the same on every rank) then keeps every rank's state,
    and one JSON string is one entry however far the epoch went (a fresh loader's state
    has the same single key as a mid-epoch one). The ranks' states merge by dict union.
    """
    return {f"rank{rank}": json.dumps(state, separators=(",", ":"))}


def rank_states(state: object) -> list[dict[str, Any]] | None:
    """The ranks' states in a loader's state (:func:`keyed_state`, or several merged by ``|``).

    ``None`` when ``state`` is not of that shape (a plain state, or anything else, left to
    the parser to judge). Ordered by rank.

    Raises:
        ResumeStateError: an entry ``rank<r>`` is not the JSON of an object.
    """
    if not (
        isinstance(state, Mapping)
        and state
        and all(type(k) is str and RANK_KEY.fullmatch(k) and type(v) is str for k, v in state.items())
    ):
        return None
    parts = []
    for key in sorted(state, key=lambda k: int(k[4:])):
        try:
            part = json.loads(state[key])
        except ValueError as exc:
            where = f"the loader state's entry {key!r}"
            raise ResumeStateError(f"{where} is not JSON ({exc}); {_EDITED}") from None
        if not isinstance(part, dict):
            _fail(part, f"the loader state's entry {key!r}", "the JSON of an object")
        parts.append(part)
    return parts


def plain_state(state: Mapping[str, Any]) -> Mapping[str, Any]:
    """``state`` as a dataset reads it: a loader's state unwrapped, several ranks' merged."""
    parts = rank_states(state)
    if parts is None:
        return state
    return parts[0] if len(parts) == 1 else merge_states(parts)
