"""The ``reshard`` command as real processes: SIGKILL at random points then rerun, and torchrun."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.tools.helpers import manifest_doc, read_output, visible_shards, write_source

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 150


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO / "src")
    env["OMP_NUM_THREADS"] = "1"
    return env


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch_dataloader_utils", "reshard", *args]


def markers(dst: Path) -> int:
    done = dst / "_reshard" / "done"
    try:
        return len(os.listdir(done))
    except FileNotFoundError:
        return 0


def check_no_partial_shard_is_visible(dst: Path) -> None:
    for path in visible_shards(dst):
        meta = pq.read_metadata(path)  # a complete file: its footer is there
        assert pq.read_table(path).num_rows == meta.num_rows


@pytest.mark.parametrize(
    ("seed", "extra"),
    [
        (11, []),
        (12, ["--sort-by", "s"]),
        (13, ["--group-by", "user"]),
    ],
)
def test_sigkill_at_a_random_point_then_rerun_ends_exactly_once(
    tmp_path: Path, seed: int, extra: list[str]
) -> None:
    rng = random.Random(seed)
    total = write_source(tmp_path / "src", "parquet", [rng.randint(200, 900) for _ in range(40)])
    if "user" in extra:  # group by a key of 97 values spread over every file
        for path in sorted((tmp_path / "src").iterdir()):
            table = pq.read_table(path)
            pq.write_table(table.append_column("user", pa.array(table.column("id").to_numpy() % 97)), path)
    dst = tmp_path / "dst"
    args = command(str(tmp_path / "src"), str(dst), "--target-file-size", "3KiB", "--workers", "2", *extra)
    kill_after = rng.randint(1, 25)  # done markers (maps or shards) before the kill
    for _attempt in range(4):
        proc = subprocess.Popen(
            args, env=child_env(), start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + TIMEOUT
        while proc.poll() is None and markers(dst) < kill_after and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.03))
        os.killpg(proc.pid, signal.SIGKILL)  # the command and its worker processes, at once
        proc.wait(30)
        check_no_partial_shard_is_visible(dst)
        if not (dst / "_manifest.json").exists():
            break
        # On a quiet machine the job can end in the moment before the kill: again, earlier.
        shutil.rmtree(dst)
        kill_after = max(1, kill_after // 2)
    else:
        pytest.fail(f"the job finished before the kill four times (last after {kill_after} markers)")
    done = subprocess.run(args, env=child_env(), capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "done before" in done.stdout
    ids = np.sort(read_output(dst).column("id").to_numpy())
    assert np.array_equal(ids, np.arange(total))
    shards = {s["path"] for s in manifest_doc(dst)["shards"]}
    assert {str(p.relative_to(dst)) for p in visible_shards(dst)} == shards
    assert sorted(os.listdir(dst)) == sorted(["_manifest.json", *shards])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_torchrun_two_ranks_map_reduce_and_merge(tmp_path: Path) -> None:
    total = write_source(tmp_path / "src", "parquet", [300, 1200, 50, 800, 640, 999, 17, 400])
    dst = tmp_path / "dst"
    cmd = [
        str(Path(sys.executable).with_name("torchrun")),
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "--module",
        "torch_dataloader_utils",
        "reshard",
        str(tmp_path / "src"),
        str(dst),
        "--target-file-size=4KiB",
        "--group-by=label",
        "--partition-by=label",
        "--workers=2",
        "--verify",
        "--rank-timeout=60",
    ]
    done = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("verified") == 2  # both ranks report the job
    out = read_output(dst)
    assert np.array_equal(np.sort(out.column("id").to_numpy()), np.arange(total))
    doc = manifest_doc(dst)
    assert {s["path"].split("/")[0] for s in doc["shards"]} == {f"label={v}" for v in range(5)}
    assert not (dst / "_reshard").exists()
