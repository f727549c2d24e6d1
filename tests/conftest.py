"""Shared fixtures and Hypothesis profiles.

Fixture plugins live in ``tests/fixtures/``; each issue area adds its own module there
and lists it in ``pytest_plugins`` below.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = [
    "tests.fixtures.data",
    "tests.fixtures.e2e",
    "tests.fixtures.examples020",
    "tests.fixtures.iceberg",
    "tests.fixtures.recipes",
    "tests.fixtures.s3",
    "tests.fixtures.stores",
]

settings.register_profile(
    "default",
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "thorough",
    deadline=None,
    max_examples=500,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_per_module() -> Iterator[None]:
    """Collect each test module's cyclic garbage when the module ends.

    A few full runs (2026-11-23) lost an xdist worker to a segmentation fault while the
    cyclic garbage collector ran inside a later, unrelated test (``test_layers.py``,
    ``test_orc.py``), so the culprit's module was unknown. Collected here, a module's
    objects are freed at its own teardown: such a crash is reported against that
    module's last test (one was, in ``test_orc.py``), and objects holding native
    resources (Arrow readers, S3 clients, shared memory) do not outlive their module's
    threads and servers.
    """
    yield
    gc.collect()
