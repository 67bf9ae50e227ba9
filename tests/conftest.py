"""Test set-up: eight simulated CPU devices, configured before the JAX backend starts, and a
persistent compilation cache of the session's own (a program compiled by one test module is
read back by the next one after the in-memory caches are cleared)."""

import atexit
import os
import shutil
import tempfile

# No background warm-up process (lab.warm) from a notebook's set-up cell run by the tests.
os.environ["RLCLUSTER_LAB_WARM"] = "off"

from rlcluster_lab.core.compile_cache import enable_compilation_cache
from rlcluster_lab.core.devices import ensure_simulated_devices

ensure_simulated_devices(8)
_CACHE = tempfile.mkdtemp(prefix="rlcluster-lab-test-cache-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
enable_compilation_cache(_CACHE)


import jax  # noqa: E402  (after the devices are set)
import pytest  # noqa: E402

from rlcluster_lab.placement.programs import clear_programs


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
