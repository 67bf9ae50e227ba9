"""The warm start (lab.notebook.warm) and the bound on the persistent compilation cache's size on disk."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import warnings

import pytest

from rlcluster_lab.core import compile_cache
from rlcluster_lab.lab.notebook import warm

# ------------------------------------------------------------------ the bound on disk


def _file(folder, name: str, size: int, when: float):
    path = folder / name
    path.write_bytes(b"x" * size)
    os.utime(path, (when, when))
    return path


@pytest.fixture
def private(tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    return folder


def test_trimming_deletes_the_least_recently_used_files_down_to_nine_tenths(private):
    old = [_file(private, f"old{i}-cache", 1000, 1_000 + i) for i in range(5)]
    new = [_file(private, f"new{i}-cache", 1000, 9_000 + i) for i in range(5)]
    deleted, freed = compile_cache.trim_cache(private, 8_000)
    assert (deleted, freed) == (3, 3000)  # 10,000 bytes down to at most 7,200
    assert [p.exists() for p in old] == [False, False, False, True, True]
    assert all(p.exists() for p in new)


def test_a_cache_within_its_bound_is_left_alone(private):
    files = [_file(private, f"e{i}-cache", 1000, 1_000 + i) for i in range(3)]
    assert compile_cache.trim_cache(private, 3_000) == (0, 0)
    assert all(p.exists() for p in files)


def test_trimming_counts_subfolders_and_keeps_the_warm_start_files(private):
    (private / "rlcluster-lab-analysis").mkdir(mode=0o700)
    analysis = _file(private / "rlcluster-lab-analysis", "a.json", 4000, 1_000)
    record = _file(private, warm.RECORD, 4000, 500)
    entry = _file(private, "e-cache", 1000, 9_000)
    assert compile_cache.trim_cache(private, 6_000) == (1, 4000)  # 9,000 bytes down to at most 5,400
    assert not analysis.exists() and record.exists() and entry.exists()


def test_trimming_never_touches_a_folder_others_can_write(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    files = [_file(folder, f"e{i}-cache", 1000, 1_000 + i) for i in range(4)]
    assert compile_cache.trim_cache(folder, 1_000) == (0, 0)
    assert all(p.exists() for p in files)


def test_trimming_does_not_follow_links_out_of_the_folder(private, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = _file(outside, "precious", 5000, 1)
    (private / "link").symlink_to(outside, target_is_directory=True)
    (private / "file-link").symlink_to(victim)
    _file(private, "e-cache", 1000, 9_000)
    compile_cache.trim_cache(private, 500)
    assert victim.exists()


def test_the_bound_is_a_setting_in_megabytes(monkeypatch):
    monkeypatch.delenv(compile_cache.MAX_MB_ENV, raising=False)
    assert compile_cache.max_cache_bytes() == compile_cache.DEFAULT_MAX_MB * 2**20
    monkeypatch.setenv(compile_cache.MAX_MB_ENV, "1.5")
    assert compile_cache.max_cache_bytes() == int(1.5 * 2**20)
    for bad in ("0", "-3", "lots", "inf"):
        monkeypatch.setenv(compile_cache.MAX_MB_ENV, bad)
        with pytest.raises(ValueError, match="positive number of megabytes"):
            compile_cache.max_cache_bytes()


def test_turning_the_cache_on_trims_it_to_its_bound(private, monkeypatch, keep_cache_setting):
    files = [_file(private, f"e{i}-cache", 400_000, 1_000 + i) for i in range(5)]
    monkeypatch.setenv(compile_cache.MAX_MB_ENV, "1")
    assert compile_cache.enable_compilation_cache(private) == private
    assert sum(p.exists() for p in files) == 2  # 2,000,000 bytes down to at most 0.9 MiB


@pytest.fixture
def keep_cache_setting():
    import jax

    before = jax.config.jax_compilation_cache_dir
    yield
    jax.config.update("jax_compilation_cache_dir", before)


# ------------------------------------------------------------------ starting the warm-up


@pytest.fixture
def warm_env(private, monkeypatch):
    monkeypatch.setenv(compile_cache.ENV, str(private))
    monkeypatch.delenv(warm.ENV, raising=False)
    return private


def _waiting_child(release) -> list[str]:
    """A stand-in warm-up: waits until ``release`` exists (at most 60 s), then ends."""
    code = (
        "import os, sys, time\n"
        "t = time.monotonic()\n"
        f"while not os.path.exists({str(release)!r}) and time.monotonic() - t < 60: time.sleep(0.05)\n"
    )
    return [sys.executable, "-c", code]


@pytest.mark.cluster  # starts Python processes (stand-ins for the warm-up)
def test_the_warm_start_starts_one_process_and_not_a_second_while_it_runs(warm_env, tmp_path):
    release = tmp_path / "release"
    line = warm.start_warm_up(command=_waiting_child(release))
    assert line.startswith("warming the compilation cache in the background (process ")
    pid = int((warm_env / warm.LOCK).read_text())
    try:
        again = warm.start_warm_up(command=_waiting_child(release))
        assert again == f"the compilation cache is being warmed already (process {pid})"
    finally:
        release.touch()
        os.waitpid(pid, 0)
    # The process ended without removing its lock (a crash, say): the stale lock is no obstacle.
    line = warm.start_warm_up(command=[sys.executable, "-c", "pass"])
    assert line.startswith("warming the compilation cache in the background")
    os.waitpid(int((warm_env / warm.LOCK).read_text()), 0)


@pytest.mark.cluster  # starts a Python process (a stand-in for the warm-up)
def test_the_warm_up_process_runs_jax_on_the_cpu_alone_never_on_the_kernels_accelerator(warm_env, monkeypatch):
    """Only one process can hold a TPU chip, and the kernel that starts the warm-up holds it: the
    process starts with JAX on the CPU backend alone, however the kernel's environment names
    platforms. The stand-in writes the environment it was started with to the warm-up's log."""
    monkeypatch.setenv("JAX_PLATFORMS", "tpu,cpu")
    monkeypatch.setenv("JAX_PLATFORM_NAME", "tpu")
    monkeypatch.delenv("TPU_SKIP_MDS_QUERY", raising=False)
    show = "import json, os; print(json.dumps(dict(os.environ)))"
    line = warm.start_warm_up(command=[sys.executable, "-c", show])
    assert line.startswith("warming the compilation cache in the background")
    os.waitpid(int((warm_env / warm.LOCK).read_text()), 0)
    env = json.loads((warm_env / warm.LOG).read_text())
    assert env["JAX_PLATFORMS"] == "cpu" and "JAX_PLATFORM_NAME" not in env
    assert env["TPU_SKIP_MDS_QUERY"] == "1"


def test_a_warm_environment_starts_nothing(warm_env):
    (warm_env / warm.RECORD).write_text(json.dumps({"key": warm.warm_key()}))
    assert warm.start_warm_up(command=[sys.executable, "-c", "raise SystemExit(1)"]) == (
        "compilation cache already warm for this environment"
    )
    assert not (warm_env / warm.LOCK).exists()


def test_a_record_for_another_environment_is_not_warm(warm_env):
    (warm_env / warm.RECORD).write_text(json.dumps({"key": warm.warm_key(devices=4)}))
    assert not warm.is_warm(warm_env)
    (warm_env / warm.RECORD).write_text("not json")
    assert not warm.is_warm(warm_env)
    # Programs compiled with other CPU options are other cache entries: not warm either.
    other = {**warm.warm_key(), "cpu_compiler_options": {"xla_backend_optimization_level": 0}}
    (warm_env / warm.RECORD).write_text(json.dumps({"key": other}))
    assert not warm.is_warm(warm_env)
    # Nor programs of another precision (core.precision): the train step at the cluster's, say.
    key = warm.warm_key()
    exact = {"sampler": "highest", "log-probs": "highest"}
    assert key["matmul_precisions"] == {**exact, "scores": None, "train step": None}
    swapped = {**key, "matmul_precisions": {**key["matmul_precisions"], "train step": "highest"}}
    (warm_env / warm.RECORD).write_text(json.dumps({"key": swapped}))
    assert not warm.is_warm(warm_env)


def test_the_warm_start_is_off_by_setting_or_without_a_trusted_cache(warm_env, monkeypatch, tmp_path):
    monkeypatch.setenv(warm.ENV, "off")
    assert warm.start_warm_up(command=[sys.executable, "-c", "pass"]) == ""
    monkeypatch.delenv(warm.ENV)
    monkeypatch.setenv(compile_cache.ENV, "off")
    assert "cache is off" in warm.start_warm_up(command=[sys.executable, "-c", "pass"])
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv(compile_cache.ENV, str(shared))
    with pytest.warns(RuntimeWarning, match="can be written by other users"):
        assert "cannot be trusted" in warm.start_warm_up(command=[sys.executable, "-c", "pass"])
    assert not (shared / warm.LOCK).exists()


def _read_only(monkeypatch, folder):
    """``folder`` as on a read-only file system: every open that would write in it fails (EROFS)."""
    real = os.open

    def open_(path, flags, *args, **kwargs):
        if str(path).startswith(str(folder)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)


def test_a_read_only_cache_folder_is_one_warning_and_no_warm_start(warm_env, monkeypatch):
    _read_only(monkeypatch, warm_env)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lines = [warm.start_warm_up(command=[sys.executable, "-c", "raise SystemExit(1)"]) for _ in range(2)]
    assert lines == [f"warm start skipped: {warm_env} cannot be written (see the warning)"] * 2
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == [
        f"the warm start is off: {warm_env / warm.LOCK} cannot be written (Read-only file system); programs are "
        f"compiled when first needed instead. Make {warm_env} a writable folder of your own, set "
        f"{compile_cache.ENV} to one, or set {warm.ENV}=off"
    ]
    assert os.listdir(warm_env) == []


def test_setup_on_a_read_only_cache_folder_warns_and_goes_on(warm_env, monkeypatch, keep_cache_setting):
    from rlcluster_lab.lab.notebook.setup import setup

    _read_only(monkeypatch, warm_env)
    with pytest.warns(RuntimeWarning, match=r"the warm start is off: .*\(Read-only file system\)"):
        found = setup(quiet=True)
    assert f"warm start skipped: {warm_env} cannot be written (see the warning)" in found.notes


@pytest.mark.cluster  # starts a Python process
def test_warm_background_in_an_unusable_folder_is_one_warning_and_no_traceback(warm_env):
    (warm_env / warm.LOCK).mkdir()  # the lock's name taken by a folder: it cannot be opened for writing
    proc = subprocess.run(
        [sys.executable, "-m", "rlcluster_lab.lab.notebook.warm", "--background"],
        env={**os.environ, compile_cache.ENV: str(warm_env)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == f"warm start skipped: {warm_env} cannot be written (see the warning)\n"
    assert proc.stderr.count("RuntimeWarning: the warm start is off: ") == 1, proc.stderr
    assert "Is a directory" in proc.stderr


@pytest.mark.cluster  # starts Python processes (stand-ins for the warm-up)
def test_concurrent_callers_start_exactly_one_warm_up(warm_env, tmp_path, monkeypatch):
    # Four callers at once. The first to take the lock is held inside Popen until every other
    # caller has either given up or reached Popen itself, so a lock that another caller can take
    # meanwhile (an empty lock file read as stale) shows as a second process, every time.
    callers, release = 4, tmp_path / "release"
    state = {"returned": 0, "in_popen": 0}
    cond = threading.Condition()
    real = subprocess.Popen

    def popen(*args, **kwargs):
        with cond:
            state["in_popen"] += 1
            cond.notify_all()
            cond.wait_for(lambda: state["returned"] + state["in_popen"] == callers, timeout=60)
        return real(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    barrier = threading.Barrier(callers)
    lines: list[str] = []

    def call() -> None:
        barrier.wait()
        try:
            lines.append(warm.start_warm_up(command=_waiting_child(release)))
        finally:
            with cond:
                state["returned"] += 1
                cond.notify_all()

    threads = [threading.Thread(target=call) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    started = [line for line in lines if line.startswith("warming the compilation cache in the background")]
    pids = [int(line.split("(process ")[1].split(",")[0]) for line in started]
    try:
        assert len(started) == 1, lines
        others = [line for line in lines if line not in started]
        assert others == [f"the compilation cache is being warmed already (process {os.getpid()})"] * 3
        # Once it started, its pid is in the lock: the next caller names it.
        assert int((warm_env / warm.LOCK).read_text()) == pids[0]
        assert warm.start_warm_up(command=_waiting_child(release)) == (
            f"the compilation cache is being warmed already (process {pids[0]})"
        )
    finally:
        release.touch()
        for pid in pids:
            os.waitpid(pid, 0)


@pytest.mark.parametrize("name", [warm.LOG, warm.LOCK])
def test_the_warm_start_never_writes_through_a_link(warm_env, tmp_path, name):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (warm_env / name).symlink_to(victim)
    with pytest.warns(RuntimeWarning, match="is a symbolic link, which the warm start never writes through"):
        line = warm.start_warm_up(command=[sys.executable, "-c", "print('written')"])
    assert line == f"warm start skipped: {warm_env} cannot be written (see the warning)"
    assert victim.read_text() == "precious"


def test_the_warm_record_is_never_written_through_a_link(warm_env, tmp_path, monkeypatch, capsys):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (warm_env / warm.RECORD).symlink_to(victim)
    monkeypatch.setattr(warm, "warm_programs", lambda devices: {"seconds": 0.0})  # the compiling is not tested
    with pytest.warns(RuntimeWarning, match="is a symbolic link"):
        assert warm.main([]) == 1
    assert victim.read_text() == "precious"
    assert capsys.readouterr().out == f"warm start skipped: {warm_env} cannot be written (see the warning)\n"


def test_the_warmed_step_is_the_widgets_step():
    from rlcluster_lab.app.learner import LearnerConfig
    from rlcluster_lab.lab.widget.placement_lab import PlacementLab

    assert PlacementLab(build=False).step_config == LearnerConfig(**warm.STEP_SIZES)


# ------------------------------------------------------------------ what it warms

WARM = """
from rlcluster_lab.lab.notebook import warm
print(warm.warm_programs(8, [("colocated", True)]))
"""

FIRST_STEP = """
import jax
jax.config.update("jax_num_cpu_devices", 8)
from rlcluster_lab.core.compile_cache import count_compilations, enable_compilation_cache
enable_compilation_cache()
from rlcluster_lab import Scenario, build_cluster
from rlcluster_lab.app.learner import GRPOLearner, LearnerConfig
from rlcluster_lab.lab.notebook.warm import STEP_SIZES
with count_compilations() as built:
    cluster = build_cluster(Scenario(layout="colocated", lora=True))
    GRPOLearner(cluster, LearnerConfig(**STEP_SIZES)).step()
print("COMPILED", sorted({name for name, _, cached in built if not cached}))
print("READ", len([1 for _, _, cached in built if cached]))
"""


@pytest.mark.cluster
def test_after_the_warm_up_a_new_process_compiles_nothing_for_its_first_step(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, compile_cache.ENV: str(cache), "JAX_PLATFORMS": "cpu"}
    warmed = subprocess.run([sys.executable, "-c", WARM], env=env, capture_output=True, text=True, timeout=600)
    assert warmed.returncode == 0, warmed.stderr[-2000:]
    step = subprocess.run([sys.executable, "-c", FIRST_STEP], env=env, capture_output=True, text=True, timeout=600)
    assert step.returncode == 0, step.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in step.stdout.splitlines() if line.startswith(("COMPILED", "READ")))
    assert lines["COMPILED"] == "[]", lines
    assert int(lines["READ"]) >= 4


def test_a_lock_read_before_its_holder_wrote_its_pid_still_names_the_holder(tmp_path):
    # The holder takes the lock, then writes its pid: a caller reading the new, empty file in
    # between once said "another process" (a flaky line in the four-caller test).
    (tmp_path / warm.LOCK).write_bytes(b"")
    writer = threading.Timer(0.05, lambda: (tmp_path / warm.LOCK).write_text(f"{4321:<20}"))
    writer.start()
    try:
        assert warm._lock_pid(tmp_path) == 4321
    finally:
        writer.join()
    (tmp_path / warm.LOCK).write_bytes(b"")
    assert warm._lock_pid(tmp_path, wait=0.02) is None  # a lock nobody writes: unnamed, after a bounded wait
