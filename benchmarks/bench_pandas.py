"""Why pandas slows the loader with workers: each hypothesis measured, interleaved.

``pyarrow.dataset`` imports pandas whenever it is installed (pyarrow's pandas shim, at
import), so the main process holds pandas' objects when DataLoader workers fork. This
runs S1 of ``compare.py`` (8M rows, 9 numeric columns, 16 files, batch 4096,
``num_workers=2``) in fresh processes, in variants, one after the other per repetition:

* ``no pandas`` / ``pandas``: the same packages, with and without a directory holding
  pandas on ``PYTHONPATH`` (``--site``);
* ``... + worker gc.freeze``: each worker moves every object it inherited into the
  permanent generation when it starts (``gc.freeze()``: no object is touched), so its
  collections traverse only the objects it makes;
* ``pandas + worker gc off``: the workers never collect cycles;
* ``pandas + main gc.collect before fork``: the main process collects once before its
  workers fork (inside the timed loop, as the loader does it), and the workers freeze.

Reported per variant: the wall time of the epoch, the workers' CPU seconds and minor
page faults (``RUSAGE_CHILDREN``, after they exited), the workers' full (generation 2)
collections and the objects they traversed (``gc.callbacks``), the objects the garbage
collector tracked in the main process when the workers forked, the threads of a
worker, and ``import pandas``'s time in a fresh process.

Run: ``python benchmarks/bench_pandas.py --site DIR`` (DIR: ``pip install --target DIR
pandas``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VARIANTS = {  # name: (pandas on the path, what each worker does when it starts)
    "no pandas": (False, ""),
    "pandas": (True, ""),
    "no pandas + worker gc.freeze": (False, "freeze"),
    "pandas + worker gc.freeze": (True, "freeze"),
    "pandas + worker gc off": (True, "off"),
    "pandas + main gc.collect before fork": (True, "collect"),
}


def _in_worker(mode: str, report: str) -> None:
    """Set up a freshly forked worker: the variant's GC setting, and its GC statistics at exit."""
    import gc
    import multiprocessing.util as mp_util
    import threading

    if mode == "freeze":
        gc.freeze()
    elif mode == "off":
        gc.disable()
    stats = {"full": 0, "seconds": 0.0, "threads": 0}
    began = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            stats["full"] += 1
            stats["seconds"] += time.perf_counter() - began[0]

    gc.callbacks.append(on_gc)

    def dump() -> None:
        stats["threads"] = threading.active_count()
        with open(f"{report}.{os.getpid()}", "w") as f:
            json.dump(stats, f)

    mp_util.Finalize(None, dump, exitpriority=100)


def child(data: str, mode: str, report: str) -> None:
    import gc
    import multiprocessing.util as mp_util
    import warnings

    warnings.filterwarnings("ignore")
    from torch_dataloader_utils import create_dataloader

    columns = ["id", "f0", "f1", "f2", "f3", "f4", "f5", "i0", "label"]
    loader, _ = create_dataloader(data, batch_size=4096, num_workers=2, columns=columns)

    class Marker:  # register_after_fork keeps a weak reference to it
        pass

    marker = Marker()
    mp_util.register_after_fork(marker, lambda _: _in_worker(mode, report))
    tracked = len(gc.get_objects())
    main_gc = {"full": 0, "seconds": 0.0, "began": 0.0}

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if info["generation"] == 2:
            if phase == "start":
                main_gc["began"] = time.perf_counter()
            else:
                main_gc["full"] += 1
                main_gc["seconds"] += time.perf_counter() - main_gc["began"]

    gc.callbacks.append(on_gc)
    rows = 0
    t0 = time.perf_counter()
    if mode == "collect":  # once, before the workers fork, timed (as the loader would)
        gc.collect()
    for batch in loader:
        rows += len(batch["id"])
    wall = time.perf_counter() - t0
    gc.callbacks.remove(on_gc)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        json.dumps(
            {
                "wall_s": wall,
                "rows": rows,
                "worker_cpu_s": kids.ru_utime + kids.ru_stime,
                "worker_minor_faults": kids.ru_minflt,
                "tracked_objects": tracked,
                "main_full_gcs": main_gc["full"],
                "main_full_gc_s": main_gc["seconds"],
                "pandas": "pandas" in sys.modules,
            }
        )
    )


def _import_seconds(site: str) -> float:
    code = "import time; t = time.perf_counter(); import pandas; print(time.perf_counter() - t)"
    env = {**os.environ, "PYTHONPATH": site}
    return float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--site", help="a directory holding pandas (pip install --target); required")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data-dir", type=Path, default=HERE / ".data")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(*args.child)
        return
    if not args.site:
        p.error("--site DIR is required: a directory holding pandas (pip install --target DIR pandas)")
    sys.path.insert(0, str(HERE))
    import common

    data = str(common.ensure_dataset(common.DatasetSpec(rows=8_000_000, files=16), args.data_dir)[0].parent)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    loads = [os.getloadavg()[0]]
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_pandas.{os.getpid()}"
    for r in range(args.repeats):
        for name, (pandas, mode) in VARIANTS.items():
            paths = [str(ROOT / "src"), *([args.site] if pandas else [])]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
            report = f"{tmp}.{r}.{mode or 'none'}.{int(pandas)}"
            out = subprocess.run(
                [sys.executable, __file__, "--child", data, mode, report],
                env=env, capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            figures = json.loads(out.strip().splitlines()[-1])
            workers = [json.loads(f.read_text()) for f in Path(report).parent.glob(Path(report).name + ".*")]
            for f in Path(report).parent.glob(Path(report).name + ".*"):
                f.unlink()
            figures["worker_full_gcs"] = sum(w["full"] for w in workers)
            figures["worker_full_gc_s"] = sum(w["seconds"] for w in workers)
            figures["worker_threads"] = max((w["threads"] for w in workers), default=0)
            runs[name].append(figures)
        loads.append(os.getloadavg()[0])
        print(f"repetition {r + 1}/{args.repeats} (load {loads[-1]:.1f})", file=sys.stderr, flush=True)
    base = statistics.median(f["wall_s"] for f in runs["no pandas"])

    def cell(name: str, key: str, fmt: str) -> str:
        values = [f[key] for f in runs[name]]
        return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"

    rows = [
        [
            name,
            cell(name, "wall_s", ".2f"),
            f"{statistics.median(f['wall_s'] for f in runs[name]) / base:.2f}x",
            cell(name, "worker_cpu_s", ".2f"),
            cell(name, "worker_minor_faults", ".0f"),
            cell(name, "worker_full_gcs", ".0f"),
            cell(name, "worker_full_gc_s", ".3f"),
            cell(name, "main_full_gcs", ".0f"),
            cell(name, "main_full_gc_s", ".3f"),
            cell(name, "tracked_objects", ".0f"),
            cell(name, "worker_threads", ".0f"),
        ]
        for name in VARIANTS
    ]
    info = common.machine()
    md = (
        f"`benchmarks/bench_pandas.py` ({args.repeats} interleaved repetitions, median [min-max]); S1 at "
        f"num_workers=2; `import pandas` alone: {_import_seconds(args.site):.2f} s. Python {info['python']}, "
        f"torch {info['torch']}, pyarrow {info['pyarrow']}, {info['cpus']} CPUs, 1-minute load "
        f"{min(loads):.1f}-{max(loads):.1f}.\n\n"
        + common.table(
            [
                "variant",
                "wall s",
                "vs no pandas",
                "workers' CPU s",
                "workers' minor faults",
                "workers' full GCs",
                "their time s",
                "main's full GCs",
                "their time s",
                "objects tracked at fork",
                "threads per worker",
            ],
            rows,
        )
    )
    common.write_results("bench_pandas", {"loads": loads, "runs": runs, "machine": info}, md)


if __name__ == "__main__":
    main()
