"""Issue 28, item 21 (obscure messages): a resume state, the commands and an ignored option.

* A state whose ints became floats (through a tool that stores numbers as floats) was
  "version 1.0 not supported", as if another library version had saved it.
* ``simulate`` with a zero bandwidth, cores, decode rate or receive rate raised
  ``ZeroDivisionError``; negative rates were accepted and predicted nonsense.
* ``plan --num-ranks 1000000000`` raised numpy's ``MemoryError`` (or ran for minutes).
* ``inspect --table`` called an Iceberg table's deleted rows "pruned by filters".
* ``metadata_cache`` with ``format="csv"`` was silently ignored.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from testsupport.iceberg_tables import commit_deletes, data_files, position_delete_file

from tests.bounds import assert_ends_within
from tests.fixtures.data import write_parquet_files
from tests.fixtures.iceberg import create_id_table, id_table
from torch_dataloader_utils import (
    ConfigError,
    IncompatibleOptionsError,
    ResumeStateError,
    create_dataloader,
)
from torch_dataloader_utils.cli import main
from torch_dataloader_utils.tools.simulate import SimulateRequest, StorageModel
from torch_dataloader_utils.tools.source import Source


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("obscure") / "data"
    write_parquet_files(path, [300, 200], row_group_size=50, with_strings=False)
    return str(path)


def _floats(value: Any) -> Any:
    """``value`` with every int a float, as a JavaScript or YAML round trip leaves it."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats(v) for v in value]
    return value


def test_28_21_state_whose_ints_became_floats(root: str) -> None:
    loader, _ = create_dataloader(root, num_workers=0, batch_size=32, shuffle=True)
    it = iter(loader)
    next(it)
    state = _floats(json.loads(json.dumps(loader.dataset.state_dict())))
    del it
    other, _ = create_dataloader(root, num_workers=0, batch_size=32, shuffle=True)
    with pytest.raises(ResumeStateError) as err:
        other.load_state_dict(state)
    text = str(err.value)
    assert "integers became floats" in text
    assert "state.version=2.0" in text
    assert "not supported" not in text


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--bandwidth-mib", "0"),
        ("--bandwidth-mib", "-5"),
        ("--receive-mib", "0"),
        ("--receive-mib", "-1"),
        ("--decode-rate", "0"),
        ("--decode-rate", "-100"),
        ("--cores-per-rank", "0"),
        ("--cores-per-rank", "nan"),
    ],
)
def test_28_21_simulate_refuses_zero_and_negative_rates(
    root: str, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", root, flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: '{value}' must be a number > 0" in err


@pytest.mark.parametrize(
    ("storage", "request_options", "words"),
    [
        ({"bandwidth": 0.0}, {}, r"bandwidth=0\.0 must be a finite number > 0 \(--bandwidth-mib"),
        ({"receive_rate": -1.0}, {}, r"receive_rate=-1\.0 must be a finite number > 0 \(--receive-mib"),
        ({"latency_sec": -0.1}, {}, r"latency_sec=-0\.1 must be a finite number >= 0 \(--latency-ms"),
        ({"concurrency": 0}, {}, r"concurrency=0 must be an int >= 1"),
        ({}, {"decode_rate": 0.0}, r"decode_rate=0\.0 must be a finite number > 0 \(--decode-rate"),
        ({}, {"cores_per_rank": 0.0}, r"cores_per_rank=0\.0 must be a finite number > 0"),
        ({}, {"step_sec": -1.0}, r"step_sec=-1\.0 must be a finite number >= 0 \(--step-ms"),
    ],
)
def test_28_21_simulate_models_check_their_figures(
    root: str, storage: dict[str, Any], request_options: dict[str, Any], words: str
) -> None:
    with pytest.raises(ConfigError, match=words):
        SimulateRequest(source=Source(path=root), storage=StorageModel(**storage), **request_options)


@pytest.mark.parametrize(
    "argv",
    [
        ["--num-ranks", "1000000000"],
        ["--num-ranks", "65537"],
        ["--num-ranks", "4096", "--num-workers", "512"],
    ],
)
@pytest.mark.parametrize("command", ["plan", "inspect", "simulate"])
def test_28_21_huge_worlds_are_refused_at_once(
    root: str, command: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.perf_counter()
    assert main([command, root, *argv]) == 2
    assert_ends_within(time.perf_counter() - started, 6)  # refused before any planning
    err = capsys.readouterr().err
    assert "ConfigError" in err
    assert "at most 65,536 ranks and 1,048,576 ranks x workers" in err
    assert "MemoryError" not in err


def test_28_21_inspect_table_calls_deleted_rows_deleted(
    iceberg_catalog: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config, catalog = iceberg_catalog
    table = create_id_table(catalog)
    table.append(id_table(0, 100))
    table.append(id_table(100, 100))
    first, second = data_files(table)
    commit_deletes(table, [position_delete_file(table, {first: [0, 5, 17, 99], second: range(30, 45)})])
    assert main(["inspect", "--table", "ns.t", "--catalog-config", json.dumps(config)]) == 0
    out = capsys.readouterr().out
    assert "19 rows deleted" in out
    assert "pruned" not in out
    assert main(["inspect", "--table", "ns.t", "--catalog-config", json.dumps(config), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert (found["rows"], found["live_rows"], found["deleted_rows"]) == (200, 181, 19)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "orc"])
def test_28_21_metadata_cache_on_another_format_is_refused(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"a.{fmt}"
    if fmt == "orc":
        import pyarrow as pa
        import pyarrow.orc as po

        po.write_table(pa.table({"id": [1, 2]}), path)
    else:
        path.write_text("id\n1\n2\n" if fmt == "csv" else '{"id": 1}\n{"id": 2}\n')
    with pytest.raises(IncompatibleOptionsError) as err:
        create_dataloader(str(path), format=fmt, metadata_cache=str(tmp_path / "meta.arrow"))
    assert f"applies to format='parquet' only (got format={fmt!r}" in str(err.value)
    assert not (tmp_path / "meta.arrow").exists()
