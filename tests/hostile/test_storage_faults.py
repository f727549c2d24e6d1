"""Issue 33, item 7: transient storage errors were taken for bad data, and good rows dropped.

With ``on_bad_data='skip'``, six 503 SlowDown mid-file dropped 6 good ORC stripes
(33,856 of 40,000 rows); resets and cut responses dropped 3,072 to 6,144 good rows; a
flipped byte in transit made a good Parquet row group "bad"; a ``filesystem=`` whose
reads failed 1 in 7 with EIO dropped 2,000 of 3,000 rows; an ``ArrowMemoryError`` on a
valid row group dropped it; with ``'raise'``, one 503 said "cannot be decoded", with no
retry. The rule now: only a unit that fails to decode on the same bytes read twice is
bad data; I/O errors are retried, then raised as ``ReadError``; memory errors raise.

Faults are injected by an HTTP proxy in front of a real S3 server (503, reset, a cut
body, a flipped byte) and by a ``filesystem=`` object whose reads fail (EIO, EACCES,
MemoryError): ``testsupport.faults``.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from testsupport.faults import FaultProxy, FaultyFileSystem
from testsupport.s3_server import BUCKET, S3Server

from tests.fixtures.e2e import assert_exactly_once, epoch_ids
from tests.strategies_faults import FS_FAULTS, FaultCase, fault_cases
from torch_dataloader_utils import (
    BadDataError,
    IcebergDataset,
    ReadError,
    create_dataloader,
)

pytestmark = pytest.mark.slow

FILES = 2
ROWS = 2000  # per file
GROUP = 250  # rows per row group (stripe); text lines: one chunk per file
TOTAL = FILES * ROWS
EXT = {"parquet": "parquet", "orc": "orc", "jsonl": "jsonl", "csv": "csv"}
FAST = {"retries": 4, "retry_backoff": 0.01, "request_timeout": 20}


def _table(i: int) -> pa.Table:
    ids = np.arange(i * ROWS, (i + 1) * ROWS, dtype=np.int64)
    return pa.table({"id": ids, "x": ids * 0.5})


def _encode(fmt: str, table: pa.Table) -> bytes:
    buf = io.BytesIO()
    if fmt == "parquet":  # with page checksums: a flipped byte in a page is detected
        pq.write_table(table, buf, row_group_size=GROUP, write_page_checksum=True)
    elif fmt == "orc":
        orc.write_table(table, buf, stripe_size=4096, batch_size=GROUP)
    elif fmt == "csv":
        rows = zip(table["id"].to_pylist(), table["x"].to_pylist(), strict=True)
        buf.write(("id,x\n" + "".join(f"{a},{b}\n" for a, b in rows)).encode())
    else:
        rows = zip(table["id"].to_pylist(), table["x"].to_pylist(), strict=True)
        buf.write("".join(json.dumps({"id": a, "x": b}) + "\n" for a, b in rows).encode())
    return buf.getvalue()


@pytest.fixture(scope="module")
def proxy(storage_faults: FaultProxy) -> FaultProxy:
    """The fault-injecting proxy in front of the S3 server (disarmed between uses)."""
    return storage_faults


@pytest.fixture(scope="module")
def remote(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Path]]:
    """Each format's files on the S3 server and on local disk: format -> (bucket/prefix, local dir)."""
    fs = s3_server.fs()
    out = {}
    for fmt in EXT:
        prefix = f"{BUCKET}/faults-{uuid.uuid4().hex[:8]}/{fmt}"
        local = tmp_path_factory.mktemp(f"faults-{fmt}")
        for i in range(FILES):
            data = _encode(fmt, _table(i))
            (local / f"part-{i}.{EXT[fmt]}").write_bytes(data)
            fs.pipe_file(f"{prefix}/part-{i}.{EXT[fmt]}", data)
        out[fmt] = (prefix, local)
    return out


@pytest.fixture(scope="module")
def lake(s3_server: S3Server, proxy: FaultProxy, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An Iceberg table of ``TOTAL`` rows (row groups of ``GROUP``) on S3, reached through the proxy."""
    from testsupport.iceberg_tables import make_catalog

    root = tmp_path_factory.mktemp("faults-lake")
    config = {
        "type": "sql",
        "uri": f"sqlite:///{root / 'catalog.db'}",
        "warehouse": f"s3://{BUCKET}/faults-{uuid.uuid4().hex[:8]}/wh",
        "s3.endpoint": s3_server.endpoint,  # written to the server directly
        "s3.access-key-id": s3_server.options()["key"],
        "s3.secret-access-key": s3_server.options()["secret"],
        "s3.region": "us-east-1",
    }
    table = make_catalog(config).create_table(
        "ns.t", schema=_table(0).schema, properties={"write.parquet.row-group-limit": str(GROUP)}
    )
    for i in range(FILES):
        table.append(_table(i))
    return {**config, "s3.endpoint": proxy.endpoint}  # read through the proxy


@dataclass(frozen=True)
class Where:
    """Where the faults' data lives: the S3 server, the proxy before it, the files, the Iceberg table."""

    s3: S3Server
    proxy: FaultProxy
    remote: dict[str, tuple[str, Path]]
    lake: dict[str, str] | None = None


@pytest.fixture(scope="module")
def where(s3_server: S3Server, proxy: FaultProxy, remote: dict[str, tuple[str, Path]]) -> Where:
    """The data of every format on S3 (and on local disk for ``filesystem=`` faults), and the proxy."""
    return Where(s3_server, proxy, remote)


@pytest.fixture(scope="module")
def where_lake(where: Where, lake: dict[str, str]) -> Where:
    """:func:`where` with the Iceberg table."""
    return Where(where.s3, where.proxy, where.remote, lake)


def _options(case: FaultCase, tmp: Path) -> dict[str, Any]:
    options: dict[str, Any] = {"num_workers": 0, "batch_size": 300, "on_bad_data": case.policy, **FAST}
    if case.policy == "quarantine":
        options["quarantine_dir"] = str(tmp / "quarantine")
    if case.cache:
        options["data_cache"] = str(tmp / "cache")
    return options


def _loader(case: FaultCase, tmp: Path, where: Where) -> tuple[Any, FaultyFileSystem | None]:
    """The loader of ``case``, built with no fault armed, and the failing filesystem (FS faults)."""
    options = _options(case, tmp)
    if case.fmt == "iceberg":
        lake = where.lake
        assert lake is not None
        for name in FAST:  # Iceberg reads with the default retries and budget
            options.pop(name)
        loader, _ = IcebergDataset.create_dataloader("ns.t", catalog_config=lake, **options)
        return loader, None
    prefix, local = where.remote[case.fmt]
    if case.kind in FS_FAULTS:
        faulty = FaultyFileSystem(name=uuid.uuid4().hex, skip_instance_cache=True)
        loader, _ = create_dataloader(f"faulty://{local}", format=case.fmt, filesystem=faulty, **options)
        return loader, faulty
    storage = where.s3.options(where.proxy.endpoint)
    loader, _ = create_dataloader(f"s3://{prefix}", format=case.fmt, storage_options=storage, **options)
    return loader, None


def _read(
    case: FaultCase, loader: Any, proxy: FaultProxy, faulty: FaultyFileSystem | None, after: int = 0
) -> list[int]:
    """One epoch with the fault armed (``after``: that many requests first go through)."""
    target: Any = faulty if faulty is not None else proxy
    target.arm(case.kind, every=case.every, limit=case.limit, after=after)
    try:
        return epoch_ids(loader)
    finally:
        target.disarm()


def _every_row_once(case: FaultCase, tmp: Path, where: Where, after: int = 0) -> Any:
    """Read an epoch of ``case`` (the fault armed): every row once, none counted as bad; the loader."""
    loader, faulty = _loader(case, tmp, where)
    ids = _read(case, loader, where.proxy, faulty, after)
    schedule = faulty.schedule if faulty is not None else where.proxy.schedule
    assert schedule.damaged > 0  # the faults happened
    assert case.limit < 0 or schedule.damaged == case.limit
    assert_exactly_once(ids, range(TOTAL))
    assert loader.metrics().total.bad_units == 0
    return loader


def _quarantined(tmp: Path) -> list[str]:
    report = tmp / "quarantine" / "quarantine.jsonl"
    return report.read_text().splitlines() if report.exists() else []


# -- one test per kind of fault ------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["orc", "parquet", "jsonl"])
@pytest.mark.parametrize("kind", ["503", "reset", "cut"])
def test_item_7_a_transient_http_fault_is_retried_never_skipped(
    where: Where,
    tmp_path: Path,
    kind: str,
    fmt: str,
) -> None:
    every = 3 if fmt == "orc" else 1  # a Parquet or JSONL file here comes in one request
    case = FaultCase(kind, fmt, "skip", cache=False, every=every, limit=2)
    _every_row_once(case, tmp_path, where)  # before (ORC): stripes dropped, or ReadError


@pytest.mark.parametrize("cache", [False, True], ids=["no_cache", "cache"])
@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_item_7_a_flipped_byte_in_transit_is_read_again_never_skipped(
    where: Where,
    tmp_path: Path,
    fmt: str,
    cache: bool,
) -> None:
    """Parquet pages carry checksums here; ``0xFF`` is never valid UTF-8 text."""
    case = FaultCase("flip", fmt, "skip", cache=cache, every=1, limit=2)
    loader = _every_row_once(case, tmp_path, where)  # before: a good unit skipped
    if cache:  # the damaged bytes were not kept: the next epoch reads them right
        assert_exactly_once(epoch_ids(loader), range(TOTAL))
        assert_exactly_once(epoch_ids(loader), range(TOTAL))
        assert loader.metrics().total.bad_units == 0


@pytest.mark.parametrize("fmt", ["orc", "parquet", "csv"])
def test_item_7_eio_from_a_filesystem_object_is_retried_never_skipped(
    where: Where, tmp_path: Path, fmt: str
) -> None:
    case = FaultCase("eio", fmt, "skip", cache=False, every=2, limit=-1)  # 1 read in 2 fails
    _every_row_once(case, tmp_path, where)  # before: 2,000 of 3,000 rows dropped


@pytest.mark.parametrize("fmt", ["orc", "parquet", "jsonl"])
def test_item_7_eacces_from_a_filesystem_object_is_a_read_error(
    where: Where, tmp_path: Path, fmt: str
) -> None:
    case = FaultCase("eacces", fmt, "skip", cache=False, every=2, limit=-1)
    loader, faulty = _loader(case, tmp_path, where)
    with pytest.raises(ReadError, match=r"PermissionError.*Permission denied \(injected\)") as raised:
        _read(case, loader, where.proxy, faulty)
    assert not isinstance(raised.value, BadDataError)
    assert "part-" in str(raised.value)  # the file is named


@pytest.mark.parametrize("fmt", ["orc", "parquet", "jsonl"])
def test_item_7_a_memory_error_while_reading_is_raised_not_skipped(
    where: Where, tmp_path: Path, fmt: str
) -> None:
    case = FaultCase("memory", fmt, "skip", cache=False, every=2, limit=-1)
    loader, faulty = _loader(case, tmp_path, where)
    with pytest.raises(MemoryError, match="injected"):
        _read(case, loader, where.proxy, faulty)
    assert loader.metrics().total.bad_units == 0


_ARROW_MEMORY = """
import resource, sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from torch_dataloader_utils import create_dataloader

path = sys.argv[1]
small = pa.table({"id": np.arange(0, 1000, dtype=np.int64), "blob": pa.array([b"x"] * 1000)})
huge = pa.table({"id": np.arange(1000, 1001, dtype=np.int64), "blob": pa.array([bytes(800 * 2**20)])})
with pq.ParquetWriter(path, small.schema, compression="zstd") as writer:
    writer.write_table(small)
    writer.write_table(huge)  # a valid row group that needs 800 MiB to decode
loader, _ = create_dataloader(
    path, num_workers=0, on_bad_data="skip", batch_size=100, decode_ahead=False, output_format="arrow"
)
with open("/proc/self/status") as fh:
    vm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (vm + 256 * 2**20, resource.RLIM_INFINITY))
try:
    rows = sum(b.num_rows for b in loader)
except MemoryError as exc:
    print("MemoryError", type(exc).__name__)
else:
    print("rows", rows, "bad_units", loader.metrics().total.bad_units)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="limits the address space with RLIMIT_AS")
def test_item_7_arrow_memory_error_on_a_valid_row_group_is_raised_not_skipped(tmp_path: Path) -> None:
    script = tmp_path / "arrow_memory.py"
    script.write_text(textwrap.dedent(_ARROW_MEMORY))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "huge.parquet")],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "PYTHONPATH": f"{root / 'src'}:{root}",
            "PATH": "/usr/bin:/bin",
            "OMP_NUM_THREADS": "1",
            "ARROW_DEFAULT_MEMORY_POOL": "system",  # malloc: the address-space limit applies at once
        },
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[:1] == ["MemoryError"], done.stdout  # before: "rows 1000 bad_units 1"
    assert "ArrowMemoryError" in done.stdout


@pytest.fixture(scope="module")
def large_orc(s3_server: S3Server) -> str:
    """An ORC file of 12 MiB (3 blocks of the cache) and 64 stripes: ``bucket/prefix``."""
    rng = np.random.default_rng(7)
    ids = np.arange(400_000, dtype=np.int64)
    table = pa.table(
        {"id": ids, "x": rng.random(len(ids)), "y": rng.random(len(ids)), "z": rng.random(len(ids))}
    )
    buf = io.BytesIO()
    orc.write_table(table, buf, stripe_size=200_000, compression="uncompressed")
    prefix = f"{BUCKET}/faults-{uuid.uuid4().hex[:8]}/large"
    s3_server.fs().pipe_file(f"{prefix}/part-0.orc", buf.getvalue())
    return prefix


def test_item_7_a_long_outage_with_the_cache_is_a_read_error_not_lost_rows(
    s3_server: S3Server, proxy: FaultProxy, large_orc: str, tmp_path: Path
) -> None:
    """The outage starts after the file's first block: its other stripes' blocks fail."""
    loader, _ = create_dataloader(
        f"s3://{large_orc}",
        format="orc",
        storage_options=s3_server.options(proxy.endpoint),
        data_cache=str(tmp_path / "cache"),
        on_bad_data="skip",
        num_workers=0,
        batch_size=4096,
        **FAST,
    )
    case = FaultCase("503", "orc", "skip", cache=True, every=1, limit=-1)
    with pytest.raises(ReadError, match=r"failed after \d+ attempt\(s\)") as raised:
        _read(case, loader, proxy, None, after=1)  # before: the stripes of 2 blocks dropped
    assert not isinstance(raised.value, BadDataError)
    assert loader.metrics().total.bad_units == 0


@pytest.mark.parametrize("fmt", ["orc", "parquet", "jsonl"])
def test_item_7_with_raise_one_503_is_retried_not_called_undecodable(
    where: Where, tmp_path: Path, fmt: str
) -> None:
    case = FaultCase("503", fmt, "raise", cache=False, every=2, limit=1)
    loader, faulty = _loader(case, tmp_path, where)
    assert_exactly_once(_read(case, loader, where.proxy, faulty), range(TOTAL))  # before: "cannot be decoded"
    assert where.proxy.schedule.damaged == 1


@pytest.mark.parametrize("kind", ["503", "reset", "cut"])
def test_item_7_iceberg_on_s3_a_transient_fault_never_drops_a_row_group(
    where_lake: Where,
    tmp_path: Path,
    kind: str,
) -> None:
    # Four requests in a row after the first footer and row group: more than the S3
    # client's own attempts (3), so the row group's read fails in pyarrow.
    case = FaultCase(kind, "iceberg", "skip", cache=False, every=1, limit=4)
    _every_row_once(case, tmp_path, where_lake, after=3)  # before: a row group dropped


# -- the property ------------------------------------------------------------------------------


@settings(max_examples=40)
@given(case=fault_cases())
def test_item_7_every_good_row_once_or_a_read_error_never_fewer_rows(
    where_lake: Where,
    tmp_path_factory: pytest.TempPathFactory,
    case: FaultCase,
) -> None:
    """Any fault, format, policy, with or without the cache: never fewer rows without an error."""
    tmp = tmp_path_factory.mktemp("case")
    loader, faulty = _loader(case, tmp, where_lake)
    allowed: tuple[type[BaseException], ...] = (MemoryError,) if case.kind == "memory" else (ReadError,)
    failed: BaseException | None = None
    try:
        ids = _read(case, loader, where_lake.proxy, faulty)
    except allowed as exc:
        failed = exc
    if failed is not None:
        assert not isinstance(failed, BadDataError)
        assert _quarantined(tmp) == []
        return
    assert_exactly_once(ids, range(TOTAL))
    assert loader.metrics().total.bad_units == 0
    assert _quarantined(tmp) == []
