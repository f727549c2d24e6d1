"""Command line ``torch-dataloader-utils`` (or ``python -m torch_dataloader_utils``): parsing only.

Commands (their logic lives in :mod:`torch_dataloader_utils.tools`, one module each)::

    torch-dataloader-utils plan PATH --num-ranks 64 --num-workers 4 --batch-size 1024
    torch-dataloader-utils plan PATH --epochs 3 --picture plan.png
    torch-dataloader-utils inspect PATH --num-ranks 64 --num-workers 4
    torch-dataloader-utils simulate PATH --num-ranks 64 --num-workers 4 --latency-ms 30
    torch-dataloader-utils simulate PATH --num-ranks 8 --picture epoch.png
    torch-dataloader-utils reshard SRC DST --target-file-size 256MiB --workers 8
    torch-dataloader-utils cache show /local_nvme/tdu-cache [--size 200GiB] [--json]
    torch-dataloader-utils cache clear /local_nvme/tdu-cache
    torch-dataloader-utils replay LEDGER --step 41200 --rank 3 [--read --out batch.parquet]
    torch-dataloader-utils ledger LEDGER --where "id = 123"
    torch-dataloader-utils demo

A user error (a missing path, a bad option) prints one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from torch_dataloader_utils.config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_EQUAL_BATCHES,
    DEFAULT_READ_AHEAD_BYTES,
    DEFAULT_SHUFFLE_SEED,
    DEFAULT_SPLIT_BYTES,
)
from torch_dataloader_utils.errors import DataLoaderUtilsError

__all__ = ["build_parser", "main"]

PROG = "torch-dataloader-utils"
USER_ERROR = 2
"""Exit status of a user error (as argparse's own)."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``PROG CMD: error: ... (see --help)``."""

    def error(self, message: str) -> NoReturn:
        self.exit(USER_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Help(argparse.RawDescriptionHelpFormatter):
    """Help with every default shown (options left unset show the library's default in their text)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "(default" in text or not action.option_strings:
            return text
        if default is None or default is False or default is argparse.SUPPRESS:
            return text
        return f"{text} (default: {default})"


def _typed(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """An argparse ``type`` whose ``ValueError`` message is shown as is."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    convert.__name__ = name
    return convert


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{text!r} must be an integer >= 1")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"{text!r} must be an integer >= 0")
    return value


def _non_negative_number(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError(f"{text!r} must be a number >= 0")
    return value


def _positive_number(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise ValueError(f"{text!r} must be a number > 0")
    return value


def _dataset_arguments(p: argparse.ArgumentParser) -> None:
    """The options that shape a plan: the source, its reading options, the world."""
    _source_arguments(p.add_argument_group("dataset"))
    _plan_arguments(p.add_argument_group("plan options (as create_dataloader's keywords)"))
    world = p.add_argument_group("world")
    world.add_argument("--num-ranks", type=_typed(_positive, "int"), default=1, help="ranks of the job")
    world.add_argument(
        "--num-workers",
        type=_typed(_non_negative, "int"),
        default=0,
        help="DataLoader workers per rank (0: read in the main process)",
    )
    p.add_argument("--json", action="store_true", help="print JSON for machines")


def _source_arguments(src: argparse._ArgumentGroup) -> None:
    """Which data: files or an Iceberg table, and how they are read."""
    from torch_dataloader_utils.tools import source

    src.add_argument(
        "path", nargs="*", help="files: a file, directory or glob (several allowed); omit with --table"
    )
    src.add_argument(
        "--format", choices=["parquet", "orc", "csv", "jsonl"], default="parquet", help="file format"
    )
    src.add_argument(
        "--table", help="an Iceberg table instead of files: NAMESPACE.TABLE (default: none, read PATH)"
    )
    src.add_argument(
        "--catalog-config",
        type=_typed(source.parse_catalog_config, "catalog config"),
        help="Iceberg catalog properties: a JSON object or a JSON file (default: pyiceberg's configuration)",
    )
    src.add_argument("--snapshot-id", type=int, help="Iceberg: read this snapshot (default: the current one)")
    src.add_argument(
        "--mix",
        metavar="RECIPE",
        type=_typed(_load_recipe, "recipe"),
        help='a mix of sources instead of PATH: a JSON object or file {"sources": [{"path": ...}, ...], '
        '"weights": [...], ...} (see docs/recipes.md) (default: none)',
    )
    src.add_argument(
        "--storage-option",
        action="append",
        type=_typed(source.parse_storage_option, "KEY=VALUE"),
        metavar="KEY=VALUE",
        help="a filesystem option (credentials, endpoint_url, ...), repeatable; values are JSON "
        "literals or strings (default: none)",
    )
    src.add_argument("--columns", help="comma-separated columns to read (default: all)")
    src.add_argument(
        "--filter",
        action="append",
        type=_typed(source.parse_filter, "filter"),
        metavar="EXPR",
        help="a row filter 'COLUMN OP VALUE' (OP: == != < <= > >= in, 'is null'), repeatable, "
        "combined with AND (default: none)",
    )
    src.add_argument(
        "--partitioning", choices=["hive"], help="read key=value directories as columns (default: none)"
    )
    src.add_argument("--count-rows", action="store_true", help="count the rows a filter keeps (exact plans)")


def _plan_arguments(opt: argparse._ArgumentGroup) -> None:
    """How the plan is made: batches, chunks, equal batches, shuffling, read-ahead."""
    opt.add_argument(
        "--batch-size", type=_typed(_positive, "int"), help=f"rows per batch (default: {DEFAULT_BATCH_SIZE})"
    )
    opt.add_argument(
        "--split-strategy",
        choices=["row_group", "byte_range", "file"],
        help="how files are cut into chunks "
        "(default: row_group for Parquet / ORC, byte_range for CSV / JSONL)",
    )
    opt.add_argument(
        "--split-bytes",
        help=f"target chunk size, e.g. 128MiB (default: {DEFAULT_SPLIT_BYTES // 2**20}MiB)",
    )
    opt.add_argument(
        "--split-rows", type=_typed(_positive, "int"), help="target rows per chunk (default: by bytes)"
    )
    opt.add_argument(
        "--equal-batches",
        choices=["drop", "pad", "off"],
        help=f"make every rank yield the same batches (default: {DEFAULT_EQUAL_BATCHES.value})",
    )
    opt.add_argument("--drop-last", action="store_true", help="drop each worker's last short batch")
    opt.add_argument("--shuffle", action="store_true", help="shuffle the chunk order every epoch")
    opt.add_argument(
        "--seed", type=_typed(_non_negative, "int"), help=f"shuffle seed (default: {DEFAULT_SHUFFLE_SEED})"
    )
    opt.add_argument(
        "--row-shuffle-window",
        type=_typed(_positive, "int"),
        help="also mix rows across chunks (default: off)",
    )
    opt.add_argument(
        "--read-ahead", help=f"remote read-ahead bytes (default: {DEFAULT_READ_AHEAD_BYTES // 2**20}MiB)"
    )


def _source(args: argparse.Namespace) -> Any:
    """The :class:`~torch_dataloader_utils.tools.source.Source` the arguments describe."""
    from functools import reduce

    from torch_dataloader_utils.tools.source import Source

    options: dict[str, Any] = {}
    given = {
        "batch_size": args.batch_size,
        "split_strategy": args.split_strategy,
        "split_bytes": args.split_bytes,
        "split_rows": args.split_rows,
        "equal_batches": args.equal_batches,
        "shuffle_seed": args.seed,
        "row_shuffle_window": args.row_shuffle_window,
        "read_ahead_bytes": args.read_ahead,
        "partitioning": args.partitioning,
        "snapshot_id": args.snapshot_id,
    }
    options.update({k: v for k, v in given.items() if v is not None})
    for flag in ("shuffle", "drop_last", "count_rows"):
        if getattr(args, flag):
            options[flag] = True
    if args.columns:
        options["columns"] = [c.strip() for c in args.columns.split(",") if c.strip()]
    if args.filter:
        options["filters"] = reduce(lambda a, b: a & b, args.filter)
    if args.storage_option:
        options["storage_options"] = dict(args.storage_option)
    if getattr(args, "mix", None) is not None:
        if args.path or args.table is not None:
            raise argparse.ArgumentTypeError(
                "pass --mix alone: its recipe names the sources (not PATH or --table)"
            )
        return Source(mix=args.mix, options=options)
    if args.table is not None:
        if args.path:
            raise argparse.ArgumentTypeError(
                f"pass PATH or --table, not both (got {args.path} and {args.table!r})"
            )
        if args.format != "parquet" or args.partitioning:
            raise argparse.ArgumentTypeError("--format and --partitioning apply to files, not to --table")
        return Source(table=args.table, catalog_config=args.catalog_config, options=options)
    if not args.path:
        raise argparse.ArgumentTypeError("pass PATH (files) or --table NAMESPACE.TABLE (Iceberg)")
    for key in ("snapshot_id",):
        if key in options:
            raise argparse.ArgumentTypeError(f"--{key.replace('_', '-')} applies to --table only")
    path = args.path[0] if len(args.path) == 1 else list(args.path)
    return Source(path=path, format=args.format, options=options)


def _load_recipe(text: str) -> Any:
    from torch_dataloader_utils.tools.mix import load_recipe

    return load_recipe(text)


def _plan(args: argparse.Namespace) -> int:
    from torch_dataloader_utils.tools.plan import PlanRequest, run_plan

    if args.mix is not None:
        from torch_dataloader_utils.tools.mix import plan_mix

        for flag, given in (("--picture", args.picture), ("--verify", args.verify)):
            if given:
                raise argparse.ArgumentTypeError(
                    f"{flag} applies to the plan of one source, and --mix plans a mix of sources by weight: "
                    f"run plan SOURCE {flag} for each source of the recipe, or drop {flag}"
                )
        print(
            plan_mix(
                _source(args),
                num_ranks=args.num_ranks,
                num_workers=args.num_workers,
                epoch=args.epoch,
                epochs=args.epochs,
                as_json=args.json,
            )
        )
        return 0
    request = PlanRequest(
        source=_source(args),
        num_ranks=args.num_ranks,
        num_workers=args.num_workers,
        epoch=args.epoch,
        epochs=args.epochs,
        detail=args.detail,
        as_json=args.json,
        picture=Path(args.picture) if args.picture else None,
        picture_ranks=args.picture_ranks,
        verify=args.verify,
    )
    print(run_plan(request))
    return 0


def _price_arguments(parser: argparse.ArgumentParser) -> None:
    """``--price-per-1000`` and ``--list-price-per-1000``: the cost of the predicted requests."""
    parser.add_argument(
        "--price-per-1000",
        type=_typed(_non_negative_number, "number"),
        help="what 1,000 GET/HEAD requests cost (S3 Standard: 0.0004 USD); prices the predicted "
        "requests (default: counts only)",
    )
    parser.add_argument(
        "--list-price-per-1000",
        type=_typed(_non_negative_number, "number"),
        help="what 1,000 LIST/PUT requests cost (S3 Standard: 0.005 USD) (default: --price-per-1000)",
    )


def _inspect(args: argparse.Namespace) -> int:
    from torch_dataloader_utils.tools.inspect import InspectRequest, run_inspect

    if args.mix is not None:
        raise argparse.ArgumentTypeError("inspect looks at one source: pass its PATH or --table, not --mix")

    request = InspectRequest(
        source=_source(args),
        num_ranks=args.num_ranks,
        num_workers=args.num_workers,
        top=args.top,
        as_json=args.json,
        price_per_1000=args.price_per_1000,
        list_price_per_1000=args.list_price_per_1000,
    )
    print(run_inspect(request))
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from torch_dataloader_utils.config import parse_read_ahead
    from torch_dataloader_utils.tools.simulate import SimulateRequest, StorageModel, run_simulate

    bandwidth = float("inf") if args.bandwidth_mib is None else args.bandwidth_mib * 2**20
    storage = StorageModel(
        latency_sec=args.latency_ms / 1000,
        bandwidth=bandwidth,
        concurrency=args.concurrency,
        read_ahead_bytes=DEFAULT_READ_AHEAD_BYTES
        if args.read_ahead is None
        else parse_read_ahead(args.read_ahead),
        receive_rate=float("inf") if args.receive_mib is None else args.receive_mib * 2**20,
    )
    request = SimulateRequest(
        source=_source(args),
        num_ranks=args.num_ranks,
        num_workers=args.num_workers,
        epoch=args.epoch,
        storage=storage,
        decode_rate=args.decode_rate,
        cores_per_rank=args.cores_per_rank,
        worker_start_sec=args.worker_start,
        step_sec=args.step_ms / 1000,
        detail=args.detail,
        as_json=args.json,
        picture=Path(args.picture) if args.picture else None,
        picture_ranks=args.picture_ranks,
        price_per_1000=args.price_per_1000,
        list_price_per_1000=args.list_price_per_1000,
    )
    if args.mix is not None:
        from torch_dataloader_utils.tools.mix import simulate_mix

        print(simulate_mix(request))
        return 0
    print(run_simulate(request))
    return 0


def _cache(args: argparse.Namespace) -> int:
    from torch_dataloader_utils.config import parse_size
    from torch_dataloader_utils.tools.cache import run_cache

    limit = parse_size(args.size, "--size") if args.size is not None else None
    print(run_cache(args.directory, args.action, limit=limit, as_json=args.json))
    return 0


def _add_cache(sub: Any) -> None:
    cmd = sub.add_parser(
        "cache",
        help="show or clear a node-local data_cache (the byte ranges read from remote storage)",
        description=(
            "Show what a data_cache directory holds (files, ranges, bytes on disk) or clear it. "
            "Safe while jobs use it: they fetch again what was removed."
        ),
        formatter_class=_Help,
    )
    cmd.add_argument("action", choices=["show", "clear"], help="what to do")
    cmd.add_argument("directory", help="the data_cache directory of the jobs")
    cmd.add_argument(
        "--size", help="its data_cache_size, to show the share used, e.g. 200GiB (default: none)"
    )
    cmd.add_argument("--json", action="store_true", help="print JSON for machines")
    cmd.set_defaults(fn=_cache)


def _demo(args: argparse.Namespace) -> int:
    from torch_dataloader_utils.tools.demo import run_demo

    return run_demo(args)


def _demo_rank(args: argparse.Namespace) -> int:
    from torch_dataloader_utils.tools.demo import run_demo_rank

    return run_demo_rank(args)


def _json_object(text: str) -> dict[str, Any]:
    """A JSON object given on the command line (``--storage-options '{"anon": false}'``)."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f'{text!r} is not JSON ({exc}); give an object, e.g. \'{{"key": "value"}}\''
        ) from exc
    if not isinstance(value, dict):
        raise ValueError(f'{text!r} must be a JSON object, e.g. \'{{"key": "value"}}\'')
    return value


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [c.strip() for c in text.split(",") if c.strip()]


def _row_group_size(text: str) -> tuple[str | None, int | None]:
    """``--row-group-size``: bytes (``32MiB``) or rows (``100000rows``) as (bytes, rows)."""
    size = text.strip()
    if not size.lower().endswith("rows"):
        return size, None
    digits = size[: -len("rows")].strip().replace("_", "")
    if not digits.isdigit():
        raise ValueError(f"{text!r}: give bytes ('32MiB') or rows ('100000rows')")
    return None, int(digits)


def _reshard(args: argparse.Namespace) -> int:
    from functools import reduce

    from torch_dataloader_utils.tools.reshard import reshard

    row_group_bytes, row_group_rows = args.row_group_size
    report = reshard(
        args.src if len(args.src) > 1 else args.src[0],
        args.dst,
        format=args.format,
        columns=_names(args.columns),
        filters=reduce(lambda a, b: a & b, args.filter) if args.filter else None,
        storage_options=args.storage_options,
        partitioning=args.partitioning,
        catalog_config=args.catalog_config,
        snapshot_id=args.snapshot_id,
        dst_storage_options=args.dst_storage_options,
        target_file_size=args.target_file_size,
        row_group_bytes=row_group_bytes,
        row_group_rows=row_group_rows,
        compression=args.compression,
        sort_by=_names(args.sort_by),
        group_by=_names(args.group_by),
        partition_by=_names(args.partition_by),
        workers=args.workers,
        verify=args.verify,
        rank_timeout=args.rank_timeout,
    )
    print(report.describe())
    return 0


def _add_reshard(sub: Any) -> None:
    from torch_dataloader_utils.tools import source
    from torch_dataloader_utils.tools.reshard import (
        COMPRESSIONS,
        DEFAULT_COMPRESSION,
        DEFAULT_RANK_TIMEOUT,
        SOURCE_FORMATS,
    )

    cmd = sub.add_parser(
        "reshard",
        help="rewrite many small files into Parquet shards of a target size, with a manifest",
        description=(
            "Rewrite SRC (anything the loader reads) into Parquet shards of about "
            "--target-file-size under DST, with DST/_manifest.json that the loader opens "
            "without listing or footers. Restartable: run the same command again after an "
            "interruption. Under torchrun every rank writes its share."
        ),
        formatter_class=_Help,
    )
    json_object = _typed(_json_object, "JSON object")
    cmd.add_argument(
        "src", nargs="+", help="files, directories, globs or URLs; or a table with --format iceberg"
    )
    cmd.add_argument("dst", help="output directory (local or URL): new, empty, or an interrupted job's")
    cmd.add_argument("--format", default="parquet", choices=SOURCE_FORMATS, help="source format")
    cmd.add_argument("--columns", help="comma-separated columns to keep (default: all)")
    cmd.add_argument(
        "--filter",
        action="append",
        type=_typed(source.parse_filter, "filter"),
        metavar="EXPR",
        help="keep rows where 'COLUMN OP VALUE' holds, repeatable, combined with AND (default: none)",
    )
    cmd.add_argument("--partitioning", choices=["hive"], help="read key=value directories (default: none)")
    cmd.add_argument(
        "--storage-options", type=json_object, help="source filesystem options, a JSON object (default: none)"
    )
    cmd.add_argument(
        "--dst-storage-options",
        type=json_object,
        help="output filesystem options, a JSON object (default: none)",
    )
    cmd.add_argument(
        "--catalog-config",
        type=_typed(source.parse_catalog_config, "catalog config"),
        help="Iceberg catalog properties: a JSON object or a JSON file (default: pyiceberg's configuration)",
    )
    cmd.add_argument("--snapshot-id", type=int, help="Iceberg snapshot (default: the current one)")
    cmd.add_argument("--target-file-size", default="256MiB", help="bytes per shard, e.g. 256MiB")
    cmd.add_argument(
        "--row-group-size",
        type=_typed(_row_group_size, "size"),
        default="32MiB",
        help="bytes (32MiB) or rows (100000rows)",
    )
    cmd.add_argument("--compression", default=DEFAULT_COMPRESSION, choices=COMPRESSIONS, help="codec")
    cmd.add_argument("--sort-by", help="comma-separated columns to sort each shard by (default: none)")
    cmd.add_argument("--group-by", help="columns whose rows stay in one shard, contiguous (default: none)")
    cmd.add_argument("--partition-by", help="columns written as key=value directories (default: none)")
    cmd.add_argument("--workers", type=_typed(_positive, "int"), default=1, help="worker processes per rank")
    cmd.add_argument("--verify", action="store_true", help="compare row counts and column checksums")
    cmd.add_argument(
        "--rank-timeout",
        type=_typed(_non_negative_number, "number"),
        default=DEFAULT_RANK_TIMEOUT,
        help="seconds a rank waits at a barrier",
    )
    cmd.set_defaults(fn=_reshard)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command."""
    from torch_dataloader_utils import __version__
    from torch_dataloader_utils.io.prefetch import FETCH_THREADS
    from torch_dataloader_utils.tools import ledger_cli

    parser = _Parser(
        prog=PROG,
        description="See what the loader does before a run: its plan, the data, a predicted epoch.",
        formatter_class=_Help,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log the library's records (-v INFO, -vv DEBUG)"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    plan = sub.add_parser(
        "plan",
        help="which chunks every rank and worker reads: summary, detail, --json, --picture",
        description="Plan epochs exactly as the loader will, for any number of ranks and workers; show them.",
        formatter_class=_Help,
    )
    _dataset_arguments(plan)
    plan.add_argument("--epoch", type=_typed(_non_negative, "int"), default=0, help="the first epoch shown")
    plan.add_argument("--epochs", type=_typed(_positive, "int"), default=1, help="epochs shown")
    plan.add_argument(
        "--detail", type=int, default=16, help="ranks listed chunk by chunk (-1: all; 0: summary only)"
    )
    plan.add_argument(
        "--picture",
        metavar="FILE",
        help="draw the plan to FILE (.png, .svg or .pdf; needs matplotlib) (default: none)",
    )
    plan.add_argument(
        "--picture-ranks", type=_typed(_positive, "int"), default=16, help="ranks drawn at most"
    )
    plan.add_argument(
        "--verify",
        action="store_true",
        help="check that no row is planned for two ranks (calls a custom strategy for every rank)",
    )
    plan.set_defaults(fn=_plan)

    inspect = sub.add_parser(
        "inspect",
        help="files, rows, bytes, row groups, schema, compression; warnings and a split size",
        description="Describe a dataset from its metadata and recommend how to split (or reshard) it.",
        formatter_class=_Help,
    )
    _dataset_arguments(inspect)
    inspect.add_argument("--top", type=_typed(_non_negative, "int"), default=5, help="largest files listed")
    _price_arguments(inspect)
    inspect.set_defaults(fn=_inspect)

    sim = sub.add_parser(
        "simulate",
        help="predict time to first batch, epoch time per rank and the straggler",
        description=(
            "Predict an epoch from the plan, a storage model (latency, bandwidth, concurrency) and a decode "
            "rate (measured on one chunk of the plan unless --decode-rate is given)."
        ),
        formatter_class=_Help,
    )
    _dataset_arguments(sim)
    sim.add_argument("--epoch", type=_typed(_non_negative, "int"), default=0, help="the epoch simulated")
    sim.add_argument(
        "--latency-ms",
        type=_typed(_non_negative_number, "number"),
        default=0.0,
        help="milliseconds per request",
    )
    sim.add_argument(
        "--bandwidth-mib",
        type=_typed(_positive_number, "number"),
        help="MiB/s of one request (default: unlimited)",
    )
    sim.add_argument(
        "--receive-mib",
        type=_typed(_positive_number, "number"),
        help="MiB/s one core can receive (copies, TLS): fetching takes CPU from decoding (default: free)",
    )
    sim.add_argument(
        "--concurrency",
        type=_typed(_positive, "int"),
        default=FETCH_THREADS,
        help="requests in flight per worker",
    )
    sim.add_argument(
        "--decode-rate",
        type=_typed(_positive_number, "number"),
        help="rows/s of one reading process (default: measured on one chunk)",
    )
    sim.add_argument(
        "--cores-per-rank",
        type=_typed(_positive_number, "number"),
        default=1.0,
        help="cores each rank's processes share",
    )
    sim.add_argument(
        "--worker-start",
        type=_typed(_non_negative_number, "number"),
        help="seconds to start the DataLoader workers (default: measured here)",
    )
    sim.add_argument(
        "--step-ms",
        type=_typed(_non_negative_number, "number"),
        default=0.0,
        help="the training step per batch, ms",
    )
    sim.add_argument("--detail", type=int, default=16, help="ranks listed (-1: all)")
    sim.add_argument(
        "--picture",
        metavar="FILE",
        help="draw the predicted epoch, a timeline per rank and worker, to FILE (.png, .svg or .pdf; "
        "needs matplotlib) (default: none)",
    )
    sim.add_argument("--picture-ranks", type=_typed(_positive, "int"), default=16, help="ranks drawn at most")
    _price_arguments(sim)
    sim.set_defaults(fn=_simulate)

    _add_reshard(sub)
    _add_cache(sub)
    ledger_cli.add_commands(sub, _Help, _typed, _typed(_non_negative, "int"))

    demo = sub.add_parser(
        "demo", help="generate a local dataset and read it as ranks x workers", formatter_class=_Help
    )
    demo.add_argument("--data-dir", default="demo_data", help="where the demo dataset is written")
    demo.add_argument("--num-ranks", type=int, default=2, help="ranks (torchrun processes)")
    demo.add_argument("--num-workers", type=int, default=2, help="DataLoader workers per rank")
    demo.add_argument("--batch-size", type=int, default=1000, help="rows per batch")
    demo.add_argument("--epochs", type=int, default=2, help="epochs read")
    demo.add_argument("--timeout", type=float, default=300, help="seconds before the demo gives up")
    demo.set_defaults(fn=_demo)
    rank = sub.add_parser(
        "demo-rank", help="one rank of the demo (started by torchrun)", formatter_class=_Help
    )
    rank.add_argument("--data-dir", required=True, help="the demo dataset")
    rank.add_argument("--num-workers", type=int, default=2, help="DataLoader workers")
    rank.add_argument("--batch-size", type=int, default=1000, help="rows per batch")
    rank.add_argument("--epochs", type=int, default=2, help="epochs read")
    rank.set_defaults(fn=_demo_rank)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``torch-dataloader-utils`` and ``python -m torch_dataloader_utils``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("plan", "inspect", "simulate", "replay", "ledger"):
        from torch_dataloader_utils.tools.source import quiet_library_logs

        quiet_library_logs(args.verbose)
    try:
        with warnings.catch_warnings():
            # The library's warnings (a layout that mixes badly, ...) as one line each.
            warnings.showwarning = _warning_line(f"{PROG} {args.command}")
            return int(args.fn(args))
    except argparse.ArgumentTypeError as exc:
        return _fail(f"{PROG} {args.command}", str(exc))
    except (DataLoaderUtilsError, OSError) as exc:
        return _fail(f"{PROG} {args.command}", f"{type(exc).__name__}: {exc}")


def _warning_line(prog: str) -> Callable[..., None]:
    def show(message: Warning | str, *args: Any, **kwargs: Any) -> None:
        print(f"{prog}: warning: {' '.join(str(message).split())}", file=sys.stderr)

    return show


def _fail(prog: str, message: str) -> int:
    first = " ".join(message.split())
    print(f"{prog}: error: {first}", file=sys.stderr)
    return USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
