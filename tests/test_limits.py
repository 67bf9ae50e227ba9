import pytest

from rlcluster_lab.core import limits


def test_check_fits(monkeypatch):
    monkeypatch.setenv(limits.LIMIT_ENV, "1000")
    limits.check_fits(1000, "x")
    with pytest.raises(limits.TooLargeError, match="1,001 bytes.*at most 1.0 KB.*use less"):
        limits.check_fits(1001, "the thing", "use less")
    monkeypatch.delenv(limits.LIMIT_ENV)
    assert limits.limit_bytes() > 0
