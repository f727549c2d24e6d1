"""pyarrow: the serialized ORC file tail, for exact per-stripe row counts.

pyarrow's public ``ORCFile`` gives the number of stripes and of rows, but not the rows of
each stripe, which splitting by stripe needs (without reading the stripes). The file
tail (a protobuf ``FileTail``, whose ``footer`` lists every stripe) is exposed only by
the private reader object: ``ORCFile.reader.serialized_file_tail()``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["orc_file_tail"]


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
