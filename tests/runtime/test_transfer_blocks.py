"""Constant work per received batch: column blocks, feature packs stacked in place, pinned views.

The receiving process builds a batch's 1-d columns of one dtype from ONE ``[k, rows]``
block (one ``unbind``), so its Python work per batch does not grow with the columns; a
feature pack is stacked straight into the transfer buffer; with a pinner, batches are
built over a second, page-locked mapping of each segment, released with the pool.
"""

from __future__ import annotations

import gc
import pickle
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from torch_dataloader_utils import FeaturePack, create_dataloader
from torch_dataloader_utils.config import OutputConfig
from torch_dataloader_utils.convert import BatchConverter, DeferredPack, DeferredText, JaggedParts
from torch_dataloader_utils.runtime import loader as loader_module
from torch_dataloader_utils.transfer import (
    PIPE_MAX_BYTES,
    BatchGroup,
    PooledBatch,
    SegmentPool,
    _Views,
    pack,
    pack_group,
    unpack_on,
)


def _roundtrip(obj: Any) -> Any:
    return pickle.loads(bytes(ForkingPickler.dumps(obj)))


def _wide(columns: int, rows: int, start: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"id": torch.arange(start, start + rows, dtype=torch.int64)}
    for c in range(columns):
        out[f"c{c}"] = torch.arange(rows, dtype=torch.float32) * (c + 1) + start
    return out


def test_columns_of_one_dtype_travel_as_one_block_and_keep_their_order() -> None:
    batch = {
        "s": DeferredText(pa.array(["a", "bb", "ccc"]), True),
        **{f"f{i}": torch.arange(3, dtype=torch.float32) + i for i in range(5)},
        "i": torch.arange(3, dtype=torch.int64),
        "m": torch.arange(6, dtype=torch.float32).reshape(3, 2),
        "j": torch.arange(3, dtype=torch.int64) * 7,
        "short": torch.arange(2, dtype=torch.float32),
    }
    packed = pack(batch)
    kind, keys, blocks, rest, _ = packed.layout
    assert kind == "B"
    assert keys == tuple(batch)
    assert sorted((np.dtype(b[1]).name, b[2], b[3]) for b in blocks) == [("float32", 5, 3), ("int64", 2, 3)]
    assert len(rest) == 3  # the string, the 2-d tensor, the lone float column of another length
    got = _roundtrip(packed)
    assert list(got) == list(batch)
    assert got["s"] == ["a", "bb", "ccc"]
    for key in batch:
        if key != "s":
            assert torch.equal(got[key], batch[key]), key
    # The block's columns are views of one buffer.
    assert got["f0"].untyped_storage().data_ptr() == got["f4"].untyped_storage().data_ptr()


def test_building_a_batch_does_not_grow_with_its_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    build = _Views.build

    def counted(self: _Views, layout: Any) -> Any:
        nonlocal calls
        calls += 1
        return build(self, layout)

    monkeypatch.setattr(_Views, "build", counted)
    per_batch = {}
    for columns in (1, 64):
        calls = 0
        group = _roundtrip(pack_group([_wide(columns, 100, 10 * i) for i in range(4)]))
        assert len(group) == 4
        for i, batch in enumerate(group):
            assert len(batch) == columns + 1
            assert torch.equal(
                batch[f"c{columns - 1}"], torch.arange(100, dtype=torch.float32) * columns + 10 * i
            )
        per_batch[columns] = calls / 4
    assert per_batch[64] <= per_batch[1] <= 3  # Python-level builds per batch: not one per column


def test_feature_pack_is_stacked_in_the_transfer_buffer() -> None:
    batch = pa.record_batch(
        {
            "a": pa.array([1.0, 2.0, 3.0], pa.float64()),
            "b": pa.array([4, 5, 6], pa.int32()),
            "v": pa.array([[7, 8], [9, 10], [11, 12]], pa.list_(pa.int64(), 2)),
            "id": pa.array([0, 1, 2]),
        }
    )
    conv = BatchConverter(
        batch.schema, OutputConfig(pack_features=(FeaturePack(["b", "a", "v"], key="x", dtype="float32"),))
    )
    deferred = conv.convert_for_transfer(batch)
    assert isinstance(deferred["x"], DeferredPack)
    expected = conv(batch)["x"]
    assert expected.tolist() == [[4, 1, 7, 8], [5, 2, 9, 10], [6, 3, 11, 12]]
    got = _roundtrip(pack(deferred))
    assert got["x"].dtype == torch.float32
    assert torch.equal(got["x"], expected)
    assert torch.equal(_roundtrip(deferred["x"]), expected)  # pickled alone: the stacked tensor
    group = _roundtrip(pack_group([deferred, conv.convert_for_transfer(batch.slice(1))]))
    assert torch.equal(group[1]["x"], expected[1:])


def test_a_group_rebuilt_from_its_buffer_on_a_device_is_the_same_group() -> None:
    items = [
        {
            **_wide(3, 5, i),
            "m": torch.arange(10, dtype=torch.int16).reshape(5, 2) + i,
            "bf": torch.arange(5, dtype=torch.bfloat16),
            "j": JaggedParts(torch.arange(6, dtype=torch.int32), torch.tensor([0, 2, 2, 3, 6, 6])),
            "s": DeferredText(pa.array(["x", "", "y", "zz", f"r{i}"]), True),
        }
        for i in range(3)
    ]
    group = _roundtrip(pack_group(items))
    assert isinstance(group, BatchGroup)
    assert group.source is not None
    again = unpack_on(group.source, torch.device("cpu"))
    assert len(again) == len(group)
    for a, b in zip(again, group, strict=True):
        assert list(a) == list(b)
        for key in a:
            if key == "j":
                assert torch.equal(a[key].values(), b[key].values())
                assert torch.equal(a[key].offsets(), b[key].offsets())
            elif key == "s":
                assert a[key] == b[key]
            else:
                assert a[key].dtype == b[key].dtype
                assert torch.equal(a[key], b[key]), key


# -- page-locked segments ---------------------------------------------------------------


class RecordingPinner:
    """A HostPinner that page-locks nothing and records what it was asked (no CUDA here)."""

    def __init__(self) -> None:
        self.registered: dict[int, int] = {}
        self.calls: list[tuple[str, int]] = []

    def register(self, address: int, nbytes: int) -> None:
        assert address % 4096 == 0, "cudaHostRegister needs page-aligned ranges"
        assert nbytes % 4096 == 0
        assert address not in self.registered
        self.registered[address] = nbytes
        self.calls.append(("register", address))

    def unregister(self, address: int) -> None:
        assert address in self.registered, "unregistering a range never registered"
        del self.registered[address]
        self.calls.append(("unregister", address))

    def synchronize(self) -> None:
        self.calls.append(("synchronize", 0))


def test_pinned_pool_builds_batches_over_its_registered_mapping() -> None:
    pinner = RecordingPinner()
    pool = SegmentPool(workers=1, slots_per_worker=2, pinner=pinner)
    assert pool.pinned
    assert pool.lease()
    writer = pool.writer(0)
    assert writer is not None
    small = pack_group([_wide(2, 10)], writer)
    assert isinstance(small, PooledBatch)  # every size travels in a segment when pinned
    got = _roundtrip(small)
    assert torch.equal(got[0]["c1"], torch.arange(10, dtype=torch.float32) * 2)
    ((address, nbytes),) = pinner.registered.items()
    seg = pool.segments[small.slot]
    assert seg is not None
    assert got[0]["c1"].data_ptr() != seg.data_ptr()  # not the mapping workers write through
    assert address <= got[0]["c1"].data_ptr() < address + nbytes  # but the registered one
    # A group that outgrows the slot's segment replaces it: the old mapping is released.
    del got
    gc.collect()
    n = PIPE_MAX_BYTES * 3
    big = pack_group([{"a": torch.arange(n // 8, dtype=torch.int64)}] * 2, writer)
    assert isinstance(big, PooledBatch)
    got = _roundtrip(big)
    assert torch.equal(got[1]["a"], torch.arange(n // 8, dtype=torch.int64))
    assert len(pinner.registered) == len([s for s in pool.segments if s is not None])
    assert ("unregister", address) in pinner.calls or big.slot != small.slot
    pool.close()
    assert pinner.registered == {}
    assert torch.equal(got[1]["a"][:3], torch.arange(3))  # batches outlive the unregistration


def test_pinned_pool_segments_hold_a_full_group_from_the_start() -> None:
    pinner = RecordingPinner()
    pool = SegmentPool(workers=1, slots_per_worker=1, pinner=pinner, min_segment=4 << 20)
    assert pool.lease()
    writer = pool.writer(0)
    first = pack_group([_wide(1, 10)], writer)
    assert isinstance(first, PooledBatch)
    assert first.segment is not None
    assert first.segment.numel() >= 4 << 20
    _roundtrip(first)
    gc.collect()  # the first group is gone: its slot is free again
    bigger = pack_group([{"a": torch.arange((3 << 20) // 8)}], writer)
    assert isinstance(bigger, PooledBatch)
    assert bigger.segment is None  # no new segment, no second registration
    assert torch.equal(_roundtrip(bigger)[0]["a"][-2:], torch.arange((3 << 20) // 8)[-2:])
    assert [kind for kind, _ in pinner.calls] == ["register"]
    pool.close()
    assert [kind for kind, _ in pinner.calls] == ["register", "synchronize", "unregister"]


def test_pinned_pool_releases_its_ranges_when_collected() -> None:
    pinner = RecordingPinner()
    pool = SegmentPool(workers=1, slots_per_worker=1, pinner=pinner)
    assert pool.lease()
    got = _roundtrip(pack_group([_wide(1, 10)], pool.writer(0)))
    assert len(pinner.registered) == 1
    assert torch.equal(got[0]["id"], torch.arange(10))
    del pool  # a batch's finalizer still refers to the pool
    gc.collect()
    assert len(pinner.registered) == 1
    del got
    gc.collect()
    assert pinner.registered == {}


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True], ids=["new_workers", "persistent"])
def test_loader_with_pinned_segments_leaks_no_page_locked_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, persistent: bool
) -> None:
    pinners: list[RecordingPinner] = []

    def make() -> RecordingPinner:
        pinners.append(RecordingPinner())
        return pinners[-1]

    monkeypatch.setattr(loader_module, "_host_pinner", make)
    for f in range(3):
        ids = np.arange(f * 3000, (f + 1) * 3000)
        pq.write_table(
            pa.table({"id": ids, "x": ids * 0.5, "s": [f"r{i}" for i in ids]}),
            tmp_path / f"p{f}.parquet",
            row_group_size=1000,
        )

    def run() -> None:
        loader, dataset = create_dataloader(
            str(tmp_path),
            batch_size=256,
            num_workers=2,
            pin_memory=True,
            persistent_workers=persistent,
            shuffle=True,
            timeout=60,
        )
        for epoch in range(2):
            dataset.set_epoch(epoch)
            seen = []
            for batch in loader:
                assert batch["x"].tolist() == [i * 0.5 for i in batch["id"].tolist()]
                assert batch["s"] == [f"r{i}" for i in batch["id"].tolist()]
                seen.extend(batch["id"].tolist())
                batch["x"].mul_(0)  # the loop writes into its batch: later batches are intact
            assert sorted(seen) == list(range(9000))
        assert len(pinners) == 1
        assert pinners[0].registered, "no segment was page-locked"

    run()
    gc.collect()
    (pinner,) = pinners
    assert pinner.registered == {}  # every page-locked range released with the loader
    registers = sum(1 for kind, _ in pinner.calls if kind == "register")
    assert registers == sum(1 for kind, _ in pinner.calls if kind == "unregister") >= 2
