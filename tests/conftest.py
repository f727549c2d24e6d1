"""Shared fixtures and Hypothesis profiles.

Fixture plugins live in ``tests/fixtures/``; each issue area adds its own module there
and lists it in ``pytest_plugins`` below.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

pytest_plugins = [
    "tests.fixtures.data",
    "tests.fixtures.e2e",
    "tests.fixtures.examples020",
    "tests.fixtures.iceberg",
    "tests.fixtures.s3",
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
