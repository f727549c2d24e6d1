"""The training ledger end to end: a loop records its passes; replay gives back every batch it received."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from tests.fixtures.data import write_parquet_files
from tests.plan.test_lineage import reference_order
from torch_dataloader_utils import FileChangedError, Ledger, LedgerError, SequencePack, create_dataloader
from torch_dataloader_utils.plan.lineage import Delivery

pytestmark = pytest.mark.filterwarnings("ignore:shuffle=True mixes the rows")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    write_parquet_files(root, [300, 257, 410, 190], row_group_size=64)
    return root


def delivered(loader: Any, dataset: Any, epochs: int) -> Iterator[dict[str, torch.Tensor]]:
    """Every batch of ``epochs`` epochs, as the loop receives them (step = its position)."""
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        yield from loader


def assert_same(got: Any, expected: Any) -> None:
    """The same values in the same order: tensors, tuples of them (packed lists), dicts, lists."""
    assert type(got) is type(expected)
    if isinstance(expected, torch.Tensor) and expected.is_nested:  # jagged: values and offsets
        assert torch.equal(got.values(), expected.values())
        assert torch.equal(got.offsets(), expected.offsets())
    elif isinstance(expected, torch.Tensor):
        assert torch.equal(got, expected)
    elif isinstance(expected, dict):
        assert list(got) == list(expected)
        for name, value in expected.items():
            assert_same(got[name], value)
    elif isinstance(expected, (tuple, list)):
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            assert_same(a, b)
    else:
        assert got == expected


SLOW = pytest.mark.slow  # over 1.5 CPU seconds (DataLoader workers started)
CASES = [
    pytest.param({}, id="plain"),
    pytest.param({"num_workers": 2}, id="workers", marks=SLOW),
    pytest.param({"shuffle": True, "num_workers": 2}, id="shuffle", marks=SLOW),
    pytest.param({"shuffle": True, "row_interleave": 100, "num_workers": 2}, id="row mixing", marks=SLOW),
    pytest.param({"shuffle": True, "row_shuffle_window": 300, "num_workers": 1}, id="window"),
    pytest.param({"shuffle": True, "split_rows": 100, "drop_last": True}, id="split rows"),
]


@pytest.mark.parametrize("options", CASES)
def test_replay_gives_back_every_batch_the_loop_received(data: Path, tmp_path: Path, options: Any) -> None:
    ledger = tmp_path / "ledger"
    loader, dataset = create_dataloader(str(data), batch_size=50, ledger=str(ledger), **options)
    batches = list(delivered(loader, dataset, 1))
    book = Ledger(ledger)
    assert book.steps(0) == len(batches)
    for step, batch in enumerate(batches):
        assert_same(book.rows(step), batch)
        lineage = book.batch(step)
        assert lineage.rows.column("file_row").to_pylist() == [
            int(i) - _first_id(data, f)
            for i, f in zip(batch["id"], lineage.rows.column("file").to_pylist(), strict=True)
        ]


def _first_id(data: Path, file: str) -> int:
    return int(pq.read_table(file, columns=["id"]).column("id")[0].as_py())


def test_packed_batches_replay_with_their_documents(corpus: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    pack = SequencePack("tokens", seq_len=32, pad_id=-1, attention_mask=True)
    loader, dataset = create_dataloader(
        corpus, batch_size=16, shuffle=True, num_workers=1, pack_sequences=pack, ledger=str(ledger)
    )
    batches = list(delivered(loader, dataset, 2))
    book = Ledger(ledger)
    for step, batch in enumerate(batches):
        assert_same(book.rows(step), batch)
    documents = book.read(3)  # the batch's documents, before they were packed
    assert documents.num_rows == book.batch(3).rows.num_rows == 16
    assert sum(len(t) for t in documents.column("tokens").to_pylist()) == int(
        (batches[3]["tokens"] >= 0).sum()
    )


@pytest.mark.parametrize("num_ranks", [2, 3])
def test_every_rank_replays_its_own_batches(data: Path, tmp_path: Path, num_ranks: int) -> None:
    ledger = tmp_path / "ledger"
    received = {}
    for rank in range(num_ranks):
        loader, dataset = create_dataloader(
            str(data), batch_size=32, num_ranks=num_ranks, rank=rank, shuffle=True, row_interleave=64,
            num_workers=1, ledger=str(ledger),
        )  # fmt: skip
        received[rank] = list(delivered(loader, dataset, 2))
    book = Ledger(ledger)
    assert book.ranks == list(range(num_ranks))
    for rank, batches in received.items():
        for step, batch in enumerate(batches):
            assert_same(book.rows(step, rank), batch)


def test_elastic_order_replays_on_any_rank(data: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    received = {}
    for rank in range(2):
        loader, dataset = create_dataloader(
            str(data),
            batch_size=64,
            num_ranks=2,
            rank=rank,
            canonical_ranks=4,
            shuffle=True,
            ledger=str(ledger),
        )
        received[rank] = list(delivered(loader, dataset, 1))
    book = Ledger(ledger)
    assert book.passes(1)[0].record.order == "elastic"
    for rank, batches in received.items():
        for step, batch in enumerate(batches):
            assert_same(book.rows(step, rank), batch)


def test_where_finds_every_step_that_saw_a_row_and_no_other(data: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    seen: dict[int, list[tuple[int, int, int]]] = {}
    for rank in range(2):
        loader, dataset = create_dataloader(
            str(data), batch_size=40, num_ranks=2, rank=rank, shuffle=True, row_interleave=50, num_workers=2,
            ledger=str(ledger),
        )  # fmt: skip
        for step, batch in enumerate(delivered(loader, dataset, 3)):
            for position, value in enumerate(batch["id"].tolist()):
                seen.setdefault(value, []).append((step, rank, position))
    book = Ledger(ledger)
    for planted in (7, 300, 556, 1000, 1156):
        found = book.where(pc.field("id") == planted)
        assert [(s.step, s.rank, s.position) for s in found] == sorted(seen[planted])
        assert {s.file_row for s in found} == {planted - _file_start(planted)}
    assert book.where("id = -5") == []


def _file_start(value: int) -> int:
    starts = np.cumsum([0, 300, 257, 410, 190])
    return int(starts[np.searchsorted(starts, value, side="right") - 1])


def test_where_reads_only_the_chunks_statistics_leave(data: Path, tmp_path: Path) -> None:
    from torch_dataloader_utils.tools.ledger_query import _Matcher, sightings

    ledger = tmp_path / "ledger"
    loader, dataset = create_dataloader(str(data), batch_size=100, split_rows=64, ledger=str(ledger))
    list(delivered(loader, dataset, 1))
    book = Ledger(ledger)
    matcher = _Matcher(pc.field("id") == 600)
    found = sightings(book.replays(), matcher)
    assert len(found) == 1
    assert matcher.chunks_read == 1  # of 19 chunks: the one row group whose min/max hold 600


def test_replay_refuses_a_file_changed_since_naming_it(data: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    loader, dataset = create_dataloader(str(data), batch_size=100, ledger=str(ledger))
    list(delivered(loader, dataset, 1))
    first = sorted(data.iterdir())[0]
    table = pq.read_table(first)
    pq.write_table(table.slice(1), first, row_group_size=64)  # one row fewer
    book = Ledger(ledger)
    files = {step: set(book.batch(step).rows.column("file").to_pylist()) for step in range(book.steps())}
    touched = [step for step, names in files.items() if str(first) in names]  # no data read to know
    untouched = [step for step, names in files.items() if str(first) not in names]
    assert touched
    assert untouched
    with pytest.raises(FileChangedError, match=first.name):
        book.read(touched[0])
    book.read(untouched[0])  # a batch of files that did not change is read


def test_the_files_manifest_is_written_once_per_files_digest(data: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    loader, dataset = create_dataloader(str(data), batch_size=100, shuffle=True, ledger=str(ledger))
    list(delivered(loader, dataset, 3))
    names = sorted(p.name for p in ledger.iterdir())
    assert [n.split("-")[0] for n in names] == ["config", "files", "rank"]
    lines = (ledger / "rank-00000.jsonl").read_text().splitlines()
    passes = [json.loads(line) for line in lines if json.loads(line)["kind"] == "pass"]
    assert len(passes) == 3
    assert all(len(line) < 400 for line in lines)
    assert passes[0]["files"] == passes[2]["files"] == [n for n in names if n.startswith("files-")]


def test_secrets_are_never_written(s3_server: Any, tmp_path: Path) -> None:
    from testsupport.s3_server import SECRET

    prefix = s3_server.new_prefix()
    fs = s3_server.fs()
    local = tmp_path / "data"
    write_parquet_files(local, [120, 80], row_group_size=40)
    for path in local.iterdir():
        fs.put(str(path), f"{prefix}/{path.name}")
    ledger = tmp_path / "ledger"
    options = s3_server.options()
    loader, dataset = create_dataloader(
        f"s3://{prefix}", batch_size=50, storage_options=options, ledger=str(ledger)
    )
    batches = list(delivered(loader, dataset, 1))
    for path in ledger.iterdir():
        assert SECRET.encode() not in path.read_bytes(), path.name
        assert options["key"].encode() not in path.read_bytes(), path.name
    assert_same(Ledger(ledger, storage_options=options).rows(2), batches[2])
    with pytest.raises(Exception, match=r"(?i)denied|forbidden|credential|signature|403|invalid"):
        Ledger(ledger, storage_options={"endpoint_url": options["endpoint_url"]}).read(2)


def test_a_directory_without_a_ledger_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="no ledger"):
        Ledger(tmp_path)


def test_a_step_before_any_pass_or_of_an_unknown_rank_is_an_error(data: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    loader, dataset = create_dataloader(str(data), batch_size=100, ledger=str(ledger))
    list(delivered(loader, dataset, 1))
    book = Ledger(ledger)
    with pytest.raises(LedgerError, match="no records of rank 3"):
        book.batch(0, rank=3)
    with pytest.raises(LedgerError, match="step 400 is not in rank 0's pass from step 0"):
        book.batch(400)


def test_a_ledger_url_is_refused(data: Path) -> None:
    from torch_dataloader_utils import ConfigError

    with pytest.raises(ConfigError, match="ledger='s3://b/l' is a URL"):
        create_dataloader(str(data), ledger="s3://b/l")
    assert os.path.isdir(data)


class _Groups(IterableDataset[list[tuple[int, int]]]):
    """Each worker yields its batches ``(worker, index)`` in groups of 1, 2, 4, ... (at most ``cap``)."""

    def __init__(self, batches: list[int], cap: int) -> None:
        self.batches, self.cap = batches, cap

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        size, at, count = 1, 0, self.batches[worker]
        while at < count:
            yield [(worker, k) for k in range(at, min(count, at + size))]
            at += size
            size = min(2 * size, self.cap)


@pytest.mark.parametrize(("batches", "cap"), [([5, 40], 4), ([33, 2], 8), ([0, 9], 2)])
def test_torch_dataloader_delivers_groups_in_the_order_delivery_computes(
    batches: list[int], cap: int
) -> None:
    """The assumption under :class:`Delivery`: torch takes one item of every live worker in turn."""
    loader = DataLoader(_Groups(batches, cap), batch_size=None, num_workers=2, prefetch_factor=2)
    got = [tuple(item) for group in loader for item in group]
    got = [(int(torch.as_tensor(w)), int(torch.as_tensor(k))) for w, k in got]
    delivery = Delivery(batches, cap)
    assert got == [delivery.locate(s) for s in range(delivery.total)]
    assert np.array_equal(np.asarray(got), np.asarray(reference_order(batches, cap)).reshape(-1, 2))


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"num_workers": 0}, id="main process"),
        pytest.param({"num_workers": 2, "shuffle": True}, id="workers", marks=SLOW),
        pytest.param({"num_workers": 2, "shuffle": True, "row_interleave": 40}, id="row mixing", marks=SLOW),
        pytest.param({"num_workers": 1, "equal_batches": "pad", "num_ranks": 2}, id="pad"),
    ],
)
def test_skipped_units_shift_later_batches_and_replay_knows(tmp_path: Path, options: dict[str, Any]) -> None:
    from tests.hostile.test_bad_data import plant_parquet

    planted = plant_parquet(tmp_path / "data", [300, 200, 250], 50, {(0, 1), (1, 3), (2, 0), (2, 4)})
    ledger = tmp_path / "ledger"
    received = {}
    ranks = options.pop("num_ranks", 1)
    for rank in range(ranks):
        loader, dataset = create_dataloader(
            str(planted.root), batch_size=32, on_bad_data="skip", ledger=str(ledger),
            num_ranks=ranks, rank=rank, **options,
        )  # fmt: skip
        received[rank] = list(delivered(loader, dataset, 2))
    book = Ledger(ledger)
    for rank, batches in received.items():
        for step, batch in enumerate(batches):
            assert_same(book.rows(step, rank), batch)


def test_the_loops_order_does_not_depend_on_the_bytes_of_batches(tmp_path: Path, monkeypatch: Any) -> None:
    """Workers hand over groups of batches: which worker's batch is step N follows from the plan.

    One worker's batches are 250 times larger than the other's (long strings), and a group
    is at most 256 KiB: a group cut by bytes would hold fewer of the large batches, and the
    loop would meet the workers' batches in another order than the plan's counts give.
    """
    import pyarrow as pa

    from torch_dataloader_utils.runtime import emit

    root = tmp_path / "data"
    root.mkdir()
    rows = 2000
    for i, width in enumerate((8, 2000)):
        ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "s": pa.array(["x" * width] * rows)}), root / f"part-{i}.parquet")
    monkeypatch.setattr(emit, "GROUP_BYTES", 256 << 10)
    ledger = tmp_path / "ledger"
    loader, _ = create_dataloader(str(root), batch_size=16, num_workers=2, ledger=str(ledger))
    received = [batch["id"].tolist() for batch in loader]
    book = Ledger(ledger)
    assert {book.batch(s).worker for s in range(len(received))} == {0, 1}
    for step, ids in enumerate(received):
        lineage = book.batch(step).rows
        files = [int(Path(f).stem.split("-")[1]) for f in lineage.column("file").to_pylist()]
        rebuilt = [f * rows + r for f, r in zip(files, lineage.column("file_row").to_pylist(), strict=True)]
        assert rebuilt == ids, step
    assert book.read(len(received) - 1).column("id").to_pylist() == received[-1]
