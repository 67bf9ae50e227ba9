"""Compiled programs: a persistent cache on disk, and a bound on what one process keeps."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
import warnings

import jax
import pytest
from pairwise import pairwise

from rlcluster_lab.core import compile_cache
from rlcluster_lab.placement import programs


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path, keep_cache_setting):
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.cache_dir() == tmp_path / "xdg" / "rlcluster-lab" / "jax"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert compile_cache.cache_dir() == tmp_path / "jax"
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "ours"))
    assert compile_cache.cache_dir() == tmp_path / "ours"
    for off in ("off", "0", "false", "none"):
        monkeypatch.setenv(compile_cache.ENV, off)
        assert compile_cache.cache_dir() is None
        assert compile_cache.enable_compilation_cache() is None


CHILD = """
import sys, time
import jax
jax.config.update("jax_num_cpu_devices", 8)
from rlcluster_lab.core.compile_cache import enable_compilation_cache
print(enable_compilation_cache())
from rlcluster_lab import Scenario, build_cluster
cluster = build_cluster(Scenario(layout="reshaped", lora=True))
report = cluster.sync_weights()
print(report.moved_cross_device_bytes, report.minimum_cross_device_bytes)
"""


@pytest.mark.cluster
def test_a_second_process_reads_the_programs_the_first_wrote(tmp_path):
    """The persistent cache fills on the first run, serves the second, and a program read
    back from it is accounted exactly like one compiled here."""
    env = {**os.environ, compile_cache.ENV: str(tmp_path / "cache")}
    runs = [
        subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr
    entries = list((tmp_path / "cache").iterdir())
    assert entries, "the first run wrote no program to the cache"
    # The same figures from a compiled and from a cached program.
    assert runs[0].stdout.splitlines()[-1] == runs[1].stdout.splitlines()[-1]
    moved, minimum = map(int, runs[1].stdout.split()[-2:])
    assert moved == minimum > 0


# --- writes after the work (compile_cache.WriteBehind) ------------------------------------------


def _writer(monkeypatch, quiet: float, fail_on: object = None):
    """A WriteBehind over a recording write (raising for the entry ``fail_on``)."""
    monkeypatch.setattr(compile_cache, "QUIET_S", quiet)
    written: list[tuple[object, str]] = []

    def write(entry: object) -> None:
        if entry == fail_on:
            raise OSError("disk full")
        written.append((entry, threading.current_thread().name))

    return compile_cache.WriteBehind(write), written


def test_a_queued_write_waits_for_quiet_and_a_flush_writes_all_of_them_in_order(monkeypatch):
    writer, written = _writer(monkeypatch, quiet=3600.0)
    for entry in range(5):
        writer.put(entry)
    assert written == [] and writer.pending() == 5, "written while the work that compiled them goes on"
    writer.flush()
    assert [e for e, _ in written] == [0, 1, 2, 3, 4] and writer.pending() == 0


def test_the_writer_writes_once_compiling_pauses_on_its_own_thread(monkeypatch):
    writer, written = _writer(monkeypatch, quiet=0.0)
    writer.put("a")
    deadline = time.monotonic() + 60
    while writer.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert written == [("a", "compilation cache writer")]


def test_a_full_queue_is_written_without_waiting_for_quiet(monkeypatch):
    writer, written = _writer(monkeypatch, quiet=3600.0)
    monkeypatch.setattr(compile_cache, "MAX_PENDING", 3)
    for entry in range(3):
        writer.put(entry)
    deadline = time.monotonic() + 60
    while writer.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [e for e, _ in written] == [0, 1, 2]


def test_a_write_that_fails_warns_and_the_others_are_still_written(monkeypatch):
    writer, written = _writer(monkeypatch, quiet=3600.0, fail_on=1)
    for entry in range(3):
        writer.put(entry)
    with pytest.warns(RuntimeWarning, match="not written: OSError: disk full"):
        writer.flush()
    assert [e for e, _ in written] == [0, 2] and writer.pending() == 0
    writer.put(3)
    writer.flush()
    assert written[-1][0] == 3, "a failed write stopped the writer"


WRITE_BEHIND_CHILD = """
import os, sys
import jax
import jax.numpy as jnp
jax.config.update("jax_num_cpu_devices", 8)
from rlcluster_lab.core import compile_cache
compile_cache.QUIET_S = 3600.0
folder = compile_cache.enable_compilation_cache()
def files():
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(compile_cache.KEEP_PREFIX))
before = files()
jax.jit(lambda x: jnp.sin(x) * float(sys.argv[1]))(jnp.ones(3)).block_until_ready()
queued = compile_cache.pending_cache_writes()
assert files() == before, "written during the work"
if sys.argv[2] == "flush":
    compile_cache.flush_cache_writes()
    assert compile_cache.pending_cache_writes() == 0 and len(files()) > len(before)
print(queued, len(before))
"""


@pytest.mark.cluster
def test_a_program_reaches_the_disk_cache_by_a_flush_or_by_the_end_of_the_process(tmp_path):
    """Compiled, a program is queued, not written; a flush writes it, and so does the
    process's exit: a process that ends at once still leaves its programs for the next."""
    env = {**os.environ, compile_cache.ENV: str(tmp_path / "cache")}
    seen = []
    for scale, how in (("2.5", "flush"), ("3.5", "exit")):
        run = subprocess.run(
            [sys.executable, "-c", WRITE_BEHIND_CHILD, scale, how], env=env, capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, run.stderr
        queued, before = map(int, run.stdout.split())
        assert queued >= 1
        seen.append(before)
    after = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(compile_cache.KEEP_PREFIX)]
    assert len(after) > seen[1] > seen[0], "the exiting process's program never reached the disk"


# The rebuild loop's clusters, pairwise over layout x size x engine x LoRA.
REBUILDS = pairwise(
    {
        "layout": ["colocated", "reshaped", "split"],
        "size": ["tiny", "small"],
        "engine": ["vanilla", "vllm", "sglang_jax"],
        "lora": [False, True],
    },
    [
        ("colocated", "tiny", "vanilla", False),
        ("colocated", "small", "vllm", True),
        ("colocated", "small", "sglang_jax", False),
        ("reshaped", "tiny", "vllm", False),
        ("reshaped", "small", "vanilla", True),
        ("reshaped", "tiny", "sglang_jax", True),
        ("split", "small", "vanilla", False),
        ("split", "tiny", "vllm", True),
        ("split", "tiny", "sglang_jax", False),
    ],
)


TRIM_CHILD = """
import json, os, sys
import jax
jax.config.update("jax_num_cpu_devices", 8)
from rlcluster_lab.core.compile_cache import enable_compilation_cache
enable_compilation_cache(os.environ["RLCLUSTER_LAB_TEST_CACHE"])
import rlcluster_lab.app.scenario as scenario_module
from rlcluster_lab import GRPOLearner, LearnerConfig, Scenario, build_cluster
from rlcluster_lab.placement import programs
held, limit = programs.mapped_regions(), programs.mapping_limit()
programs.TRIM_FRACTION = (held + 120) / limit
trims, trim = [], programs.trim_compiled_programs
def counted(*args):
    trims.append(trim(*args))
    return trims[-1]
programs.trim_compiled_programs = scenario_module.trim_compiled_programs = counted
peak = 0
for i, (layout, size, engine, lora) in enumerate(json.loads(sys.argv[1])):
    cluster = build_cluster(Scenario(layout=layout, model_size=size, engine=engine, lora=lora, max_tokens=4))
    cluster.sync_weights()
    if i % 4 == 3:
        GRPOLearner(cluster, LearnerConfig(steps=1, prompts_per_step=1, group_size=2)).step()
    del cluster
    peak = max(peak, programs.mapped_regions())
print(json.dumps({"trims": trims, "peak": peak, "limit": limit}))
"""


@pytest.mark.slow
@pytest.mark.cluster
def test_varied_rebuilds_trim_again_and_again_and_stay_under_the_mapping_limit():
    """The lab's rebuild loop, in a fresh process: nine clusters over every layout, two sizes,
    every engine and LoRA, a sync each and a training step after the fourth and the eighth. A
    step's programs take about 320-370 mappings in a fresh process (each program's machine code
    in one piece, core.compile_options; about 600 when XLA:CPU split it), a build 20-30, so with
    the bound 120 above where the loop starts, the build after each step must trim (twice at
    least: the bound holds the loop, not only its first crossing), and the process never runs
    past the kernel's limit. A fresh process, because in one that ran other tests first XLA has
    mapped much of what a step needs already (a step then added as few as 64 mappings)."""
    if programs.mapped_regions() is None or programs.mapping_limit() is None:
        pytest.skip("no /proc/self/maps here: the mapping bound is a Linux matter")
    run = subprocess.run(
        [sys.executable, "-c", TRIM_CHILD, json.dumps(REBUILDS)], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert sum(out["trims"]) >= 2, f"the bound triggered {sum(out['trims'])} times in {len(out['trims'])} builds"
    assert out["peak"] < out["limit"]


# --- the trust boundary (issue 21): a cache whose files are run, or believed ---------------------


@pytest.fixture
def keep_cache_setting():
    """Tests below turn the cache on and off; the session's own folder comes back after each."""
    before = jax.config.jax_compilation_cache_dir
    yield
    jax.config.update("jax_compilation_cache_dir", before)


def _warnings_from(call):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = call()
    return result, [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]


def test_a_cache_folder_others_can_write_is_refused_with_one_warning(tmp_path, keep_cache_setting):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    result, said = _warnings_from(lambda: compile_cache.enable_compilation_cache(shared))
    assert result is None and jax.config.jax_compilation_cache_dir is None
    assert len(said) == 1 and "can be written by other users (mode 0777" in said[0]
    again, said = _warnings_from(lambda: compile_cache.enable_compilation_cache(shared))
    assert again is None and said == []  # one warning per folder, not one per call


def test_a_cache_folder_of_another_user_is_refused(tmp_path, monkeypatch, keep_cache_setting):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    monkeypatch.setattr(compile_cache.os, "getuid", lambda: os.stat(folder).st_uid + 1)
    result, said = _warnings_from(lambda: compile_cache.enable_compilation_cache(folder))
    assert result is None and len(said) == 1 and "not by this user" in said[0]


def test_a_jax_cache_folder_from_the_environment_is_turned_off_when_untrusted(
    tmp_path, monkeypatch, keep_cache_setting
):
    shared = tmp_path / "jax-shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(shared))
    jax.config.update("jax_compilation_cache_dir", str(shared))  # as JAX reads its own variable
    result, said = _warnings_from(compile_cache.enable_compilation_cache)
    assert result is None and jax.config.jax_compilation_cache_dir is None and len(said) == 1


def test_a_new_cache_folder_is_created_private(tmp_path, keep_cache_setting):
    folder = tmp_path / "a" / "new"
    assert compile_cache.enable_compilation_cache(folder) == folder
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert jax.config.jax_compilation_cache_dir == str(folder)
