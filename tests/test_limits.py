"""The host-memory bound every allocation is checked against, and the device-memory one."""

import pytest

from rlcluster_lab.core import limits
from rlcluster_lab.core.errors import ConfigError


def test_check_fits(monkeypatch):
    monkeypatch.setenv(limits.LIMIT_ENV, "1000")
    limits.check_fits(1000, "x")
    with pytest.raises(limits.TooLargeError, match="1,001 bytes.*at most 1.0 KB.*use less"):
        limits.check_fits(1001, "the thing", "use less")
    monkeypatch.delenv(limits.LIMIT_ENV)
    assert limits.limit_bytes() > 0


@pytest.mark.parametrize("value", ["1e999", "inf", "nan", "-5", "64 parsecs", ""])
def test_a_memory_limit_that_is_no_byte_count_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(limits.LIMIT_ENV, value)
    if not value:
        assert limits.limit_bytes() > 0  # empty: not set
        return
    with pytest.raises(ConfigError, match=f"{limits.LIMIT_ENV}=.* is not a number of bytes"):
        limits.limit_bytes()


@pytest.mark.parametrize("value, expected", [("64MiB", 64 << 20), ("2GB", 2 * 10**9), ("1e6", 10**6), ("0", 0)])
def test_a_memory_limit_takes_units(monkeypatch, value, expected):
    monkeypatch.setenv(limits.LIMIT_ENV, value)
    assert limits.limit_bytes() == expected


class _Device:
    """A stand-in device: what the check reads (id, platform, its allocator's figures)."""

    def __init__(self, i, stats):
        self.id, self.platform, self._stats = i, "gpu", stats

    def memory_stats(self):
        return self._stats


def test_device_memory_is_compared_only_where_the_device_reports_it():
    full = _Device(1, {"bytes_limit": 1000, "bytes_in_use": 900})
    quiet = _Device(2, None)  # a CPU device: no allocator figures, the host check applies
    limits.check_fits_devices({1: 100, 2: 10**15}, [full, quiet], "placing")
    with pytest.raises(limits.TooLargeError, match=r"placing would need about 101 B .* gpu device 1 but it has 100 B"):
        limits.check_fits_devices({1: 101}, [full], "placing")
