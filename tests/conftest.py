"""Test set-up: eight simulated CPU devices, configured before the JAX backend starts."""
from rlcluster_lab.devices import ensure_simulated_devices

ensure_simulated_devices(8)


import jax  # noqa: E402  (after the devices are set)
import pytest  # noqa: E402

from rlcluster_lab.reshard import clear_programs  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _fresh_compile_caches():
    """Each test module starts without the previous modules' compiled programs.

    On the CPU backend every compiled kernel holds memory mappings, and one
    process running the whole suite would otherwise approach the kernel's
    per-process limit on mappings.
    """
    yield
    clear_programs()
    jax.clear_caches()
