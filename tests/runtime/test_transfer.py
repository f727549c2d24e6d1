"""Batches crossing the worker -> main process boundary arrive intact.

Covers transfer.pack / pack_group / unpack through a real pickle round trip (as a
DataLoader queue does it) and end-to-end through real DataLoader workers.
"""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.multiprocessing
from torch.utils.data import DataLoader

from tests.fixtures.data import WriteParquet
from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.config import OutputConfig, OutputFormat
from torch_dataloader_utils.convert import BatchConverter, DeferredText
from torch_dataloader_utils.transfer import PIPE_MAX_BYTES, BatchGroup, pack, pack_group


def _roundtrip(obj: Any) -> Any:
    return pickle.loads(bytes(ForkingPickler.dumps(obj)))


def _assert_same(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype
        assert a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype
        assert a.tolist() == b.tolist()
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        assert a == b


def test_pack_roundtrip_tensors_of_every_kind() -> None:
    obj = {
        "f32": torch.arange(7, dtype=torch.float32),
        "i64": torch.arange(5, dtype=torch.int64) * (1 << 40),
        "bool": torch.tensor([True, False, True]),
        "bf16": torch.arange(3, dtype=torch.bfloat16),
        "fixed": torch.arange(12, dtype=torch.int32).reshape(4, 3),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.zeros(0, dtype=torch.int16),
        "strided": torch.arange(10, dtype=torch.int64)[::2],
        "nested": [torch.arange(2), (torch.ones(3), "x")],
        "plain": ["a", "b"],
        "number": 3,
    }
    expected = {**obj, "strided": obj["strided"].contiguous()}
    _assert_same(_roundtrip(pack(obj)), expected)


@pytest.mark.parametrize(
    "array",
    [
        pa.array(["a", "", "héllo", "x" * 100]),
        pa.array(["a", "", "héllo", "x" * 100], pa.large_string()),
        pa.array([b"\x00\x01", b"", b"z"]),
        pa.array([b"\x00\x01", b"", b"z"], pa.large_binary()),
        pa.array([f"s{i}" for i in range(50)]).slice(7, 20),
        pa.array(["", ""]),
        pa.array([], pa.string()),
    ],
    ids=["string", "large_string", "binary", "large_binary", "sliced", "all_empty", "no_rows"],
)
@pytest.mark.parametrize("to_torch", [True, False])
def test_deferred_text_roundtrip(array: pa.Array, to_torch: bool) -> None:
    obj = {"id": torch.arange(len(array)), "s": DeferredText(array, to_torch)}
    expected = array.to_pylist() if to_torch else np.array(array.to_pylist(), dtype=object)
    got = _roundtrip(pack(obj))
    _assert_same(got["s"], expected)
    # Pickled on its own (e.g. inside a user structure pack leaves alone): the plain value.
    _assert_same(_roundtrip(DeferredText(array, to_torch)), expected)


def test_sliced_text_sends_only_its_rows() -> None:
    big = pa.array(["y" * 1000] * 1000)
    packed = pack({"s": DeferredText(big.slice(10, 2), True)})
    assert len(bytes(ForkingPickler.dumps(packed))) < 4096


def test_large_batches_travel_in_shared_memory() -> None:
    n = PIPE_MAX_BYTES // 8 + 1024
    obj = {"a": torch.arange(n, dtype=torch.int64), "b": torch.ones(3)}
    packed = pack(obj)
    assert isinstance(packed.buffer, torch.Tensor)
    assert packed.buffer.is_shared()
    _assert_same(_roundtrip(packed), obj)


def test_pack_group_unpacks_as_batch_group() -> None:
    items = [
        {"id": torch.arange(i, i + 3), "s": DeferredText(pa.array(["a", "b", str(i)]), True)}
        for i in range(4)
    ]
    got = _roundtrip(pack_group(items))
    assert type(got) is BatchGroup
    _assert_same(list(got), [{"id": torch.arange(i, i + 3), "s": ["a", "b", str(i)]} for i in range(4)])


def test_convert_for_transfer_matches_call() -> None:
    batch = pa.record_batch(
        {
            "x": pa.array([1.5, 2.5], pa.float32()),
            "s": pa.array(["a", "b"]),
            "n": pa.array(["a", None]),
            "d": pa.array(["u", "v"]).dictionary_encode(),
        }
    )
    for out in (OutputFormat.TORCH, OutputFormat.NUMPY):
        conv = BatchConverter(batch.schema, OutputConfig(output_format=out))
        _assert_same(_roundtrip(pack(conv.convert_for_transfer(batch))), conv(batch))


# -- end to end through real DataLoader workers -----------------------------------


def _expected(paths: list[Path]) -> dict[int, str]:
    import pyarrow.parquet as pq

    t = pa.concat_tables([pq.read_table(p, columns=["id", "s"]) for p in paths])
    return dict(zip(t.column("id").to_pylist(), t.column("s").to_pylist(), strict=True))


def _check_rows(
    batches: list[dict[str, Any]], expected: dict[int, str], batch_size: int, workers: int
) -> None:
    seen: list[int] = []
    short = 0
    for b in batches:
        ids = b["id"].tolist()
        assert len(b["s"]) == len(ids)
        assert [expected[i] for i in ids] == list(b["s"])
        assert torch.equal(b["x"], torch.tensor(ids, dtype=torch.float32) * 0.5)
        short += len(ids) != batch_size
        seen += ids
    assert sorted(seen) == sorted(expected)  # every row exactly once
    assert short <= max(1, workers)  # only each worker's last batch may be short


@pytest.mark.parametrize("batch_size", [7, 100, 5000])
def test_two_workers_deliver_every_row_once(write_parquet: WriteParquet, batch_size: int) -> None:
    paths = write_parquet([3000, 1234, 2500], row_group_size=700)
    loader, _ = create_dataloader(
        str(paths[0].parent), batch_size=batch_size, num_workers=2, split_rows=1400, timeout=60
    )
    _check_rows(list(loader), _expected(paths), batch_size, 2)


def test_plain_dataloader_over_the_dataset_never_sees_groups(write_parquet: WriteParquet) -> None:
    paths = write_parquet([2000, 2000], row_group_size=500)
    loader, dataset = create_dataloader(str(paths[0].parent), batch_size=10, num_workers=2, timeout=60)
    list(loader)  # the library's loader ran first; the dataset must not stay in group mode
    plain = DataLoader(dataset, batch_size=None, num_workers=2, timeout=60)
    batches = list(plain)
    assert all(isinstance(b, dict) for b in batches)
    _check_rows(batches, _expected(paths), 10, 2)


def test_persistent_workers_and_collate_fn(write_parquet: WriteParquet) -> None:
    paths = write_parquet([1500, 1500], row_group_size=400)

    def collate(batch: dict[str, Any]) -> dict[str, Any]:
        return {**batch, "n": len(batch["s"])}

    loader, dataset = create_dataloader(
        str(paths[0].parent),
        batch_size=64,
        num_workers=2,
        persistent_workers=True,
        collate_fn=collate,
        shuffle=True,
        timeout=60,
    )
    for epoch in range(2):
        dataset.set_epoch(epoch)
        batches = list(loader)
        assert all(b["n"] == len(b["id"]) for b in batches)
        _check_rows(batches, _expected(paths), 64, 2)


def test_numpy_output_from_workers(write_parquet: WriteParquet) -> None:
    paths = write_parquet([800, 900], row_group_size=300)
    loader, _ = create_dataloader(
        str(paths[0].parent), batch_size=50, num_workers=2, output_format="numpy", timeout=60
    )
    batches = list(loader)
    assert all(isinstance(b["id"], np.ndarray) and b["s"].dtype == object for b in batches)
    ids = sorted(i for b in batches for i in b["id"].tolist())
    assert ids == sorted(_expected(paths))


def test_large_group_travels_in_shared_memory() -> None:
    n = PIPE_MAX_BYTES // 8
    items = [{"a": torch.arange(n, dtype=torch.int64) + i, "s": ["x"]} for i in range(3)]
    packed = pack_group(items)
    assert isinstance(packed.buffer, torch.Tensor)
    got = _roundtrip(packed)
    assert type(got) is BatchGroup
    _assert_same(list(got), items)


def test_batches_before_a_worker_error_still_arrive(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from torch_dataloader_utils.errors import NullValueError

    root = tmp_path / "data"
    root.mkdir()
    pq.write_table(pa.table({"id": pa.array(range(1000), pa.int64())}), root / "a.parquet")
    pq.write_table(pa.table({"id": pa.array([1000, None, 1002], pa.int64())}), root / "b.parquet")
    loader, _ = create_dataloader(str(root), batch_size=10, num_workers=1, split_strategy="file", timeout=60)
    seen: list[int] = []

    def consume() -> None:
        for b in loader:
            seen.extend(b["id"].tolist())

    with pytest.raises(NullValueError, match="'id'"):
        consume()
    assert seen == list(range(1000))
