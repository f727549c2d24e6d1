"""Hypothesis strategies for line-delimited text files (CSV, JSONL) with an ``id`` column."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass

from hypothesis import strategies as st

# Commas, quotes, spaces and multi-byte UTF-8 (2, 3 and 4 bytes); no CR / LF (those are
# line ends; quoted newlines are tested on their own).
_ALPHABET = st.sampled_from(list("ab ,\"'xé€😀\t;{}[]:"))
values = st.text(_ALPHABET, min_size=0, max_size=40).map(lambda s: "v" + s)


@dataclass(frozen=True)
class TextCase:
    """File bytes and the records they hold, by id."""

    data: bytes
    records: dict[int, str]


@st.composite
def text_files(draw: st.DrawFn, fmt: str) -> TextCase:
    """A CSV (header ``id,s``) or JSONL file: random values, empty lines, CRLF, final newline or not."""
    strs = draw(st.lists(values, min_size=1 if fmt == "jsonl" else 0, max_size=60))
    lines: list[str] = []
    for i, s in enumerate(strs):
        if fmt == "csv":
            out = io.StringIO()
            csv.writer(out, lineterminator="").writerow([i, s])
            lines.append(out.getvalue())
        else:
            lines.append(json.dumps({"id": i, "s": s}, ensure_ascii=draw(st.booleans())))
        for _ in range(draw(st.integers(0, 2) if draw(st.integers(0, 4)) == 0 else st.just(0))):
            lines.append(draw(st.sampled_from(["", " \t"] if fmt == "jsonl" else [""])))
    if fmt == "csv":
        lines.insert(0, "id,s")
    out_bytes = bytearray()
    for j, line in enumerate(lines):
        out_bytes += line.encode()
        last = j == len(lines) - 1
        if not last or draw(st.booleans()):
            out_bytes += b"\r\n" if draw(st.booleans()) else b"\n"
    return TextCase(bytes(out_bytes), dict(enumerate(strs)))


@dataclass(frozen=True)
class TypedCase:
    """A CSV (header ``id,x``) or JSONL file whose ``x`` holds integers, decimals and bad lines.

    ``good`` are the ids of the lines that are data under some numeric type of ``x``
    (integers and decimals); the other lines do not parse whatever the types (a CSV
    field too many, a JSON object cut short). The first line is always good.
    """

    data: bytes
    good: frozenset[int]
    decimals: frozenset[int]


LINE_KINDS = ("int", "int", "int", "decimal", "bad")


@st.composite
def typed_text_files(draw: st.DrawFn, fmt: str) -> TypedCase:
    """A file for type inference: ``x`` integer or decimal per line, bad lines anywhere."""
    kinds = ["int", *draw(st.lists(st.sampled_from(LINE_KINDS), min_size=0, max_size=60))]
    lines = ["id,x"] if fmt == "csv" else []
    good: set[int] = set()
    decimals: set[int] = set()
    for i, kind in enumerate(kinds):
        whole = draw(st.integers(-(10**6), 10**6))
        if kind == "bad":
            lines.append(f"{i},{whole},{whole}" if fmt == "csv" else f'{{"id": {i}, "x": ')
            continue
        x = f"{whole}.5" if kind == "decimal" else str(whole)
        lines.append(f"{i},{x}" if fmt == "csv" else f'{{"id": {i}, "x": {x}}}')
        good.add(i)
        if kind == "decimal":
            decimals.add(i)
    return TypedCase(("\n".join(lines) + "\n").encode(), frozenset(good), frozenset(decimals))
