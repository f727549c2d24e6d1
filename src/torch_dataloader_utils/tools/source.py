"""The dataset a command looks at: a path or an Iceberg table, with the options that shape a plan.

The command line turns its arguments into a :class:`Source` (values only, parsed by
the helpers here: ``--filter``, ``--storage-option``, ``--catalog-config``) and the
commands build the library's own dataset from it with :func:`open_dataset`, so a plan
shown by ``plan`` is exactly the plan the loader would read.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.errors import ConfigError
from torch_dataloader_utils.plan.state import MAX_RANKS, MAX_WORKER_SLOTS
from torch_dataloader_utils.runtime.dataset import PlannedDataset
from torch_dataloader_utils.runtime.files import StructuredDataset
from torch_dataloader_utils.runtime.iceberg import IcebergDataset

__all__ = [
    "Source",
    "parse_catalog_config",
    "parse_filter",
    "parse_storage_option",
    "open_dataset",
    "quiet_library_logs",
]

_FILTER = re.compile(
    r"^\s*(?P<column>[A-Za-z_][\w.]*)\s*"
    r"(?P<op>==|!=|<=|>=|<|>|=| in | not in | is null| is not null)\s*(?P<value>.*?)\s*$",
    re.IGNORECASE,
)


def _literal(text: str) -> Any:
    """A JSON literal (number, true/false, null, "quoted string"), else the text as a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text.strip("'")


def parse_filter(text: str) -> pc.Expression:
    """``COLUMN OP VALUE`` as a pyarrow expression: ``label >= 3``, ``split == "train"``.

    ``OP`` is one of ``== != < <= > >= in`` (``in`` takes comma-separated values) or
    ``is null`` / ``is not null``. Values are JSON literals (numbers, ``true``,
    ``"text"``); bare words are strings.

    Raises:
        ValueError: the text is not such a comparison (says what is allowed).
    """
    m = _FILTER.match(text)
    if m is None:
        raise ValueError(
            f"--filter {text!r} is not 'COLUMN OP VALUE' with OP one of == != < <= > >= in, "
            "'is null' or 'is not null', e.g. --filter 'label >= 3'"
        )
    column, op, raw = m["column"], m["op"].strip().lower(), m["value"]
    if raw[:1] in ("=", "<", ">", "!"):
        raise ValueError(
            f"--filter {text!r}: {m['op'].strip()!r} is followed by {raw!r}, which starts with an operator; "
            "write COLUMN OP VALUE with one OP of == != < <= > >= in, e.g. --filter 'label >= 3'"
        )
    ref = pc.field(*column.split("."))
    if op in ("is null", "is not null"):
        if raw:
            raise ValueError(f"--filter {text!r}: nothing may follow {op!r}")
        return ref.is_null() if op == "is null" else ~ref.is_null()
    if not raw:
        raise ValueError(f"--filter {text!r} has no value after {op!r}")
    if op in ("in", "not in"):
        values = [_literal(v.strip()) for v in raw.strip("()[]").split(",") if v.strip()]
        expr = ref.isin(pa.array(values))
        return (~expr & ref.is_valid()) if op == "not in" else expr  # nulls are in no list
    value = _literal(raw)
    ops = {
        "==": ref.__eq__,
        "=": ref.__eq__,
        "!=": ref.__ne__,
        "<": ref.__lt__,
        "<=": ref.__le__,
        ">": ref.__gt__,
        ">=": ref.__ge__,
    }
    return ops[op](value)


def parse_storage_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--storage-option`` (the value a JSON literal, else a string).

    Raises:
        ValueError: there is no ``=`` or no key.
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(
            f"--storage-option {text!r} must be KEY=VALUE, e.g. --storage-option endpoint_url=http://host:9000"
        )
    return key.strip(), _literal(value.strip())


def parse_catalog_config(text: str) -> dict[str, Any]:
    """``--catalog-config``: a JSON object, or the path of a file holding one.

    Raises:
        ValueError: neither a JSON object nor a readable file holding one.
    """
    body = text
    if not text.lstrip().startswith("{"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise ValueError(
                f"--catalog-config {text!r} is neither a JSON object nor a file; pass e.g. "
                '\'{"type": "sql", "uri": "sqlite:///catalog.db", "warehouse": "file:///wh"}\''
            )
        body = path.read_text()
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise ValueError(f"--catalog-config is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(
            f"--catalog-config must be a JSON object of catalog properties, got {type(value).__name__}"
        )
    return value


@dataclass(frozen=True)
class Source:
    """A dataset to look at: files (``path``) or an Iceberg ``table``, and its options.

    Attributes:
        path: Files: a file, directory or glob (or several).
        format: Files: ``parquet``, ``orc``, ``csv`` or ``jsonl``.
        table: Iceberg: ``namespace.table`` (then ``path`` is ``None``).
        catalog_config: Iceberg: the catalog's properties.
        options: Library keywords given on the command line (only those given, so the
            library's defaults apply to the rest): ``batch_size``, ``split_rows``,
            ``filters``, ``storage_options``, ...
        mix: A mix of sources instead: the recipe (``sources``, ``weights`` and keywords
            of ``create_mixed_dataloader``; see :mod:`.mix`).
    """

    path: str | Sequence[str] | None = None
    format: str = "parquet"
    table: str | None = None
    catalog_config: Mapping[str, Any] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    mix: Mapping[str, Any] | None = None

    def describe(self) -> str:
        """``'PATH' (parquet)``, ``Iceberg table 'ns.t'`` or ``a mix of 3 sources``."""
        if self.mix is not None:
            names = [str(s.get("name") or s.get("table") or s.get("path")) for s in self.mix["sources"]]
            return f"a mix of {len(names)} sources ({', '.join(names)})"
        if self.table is not None:
            return f"Iceberg table {self.table!r}"
        path = self.path if isinstance(self.path, str) or self.path is None else ", ".join(self.path)
        return f"{path!r} ({self.format})"


def open_dataset(
    source: Source, *, num_ranks: int = 1, rank: int = 0, num_workers: int = 1
) -> PlannedDataset:
    """The library's dataset for ``source``, planned for ``num_ranks`` x ``num_workers``.

    The commands plan and summarize every rank (arrays of ranks x workers), so the world
    is bounded: at most :data:`~torch_dataloader_utils.plan.state.MAX_RANKS` ranks (the most
    a resume state describes) and :data:`~torch_dataloader_utils.plan.state.MAX_WORKER_SLOTS`
    ranks x workers.

    Raises:
        ConfigError: a world larger than that (before anything is read).
        DataLoaderUtilsError: whatever building the dataset raises (a missing path, a bad
            option, ...), with its message naming the option.
    """
    slots = num_ranks * max(1, num_workers)
    if num_ranks > MAX_RANKS or slots > MAX_WORKER_SLOTS:
        raise ConfigError(
            f"--num-ranks {num_ranks:,} x --num-workers {num_workers:,} is more than the commands plan: "
            f"at most {MAX_RANKS:,} ranks and {MAX_WORKER_SLOTS:,} ranks x workers (every rank is "
            "planned and summarized here; the loader itself plans only its own rank)"
        )
    options: dict[str, Any] = {
        **source.options,
        "num_ranks": num_ranks,
        "rank": rank,
        "num_workers": num_workers,
    }
    if source.table is not None:
        return IcebergDataset(source.table, catalog_config=source.catalog_config, **options)
    return StructuredDataset(source.path, format=source.format, **options)


def quiet_library_logs(verbosity: int) -> None:
    """Route the library's records to standard error: warnings and errors only by default."""
    level = {0: logging.ERROR, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    logger = logging.getLogger("torch_dataloader_utils")
    logger.setLevel(level)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
