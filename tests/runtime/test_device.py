"""``device=``: batches handed over on a device, equal and in order, safe on the current stream.

Without CUDA: ``device="cpu"`` (and ``"auto"``) hand over the same batches as no device,
and a GPU device is a clear :class:`ConfigError`. The CUDA tests run only where CUDA is.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from torch_dataloader_utils import ConfigError, FeaturePack, IncompatibleOptionsError, create_dataloader
from torch_dataloader_utils.config import LoaderConfig, OutputConfig, OutputFormat
from torch_dataloader_utils.runtime import loader as loader_module
from torch_dataloader_utils.runtime.device import OnDevice, copied_ahead, resolve_device, to_device
from torch_dataloader_utils.runtime.loader import COPY_AHEAD_GROUPS, ResumableDataLoader
from torch_dataloader_utils.runtime.options import _check_device
from torch_dataloader_utils.transfer import BatchGroup

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
no_cuda = pytest.mark.skipif(CUDA, reason="checks the errors of a machine without CUDA")

ROWS = 3000


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("device")
    for f in range(3):
        ids = np.arange(f * 1000, (f + 1) * 1000)
        tokens = pa.array([[int(i)] * int(i % 4) for i in ids], pa.list_(pa.int32()))
        table = pa.table(
            {
                "id": ids,
                "a": (ids * 0.5).astype(np.float32),
                "b": (ids % 7).astype(np.float32),
                "label": ids % 3,
                "tokens": tokens,
                "s": [f"r{i}" for i in ids],
            }
        )
        pq.write_table(table, root / f"p{f}.parquet", row_group_size=250)
    return root


def _loader(data: Path, **options: Any) -> Any:
    base: dict[str, Any] = {"batch_size": 128, "shuffle": True, "shuffle_seed": 3}
    if options.get("num_workers"):
        base["timeout"] = 60
    return create_dataloader(str(data), **{**base, **options})[0]


def _plain(batch: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor) and v.is_nested:
            out[k] = (v.values().cpu().tolist(), v.offsets().cpu().tolist())
        elif isinstance(v, torch.Tensor):
            out[k] = (str(v.dtype), v.cpu().tolist())
        else:
            out[k] = v
    return out


def test_device_values_are_resolved_and_checked() -> None:
    assert resolve_device(None) is None
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"device=3 must be 'cuda', 'cuda:N', a torch.device, 'auto'"):
        resolve_device(3)
    with pytest.raises(ConfigError, match=r"device='gpu' is not a device; pass 'cuda'"):
        resolve_device("gpu")
    with pytest.raises(ConfigError, match=r"device='meta' is a 'meta' device; the loader's device stage"):
        resolve_device("meta")
    with pytest.raises(ConfigError, match=r"device=7 must be a torch.device here"):
        LoaderConfig(device=7)  # type: ignore[arg-type]


@no_cuda
@pytest.mark.parametrize("value", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_a_gpu_device_without_cuda_is_a_clear_error(data: Path, value: Any) -> None:
    with pytest.raises(ConfigError, match=r"needs a CUDA GPU, but torch\.cuda\.is_available") as exc:
        _loader(data, device=value, num_workers=0)
    assert f"device={value!r}" in str(exc.value)
    assert "device='cpu'" in str(exc.value)
    assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize("device", [torch.device("cuda", 0), torch.device("cpu")])
@pytest.mark.parametrize("output_format", [OutputFormat.NUMPY, OutputFormat.ARROW, OutputFormat.DICT])
def test_any_device_needs_torch_output(device: torch.device, output_format: OutputFormat) -> None:
    """The CPU too: the same options behave the same with and without a GPU (issue 33, item 22)."""
    loader = LoaderConfig(device=device)
    match = rf"output_format='{output_format.value}' gives no tensors"
    with pytest.raises(IncompatibleOptionsError, match=match):
        _check_device(loader, OutputConfig(output_format=output_format), {"device": str(device)})
    _check_device(loader, OutputConfig(), {})
    _check_device(LoaderConfig(), OutputConfig(output_format=output_format), {})


def test_copies_are_queued_ahead_in_order() -> None:
    log: list[str] = []

    def items() -> Iterator[int]:
        for i in range(5):
            log.append(f"read {i}")
            yield i

    def copy(i: int) -> int:
        log.append(f"copy {i}")
        return i * 10

    got = []
    for out in copied_ahead(items(), copy, ahead=2):
        log.append(f"hand {out // 10}")
        got.append(out)
    assert got == [0, 10, 20, 30, 40]
    assert log.index("copy 2") < log.index("hand 0")  # batch 0 handed while 1 and 2 are queued
    assert log.index("hand 1") < log.index("read 4") < log.index("hand 2")  # 2 ahead, never more


@pytest.mark.parametrize(
    "options",
    [
        {"num_workers": 0},
        {"num_workers": 2},
        {"num_workers": 2, "persistent_workers": True, "pin_memory": True},
        {"num_workers": 2, "pack_features": FeaturePack(["a", "b"], key="x")},
    ],
    ids=["main_process", "workers", "persistent_pinned", "feature_pack"],
)
@pytest.mark.parametrize("device", ["cpu", "auto"] + (["cuda"] if CUDA else []))
@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true but no accelerator")
def test_device_hands_over_equal_values_in_order(data: Path, options: dict[str, Any], device: str) -> None:
    """Also when the training step writes into every batch it gets."""
    expected = [_plain(b) for b in _loader(data, **options)]
    loader = _loader(data, device=device, **options)
    got = []
    for batch in loader:
        if device == "cuda" or (device == "auto" and CUDA):
            assert batch["label"].is_cuda
            assert isinstance(batch["s"], list)  # strings stay on the host
        got.append(_plain(batch))
        for value in batch.values():  # the step writes into the batch, in place
            if isinstance(value, torch.Tensor) and not value.is_nested:
                value.fill_(-1)
    assert got == expected
    assert sorted(i for b in got for i in b["id"][1]) == list(range(ROWS))


@needs_cuda
def test_cuda_batches_are_safe_on_the_current_stream(data: Path) -> None:
    """The step runs on a stream of its own; the handed batch is ready there, and its memory kept."""
    loader = _loader(data, device="cuda", num_workers=2, pin_memory=True)
    expected = [_plain(b) for b in _loader(data, num_workers=2)]
    step = torch.cuda.Stream()
    sums = []
    with torch.cuda.stream(step):
        for batch in loader:
            torch.cuda._sleep(1_000_000)  # a slow step: copies of later batches run meanwhile
            sums.append((batch["a"] * 2).sum())
            del batch
    torch.cuda.synchronize()
    assert [float(s) for s in sums] == [2 * float(np.sum(b["a"][1])) for b in expected]


@needs_cuda
def test_pinned_segments_with_new_workers_every_epoch(data: Path) -> None:
    """Workers forked after segments were page-locked never write through the locked mapping."""
    loader, dataset = create_dataloader(
        str(data), batch_size=128, num_workers=2, device="cuda", shuffle=True, timeout=60
    )
    for epoch in range(3):
        dataset.set_epoch(epoch)
        ids = [i for b in loader for i in b["id"].tolist()]
        assert sorted(ids) == list(range(ROWS))


@needs_cuda
def test_pinned_batches_and_no_page_locked_memory_left(data: Path) -> None:
    loader = _loader(data, num_workers=2, pin_memory=True)
    pinner = loader._pinner
    assert pinner is not None
    for batch in loader:
        assert batch["a"].is_pinned()
    assert pinner.registered
    del loader, batch
    gc.collect()
    assert pinner.registered == {}


class _RecordingStage:
    """A stand-in for ``DeviceStage`` on the CPU: copies by cloning, records the thread and order.

    ``DeviceStage`` needs CUDA; this checks the loader's wiring around it (which thread
    queues the copies, how far ahead, what is handed over) on any machine.
    """

    def __init__(self) -> None:
        self.log: list[tuple[str, int, str]] = []
        self.copied = 0
        self.handed = 0

    def copy(self, item: Any) -> OnDevice:
        self.copied += 1
        self.log.append(("copy", self.copied, threading.current_thread().name))
        group = isinstance(item, BatchGroup)
        batches = [to_device(b, torch.device("cpu")) for b in (item if group else [item])]
        cloned = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in batches]
        return OnDevice(cloned, None, [], item, group)

    def hand(self, item: OnDevice) -> list[Any]:
        self.handed += 1
        self.log.append(("hand", self.handed, threading.current_thread().name))
        assert self.copied <= self.handed + COPY_AHEAD_GROUPS or not in_loop_thread()
        return item.batches

    def close(self) -> None:
        self.log.append(("close", 0, threading.current_thread().name))


def in_loop_thread() -> bool:
    return not loader_module.COPY_IN_RECEIVER


@pytest.mark.parametrize("in_receiver", [False, True], ids=["loop_thread", "receiving_thread"])
def test_device_copies_are_queued_by_the_loop_thread_one_group_ahead(
    data: Path, monkeypatch: pytest.MonkeyPatch, in_receiver: bool
) -> None:
    """With workers, the loop's thread queues each group's copy (no tensor calls in the receiver).

    The receiving thread's copies cost a launch-bound training step ~10 points of stall
    on an H200 (docs/benchmarks.md); the copy now runs in the loop's thread, one group
    ahead of the one handed over. The receiving-thread variant stays for the benchmark.
    """
    monkeypatch.setattr(loader_module, "COPY_IN_RECEIVER", in_receiver)
    stage = _RecordingStage()
    monkeypatch.setattr(ResumableDataLoader, "_device_stage", lambda self: stage)
    options: dict[str, Any] = {"num_workers": 2, "persistent_workers": True}
    expected = [_plain(b) for b in _loader(data, **options)]
    loader = _loader(data, **options)
    got = []
    for batch in loader:
        got.append(_plain(batch))
        for value in batch.values():  # the step writes into the (copied) batch
            if isinstance(value, torch.Tensor) and not value.is_nested:
                value.fill_(-1)
    assert got == expected
    assert sorted(i for b in got for i in b["id"][1]) == list(range(ROWS))
    copies = [entry for entry in stage.log if entry[0] == "copy"]
    hands = [entry for entry in stage.log if entry[0] == "hand"]
    assert len(copies) == len(hands) == stage.copied >= 2
    loop_thread = threading.current_thread().name
    assert {thread for _, _, thread in hands} == {loop_thread}
    if in_receiver:
        assert {thread for _, _, thread in copies} == {"torch_dataloader_utils-receive"}
    else:
        assert {thread for _, _, thread in copies} == {loop_thread}
        order = [(kind, n) for kind, n, _ in stage.log if kind != "close"]
        # the next group's copy is queued before a group is handed over (items that carry
        # no batches, e.g. a worker's end, take a place in the look-ahead too), never two ahead
        assert order.index(("copy", 2)) < order.index(("hand", 1))
        for n in range(1, len(hands) + 1):
            assert order.index(("copy", n)) < order.index(("hand", n))
            if n + 2 <= len(copies):
                assert order.index(("hand", n)) < order.index(("copy", n + 2))
    assert stage.log[-1][0] == "close"


@needs_cuda
def test_pinned_batches_copied_by_the_loop_behind_a_slow_gpu(data: Path) -> None:
    """``pin_memory=True`` and the loop's own ``.to(non_blocking=True)`` while the GPU lags far behind.

    The batches live in page-locked shared segments that a worker refills once the main
    process drops the group. torch's own pinned memory is not reused before the copies
    queued from it have run; this checks the same for the segments: the CPU runs ahead
    (nothing synchronizes), the GPU sleeps before every copy, and each batch's ids,
    summed on the GPU after all that, must equal the ids it had when it was handed over.
    """
    loader, dataset = create_dataloader(
        str(data),
        columns=["id"],
        batch_size=16,
        num_workers=2,
        persistent_workers=True,
        pin_memory=True,
        shuffle=True,
        shuffle_seed=5,
        timeout=60,
    )
    expected, sums = [], []
    pinned = 0
    for epoch in range(3):  # a new epoch refills every segment, while the GPU is far behind
        dataset.set_epoch(epoch)
        for batch in loader:
            # A group whose worker found every segment waiting for its copies travels
            # outside the pool (pageable memory: its copy is synchronous).
            pinned += bool(batch["id"].is_pinned())
            expected.append(int(batch["id"].sum()))
            torch.cuda._sleep(10_000_000)  # the copy below runs milliseconds later on the GPU
            sums.append(batch["id"].to("cuda", non_blocking=True).sum())
            del batch
    torch.cuda.synchronize()  # only now: the CPU ran ahead through all three epochs
    assert pinned > 0
    assert sum(expected) == 3 * ROWS * (ROWS - 1) // 2
    wrong = sum(int(s) != e for s, e in zip(sums, expected, strict=True))
    assert wrong == 0, f"{wrong} of {len(sums)} batches changed under a queued copy (segment refilled)"
