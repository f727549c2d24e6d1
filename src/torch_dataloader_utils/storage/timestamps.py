"""Timestamps in S3's answers, parsed without dateutil.

botocore parses every timestamp it receives (each object's ``LastModified`` in a listing,
the ``Last-Modified`` header of every GET) with ``dateutil``, at 80-250 microseconds
each on the machine of docs/benchmarks.md: most of the CPU of listing 1,000 objects, and
a visible part of every small read. S3 sends two forms, ISO 8601 in UTC
(``2026-11-28T01:43:28.000Z``, in XML) and the HTTP date (``Sat, 28 Nov 2026 01:43:28
GMT``, in headers); :func:`parse_timestamp` reads both with the standard library in a
few microseconds and hands anything else to botocore's own parser. Only the library's
own s3fs clients are changed (:func:`use_fast_timestamps`), never a user's.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import email.utils
from typing import Any

__all__ = ["parse_timestamp", "use_fast_timestamps"]


def _default(value: Any) -> Any:
    from botocore.parsers import DEFAULT_TIMESTAMP_PARSER

    return DEFAULT_TIMESTAMP_PARSER(value)


def parse_timestamp(value: Any) -> Any:
    """``value`` as an aware ``datetime`` (UTC), the same instant botocore's parser gives."""
    if isinstance(value, str):
        try:
            if value.endswith("Z") and "T" in value:
                return _dt.datetime.fromisoformat(value[:-1]).replace(tzinfo=_dt.UTC)
            if value.endswith(" GMT"):
                return email.utils.parsedate_to_datetime(value)
        except (ValueError, TypeError, IndexError):
            pass
    return _default(value)


def use_fast_timestamps(session: Any, client: Any) -> None:
    """Parse the timestamps of ``client`` (a botocore client) and of clients ``session`` makes later.

    Best effort: a botocore that keeps its parser elsewhere is left as it is.
    """
    parser = getattr(client, "_response_parser", None)
    if parser is not None and hasattr(parser, "_timestamp_parser"):
        parser._timestamp_parser = parse_timestamp
    with contextlib.suppress(Exception):  # an older or newer botocore: keep its own parser
        session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_timestamp)
