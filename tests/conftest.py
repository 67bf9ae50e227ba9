"""Test set-up: eight simulated CPU devices, configured before the JAX backend starts, a
persistent compilation cache of the run's own (a program compiled by one test module is read
back by the next one after the in-memory caches are cleared), and the tiers.

Tiers: a test that builds a cluster or starts a Python process carries the ``cluster`` marker,
and ``make test-fast`` (``-m "not cluster and not slow"``, no notebooks) leaves it out. A test
without the marker that builds one anyway fails, naming the marker, so the fast tier stays fast.
"""

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile

# No background warm-up process (lab.notebook.warm) from a notebook's set-up cell run by the tests.
os.environ["RLCLUSTER_LAB_WARM"] = "off"

from rlcluster_lab.core.compile_cache import enable_compilation_cache, flush_cache_writes
from rlcluster_lab.core.devices import ensure_simulated_devices

ensure_simulated_devices(8)
# One folder for the whole run: pytest-xdist's workers (``make test``) inherit it from the process
# that starts them, so a program one worker compiled is read back by the other.
_CACHE = os.environ.get("RLCLUSTER_LAB_TEST_CACHE")
if _CACHE is None:
    _CACHE = os.environ["RLCLUSTER_LAB_TEST_CACHE"] = tempfile.mkdtemp(prefix="rlcluster-lab-test-cache-")
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
enable_compilation_cache(_CACHE)


import jax  # noqa: E402  (after the devices are set)
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from rlcluster_lab import RLCluster  # noqa: E402
from rlcluster_lab.placement.programs import clear_programs  # noqa: E402

# Property tests whose every example compiles (a reshard onto fresh shardings) take their count
# from the profile: "ci" (the default: `make test`, `make test-fast`) or "thorough"
# (HYPOTHESIS_PROFILE=thorough, the counts they ran before the tiers and more). Derandomized
# either way, so a run repeats exactly. Properties whose examples cost nothing name their own.
# "explore" draws new examples at every run (nothing derandomized, nothing stored): for hunting
# a configuration none of the fixed ones reaches; a failure prints the example to pin in a test.
settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True)
settings.register_profile("thorough", max_examples=40, deadline=None, derandomize=True)
settings.register_profile("explore", max_examples=25, deadline=None, derandomize=False, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True, scope="module")
def _fresh_compile_caches():
    """Each test module starts without the previous modules' compiled programs.

    On the CPU backend every compiled kernel holds memory mappings, and one
    process running the whole suite would otherwise approach the kernel's
    per-process limit on mappings.
    """
    yield
    flush_cache_writes()  # on disk before the clear: a later module reads them back
    clear_programs()
    jax.clear_caches()


# ---------------------------------------------------------------------------- tiers

# What the running test (its set-up included) started that only the full tier may start.
_started: list[str] = []


def _watch(cls: type, what: str, applies=lambda *a, **k: True) -> None:
    """Note ``what`` each time ``cls`` is constructed (and ``applies`` to the arguments)."""
    real = cls.__init__

    @functools.wraps(real)
    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        if applies(*args, **kwargs):
            _started.append(what)

    cls.__init__ = init


def _is_python(args, executable=None, **_) -> bool:
    """A Python interpreter (seconds to start, and JAX to import); a small tool is not noted."""
    program = executable or (args if isinstance(args, str | bytes | os.PathLike) else args[0])
    name = os.path.basename(os.fsdecode(program)).split()[0]
    return name.startswith("python") or os.fsdecode(program) == sys.executable


_watch(RLCluster, "built an RLCluster")
_watch(subprocess.Popen, "started a Python process", _is_python)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _started.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if call.when == "call" and report.passed and _started and item.get_closest_marker("cluster") is None:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} {' and '.join(sorted(set(_started)))} (in the test or a fixture it set up) but "
            "carries no `cluster` marker, so the fast tier (`make test-fast`) would run it. Mark it "
            "`@pytest.mark.cluster`, or test without a live cluster (figures: on a stored report)."
        )
    return report
