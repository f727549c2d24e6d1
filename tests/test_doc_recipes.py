"""The packed-training recipe of docs/recipes.md runs, as written, on a small corpus.

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

from tests.test_doc_snippets import REPO, extract_snippets

SMALL = {"SEQ_LEN": 32, "VOCAB": 1_000, "DOCUMENTS_PER_BATCH": 16}


def _training_recipe() -> str:
    doc = "docs/recipes.md"
    [snippet] = [
        s for s in extract_snippets((REPO / doc).read_text(encoding="utf-8"), doc) if "class TinyLM" in s.code
    ]
    return snippet.code


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
