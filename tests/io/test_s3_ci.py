"""Under CI (``CI`` true, 1 or yes) a missing S3 server fails the S3 tests; elsewhere it skips them."""

from __future__ import annotations

import pytest

from tests.fixtures.s3 import missing_server, strict_ci


@pytest.mark.parametrize("value", ["true", "1", "yes", "TRUE", "Yes", " true "])
def test_ci_true_values_are_strict(value: str) -> None:
    assert strict_ci({"CI": value}) is True


@pytest.mark.parametrize("environ", [{}, {"CI": ""}, {"CI": "false"}, {"CI": "0"}, {"CI": "no"}, {"C": "1"}])
def test_other_environments_are_not_strict(environ: dict[str, str]) -> None:
    assert strict_ci(environ) is False


def test_missing_server_fails_under_ci_with_the_reason() -> None:
    expected = r"no S3 server could start, and CI='true' requires"
    with pytest.raises(pytest.fail.Exception, match=expected) as info:
        missing_server("weed exited; moto is not installed", {"CI": "true"})
    assert "weed exited; moto is not installed" in str(info.value)


def test_missing_server_skips_outside_ci_with_the_reason() -> None:
    with pytest.raises(pytest.skip.Exception, match="no S3 server can run here: weed exited"):
        missing_server("weed exited", {"CI": "false"})
