"""Findings 11, 14, 15, 16 and 24 of the search for silent failures (issue 33), end to end.

- 11: the stand-ins of ``on_bad_data='skip'`` (all-zero rows) reached a mix's batches with
  no ``_is_padding``: 200 rows ``id=0, x=0.0``.
- 14: weights like ``[1, 0.0004]`` raised ``ZeroDivisionError`` (their fractions, limited to
  denominators of 1,000, became 0), in ``plan --mix`` too; numpy scalar weights were refused
  as "not a finite number".
- 15: a source with no rows (or a filter keeping none, or fewer rows than lanes) gave a raw
  ``RuntimeError`` from a worker: "a source's lane stream ended before its planned rows".
- 16: sources with the same default name (``data/v1/train``, ``data/v2/train``) were
  accepted and ``rows_by_source`` merged them under ``train``.
- 24: the idle-workers warning named no dataset and advised a lower split where that
  cannot help (elastic order, small text files); warnings named library lines
  (``recipes.py:1157``, ``files.py:254``) instead of the user's call.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.fixtures.e2e import column_chunk_range, corrupt
from tests.fixtures.recipes import SOURCE_ID_BASE, write_source
from torch_dataloader_utils import (
    ConfigError,
    IncompatibleOptionsError,
    StructuredDataset,
    create_dataloader,
    create_mixed_dataloader,
)
from torch_dataloader_utils.config import PADDING_COLUMN


def _with_bad_group(root: Path, index: int, rows: int) -> tuple[str, set[int]]:
    """A source of ``rows`` rows in groups of 100 whose second group's ``id`` chunk is garbage."""
    path = write_source(root, index, rows, files=1, row_group_size=100)
    part = Path(path) / "part-0.parquet"
    corrupt(part, [column_chunk_range(part, 1, "id")])
    bad = set(range(index * SOURCE_ID_BASE + 100, index * SOURCE_ID_BASE + 200))
    return path, bad


@pytest.mark.parametrize("policy", ["drop", "pad"])
@pytest.mark.parametrize("workers", [0, 2])
def test_33_11_standins_of_skipped_units_never_pass_as_a_mixs_rows(
    tmp_path: Path, policy: str, workers: int
) -> None:
    bad_source, bad = _with_bad_group(tmp_path / "a", 0, 600)
    good_source = write_source(tmp_path / "b", 1, 300)
    loader, _ = create_mixed_dataloader(
        [{"path": bad_source}, {"path": good_source}],
        [2, 1],
        on_bad_data="skip",
        equal_batches=policy,
        batch_size=30,
        num_workers=workers,
    )
    ids: list[int] = []
    flagged = 0
    for batch in loader:
        kept = batch["id"]
        if PADDING_COLUMN in batch:
            flagged += int(batch[PADDING_COLUMN].sum())
            kept = kept[~batch[PADDING_COLUMN]]
        ids += kept.tolist()
    assert not set(ids) & bad  # the bad group's rows never arrive
    assert ids.count(0) <= 1  # no all-zero stand-in row passes as a row (id 0 is a real row, once)
    first_source = sorted(i for i in ids if i < SOURCE_ID_BASE)
    assert first_source == sorted(set(range(600)) - bad)  # the anchor's good rows, once
    assert flagged == (100 if policy == "pad" else 0)  # stand-ins flagged as padding, or left out


@pytest.mark.parametrize(
    "weights", [[1, 0.0004], [0.0004, 0.0002], [np.float32(0.6), np.float64(0.4)], [np.int64(3), 1]]
)
def test_33_14_weights_small_or_numpy_are_taken(mix_sources: list[str], weights: list[float]) -> None:
    loader, dataset = create_mixed_dataloader(
        [{"path": p} for p in mix_sources[:2]], weights, batch_size=10, num_workers=0, source_column="source"
    )
    shares = dataset.blend.shares
    expected = np.asarray(weights, dtype=float) / float(np.sum(np.asarray(weights, dtype=float)))
    assert np.allclose(shares, expected, atol=1e-4)
    assert next(iter(loader))["id"].shape == (10,)


def test_33_14_a_share_too_small_to_keep_is_named(mix_sources: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"a source's share of 1e-09 is below the smallest a mix keeps"):
        create_mixed_dataloader([{"path": p} for p in mix_sources[:2]], [1, 1e-9], num_workers=0)


def test_33_14_plan_mix_takes_small_weights(
    mix_sources: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from torch_dataloader_utils.cli import main

    recipe = json.dumps({"sources": [{"path": p} for p in mix_sources[:2]], "weights": [1, 0.0004]})
    assert main(["plan", "--mix", recipe, "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["epochs"][0]["period"] == 2501


def test_33_15_a_source_without_rows_is_named_when_the_mix_is_built(
    tmp_path: Path, mix_sources: list[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    pq.write_table(
        pa.table(
            {
                "id": pa.array([], pa.int64()),
                "x": pa.array([], pa.float32()),
                "label": pa.array([], pa.int64()),
            }
        ),
        empty / "a.parquet",
    )
    with pytest.raises(ConfigError, match=r"source 'empty' has no rows"):
        create_mixed_dataloader([{"path": mix_sources[0]}, {"path": str(empty)}], [1, 1], num_workers=0)
    with pytest.raises(ConfigError, match=r"source 's1' has no rows .* a filter that keeps nothing"):
        create_mixed_dataloader(
            [{"path": mix_sources[0]}, {"path": mix_sources[1], "filters": pc.field("id") < 0}],
            [1, 1],
            num_workers=0,
        )
    few = write_source(tmp_path / "few", 2, 3, files=1)
    with pytest.raises(IncompatibleOptionsError, match=r"source 'few' has 3 rows for the mix's 4 lanes"):
        create_mixed_dataloader(
            [{"path": mix_sources[0]}, {"path": few}], [1, 1], num_ranks=2, rank=0, num_workers=2
        )


def test_33_16_sources_of_one_default_name_are_told_apart(tmp_path: Path) -> None:
    v1 = write_source(tmp_path / "data" / "v1" / "train", 0, 200)
    v2 = write_source(tmp_path / "data" / "v2" / "train", 1, 100)
    loader, dataset = create_mixed_dataloader(
        [{"path": v1}, {"path": v2}], [2, 1], batch_size=10, num_workers=0
    )
    assert dataset.source_names == ("v1/train", "v2/train")
    for _ in loader:
        pass
    by_source = loader.metrics().rows_by_source
    assert set(by_source) == {"v1/train", "v2/train"}
    assert by_source["v1/train"] == 200  # the anchor's epoch, once: not merged with v2's
    with pytest.raises(ConfigError, match=r"sources \[0, 1\] are all named 'train'"):
        create_mixed_dataloader(
            [{"path": v1, "name": "train"}, {"path": v2, "name": "train"}], [1, 1], num_workers=0
        )


def test_33_24_idle_workers_in_elastic_order_are_told_the_fix_that_helps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_source(tmp_path / "data", 0, 2000, files=4, row_group_size=50)
    with caplog.at_level(logging.WARNING, logger="torch_dataloader_utils"):
        StructuredDataset(
            str(tmp_path / "data"), num_ranks=2, rank=0, batch_size=4, canonical_ranks=4, num_workers=4
        )
    [message] = [r.getMessage() for r in caplog.records if "nothing to read" in r.getMessage()]
    assert "Use num_workers <= 2: in elastic order a worker reads whole canonical streams" in message
    assert "Lower split" not in message
    assert str(tmp_path / "data") in message  # the dataset is named


def test_33_24_idle_workers_over_small_text_files_are_not_told_to_lower_the_split(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "text"
    root.mkdir()
    for f in range(2):
        (root / f"p{f}.jsonl").write_text(
            "".join(json.dumps({"id": i}) + "\n" for i in range(f * 100, f * 100 + 100))
        )
    with caplog.at_level(logging.WARNING, logger="torch_dataloader_utils"):
        StructuredDataset(str(root), format="jsonl", num_workers=4, split_bytes=1 << 20)
    [message] = [r.getMessage() for r in caplog.records if "nothing to read" in r.getMessage()]
    assert "Lower split" not in message  # a file under 1 MiB is one range whatever the split
    assert "Rewrite the data with more files" in message
    assert str(root) in message


def test_33_24_warnings_name_the_users_line(tmp_path: Path, mix_sources: list[str]) -> None:
    write_source(tmp_path / "data", 0, 400, files=8, row_group_size=50)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        create_dataloader(
            str(tmp_path / "data"), num_workers=2, shuffle=True, split_rows=400
        )  # too few chunks
        create_mixed_dataloader([{"path": p} for p in mix_sources], [3, 2, 1], shuffle=True, num_workers=2)
    said = [w for w in caught if "chunks per" in str(w.message)]
    assert len(said) == 2, [str(w.message) for w in caught]
    assert {Path(w.filename).name for w in said} == {Path(__file__).name}
    mixed = str(said[1].message)
    assert "2 workers" in mixed  # the mix's lanes: its workers, not each source's 0 (was "1 workers")
