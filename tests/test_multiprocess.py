"""The cluster over JAX's multi-process runtime: 2 processes x 4 CPU devices on this machine.

One launch builds all six layout x LoRA cases in the same two processes
(they start and compile once), syncs each, and exercises every operation in
one of them; the tests below read its reports. Each case's decisions must
equal those of the same scenario built here in one process, the bytes that
cross the process boundary must equal the least the shardings allow, and a
worker killed mid-run must end the run with its error and leave no process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rlcluster_lab import Scenario, build_cluster, placement_report
from rlcluster_lab.cli.main import main
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.gathering import exchange, held_within, host_values
from rlcluster_lab.core.knobs import describe
from rlcluster_lab.multiprocess.jobs import PROMPTS
from rlcluster_lab.multiprocess.launcher import LaunchError, LaunchSettings, launch, run_reports
from rlcluster_lab.multiprocess.report import (
    ProcessesDisagree,
    merge_reports,
    minimum_crossing_elements,
    process_split,
)

CASES = [(layout, lora) for layout in ("colocated", "reshaped", "split") for lora in (False, True)]
# Every operation in one case, the one whose programs run on one process each and whose host
# values (tokens, metrics, log-probs) come from the other process: split, full weights crossing.
# (Each exercised case compiles the sampler and the training step again: about a minute on two
# cores. run_reports(..., exercise=True) runs them in every case.)
EXERCISED = {("split", False)}
# Rollouts in the other process beside the six cases: offloaded to pinned host (P14: the move
# crosses in device memory and the memory kind comes after; it once assembled pinned-host
# placeholders), and the vllm-style engine's own layout (a program first lays the weights out on
# the trainer's devices, then the shards cross; its provenance probe once failed on the process
# that holds none of that program's inputs).
ELSEWHERE = {
    "offload": {"layout": "split", "lora": True, "offload": True},
    "vllm": {"layout": "split", "engine": "vllm"},
}
# The sampler's log-probs against the scorers', and the rollout's against the live actor's after
# the sync: the same weights, so equal up to float32 rounding of differently sharded programs.
CLOSE = 1e-4


# ---------------------------------------------------------------------------- without processes


def test_one_process_reads_values_and_facts_as_before():
    import jax.numpy as jnp

    assert exchange({"a": 1}, "fact") == [{"a": 1}]
    assert [v.tolist() for v in host_values([jnp.arange(3), np.ones(2)])] == [[0, 1, 2], [1.0, 1.0]]
    assert held_within({1}, {1, 2}, "subset") and not held_within(set(), {1}, "empty")
    assert not held_within({3}, {1, 2}, "not a subset")


def test_minimum_crossing_counts_each_block_once_per_receiving_process():
    box = ((0, 4), (0, 8))  # one 32-element block
    halves = [((0, 2), (0, 8)), ((2, 4), (0, 8))]
    # Replicated on four devices of process 1, held by process 0 only: crosses once.
    assert minimum_crossing_elements([(0, box)] * 4, [(1, box)] * 4) == {1: 32}
    # Process 1 already holds one half of what it needs.
    assert minimum_crossing_elements([(0, halves[0]), (1, halves[1])], [(1, box)] * 2) == {1: 16}
    # Both processes need the whole block; each holds one half.
    got = minimum_crossing_elements([(0, halves[0]), (1, halves[1])], [(0, box), (1, box)])
    assert got == {0: 16, 1: 16}


def test_process_split_sorts_copies_by_the_processes_they_join():
    owner = {0: 0, 1: 0, 2048: 1, 2049: 1}
    across, within, pairs = process_split([(0, 2048, 10), (2048, 2049, 10), (1, 0, 5)], owner)
    assert (across, within, pairs) == (10, 15, {"0->1": 10, "1->1": 10, "0->0": 5})


def test_processes_that_decided_differently_are_an_error():
    one = _fake_report(0, [{"rule": "P1", "branch": "linked"}])
    other = _fake_report(1, [{"rule": "P1", "branch": "not_linked"}])
    with pytest.raises(ProcessesDisagree, match="process 1 reports a different 'decisions'"):
        merge_reports([one, other])
    merged = merge_reports([one, _fake_report(1, one["decisions"])])
    assert merged["process_count"] == 2
    assert merged["memory"]["unique_bytes"] == 2 * one["memory"]["unique_bytes"]
    assert merged["memory"]["by_device"] == {"0": {"device": 100}, "2048": {"device": 100}}
    assert merged["by_host"]["1"]["memory"]["by_role"] == {"actor": 100}


def _fake_report(index, decisions):
    device = str(2048 * index)
    memory = {
        "units": "physical bytes",
        "source": "measured",
        "by_role": {"actor": {"bytes": 100, "by_kind": {"device": 100}, "by_device": {device: {"device": 100}}}},
        "by_device": {device: {"device": 100}},
        "shared": [],
        "unique_bytes": 100,
        "naive_bytes": 100,
        "allocator": {"available": False, "note": "none", "by_device": {}},
    }
    facts = {
        "sharing_map": {},
        "rollout_branch": "shared",
        "rollout_shares_actor_weights": True,
        "reference_shares_backbone": False,
        "role_to_mesh": {},
        "config_role_to_mesh": {},
        "mesh_overridden_by_engine": False,
        "engine": "vanilla",
        "offload_to_cpu": False,
        "lora": False,
        "warnings": [],
        "platform": "cpu",
        "device_count": 8,
    }
    return {
        **facts,
        "decisions": decisions,
        "anchor": {"mode": "full", "memory_kind": "pinned_host", "bytes": 10},
        "memory": memory,
        "sync": None,
        "process": {"index": index, "device_ids": [int(device)], "host": "here"},
    }


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        (LaunchSettings(processes=0), "processes must be between 1 and 16"),
        (LaunchSettings(processes=2, devices_per_process=True), "devices_per_process must be an int"),
        (LaunchSettings(processes=2, timeout_s=0), "timeout_s must be a positive"),
        (LaunchSettings(processes=16, devices_per_process=1024), "between 1 and 4096"),
    ],
)
def test_launch_settings_that_cannot_work_are_refused(settings, fragment):
    with pytest.raises((ConfigError, TypeError), match=fragment):
        settings.check()


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, OSError])
def test_the_run_folder_is_removed_however_the_launch_ends(tmp_path, monkeypatch, interrupt):
    """Ctrl-C (or a failure) while the workers start left a rlcluster-lab-processes-* folder behind."""
    import tempfile

    from rlcluster_lab.multiprocess import launcher

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def stopped(*args, **kwargs):
        raise interrupt()

    monkeypatch.setattr(launcher.subprocess, "Popen", stopped)
    # A process that cannot be started is a launch that could not start, said so.
    with pytest.raises(LaunchError if interrupt is OSError else interrupt):
        launch({"kind": "report"}, LaunchSettings(processes=2, devices_per_process=1))
    assert list(tmp_path.iterdir()) == []


def _no_sockets(monkeypatch):
    """A runtime with no sockets at all (some sandboxes): creating one fails with errno 97."""
    import errno
    import socket

    def refused(*args, **kwargs):
        raise OSError(errno.EAFNOSUPPORT, os.strerror(errno.EAFNOSUPPORT))

    monkeypatch.setattr(socket, "socket", refused)


def test_without_sockets_a_launch_says_why_and_starts_nothing(monkeypatch):
    """Notebook 09 on a runtime with no sockets stopped with a bare OSError: [Errno 97]."""
    from rlcluster_lab.multiprocess import launcher

    _no_sockets(monkeypatch)
    started = []
    monkeypatch.setattr(launcher.subprocess, "Popen", lambda *a, **k: started.append(a))
    why = launcher.cannot_launch()
    assert why.startswith("open a loopback TCP socket ([Errno 97] ") and "find each other" in why
    with pytest.raises(LaunchError, match=r"could not start: this runtime cannot open a loopback TCP socket"):
        run_reports([Scenario()])
    assert started == []


def test_without_a_second_process_a_launch_says_why(monkeypatch):
    import errno

    from rlcluster_lab.multiprocess import launcher

    def refused(*args, **kwargs):
        raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))

    monkeypatch.setattr(launcher.subprocess, "Popen", refused)
    assert launcher.cannot_launch().startswith("start another Python process ([Errno 11] ")
    with pytest.raises(LaunchError, match=r"could not start: this runtime cannot start another Python process"):
        run_reports([Scenario()])


@pytest.mark.cluster  # starts Python processes (stand-ins for the workers)
def test_workers_run_jax_on_the_cpu_alone_never_on_the_callers_accelerator(monkeypatch):
    """Only one process can hold a TPU chip, and the kernel that launches holds it: the workers
    start with JAX on the CPU backend alone, however the caller's environment names platforms."""
    from rlcluster_lab.multiprocess import launcher

    monkeypatch.setenv("JAX_PLATFORMS", "tpu,cpu")
    monkeypatch.setenv("JAX_PLATFORM_NAME", "tpu")
    monkeypatch.delenv("TPU_SKIP_MDS_QUERY", raising=False)
    real, seen = subprocess.Popen, []

    def recorded(cmd, **kwargs):
        seen.append((cmd, kwargs["env"]))
        return real([sys.executable, "-c", "raise SystemExit(3)"], **kwargs)  # a worker that fails at once

    monkeypatch.setattr(launcher.subprocess, "Popen", recorded)
    with pytest.raises(LaunchError, match="exit status 3"):
        launch({"kind": "report"}, LaunchSettings(processes=2, devices_per_process=1))
    assert len(seen) == 2
    for cmd, env in seen:
        assert cmd[1:3] == ["-m", "rlcluster_lab.multiprocess.worker"]
        assert env["JAX_PLATFORMS"] == "cpu" and "JAX_PLATFORM_NAME" not in env
        assert env["TPU_SKIP_MDS_QUERY"] == "1"  # a TPU VM's workers never ask its metadata server


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--processes", "0"], "--processes must be at least 1"),
        (["--timeout", "10"], "use it with --processes"),
        (["--processes", "2", "--devices", "6"], "drop --devices"),
        (
            ["--processes", "2", "--layout", "split", "--devices-per-process", "1", "--lora-rank", "0"],
            "--lora-rank must be at least 1",
        ),
        # The devices are processes x devices-per-process: those are the flags to change, not --devices.
        (
            ["--processes", "3", "--devices-per-process", "1", "--layout", "split"],
            "not 3. Use 'colocated' here, or run with more devices. The flag to change: --layout (or "
            "--devices-per-process, --processes).",
        ),
    ],
)
def test_bad_process_flags_exit_2_before_anything_starts(capsys, args, fragment):
    assert main(["report", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and fragment in err


def test_a_scenario_the_processes_cannot_form_is_refused_before_they_start():
    # 3 processes x 1 device: the split layout needs an even device count.
    with pytest.raises(ConfigError, match="even number of devices"):
        run_reports([Scenario(layout="split")], processes=3, devices_per_process=1)
    with pytest.raises(ConfigError, match="minimal reshard strategy"):
        run_reports([Scenario(layout="split", reshard="minimal")], processes=2)


# ---------------------------------------------------------------------------- two processes


@pytest.fixture(scope="module")
def launched():
    """The six cases and the rollouts of ELSEWHERE, built by one launch of two processes (each with 4 CPU devices)."""
    start = time.monotonic()
    extra = [Scenario(**knobs) for knobs in ELSEWHERE.values()]
    reports = run_reports(
        [Scenario(layout=layout, lora=lora) for layout, lora in CASES] + extra,
        processes=2,
        devices_per_process=4,
        sync=True,
        exercise=[case in EXERCISED for case in CASES] + [False] * len(extra),
        timeout=1800,
    )
    print(f"\n2 processes, {len(CASES) + len(extra)} cases: {time.monotonic() - start:.1f} s")
    return {**dict(zip(CASES, reports)), **dict(zip(ELSEWHERE, reports[len(CASES) :]))}


def _normalised(decisions, order):
    """Decisions with every device id replaced by its position among all devices (process 0's
    devices first), so two runs over different ids but the same arrangement compare equal."""
    position = {device: p for p, device in enumerate(order)}

    def walk(value, key=None):
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [position[v] if key == "device_ids" else walk(v) for v in value]
        return value

    return walk(decisions)


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "lora"), CASES)
@pytest.mark.cluster
def test_two_processes_decide_as_one_process_does(launched, layout, lora):
    data = launched[(layout, lora)]
    assert data["process_count"] == 2  # merging checked that both processes took the same decisions
    order = data["by_host"]["0"]["device_ids"] + data["by_host"]["1"]["device_ids"]
    assert len(order) == 8 and order[4] != 4  # process 1's devices have ids of their own

    cluster = build_cluster(Scenario(layout=layout, lora=lora))
    sync = cluster.sync_weights()
    here = placement_report(cluster, sync=sync).to_json()
    assert _normalised(data["decisions"], order) == _normalised(here["decisions"], list(range(8)))
    assert data["rollout_branch"] == here["rollout_branch"]
    assert data["rollout_shares_actor_weights"] == here["rollout_shares_actor_weights"]
    assert data["reference_shares_backbone"] == here["reference_shares_backbone"]
    # Memory: the same placement holds the same bytes per role, now spread over two hosts.
    assert {r: v["bytes"] for r, v in data["memory"]["by_role"].items()} == {
        r: v["bytes"] for r, v in here["memory"]["by_role"].items()
    }
    hosts = data["by_host"]
    assert sum(h["memory"]["unique_bytes"] for h in hosts.values()) == data["memory"]["unique_bytes"]
    assert data["memory"]["unique_bytes"] == here["memory"]["unique_bytes"]
    if layout == "split":
        # The trainer's roles live on process 0's devices, the rollout's on process 1's.
        assert set(hosts["0"]["memory"]["by_role"]) >= {"actor", "reference", "anchor", "optimizer"}
        assert set(hosts["1"]["memory"]["by_role"]) == {"rollout"}
    else:
        assert hosts["0"]["memory"]["unique_bytes"] == hosts["1"]["memory"]["unique_bytes"]
    # Each process measured its own four devices, and the merged reports say so.
    assert data["memory"]["where"] == data["sync"]["where"] == "2 processes of 4 simulated CPU devices each"
    # The sync moved what one process moves, in total.
    for key in ("synced_bytes", "moved_cross_device_bytes", "minimum_cross_device_bytes", "synced_logical_bytes"):
        assert data["sync"][key] == here["sync"][key], key
    # Its transient peak, each process walking its own devices: the same pinned-host bytes per device as
    # one process walks (none: the anchor is written over its old buffers, P8), and it leaves what it found.
    peak, one = data["sync"]["transient_peak"], here["sync"]["transient_peak"]
    assert peak["after"] == {} and peak["chunks"] == one["chunks"] == 1
    pinned = [sorted(n for k in p["by_device"].values() if (n := k.get("pinned_host", 0))) for p in (peak, one)]
    assert pinned[0] == pinned[1]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ELSEWHERE))
@pytest.mark.cluster
def test_a_rollout_in_another_process_is_placed_and_synced_as_in_one_process(launched, name):
    data, knobs = launched[name], ELSEWHERE[name]
    order = data["by_host"]["0"]["device_ids"] + data["by_host"]["1"]["device_ids"]
    cluster = build_cluster(Scenario(**knobs))
    here = placement_report(cluster, sync=cluster.sync_weights()).to_json()
    assert _normalised(data["decisions"], order) == _normalised(here["decisions"], list(range(8)))
    kinds = [{r: (v["bytes"], v["by_kind"]) for r, v in d["memory"]["by_role"].items()} for d in (data, here)]
    assert kinds[0] == kinds[1]
    if knobs.get("offload"):
        assert "pinned_host" in kinds[0]["rollout"][1]  # offloaded as in one process (P14)
    keys = ("synced_bytes", "moved_cross_device_bytes", "minimum_cross_device_bytes", "relayed_cross_device_bytes")
    for key in keys:
        assert data["sync"][key] == here["sync"][key], key


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "lora"), CASES)
@pytest.mark.cluster
def test_bytes_across_processes_equal_their_minimum(launched, layout, lora):
    sync = launched[(layout, lora)]["sync"]
    p = sync["processes"]
    # Moved: read from the compiled programs' collectives and the copies made; minimum: from the
    # shardings. Every cross-device byte either crossed a process boundary or stayed in one.
    assert p["cross_process_bytes"] == p["minimum_cross_process_bytes"]
    assert p["within_process_bytes"] == p["minimum_within_process_bytes"]
    assert p["cross_process_bytes"] + p["within_process_bytes"] == sync["moved_cross_device_bytes"]
    assert sync["moved_cross_device_bytes"] == sync["minimum_cross_device_bytes"]
    assert sync["synced_bytes"] == (
        sync["moved_cross_device_bytes"]
        - sync["relayed_cross_device_bytes"]
        + sync["copied_same_device_bytes"]
        + sync["reused_bytes"]
    )
    if layout == "colocated":
        assert p["cross_process_bytes"] == p["within_process_bytes"] == 0  # shared: nothing moves
    if layout == "split":
        # Everything the rollout holds came from the trainer's process, each block once.
        assert p["cross_process_bytes"] == sync["synced_logical_bytes"] > 0
        assert set(p["by_process_pair"]) <= {"0->1", "1->1"}


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "lora"), sorted(EXERCISED))
@pytest.mark.cluster
def test_every_operation_runs_across_processes(launched, layout, lora):
    first, second = launched[(layout, lora)]["exercise_by_process"]
    # Every process read back the same tokens and the same optimizer metrics.
    assert first["tokens"] == second["tokens"]
    assert first["metrics"] == second["metrics"]
    # A NaN on a block only the second process holds is flagged on both, in device and host
    # memory, each process reading its own shards (nothing compiled).
    for checks in (first, second):
        assert checks["finite_flags"] == {"flags": [True, False, True, False], "programs_built": 0}
        # The facts exchanged so far (every construction's, every sync's and step's): the
        # coordination service keeps at most the last two of each process.
        assert 0 < checks["stored_facts"] <= 4
    for checks in (first, second):
        assert checks["sampler_vs_rollout"] < CLOSE
        assert checks["anchor_vs_rollout"] < CLOSE
        # The step changed the actor's log-probs; the sync carried the change to the rollout
        # (across processes in the split layout): afterwards it scores as the trained actor does.
        assert checks["step_changed_log_probs"] > CLOSE
        assert checks["rollout_vs_trained_actor_after_sync"] < CLOSE
    if layout == "split":
        # Models drawn on each host and placed: the same weights as one process's, so the
        # same samples from the same seed.
        here = build_cluster(Scenario(layout=layout, lora=lora)).generate(list(PROMPTS))
        assert here.tokens.tolist() == first["tokens"]


def _children(pid):
    """Process ids whose parent is ``pid`` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.cluster
def test_a_worker_that_raises_ends_the_run_with_its_own_error():
    pids = []
    # Both workers refuse the job; whichever exits first is the one reported.
    with pytest.raises(LaunchError, match=r"process [01] of 2 failed after .*ValueError: unknown job kind") as info:
        launch({"kind": "no such job"}, LaunchSettings(processes=2, devices_per_process=1), on_start=pids.extend)
    assert info.value.process_id in (0, 1) and info.value.returncode == 1
    assert "Traceback" in info.value.log_tail and "unknown job kind" in info.value.log_tail  # where it raised
    assert len(pids) == 2 and not [p for p in pids if _alive(p)]


@pytest.mark.slow
@pytest.mark.cluster
def test_a_configuration_the_workers_refuse_is_refused_in_the_launchs_terms():
    # 3 processes x 2 devices: the standard (3, 2) mesh cannot split the model's 64-wide dimensions,
    # which only the workers, holding the devices, see. A refusal (as one process gives it, naming the
    # launch's flags), not a crash report; every worker stopped.
    pids = []
    with pytest.raises(ConfigError, match="total size 3, which does not divide it") as info:
        run_reports([Scenario()], processes=3, devices_per_process=2, on_start=pids.extend)
    assert not isinstance(info.value, LaunchError) and "failed after" not in str(info.value)
    cli = describe(info.value, "cli")
    assert cli.endswith(
        "no other model size fits these meshes either. The flag to change: --devices-per-process (or --processes)."
    )
    assert len(pids) == 3 and not [p for p in pids if _alive(p)]


@pytest.mark.slow
@pytest.mark.cluster
def test_a_killed_worker_ends_the_run_with_its_error_and_no_orphans():
    cmd = [sys.executable, "-m", "rlcluster_lab", "report", "--processes", "2", "--layout", "split", "--sync"]
    cli = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        workers = []
        for line in cli.stderr:  # progress lines, then the error
            if not workers:
                workers = _children(cli.pid)
            if line.startswith("[process 1") and "built" in line:
                break
        assert len(workers) == 2, workers
        victim = next(w for w in workers if "--process-id\x001\x00" in Path(f"/proc/{w}/cmdline").read_text())
        os.kill(victim, signal.SIGKILL)  # mid-run: process 1 is about to sync
        # A generous safeguard only: the run ends on the failure, long before its own deadline.
        _, err = cli.communicate(timeout=600)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: process 1 of 2 failed after") and "killed by SIGKILL" in last
    assert "did not finish within" not in last  # the failure, not the deadline, ended it
    assert not [w for w in workers if _alive(w)]


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "lora"), CASES)
@pytest.mark.cluster
def test_the_planner_per_host_equals_two_processes_measured(launched, layout, lora):
    """L4 at small scale: the planner, told this machine's eight devices are two hosts of four,
    gives each host the bytes per role that host's process measured on its own shards, and the
    sync bytes that must cross hosts equal those that crossed processes (each against its minimum)."""
    import dataclasses

    from rlcluster_lab.planner.plan import plan_scenario
    from rlcluster_lab.planner.tables import local_topology

    data = launched[(layout, lora)]
    plan = plan_scenario(
        Scenario(layout=layout, lora=lora), dataclasses.replace(local_topology(), devices_per_host=4, host_ids=None)
    )
    assert len(plan.per_host) == 2
    for host in plan.per_host:
        measured = data["by_host"][str(host.host)]["memory"]["by_role"]
        planned = {role: sum(kinds.values()) for role, kinds in host.by_role.items() if sum(kinds.values())}
        assert planned == measured, host.host
    crossing = data["sync"]["processes"]
    assert sum(h.sync_cross_host_bytes for h in plan.per_host) == crossing["cross_process_bytes"]
    assert sum(h.sync_within_host_bytes for h in plan.per_host) == crossing["within_process_bytes"]
