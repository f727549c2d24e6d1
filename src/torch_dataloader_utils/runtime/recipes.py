"""Training-data recipes: several sources mixed by weight, exactly once per source epoch.

:func:`create_mixed_dataloader` reads several sources (directories of files, Iceberg
tables) as one dataset. Every batch takes rows of each source in proportion to its
weight, within one row (:mod:`~torch_dataloader_utils.plan.blend`), and every source is
read without replacement: each of its rows once per *its own* epoch.

:class:`MixedDataset` is the engine (:class:`~torch_dataloader_utils.runtime.dataset.OrderedDataset`)
driving a :class:`~torch_dataloader_utils.runtime.orders.mixed.MixedOrder`: the order plans
and reads the mix (lanes, the blend, positions that carry over from epoch to epoch,
resume); the engine converts, hands over, records and counts as for one source. Each
source is discovered as it would be alone (a ``StructuredDataset`` or ``IcebergDataset``
that plans nothing of its own).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias, Unpack

import pyarrow as pa

from torch_dataloader_utils.config import FileFormat, MixConfig, OnExhausted
from torch_dataloader_utils.errors import ConfigError, IncompatibleOptionsError, SchemaMismatchError
from torch_dataloader_utils.plan.blend import Blend, PassPlan
from torch_dataloader_utils.plan.schedule import MixSchedule
from torch_dataloader_utils.runtime.dataset import OrderedDataset, PlannedDataset
from torch_dataloader_utils.runtime.files import StructuredDataset, source_paths
from torch_dataloader_utils.runtime.iceberg import IcebergDataset
from torch_dataloader_utils.runtime.loader import ResumableDataLoader, build_loader
from torch_dataloader_utils.runtime.options import (
    MIX_ONLY,
    FileReadOptions,
    IcebergReadOptions,
    MixedLoaderOptions,
    Options,
    build_options,
    file_source,
    iceberg_source,
)
from torch_dataloader_utils.runtime.orders.mixed import MixedOrder

__all__ = ["MixWeights", "MixedDataLoader", "MixedDataset", "create_mixed_dataloader"]


class MixedDataset(OrderedDataset):
    """Several sources read as one, mixed by weight; see :func:`create_mixed_dataloader`.

    Args:
        sources: The sources, discovered (each a :class:`PlannedDataset` built as a member
            of a mix, with the mix's shuffle, batch size, equal batches and world).
        names: A name per source (metrics, errors).
        mix: The weights, ``on_exhausted`` and ``source_column``.
        options: The mix's options (batching, shuffle, output, loader, world).

    Raises:
        ConfigError: a weight is invalid, or a source has no rows.
        IncompatibleOptionsError: a source's row counts are not exact, equal batches are
            off where lanes must be equal, or a source has fewer rows than lanes.
        SchemaMismatchError: the sources' columns differ.
    """

    _order: MixedOrder

    def __init__(
        self, sources: Sequence[PlannedDataset], names: Sequence[str], mix: MixConfig, options: Options
    ) -> None:
        super().__init__()
        if mix.num_sources not in (None, len(sources)):
            shown = list(mix.weights) if isinstance(mix.weights, tuple) else mix.schedule.describe()
            raise ConfigError(
                f"weights={shown!r} has {mix.num_sources} weight(s) for {len(sources)} "
                "source(s); give one weight per source"
            )
        if options.canonical is not None:
            raise IncompatibleOptionsError(
                f"canonical_ranks={options.canonical} (elastic order) with create_mixed_dataloader: a mix's "
                "batches are built per lane (every rank's reading processes), not per canonical stream, so "
                "its global batches would change with the number of ranks. Drop canonical_ranks, or mix "
                "the sources into one dataset first (e.g. `torch-dataloader-utils reshard`) and read it "
                "with create_dataloader(..., canonical_ranks=...)"
            )
        self._members = tuple(sources)
        self._names = tuple(names)
        self._mix = mix
        schema = self._aligned_schema(sources)
        self._init_engine(
            MixedOrder([d.source for d in sources], names, mix, options), options, schema, names
        )

    def _aligned_schema(self, sources: Sequence[PlannedDataset]) -> pa.Schema:
        first = sources[0].schema
        for name, source in zip(self._names[1:], sources[1:], strict=True):
            schema = source.schema
            if set(schema.names) != set(first.names):
                raise SchemaMismatchError(
                    f"source {name!r} has columns {sorted(schema.names)}, source {self._names[0]!r} "
                    f"{sorted(first.names)}: a mix's sources must give the same columns. Pass "
                    "columns=[...] (to create_mixed_dataloader or in each source) to read the columns "
                    "they share"
                )
            for field in first:
                other = schema.field(field.name).type
                if other != field.type:
                    raise SchemaMismatchError(
                        f"column {field.name!r} is {other} in source {name!r} and {field.type} in source "
                        f"{self._names[0]!r}; cast it when writing the data, or leave it out of columns"
                    )
        column = self._mix.source_column
        if column is None:
            return first
        if column in first.names:
            raise IncompatibleOptionsError(
                f"source_column={column!r} is also a column of the data; pick another name"
            )
        return first.append(pa.field(column, pa.int32(), nullable=False))

    @property
    def order(self) -> MixedOrder:
        """The mixed order this dataset reads (:mod:`~torch_dataloader_utils.runtime.orders.mixed`)."""
        return self._order

    @property
    def mix(self) -> MixConfig:
        """The weights, ``on_exhausted`` and ``source_column``."""
        return self._mix

    @property
    def source_names(self) -> tuple[str, ...]:
        """The sources' names, in order."""
        return self._names

    @property
    def sources(self) -> tuple[PlannedDataset, ...]:
        """The sources' datasets, in order (discovered only: the mix plans and reads them)."""
        return self._members

    @property
    def num_lanes(self) -> int:
        """Lanes: ranks x reading processes per rank."""
        return self._order.num_lanes

    @property
    def anchor(self) -> int:
        """The source whose epoch ends the current epoch of the mix (``cycle``: longest, ``stop``: shortest).

        Chosen by the weights in force when the epoch starts.
        """
        return self._order.start_of(self.epoch).anchor

    @property
    def blend(self) -> Blend:
        """The row-level cycle of the weights the current epoch starts with."""
        return self.pass_plan().blend

    @property
    def schedule(self) -> MixSchedule:
        """The weights, as a schedule (fixed weights: one stage)."""
        return self._mix.schedule

    @property
    def origin_token(self) -> int:
        """Which loaded state the epochs are counted from (0: the start of training)."""
        return self._order.token

    def pass_plan(self, epoch: int | None = None) -> PassPlan:
        """The batches of every lane in ``epoch`` (default: the current one) of the mix."""
        return self._order.pass_plan(self.epoch if epoch is None else epoch)

    def describe(self, epoch: int | None = None) -> dict[str, Any]:
        """The mix's plan of ``epoch`` as plain values (``plan --json``)."""
        return self._order.describe(self.epoch if epoch is None else epoch)


MixedDataLoader: TypeAlias = ResumableDataLoader[MixedDataset]
"""The loader :func:`create_mixed_dataloader` returns: ``ResumableDataLoader[MixedDataset]``.

Kept as a name for code written against 0.7.0, where it was a class of its own that only
retyped ``dataset``; ``loader.metrics().rows_by_source`` counts the rows received per source.
"""


_FILE_KEYS = {"path", "format", "files"}
_ICEBERG_KEYS = {"table"}


def _source_name(spec: Mapping[str, Any], index: int) -> str | None:
    """A source's ``name``, or ``None`` when it gave none (named from its path or table later)."""
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigError(f"sources[{index}] name={name!r} must be a non-empty str")
    return name


def _default_name(spec: Mapping[str, Any], index: int, depth: int = 1) -> str:
    """A source's name from its table, or the last ``depth`` parts of its path."""
    if "table" in spec:
        return str(spec["table"])
    path = spec.get("path")
    if isinstance(path, (str, os.PathLike)):
        parts = pathlib.PurePosixPath(os.fspath(path).rstrip("/")).parts
        return "/".join(parts[-depth:]) or os.fspath(path)
    return f"source{index}"


def _names(specs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every source's name: its own, or the shortest end of its path that no other source shares.

    Raises:
        ConfigError: two sources are given the same ``name``.
    """
    given = [_source_name(spec, i) for i, spec in enumerate(specs)]
    named = [n for n in given if n is not None]
    for n in set(named):
        if named.count(n) > 1:
            where = [i for i, g in enumerate(given) if g == n]
            raise ConfigError(
                f"sources {where} are all named {n!r}: metrics and errors name sources by name; give each a "
                "name of its own"
            )
    out = [
        g if g is not None else _default_name(spec, i)
        for i, (g, spec) in enumerate(zip(given, specs, strict=True))
    ]
    depth = 1
    while len(set(out)) < len(out) and depth < 16:  # data/v1/train, data/v2/train: v1/train, v2/train
        depth += 1
        clash = {n for n in out if out.count(n) > 1}
        out = [
            _default_name(spec, i, depth) if g is None and n in clash else n
            for i, (g, n, spec) in enumerate(zip(given, out, specs, strict=True))
        ]
    if len(set(out)) < len(out):
        out = [n if out.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(out)]
    return out


def _build_source(
    spec: Mapping[str, Any], index: int, name: str, shared: Mapping[str, Any], options: Options
) -> PlannedDataset:
    """One source of a mix, discovered (``shared``: the mix's keywords each source inherits)."""
    given = {k: v for k, v in spec.items() if k != "name"}
    inside = sorted(set(given) & MIX_ONLY)
    if inside:
        raise IncompatibleOptionsError(
            f"sources[{index}] ({name!r}) sets {inside}: these are options of the whole mix (every "
            "batch holds rows of every source); pass them to create_mixed_dataloader instead"
        )
    is_table = "table" in given
    if is_table and set(given) & _FILE_KEYS:
        raise ConfigError(
            f"sources[{index}] ({name!r}) gives both table= and path=; a source is one or the other"
        )
    if not is_table and "path" not in given and "files" not in given:
        raise ConfigError(
            f"sources[{index}]={dict(spec)!r} names no data: give 'path' (files) or 'table' (Iceberg)"
        )
    allowed = IcebergReadOptions if is_table else FileReadOptions
    keys = allowed.__required_keys__ | allowed.__optional_keys__
    values: dict[str, Any] = {**{k: v for k, v in shared.items() if k in keys}, **given}
    values.setdefault("count_rows", True)  # a mix needs exact counts on every lane
    mix_keys = {
        "batch_size": options.batching.batch_size,
        "drop_last": options.batching.drop_last,
        "equal_batches": options.batching.equal_batches,
        "shuffle": options.shuffle.shuffle,
        "shuffle_seed": options.shuffle.shuffle_seed,
        "num_ranks": options.world.num_ranks,
        "rank": options.world.rank,
        "num_workers": 0,
        "output_format": "arrow",
    }
    if is_table:
        table = values.pop("table")
        source = iceberg_source(table, values)
        built = build_options(
            {**values, **mix_keys}, IcebergReadOptions, "create_mixed_dataloader", FileFormat.PARQUET
        )
        return IcebergDataset.from_config(source, built, member=True)
    path, files = values.pop("path", None), values.pop("files", None)
    file_format = values.pop("format", "parquet")
    source_cfg = file_source(file_format, values)
    built = build_options(
        {**values, **mix_keys}, FileReadOptions, "create_mixed_dataloader", source_cfg.format
    )
    return StructuredDataset.from_config(source_paths(path, files), source_cfg, built, member=True)


MixWeights: TypeAlias = (
    Sequence[float] | MixSchedule | Sequence[tuple[int, Sequence[float]]] | Callable[[int], Sequence[float]]
)
"""What ``weights=`` of :func:`create_mixed_dataloader` takes: numbers, or a schedule of them."""


def _check_sources(sources: object) -> None:
    """``sources=`` is a non-empty list of mappings (a path, or a list of paths, is told how to write it).

    Raises:
        ConfigError: it is not (names the parameter, echoes the value, shows the fix).
    """
    if isinstance(sources, (str, bytes, os.PathLike)):
        path = os.fsdecode(sources) if isinstance(sources, (bytes, os.PathLike)) else sources
        raise ConfigError(
            f"sources={sources!r} is one path, not a list of sources: write sources=[{{'path': {path!r}}}] "
            "(a mapping per source: [{'path': 'data/web/'}, {'path': 'data/books/'}])"
        )
    if isinstance(sources, Mapping) or not isinstance(sources, Sequence) or not sources:
        raise ConfigError(
            f"sources={sources!r} must be a non-empty list of source mappings, e.g. "
            "[{'path': 'data/web/'}, {'path': 'data/books/'}]"
        )
    for i, spec in enumerate(sources):
        if isinstance(spec, (str, bytes, os.PathLike)):
            path = os.fsdecode(spec) if isinstance(spec, (bytes, os.PathLike)) else spec
            raise ConfigError(
                f"sources[{i}]={spec!r} is a path; each source is a mapping of its options: write "
                f"{{'path': {path!r}}} (or {{'table': 'db.books', 'catalog_config': {{...}}}})"
            )
        if not isinstance(spec, Mapping):
            raise ConfigError(
                f"sources[{i}]={spec!r} must be a mapping of source options, e.g. "
                "{'path': 'data/web/', 'format': 'parquet'} or {'table': 'db.books', 'catalog_config': {...}}"
            )


def create_mixed_dataloader(
    sources: Sequence[Mapping[str, Any]],
    weights: MixWeights,
    **options: Unpack[MixedLoaderOptions],
) -> tuple[ResumableDataLoader[MixedDataset], MixedDataset]:
    """Several sources read as one, every batch mixing them by weight, exactly once per source epoch.

    Args:
        sources: One mapping per source: the options ``StructuredDataset`` takes
            (``path``, ``format``, ``columns``, ``filters``, ``storage_options``,
            ``partitioning``, ``split_bytes``, ...) or ``IcebergDataset`` takes
            (``table``, ``catalog_config``, ``snapshot_id``, ...), and optionally a
            ``name`` (metrics, errors; default: the directory or table name).
        weights: One weight > 0 per source: each batch holds ``weight / sum(weights)``
            of its rows from the source, within one row. Or a schedule: a list of
            ``(step, weights)`` stages from step 0 (a rank's batches since the start of
            training), a :class:`~torch_dataloader_utils.MixSchedule` (by step or by rows),
            or a pure function of the step giving the weights
            (``docs/recipes.md``, "Schedules").
        **options: The mix's options, shared by every source: batching, shuffling,
            output, ranks, workers (:class:`~torch_dataloader_utils.runtime.options.MixedLoaderOptions`);
            ``on_exhausted`` (``"cycle"``, default, or ``"stop"``), ``source_column``
            and ``allow_recipe_change``. A read option given here (``columns``, ``split_bytes``,
            ``storage_options``, ...) is the default of every source.

    Returns:
        ``(loader, dataset)``. Call ``dataset.set_epoch(epoch)`` before each epoch;
        ``loader.state_dict()`` / ``load_state_dict()`` resume mid-epoch on any number
        of ranks and workers; ``loader.metrics().rows_by_source`` counts the rows
        received per source (``docs/recipes.md``).

    Raises:
        ConfigError: a source, weight or stage is invalid (named).
        SchemaMismatchError: the sources' columns differ (read the shared ones with ``columns``).
        IncompatibleOptionsError: an option of the whole mix set in a source, or a layout
            the mix cannot read (unknown row counts, ``equal_batches='off'`` with lanes).
    """
    given: dict[str, Any] = dict(options)
    _check_sources(sources)
    mix = MixConfig(
        weights=weights,  # type: ignore[arg-type]  # checked and made a tuple or a schedule there
        on_exhausted=given.pop("on_exhausted", OnExhausted.CYCLE),
        source_column=given.pop("source_column", None),
        allow_recipe_change=given.pop("allow_recipe_change", False),
    )
    built = build_options(given, MixedLoaderOptions, "create_mixed_dataloader", FileFormat.PARQUET)
    shared = {k: v for k, v in given.items() if k not in MIX_ONLY}
    names = _names(sources)
    found = [_build_source(spec, i, names[i], shared, built) for i, spec in enumerate(sources)]
    dataset = MixedDataset(found, names, mix, built)
    return build_loader(dataset, dataset.num_workers, built.loader), dataset
