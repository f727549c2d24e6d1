"""0.2.0's multi-process examples (DDP, Horovod's code path, Accelerate, multi-rank checkpoints).

Two launches of two processes each, on CPU (gloo): ``launch_scripts/ddp_examples.py``
under torchrun and ``launch_scripts/accelerate_examples.py`` under ``accelerate launch``.
Each script runs the examples' loops and writes what every rank read; the checks are
here: every row exactly once across ranks per epoch, equal batch counts (the scripts'
DDP-wrapped models would time out otherwise).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.examples020 import Data020, note

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).with_name("launch_scripts")
LAUNCH_TIMEOUT = 240
ALL = list(range(600))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cmd: list[str], tmp_path: Path) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(REPO / "src"), HF_HOME=str(tmp_path / "hf_home"), OMP_NUM_THREADS="1")
    pipe, out = subprocess.PIPE, subprocess.STDOUT
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=pipe, stderr=out, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"launch timed out after {LAUNCH_TIMEOUT}s: {cmd}")
    assert proc.returncode == 0, output[-4000:]
    return [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(2)]


def _config(data020: Data020, tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir()
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"train": str(data020.train), "catalog_config": data020.catalog_config}))
    return path


SOURCES = {
    "horovod": "distributed.md Horovod (explicit rank/size, no process group)",
    "readme_ddp": "README DDP / Multi-Rank Usage, PyTorch DDP (gloo)",
    "docs_ddp": "distributed.md PyTorch DDP",
    "iceberg_ddp": "distributed.md Iceberg Tables with DDP",
    "env_ranks": "distributed.md Global Rank vs Local Rank (RANK / WORLD_SIZE)",
    "checkpoint_A": "checkpoint.md DDP Option A (one file, all_gather_object)",
    "checkpoint_B": "checkpoint.md DDP Option B (a file per rank)",
    "readme_accelerate": "README DDP / Multi-Rank Usage, HuggingFace Accelerate",
    "docs_accelerate": "distributed.md HuggingFace Accelerate",
    "training_accelerate": "training.md With HuggingFace Accelerate",
    "escape_hatch": "README Advanced Usage (Escape Hatch) with accelerator.prepare",
    "direct_constructor": "structured.md Advanced: Direct Constructor with accelerator.prepare",
}


def _exactly_once(per_rank: list[list[int]], expected: list[int], key: str = "", detail: str = "") -> None:
    ids = [i for ids in per_rank for i in ids]
    if key:
        name, _, epoch = key.partition("/")
        counts = ", ".join(f"rank {r}: {len(x)} rows" for r, x in enumerate(per_rank))
        extra = f"epoch {epoch}; " if epoch else ""
        note(ids, f"{extra}{counts}{'; ' + detail if detail else ''}", source=SOURCES[name])
    assert sorted(ids) == expected


def test_torchrun_examples(data020: Data020, tmp_path: Path) -> None:
    """README DDP; distributed.md DDP, Iceberg DDP, RANK / WORLD_SIZE, Horovod's path; checkpoint.md A, B."""
    config = _config(data020, tmp_path)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    cmd = [torchrun, "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={_free_port()}"]
    ranks = _run([*cmd, str(SCRIPTS / "ddp_examples.py"), str(config), str(tmp_path / "out")], tmp_path)
    horovod = [r["horovod"] for r in ranks]
    assert horovod[0]["batches"] == horovod[1]["batches"]
    detail = f"{horovod[0]['batches']} and {horovod[1]['batches']} batches"
    _exactly_once([h["ids"] for h in horovod], ALL, "horovod", detail)
    for key in ("readme_ddp", "docs_ddp/0", "docs_ddp/1", "env_ranks"):
        _exactly_once([r[key] for r in ranks], ALL, key)
    for key in ("iceberg_ddp/0", "iceberg_ddp/1"):
        _exactly_once([r[key] for r in ranks], [i for i in ALL if i % 10 >= 5], key)
    for option in ("A", "B"):
        parts = [r[f"checkpoint_{option}"] for r in ranks]
        assert all(len(p["before"]) == 3 * 32 for p in parts)
        detail = ", ".join(
            f"rank {r}: {len(p['before'])} before + {len(p['after'])} after" for r, p in enumerate(parts)
        )
        _exactly_once([p["before"] + p["after"] for p in parts], ALL, f"checkpoint_{option}", detail)


def test_accelerate_examples(data020: Data020, tmp_path: Path) -> None:
    """README Accelerate, escape hatch; distributed.md, training.md Accelerate; structured.md constructor."""
    pytest.importorskip("accelerate")
    config = _config(data020, tmp_path)
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    cmd = [
        accelerate, "launch", "--multi_gpu", "--num_processes=2", "--num_machines=1", "--mixed_precision=no",
        "--dynamo_backend=no", "--main_process_ip=127.0.0.1", f"--main_process_port={_free_port()}",
    ]  # fmt: skip
    script = str(SCRIPTS / "accelerate_examples.py")
    ranks = _run([*cmd, script, str(config), str(tmp_path / "out")], tmp_path)
    assert [r["world"] for r in ranks] == [[0, 2], [1, 2]]
    # accelerator.prepare(loader) returns the library's loader unchanged: nothing is lost.
    assert {r["readme_prepared_is_loader"] for r in ranks} == {"ResumableDataLoader"}
    keys = ("readme_accelerate", "docs_accelerate/0", "docs_accelerate/1", "training_accelerate/0")
    for key in (*keys, "training_accelerate/1"):
        _exactly_once([r[key] for r in ranks], ALL, key)
    # A plain DataLoader over the dataset, prepared: Accelerate dispatches rank 0's share
    # to both processes, so rank 1's share is never read (docs/migrating-from-0.2.md).
    for key in ("escape_hatch", "direct_constructor"):
        seen = [i for r in ranks for i in r[key]]
        note(
            seen, ", ".join(f"rank {r}: {len(x[key])} rows" for r, x in enumerate(ranks)), source=SOURCES[key]
        )
        assert len(seen) == len(set(seen)) == 300
