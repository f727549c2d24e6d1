"""The recipes of docs/recipes.md run, as written, on small data.

The mixture schedule and the recipe change (issue 36) run on small sources whose ids say
where each row comes from (:func:`tests.fixtures.recipes.write_source`), their constants
set small, and ``train_step`` recording every batch: the schedule's batches switch at the
stated step, and the changed recipe goes on where every source stood.

The packed-training recipe:

tests/test_doc_snippets.py type-checks every snippet; this one also runs: the snippet's
constants (``DATA``, ``SEQ_LEN``, ``VOCAB``, ``DOCUMENTS_PER_BATCH``) are set to a
small corpus whose documents are longer than a row, so split documents continue in
the next row (issue 33, item 18: their ``position_ids`` kept counting past ``SEQ_LEN``
and the example's position embedding of ``SEQ_LEN`` entries failed with IndexError).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from tests.fixtures.recipes import SOURCE_ID_BASE, once_per_epoch, write_source
from tests.test_doc_snippets import REPO, extract_snippets

SMALL = {"SEQ_LEN": 32, "VOCAB": 1_000, "DOCUMENTS_PER_BATCH": 16}


def _snippet(marker: str) -> str:
    """The one snippet of docs/recipes.md that holds ``marker``."""
    doc = "docs/recipes.md"
    [snippet] = [
        s for s in extract_snippets((REPO / doc).read_text(encoding="utf-8"), doc) if marker in s.code
    ]
    return snippet.code


def _training_recipe() -> str:
    return _snippet("class TinyLM")


def _run(code: str, values: dict[str, Any]) -> list[dict[str, list[int]]]:
    """Run ``code`` with ``values`` as its constants; the batches its ``train_step`` was given."""
    seen: list[dict[str, list[int]]] = []

    def train_step(batch: dict[str, torch.Tensor]) -> None:
        seen.append({"id": batch["id"].tolist(), "source": batch["source"].tolist()})

    scope: dict[str, Any] = {"__name__": "recipe", "train_step": train_step}
    exec(compile(_with_constants(code, values), "docs/recipes.md", "exec"), scope)
    return seen


def _sources(tmp_path: Path, rows: dict[str, int]) -> dict[str, str]:
    """Sources named (and with ids) in order: name -> path."""
    return {name: write_source(tmp_path / name, s, n) for s, (name, n) in enumerate(rows.items())}


def _make_up(batch: dict[str, list[int]], sources: int) -> list[int]:
    return np.bincount(batch["source"], minlength=sources).tolist()


def _with_constants(code: str, values: dict[str, Any]) -> str:
    for name, value in values.items():
        code, found = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", code, count=1, flags=re.MULTILINE)
        assert found == 1, f"the recipe no longer sets {name} at the top of a line"
    return code


def test_packed_training_recipe_runs(tmp_path: Path) -> None:
    rng = np.random.default_rng(18)
    lengths = rng.integers(1, 4 * SMALL["SEQ_LEN"], size=24)  # most documents span rows
    docs = [rng.integers(0, SMALL["VOCAB"], size=n).tolist() for n in lengths]
    data = tmp_path / "tokens"
    data.mkdir()
    for f in range(4):  # 24 row groups: enough chunks for the recipe's 2 workers to shuffle
        table = pa.table({"tokens": pa.array(docs[f::4], pa.list_(pa.int32()))})
        pq.write_table(table, data / f"{f}.parquet", row_group_size=1)
    code = _with_constants(_training_recipe(), {"DATA": str(data), **SMALL})
    torch.manual_seed(0)
    scope: dict[str, Any] = {"__name__": "recipe"}
    exec(compile(code, "docs/recipes.md", "exec"), scope)
    assert torch.isfinite(scope["loss"])
    assert int(scope["positions"].max()) < SMALL["SEQ_LEN"]


def test_the_schedule_recipe_switches_at_its_step(tmp_path: Path) -> None:
    paths = _sources(tmp_path, {"web": 400, "code": 150, "math": 61})
    values = {
        "WEB": paths["web"],
        "CODE": paths["code"],
        "MATH": paths["math"],
        "BATCH_SIZE": 10,
        "ANNEAL_AT": 12,
    }
    batches = _run(_snippet("ANNEAL_AT = "), values)
    made = [_make_up(b, 3) for b in batches]
    assert made[:12] == [[6, 3, 1]] * 12  # stage 0 to step 12 (a multiple of any worker count here)
    # Stage 1 from step 12 to the end, but for every epoch's last batches (filled up).
    assert sum(m == [4, 4, 2] for m in made[12:]) >= len(made[12:]) - 8
    assert made[12:16] == [[4, 4, 2]] * 4
    ids = [i for b in batches for i in b["id"]]
    assert len(set(ids) & set(range(400))) == 400  # two epochs: web, the anchor, read in full


def test_the_recipe_change_goes_on_where_every_source_stood(tmp_path: Path) -> None:
    rows = {"web": 400, "code": 150, "math": 61, "books": 90}
    paths = _sources(tmp_path, rows)
    values = {name.upper(): path for name, path in paths.items()} | {"BATCH_SIZE": 10, "STEPS_BEFORE": 12}
    # 12 steps: every worker (of any number here) read as many batches, so with
    # equal_batches="drop" the re-deal of the rests leaves no row out.
    batches = _run(_snippet("STEPS_BEFORE = "), values)
    before, after = batches[:12], batches[12:]
    assert [_make_up(b, 3) for b in before] == [[6, 3, 1]] * 12
    assert [_make_up(b, 3) for b in after[:4]] == [[4, 4, 2]] * 4  # web, code, books at the new weights

    def of(part: list[dict[str, list[int]]], name: str) -> list[int]:
        s = list(rows).index(name)
        return [i for b in part for i in b["id"] if i // SOURCE_ID_BASE == s]

    assert not of(after, "math")  # removed
    # web and code went on where they stood, books from its start: every row of a source
    # read as often as any other, within one (its epochs, each once, the last partly).
    read = once_per_epoch([i for b in batches for i in b["id"]], dict(enumerate(rows.values())))
    assert read[3] == len(of(after, "books")) >= 90
    assert len(set(of(before, "web") + of(after, "web"))) == 400  # the epoch of web (the anchor) in full
