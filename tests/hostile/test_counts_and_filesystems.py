"""Issue 33, items 12, 13 and 21: counts that were wrong, a quarantine_dir checked too late, filesystems.

12. JSONL byte ranges shared by readers counted their bad lines twice (``bad_units`` 7
    for 3 planted, 2 ranks x 2 workers); a clean loader's metrics reported the
    ``bad_rows`` of another loader of the same process (module globals); ``rows_padded``
    counted the stand-ins of skipped units.
13. An unusable ``quarantine_dir`` (a file, under a file, immutable) failed at the first
    bad unit with ``[Errno 17] File exists``.
21. ``filesystem=pyarrow.fs.SubTreeFileSystem(...)`` crashed in a fresh process
    (``module 'fsspec' has no attribute 'implementations'``); a memory filesystem with
    spawned workers said the file "was deleted after the dataset was built"; ``az://``
    with its server killed took 79-84 s with ``request_timeout=6``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testsupport.stores import start_azurite

from tests.fixtures.e2e import assert_exactly_once, epoch_ids
from tests.fixtures.stores import own_server
from tests.hostile.test_bad_data import options, plant_parquet, plant_text
from torch_dataloader_utils import (
    ConfigError,
    IncompatibleOptionsError,
    ReadError,
    create_dataloader,
)

ROOT = Path(__file__).resolve().parents[2]


# -- item 12: counts ----------------------------------------------------------------------------


@pytest.mark.slow
def test_item_12_jsonl_ranges_shared_by_readers_count_each_bad_line_once(tmp_path: Path) -> None:
    planted = plant_text(tmp_path / "d", "jsonl", [4001, 3333], {(0, 7), (0, 1500), (1, 3000)})
    units = rows = 0
    ids: list[int] = []
    for rank in range(2):
        loader, _ = create_dataloader(
            str(planted.root),
            num_ranks=2,
            rank=rank,
            num_workers=2,
            batch_size=64,
            on_bad_data="skip",
            equal_batches="pad",
            count_rows=True,
            split_bytes=100_000,
            multiprocessing_context="fork",
            **options(planted),
        )
        for batch in loader:
            pad = batch.column("_is_padding").to_pylist()
            ids += [i for i, p in zip(batch.column("id").to_pylist(), pad, strict=True) if not p]
        total = loader.metrics().total
        units, rows = units + total.bad_units, rows + total.bad_rows
    assert (units, rows) == (3, 3)  # before: 7 units for 3 planted lines
    assert set(ids) >= planted.good


def test_item_12_a_clean_loader_never_counts_another_loaders_bad_data(tmp_path: Path) -> None:
    bad = plant_parquet(tmp_path / "bad", [400], 100, {(0, 1), (0, 3)})
    clean = plant_parquet(tmp_path / "clean", [400], 100, set())
    train, _ = create_dataloader(
        str(bad.root), num_workers=0, batch_size=50, on_bad_data="skip", output_format="arrow"
    )
    evaluation, _ = create_dataloader(str(clean.root), num_workers=0, batch_size=50, output_format="arrow")
    for _ in zip(train, evaluation, strict=False):  # both passes at once, in one process
        pass
    assert train.metrics().total.bad_rows == 200
    assert evaluation.metrics().total.bad_rows == 0  # before: 200, the other loader's
    assert evaluation.metrics().total.bad_units == 0


def test_item_12_rows_padded_leaves_out_the_stand_ins_of_skipped_units(tmp_path: Path) -> None:
    """Four ranks with ``'pad'``: rows repeated to equalize batches, and a skipped unit's stand-ins."""
    planted = plant_parquet(tmp_path / "d", [777], 50, {(0, 2)})
    flagged = padded = bad = 0
    for rank in range(4):
        loader, _ = create_dataloader(
            str(planted.root), num_ranks=4, rank=rank, num_workers=0, batch_size=64,
            output_format="arrow", on_bad_data="skip", equal_batches="pad",
        )  # fmt: skip
        flagged += sum(sum(b.column("_is_padding").to_pylist()) for b in loader)
        total = loader.metrics().total
        padded, bad = padded + total.rows_padded, bad + total.bad_rows
    assert bad == 50  # the stand-ins reach the loop flagged, to be masked ...
    assert (flagged, padded) == (53, 3)  # ... but only the 3 repeated rows are padding (before: 53)


# -- item 13: quarantine_dir --------------------------------------------------------------------


def _immutable(path: Path) -> bool:
    path.mkdir()
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
    return done.returncode == 0


@pytest.mark.parametrize("where", ["a_file", "under_a_file", "immutable"])
def test_item_13_an_unusable_quarantine_dir_fails_when_the_loader_is_built(
    tmp_path: Path, where: str
) -> None:
    planted = plant_parquet(tmp_path / "d", [200], 100, {(0, 1)})
    target = tmp_path / "q"
    if where == "a_file":
        target.write_text("not a directory")
        why = "it is a file, not a directory"
    elif where == "under_a_file":
        (tmp_path / "file").write_text("x")
        target = tmp_path / "file" / "q"
        why = "a part of its path is a file, not a directory"
    else:
        if not shutil.which("chattr") or not _immutable(target):
            pytest.skip("chattr +i is not available here")
        why = "quarantine.jsonl cannot be written there"
    try:
        with pytest.raises(
            ConfigError, match=rf"quarantine_dir='{target}' cannot hold the quarantine report: {why}"
        ):
            create_dataloader(
                str(planted.root), num_workers=0, on_bad_data="quarantine", quarantine_dir=str(target)
            )  # before: built, then "[Errno 17] File exists" at the first bad unit
    finally:
        if where == "immutable":
            subprocess.run(["chattr", "-i", str(target)], check=False)


# -- item 21: filesystems -----------------------------------------------------------------------

_SUBTREE = """
import sys
import pyarrow.fs as pafs
from torch_dataloader_utils import create_dataloader

loader, _ = create_dataloader("data", filesystem=pafs.SubTreeFileSystem(sys.argv[1], pafs.LocalFileSystem()),
                              num_workers=0, output_format="arrow")
print(sorted(i for b in loader for i in b.column("id").to_pylist()) == list(range(400)))
"""


def test_item_21_a_pyarrow_subtree_filesystem_in_a_fresh_process(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"id": np.arange(400)}), tmp_path / "data" / "part-0.parquet", row_group_size=100)
    script = tmp_path / "subtree.py"
    script.write_text(textwrap.dedent(_SUBTREE))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"},
    )
    assert "has no attribute 'implementations'" not in done.stderr  # before: the crash
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["filesystem", "memory_url"])
def test_item_21_a_memory_filesystem_does_not_cross_into_spawned_workers(tmp_path: Path, how: str) -> None:
    memory = fsspec.filesystem("memory")
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": np.arange(400)}), buf, row_group_size=100)
    memory.pipe_file("/tdu-item-21/part-0.parquet", buf.getvalue())
    where = {"filesystem": memory} if how == "filesystem" else {}
    path = "/tdu-item-21" if how == "filesystem" else "memory:///tdu-item-21"
    try:
        loader, _ = create_dataloader(
            path, num_workers=1, multiprocessing_context="spawn", timeout=120, **where
        )
        expected = r"not in this process's .*does not cross processes.*multiprocessing_context='fork'"
        with pytest.raises(IncompatibleOptionsError, match=expected):  # before: "was deleted after ..."
            epoch_ids(loader)
        forked, _ = create_dataloader(path, num_workers=1, multiprocessing_context="fork", **where)
        assert_exactly_once(epoch_ids(forked), range(400))
    finally:
        memory.rm("/tdu-item-21", recursive=True)


@pytest.mark.slow
def test_item_21_azure_server_killed_mid_read_fails_within_request_timeout(tmp_path: Path) -> None:
    with own_server(start_azurite, "Azurite") as (server, stop):
        prefix = server.new_prefix()
        fs = server.fs()
        for i in range(2):  # 4.5 MB each: read in more than one request
            lines = "".join(json.dumps({"id": k}) + "\n" for k in range(i * 300_000, (i + 1) * 300_000))
            fs.pipe_file(f"{prefix}/part-{i}.jsonl", lines.encode())
        options = server.options()
        loader, _ = create_dataloader(
            f"az://{prefix}", format="jsonl", storage_options=options, num_workers=0, request_timeout=6
        )
        batches = iter(loader)
        next(batches)
        stop()
        started_at = time.monotonic()
        with pytest.raises(ReadError) as raised:
            for _ in batches:
                pass
        elapsed = time.monotonic() - started_at
    text = str(raised.value)
    assert "request_timeout=6 s" in text
    assert server.endpoint in text
    assert elapsed < 45, elapsed  # before: 79-84 s, a message naming neither
