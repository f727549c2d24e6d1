"""The working tree against earlier versions: same interpreter, same packages, interleaved.

Every version's ``src`` is put on ``PYTHONPATH`` of a fresh child process (a git ref's
``src`` extracted with ``git archive``), so versions differ only in the library's code.
Each repetition runs every scenario once per version, one after the other, so machine
load hits them alike; reported are medians, ranges, and ratios against the first REF.

Scenarios (each run in a fresh process; wall time from ``iter(loader)`` to the end):

* ``S1 nw=0``, ``S1 nw=2``: 8M rows of 9 numeric columns in 16 Parquet files, batch 4096.
* ``S2 nw=0``, ``S2 nw=2``: 500k rows, a string and a ``list<int32>`` column (a jagged
  tensor), batch 1024: the first batch, in seconds since the process was started
  (imports included), and the rest of the epoch ("steady").
* ``S7``: S1 at ``num_workers=2`` behind a 1 ms training step (``time.sleep``) per batch.
* ``pack``: 100k documents of 0-2,048 tokens (8 files of one row group) packed into
  rows of 2,048 (``SequencePack``), 256 documents per batch, ``num_workers=0``; against
  ``pack numpy floor``, a numpy packer over ``pyarrow`` ``iter_batches`` in a process
  that imported torch (versions without ``SequencePack`` show ``-``).

Every scenario also reports the peak PSS (proportional set size: shared pages split
between the processes sharing them) of the child and its DataLoader workers together,
sampled every 50 ms from ``/proc``.

Run: ``python benchmarks/compare.py 0.5.0`` (a version, a commit or any git ref; several
may be given: the first is the baseline of the ratios). ``--repeats`` (default 5),
``--quick`` (small data, one repetition: a smoke run), ``--site DIR`` (an extra
directory on every child's ``PYTHONPATH``, e.g. a ``pip install --target`` of pandas).
Writes ``benchmarks/results/compare-<refs>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

TREE = "tree"
NUMERIC_COLUMNS = ["id", "f0", "f1", "f2", "f3", "f4", "f5", "i0", "label"]  # common.NUMERIC_COLUMNS
# The child imports nothing from benchmarks/ (common imports pyarrow.parquet): what it
# imports before the library is the library's business.


@dataclass(frozen=True)
class Scenario:
    """One measured configuration: what the child runs and which figures it reports."""

    name: str
    data: str  # "S1", "S2" or "pack"
    workers: int = 0
    batch_size: int = 4096
    step_ms: float = 0.0
    floor: bool = False  # the numpy packer instead of the library


SCENARIOS = [
    Scenario("S1 nw=0", "S1"),
    Scenario("S1 nw=2", "S1", workers=2),
    Scenario("S2 nw=0", "S2", batch_size=1024),
    Scenario("S2 nw=2", "S2", workers=2, batch_size=1024),
    Scenario("S7", "S1", workers=2, step_ms=1.0),
    Scenario("pack", "pack", batch_size=256),
    Scenario("pack numpy floor", "pack", batch_size=256, floor=True),
]
SEQ_LEN = 2048


# -- data ----------------------------------------------------------------------------------------


def ensure_data(root: Path, quick: bool) -> dict[str, str]:
    """Write the three datasets once (cached under ``root``); their directories."""
    import common
    from bench_pack import ensure_documents
    from bench_ragged import ensure_ragged

    s1 = common.ensure_dataset(
        common.DatasetSpec(rows=200_000 if quick else 8_000_000, files=4 if quick else 16), root
    )
    s2 = ensure_ragged(root, 50_000 if quick else 500_000, 4 if quick else 8, 16_384, 64)
    pack, _ = ensure_documents(root, 5_000 if quick else 100_000, 4 if quick else 8, 16_384, 2048)
    return {"S1": str(s1[0].parent), "S2": str(s2[0].parent), "pack": str(pack[0].parent)}


# -- versions ------------------------------------------------------------------------------------


def resolve(ref: str) -> str:
    """A commit for ``ref``: a git ref, or a released version.

    A version is its release tag (``v0.7.0``: the commit that landed, tagged when it was
    released) or, in a clone without tags, the commit that set it in pyproject.toml (the
    release's own commit; later fixes of the same release are left out). Never the last
    commit before the next version: the next version's work is done under the old number.
    """

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()

    for name in (f"v{ref}", ref):
        commit = git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
        if commit:
            return commit
    for c in git("log", "--format=%H", "-G", r"^version = ", "--", "pyproject.toml").split():
        if f'version = "{ref}"' in git("show", f"{c}:pyproject.toml").splitlines():
            return c
    raise SystemExit(f"compare.py: {ref!r} is neither a git ref nor a version in pyproject.toml's history")


def extract(commit: str, into: Path) -> Path:
    """``commit``'s ``src`` under ``into`` (``git archive``); the directory to put on PYTHONPATH."""
    into.mkdir(parents=True)
    archive = into / "src.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", commit, "src"], stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


# -- the child: one scenario in a fresh process ---------------------------------------------------


def _numpy_pack(data: str, batch_size: int) -> int:
    """The floor: each batch's documents laid end to end into rows of SEQ_LEN as torch tensors.

    numpy over pyarrow's ``iter_batches``, without the library (torch imported, as a
    training process has it).
    """
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    docs = 0
    for f in sorted(Path(data).glob("*.parquet")):
        for b in pq.ParquetFile(f).iter_batches(batch_size=batch_size, columns=["tokens"]):
            col = b.column(0)
            offsets = col.offsets.to_numpy()
            values = col.values.to_numpy()
            n = len(values)
            rows = max(1, -(-n // SEQ_LEN))
            tokens = np.zeros(rows * SEQ_LEN, dtype=values.dtype)
            tokens[:n] = values
            position = np.arange(rows * SEQ_LEN, dtype=np.int32)
            starts = offsets[:-1][np.diff(offsets) > 0]
            position[:n] -= np.repeat(starts, np.diff(np.append(starts, n))).astype(np.int32)
            packed = [torch.from_numpy(a).view(rows, SEQ_LEN) for a in (tokens, position)]
            docs += len(offsets) - 1 + 0 * len(packed)
    return docs


def child(spec: dict[str, Any]) -> None:
    """Run one scenario; print its figures as one JSON line (times as ``time.time()``)."""
    import warnings

    warnings.filterwarnings("ignore")
    s = Scenario(**spec["scenario"])
    out: dict[str, Any] = {}
    if s.floor:
        out["start"] = time.time()
        out["rows"] = _numpy_pack(spec["data"], s.batch_size)
        out["end"] = time.time()
        print(json.dumps(out))
        return
    import torch_dataloader_utils as tdu

    options: dict[str, Any] = {"batch_size": s.batch_size, "num_workers": s.workers}
    if s.data == "S1":
        options["columns"] = NUMERIC_COLUMNS
    if s.data == "pack":
        if not hasattr(tdu, "SequencePack"):
            print(json.dumps({"missing": "SequencePack"}))
            return
        options["pack_sequences"] = tdu.SequencePack("tokens", seq_len=SEQ_LEN)
    loader, _ = tdu.create_dataloader(spec["data"], **options)
    step = s.step_ms / 1000
    rows = 0
    out["start"] = time.time()
    for batch in loader:
        if "first" not in out:
            out["first"] = time.time()
        rows += len(next(iter(batch.values())))
        if step:
            time.sleep(step)
    out["end"] = time.time()
    out["rows"] = rows
    print(json.dumps(out))


# -- the parent: PSS sampling, repetitions, the table ---------------------------------------------


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from ``/proc/<pid>/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def _pss_mib(pids: Sequence[int]) -> float:
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            pass
    return total / 1024


def run_child(src: Path, spec: dict[str, Any], site: str | None) -> dict[str, Any]:
    """One scenario of one version in a fresh process; its figures, peak PSS included."""
    paths = [str(src), str(ROOT / "benchmarks"), *([site] if site else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    launched = time.time()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", json.dumps(spec)], env=env, stdout=subprocess.PIPE, text=True
    )
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], _pss_mib(_tree(proc.pid)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, _ = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"compare.py: {spec['scenario']['name']} failed (exit {proc.returncode})")
    out: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    if "missing" in out:
        return out
    figures = {"wall_s": out["end"] - out["start"], "rows": out["rows"], "peak_pss_mib": peak[0]}
    if "first" in out:
        figures["first_batch_s"] = out["first"] - launched
        figures["steady_s"] = out["end"] - out["first"]
    return figures


def _cell(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


METRICS = [  # (figure, label, digits, scenarios it is shown for)
    ("wall_s", "wall s", 2, None),
    ("first_batch_s", "first batch s (since launch)", 2, ("S2 nw=0", "S2 nw=2")),
    ("steady_s", "rest of epoch s", 2, ("S2 nw=0", "S2 nw=2")),
    ("peak_pss_mib", "peak PSS MiB", 0, None),
]


def report(
    results: dict[str, dict[str, list[dict[str, Any]]]], labels: list[str], scenarios: list[Scenario]
) -> str:
    """The markdown table: per scenario and figure, each version's median [range], and ratios.

    Ratios: every version against the first, and the working tree against each other.
    """
    base = labels[0]
    # Every version against the first; the working tree (last) also against each other REF.
    pairs_of = [(v, base) for v in labels[1:]] + [(labels[-1], ref) for ref in labels[1:-1]]
    headers = ["scenario", "figure", *labels, *[f"{v} / {ref}" for v, ref in pairs_of]]
    rows = []
    for s in scenarios:
        for key, label, digits, only in METRICS:
            if only is not None and s.name not in only:
                continue
            per = {v: [r[key] for r in results[v].get(s.name, []) if key in r] for v in labels}
            cells = [_cell(per[v], digits) for v in labels]
            ratios = []
            for v, ref in pairs_of:
                pairs = [b / a for a, b in zip(per[ref], per[v], strict=False) if a]
                ratios.append(
                    "-"
                    if not pairs
                    else f"{statistics.median(per[v]) / statistics.median(per[ref]):.2f}x "
                    f"[{min(pairs):.2f}-{max(pairs):.2f}]"
                )
            rows.append([s.name, label, *cells, *ratios])
    floor = {v: results[v].get("pack numpy floor", []) for v in labels}
    packed = {v: results[v].get("pack", []) for v in labels}
    for key, label in (("peak_pss_mib", "peak PSS"), ("wall_s", "wall")):
        cells = []
        for v in labels:  # pack over its floor, per version (the target: <= 2x PSS)
            a, b = [r[key] for r in packed[v]], [r[key] for r in floor[v]]
            cells.append(f"{statistics.median(a) / statistics.median(b):.2f}x" if a and b else "-")
        if any(c != "-" for c in cells):
            rows.append(["pack / numpy floor", label, *cells, *["" for _ in pairs_of]])
    return (
        "\n".join(["| " + " | ".join(map(str, r)) + " |" for r in [headers, ["---"] * len(headers), *rows]])
        + "\n"
    )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("refs", nargs="*", help="versions or git refs to compare the working tree with")
    p.add_argument("--repeats", type=int, default=5, help="repetitions (each runs every version once)")
    p.add_argument("--quick", action="store_true", help="small data, one repetition (a smoke run)")
    p.add_argument("--site", help="an extra directory on every child's PYTHONPATH (e.g. pandas)")
    p.add_argument("--only", nargs="+", help="scenario names to run (default: all)")
    p.add_argument("--data-dir", type=Path, default=HERE / ".data")
    p.add_argument("--out-dir", type=Path, default=HERE / "results")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return
    if not args.refs:
        p.error("name at least one version or git ref, e.g. compare.py 0.5.0")
    repeats = 1 if args.quick else args.repeats
    scenarios = [s for s in SCENARIOS if not args.only or s.name in args.only]
    import common

    data = ensure_data(args.data_dir.resolve(), args.quick)
    info = common.machine()
    with tempfile.TemporaryDirectory(prefix="compare-") as tmp:
        srcs = {ref: extract(resolve(ref), Path(tmp) / f"v{i}") for i, ref in enumerate(args.refs)}
        # The working tree as it is now: edits made while the run goes on do not count.
        srcs[TREE] = Path(tmp) / "tree" / "src"
        shutil.copytree(ROOT / "src", srcs[TREE], ignore=shutil.ignore_patterns("__pycache__"))
        labels = [*args.refs, TREE]
        results: dict[str, dict[str, list[dict[str, Any]]]] = {v: {} for v in labels}
        loads = [os.getloadavg()[0]]
        for r in range(repeats):
            for s in scenarios:
                for v in labels:
                    spec = {"scenario": s.__dict__, "data": data[s.data]}
                    figures = run_child(srcs[v], spec, args.site)
                    if "missing" not in figures:
                        results[v].setdefault(s.name, []).append(figures)
            loads.append(os.getloadavg()[0])
            print(f"repetition {r + 1}/{repeats} done (load {loads[-1]:.1f})", file=sys.stderr, flush=True)
    commits = {ref: resolve(ref)[:9] for ref in args.refs}
    args.out_dir.mkdir(parents=True, exist_ok=True)  # the raw figures first, whatever the report does
    (args.out_dir / "compare-last-raw.json").write_text(json.dumps(results, indent=1))
    md = (
        f"`benchmarks/compare.py {' '.join(sys.argv[1:] if argv is None else argv)}`: "
        + ", ".join(f"{ref} = {c}" for ref, c in commits.items())
        + f", {TREE} = the working tree; {repeats} interleaved repetitions, median [min-max]; ratios: "
        f"median / median [range of the per-repetition ratios]. Python {info['python']}, torch "
        f"{info['torch']}, pyarrow {info['pyarrow']}, {info['cpus']} CPUs; 1-minute load average "
        f"{min(loads):.1f}-{max(loads):.1f} during the run"
        + (f"; extra site {args.site}" if args.site else "")
        + ".\n\n"
        + report(results, labels, scenarios)
    )
    name = "compare-" + "-".join(ref.replace("/", "_") for ref in args.refs)
    name += "-quick" if args.quick else ""
    payload = {"command": common.command_line(), "commits": commits, "machine": info, "loads": loads}
    common.write_results(name, {**payload, "results": results}, md, args.out_dir)


if __name__ == "__main__":
    main()
