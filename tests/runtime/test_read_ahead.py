"""Decoding ahead in the reading process: same batches, same resume state, on or off."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from torch_dataloader_utils import StructuredDataset, create_dataloader

ROWS = [300, 120, 410, 250, 180, 90]
TOTAL = sum(ROWS)
THREAD = "torch_dataloader_utils-read-ahead-w0"

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")


@pytest.fixture
def root(write_parquet, tmp_path):
    write_parquet(ROWS, row_group_size=[50, 40, 41, 25, 60, 30], with_strings=False)
    return str(tmp_path / "data")


@contextlib.contextmanager
def on_cpus(which: str) -> Iterator[None]:
    """This process on ``"all"`` its CPUs, or on ``"one"``: no CPU to spare, nothing decoded ahead."""
    before = os.sched_getaffinity(0)
    if which == "one":
        os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@pytest.fixture
def one_cpu():
    with on_cpus("one"):
        yield


def read(root, **opts):
    """The batches' ids, and whether every chunk was decoded in the read-ahead thread."""
    loader, dataset = create_dataloader(root, num_workers=0, batch_size=32, **opts)
    reader, threads = dataset._reader, set()

    def spy(chunk):  # the real reader, noting which thread decodes
        threads.add(threading.current_thread().name)
        return reader_read(chunk)

    reader_read = reader.read
    reader.read = spy
    out = [batch["id"].tolist() for batch in loader]
    assert threads
    return out, threads == {THREAD}


CASES = [
    {"shuffle": True},  # row mixing
    {"shuffle": True, "row_mixing": None, "split_rows": 60},
    {"shuffle": True, "row_shuffle_window": 200},
    {"shuffle": False, "equal_batches": "pad"},
]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to decode ahead")
@pytest.mark.parametrize("opts", CASES)
def test_same_batches_with_and_without_decoding_ahead(root, opts, request):
    ahead, threaded = read(root, **opts)
    assert threaded  # a CPU to spare: decoded by the read-ahead thread
    request.getfixturevalue("one_cpu")
    plain, threaded = read(root, **opts)
    assert not threaded
    assert ahead == plain
    ids = [i for b in ahead for i in b]
    assert Counter(i for i in ids if i >= 0) == Counter(range(TOTAL))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to decode ahead")
@pytest.mark.parametrize("stop_after", [1, 7, 30])
def test_state_counts_the_batches_taken_not_those_decoded_ahead(root, stop_after):
    opts = {"batch_size": 16, "shuffle": True, "shuffle_seed": 5, "split_rows": 60, "row_mixing": 40}
    states = []
    for affinity in ("all", "one"):
        with on_cpus(affinity):
            loader, _ = StructuredDataset.create_dataloader(root, num_workers=0, **opts)
            first: list[int] = []
            for n, batch in enumerate(loader, start=1):
                first.extend(batch["id"].tolist())
                if n == stop_after:
                    break
            states.append(json.loads(json.dumps(loader.state_dict())))
    assert states[0] == states[1]
    again, _ = StructuredDataset.create_dataloader(root, num_workers=0, **opts)
    again.load_state_dict(states[0])
    rest = [i for b in again for i in b["id"].tolist()]
    assert Counter(first + rest) == Counter(range(TOTAL))


@pytest.mark.parametrize(("decode_ahead", "cpus", "expected"), [(False, "all", False), (True, "one", True)])
def test_decode_ahead_overrides_the_automatic_choice(root, decode_ahead, cpus, expected):
    if cpus == "all" and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs for the automatic choice to be on")
    with on_cpus(cpus):
        batches, threaded = read(root, shuffle=True, decode_ahead=decode_ahead)
    assert threaded is expected
    assert sorted(i for b in batches for i in b) == list(range(TOTAL))


@pytest.mark.parametrize("bad", ["yes", 1, 0.5])
def test_decode_ahead_is_checked(root, bad):
    from torch_dataloader_utils.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"decode_ahead={bad!r} must be True, False or None"):
        StructuredDataset(root, decode_ahead=bad)
