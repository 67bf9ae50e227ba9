"""The host-memory bound every allocation is checked against, and the device-memory one."""

import pytest

from rlcluster_lab.core import limits
from rlcluster_lab.core.errors import ConfigError


def test_check_fits(monkeypatch):
    monkeypatch.setenv(limits.LIMIT_ENV, "1000")
    limits.check_fits(1000, "x")
    with pytest.raises(limits.TooLargeError, match="1,001 bytes.*at most 1000 B.*use less"):
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


def test_what_a_replaced_cluster_frees_counts_as_free(monkeypatch):
    # The lab checks a new cluster before it releases the live one: what that release frees
    # counts, on the host (unless the variable bounds the request itself) and on each device.
    monkeypatch.setenv(limits.LIMIT_ENV, "500")
    assert limits.limit_bytes(freed=600) == 500
    monkeypatch.delenv(limits.LIMIT_ENV)
    monkeypatch.setattr(limits, "available_host_bytes", lambda: 1000)
    assert (limits.limit_bytes(), limits.limit_bytes(freed=600)) == (500, 800)
    with pytest.raises(limits.TooLargeError, match="at most 500 B"):
        limits.check_fits(800, "building")
    limits.check_fits(800, "building", freed=600)
    with pytest.raises(limits.TooLargeError, match="at most 800 B .*counting the 600 B the cluster it replaces frees"):
        limits.check_fits(801, "building", freed=600)
    full = _Device(1, {"bytes_limit": 1000, "bytes_in_use": 900})
    limits.check_fits_devices({1: 700}, [full], "placing", freed={1: 600})
    with pytest.raises(limits.TooLargeError, match=r"has 700 B free .*and the 600 B the cluster it replaces frees"):
        limits.check_fits_devices({1: 701}, [full], "placing", freed={1: 600})


def test_check_memory_counts_the_cluster_it_replaces(monkeypatch):
    from rlcluster_lab.app.scenario import check_memory, validate
    from rlcluster_lab.core.options import Scenario

    scenario = Scenario(model_size="small")
    config = validate(scenario)
    monkeypatch.delenv(limits.LIMIT_ENV, raising=False)
    monkeypatch.setattr(limits, "available_host_bytes", lambda: 40_000_000)  # half: 20 MB, the model needs ~37 MB
    with pytest.raises(limits.TooLargeError, match="the small model"):
        check_memory(scenario, config)
    # A live cluster of 40 MB on the CPU devices, released before the build: 40 MB free instead of 20.
    check_memory(scenario, config, {str(i): {"device": 5_000_000} for i in range(8)})
