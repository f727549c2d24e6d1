"""The command line: --version, defaults in help, one-line errors with status 2, the entry point."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.data import write_parquet_files
from torch_dataloader_utils import __version__
from torch_dataloader_utils.cli import main
from torch_dataloader_utils.tools.source import parse_filter, parse_storage_option

REPO = Path(__file__).resolve().parents[1]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"torch-dataloader-utils {__version__}\n"


@pytest.mark.parametrize("command", ["plan", "inspect", "simulate"])
def test_help_shows_every_default(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in (
        "rows per batch (default: 1024)",
        "target chunk size, e.g. 128MiB (default: 64MiB)",
        "(default: drop)",
        "ranks of the job (default: 1)",
        "DataLoader workers per rank (0: read in the main process) (default: 0)",
        "file format (default: parquet)",
    ):
        assert text in out

    # Every option but flags shows its default.
    from torch_dataloader_utils.cli import _Help, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    formatter = _Help(command)
    options = [a for a in sub.choices[command]._actions if a.option_strings and a.nargs != 0]
    assert len(options) > 15
    for action in options:
        assert "(default" in (formatter._get_help_string(action) or ""), action.option_strings


def test_reshard_help_shows_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["reshard", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "bytes per shard, e.g. 256MiB (default: 256MiB)" in out
    from torch_dataloader_utils.cli import _Help, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    formatter = _Help("reshard")
    options = [a for a in sub.choices["reshard"]._actions if a.option_strings and a.nargs != 0]
    assert len(options) > 15
    for action in options:
        assert "(default" in (formatter._get_help_string(action) or ""), action.option_strings


def test_user_errors_are_one_line_with_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_parquet_files(tmp_path / "d", [100])
    cases = [
        (["plan", str(tmp_path / "missing")], "PathNotFoundError: path="),
        (["plan", str(tmp_path / "d"), "--columns", "nope"], "UnknownColumnError: columns=['nope']"),
        (
            ["plan", str(tmp_path / "d"), "--batch-size", "0"],
            "argument --batch-size: '0' must be an integer >= 1",
        ),
        (["plan", str(tmp_path / "d"), "--filter", "id ~ 1"], "is not 'COLUMN OP VALUE'"),
        (["plan", str(tmp_path / "d"), "--split-bytes", "lots"], "split_bytes='lots' is not a size"),
        (["plan", str(tmp_path / "d"), "--table", "ns.t"], "pass PATH or --table, not both"),
        (["plan"], "pass PATH (files) or --table NAMESPACE.TABLE (Iceberg)"),
        (["inspect", str(tmp_path / "d"), "--storage-option", "novalue"], "must be KEY=VALUE"),
        (["simulate", str(tmp_path / "d"), "--latency-ms", "-1"], "'-1' must be a number >= 0"),
        (["plan", str(tmp_path / "d"), "--picture", str(tmp_path / "p.gif")], "must end in .png, .svg, .pdf"),
        (["nope"], "invalid choice: 'nope'"),
        (["reshard", str(tmp_path / "d"), str(tmp_path / "o"), "--row-group-size", "xrows"], "give bytes"),
        (["reshard", str(tmp_path / "d"), str(tmp_path / "o"), "--storage-options", "[1]"], "a JSON object"),
        (["reshard", str(tmp_path / "missing"), str(tmp_path / "o")], "PathNotFoundError: "),
    ]
    for argv, words in cases:
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse's own errors
            status = int(exc.code or 0)
        err = capsys.readouterr().err
        assert status == 2, argv
        assert err.count("\n") == 1, err
        assert "Traceback" not in err
        assert words in err, (argv, err)
        assert err.startswith("torch-dataloader-utils")


def test_entry_point_runs_as_a_module(tmp_path: Path) -> None:
    write_parquet_files(tmp_path, [100])
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "torch_dataloader_utils", "plan", str(tmp_path / "nope")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("torch-dataloader-utils plan: error: PathNotFoundError: ")
    assert done.stderr.count("\n") == 1


def test_filter_and_storage_option_parsing() -> None:
    import pyarrow as pa

    table = pa.table({"a": [1, 2, 3, None], "s": ["x", "y", "z", "x"]})
    cases = {
        "a >= 2": [2, 3],
        "a == 1": [1],
        "a != 1": [2, 3],
        "a in 1, 3": [1, 3],
        "a not in (1, 3)": [2],
        "a is null": [None],
        "a is not null": [1, 2, 3],
        "s == x": [1, None],
        's == "y"': [2],
    }
    for text, ids in cases.items():
        assert table.filter(parse_filter(text)).column("a").to_pylist() == ids, text
    assert parse_storage_option("anon=true") == ("anon", True)
    assert parse_storage_option("endpoint_url=http://h:9000") == ("endpoint_url", "http://h:9000")
    assert parse_storage_option('client_kwargs={"region_name": "x"}') == (
        "client_kwargs",
        {"region_name": "x"},
    )


def test_a_malformed_filter_says_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 33, item 23: ``>>=`` was read as ``> ">= 3"``, then refused for a kernel it lacks."""
    with pytest.raises(ValueError, match=r"'>' is followed by '>= 3', which starts with an operator"):
        parse_filter("label >>= 3")
    with pytest.raises(ValueError, match=r"'==' is followed by '= 1'"):
        parse_filter("label === 1")
    data = write_parquet_files(tmp_path, [20])[0].parent
    assert main(["plan", str(data), "--filter", "id >= three"]) == 2
    err = capsys.readouterr().err
    assert 'filters=(id >= "three") cannot be applied to this data' in err
    assert "compare each column with a value of its type" in err
    assert "the columns: id: int64" in err
