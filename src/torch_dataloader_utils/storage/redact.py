"""One redaction helper for every repr, error message and log record that shows options.

Storage options and catalog properties carry credentials (``key``, ``secret``, ``token``,
``s3.secret-access-key``, a password inside an endpoint URL...). Whatever the library
prints of them goes through :func:`redact`, which keeps the option names (so a message
still says which options were given) and hides the values of those that look secret.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["HIDDEN", "RedactedRepr", "is_secret", "redact"]

HIDDEN = "***"
"""What a secret value is shown as."""

_SECRET_WORDS = ("secret", "token", "password", "passwd", "credential", "signature", "auth", "key")
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)@")


def is_secret(name: object) -> bool:
    """Whether an option of this name holds a credential (access key ids included)."""
    lower = str(name).lower()
    return any(word in lower for word in _SECRET_WORDS)


def redact(value: Any) -> Any:
    """``value`` with secret option values hidden, recursively (mappings, pairs, URLs).

    Mappings keep their keys; a value whose key looks secret becomes ``"***"``. A list
    of ``(name, value)`` pairs is treated as a mapping. Passwords in URLs
    (``scheme://user:password@host``) are hidden.
    """
    if isinstance(value, Mapping):
        return {k: HIDDEN if is_secret(k) and v is not None else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if all(isinstance(item, (list, tuple)) and len(item) == 2 for item in value) and value:
            return type(value)(
                (k, HIDDEN) if is_secret(k) and v is not None else (k, redact(v)) for k, v in value
            )
        return type(value)(redact(item) for item in value)
    if isinstance(value, str):
        return _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{HIDDEN}@", value)
    return value


class RedactedRepr:
    """Mixin for dataclasses: the ``repr`` shows every field, secret values hidden."""

    def __repr__(self) -> str:
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        shown = ", ".join(f"{f.name}={redact(getattr(self, f.name))!r}" for f in fields if f.repr)
        return f"{type(self).__name__}({shown})"
