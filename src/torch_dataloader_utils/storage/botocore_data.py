"""botocore's data files, parsed once per process and inherited by forked workers.

A botocore session loads and parses its service's description (the S3 API model, its
endpoint rules, the partitions) when its first client is made: about 60 ms of CPU.
Every DataLoader worker of every pass builds its own S3 client (a forked process
cannot use its parent's), so each paid it again while the batches waited. The files
never change within a process, so the library's s3fs clients share one loader: the
first client of the process parses them, later clients reuse them, and a worker
forked after that inherits them (a client then costs about 5 ms).

Only the library's own clients (built from ``storage_options``); an s3fs object or
session a user passes keeps its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["session_with_shared_data"]

_LOADER: Any = None
"""This process's botocore data loader (a forked worker inherits its parent's, parsed)."""


def session_with_shared_data(kwargs: Mapping[str, Any]) -> Any:
    """A new aiobotocore session (``AioSession(**kwargs)``) that loads botocore's data once per process.

    Two threads making the first sessions at once may each keep a loader of their own;
    either is a complete one, and the later sessions share whichever was kept.
    """
    from aiobotocore.session import AioSession  # type: ignore[import-untyped]

    global _LOADER
    session = AioSession(**kwargs)
    if _LOADER is None:
        _LOADER = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _LOADER)
    return session
