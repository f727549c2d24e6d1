"""``plan --mix`` and ``simulate --mix``: a mix of sources, as the mixed loader would read it.

A *recipe* is a JSON object: ``{"sources": [{"path": ...}, {"table": ..., "catalog_config":
{...}}], "weights": [...]}`` plus any keyword of ``create_mixed_dataloader``
(``on_exhausted``, ``source_column``, ``batch_size``, ...). A source may give
``"filters": ["label >= 3", ...]`` as the command line's ``--filter`` texts. Options
given on the command line apply to the whole mix (and are every source's defaults).

``plan --mix`` shows what every epoch of the mix takes of each source: its weight and
share, its rows per lane and epoch, where it stands when the mix's epoch starts, and the
batches per lane and rank (:meth:`~torch_dataloader_utils.runtime.recipes.MixedDataset.describe`).

``simulate --mix`` predicts each source as its own dataset on the same ranks and
workers (:func:`~torch_dataloader_utils.tools.simulate.run_simulation`), then adds up,
worker by worker, each source's time scaled by the share of its epoch the mix's epoch
takes: a worker of the mix reads all its sources side by side, one after the other in
time.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from functools import reduce
from pathlib import Path
from typing import Any

from torch_dataloader_utils.runtime.recipes import MixedDataset, create_mixed_dataloader
from torch_dataloader_utils.tools.source import Source, parse_filter

__all__ = ["load_recipe", "open_mix", "plan_mix", "simulate_mix"]


def load_recipe(text: str) -> dict[str, Any]:
    """A recipe from a JSON object or a JSON file.

    Raises:
        ValueError: not JSON, or not ``{"sources": [...], "weights": [...], ...}``.
    """
    body = text
    if not text.lstrip().startswith("{"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise ValueError(f"--mix {text!r} is neither a JSON object nor a file")
        body = path.read_text()
    try:
        recipe = json.loads(body)
    except ValueError as exc:
        raise ValueError(f"--mix is not valid JSON: {exc}") from exc
    if not isinstance(recipe, dict) or not {"sources", "weights"} <= set(recipe):
        raise ValueError(
            '--mix must be a JSON object {"sources": [{"path": ...}, ...], "weights": [...], ...}; '
            f"got {str(recipe)[:80]}"
        )
    return recipe


def _sources(recipe: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for spec in recipe["sources"]:
        spec = dict(spec) if isinstance(spec, Mapping) else spec
        if isinstance(spec, dict) and isinstance(spec.get("filters"), list):
            exprs = [parse_filter(f) if isinstance(f, str) else f for f in spec["filters"]]
            spec["filters"] = reduce(lambda a, b: a & b, exprs) if exprs else None
        out.append(spec)
    return out


def open_mix(source: Source, *, num_ranks: int = 1, rank: int = 0, num_workers: int = 0) -> MixedDataset:
    """The mixed dataset of ``source.mix`` for ``num_ranks`` x ``num_workers``."""
    recipe = dict(source.mix or {})
    options = {k: v for k, v in recipe.items() if k not in ("sources", "weights")}
    options.update(source.options)
    options.update(num_ranks=num_ranks, rank=rank, num_workers=num_workers)
    _, dataset = create_mixed_dataloader(_sources(recipe), recipe["weights"], **options)
    return dataset


def plan_mix(
    source: Source, *, num_ranks: int, num_workers: int, epoch: int, epochs: int, as_json: bool
) -> str:
    """The report of ``plan --mix``: every epoch's take of every source."""
    dataset = open_mix(source, num_ranks=num_ranks, num_workers=num_workers)
    views = [dataset.describe(e) for e in range(epoch, epoch + epochs)]
    if as_json:
        return json.dumps({"source": source.describe(), "epochs": views}, indent=1)
    first = views[0]
    lines = [
        f"plan of {source.describe()} for {num_ranks:,} ranks x {max(1, num_workers)} workers "
        f"({first['lanes']:,} lanes)",
        f"options: batch_size {first['batch_size']}, on_exhausted {first['on_exhausted']} (an epoch of the "
        f"mix ends when {first['anchor']!r} has read its epoch"
        + (")" if first["on_exhausted"] == "cycle" else ", or any source has)"),
    ]
    for view in views:
        lines += [
            "",
            f"epoch {view['epoch']}: {view['batches_per_rank']:,} batches per rank "
            f"({view['batches_per_lane']:,} per lane)",
        ]
        table = [["source", "weight", "share", "rows", "rows/lane/epoch", "starts at", "rows this epoch"]]
        for s in view["sources"]:
            start = s["start"]
            table.append(
                [
                    s["name"],
                    f"{s['weight']:g}",
                    f"{100 * s['share']:.1f}%",
                    f"{s['rows']:,}",
                    f"{s['rows_per_lane_epoch']:,}",
                    f"epoch {start['epoch']} +{start['rows_read']:,}",
                    f"{s['rows_this_epoch']:,}",
                ]
            )
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        lines += [
            "  "
            + "  ".join(
                c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
            for r in table
        ]
    return "\n".join(lines)


def simulate_mix(request: Any) -> str:
    """The report of ``simulate --mix`` (``request``: a :class:`~.simulate.SimulateRequest`)."""
    from torch_dataloader_utils.tools.simulate import run_simulation

    mix = open_mix(request.source, num_ranks=request.num_ranks, num_workers=request.num_workers)
    view = mix.describe(request.epoch)
    parts = []
    for spec, dataset, taken in zip(_sources(request.source.mix), mix.sources, view["sources"], strict=True):
        one = Source(
            path=spec.get("path"),
            format=spec.get("format", "parquet"),
            table=spec.get("table"),
            catalog_config=spec.get("catalog_config"),
            options={
                **{
                    k: v
                    for k, v in spec.items()
                    if k not in ("path", "format", "table", "catalog_config", "name")
                },
                "batch_size": mix.options.batching.batch_size,
                "shuffle": mix.options.shuffle.shuffle,
            },
        )
        _, sim = run_simulation(dataclasses.replace(request, source=one, epoch=0))
        share = taken["rows_this_epoch"] / max(1, int(dataset.fingerprint()["rows"]))
        parts.append((taken["name"], share, sim))
    workers: dict[tuple[int, int], float] = {}
    for _, share, sim in parts:
        for w in sim.workers:
            start = sim.worker_start_sec
            workers[(w.rank, w.worker)] = (
                workers.get((w.rank, w.worker), start) + (w.finish_sec - start) * share
            )
    batches = view["batches_per_rank"]
    ranks: dict[int, float] = {}
    for (rank, _), finish in workers.items():
        ranks[rank] = max(ranks.get(rank, 0.0), finish)
    epochs = {r: max(t, batches * request.step_sec) for r, t in ranks.items()}
    straggler = max(epochs, key=lambda r: epochs[r])
    if request.as_json:
        return json.dumps(
            {
                "mix": view,
                "epoch_sec": epochs[straggler],
                "straggler": straggler,
                "ranks": [{"rank": r, "epoch_sec": t} for r, t in sorted(epochs.items())],
                "sources": [
                    {"name": n, "share_of_its_epoch": s, "simulation": sim.as_dict()} for n, s, sim in parts
                ],
            },
            indent=1,
        )
    lines = [
        f"simulation of {request.source.describe()}: {request.num_ranks:,} ranks x "
        f"{max(1, request.num_workers)} workers, epoch {request.epoch} of the mix "
        f"({batches:,} batches per rank)",
        "each source simulated on its own, its time scaled by the share of its epoch the mix's epoch reads:",
    ]
    for name, share, sim in parts:
        lines.append(f"  {name}: {share:.2f} of its epoch; alone {sim.epoch_sec:.2f} s per epoch")
    lines.append(f"epoch of the mix: {epochs[straggler]:.2f} s (straggler: rank {straggler})")
    return "\n".join(lines)
