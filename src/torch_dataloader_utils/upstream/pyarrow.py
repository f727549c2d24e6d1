"""pyarrow: the serialized ORC file tail, and row filters serialized in full.

pyarrow's public ``ORCFile`` gives the number of stripes and of rows, but not the rows of
each stripe, which splitting by stripe needs (without reading the stripes). The file
tail (a protobuf ``FileTail``, whose ``footer`` lists every stripe) is exposed only by
the private reader object: ``ORCFile.reader.serialized_file_tail()``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["expression_bytes", "expression_from_bytes", "orc_file_tail"]


def orc_file_tail(orc_file: Any) -> bytes:
    """The serialized ``FileTail`` protobuf of an open ``pyarrow.orc.ORCFile``.

    Raises:
        RuntimeError: this pyarrow no longer exposes it (see this module's docstring).
    """
    try:
        return bytes(orc_file.reader.serialized_file_tail())
    except AttributeError as exc:
        raise RuntimeError(
            "pyarrow no longer exposes ORCFile.reader.serialized_file_tail(), which the ORC "
            "stripe splitting needs (torch_dataloader_utils/upstream/pyarrow.py); pin pyarrow "
            "to a version that has it or use split_strategy='file' for ORC"
        ) from exc


def expression_bytes(expression: Any) -> bytes:
    """A ``pyarrow.compute.Expression`` serialized in full (every literal), as pickle does it.

    Raises:
        TypeError: ``expression`` is not an expression pyarrow can serialize.
    """
    reduced = expression.__reduce__()
    if not isinstance(reduced, tuple) or len(reduced) != 2 or len(reduced[1]) != 1:
        raise TypeError(f"cannot serialize the row filter {expression!r}")
    return bytes(reduced[1][0])


def expression_from_bytes(data: bytes) -> Any:
    """The expression :func:`expression_bytes` serialized (no pickle: pyarrow's own deserializer).

    Raises:
        RuntimeError: this pyarrow no longer deserializes expressions this way.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    load = getattr(pc.Expression, "_deserialize", None)
    if load is None:
        raise RuntimeError(
            "pyarrow no longer has Expression._deserialize, which reading a recorded row filter needs "
            "(torch_dataloader_utils/upstream/pyarrow.py); read the ledger with the pyarrow that wrote it"
        )
    return load(pa.py_buffer(data))
