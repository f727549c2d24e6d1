"""Reading a training ledger: which rows step ``N`` of rank ``R`` saw, and the batch itself again.

:class:`Ledger` reads a ledger directory (``ledger=DIR``, :mod:`~torch_dataloader_utils.plan.ledger`).
The pass holding a step is the rank's last pass that started at or before it; from its
record the pass is planned again (:class:`PassReplay`), without the training job: the
files come from the ledger's manifest (no listing, no footers), the options and the
start state from its config and state files. The rows of the step's batch then follow
from the plan (:mod:`~torch_dataloader_utils.plan.lineage`); :meth:`Ledger.read` reads
only that batch's chunks, through a dataset built again from the recorded source, and
converts them as the loader did.

Secrets are not in a ledger: pass them again (``Ledger(DIR, storage_options=...)``), as
any option the ledger records by name only (a ``collate_fn``, a ``filesystem`` object, a
custom ``split_strategy``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from torch_dataloader_utils.errors import LedgerError
from torch_dataloader_utils.plan.ledger import EndRecord, PassRecord, SkipRecord, parse_record
from torch_dataloader_utils.plan.table import FileTable
from torch_dataloader_utils.runtime.ledger import merge_runs, read_json, read_manifest
from torch_dataloader_utils.tools import ledger_query
from torch_dataloader_utils.tools.ledger_query import Sighting
from torch_dataloader_utils.tools.replay import BatchLineage, LedgerPass, PassReplay
from torch_dataloader_utils.tools.replay_mixed import MixedReplay

__all__ = ["Ledger", "iter_steps"]


def _passes(records: Sequence[Any]) -> list[LedgerPass]:
    """The passes of one rank's records, in order, with their skips, ends and stops."""
    starts = [r for r in records if isinstance(r, PassRecord)]
    out: list[LedgerPass] = []
    for i, record in enumerate(starts):
        nxt = starts[i + 1] if i + 1 < len(starts) else None
        mine = [
            r
            for r in records
            if isinstance(r, (SkipRecord, EndRecord))
            and r.step == record.step
            and _between(records, record, nxt, r)
        ]
        skips: dict[int, list[tuple[int, int]]] = {}
        end = None
        for r in mine:
            if isinstance(r, SkipRecord):
                skips.setdefault(r.worker, []).extend(r.runs)
            else:
                end = r
        frozen = {w: merge_runs(v) for w, v in skips.items()}
        out.append(LedgerPass(record, frozen, end, None if nxt is None else nxt.step))
    return out


def _between(records: Sequence[Any], first: PassRecord, nxt: PassRecord | None, item: Any) -> bool:
    """Whether ``item`` comes after ``first`` and before ``nxt`` in ``records``."""
    ids = {id(r): i for i, r in enumerate(records)}
    at = ids[id(item)]
    return ids[id(first)] < at and (nxt is None or at < ids[id(nxt)])


class Ledger:
    """A training ledger, read (see the module).

    Args:
        path: The ledger directory (or one rank's ``.jsonl`` file in it).
        **overrides: Options the ledger does not hold, as the job passed them: secrets
            (``storage_options``, ``catalog_config``) and objects (``collate_fn``,
            ``filesystem``, ``split_strategy``); also any option to read with instead.

    Raises:
        LedgerError: the path holds no ledger, or a record is damaged.
    """

    def __init__(self, path: str | Path, **overrides: Any) -> None:
        root = Path(path)
        files = [root] if root.suffix == ".jsonl" else sorted(root.glob("rank-*.jsonl"))
        if not files:
            raise LedgerError(
                f"no ledger at {str(root)!r}: a ledger directory holds rank-<rank>.jsonl files "
                "(written by create_dataloader(..., ledger=DIR))"
            )
        self.root = root if root.suffix != ".jsonl" else root.parent
        self.overrides = dict(overrides)
        self._passes: dict[int, list[LedgerPass]] = {}
        for file in files:
            records = [
                parse_record(line, f"{file.name}:{n}")
                for n, line in enumerate(file.read_text().splitlines(), 1)
                if line.strip()
            ]
            for record in records:
                self._passes.setdefault(record.rank, [])
            for rank in {r.rank for r in records}:
                self._passes[rank] = _passes([r for r in records if r.rank == rank])
        self._replays: dict[tuple[int, int], PassReplay | MixedReplay] = {}
        self._configs: dict[str, dict[str, Any]] = {}
        self._tables: dict[str, FileTable] = {}

    @property
    def ranks(self) -> list[int]:
        """The ranks with records."""
        return sorted(self._passes)

    def passes(self, rank: int = 0) -> list[LedgerPass]:
        """Rank ``rank``'s passes, in the order they started."""
        return list(self._passes.get(rank, ()))

    def steps(self, rank: int = 0) -> int:
        """One past the last step rank ``rank`` is known to have received (0: none)."""
        passes = self.passes(rank)
        if not passes:
            return 0
        last = passes[-1]
        end = last.last_step
        return end if end is not None else last.step + self.replay(last).num_batches

    def pass_of(self, step: int, rank: int = 0) -> LedgerPass:
        """The pass that delivered ``step`` on ``rank``: the last one that started at or before it.

        Raises:
            LedgerError: no pass of the rank started at or before ``step``.
        """
        passes = self._passes.get(rank)
        if not passes:
            raise LedgerError(f"the ledger has no records of rank {rank}; it has ranks {self.ranks}")
        found = [p for p in passes if p.step <= step]
        if not found:
            raise LedgerError(f"rank {rank}'s first pass starts at step {passes[0].step}, after step {step}")
        return found[-1]

    def config(self, name: str) -> dict[str, Any]:
        """A config file of the ledger (parsed once)."""
        if name not in self._configs:
            self._configs[name] = read_json(self.root / name)
        return self._configs[name]

    def table(self, name: str) -> FileTable:
        """A files manifest of the ledger (loaded once)."""
        if name not in self._tables:
            self._tables[name] = read_manifest(self.root / name)
        return self._tables[name]

    def replay(self, ledger_pass: LedgerPass) -> PassReplay | MixedReplay:
        """The pass planned again (a mix's passes by :class:`~.replay_mixed.MixedReplay`)."""
        key = (ledger_pass.record.rank, ledger_pass.step)
        found = self._replays.get(key)
        if found is None or found.ledger_pass is not ledger_pass:
            kind = MixedReplay if ledger_pass.record.order == "mixed" else PassReplay
            found = self._replays[key] = kind(self, ledger_pass)
        return found

    def batch(self, step: int, rank: int = 0) -> BatchLineage:
        """Where every row of step ``step``'s batch on rank ``rank`` came from (no data is read).

        Raises:
            LedgerError: the rank has no pass holding the step.
        """
        ledger_pass = self.pass_of(step, rank)
        return self.replay(ledger_pass).lineage(step)

    def read(self, step: int, rank: int = 0) -> pa.RecordBatch:
        """Step ``step``'s batch on rank ``rank`` as Arrow before conversion: its rows, in order.

        Reads only that batch's chunks, through the source built again.

        Raises:
            FileChangedError: a file of the batch changed since the ledger recorded it.
            LedgerError: the source cannot be built again as recorded (a secret or an
                object not passed, an Iceberg snapshot expired).
        """
        return self.replay(self.pass_of(step, rank)).read(step)

    def replays(self, ranks: Iterable[int] | None = None) -> Iterator[tuple[LedgerPass, PassReplay]]:
        """Every pass of ``ranks`` (default: all), with its replay, in order (one source only).

        Raises:
            LedgerError: a pass read a mix of sources (the reverse questions cover one source).
        """
        for rank in self.ranks if ranks is None else ranks:
            for ledger_pass in self.passes(rank):
                replay = self.replay(ledger_pass)
                if isinstance(replay, MixedReplay):
                    raise LedgerError(
                        f"rank {rank}'s pass from step {ledger_pass.step} read a mix of sources: --where and "
                        "--deleted answer for a source read on its own; replay the mix's steps instead"
                    )
                yield ledger_pass, replay

    def where(
        self, condition: Any, *, ranks: Iterable[int] | None = None, prune: bool = True
    ) -> list[Sighting]:
        """Every step (of ``ranks``, default all) that received a row meeting ``condition``.

        ``condition``: a ``pyarrow.compute.Expression`` or text such as ``"id = 123"``
        (``COLUMN OP VALUE``). Chunks whose statistics exclude it are not read
        (``prune=False`` reads every chunk the passes read, to compare).

        Raises:
            FileChangedError: a candidate chunk's file changed since the ledger recorded it.
            LedgerError: the source cannot be built again (see :meth:`read`).
        """
        from torch_dataloader_utils.tools.source import parse_filter

        expression = parse_filter(condition) if isinstance(condition, str) else condition
        return ledger_query.where(self.replays(ranks), expression, prune=prune)

    def deleted(self, snapshot_id: int, *, ranks: Iterable[int] | None = None) -> list[Sighting]:
        """Every step (of ``ranks``) that trained on a row the Iceberg snapshot ``snapshot_id`` no longer has.

        Raises:
            LedgerError: the passes read no Iceberg table, or ``snapshot_id`` is not a later
                snapshot of the one they read.
        """
        return ledger_query.deleted(self.replays(ranks), snapshot_id)

    def rows(self, step: int, rank: int = 0) -> Any:
        """Step ``step``'s batch on rank ``rank`` exactly as the loop received it (converted)."""
        replay = self.replay(self.pass_of(step, rank))
        return replay.convert(replay.read(step))


def iter_steps(ledger: Ledger, rank: int) -> Iterator[tuple[LedgerPass, int]]:
    """``(pass, step)`` of every step of ``rank`` that counts (superseded steps left out)."""
    for ledger_pass in ledger.passes(rank):
        replay = ledger.replay(ledger_pass)
        end = ledger_pass.last_step
        last = replay.record.step + replay.num_batches
        for step in range(replay.record.step, last if end is None else min(end, last)):
            yield ledger_pass, step
