"""Real local servers for Google Cloud Storage and Azure Blob, for tests and benchmarks.

* :func:`start_gcs` runs ``gcp-storage-emulator`` (PyPI) on a free port, in memory; gcsfs
  reaches it with ``token="anon"`` and ``endpoint_url``.
* :func:`start_azurite` runs Azurite's blob service (npm ``azurite``) on a free port;
  adlfs reaches it with the well-known development account's connection string.
  ``make`` installs Azurite into ``.venv/azurite`` (see the Makefile); an ``azurite-blob``
  on ``PATH`` is used otherwise.

Each returns ``(server, stop)``, or a string saying why it could not start, like
:mod:`testsupport.s3_server`.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testsupport.s3_server import free_ports

__all__ = [
    "AZURE_ACCOUNT",
    "AZURE_CONTAINER",
    "GCS_BUCKET",
    "AzureServer",
    "GcsServer",
    "azurite_binary",
    "start_azurite",
    "start_gcs",
]

GCS_BUCKET = "tdu-bucket"
AZURE_CONTAINER = "tdu-container"
AZURE_ACCOUNT = "devstoreaccount1"
# Azurite's documented development account key (public, not a secret).
_AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@dataclass
class GcsServer:
    """A running GCS emulator and the storage_options that reach it."""

    endpoint: str
    kind: str = "gcp-storage-emulator"

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        return {"token": "anon", "project": "test", "endpoint_url": endpoint or self.endpoint}

    def fs(self) -> Any:
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(skip_instance_cache=True, **self.options())

    def new_prefix(self) -> str:
        return f"{GCS_BUCKET}/{uuid.uuid4().hex[:12]}"


@dataclass
class AzureServer:
    """A running Azurite blob service and the storage_options that reach it."""

    endpoint: str
    kind: str = "azurite"

    def connection_string(self, endpoint: str | None = None) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={_AZURE_KEY};"
            f"BlobEndpoint={endpoint or self.endpoint}/{AZURE_ACCOUNT};"
        )

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        return {"connection_string": self.connection_string(endpoint)}

    def fs(self) -> Any:
        import adlfs

        return adlfs.AzureBlobFileSystem(skip_instance_cache=True, **self.options())

    def new_prefix(self) -> str:
        return f"{AZURE_CONTAINER}/{uuid.uuid4().hex[:12]}"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait(probe: Callable[[], bool], proc: subprocess.Popen[bytes], seconds: float, port: int) -> bool:
    """Wait for the port to accept connections (clients back off for seconds on a refused one), then probe."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if _listening(port) and probe():
                return True
        except Exception:
            pass
        time.sleep(0.3)
    return False


def _stopper(proc: subprocess.Popen[bytes], log: Any) -> Callable[[], None]:
    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()

    return stop


def _tail(path: Path) -> str:
    try:
        return path.read_bytes()[-400:].decode(errors="replace")
    except OSError:
        return ""


def start_gcs(workdir: Path) -> tuple[GcsServer, Callable[[], None]] | str:
    """``gcp-storage-emulator`` on a free port (in memory): (server, stop), or why it could not start."""
    exe = Path(sys.executable).parent / "gcp-storage-emulator"
    if not exe.exists():
        found = shutil.which("gcp-storage-emulator")
        if found is None:
            return "gcp-storage-emulator is not installed (pip install gcp-storage-emulator)"
        exe = Path(found)
    try:
        import gcsfs  # noqa: F401
    except ImportError as exc:
        return f"gcsfs is not installed ({exc})"
    port = free_ports(1)[0]
    log = open(workdir / "gcs.log", "wb")  # noqa: SIM115 - closed by stop()
    args = [
        str(exe),
        "start",
        "--port",
        str(port),
        "-H",
        "127.0.0.1",
        "--default-bucket",
        GCS_BUCKET,
        "-q",
        "-M",
    ]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = GcsServer(f"http://127.0.0.1:{port}")
    stop = _stopper(proc, log)

    def probe() -> bool:
        fs = server.fs()
        fs.pipe(f"{GCS_BUCKET}/.probe", b"ok")
        return bool(fs.cat(f"{GCS_BUCKET}/.probe") == b"ok")

    if not _wait(probe, proc, 30, port):
        stop()
        return f"gcp-storage-emulator did not start: {_tail(workdir / 'gcs.log')}"
    return server, stop


def azurite_binary() -> str | None:
    """``azurite-blob``: the one ``make`` installs under ``.venv/azurite``, else on ``PATH``."""
    installed = Path(sys.prefix) / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if installed.exists():
        return str(installed)
    return shutil.which("azurite-blob")


def start_azurite(workdir: Path) -> tuple[AzureServer, Callable[[], None]] | str:
    """Azurite's blob service on a free port: (server, stop), or why it could not start."""
    exe = azurite_binary()
    if exe is None:
        return "azurite-blob is not installed (make installs it into .venv/azurite: npm install azurite)"
    try:
        import adlfs  # noqa: F401
    except ImportError as exc:
        return f"adlfs is not installed ({exc})"
    port = free_ports(1)[0]
    data = workdir / "azurite"
    data.mkdir(parents=True, exist_ok=True)
    log = open(workdir / "azurite.log", "wb")  # noqa: SIM115 - closed by stop()
    args = [
        exe, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(data),
        "--silent", "--skipApiVersionCheck", "--loose",
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = AzureServer(f"http://127.0.0.1:{port}")
    stop = _stopper(proc, log)

    def probe() -> bool:
        fs = server.fs()
        if not fs.exists(AZURE_CONTAINER):
            fs.mkdir(AZURE_CONTAINER)
        fs.pipe(f"{AZURE_CONTAINER}/.probe", b"ok")
        return bool(fs.cat(f"{AZURE_CONTAINER}/.probe") == b"ok")

    if not _wait(probe, proc, 40, port):
        stop()
        return f"Azurite did not start: {_tail(workdir / 'azurite.log')}"
    return server, stop
