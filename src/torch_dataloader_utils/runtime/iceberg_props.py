"""``storage_options`` of an Iceberg dataset, as pyiceberg FileIO properties.

An Iceberg table is read through its catalog's FileIO, which takes string properties
(``s3.endpoint``, ``s3.access-key-id``, ...). To accept the same ``storage_options`` as
file datasets, the fsspec / s3fs spellings are translated once, here, and merged into
``catalog_config`` (which then reaches the catalog, the table's FileIO and every
worker). Keys already in pyiceberg's dotted form pass unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch_dataloader_utils.errors import ConfigError, IncompatibleOptionsError
from torch_dataloader_utils.storage.redact import HIDDEN, is_secret, redact

__all__ = ["catalog_properties"]

# s3fs keyword -> pyiceberg FileIO property.
_S3FS_KEYS = {
    "key": "s3.access-key-id",
    "secret": "s3.secret-access-key",
    "token": "s3.session-token",
    "endpoint_url": "s3.endpoint",
    "region_name": "s3.region",
    "anon": "s3.anonymous",
}
# s3fs keywords that only tune fsspec's own client: meaningless for a FileIO.
_IGNORED = frozenset(
    {"skip_instance_cache", "use_listings_cache", "listings_expiry_time", "default_block_size"}
)


def _flatten(options: Mapping[str, Any]) -> dict[str, Any]:
    flat = {k: v for k, v in options.items() if k not in ("client_kwargs", "config_kwargs")}
    for nested in ("client_kwargs", "config_kwargs"):
        inner = options.get(nested) or {}
        if not isinstance(inner, Mapping):
            raise ConfigError(f"storage_options[{nested!r}]={inner!r} must be a dict")
        flat.update(inner)
    return flat


def catalog_properties(
    catalog_config: Mapping[str, Any] | None, storage_options: Mapping[str, Any] | None
) -> Mapping[str, Any] | None:
    """``catalog_config`` with ``storage_options`` translated and merged in.

    Raises:
        ConfigError: ``storage_options`` is not a dict, or holds a key with no FileIO meaning.
        IncompatibleOptionsError: both set the same property to different values.
    """
    if not storage_options:
        return catalog_config
    if not isinstance(storage_options, Mapping):
        raise ConfigError(f"storage_options={storage_options!r} must be a dict of filesystem options")
    merged: dict[str, Any] = dict(catalog_config or {})
    for key, value in _flatten(storage_options).items():
        if key in _IGNORED:
            continue
        prop = _S3FS_KEYS.get(key, key if "." in key else None)
        if prop is None:
            raise ConfigError(
                f"storage_options key {key!r} has no Iceberg FileIO equivalent; pass "
                f"{sorted(_S3FS_KEYS)} or pyiceberg properties such as 's3.endpoint', or put the "
                "property in catalog_config"
            )
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if prop in merged and str(merged[prop]) != text:
            raise IncompatibleOptionsError(
                f"storage_options[{key!r}]={_shown(key, value)!r} and catalog_config[{prop!r}]="
                f"{_shown(prop, merged[prop])!r} "
                "disagree; set it in one place"
            )
        merged[prop] = text
    return merged


def _shown(name: str, value: object) -> object:
    """``value`` as an error may show it: hidden when ``name`` is a credential's."""
    return HIDDEN if is_secret(name) else redact(value)
