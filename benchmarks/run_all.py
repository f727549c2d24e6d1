"""Run every benchmark (``make bench``); results go to ``benchmarks/results/``.

Options are passed to each benchmark (e.g. ``--quick``, ``--repeats 7``).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import bench_memory  # noqa: E402
import bench_parquet  # noqa: E402
import bench_ragged  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    print("== throughput (bench_parquet) ==", flush=True)
    bench_parquet.main(args)
    print("== ragged columns (bench_ragged) ==", flush=True)
    bench_ragged.main(args)
    print("== memory (bench_memory) ==", flush=True)
    bench_memory.main(args)


if __name__ == "__main__":
    main()
