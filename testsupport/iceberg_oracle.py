"""An independent Iceberg reader for the tests (DataFusion + iceberg-rust), in its own process.

The tests check what the loader reads from Iceberg tables against what DataFusion reads
(it applies position and equality deletes itself). DataFusion runs Rust threads of its
own; inside the test process they caused two kinds of trouble on this 2-core machine:
a query that, once in many runs, never returned, and a test worker aborted at exit
because an abandoned query's thread woke up while Python was shutting down. Here the
queries run in one child process per test process, started on first use. A query that
does not answer in time has its process killed, and is asked again of a fresh one.

Protocol (binary pipes): a request is one JSON line ``{"metadata": location, "properties":
{...}, "sql": text}``; the answer is an 8-byte length and an Arrow IPC stream (the table
registered as ``t``), or a negative length and a UTF-8 error message.

    python -m testsupport.iceberg_oracle    # serves requests on stdin / stdout
"""

from __future__ import annotations

import atexit
import json
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

__all__ = ["IcebergOracle", "query"]

_LENGTH = struct.Struct("<q")
ROOT = Path(__file__).resolve().parents[1]


class IcebergOracle:
    """A child process answering SQL over Iceberg tables (started on first use).

    Args:
        timeout: Seconds a query may take before its process is killed.
    """

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def query(self, metadata: str, properties: dict[str, str], sql: str) -> pa.Table:
        """``sql`` over the table of ``metadata`` (registered as ``t``); asked twice at most."""
        request = json.dumps({"metadata": metadata, "properties": properties, "sql": sql}).encode() + b"\n"
        with self._lock:
            for _attempt in range(2):
                answer = self._ask(request)
                if answer is not None:
                    return answer
        raise AssertionError(f"the DataFusion oracle did not answer {sql!r} twice in {self.timeout} s")

    def _ask(self, request: bytes) -> pa.Table | None:
        process = self._start()
        stdin, stdout = process.stdin, process.stdout
        if stdin is None or stdout is None:
            raise RuntimeError("the DataFusion oracle process has no pipes")
        box: list[pa.Table | BaseException] = []

        def exchange() -> None:
            try:
                stdin.write(request)
                stdin.flush()
                box.append(_read_answer(stdout))
            except BaseException as exc:  # handed to the caller
                box.append(exc)

        worker = threading.Thread(target=exchange, name="iceberg-oracle-client", daemon=True)
        worker.start()
        worker.join(self.timeout)
        if not box:  # no answer in time: kill the process (which ends the read) and retry
            process.kill()
            worker.join(10.0)
            self.close()
            return None
        answer = box[0]
        if isinstance(answer, BaseException):
            self.close()
            raise answer
        return answer

    def _start(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
            self._process = subprocess.Popen(
                [sys.executable, "-m", "testsupport.iceberg_oracle"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=ROOT,
                env=env,
            )
        return self._process

    def close(self) -> None:
        """Stop the child process (a later query starts a new one)."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(5.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10.0)
        if process.stdout is not None:
            process.stdout.close()


def _read_exactly(stream: IO[bytes], n: int) -> bytes:
    data = stream.read(n)
    if data is None or len(data) != n:
        raise EOFError("the DataFusion oracle process ended without answering")
    return data


def _read_answer(stream: IO[bytes]) -> pa.Table:
    (length,) = _LENGTH.unpack(_read_exactly(stream, _LENGTH.size))
    if length < 0:
        raise RuntimeError(f"the DataFusion oracle failed: {_read_exactly(stream, -length).decode()}")
    with pa.ipc.open_stream(_read_exactly(stream, length)) as reader:
        return reader.read_all()


_ORACLE = IcebergOracle()
atexit.register(_ORACLE.close)


def query(table: Any, sql: str, metadata_location: str | None = None) -> pa.Table:
    """``sql`` over the pyiceberg ``table`` (as ``t``), answered by the shared child process.

    ``metadata_location``: read the table as that metadata file describes it (the one
    written by an earlier commit: its snapshot), instead of its current metadata.
    """
    properties = {str(k): str(v) for k, v in table.io.properties.items()}
    return _ORACLE.query(metadata_location or table.metadata_location, properties, sql)


def _serve() -> None:
    import datafusion
    from pyiceberg.table import StaticTable

    source, sink = sys.stdin.buffer, sys.stdout.buffer
    for line in source:
        request = json.loads(line)
        try:
            table = StaticTable.from_metadata(request["metadata"], properties=request["properties"])
            ctx = datafusion.SessionContext()
            ctx.register_table("t", table)
            result = ctx.sql(request["sql"]).to_arrow_table()
            out = pa.BufferOutputStream()
            with pa.ipc.new_stream(out, result.schema) as writer:
                writer.write_table(result)
            payload = out.getvalue().to_pybytes()
            sink.write(_LENGTH.pack(len(payload)) + payload)
        except Exception as exc:  # reported to the client, which raises it
            message = f"{type(exc).__name__}: {exc}".encode()
            sink.write(_LENGTH.pack(-len(message)) + message)
        sink.flush()


if __name__ == "__main__":
    _serve()
