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

    def fence(self) -> Any:
        return None  # no copies queued: a dropped group's slot is free at once

    def passed(self, fence: Any) -> bool:
        raise AssertionError("no fence was given")


class Fence:
    def __init__(self, name: str) -> None:
        self.name = name
        self.done = False


class FencingPinner(RecordingPinner):
    """A pinner whose fences pass when the test says so (a CUDA event stands in on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.fences: list[Fence] = []

    def fence(self) -> Any:
        fence = Fence(f"fence {len(self.fences)}")
        self.fences.append(fence)
        return fence

    def passed(self, fence: Any) -> bool:
        return bool(fence.done)


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


@pytest.mark.parametrize("pinned", [False, True])
def test_a_held_batch_keeps_its_segment_busy_after_its_group_is_dropped(pinned: bool) -> None:
    """A worker never refills a segment the loop still holds a batch of.

    The loop drops a group as it goes, but may keep one of its batches (the last one, a
    column of it). Its slot must stay busy until that is gone: in 0.6.0 a page-locked
    pool built batches over a view of a view of its mapping, numpy rooted their views
    at the mapping rather than at the group's array, and the slot was freed (and
    refilled by the worker) under a batch the loop held.
    """
    pool = SegmentPool(workers=1, slots_per_worker=2, pinner=RecordingPinner() if pinned else None)
    assert pool.lease()
    writer = pool.writer(0)
    assert writer is not None
    rows = PIPE_MAX_BYTES // 4  # over the pipe's limit: a segment, pinned or not
    sent = pack_group(
        [{"a": torch.arange(rows, dtype=torch.float32) + i, "b": torch.ones(rows)} for i in range(2)], writer
    )
    assert isinstance(sent, PooledBatch)
    group = _roundtrip(sent)
    kept = group[1]["a"]
    del group
    gc.collect()
    assert pool._flags[sent.slot] != 0, "the slot was freed while a batch of it is held"
    assert torch.equal(kept[:3], torch.tensor([1.0, 2.0, 3.0]))
    del kept
    gc.collect()
    assert pool._flags[sent.slot] == 0  # free once nothing of the group is left


def test_pinned_pool_reuses_a_slot_only_after_the_copies_queued_from_it() -> None:
    """A dropped group's segment waits for its fence: a copy queued from it may not have run.

    The loop's own ``.to(device, non_blocking=True)`` of a page-locked batch reads it when
    the GPU gets there; a worker refilling the segment before then would change the
    copied values (torch's pinned memory is not reused before its copies either).
    """
    pinner = FencingPinner()
    pool = SegmentPool(workers=1, slots_per_worker=2, pinner=pinner)
    assert pool.lease()
    writer = pool.writer(0)
    assert writer is not None
    first = _roundtrip(pack_group([_wide(1, 10)], writer))
    second = _roundtrip(pack_group([_wide(1, 10)], writer))
    assert writer.take(64) is None  # both slots hold a group
    del first
    gc.collect()
    assert [f.name for f in pinner.fences] == ["fence 0"]
    pool.free_fenced()
    assert writer.take(64) is None  # dropped, but its copies have not run: still busy
    del second
    gc.collect()
    pinner.fences[1].done = True
    pool.free_fenced()
    assert writer.take(64) is None  # slots come back in the order they were dropped
    pinner.fences[0].done = True
    pool.free_fenced()
    taken = writer.take(64)
    assert taken is not None
    again = writer.take(64)
    assert again is not None
    assert again[0] != taken[0]  # both free now
    # A slot still waiting for its fence stays busy for the next iteration's workers too.
    pool._flags[taken[0]] = pool._flags[again[0]] = 0  # (the test's takes sent nothing)
    third = _roundtrip(pack_group([_wide(1, 10)], writer))
    del third
    gc.collect()
    pool.release()
    assert pool.lease()
    assert writer.take(64) is not None
    assert writer.take(64) is None
    pinner.fences[-1].done = True
    pool.free_fenced()
    assert writer.take(64) is not None
    pool.close()


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
