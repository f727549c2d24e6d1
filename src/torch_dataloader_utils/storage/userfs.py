"""``filesystem=``: a filesystem object the user built, used for every request.

pyarrow datasets, Ray Data and HF datasets take a filesystem object; so does the
library. A :class:`UserFileSystem` wraps an fsspec ``AbstractFileSystem`` or a
``pyarrow.fs.FileSystem`` instance and answers what a
:class:`~torch_dataloader_utils.storage.fs.FileSystemSpec` needs: an fsspec view (listing,
``cat_file``, ``info``), a pyarrow view (footers, readers), and how the bytes are read.
The library then builds no filesystem of its own.

* **In this process** the object itself is used. **In another process** (a DataLoader
  worker, forked or spawned) it is rebuilt from its own serialization, made when it
  was given (fsspec filesystems pickle as their class and constructor arguments; s3fs,
  for one, refuses to be used after a fork). An object that cannot be pickled works
  with ``num_workers=0``; a worker that needs it raises :class:`ConfigError` saying why.
* **Bytes** take pyarrow's native client only where it provably reaches the same
  storage with the same credentials: a plain fsspec ``LocalFileSystem``; a plain
  ``s3fs.S3FileSystem`` whose every option translates, with no mock active and the
  endpoint botocore resolves (:mod:`~torch_dataloader_utils.storage.native_s3`); a
  pyarrow filesystem (it is the native client). Anything else (a subclass, a custom
  session, gcsfs, adlfs, memory...) is read through the object itself.
  :attr:`UserFileSystem.data_path` says which, and why.
"""

from __future__ import annotations

import os
import pickle
import uuid
from typing import Any

import fsspec
import pyarrow.fs as pafs

from torch_dataloader_utils.errors import ConfigError, OptionTypeError
from torch_dataloader_utils.storage.calls import describe_endpoint
from torch_dataloader_utils.storage.fs import native_s3_options
from torch_dataloader_utils.storage.native_s3 import check_native
from torch_dataloader_utils.storage.stores import object_identity

__all__ = ["UserFileSystem"]

_ARROW_PROTOCOLS = {
    "local": ("file", "local"),
    "s3": ("s3", "s3a"),
    "gcs": ("gs", "gcs"),
    "abfs": ("abfs", "az", "abfss"),
    "hdfs": ("hdfs",),
}


def _class_name(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _fsspec_protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    protocol = fs.protocol
    names = protocol if isinstance(protocol, (tuple, list)) else (protocol,)
    return tuple(str(n) for n in names)


def _arrow_endpoint(filesystem: pafs.FileSystem) -> dict[str, Any]:
    """``{"endpoint_url": ...}`` of a pyarrow S3 filesystem with an endpoint override (for messages)."""
    try:
        reduced = filesystem.__reduce__()
        kwargs = reduced[1][0] if isinstance(reduced[1][0], dict) else {}
    except Exception:
        return {}
    host = kwargs.get("endpoint_override")
    if not host:
        return {}
    return {"endpoint_url": host if "://" in host else f"{kwargs.get('scheme') or 'https'}://{host}"}


def _advice(inner: fsspec.AbstractFileSystem | None, options: dict[str, Any]) -> str:
    """What to change when requests through ``inner`` time out, for known traps ('' if none)."""
    if type(inner).__name__ == "ExtendedGcsFileSystem":
        endpoint = str(options.get("endpoint_url") or "")
        if endpoint and "googleapis.com" not in endpoint:
            return (
                "; gcsfs's default class (ExtendedGcsFileSystem) first asks Google's gRPC API for "
                f"the bucket's layout, which {endpoint} does not answer: pass "
                "gcsfs.core.GCSFileSystem(...) instead, or set GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false"
            )
    return ""


class UserFileSystem:
    """A filesystem instance given by the user, usable in this process and rebuilt in others.

    Args:
        filesystem: An fsspec ``AbstractFileSystem`` or ``pyarrow.fs.FileSystem`` instance.

    Attributes:
        protocols: The URL schemes it serves (the first is canonical).
        token: Identifies this wrapper (and its rebuilt copies) in client caches.
        name: The object's class, for messages.
        data_path: How data bytes are read, and why (``"pyarrow's native S3 client (...)"``,
            ``"the filesystem object (...)"``).
        advice: What to change when its requests time out, for known traps (or ``""``).
        store: The store it reaches (:func:`~.stores.object_identity`: its class and where
            its requests go, no secrets): what the node-local cache keys its files by.
        process_local: Whether it keeps its files in this process's memory (fsspec's
            ``MemoryFileSystem``): they do not cross into a spawned DataLoader worker.

    Raises:
        OptionTypeError: ``filesystem`` is not a filesystem instance.
    """

    def __init__(self, filesystem: Any) -> None:
        if not isinstance(filesystem, (fsspec.AbstractFileSystem, pafs.FileSystem)):
            raise OptionTypeError(
                f"filesystem={filesystem!r} is not an fsspec or pyarrow filesystem instance"
            )
        self._given: Any = filesystem
        self._pid = os.getpid()
        self._local: dict[str, Any] = {}
        self.token = uuid.uuid4().hex
        self.name = _class_name(filesystem)
        self._payload: bytes | None = None
        self._unpicklable: str | None = None
        try:
            self._payload = pickle.dumps(filesystem)
        except Exception as exc:
            self._unpicklable = f"{type(exc).__name__}: {exc}"
        inner = self._fsspec_of(filesystem)
        if isinstance(filesystem, pafs.FileSystem) and inner is None:
            self.kind = "arrow"
            self.protocols = _ARROW_PROTOCOLS.get(filesystem.type_name, (filesystem.type_name,))
            self.options: dict[str, Any] = _arrow_endpoint(filesystem)
        else:
            assert inner is not None
            self.kind = "fsspec"
            self.protocols = _fsspec_protocols(inner)
            self.options = dict(getattr(inner, "storage_options", {}) or {})
        from fsspec.implementations.local import LocalFileSystem  # not imported by ``import fsspec``
        from fsspec.implementations.memory import MemoryFileSystem

        self.is_local = type(filesystem) is pafs.LocalFileSystem or type(inner) is LocalFileSystem
        self.process_local = isinstance(inner, MemoryFileSystem)
        self.store = object_identity(filesystem)
        self._native_s3: dict[str, Any] | None = None
        self.data_path = self._decide(filesystem, inner)
        self.advice = _advice(inner, self.options)

    @staticmethod
    def _fsspec_of(filesystem: Any) -> fsspec.AbstractFileSystem | None:
        """The fsspec filesystem inside ``filesystem`` (itself, or a PyFileSystem's handler's)."""
        if isinstance(filesystem, fsspec.AbstractFileSystem):
            return filesystem
        handler = getattr(filesystem, "handler", None)
        inner = getattr(handler, "fs", None)
        return inner if isinstance(inner, fsspec.AbstractFileSystem) else None

    def _decide(self, filesystem: Any, inner: fsspec.AbstractFileSystem | None) -> str:
        if self.is_local:
            return "local files (the local disk, as the filesystem object reads it)"
        if self.kind == "arrow" or (isinstance(filesystem, pafs.FileSystem) and inner is not None):
            return f"the pyarrow filesystem object ({self.name})"
        import sys

        s3fs = sys.modules.get("s3fs")
        if s3fs is not None and type(inner) is s3fs.S3FileSystem:
            native, why = check_native(native_s3_options(self.options), self.options)
            if native is not None:
                self._native_s3 = native
                return f"{why}, with the s3fs object's options"
            return f"the filesystem object ({self.name}): {why.removeprefix('s3fs ')}"
        return f"the filesystem object ({self.name}; no native client reaches it the same way)"

    # -- pickling: values only; the object is rebuilt from its own serialization ----------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_given"] = None
        state["_local"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = -1

    @property
    def native(self) -> bool:
        """Whether data bytes go through a pyarrow client (not through fsspec calls)."""
        return self.is_local or self.kind == "arrow" or self._native_s3 is not None

    @property
    def endpoint(self) -> str | None:
        """Where its requests go, as a user would name it (``None`` for local files)."""
        if self.is_local:
            return None
        return describe_endpoint(self.protocols[0], self.options)

    def get(self) -> Any:
        """The filesystem object for this process: the given one, or its rebuilt copy.

        Raises:
            ConfigError: this is another process and the object could not be pickled.
        """
        if self._given is not None and self._pid == os.getpid():
            return self._given
        key = f"object-{os.getpid()}"
        if key not in self._local:
            if self._payload is None:
                raise ConfigError(
                    f"filesystem={self.name} cannot be rebuilt in a DataLoader worker: it could "
                    f"not be pickled when it was given ({self._unpicklable}); pass a filesystem "
                    "that pickles (fsspec filesystems built from their options do), or "
                    "num_workers=0"
                )
            self._local.clear()
            self._local[key] = pickle.loads(self._payload)
        return self._local[key]

    def _cached(self, kind: str, make: Any) -> Any:
        key = f"{kind}-{os.getpid()}"
        client = self._local.get(key)
        if client is None:
            client = self._local[key] = make()
        return client

    def fsspec(self) -> fsspec.AbstractFileSystem:
        """The fsspec view of the filesystem (listing, ``cat_file``, ``info``)."""
        given = self.get()
        inner = self._fsspec_of(given)
        if inner is not None:
            return inner
        from fsspec.implementations.arrow import ArrowFSWrapper

        return self._cached("fsspec", lambda: ArrowFSWrapper(given))

    def arrow(self) -> pafs.FileSystem:
        """The pyarrow view: the data path (:attr:`data_path`)."""
        given = self.get()
        if isinstance(given, pafs.FileSystem):
            return given
        if self.is_local:
            return self._cached("arrow", pafs.LocalFileSystem)  # type: ignore[no-any-return]
        if self._native_s3 is not None:
            native = self._native_s3
            return self._cached("arrow", lambda: pafs.S3FileSystem(**native))  # type: ignore[no-any-return]
        return self._cached(  # type: ignore[no-any-return]
            "arrow",
            lambda: pafs.PyFileSystem(pafs.FSSpecHandler(given)),  # type: ignore[abstract]
        )

    def strip(self, path: str) -> str:
        """``path`` as the filesystem names it (its scheme removed).

        Raises:
            ConfigError: ``path`` has a scheme the filesystem does not serve.
        """
        scheme, sep, rest = path.partition("://")
        if sep and scheme not in self.protocols:
            raise ConfigError(
                f"path={path!r} is a {scheme}:// URL but filesystem={self.name} serves "
                f"{', '.join(p + '://' for p in self.protocols)}; pass a path on that filesystem "
                "(with its scheme or none)"
            )
        stripped = rest if sep else path
        if self.kind == "fsspec":
            return str(self.fsspec()._strip_protocol(stripped))
        return os.path.abspath(stripped) if self.is_local else stripped.rstrip("/")

    def __repr__(self) -> str:
        return f"UserFileSystem({self.name}, data_path={self.data_path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UserFileSystem) and other.token == self.token

    def __hash__(self) -> int:
        return hash(self.token)
