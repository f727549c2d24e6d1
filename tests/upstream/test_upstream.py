"""Every third-party private API the library uses, exercised against the installed version.

If an upgrade changes one of them, the test of that wrapper fails here, naming the API
and the module of ours that wraps it (``torch_dataloader_utils/upstream/``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pytest
import torch
from testsupport.iceberg_tables import make_catalog, sql_catalog_config

from tests.fixtures.iceberg import create_id_table, id_table
from torch_dataloader_utils.discovery.orc import stripes_from_tail
from torch_dataloader_utils.upstream import pyarrow as up_pyarrow
from torch_dataloader_utils.upstream import pyiceberg as up_pyiceberg
from torch_dataloader_utils.upstream import torch as up_torch


def test_torch_new_shared_bytes_is_shared_and_sized() -> None:
    assert hasattr(torch.UntypedStorage, "_new_shared"), (
        "torch changed UntypedStorage._new_shared (upstream/torch.py falls back to a copy: re-measure)"
    )
    buffer = up_torch.new_shared_bytes(1 << 20)
    assert buffer.dtype == torch.uint8
    assert buffer.numel() == 1 << 20
    assert buffer.is_shared()
    buffer[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    assert buffer[:4].tolist() == [1, 2, 3, 4]


def test_pyarrow_orc_file_tail_lists_every_stripe(tmp_path: Path) -> None:
    path = tmp_path / "t.orc"
    table = pa.table({"id": np.arange(10_000)})
    orc.write_table(table, path, stripe_size=4096, batch_size=1000)
    reader = orc.ORCFile(str(path))
    try:
        tail = up_pyarrow.orc_file_tail(reader)
    except RuntimeError as exc:
        pytest.fail(f"pyarrow changed ORCFile.reader.serialized_file_tail (upstream/pyarrow.py): {exc}")
    stripes = stripes_from_tail(tail)
    assert len(stripes) == reader.nstripes > 1
    assert sum(rows for _, _, rows in stripes) == reader.nrows == 10_000


def test_pyiceberg_manifest_entries_and_filesystem(tmp_path: Path) -> None:
    config = sql_catalog_config(tmp_path / "iceberg")
    catalog = make_catalog(config)
    table = create_id_table(catalog)
    table.append(id_table(0, 30))
    table.append(id_table(30, 20))
    scan = table.scan()
    try:
        entries = up_pyiceberg.manifest_entries(scan)
    except AttributeError as exc:
        pytest.fail(f"pyiceberg changed DataScan._plan_manifest_entries (upstream/pyiceberg.py): {exc}")
    assert sorted(e.data_file.record_count for e in entries) == [20, 30]
    location = entries[0].data_file.file_path
    try:
        scheme, netloc, path = up_pyiceberg.parse_location(location, table.io.properties)
        fs = up_pyiceberg.arrow_filesystem(scheme, netloc, table.io.properties)
    except AttributeError as exc:
        pytest.fail(
            f"pyiceberg changed PyArrowFileIO.parse_location/fs_by_scheme (upstream/pyiceberg.py): {exc}"
        )
    assert scheme == "file"
    assert fs.get_file_info(path).size > 0


def test_accelerate_prepare_leaves_flagged_loader_alone() -> None:
    import inspect

    from accelerate import Accelerator

    from torch_dataloader_utils.runtime.loader import ResumableDataLoader
    from torch_dataloader_utils.upstream.accelerate import PREPARED_FLAG

    source = inspect.getsource(Accelerator.prepare_data_loader)
    assert PREPARED_FLAG in source, (
        f"accelerate no longer checks {PREPARED_FLAG} in prepare_data_loader "
        "(upstream/accelerate.py): prepare(loader) would re-shard the library's loader"
    )
    assert getattr(ResumableDataLoader, PREPARED_FLAG) is True


def test_torch_jagged_is_the_public_nested_tensor_without_a_copy() -> None:
    values = torch.arange(12, dtype=torch.int32).reshape(6, 2)
    offsets = torch.tensor([0, 2, 2, 6], dtype=torch.int64)
    ours = up_torch.jagged(values, offsets)
    public = torch.nested.nested_tensor_from_jagged(values, offsets)
    assert type(ours) is type(public), "torch moved NestedTensor (upstream/torch.py falls back: re-measure)"
    assert ours.layout is torch.jagged
    assert ours.shape[0] == public.shape[0] == 3
    assert ours.values().data_ptr() == values.data_ptr()
    assert ours.offsets().data_ptr() == offsets.data_ptr()
    assert [t.tolist() for t in ours.unbind()] == [t.tolist() for t in public.unbind()]
    assert (ours + 1).values().tolist() == (values + 1).tolist()
    parts = up_torch.jagged_parts(ours)
    assert parts is not None, "NestedTensor no longer keeps _values / _offsets (upstream/torch.py)"
    assert parts[0].data_ptr() == values.data_ptr()
    assert parts[1].data_ptr() == offsets.data_ptr()
    assert up_torch.jagged_parts(values) is None


def test_torch_prepare_jagged_hides_only_the_fx_notice(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = (
        "import logging, torch\n"
        "from torch_dataloader_utils.upstream.torch import jagged, prepare_jagged\n"
        "prepare_jagged()\n"
        "jagged(torch.zeros(2), torch.tensor([0, 1, 2])).values()\n"
        "logging.getLogger('torch.fx._symbolic_trace').warning('still-logged')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert "is_fx_tracing" not in done.stderr
    assert "still-logged" in done.stderr  # the filter is gone afterwards
