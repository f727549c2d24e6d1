"""Mid-epoch resumption and the row-level window shuffle, as pure planning.

A worker reads a list of :class:`Piece` values in order. A piece is either one chunk in
file order, or a *window*: a few consecutive chunks read together whose rows are
emitted in a seeded permutation (the row-level shuffle). A piece may be restricted to
the rows ``[lo, hi)`` of its emission order. So every row a worker yields sits at a
position ``(piece index, row offset)`` of its list, and what the training loop has
consumed is a *cursor* per worker: the pieces before ``piece`` are done, and the first
``offset`` rows of ``piece`` are done.

Resuming an epoch:

1. rebuild the pieces of the segment that was interrupted (the full plan of the
   epoch, or a previous resume plan: :func:`segment_pieces`);
2. cut every worker's list at its cursor (:func:`remaining`); a chunk read in file
   order is cut exactly at the row (no re-read) when row counts are exact, a window is
   continued at its offset in the same permutation (its buffer is re-read, never
   stored);
3. deal what remains over the new world (:func:`replan`): other ``num_ranks``, other
   ``num_workers``, equal rows per rank and batch multiples per worker when
   ``equal_batches`` is on (:func:`~.ranks.rank_quota`, :func:`~.ranks.worker_quotas`).

Nothing here reads the environment; the state is plain ints and strings.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from torch_dataloader_utils.errors import CheckpointMismatchError, ResumeStateError, StateMismatchError
from torch_dataloader_utils.plan.assign import assign
from torch_dataloader_utils.plan.planner import PlanSpec, plan_epoch
from torch_dataloader_utils.plan.ranks import cut_chunk, fill_quotas_by, rank_quota, worker_quotas
from torch_dataloader_utils.plan.shuffle import permutation
from torch_dataloader_utils.plan.types import Chunk, ChunkUnit, EqualBatches, FileInfo

__all__ = [
    "STATE_FORMAT",
    "STATE_VERSION",
    "Cursor",
    "Piece",
    "ResumeResult",
    "as_pieces",
    "check_state",
    "cut_piece",
    "fingerprint",
    "merge_states",
    "normalize",
    "piece_rows",
    "remaining",
    "replan",
    "segment_pieces",
    "window_pieces",
]

STATE_FORMAT = "torch_dataloader_utils.resume"
"""Value of ``state["format"]``."""
STATE_VERSION = 1
"""Value of ``state["version"]``; loading another version is an error."""

Cursor = tuple[int, int]
"""``(piece index, rows consumed of that piece)`` for one worker."""


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows a worker emits: one chunk in file order, or a shuffled window of chunks.

    Attributes:
        chunks: The chunks read; exactly one when ``key`` is ``None``.
        key: Seed of the row permutation of a window (``(seed, epoch, segment, rank,
            worker, window)``), or ``None`` for file order.
        lo: First emitted row (in emission order) that belongs to the piece.
        hi: One past the last emitted row, or ``None`` for "to the end".
    """

    chunks: tuple[Chunk, ...]
    key: tuple[int, ...] | None = None
    lo: int = 0
    hi: int | None = None

    @property
    def total_rows(self) -> int | None:
        """Rows of all its chunks, before ``lo`` / ``hi``, or ``None`` if unknown."""
        total = 0
        for chunk in self.chunks:
            if chunk.num_rows is None:
                return None
            total += chunk.num_rows
        return total

    @property
    def num_rows(self) -> int | None:
        """Rows the piece emits, or ``None`` if unknown."""
        total = self.total_rows
        if total is None:
            return None if self.hi is None else self.hi - self.lo
        return min(total, total if self.hi is None else self.hi) - self.lo

    @property
    def weight(self) -> int:
        """Balancing weight: rows when known, else bytes."""
        rows = self.num_rows
        return rows if rows is not None else sum(c.num_bytes for c in self.chunks)

    @property
    def whole(self) -> bool:
        """One whole chunk in file order (it can join a window)."""
        return self.key is None and self.lo == 0 and self.hi is None

    @property
    def padding(self) -> bool:
        """All its chunks repeat rows read elsewhere (``equal_batches='pad'``)."""
        return all(c.padding for c in self.chunks)


def as_pieces(chunks: Sequence[Chunk]) -> list[Piece]:
    """Every chunk as a piece read in file order."""
    return [Piece((c,)) for c in chunks]


def _exact(chunk: Chunk) -> bool:
    return chunk.unit is ChunkUnit.ROWS and chunk.num_rows is not None


def window_pieces(pieces: Sequence[Piece], window_rows: int | None, key: tuple[int, ...]) -> list[Piece]:
    """Group runs of consecutive whole chunks into windows of at most ``window_rows`` rows.

    A window closes before the chunk that would take it over ``window_rows`` (a chunk
    larger than that forms a window alone), so the rows held at once are at most
    ``max(window_rows, largest chunk)``. Pieces that are not whole chunks (continued
    windows, partly read chunks) stay as they are. Window ``j`` gets the key
    ``(*key, j)``. ``window_rows=None`` returns ``pieces`` unchanged.
    """
    if window_rows is None:
        return list(pieces)
    out: list[Piece] = []
    group: list[Chunk] = []
    rows = 0

    def close() -> None:
        nonlocal group, rows
        if group:
            out.append(Piece(tuple(group), (*key, len(out))))
        group, rows = [], 0

    for piece in pieces:
        if not piece.whole:
            close()
            out.append(piece)
            continue
        chunk = piece.chunks[0]
        n = chunk.weight
        if group and rows + n > window_rows:
            close()
        group.append(chunk)
        rows += n
    close()
    return out


def cut_piece(piece: Piece, rows: int, files: Mapping[str, FileInfo], exact: bool) -> tuple[Piece, Piece]:
    """``(head, tail)``: the piece's first ``rows`` emitted rows and the rest.

    A whole chunk with exact row counts is cut into two chunks (each reads only its
    own rows); anything else becomes two row ranges of the same emission order.
    """
    if piece.whole and exact and _exact(piece.chunks[0]):
        head, tail = cut_chunk(piece.chunks[0], files[piece.chunks[0].path], rows)
        return Piece((head,)), Piece((tail,))
    stop = piece.lo + rows
    return replace(piece, hi=stop), replace(piece, lo=stop)


def advance(piece: Piece, rows: int, files: Mapping[str, FileInfo], exact: bool) -> Piece | None:
    """What is left of ``piece`` after its first ``rows`` rows were consumed."""
    n = piece.num_rows
    if rows <= 0:
        return piece if n != 0 else None
    if n is not None and rows >= n:
        return None
    return cut_piece(piece, rows, files, exact)[1]


def remaining(
    pieces: Sequence[Piece], cursor: Cursor, files: Mapping[str, FileInfo], exact: bool
) -> list[Piece]:
    """A worker's pieces not yet consumed, given its cursor ``(piece, offset)``.

    Raises:
        ResumeStateError: the cursor points past the worker's pieces.
    """
    index, offset = cursor
    if index < 0 or offset < 0 or index > len(pieces) or (index == len(pieces) and offset):
        raise ResumeStateError(
            f"cursor {list(cursor)} is outside the worker's {len(pieces)} pieces; the state does not "
            "belong to this plan (was it saved by another version, or edited?)"
        )
    if index == len(pieces):
        return []
    n = pieces[index].num_rows
    if n is not None and offset > n:
        raise ResumeStateError(
            f"cursor {list(cursor)} is past the {n} rows of piece {index}; the state does not "
            "belong to this plan"
        )
    rest = advance(pieces[index], offset, files, exact)
    return ([rest] if rest is not None else []) + [p for p in pieces[index + 1 :] if p.num_rows != 0]


def _fill(
    bins: Sequence[Sequence[Piece]], quotas: Sequence[int], files: Mapping[str, FileInfo]
) -> tuple[list[list[Piece]], list[Piece]]:
    """:func:`~.ranks.fill_quotas` for pieces: exact quotas, cutting at row granularity."""
    return fill_quotas_by(bins, quotas, rows=_rows, cut=lambda piece, n: cut_piece(piece, n, files, True))


def _rows(piece: Piece) -> int:
    n = piece.num_rows
    if n is None:
        raise ResumeStateError(
            "equal_batches needs exact row counts to re-plan the rest of an epoch, but a piece of "
            f"{piece.chunks[0].path!r} has an unknown row count; pass equal_batches='off'"
        )
    return n


def _padded(piece: Piece) -> Piece:
    return replace(piece, chunks=tuple(replace(c, padding=True) for c in piece.chunks))


@dataclass(frozen=True, slots=True)
class ResumeResult:
    """Pieces of every (rank, worker) for the rest of an epoch, and the rows left out.

    Attributes:
        assignments: ``assignments[rank][worker]``: that worker's pieces, in order.
        dropped: Pieces no rank reads (``equal_batches='drop'``; fewer than
            ``num_ranks`` rows).
    """

    assignments: tuple[tuple[tuple[Piece, ...], ...], ...]
    dropped: tuple[Piece, ...] = ()


def replan(
    pool: Sequence[Piece],
    files: Mapping[str, FileInfo],
    *,
    num_ranks: int,
    num_workers: Callable[[int], int],
    equal_batches: EqualBatches,
    batch_size: int,
    window_rows: int | None = None,
    key: tuple[int, ...] = (),
) -> ResumeResult:
    """Deal the remaining pieces of an epoch over a (new) world.

    Pieces are dealt ``[rank::num_ranks]``; with ``equal_batches`` on (and more than one
    rank) every rank then gets exactly :func:`~.ranks.rank_quota` rows, surplus rows
    moving to short ranks at row granularity, and every worker a multiple of
    ``batch_size`` (:func:`~.ranks.worker_quotas`), as in a full epoch. Whole chunks are
    regrouped into windows when ``window_rows`` is set (keys ``(*key, rank, worker, j)``).

    Args:
        pool: The remaining pieces, in a canonical order (rank, worker, piece).
        files: The files of the pieces, by path.
        num_ranks: Ranks of the new world.
        num_workers: Workers of a rank (ranks may differ), at least 1.
        equal_batches: The equal-batches policy.
        batch_size: Rows per batch.
        window_rows: Row-shuffle window, or ``None``.
        key: Prefix of the windows' permutation keys.
    """
    shares = [list(pool[r::num_ranks]) for r in range(num_ranks)]
    equal = equal_batches is not EqualBatches.OFF and num_ranks > 1
    dropped: list[Piece] = []
    if equal:
        pad = equal_batches is EqualBatches.PAD
        total = sum(_rows(p) for p in pool)
        quota = rank_quota(total, num_ranks, pad)
        shares, dropped = _fill(shares, [quota] * num_ranks, files)
        if pad:
            stream = [p for p in pool if _rows(p)]
            for share in shares:
                short = quota - sum(_rows(p) for p in share)
                for piece in stream:
                    if short <= 0:
                        break
                    n = _rows(piece)
                    take = piece if n <= short else cut_piece(piece, short, files, True)[0]
                    share.append(_padded(take))
                    short -= min(n, short)
    per_rank = []
    for rank, share in enumerate(shares):
        workers = max(1, num_workers(rank))
        bins = assign(share, workers, _weight)
        if equal:
            rows = sum(_rows(p) for p in share)
            bins, rest = _fill(bins, worker_quotas(rows, workers, batch_size), files)
            assert not rest, "worker quotas add up to the rank's rows"
        per_rank.append(
            tuple(tuple(window_pieces(b, window_rows, (*key, rank, w))) for w, b in enumerate(bins))
        )
    return ResumeResult(tuple(per_rank), tuple(dropped))


def _weight(piece: Piece) -> int:
    return piece.weight


def _ranks_of(segment: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    return {int(r): entry for r, entry in segment["ranks"].items()}


def segment_pieces(
    spec: PlanSpec,
    epoch: int,
    segments: Sequence[Mapping[str, Any]],
    *,
    num_ranks: int,
    num_workers: Callable[[int], int],
    window_rows: int | None,
    exact: bool,
) -> ResumeResult:
    """Pieces of every (rank, worker) after the interrupted ``segments`` of ``epoch``.

    Segment 0 is the epoch's full plan in the world it was saved under (each rank with
    its own ``num_workers``); each later segment is the :func:`replan` of what the one
    before left. The result is the replan of what the last segment left, over
    ``num_ranks`` ranks. With no segments it is the full plan of the epoch.

    Args:
        spec: The plan's options (its ``num_ranks`` / ``num_workers`` are replaced).
        epoch: The epoch.
        segments: Merged segments of a state (``{"num_ranks", "ranks": {rank:
            {"num_workers", "cursors", "done"}}}``).
        num_ranks: Ranks of the world to plan for.
        num_workers: Workers of a rank in that world.
        window_rows: Row-shuffle window, or ``None``.
        exact: Row counts are exact (no row filter), so chunks can be cut at a row.
    """
    files = {f.path: f for f in spec.files}
    seed = spec.seed if spec.shuffle else 0
    worlds = [(int(s["num_ranks"]), _workers_of(s)) for s in segments] + [(num_ranks, num_workers)]
    ranks0, workers0 = worlds[0]
    plans = {}
    for w in sorted({max(1, workers0(r)) for r in range(ranks0)}):
        plans[w] = plan_epoch(replace(spec, num_ranks=ranks0, num_workers=w), epoch)
    assignments: list[tuple[tuple[Piece, ...], ...]] = []
    for r in range(ranks0):
        plan = plans[max(1, workers0(r))]
        assignments.append(
            tuple(
                tuple(window_pieces(as_pieces(chunks), window_rows, (seed, epoch, 0, r, w)))
                for w, chunks in enumerate(plan.assignments[r])
            )
        )
    result = ResumeResult(tuple(assignments), tuple(as_pieces(plans[max(1, workers0(0))].dropped)))
    for index, segment in enumerate(segments, start=1):
        entries = _ranks_of(segment)
        pool: list[Piece] = []
        for r, workers in enumerate(result.assignments):
            entry = entries[r]
            if entry.get("done"):
                continue
            cursors = entry["cursors"]
            if len(cursors) != len(workers):
                raise ResumeStateError(
                    f"rank {r} has {len(cursors)} worker cursors but planned {len(workers)} workers; "
                    "the state is inconsistent"
                )
            for pieces, cursor in zip(workers, cursors, strict=True):
                pool.extend(remaining(pieces, (int(cursor[0]), int(cursor[1])), files, exact))
        ranks, workers_of = worlds[index]
        result = replan(
            pool,
            files,
            num_ranks=ranks,
            num_workers=workers_of,
            equal_batches=spec.equal_batches,
            batch_size=spec.batch_size,
            window_rows=window_rows,
            key=(seed, epoch, index),
        )
    return result


def _workers_of(segment: Mapping[str, Any]) -> Callable[[int], int]:
    entries = _ranks_of(segment)
    return lambda r: int(entries[r]["num_workers"])


def piece_rows(piece: Piece, files: Mapping[str, FileInfo]) -> list[tuple[str, int, bool]]:
    """Every row a piece emits, in order, as ``(path, file row, padding)`` (for checks).

    Only for chunks counted in rows; a window is its chunks' rows in a permutation by
    its key, restricted to ``[lo, hi)``.
    """
    rows: list[tuple[str, int, bool]] = []
    for chunk in piece.chunks:
        info = files[chunk.path]
        if info.row_groups is None:
            stop = min(chunk.stop, info.num_rows or 0)
            rows.extend((chunk.path, i, chunk.padding) for i in range(chunk.start, stop))
        else:
            for g in info.groups_in(chunk.start, chunk.stop):
                lo, hi = max(chunk.start, g.first_row), min(chunk.stop, g.stop_row)
                rows.extend((chunk.path, i, chunk.padding) for i in range(lo, hi))
    if piece.key is not None:
        order = permutation(len(rows), piece.key[0], piece.key[1], *piece.key[2:])
        rows = [rows[i] for i in order]
    return rows[piece.lo : piece.hi]


# -- state: plain JSON values ----------------------------------------------------------------


def fingerprint(files: Sequence[FileInfo], options: Mapping[str, Any]) -> dict[str, Any]:
    """What a state is tied to: a digest of the files plus the options that shape the plan.

    The files enter as a SHA-256 of their paths, sizes, modification times and row
    counts (so the state stays small), with their number, rows and bytes in clear for
    messages; ``options`` must be JSON values.
    """
    digest = hashlib.sha256()
    rows = 0
    for f in files:
        digest.update(json.dumps([f.path, f.size, f.mtime, f.num_rows, f.live_rows]).encode())
        rows += f.live_rows or 0
    return {
        "files_sha256": digest.hexdigest(),
        "num_files": len(files),
        "rows": rows,
        "bytes": sum(f.size for f in files),
        "options": dict(options),
    }


def check_state(state: object, expected: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a loaded state's shape and that it belongs to the dataset ``expected`` describes.

    Args:
        state: What ``json.load`` (or a checkpoint) gave back.
        expected: The dataset's :func:`fingerprint`.

    Returns:
        The state as a dict.

    Raises:
        ResumeStateError: the value is not a state of this format and version.
        StateMismatchError: it was saved for other data or other options; the
            message says what changed.
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
    if state.get("version") != STATE_VERSION:
        raise ResumeStateError(
            f"resume state version {state.get('version')!r} is not supported (this library reads "
            f"version {STATE_VERSION}); resume with the library version that saved it"
        )
    for key, kind in (("epoch", int), ("segments", list), ("fingerprint", dict)):
        if not isinstance(state.get(key), kind):
            raise ResumeStateError(f"resume state field {key!r} is missing or not a {kind.__name__}")
    saved = state["fingerprint"]
    changes = []
    for key in ("num_files", "rows", "bytes"):
        if saved.get(key) != expected[key]:
            changes.append(f"{key}: {saved.get(key)!r} in the state, {expected[key]!r} now")
    if not changes and saved.get("files_sha256") != expected["files_sha256"]:
        changes.append(
            "the files' paths, sizes or modification times differ (same number of files, rows and bytes)"
        )
    old_opts, new_opts = saved.get("options", {}), expected["options"]
    for key in sorted(set(old_opts) | set(new_opts)):
        if old_opts.get(key) != new_opts.get(key):
            changes.append(f"option {key}: {old_opts.get(key)!r} in the state, {new_opts.get(key)!r} now")
    if changes:
        raise StateMismatchError(
            "the resume state was saved for different data or options: "
            + "; ".join(changes)
            + ". Resume with the same files and options, or start the epoch afresh without the state"
        )
    for segment in state["segments"]:
        _check_segment(segment)
    return state


def _check_segment(segment: object) -> None:
    if not isinstance(segment, dict) or not isinstance(segment.get("ranks"), dict):
        raise ResumeStateError(f"resume state segment {segment!r} is malformed")
    num_ranks = segment.get("num_ranks")
    if not isinstance(num_ranks, int) or num_ranks < 1:
        raise ResumeStateError(f"resume state segment has num_ranks={num_ranks!r}")
    present = sorted(int(r) for r in segment["ranks"])
    if present != list(range(num_ranks)):
        missing = sorted(set(range(num_ranks)) - set(present))
        raise ResumeStateError(
            f"the resume state holds ranks {present} of a {num_ranks}-rank job (missing {missing}); "
            "merge the states of all ranks first (merge_states, or gather_state under torch.distributed)"
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
    first = states[0]
    for other in states[1:]:
        for key in ("format", "version", "fingerprint", "epoch"):
            if other.get(key) != first.get(key):
                raise ResumeStateError(
                    f"cannot merge states with different {key}: {first.get(key)!r} and {other.get(key)!r}; "
                    "merge the states every rank saved at the same step"
                )
        if other["segments"][:-1] != first["segments"][:-1]:
            raise ResumeStateError("cannot merge states that resumed from different checkpoints")
    merged = {k: v for k, v in first.items() if k != "segments"}
    if not first["segments"]:
        merged["segments"] = []
        return merged
    last: dict[str, Any] = {"num_ranks": first["segments"][-1]["num_ranks"], "ranks": {}}
    for state in states:
        if not state["segments"]:
            raise ResumeStateError("cannot merge a state at the start of an epoch with one in its middle")
        segment = state["segments"][-1]
        if segment["num_ranks"] != last["num_ranks"]:
            raise ResumeStateError(
                f"cannot merge states of {segment['num_ranks']} and {last['num_ranks']} ranks"
            )
        for rank, entry in segment["ranks"].items():
            if rank in last["ranks"] and last["ranks"][rank] != entry:
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
