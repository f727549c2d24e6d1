"""``plan --mix`` and ``simulate --mix``: a mix of sources, as the mixed loader would read it.

A *recipe* is a JSON object: ``{"sources": [{"path": ...}, {"table": ..., "catalog_config":
{...}}], "weights": [...]}`` plus any keyword of ``create_mixed_dataloader``
(``on_exhausted``, ``source_column``, ``batch_size``, ...). ``"weights"`` may be a
schedule: a list of ``[step, [weights]]`` stages, or ``{"unit": "rows", "stages": [...]}``. A source may give
``"filters": ["label >= 3", ...]`` as the command line's ``--filter`` texts (one text
alone is a list of one). :func:`load_recipe` checks the shape and parses the filters,
naming what is wrong by its place (``sources[1].filters[0]``). Options given on the
command line apply to the whole mix (and are every source's defaults).

``plan --mix`` shows what every epoch of the mix takes of each source: its weight and
share, its rows per lane and epoch, where it stands when the mix's epoch starts, and the
batches per lane and rank (:meth:`~torch_dataloader_utils.runtime.recipes.MixedDataset.describe`);
with a schedule, the stages the epoch meets and the step each starts at; and a note when
the epoch's last batch, filled up from the other sources once the anchor has run out,
takes much of a source's rows (sources of few rows per lane for the batch size).

``simulate --mix`` predicts each source as its own dataset on the same ranks and
workers (:func:`~torch_dataloader_utils.tools.simulate.run_simulation`), then adds up,
worker by worker, each source's time scaled by the share of its epoch the mix's epoch
takes: a worker of the mix reads all its sources side by side, one after the other in
time. ``--picture`` draws that epoch (:class:`MixWorker` lanes); ``plan --mix`` has no
picture (a plan picture draws one source's chunks).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from functools import reduce
from pathlib import Path
from typing import Any

from torch_dataloader_utils.errors import ConfigError
from torch_dataloader_utils.plan.schedule import MixSchedule
from torch_dataloader_utils.runtime.recipes import MixedDataset, create_mixed_dataloader
from torch_dataloader_utils.tools.source import Source, parse_filter

__all__ = ["MixWorker", "load_recipe", "open_mix", "plan_mix", "simulate_mix"]


_SOURCE_EXAMPLE = '{"path": "data/web/"} or {"table": "db.books", "catalog_config": {...}}'


def load_recipe(text: str) -> dict[str, Any]:
    """A recipe from a JSON object or a JSON file, its shape checked and its filters parsed.

    A source's ``"filters"`` is a list of ``--filter`` texts (a single text is taken as
    one); each is parsed here, so a malformed one is named with its place in the recipe.

    Raises:
        ValueError: not JSON, or not ``{"sources": [...], "weights": [...], ...}``; the
            message names the key, echoes the value and shows the fix.
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
    sources = recipe["sources"]
    if isinstance(sources, str):
        raise ValueError(
            f'--mix: "sources" is the string {sources!r}, not a list of sources; write '
            f'"sources": [{{"path": {json.dumps(sources)}}}] (one object per source)'
        )
    if not isinstance(sources, list) or not sources:
        raise ValueError(
            f'--mix: "sources" is {json.dumps(sources)[:80]}; it must be a non-empty list of sources, '
            f"each an object such as {_SOURCE_EXAMPLE}"
        )
    recipe["sources"] = [_checked_source(spec, i) for i, spec in enumerate(sources)]
    recipe["weights"] = _checked_weights(recipe["weights"])
    return recipe


def _checked_weights(weights: object) -> Any:
    """A recipe's ``"weights"``: a list (numbers, or ``[step, [weights]]`` stages) or a schedule object.

    Raises:
        ValueError: a schedule object of another shape (names the fix).
    """
    if not isinstance(weights, dict):
        return weights
    if set(weights) - {"unit", "stages"} or not isinstance(weights.get("stages"), list):
        raise ValueError(
            f'--mix: "weights" is {json.dumps(weights)[:80]}; a schedule is {{"unit": "step" or "rows", '
            '"stages": [[0, [0.6, 0.4]], [50000, [0.4, 0.6]]]}, or a list of stages (by step)'
        )
    try:
        return MixSchedule(weights["stages"], unit=weights.get("unit", "step"))
    except ConfigError as exc:
        raise ValueError(f'--mix: "weights": {exc}') from None


def _checked_source(spec: object, index: int) -> dict[str, Any]:
    """Source ``index`` of a recipe, its ``"filters"`` a list of texts that parse."""
    where = f"--mix: sources[{index}]"
    if isinstance(spec, str):
        example = json.dumps({"path": spec})
        raise ValueError(f"{where} is the string {spec!r}; each source is an object, e.g. {example}")
    if not isinstance(spec, dict):
        shown = json.dumps(spec)[:80]
        raise ValueError(f"{where} is {shown}; each source is an object such as {_SOURCE_EXAMPLE}")
    filters = spec.get("filters")
    if filters is None:
        return spec
    texts = [filters] if isinstance(filters, str) else filters
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ValueError(
            f'{where}.filters is {json.dumps(filters)[:80]}; give --filter texts, e.g. "filters": '
            '["label >= 3", "lang == \\"en\\""] (all must hold)'
        )
    for j, text in enumerate(texts):
        try:
            parse_filter(text)
        except ValueError as exc:
            raise ValueError(f"{where}.filters[{j}]: {exc}") from None
    return {**spec, "filters": texts}


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
    weights = recipe["weights"]
    if isinstance(weights, dict):
        weights = _checked_weights(weights)
    options.update(source.options)
    options.update(num_ranks=num_ranks, rank=rank, num_workers=num_workers)
    _, dataset = create_mixed_dataloader(_sources(recipe), weights, **options)
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
        f"mix ends when its anchor has read its epoch: {first['anchor']!r} in epoch {first['epoch']})",
    ]
    for view in views:
        lines += [
            "",
            f"epoch {view['epoch']}: {view['batches_per_rank']:,} batches per rank "
            f"({view['batches_per_lane']:,} per lane), from step {view['step']:,}",
        ]
        if len(view["stages"]) > 1 or view["stages"][0]["stage"]:
            lines += [
                f"  stage {st['stage']} from step {st['first_step']:,}: weights {st['weights']}"
                for st in view["stages"]
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
        lines += _fill_note(view)
    return "\n".join(lines)


def _fill_note(view: Mapping[str, Any]) -> list[str]:
    """Why a source takes more rows than its weight gives: the epoch's last batch is filled up.

    When the anchor runs out, each lane's last batch takes what it has left and fills the
    rest from the other sources by weight, so the batch stays full (documented ``cycle``
    and ``stop`` behaviour). With sources of few rows per lane for the batch size, that
    fill is much of the epoch (two sources of 100 rows, batches of 1,024: one batch, 100
    rows of the anchor and 924 of the other, 9.24 of its epochs).
    """
    anchor = view["anchor"]
    lanes = view["lanes"]
    filled = [
        s
        for s in view["sources"]
        if s["name"] != anchor and s["last_batch_fill"] * 10 > max(1, s["rows_this_epoch"] // lanes)
    ]
    if not filled:
        return []
    head = next(s for s in view["sources"] if s["name"] == anchor)
    batch = view["batch_size"]
    each = ", ".join(
        f"{s['name']!r} takes {s['last_batch_rows']:,} rows there, {s['last_batch_fill']:,} more than a "
        f"batch at the weights holds, and reads {s['epochs_this_epoch']:.2f} of its epochs this epoch "
        "(each row once per its epoch)"
        for s in filled
    )
    # At most this batch size, the anchor's epoch is 10 or more batches per lane.
    fits = max(1, int(head["rows_per_lane_epoch"] / head["share"] / 10))
    return [
        f"  note: {anchor!r}, whose epoch ends the mix's, has {head['rows_per_lane_epoch']:,} rows per lane "
        f"and its share of a batch is {round(head['share'] * batch):,} rows: every "
        f"lane's last batch takes the {head['last_batch_rows']:,} rows it has left and fills the rest of its "
        f"{batch:,} rows from the other sources, by weight, so that batches stay full: {each}. With "
        f"batch_size <= {fits:,} the epoch has 10 or more batches and its last one is a small part of it "
        '(docs/recipes.md, "The last batch of an epoch")'
    ]


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
    note = ""
    if request.picture is not None:
        note = _draw_mix(request, [sim for _, _, sim in parts], workers, epochs)
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
    return "\n".join(lines) + note


@dataclasses.dataclass(frozen=True)
class MixWorker:
    """One worker of a mix's predicted epoch, as :func:`~.picture.draw_timeline` draws it.

    Attributes:
        rank: The rank.
        worker: The worker.
        first_batch_sec: When its first batch can be mixed: every source has one.
        finish_sec: When it has read its share of every source.
    """

    rank: int
    worker: int
    first_batch_sec: float
    finish_sec: float


def _draw_mix(
    request: Any, sims: list[Any], finishes: Mapping[tuple[int, int], float], epochs: Mapping[int, float]
) -> str:
    """Draw the mix's predicted epoch to ``request.picture``; the report's line about it."""
    from torch_dataloader_utils.tools.picture import draw_timeline

    first: dict[tuple[int, int], float] = {}
    for sim in sims:
        for w in sim.workers:
            first[(w.rank, w.worker)] = max(first.get((w.rank, w.worker), 0.0), w.first_batch_sec)
    lanes = [MixWorker(r, w, min(first.get((r, w), 0.0), t), t) for (r, w), t in sorted(finishes.items())]
    drawn = draw_timeline(
        lanes,
        sorted(epochs.items()),
        request.picture,
        max_ranks=request.picture_ranks,
        title=request.source.describe(),
    )
    return f"\npicture: {request.picture} ({len({(b.rank, b.worker) for b in drawn}):,} workers drawn)"
