"""Before / after: a benchmark of this checkout against the same benchmark at another revision.

Both versions run in the same session, alternating round by round (base, head, base,
head, ...), each run measuring its own raw-pyarrow loop, so the ratios compare like with
like even when the machine's speed drifts. Reported per configuration: the median over
rounds of each version's ratio against its raw loop, and the change.

Run: ``python benchmarks/bench_compare.py --base REV [--rounds 3] -- [bench_parquet options]``
(``--bench bench_text.py`` for another benchmark that writes ``ratio_vs_raw``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402


def _run(
    checkout: Path, bench: str, out_dir: Path, data_dir: Path, extra: Sequence[str]
) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": f"{checkout / 'src'}{os.pathsep}{checkout}"}
    cmd = [sys.executable, str(checkout / "benchmarks" / bench), "--out-dir", str(out_dir)]
    cmd += ["--data-dir", str(data_dir), *extra]
    subprocess.run(cmd, check=True, env=env, cwd=checkout, stdout=subprocess.DEVNULL)
    [result] = [p for p in out_dir.glob("*.json")]
    return list(json.loads(result.read_text())["results"])


def _key(entry: dict[str, Any]) -> tuple[Any, ...]:
    return (entry["name"], *sorted(entry["params"].items()))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="git revision to compare against (e.g. a commit)")
    p.add_argument("--rounds", type=int, default=3, help="alternating runs of each version")
    p.add_argument("--bench", default="bench_parquet.py", help="benchmark script under benchmarks/")
    p.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA)
    p.add_argument("--out", type=Path, default=common.DEFAULT_RESULTS / "bench_compare.md")
    p.add_argument("extra", nargs="*", help="options passed to the benchmark (after --)")
    args = p.parse_args(argv)
    ratios: dict[str, dict[tuple[Any, ...], list[float]]] = {"base": {}, "head": {}}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base], check=True
        )
        try:
            for round_ in range(args.rounds):
                for name, checkout in (("base", base), ("head", ROOT)):
                    out = Path(tmp) / f"{name}-{round_}"
                    for entry in _run(checkout, args.bench, out, args.data_dir, args.extra):
                        if entry["name"] != "raw":
                            ratios[name].setdefault(_key(entry), []).append(entry["ratio_vs_raw"])
                    print(f"round {round_ + 1}/{args.rounds}: {name} done", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=True)
    rows = []
    for key, base_ratios in ratios["base"].items():
        head_ratios = ratios["head"].get(key, [])
        if not head_ratios:
            continue
        b, h = statistics.median(base_ratios), statistics.median(head_ratios)
        params = ", ".join(f"{k}={v}" for k, v in key[1:])
        rows.append([params, f"{b:.3f}x", f"{h:.3f}x", f"{(h / b - 1) * 100:+.1f}%"])
    info = common.machine()
    md = (
        f"`{args.bench}` at `{args.base}` (base) and at this checkout (head), {args.rounds} alternating "
        f"rounds, options `{' '.join(args.extra)}`; median over rounds of each run's ratio against "
        f"its own raw loop. Machine: {info['cpus']} CPUs, load average {info['loadavg_at_start']}.\n\n"
        + common.table(["configuration", "base vs raw", "head vs raw", "change"], rows)
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(md)
    print(md)


if __name__ == "__main__":
    main()
