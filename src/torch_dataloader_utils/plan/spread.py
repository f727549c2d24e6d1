"""How many files a batch draws from: the expected figure for a reader's pieces, from counts alone.

A piece read in file order gives batches of consecutive rows of one chunk: one file. A
shuffled window or a mix draws every batch from a seeded permutation of its chunks' rows
(a mix round by round, each round holding the streams in proportion to their sizes), so
a batch of ``b`` rows is close to a uniform sample of them: file ``f``, holding a share
``p_f`` of the piece's rows, is in the batch with probability ``1 - (1 - p_f) ** b``, and
the expected number of files is the sum of those. The figure ignores the few batches
that straddle two pieces and a mix's last rounds, where exhausted streams leave fewer
files: it is the expectation the commands print (``plan``, ``inspect``) and that the
runtime compares with what the mixing needs. It needs no data: chunk weights and paths.

Pure: stdlib only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from torch_dataloader_utils.plan.pieces import Piece

__all__ = ["SPREAD_RANKS", "FileSpread", "piece_files_per_batch"]

SPREAD_RANKS = 64
"""Ranks whose readers a figure of a large job is computed over (the first ones): enough to
be representative, few enough to plan at once."""


def piece_files_per_batch(piece: Piece, batch_size: int) -> float:
    """Expected distinct files in a batch of ``batch_size`` rows drawn from ``piece``."""
    if piece.key is None or len(piece.chunks) < 2:
        return 1.0
    weights: dict[str, int] = {}
    for chunk in piece.chunks:
        weights[chunk.path] = weights.get(chunk.path, 0) + max(0, chunk.weight)
    total = sum(weights.values())
    if total <= 0 or len(weights) == 1:
        return 1.0
    rows = piece.num_rows
    draw = max(1, min(batch_size, rows if rows is not None else batch_size))
    return sum(1.0 - (1.0 - w / total) ** draw for w in weights.values())


@dataclass
class FileSpread:
    """Expected files per batch, averaged over the batches of several readers' pieces.

    Attributes:
        batch_size: Rows per batch.
        files: Sum over batches of the expected files of each.
        batches: Batches counted.
    """

    batch_size: int
    files: float = 0.0
    batches: float = 0.0

    def add(self, pieces: Iterable[Piece]) -> None:
        """Count one reader's pieces (each weighs its number of batches)."""
        for piece in pieces:
            rows = piece.num_rows
            weight = rows if rows is not None else piece.weight
            if weight <= 0:
                continue
            batches = weight / self.batch_size
            self.files += batches * piece_files_per_batch(piece, self.batch_size)
            self.batches += batches

    def add_all(self, readers: Sequence[Iterable[Piece]]) -> None:
        """Count several readers' pieces."""
        for pieces in readers:
            self.add(pieces)

    @property
    def mean(self) -> float | None:
        """Expected files per batch, or ``None`` when no batch was counted."""
        return self.files / self.batches if self.batches else None
