"""The resume state as plain JSON values: its format, fingerprint, checks and merging.

A state is ``{"format", "version", "fingerprint", "epoch", "seed", "world", "segments"}``;
each segment is one interrupted pass over the epoch: ``{"num_ranks", "ranks": {rank:
{"num_workers", "cursors", "done"}}}``. What the segments mean for planning is in
:mod:`.resume`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from torch_dataloader_utils.errors import CheckpointMismatchError, ResumeStateError, StateMismatchError
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.plan.types import FileInfo

__all__ = [
    "STATE_FORMAT",
    "STATE_VERSION",
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
    digest_key = "files_digest" if "files_digest" in saved else "files_sha256"
    if not changes and saved.get(digest_key) != expected.get(digest_key):
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
