"""Rough edges found by the search for trouble (issue 33), each case as it was reported.

- 8: CSV / JSONL without ``schema=``: ``x`` inferred as int64 from the head of the file, and
  100 valid rows with ``x=200000.5`` later were counted as bad and dropped under ``skip``.
- 9: a bad line in the first MiB of a JSONL file failed the whole job even with ``skip``
  ("cannot infer column types from the first ... bytes").
- 10: a CSV with a quoted newline under ``skip``: a record lost and a made-up row
  ``{'id': 3, 'text': 'line"', 'n': 6}`` delivered.
- 19: a state whose keys are ``rank00`` or ``Rank0``, or whose entries were decoded to
  dicts, said "not a resume state (expected a dict ... got dict)"; a mixed loader's state
  given to a plain loader (and the reverse) did not say what it was. (DCP from 2 ranks to
  3: tests/runtime/test_checkpoint_launch.py.)
- 20: Lightning warned "your dataloader is not resumable" on every exact resume (a real
  Trainer's resumed fit: tests/test_lightning.py).
- 22: ``device='cpu'`` with ``output_format='numpy'`` was accepted and ignored.
- 23: ``plan --mix ... --picture p.png`` and ``simulate --mix ... --picture`` exited 0 and
  wrote no picture; ``"sources": "/path"`` and a malformed filter gave cryptic messages.
- 25: ``filters=`` of the wrong type raised another class than 0.2.0's ``TypeError`` when
  anything else was wrong too (a missing path, an empty directory, a missing table).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fixtures.iceberg import create_id_table, id_table
from tests.fixtures.recipes import SOURCE_ID_BASE, write_source
from torch_dataloader_utils import (
    BadDataError,
    CorruptFileError,
    DataFileInfo,
    IcebergDataset,
    IncompatibleOptionsError,
    InferredSchemaError,
    OptionTypeError,
    RecordBoundaryError,
    ResumeStateError,
    StructuredDataset,
    create_dataloader,
    create_mixed_dataloader,
    reshard,
)
from torch_dataloader_utils.cli import main
from torch_dataloader_utils.config import PADDING_COLUMN

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*worker.*:UserWarning", "ignore:shuffle=True mixes:UserWarning"
)


def delivered(path: Path, fmt: str, **options: Any) -> list[dict[str, Any]]:
    """Every row the loader delivers as data, in order (rows flagged as padding left out)."""
    loader, _ = create_dataloader(
        str(path), format=fmt, num_workers=0, batch_size=4096, output_format="arrow", **options
    )
    rows: list[dict[str, Any]] = []
    for batch in loader:
        rows += [r for r in batch.to_pylist() if not r.pop(PADDING_COLUMN, False)]
    return rows


# -- 8: a value valid under a wider type is not bad data -------------------------------
def late_decimals(path: Path, fmt: str) -> list[int]:
    """120,000 rows with integer ``x`` (more than the 1 MiB head), then 100 with ``x=200000.5``."""
    with open(path, "w") as f:
        if fmt == "csv":
            f.write("id,x\n")
        for i in range(120_100):
            x: float = i if i < 120_000 else 200000.5
            f.write(f"{i},{x}\n" if fmt == "csv" else json.dumps({"id": i, "x": x}) + "\n")
    assert path.stat().st_size > 1024**2
    return list(range(120_100))


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.parametrize("policy", ["skip", "raise"])
def test_33_8_valid_rows_after_the_inferred_head_are_not_dropped(
    tmp_path: Path, fmt: str, policy: str
) -> None:
    path = tmp_path / f"late.{fmt}"
    ids = late_decimals(path, fmt)
    with pytest.raises(InferredSchemaError, match=r"column 'x' from int64 to double") as exc:
        delivered(path, fmt, on_bad_data=policy)
    assert str(path) in str(exc.value)
    assert "schema=pyarrow.schema([('id', 'int64'), ('x', 'double')])" in str(exc.value)
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64())])  # the fix the error names
    rows = delivered(path, fmt, schema=schema, on_bad_data=policy)
    assert [r["id"] for r in rows] == ids
    assert [r["x"] for r in rows[-100:]] == [200000.5] * 100


def test_33_8_a_value_no_wider_type_holds_is_still_bad_data(tmp_path: Path) -> None:
    path = tmp_path / "late.jsonl"
    with open(path, "w") as f:
        f.writelines(json.dumps({"id": i, "x": i if i < 60_000 else "n/a"}) + "\n" for i in range(60_100))
    assert [r["id"] for r in delivered(path, "jsonl", on_bad_data="skip")] == list(range(60_000))


# -- 9: bad lines in the head do not stop inference ------------------------------------
def head_with_a_bad_line(path: Path) -> list[int]:
    """100 JSONL records; a line cut short after the 51st (in the head, at byte 1,000)."""
    with open(path, "w") as f:
        for i in range(100):
            f.write(json.dumps({"id": i, "x": i}) + "\n")
            if i == 50:
                f.write('{"id": 5000, "x": \n')
    return list(range(100))


def test_33_9_a_bad_line_in_the_head_is_skipped_like_any_other(tmp_path: Path) -> None:
    path = tmp_path / "head.jsonl"
    ids = head_with_a_bad_line(path)
    assert [r["id"] for r in delivered(path, "jsonl", on_bad_data="skip")] == ids
    with pytest.raises(BadDataError, match=r"line.*bytes \[1000, 1019\)"):
        delivered(path, "jsonl", on_bad_data="raise")


def test_33_9_a_head_where_no_line_parses_names_the_first_line(tmp_path: Path) -> None:
    path = tmp_path / "really.jsonl"
    path.write_text("id,x\n" + "".join(f"{i},{i}\n" for i in range(10)))  # a CSV file
    match = r"none of its 11 first lines parses \(line 1 at byte 0: .*\); is the format right\? Pass format="
    with pytest.raises(CorruptFileError, match=match):
        delivered(path, "jsonl")


# -- 10: records that span lines are never skipped as bad lines ------------------------
QUOTED = 'id,text,n\n1,a,1\n2,"first\n3,line",6\n4,b,4\n'


@pytest.mark.parametrize("split_bytes", [None, 25])  # 25: the quoted field opens at a range's end
def test_33_10_a_quoted_newline_under_skip_makes_no_row_up(tmp_path: Path, split_bytes: int | None) -> None:
    path = tmp_path / "q.csv"
    path.write_text(QUOTED)
    split = {} if split_bytes is None else {"split_bytes": split_bytes}
    with pytest.raises(RecordBoundaryError, match=r"quoted_newlines=True") as exc:
        delivered(path, "csv", on_bad_data="skip", shuffle=False, **split)
    assert str(path) in str(exc.value)
    rows = delivered(path, "csv", on_bad_data="skip", quoted_newlines=True)
    assert rows == [
        {"id": 1, "text": "a", "n": 1},
        {"id": 2, "text": "first\n3,line", "n": 6},
        {"id": 4, "text": "b", "n": 4},
    ]


# -- 19: a state that is not the one expected says what it is --------------------------
@pytest.fixture
def parquet_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    for f in range(2):
        pq.write_table(pa.table({"id": list(range(f * 100, f * 100 + 100))}), root / f"p{f}.parquet")
    return root


def started(loader: Any) -> dict[str, Any]:
    """The state of ``loader`` after two batches."""
    it = iter(loader)
    next(it)
    next(it)
    return loader.state_dict()  # type: ignore[no-any-return]


def test_33_19_rank_keys_spelled_otherwise_or_decoded_entries_say_so(parquet_dir: Path) -> None:
    state = started(create_dataloader(str(parquet_dir), batch_size=10, num_workers=0)[0])
    fresh, _ = create_dataloader(str(parquet_dir), batch_size=10, num_workers=0)
    for key in ("rank00", "Rank0"):
        with pytest.raises(
            ResumeStateError, match=rf"its keys \['{key}'\] are not rank keys: .*'rank0', 'rank1'"
        ):
            fresh.load_state_dict({key: state["rank0"]})
    with pytest.raises(ResumeStateError, match=r"its entry 'rank0' is a dict, not the JSON string"):
        fresh.load_state_dict({"rank0": json.loads(state["rank0"])})
    fresh.load_state_dict(state)  # the state as it was returned loads


def test_33_19_a_mixed_loaders_state_and_a_plain_one_say_which_they_are(parquet_dir: Path) -> None:
    plain = started(create_dataloader(str(parquet_dir), batch_size=10, num_workers=0)[0])
    sources = [{"path": str(parquet_dir)}, {"path": str(parquet_dir)}]
    mixed = started(create_mixed_dataloader(sources, [1, 1], batch_size=10, num_workers=0)[0])
    with pytest.raises(
        ResumeStateError, match=r"it is the state of a mixed loader \(create_mixed_dataloader\)"
    ):
        create_dataloader(str(parquet_dir), batch_size=10, num_workers=0)[0].load_state_dict(mixed)
    fresh_mix, _ = create_mixed_dataloader(sources, [1, 1], batch_size=10, num_workers=0)
    with pytest.raises(ResumeStateError, match=r"it is the state of a loader of files or an Iceberg table"):
        fresh_mix.load_state_dict(plain)


# -- 20: Lightning counts StructuredDataModule's train loader as resumable ---------------
def test_33_20_lightning_counts_the_train_loader_as_resumable(parquet_dir: Path) -> None:
    """Lightning warns "not resumable" unless every loader is its ``_Stateful``
    (``training_epoch_loop.reset``); the cursors stay the data module's entry.
    """
    pytest.importorskip("lightning")
    from lightning.fabric.utilities.types import _Stateful
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

    from torch_dataloader_utils.lightning import KEPT_BY, StructuredDataModule

    data = StructuredDataModule(str(parquet_dir), batch_size=16, num_workers=0)
    combined = CombinedLoader(data.train_dataloader())
    assert all(isinstance(loader, _Stateful) for loader in combined.flattened)  # Lightning's test
    assert combined._state_dicts() == [KEPT_BY]  # no cursors in Lightning's own entry
    combined._load_state_dicts([KEPT_BY])
    with pytest.raises(ResumeStateError, match=r"written for another train loader"):
        combined._load_state_dicts([{"rank0": "{}"}])


# -- 22: device needs torch output -----------------------------------------------------
@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_33_22_device_cpu_with_numpy_output_is_refused(tmp_path: Path, device: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(10)))
    with pytest.raises(
        IncompatibleOptionsError, match=rf"device='{device}'.*output_format='numpy' gives no tensors"
    ):
        create_dataloader(str(path), format="jsonl", device=device, output_format="numpy")


# -- 23: the command line --------------------------------------------------------------
def recipe(tmp_path: Path, **changes: Any) -> str:
    """A recipe of two sources (300 and 90 rows), as ``--mix`` text."""
    paths = [write_source(tmp_path / f"s{i}", i, n) for i, n in enumerate((300, 90))]
    body: dict[str, Any] = {"sources": [{"path": paths[0]}, {"path": paths[1]}], "weights": [3, 1]}
    return json.dumps({**body, **changes})


def test_33_23_plan_mix_picture_is_refused_not_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    picture = tmp_path / "p.png"
    assert main(["plan", "--mix", recipe(tmp_path), "--picture", str(picture)]) == 2
    err = capsys.readouterr().err
    assert "--picture applies to the plan of one source" in err
    assert "run plan SOURCE --picture for each source of the recipe, or drop --picture" in err
    assert not picture.exists()
    assert main(["plan", "--mix", recipe(tmp_path), "--verify"]) == 2
    assert "--verify applies to the plan of one source" in capsys.readouterr().err


def test_33_23_simulate_mix_picture_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    picture = tmp_path / "s.png"
    args = ["--num-ranks", "2", "--num-workers", "2", "--batch-size", "10", "--decode-rate", "1000"]
    code = main(
        ["simulate", "--mix", recipe(tmp_path), "--picture", str(picture), "--worker-start", "0", *args]
    )
    assert code == 0
    assert f"picture: {picture} (4 workers drawn)" in capsys.readouterr().out
    assert picture.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("sources", "says"),
    [
        (
            "/data/web",
            r'"sources" is the string \'/data/web\', not a list of sources; '
            r'write "sources": \[\{"path": "/data/web"\}\]',
        ),
        (
            ["/data/web"],
            r"sources\[0\] is the string '/data/web'; "
            r'each source is an object, e.g. \{"path": "/data/web"\}',
        ),
        (
            {"path": "/data/web"},
            r'"sources" is \{"path": "/data/web"\}; it must be a non-empty list of sources',
        ),
    ],
)
def test_33_23_sources_that_are_not_a_list_of_objects_name_the_key_and_fix(
    sources: object, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--mix", json.dumps({"sources": sources, "weights": [1]})])
    assert exit_.value.code == 2
    assert re.search(says, capsys.readouterr().err)


@pytest.mark.parametrize(
    ("filters", "says"),
    [
        (["label >>= 3"], r"sources\[1\]\.filters\[0\]: --filter 'label >>= 3': '>' is followed by '>= 3'"),
        (["label"], r"sources\[1\]\.filters\[0\]: --filter 'label' is not 'COLUMN OP VALUE'"),
        ({"label": 3}, r'sources\[1\]\.filters is \{"label": 3\}; give --filter texts, e.g. "filters": \['),
    ],
)
def test_33_23_a_malformed_filter_in_a_recipe_is_named_by_its_place(
    tmp_path: Path, filters: object, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    body = json.loads(recipe(tmp_path))
    body["sources"][1]["filters"] = filters
    with pytest.raises(SystemExit) as exit_:  # a message, not a traceback
        main(["plan", "--mix", json.dumps(body)])
    assert exit_.value.code == 2
    assert re.search(says, capsys.readouterr().err)


def test_33_23_one_filter_text_in_a_recipe_is_taken_as_a_list_of_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = json.loads(recipe(tmp_path))
    body["sources"][1]["filters"] = "label >= 3"
    assert main(["plan", "--mix", json.dumps(body), "--batch-size", "10", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["epochs"][0]["sources"][1]["rows"] == sum(
        1 for i in range(90) if (i + SOURCE_ID_BASE) % 7 >= 3
    )


# -- 25: filters of the wrong type are a TypeError, whatever else is wrong ---------------
WRONG_FILTERS = [{"id": 1}, "id > 3", [("id", ">", 3)]]


@pytest.mark.parametrize("filters", WRONG_FILTERS)
def test_33_25_wrong_filters_are_a_type_error_before_the_path_is_read(
    tmp_path: Path, filters: object
) -> None:
    missing = str(tmp_path / "missing")
    builds = [
        lambda: StructuredDataset(missing, filters=filters),
        lambda: StructuredDataset(files=[DataFileInfo(missing)], filters=filters),  # 0.2.0's inputs
        lambda: create_dataloader(str(tmp_path), filters=filters),  # an empty directory
        lambda: create_mixed_dataloader([{"path": missing, "filters": filters}, {"path": missing}], [1, 1]),
        lambda: reshard(missing, str(tmp_path / "out"), filters=filters),
    ]
    for build in builds:
        with pytest.raises(TypeError, match=r"filters=.* must be a pyarrow.compute.Expression") as exc:
            build()
        assert isinstance(exc.value, OptionTypeError)
        assert f"(a {type(filters).__name__})" in str(exc.value)


def test_33_25_iceberg_wrong_filters_are_a_type_error_before_the_table_is_loaded(
    iceberg_catalog: tuple[dict[str, str], Any],
) -> None:
    config, catalog = iceberg_catalog
    create_id_table(catalog).append(id_table(0, 10))
    for table in ("ns.t", "ns.missing"):
        with pytest.raises(TypeError, match=r"filters=\{'id': 1\} \(a dict\) must be"):
            IcebergDataset(table=table, catalog_config=config, filters={"id": 1})
