"""One exception hierarchy for the whole library.

Every error the library raises on purpose derives from :class:`DataLoaderUtilsError`,
so ``except DataLoaderUtilsError`` catches them all. Errors about a bad argument are
also :class:`ValueError`, errors about a missing path are also
:class:`FileNotFoundError`, so code written against the builtins keeps working; where torch-dataloader-utils
0.2.0 raised another builtin for the same mistake (``TypeError`` for a ``filters`` of
the wrong type, ``ImportError`` for ``show_progress`` without ``tqdm``), the error is
that builtin too::

    DataLoaderUtilsError
    ├── ConfigError (ValueError)              a parameter has an invalid value
    │   ├── IncompatibleOptionsError          two parameters cannot be combined
    │   │   └── MissingDependencyError (ImportError)
    │   │                                     an option needs a package not installed
    │   ├── OptionTypeError (TypeError)       a parameter's value has the wrong type
    │   └── UnknownOptionError (TypeError)    a keyword that is no option (a typo)
    ├── DiscoveryError                        listing files or reading their metadata
    │   ├── PathNotFoundError (FileNotFoundError)
    │   ├── NoFilesFoundError                 the path exists but holds no data files
    │   └── CorruptFileError                  a file's footer/metadata cannot be read
    ├── SchemaError (ValueError)
    │   ├── UnknownColumnError                a requested column does not exist
    │   ├── SchemaMismatchError               two files disagree on a field
    │   └── InferredSchemaError               a CSV / JSONL value needs a wider type than
    │                                         the one inferred from the files' heads
    ├── PlanError                             a split strategy produced an invalid plan
    │   └── OverlappingChunksError            two chunks (or two ranks) share rows
    ├── DistributedConfigError (ConfigError)  rank / world size disagree with the runtime
    ├── ResumeStateError (ConfigError)        a resume state is malformed or incomplete
    │   └── CheckpointMismatchError           it cannot resume this dataset (0.2.0's name)
    │       └── StateMismatchError            it was saved for other data or options
    ├── UnknownLengthError (TypeError)        len() asked where row counts are unknown
    ├── ReadError                             reading a chunk's data failed
    │   ├── RecordBoundaryError               text records do not match their lines
    │   │                                     (e.g. newlines inside quoted CSV fields)
    │   ├── BadDataError                      a unit of a file cannot be decoded
    │   │                                     (on_bad_data='raise'; names file and position)
    │   └── FileChangedError                  a file was rewritten after planning
    ├── ConversionError (ValueError)          a column cannot become the output type
    │   └── NullValueError                    a null in a column that cannot hold one
    ├── LedgerError                           a training ledger is damaged, or cannot replay
    │                                         what it recorded exactly (names the reason)
    ├── ReshardError                          a reshard job cannot start or finish
    │   ├── DestinationConflictError          the destination holds other data or another
    │   │                                     job's shards
    │   └── SourceChangedError                the source changed since the job started
    └── RankFailedError                       another rank of a multi-rank job failed

Messages name the parameter or file, echo the offending value and say the fix. Warnings
(:func:`warn`) are attributed to the caller's line, the first frame outside the package.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

__all__ = [
    "BadDataError",
    "CheckpointMismatchError",
    "ConfigError",
    "ConversionError",
    "CorruptFileError",
    "DataLoaderUtilsError",
    "DestinationConflictError",
    "DiscoveryError",
    "DistributedConfigError",
    "FileChangedError",
    "IncompatibleOptionsError",
    "InferredSchemaError",
    "LedgerError",
    "MissingDependencyError",
    "NoFilesFoundError",
    "NullValueError",
    "OptionTypeError",
    "OverlappingChunksError",
    "PathNotFoundError",
    "PlanError",
    "RankFailedError",
    "ReadError",
    "RecordBoundaryError",
    "ReshardError",
    "ResumeStateError",
    "SchemaError",
    "SchemaMismatchError",
    "SourceChangedError",
    "StateMismatchError",
    "UnknownColumnError",
    "UnknownLengthError",
    "UnknownOptionError",
    "user_stacklevel",
    "warn",
]


class DataLoaderUtilsError(Exception):
    """Base class of every error raised on purpose by torch_dataloader_utils."""


class ConfigError(DataLoaderUtilsError, ValueError):
    """A parameter has an invalid value."""


class IncompatibleOptionsError(ConfigError):
    """Two parameters were given values that cannot be used together."""


class MissingDependencyError(IncompatibleOptionsError, ImportError):
    """An option needs an optional package that is not installed (the message names the extra).

    Also an :class:`ImportError`, as torch-dataloader-utils 0.2.0 raised for it.
    """


class OptionTypeError(ConfigError, TypeError):
    """A parameter's value has the wrong type (e.g. ``filters`` that is not an Expression).

    Also a :class:`TypeError`, as torch-dataloader-utils 0.2.0 raised for ``filters``.
    """


class UnknownOptionError(ConfigError, TypeError):
    """A keyword argument that is not an option (usually a typo); names the closest one.

    Also a :class:`TypeError`, which Python raises for an unexpected keyword argument.
    """


class DistributedConfigError(ConfigError):
    """``rank`` / ``num_ranks`` disagree with each other or with the running job."""


class ResumeStateError(ConfigError):
    """A resume state cannot be loaded: not a state, another version, or incomplete."""


class CheckpointMismatchError(ResumeStateError):
    """A saved state cannot resume this dataset (the name torch-dataloader-utils 0.2.0 used).

    Raised directly for a checkpoint in 0.2.0's format; ``except CheckpointMismatchError``
    also catches :class:`StateMismatchError`, so 0.2.0 code that discards a mismatched
    checkpoint keeps working.
    """


class StateMismatchError(CheckpointMismatchError):
    """A resume state was saved for other files or options than the dataset's."""


class UnknownLengthError(DataLoaderUtilsError, TypeError):
    """``len()`` of a dataset or loader whose row counts are unknown before reading.

    A :class:`TypeError`, as ``len()`` of an object without a length raises, so code
    that probes ``len()`` (``list()``, progress bars) falls back to iterating.
    """


class DiscoveryError(DataLoaderUtilsError):
    """Listing files or reading their metadata failed."""


class PathNotFoundError(DiscoveryError, FileNotFoundError):
    """A path given by the user does not exist."""


class NoFilesFoundError(DiscoveryError):
    """The path exists but no data files were found under it."""


class CorruptFileError(DiscoveryError):
    """A data file's metadata (footer, header) could not be read."""


class SchemaError(DataLoaderUtilsError, ValueError):
    """The data's schema does not fit the request."""


class UnknownColumnError(SchemaError):
    """A requested column (or a filter's column) does not exist."""


class SchemaMismatchError(SchemaError):
    """Two files of the same dataset disagree about a field."""


class InferredSchemaError(SchemaError):
    """A CSV / JSONL value fits only a wider type than the one inferred for its column.

    Column types are inferred from the head of each file (no ``schema=``); a later line
    whose value is valid under a wider type (``200000.5`` in a column inferred as int64)
    is not bad data, so it is raised under every ``on_bad_data``, naming the column, both
    types, the line and the ``schema=`` to pass.
    """


class PlanError(DataLoaderUtilsError):
    """A split strategy returned chunks that cannot be read exactly once."""


class OverlappingChunksError(PlanError):
    """Two chunks of an epoch's plan cover the same rows."""


class ReadError(DataLoaderUtilsError):
    """Reading a chunk's data failed."""


class ConversionError(DataLoaderUtilsError, ValueError):
    """A column cannot be converted to the requested output format."""


class NullValueError(ConversionError):
    """A column holds nulls and its output type cannot represent them."""


class RecordBoundaryError(ReadError):
    """A text chunk parsed into a different number of records than it has lines.

    Raised instead of returning split or duplicated records, typically because quoted
    CSV fields hold newlines and the file was split at byte offsets.
    """


class BadDataError(ReadError):
    """A unit of a file (a row group, a stripe, a line) cannot be decoded.

    Raised with ``on_bad_data='raise'`` (the default), naming the file and the unit's
    position; ``on_bad_data='skip'`` or ``'quarantine'`` drops such units instead. A file
    that changed or disappeared since planning is a :class:`FileChangedError`, never this.
    """


class FileChangedError(ReadError):
    """A file's size or modification time differs from when the dataset was built.

    The plan (row groups, row ranges, byte offsets) describes the file as it was; it is
    not read against a file that was rewritten since. Build the dataset again.
    """


class LedgerError(DataLoaderUtilsError):
    """A training ledger (``ledger=``) is damaged, or cannot replay what it recorded exactly.

    Replay refuses rather than return other rows: a secret the ledger does not hold, a
    source or option it cannot rebuild, an Iceberg snapshot expired since. A file that
    changed since the ledger recorded it is a :class:`FileChangedError`.
    """


class ReshardError(DataLoaderUtilsError):
    """A reshard job cannot start or finish (unwritable destination, failed verification...)."""


class DestinationConflictError(ReshardError):
    """The destination holds files reshard did not write, or another job's shards.

    Also: the destination is inside the source or holds it, or another job claimed it
    first. Nothing is overwritten: choose a new destination, or delete it to start over.
    """


class SourceChangedError(ReshardError):
    """The source changed since the reshard job writing the destination started."""


class RankFailedError(DataLoaderUtilsError):
    """Another rank of a multi-rank job failed, so this rank stops too (its error is named)."""


_PACKAGE_DIR = str(Path(__file__).resolve().parent) + "/"


def user_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside this package, seen from the caller of this function.

    So a warning raised deep inside the library names the user's line (their call of
    ``create_dataloader`` or ``set_epoch``), not one of the library's own.
    """
    level = 1
    frame = sys._getframe(1)
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(_PACKAGE_DIR):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the first line outside the package (the user's call)."""
    warnings.warn(message, category, stacklevel=user_stacklevel())
