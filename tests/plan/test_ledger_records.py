"""The ledger's records: one JSON line each, version 1, parsed strictly, unknown keys ignored."""

from __future__ import annotations

import json

import pytest

from torch_dataloader_utils.errors import LedgerError
from torch_dataloader_utils.plan.ledger import (
    LEDGER_VERSION,
    EndRecord,
    PassRecord,
    SkipRecord,
    pack_runs,
    parse_record,
    rank_file,
    to_line,
    unpack_runs,
)

PASS = PassRecord(
    rank=1,
    num_ranks=2,
    num_workers=2,
    epoch=3,
    step=1200,
    order="planned",
    groups=1024,
    config="config-abc.json",
    files=("files-0123.npz",),
    start=None,
    time=1.5,
    library="0.7.0",
)


@pytest.mark.parametrize(
    "record",
    [
        PASS,
        SkipRecord(rank=0, step=4, worker=1, runs=((77, 10),)),
        SkipRecord(rank=0, step=4, worker=1, runs=((3, 1), (5, 2), (1000, 130), (2**40, 7))),
        EndRecord(rank=0, step=4, batches=9, completed=True),
    ],
)
def test_a_record_is_one_line_that_parses_back(record: object) -> None:
    line = to_line(record)  # type: ignore[arg-type]
    assert line.endswith("\n")
    assert line.count("\n") == 1
    assert json.loads(line)["ledger"] == LEDGER_VERSION
    assert parse_record(line, "x:1") == record


def test_a_pass_record_is_a_few_hundred_bytes() -> None:
    assert len(to_line(PASS)) < 300


def test_scattered_runs_are_packed_to_a_few_bytes_each() -> None:
    runs = tuple((3 * i, 1 + i % 2) for i in range(0, 30000, 1))  # a unit's rows scattered by a row mix
    line = to_line(SkipRecord(rank=0, step=0, worker=0, runs=runs))
    assert len(line) < 2 * len(runs)
    assert parse_record(line, "x:1").runs == runs  # type: ignore[union-attr]
    assert unpack_runs(pack_runs(runs)) == runs


def test_unknown_keys_are_ignored() -> None:
    value = json.loads(to_line(PASS))
    value["added_later"] = {"anything": 1}
    assert parse_record(json.dumps(value), "x:1") == PASS


def test_another_version_is_refused_naming_it() -> None:
    value = {**json.loads(to_line(PASS)), "ledger": 2}
    with pytest.raises(LedgerError, match=r"version 2.*reads version 1"):
        parse_record(json.dumps(value), "rank-00001.jsonl:7")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"rank": True}, "rank: must be an int"),
        ({"step": -1}, "step: must be an int >= 0"),
        ({"order": "random"}, "order: must be one of planned, elastic, mixed"),
        ({"files": "files-1.npz"}, "files: must be a list of strings"),
        ({"rank": 2}, "rank: must be below num_ranks=2"),
        ({"kind": "nothing"}, "kind: must be one of end, pass, skip"),
        ({"kind": "skip", "runs": "not base64!"}, "runs: must be runs packed by pack_runs"),
    ],
)
def test_a_damaged_record_is_refused_naming_the_field(change: dict[str, object], words: str) -> None:
    value = {**json.loads(to_line(PASS)), **change}
    with pytest.raises(LedgerError, match=words):
        parse_record(json.dumps(value), "rank-00001.jsonl:7")


def test_a_line_that_is_not_json_is_refused() -> None:
    with pytest.raises(LedgerError, match=r"rank-00000\.jsonl:3 is not JSON"):
        parse_record('{"ledger": 1, "kind": "pa', "rank-00000.jsonl:3")


def test_rank_files_sort_by_rank() -> None:
    assert rank_file(3) == "rank-00003.jsonl"
    assert sorted(rank_file(r) for r in (10, 2, 100)) == [rank_file(r) for r in (2, 10, 100)]
