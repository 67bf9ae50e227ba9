"""Compiled programs: a persistent cache on disk, and a bound on what one process keeps."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import jax
import pytest

from rlcluster_lab import Scenario, build_cluster
from rlcluster_lab.app.learner import GRPOLearner, LearnerConfig
from rlcluster_lab.core import compile_cache
from rlcluster_lab.placement import programs


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
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


@pytest.mark.slow
def test_sixty_varied_rebuilds_stay_under_the_mapping_limit(monkeypatch):
    """The lab's rebuild loop: 60 clusters over every layout, two sizes, every engine and
    LoRA, a sync each and a training step every fifteenth. With the bound set just above where
    the process starts, it must trim at least once and never run past the kernel's limit."""
    held, limit = programs.mapped_regions(), programs.mapping_limit()
    if held is None or limit is None:
        pytest.skip("no /proc/self/maps here: the mapping bound is a Linux matter")
    monkeypatch.setattr(programs, "TRIM_FRACTION", (held + 4000) / limit)
    trims = []
    real = programs.trim_compiled_programs
    monkeypatch.setattr(programs, "trim_compiled_programs", lambda *a: trims.append(real(*a)) or trims[-1])
    import rlcluster_lab.app.scenario as scenario_mod

    monkeypatch.setattr(scenario_mod, "trim_compiled_programs", programs.trim_compiled_programs)
    combos = itertools.cycle(
        itertools.product(
            ["colocated", "reshaped", "split"], ["tiny", "small"], ["vanilla", "vllm", "sglang_jax"], [False, True]
        )
    )
    peak = 0
    for i in range(60):
        layout, size, engine, lora = next(combos)
        cluster = build_cluster(Scenario(layout=layout, model_size=size, engine=engine, lora=lora, max_tokens=4))
        cluster.sync_weights()
        if i % 15 == 14:
            GRPOLearner(cluster, LearnerConfig(steps=1, prompts_per_step=1, group_size=2)).step()
        del cluster
        peak = max(peak, programs.mapped_regions())
    assert any(trims), "the bound never triggered"
    assert peak < limit
    jax.clear_caches()
