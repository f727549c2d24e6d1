"""Batches crossing the worker -> main process boundary arrive intact.

Covers transfer.pack / pack_group / unpack through a real pickle round trip (as a
DataLoader queue does it) and end-to-end through real DataLoader workers.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import threading
import weakref
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
from torch_dataloader_utils import create_dataloader, transfer
from torch_dataloader_utils.config import OutputConfig, OutputFormat
from torch_dataloader_utils.convert import BatchConverter, DeferredText, JaggedParts
from torch_dataloader_utils.transfer import (
    PIPE_MAX_BYTES,
    BatchGroup,
    PackedBatch,
    PooledBatch,
    SegmentPool,
    pack,
    pack_group,
)


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


# -- segments used again (SegmentPool) ------------------------------------------------


def _free_slots(pool: SegmentPool) -> set[int]:
    return {s for s, flag in enumerate(pool.flags.tolist()) if flag == 0}


def test_pooled_group_roundtrip_and_slot_freed_when_last_view_goes() -> None:
    pool = SegmentPool(workers=1, slots_per_worker=2)
    assert pool.lease()
    writer = pool.writer(0)
    assert writer is not None
    n = PIPE_MAX_BYTES // 8
    items = [
        {
            "a": torch.arange(n, dtype=torch.int64) + i,
            "bf": torch.arange(4, dtype=torch.bfloat16),
            "j": JaggedParts(torch.arange(6, dtype=torch.int32), torch.tensor([0, 2, 2, 6])),
            "s": DeferredText(pa.array(["x", "", f"r{i}"]), False),
            "t": DeferredText(pa.array(["u", "v", "w"]), True),
        }
        for i in range(3)
    ]
    packed = pack_group(items, writer)
    assert isinstance(packed, PooledBatch)
    assert packed.segment is not None
    got = _roundtrip(packed)
    assert type(got) is BatchGroup
    assert _free_slots(pool) == {1}
    # Views of every kind keep the slot busy: a numpy slice, a torch view of a bfloat16
    # tensor, a nested tensor's values, an Arrow buffer.
    keep = [
        got[0]["a"].numpy()[5:9],
        got[1]["bf"][1:],
        got[2]["j"].values()[2:],
        pa.array(got[0]["s"]).buffers(),
    ]
    expected = [
        np.arange(5, 9),
        torch.arange(1, 4, dtype=torch.bfloat16),
        torch.arange(2, 6, dtype=torch.int32),
    ]
    del got, packed
    gc.collect()
    for held in keep:
        assert _free_slots(pool) == {1}, f"freed while {type(held)} still refers to the group"
    assert keep[0].tolist() == expected[0].tolist()
    assert torch.equal(keep[1], expected[1])
    assert torch.equal(keep[2], expected[2])
    keep.clear()
    gc.collect()
    assert _free_slots(pool) == {0, 1}
    # The next group reuses the segment: only its number travels.
    again = pack_group(items, writer)
    assert isinstance(again, PooledBatch)
    assert again.slot == 0
    assert again.segment is None
    assert len(bytes(ForkingPickler.dumps(again))) < 4096
    _assert_same(
        [{k: v for k, v in b.items() if k != "j"} for b in _roundtrip(again)],
        [
            {
                **{k: v for k, v in b.items() if k not in ("j", "s", "t")},
                "s": np.array(["x", "", f"r{i}"], dtype=object),
                "t": ["u", "v", "w"],
            }
            for i, b in enumerate(items)
        ],
    )


def test_pool_falls_back_to_fresh_segments_when_every_slot_is_held() -> None:
    pool = SegmentPool(workers=1, slots_per_worker=1)
    assert pool.lease()
    writer = pool.writer(0)
    n = PIPE_MAX_BYTES // 8 + 1
    first = _roundtrip(pack_group([{"a": torch.arange(n)}], writer))
    second = pack_group([{"a": torch.arange(n) * 2}], writer)
    assert isinstance(second, PackedBatch)
    assert isinstance(second.buffer, torch.Tensor)
    assert torch.equal(_roundtrip(second)[0]["a"], torch.arange(n) * 2)
    assert torch.equal(first[0]["a"], torch.arange(n))


def test_pool_lease_is_exclusive_and_frees_slots_no_batch_holds() -> None:
    pool = SegmentPool(workers=2, slots_per_worker=2)
    assert pool.lease()
    assert not pool.lease()  # a second iteration at the same time goes without
    writer = pool.writer(1)
    n = PIPE_MAX_BYTES // 8 + 1
    held = _roundtrip(pack_group([{"a": torch.arange(n)}], writer))
    lost = pack_group([{"a": torch.arange(n)}], writer)  # sent, never received
    assert _free_slots(pool) == {0, 1}
    pool.release()
    assert pool.lease()
    assert _free_slots(pool) == {0, 1, 3}  # the lost group's slot is free again, the held one not
    assert isinstance(lost, PooledBatch)
    assert torch.equal(held[0]["a"], torch.arange(n))


def test_pool_pickled_without_torch_sharing_is_not_used() -> None:
    pool = SegmentPool(workers=1, slots_per_worker=1)
    copy = pickle.loads(pickle.dumps(pool))
    assert copy.writer(0) is None
    assert pool.writer(0) is not None


def _ragged_rows(root: Path, files: int, rows: int, width: int = 1) -> None:
    root.mkdir()
    import pyarrow.parquet as pq

    for f in range(files):
        ids = np.arange(f * rows, (f + 1) * rows)
        tokens = pa.array([[int(i) % 1000] * int(i % 9 * width) for i in ids], pa.list_(pa.int32()))
        text = pa.array([f"r{i}" * int(1 + i % 3) for i in ids])
        pq.write_table(
            pa.table({"id": ids, "tokens": tokens, "text": text}), root / f"p{f}.parquet", row_group_size=2000
        )


def _check_ragged(batch: dict[str, Any], width: int = 1) -> list[int]:
    ids = batch["id"].tolist()
    lengths = [i % 9 * width for i in ids]
    assert torch.equal(batch["tokens"].offsets().diff(), torch.tensor(lengths, dtype=torch.int64))
    assert batch["tokens"].values().tolist() == [i % 1000 for i in ids for _ in range(i % 9 * width)]
    assert batch["text"] == [f"r{i}" * (1 + i % 3) for i in ids]
    return ids


@pytest.fixture
def small_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    # Small groups that still take the shared-memory path (forked workers inherit the patch).
    from torch_dataloader_utils.runtime import emit

    monkeypatch.setattr(emit, "GROUP_BYTES", 96 << 10)
    monkeypatch.setattr(emit, "UNPINNED_GROUP_BYTES", 96 << 10)
    monkeypatch.setattr(transfer, "PIPE_MAX_BYTES", 16 << 10)


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True], ids=["new_workers", "persistent"])
def test_held_batches_are_never_overwritten(tmp_path: Path, small_groups: None, persistent: bool) -> None:
    root = tmp_path / "data"
    _ragged_rows(root, files=4, rows=6000)
    loader, dataset = create_dataloader(
        str(root), batch_size=500, num_workers=2, persistent_workers=persistent, shuffle=True, timeout=60
    )
    kept = list(loader)  # every batch of epoch 0 held: the workers find no free slot
    pool = loader._transport
    assert pool is not None
    assert any(seg is not None for seg in pool.segments)
    assert sorted(i for b in kept for i in _check_ragged(b)) == list(range(24_000))
    for epoch in (1, 2):
        dataset.set_epoch(epoch)
        ids = [i for b in loader for i in _check_ragged(b)]
        assert sorted(ids) == list(range(24_000))
        # Keep every third batch of the earlier epochs (parts of groups), drop the rest.
        kept = kept[::3]
        gc.collect()
    assert sorted(i for b in kept for i in _check_ragged(b)) == sorted(
        i for b in kept for i in b["id"].tolist()
    )
    for b in kept:
        _check_ragged(b)
    del kept, b
    gc.collect()
    if not persistent:
        assert _free_slots(pool) == set(range(len(pool.segments)))


@pytest.mark.slow
def test_early_break_then_full_epochs_are_exact(tmp_path: Path, small_groups: None) -> None:
    root = tmp_path / "data"
    _ragged_rows(root, files=3, rows=5000)
    loader, _ = create_dataloader(str(root), batch_size=400, num_workers=2, timeout=60)
    for _ in range(2):
        for i, b in enumerate(loader):  # stop early: groups in flight are dropped unread
            _check_ragged(b)
            if i == 3:
                break
        ids = [i for b in loader for i in _check_ragged(b)]
        assert sorted(ids) == list(range(15_000))
    pool = loader._transport
    assert pool is not None
    assert pool.lease()
    pool.release()


@pytest.mark.slow
def test_two_iterations_at_once_share_no_segment(tmp_path: Path, small_groups: None) -> None:
    root = tmp_path / "data"
    _ragged_rows(root, files=2, rows=5000)
    loader, _ = create_dataloader(str(root), batch_size=300, num_workers=2, timeout=60)
    first = iter(loader)
    a = [next(first) for _ in range(3)]
    second = [i for b in loader for i in _check_ragged(b)]  # runs while `first`'s workers live
    rest = [b for b in first]
    ids = [i for b in [*a, *rest] for i in _check_ragged(b)]
    assert sorted(ids) == sorted(second) == list(range(10_000))


@pytest.mark.slow
def test_spawned_workers_use_the_pool(tmp_path: Path) -> None:
    # Spawned workers import the library afresh: groups of the real size (a few MiB).
    root = tmp_path / "data"
    _ragged_rows(root, files=2, rows=3000, width=60)
    loader, dataset = create_dataloader(
        str(root),
        batch_size=300,
        num_workers=1,
        multiprocessing_context="spawn",
        persistent_workers=True,
        timeout=120,
    )
    for epoch in range(2):
        dataset.set_epoch(epoch)
        kept = list(loader)
        assert sorted(i for b in kept for i in _check_ragged(b, width=60)) == list(range(6000))
    assert loader._transport is not None
    assert any(seg is not None for seg in loader._transport.segments)


# -- segments are released ---------------------------------------------------------


def _torch_segments() -> tuple[int, set[str]]:
    """This process's mappings of torch shared-memory segments, and the names in /dev/shm."""
    with open("/proc/self/maps") as maps:
        mapped = sum(1 for line in maps if "/torch_" in line and "/dev/shm" in line)
    names = (
        {n for n in os.listdir("/dev/shm") if n.startswith("torch_")} if os.path.isdir("/dev/shm") else set()
    )
    return mapped, names


def _owner(name: str) -> int:
    """The pid in a torch segment name (``torch_<pid>_<n>``), or -1."""
    parts = name.split("_")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else -1


@pytest.mark.slow
def test_no_segment_outlives_the_loader(tmp_path: Path, small_groups: None) -> None:
    root = tmp_path / "data"
    _ragged_rows(root, files=3, rows=5000)
    gc.collect()
    names_before = _torch_segments()[1]
    pids = {os.getpid()}
    segments: list[weakref.ref[Any]] = []

    def run() -> None:
        loader, dataset = create_dataloader(str(root), batch_size=400, num_workers=2, timeout=60)
        for epoch in range(2):
            dataset.set_epoch(epoch)
            ids = []
            for b in loader:
                pids.update(p.pid for p in multiprocessing.active_children() if p.pid is not None)
                ids.extend(_check_ragged(b))
                pool = loader._transport
                if pool is not None:
                    segments.extend(weakref.ref(seg) for seg in pool.segments if seg is not None)
            assert sorted(ids) == list(range(15_000))
        for i, b in enumerate(loader):  # break out of the loop with a batch held
            if i == 2:
                held = b
                break
        _check_ragged(held)

    run()
    assert segments, "the loader never used its segment pool"
    for thread in threading.enumerate():  # receive threads end within their poll interval
        if thread.name == "torch_dataloader_utils-receive":
            thread.join(timeout=30)
    gc.collect()
    alive = [ref() for ref in segments if ref() is not None]
    assert alive == []  # every segment freed (so unmapped) once loader and batches are gone
    left = sorted(n for n in _torch_segments()[1] - names_before if _owner(n) in pids)
    assert left == []  # nothing of this process or its workers left behind in /dev/shm


def test_forked_child_dropping_a_group_does_not_free_its_slot() -> None:
    pool = SegmentPool(workers=1, slots_per_worker=2)
    assert pool.lease()
    writer = pool.writer(0)
    n = PIPE_MAX_BYTES // 8 + 1
    got = _roundtrip(pack_group([{"a": torch.arange(n)}], writer))
    assert _free_slots(pool) == {1}
    pid = os.fork()
    if pid == 0:  # the child inherits the group and its finalizer, and drops them
        try:
            del got
            gc.collect()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _free_slots(pool) == {1}  # the slot is the parent's batch's: still busy
    assert torch.equal(got[0]["a"], torch.arange(n))
    del got
    gc.collect()
    assert _free_slots(pool) == {0, 1}
