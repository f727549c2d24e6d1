"""Hostile cases 10, 11, 18, 19 and 21 (reshard): a manifest and its shards, trusted as far as they hold.

Before: a shard copied over another of the same size was read twice with no error (the
manifest held sizes only); a hand-edited manifest could list a shard twice, drop row
groups or point outside its directory; two jobs started on one destination left a
"complete" manifest of mixed shards, and a rerun reported success; ``verify`` compared
columns separately, so values moved between rows passed; ``reshard data/ data/shards/``
was accepted and the source then read every row twice; and a full disk, a long partition
value, a renamed column in a manifest or a resume across ``use_manifest`` gave raw or
misleading errors.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fixtures.s3 import S3Server
from torch_dataloader_utils import (
    ConfigError,
    CorruptFileError,
    DestinationConflictError,
    FileChangedError,
    ReshardError,
    SchemaMismatchError,
    create_dataloader,
    reshard,
)

ROWS = 4000
# Fixed-width columns, no compression: shards of equal rows have equal sizes.
OPTIONS: dict[str, Any] = {"target_file_size": "16KiB", "row_group_rows": 250, "compression": "none"}


def _source(root: Path, files: int = 4) -> Path:
    root.mkdir(parents=True)
    per = ROWS // files
    for i in range(files):
        ids = np.arange(i * per, (i + 1) * per, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), root / f"p{i}.parquet", row_group_size=100)
    return root


def _ids(path: Path | str, **options: Any) -> list[int]:
    loader, _ = create_dataloader(str(path), batch_size=500, num_workers=0, **options)
    return sorted(i for batch in loader for i in batch["id"].tolist())


def _manifest(dst: Path) -> dict[str, Any]:
    return json.loads((dst / "_manifest.json").read_text())


@pytest.fixture
def dst(tmp_path: Path) -> Path:
    """A resharded copy of 4,000 rows in shards of equal size (the last one smaller)."""
    out = tmp_path / "shards"
    report = reshard(str(_source(tmp_path / "src")), str(out), **OPTIONS)
    assert report.num_shards >= 3
    sizes = [s["bytes"] for s in _manifest(out)["shards"]]
    assert sizes[0] == sizes[1]
    return out


def _assert_stale(text: str) -> None:
    assert "_manifest.json' is stale" in text
    assert "reshard again" in text
    assert "use_manifest=False" in text


# -- case 10: what a manifest trusts --------------------------------------------------------


def test_case_10_shard_copied_over_another_of_the_same_size(dst: Path) -> None:
    shards = _manifest(dst)["shards"]
    shutil.copyfile(dst / shards[1]["path"], dst / shards[0]["path"])
    with pytest.raises(FileChangedError) as exc:
        _ids(dst)
    _assert_stale(str(exc.value))
    assert str(dst / shards[0]["path"]) in str(exc.value)


def test_case_10_shard_replaced_keeping_size_and_time_is_caught_by_its_footer(dst: Path) -> None:
    """Other row groups at the same size and time: the footer read is compared with the manifest."""
    shard = dst / _manifest(dst)["shards"][0]["path"]
    stat = shard.stat()
    table = pq.read_table(shard)
    for rows in range(300, 0, -1):  # other row groups, padded to the same size
        pq.write_table(table, shard, row_group_size=rows, compression="none")
        if shard.stat().st_size <= stat.st_size:
            break
    from tests.fixtures.data import write_same_size

    write_same_size(shard, table, stat.st_size, row_group_size=rows)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(FileChangedError) as exc:
        _ids(dst)
    assert "row group" in str(exc.value)
    _assert_stale(str(exc.value))


def _edit(dst: Path, change: str) -> None:
    doc = _manifest(dst)
    shards = doc["shards"]
    if change == "listed_twice":
        shards.append(dict(shards[0]))
    elif change == "absolute_path":
        shards[0]["path"] = str(dst / shards[0]["path"])
    elif change == "parent_path":
        shards[0]["path"] = "../shards/" + shards[0]["path"]
    elif change == "row_group_dropped":
        shards[0]["row_groups"].pop()
    (dst / "_manifest.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("change", ["listed_twice", "absolute_path", "parent_path", "row_group_dropped"])
def test_case_10_hand_edited_manifest_is_refused(dst: Path, change: str) -> None:
    _edit(dst, change)
    with pytest.raises(CorruptFileError, match=r"_manifest\.json' cannot be used: .*reshard again"):
        _ids(dst)


def test_case_10_row_group_dropped_consistently_is_caught_by_the_footer(dst: Path) -> None:
    doc = _manifest(dst)
    shard = doc["shards"][0]
    dropped = shard["row_groups"].pop()
    shard["rows"] -= dropped[1]
    doc["num_rows"] -= dropped[1]
    (dst / "_manifest.json").write_text(json.dumps(doc))
    with pytest.raises(FileChangedError) as exc:
        _ids(dst)
    _assert_stale(str(exc.value))


def test_case_10_unchanged_shards_read_exactly(dst: Path) -> None:
    assert _ids(dst) == list(range(ROWS))
    assert all("mtime" in s for s in _manifest(dst)["shards"])


# -- case 11: two jobs on one destination ----------------------------------------------------


def _job(barrier: Any, src: str, dst: str, size: str, out: Any) -> None:
    barrier.wait()
    try:
        report = reshard(src, dst, target_file_size=size, row_group_rows=100, compression="none")
        out.put(("ok", report.num_rows))
    except Exception as exc:
        out.put((type(exc).__name__, str(exc)))


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(3))
def test_case_11_two_jobs_started_on_one_destination(tmp_path: Path, trial: int) -> None:
    src = _source(tmp_path / "src", files=20)
    dst = tmp_path / "dst"
    context = multiprocessing.get_context("fork")
    barrier, out = context.Barrier(2), context.Queue()
    jobs = [
        context.Process(target=_job, args=(barrier, str(src), str(dst), size, out))
        for size in ("8KiB", "20KiB")
    ]
    for job in jobs:
        job.start()
    results = [out.get(timeout=120) for _ in jobs]
    for job in jobs:
        job.join(timeout=60)
    outcomes = sorted(kind for kind, _ in results)
    assert outcomes == ["DestinationConflictError", "ok"], results
    refused = next(text for kind, text in results if kind != "ok")
    assert "reshard job with other options (target_file_size=" in refused
    assert _ids(dst) == list(range(ROWS))


def test_case_11_a_job_that_finishes_while_the_other_writes_its_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving a loaded machine gave (2026-11-27): job A ran to its end, removing its
    ``_reshard/`` directory, between job B creating ``_reshard/tmp`` and writing its claim there.
    B must judge A's finished output (a conflict naming the options), not fail to write."""
    from torch_dataloader_utils.tools.reshard_io import Destination

    src = _source(tmp_path / "src", files=20)
    dst = tmp_path / "dst"
    mkdirs = Destination._mkdirs
    raced: list[bool] = []

    def mkdirs_then_other_job(self: Destination, rel: str) -> None:
        mkdirs(self, rel)
        if rel.startswith("_reshard/tmp/") and rel.endswith("job.json") and not raced:
            raced.append(True)
            monkeypatch.setattr(Destination, "_mkdirs", mkdirs)
            reshard(str(src), str(dst), target_file_size="8KiB", row_group_rows=100, compression="none")

    monkeypatch.setattr(Destination, "_mkdirs", mkdirs_then_other_job)
    with pytest.raises(DestinationConflictError, match=r"a finished reshard job with other options"):
        reshard(str(src), str(dst), target_file_size="20KiB", row_group_rows=100, compression="none")
    assert raced == [True]
    assert _ids(dst) == list(range(ROWS))


def test_case_11_the_claim_is_exclusive_and_carried_by_the_markers(tmp_path: Path) -> None:
    from torch_dataloader_utils.storage.fs import resolve
    from torch_dataloader_utils.tools.reshard_io import Destination

    fs, root = resolve(str(tmp_path / "dst"))
    dest = Destination(fs, root)
    assert dest.create_exclusive("_reshard/job.json", b'{"job_id": "a"}')
    assert not dest.create_exclusive("_reshard/job.json", b'{"job_id": "b"}')
    assert json.loads((tmp_path / "dst" / "_reshard" / "job.json").read_text()) == {"job_id": "a"}
    assert not list((tmp_path / "dst" / "_reshard" / "tmp").iterdir())


@pytest.mark.slow
def test_case_11_the_claim_is_exclusive_on_s3(s3_server: S3Server) -> None:
    from torch_dataloader_utils.storage.fs import resolve
    from torch_dataloader_utils.tools.reshard_io import Destination

    fs, root = resolve(f"s3://{s3_server.new_prefix()}/dst", s3_server.options())
    dest = Destination(fs, root)
    assert dest.create_exclusive("_reshard/job.json", b'{"job_id": "a"}')
    assert not dest.create_exclusive("_reshard/job.json", b'{"job_id": "b"}')
    assert dest.read_json("_reshard/job.json") == {"job_id": "a"}


@pytest.mark.parametrize("size", ["20KiB", "8KiB"])
def test_case_11_a_job_that_finished_while_another_planned_is_not_overwritten(
    tmp_path: Path, size: str
) -> None:
    """The race the two-job test hits about 1 run in 10: job A runs to its end (and releases its
    claim) while job B, which found the destination empty, is still planning; B then claims it.
    B must judge A's finished output, not write over it: a conflict with other options, done
    with the same ones."""
    src = _source(tmp_path / "src", files=20)
    dst = tmp_path / "dst"
    from torch_dataloader_utils.tools import reshard as module

    original = module._Job._calibrate
    ran: list[int] = []

    def plan_while_another_job_finishes(self: Any) -> Any:
        if not ran:
            ran.append(0)  # the other job plans with the original
            module._Job._calibrate = original  # type: ignore[method-assign]
            other = reshard(
                str(src), str(dst), target_file_size="8KiB", row_group_rows=100, compression="none"
            )
            ran[0] = other.num_rows
        return original(self)

    module._Job._calibrate = plan_while_another_job_finishes  # type: ignore[method-assign]
    try:
        if size == "8KiB":  # the same job: done before, nothing written again
            report = reshard(
                str(src), str(dst), target_file_size=size, row_group_rows=100, compression="none"
            )
            assert report.num_rows == ROWS
        else:
            with pytest.raises(DestinationConflictError, match=r"finished reshard job with other options"):
                reshard(str(src), str(dst), target_file_size=size, row_group_rows=100, compression="none")
    finally:
        module._Job._calibrate = original  # type: ignore[method-assign]
    assert ran == [ROWS]
    assert not (dst / "_reshard").exists()
    assert _manifest(dst)["options"]["target_file_size"] == 8192
    assert _ids(dst) == list(range(ROWS))


def test_case_11_shards_that_do_not_add_up_write_no_manifest(tmp_path: Path) -> None:
    """A marker of the job describing other rows (another job's shard): no manifest is written."""
    src = _source(tmp_path / "src")
    dst = tmp_path / "dst"
    from torch_dataloader_utils.tools import reshard as module

    original = module._Job._read_markers

    def tampered(self: Any, kind: str, count: int) -> list[Any]:
        docs = original(self, kind, count)
        if kind == "shard":
            docs[0] = {**docs[0], "rows": docs[0]["rows"] - 1}
        return docs

    module._Job._read_markers = tampered  # type: ignore[method-assign]
    try:
        with pytest.raises(ReshardError, match=r"hold 3999 rows but the job planned 4000: another job"):
            reshard(str(src), str(dst), **OPTIONS)
    finally:
        module._Job._read_markers = original  # type: ignore[method-assign]
    assert not (dst / "_manifest.json").exists()


# -- case 18: verify sees values moved between rows -------------------------------------------


def test_case_18_verify_finds_values_permuted_within_a_row_group(dst: Path, tmp_path: Path) -> None:
    shard = dst / _manifest(dst)["shards"][0]["path"]
    stat = shard.stat()
    table = pq.read_table(shard)
    x = table.column("x").to_numpy().copy()
    x[:250] = x[:250][::-1]  # the first row group's x values, reversed: every column's multiset is kept
    pq.write_table(table.set_column(1, "x", pa.array(x)), shard, row_group_size=250, compression="none")
    assert shard.stat().st_size == stat.st_size
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ReshardError, match="values were moved between rows"):
        reshard(str(tmp_path / "src"), str(dst), verify=True, **OPTIONS)


def test_case_18_an_unchanged_output_verifies(dst: Path, tmp_path: Path) -> None:
    assert reshard(str(tmp_path / "src"), str(dst), verify=True, **OPTIONS).verified


# -- case 19: a destination inside the source --------------------------------------------------


@pytest.mark.parametrize(
    ("src", "dst", "where"),
    [
        ("data", "data/shards", "inside the source"),
        ("data", "data", "inside the source"),
        ("data/raw", "data", "a directory that holds the source"),
        ("data/**/*.parquet", "data/shards", "inside the source"),
    ],
)
def test_case_19_destination_inside_the_source_is_refused(
    tmp_path: Path, src: str, dst: str, where: str
) -> None:
    _source(tmp_path / "data" / "raw")
    with pytest.raises(DestinationConflictError, match=f"is {where} .*read twice"):
        reshard(str(tmp_path / src), str(tmp_path / dst))
    assert not (tmp_path / dst / "_manifest.json").exists()


def test_case_19_a_sibling_destination_and_a_flat_glob_are_fine(tmp_path: Path) -> None:
    _source(tmp_path / "data")
    reshard(str(tmp_path / "data"), str(tmp_path / "shards"))
    reshard(str(tmp_path / "data" / "*.parquet"), str(tmp_path / "data" / "flat"))  # * does not cross '/'
    assert _ids(tmp_path / "shards") == _ids(tmp_path / "data" / "flat") == list(range(ROWS))


# -- case 21: obscure messages of reshard and manifests ----------------------------------------


def test_case_21_full_disk_names_the_file(tmp_path: Path) -> None:
    """A real ENOSPC (/dev/full) while a destination writes: the file and the cause are named."""
    from torch_dataloader_utils.storage.fs import FileSystemSpec
    from torch_dataloader_utils.tools.reshard_io import Destination, writing

    dest = Destination(FileSystemSpec("file"), "/dev")
    with (
        pytest.raises(ReshardError, match=r"writing '/dev/full' failed .*No space left.*the storage is full"),
        writing(dest, "full"),
        dest.open_output("full") as out,
    ):
        out.write(b"x" * (1 << 20))


FSIZE_SCRIPT = """
import resource, signal, sys
from torch_dataloader_utils import ReshardError, reshard
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
try:
    reshard(sys.argv[1], sys.argv[2], target_file_size="64KiB", row_group_rows=250, compression="none")
except ReshardError as exc:
    print("ReshardError:", exc)
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs RLIMIT_FSIZE (POSIX)")
def test_case_21_a_write_refused_during_reshard_names_the_shard(tmp_path: Path) -> None:
    src = _source(tmp_path / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", FSIZE_SCRIPT, str(src), str(tmp_path / "dst")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    assert done.stdout.startswith("ReshardError: writing "), done.stdout + done.stderr[-2000:]
    assert f"{tmp_path / 'dst'}/part-00000.parquet" in done.stdout
    assert "File too large" in done.stdout
    assert "run the same command again" in done.stdout


def test_case_21_partition_value_longer_than_a_file_name(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "k": ["a" * 300, "b"]}), root / "a.parquet")
    with pytest.raises(
        ConfigError, match=r"partition_by column 'k' has a value .*longer than file systems allow \(255\)"
    ):
        reshard(str(root), str(tmp_path / "dst"), partition_by="k")


def test_case_21_manifest_schema_renaming_a_column(dst: Path) -> None:
    import base64

    doc = _manifest(dst)
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(doc["schema"])))
    renamed = pa.schema([pa.field("ident" if f.name == "id" else f.name, f.type) for f in schema])
    doc["schema"] = base64.b64encode(renamed.serialize().to_pybytes()).decode()
    (dst / "_manifest.json").write_text(json.dumps(doc))
    loader, _ = create_dataloader(str(dst), num_workers=0)
    with pytest.raises(
        SchemaMismatchError, match=r"has no column 'ident', which the manifest .* lists"
    ) as exc:
        list(loader)
    _assert_stale(str(exc.value))


def test_case_21_resume_across_use_manifest_true_to_false(dst: Path) -> None:
    loader, _ = create_dataloader(str(dst), batch_size=100, num_workers=0, use_manifest=True)
    batches = iter(loader)
    seen = [i for _ in range(7) for i in next(batches)["id"].tolist()]
    state = loader.state_dict()
    listed, _ = create_dataloader(str(dst), batch_size=100, num_workers=0, use_manifest=False)
    listed.load_state_dict(state)
    rest = [i for batch in listed for i in batch["id"].tolist()]
    assert sorted(seen + rest) == list(range(ROWS))
