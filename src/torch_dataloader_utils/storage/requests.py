"""Requests to storage, counted by kind where they are sent: what the store bills.

Object stores bill requests by kind (on S3: LIST and PUT at one price, GET and HEAD at
another) and the bytes they send. Every request the library sends to remote storage
is counted in this process's :func:`process_requests`, by kind, where it is sent:

* through s3fs (listing, footers, the first read of a file in a pass, manifests, the
  metadata cache): a hook on botocore's ``before-send`` event of the client counts each
  HTTP request botocore sends, retries and the requests s3fs makes on its own included
  (:func:`watch_botocore`), so the count is what the server receives;
* through pyarrow's native S3 client: each call the library makes is one request (the
  client is built with one attempt per call, and files are opened with their known
  size, so no HEAD precedes a read), counted by the caller (:func:`count_request`); a
  Parquet footer by pyarrow's own rule (:mod:`~torch_dataloader_utils.storage.footers`).
  Not seen: libcurl resends a request once on its own when a reused connection dies
  before any answer (a server that read it and reset the connection saw two);
* through any other fsspec filesystem (GCS, Azure, a user's object): each call of the
  filesystem's API the library makes, counted as one request of its kind
  (:data:`CALL_KINDS`); a client that pages or retries inside one call sends more.

Bytes received (GET) and sent (PUT) are counted by the callers, which hold the data.
A forked process starts from its parent's counts; readers report differences.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CALL_KINDS",
    "KINDS",
    "RequestCounts",
    "count_bytes",
    "count_request",
    "kind_of_operation",
    "process_requests",
    "watch_botocore",
]

KINDS = ("lists", "heads", "gets", "puts", "others")
"""The kinds of request counted, as :class:`RequestCounts` names them."""

CALL_KINDS: Mapping[str, str] = {
    "find": "lists",
    "ls": "lists",
    "glob": "lists",
    "walk": "lists",
    "info": "heads",
    "exists": "heads",
    "size": "heads",
    "isdir": "heads",
    "isfile": "heads",
    "cat_file": "gets",
    "cat": "gets",
    "pipe_file": "puts",
    "pipe": "puts",
    "put_file": "puts",
    "rm": "others",
    "rm_file": "others",
}
"""The kind of request an fsspec call is counted as where no hook sees the requests."""


@dataclass(frozen=True)
class RequestCounts:
    """Requests sent to remote storage, by kind, and the bytes they carried.

    S3 bills LIST and PUT requests at one price and GET and HEAD at another (per 1,000);
    :meth:`cost` applies the prices you pay.

    Attributes:
        lists: Listing requests (one per page of up to 1,000 objects on S3).
        heads: Metadata requests (HEAD on S3: a file's size and modification time).
        gets: Reads (ranged GETs of column chunks, footers, whole small files, manifests).
        puts: Writes (the metadata cache; on S3 also the parts of a multipart upload).
        others: Any other request (deletes, ...).
        bytes_received: Bytes the reads returned.
        bytes_sent: Bytes the writes sent.
    """

    lists: int = 0
    heads: int = 0
    gets: int = 0
    puts: int = 0
    others: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0

    @property
    def total(self) -> int:
        """Requests of every kind."""
        return self.lists + self.heads + self.gets + self.puts + self.others

    def __add__(self, other: RequestCounts) -> RequestCounts:
        return RequestCounts(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))

    def __sub__(self, other: RequestCounts) -> RequestCounts:
        return RequestCounts(*(a - b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))

    def as_tuple(self) -> tuple[int, ...]:
        """The counts in field order (what a DataLoader worker sends with its batches)."""
        return dataclasses.astuple(self)

    def as_dict(self) -> dict[str, int]:
        """The counts as plain values, with ``total``."""
        return {**dataclasses.asdict(self), "total": self.total}

    def cost(self, per_1000: float, list_per_1000: float | None = None) -> float:
        """What these requests cost at ``per_1000`` per 1,000 requests.

        Args:
            per_1000: The price of 1,000 requests (GET, HEAD and others; every kind when
                ``list_per_1000`` is not given). S3 Standard in us-east-1: 0.0004 USD.
            list_per_1000: The price of 1,000 LIST and PUT requests, when it differs
                (S3 Standard: 0.005 USD).
        """
        dear = per_1000 if list_per_1000 is None else list_per_1000
        return ((self.gets + self.heads + self.others) * per_1000 + (self.lists + self.puts) * dear) / 1000

    def __str__(self) -> str:
        return (
            f"{self.total:,} requests ({self.lists:,} LIST, {self.heads:,} HEAD, {self.gets:,} GET, "
            f"{self.puts:,} PUT"
            + (f", {self.others:,} other" if self.others else "")
            + f"), {self.bytes_received:,} bytes received"
            + (f", {self.bytes_sent:,} sent" if self.bytes_sent else "")
        )


class _Counter:
    """This process's counts (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values = [0] * len(dataclasses.fields(RequestCounts))

    def add(self, index: int, nbytes_in: int = 0, nbytes_out: int = 0) -> None:
        with self.lock:
            if index >= 0:
                self.values[index] += 1
            self.values[5] += nbytes_in
            self.values[6] += nbytes_out


_COUNTER = _Counter()
_INDEX = {kind: i for i, kind in enumerate(KINDS)}


def _after_fork() -> None:
    _COUNTER.lock = threading.Lock()  # a thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_after_fork)


def process_requests() -> RequestCounts:
    """Every request counted in this process so far (a forked child starts from its parent's)."""
    with _COUNTER.lock:
        return RequestCounts(*_COUNTER.values)


def count_request(kind: str, nbytes_in: int = 0, nbytes_out: int = 0) -> None:
    """Count one request of ``kind`` (one of :data:`KINDS`) and the bytes it carried."""
    _COUNTER.add(_INDEX[kind], nbytes_in, nbytes_out)


def count_bytes(nbytes_in: int = 0, nbytes_out: int = 0) -> None:
    """Count bytes of a request counted elsewhere (by the botocore hook)."""
    _COUNTER.add(-1, nbytes_in, nbytes_out)


def kind_of_operation(operation: str) -> str:
    """The kind of an S3 API operation (``"GetObject"`` is a GET, ``"ListObjectsV2"`` a LIST...)."""
    if operation.startswith("List"):
        return "lists"
    if operation.startswith("Head"):
        return "heads"
    if operation.startswith("Get"):
        return "gets"
    if operation.startswith(("Put", "Upload", "Create", "Complete", "Copy", "Post")):
        return "puts"
    return "others"


def _on_send(event_name: str = "", **_: Any) -> None:
    """Count the request of a ``before-send`` event of botocore (returns nothing: it is sent)."""
    count_request(kind_of_operation(event_name.rsplit(".", 1)[-1]))


_HOOK_ID = "torch-dataloader-utils-requests"


def watch_botocore(emitter: Any) -> None:
    """Count every request sent by the botocore clients of ``emitter`` (a session or a client's events).

    Registering twice on the same emitter counts once. A client copies its session's
    handlers when it is created: register on the session for clients made later.
    """
    emitter.register("before-send.s3", _on_send, unique_id=_HOOK_ID)
