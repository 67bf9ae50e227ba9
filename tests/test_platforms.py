"""Accelerator-only branches, exercised on CPU: a stand-in chip, a default backend that is not
the cluster's, device ids shared across platforms. Every platform decision reads the devices
of the arrays and meshes at hand, never JAX's default backend."""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import rlcluster_lab as rl
from rlcluster_lab import ClusterConfig, Role, Scenario, build_cluster, layout_meshes, placement_report
from rlcluster_lab.core.config import ConfigError
from rlcluster_lab.core.devices import devices_words
from rlcluster_lab.core.limits import TooLargeError
from rlcluster_lab.core.meshes import make_mesh
from rlcluster_lab.lab.notebook import setup as notebook
from rlcluster_lab.measure import allocator_stats
from rlcluster_lab.placement.transfers import shard_key


class Chip:
    """A stand-in accelerator device: what a mesh and the set-up read of a device."""

    def __init__(self, i: int, platform: str = "gpu", stats: dict | None = None) -> None:
        self.id, self.platform, self.device_kind, self.process_index = i, platform, "Stand-in chip", 0
        self._stats = stats

    def memory_stats(self):
        return self._stats

    def __repr__(self) -> str:
        return f"Chip({self.platform}:{self.id})"


def test_setup_on_a_single_gpu_builds_on_cpu_devices_beside_it_and_never_restarts(monkeypatch):
    cpus = jax.devices("cpu")
    chip = Chip(0)
    real = jax.devices
    monkeypatch.setattr(notebook.jax, "devices", lambda platform=None: [chip] if platform is None else real(platform))
    updates = []
    monkeypatch.setattr(notebook.jax.config, "update", lambda k, v: updates.append(k))
    lab = rl.setup(8, quiet=True)
    assert lab.accelerator == "gpu" and lab.accelerator_devices == (chip,)
    assert list(lab.devices) == cpus and lab.simulated and lab.platform == "cpu"
    assert lab.reachable == ("colocated", "reshaped", "split")
    assert "jax_platforms" not in updates  # no restart, so no platform list that could name 'gpu'
    assert "simulated CPU devices beside it" in lab.summary()


def test_setup_with_use_accelerator_builds_on_the_chip(monkeypatch):
    chip = Chip(0, "tpu")
    real = jax.devices
    monkeypatch.setattr(notebook.jax, "devices", lambda platform=None: [chip] if platform is None else real(platform))
    lab = rl.setup(8, quiet=True, use="accelerator")
    assert lab.devices == (chip,) and lab.platform == "tpu" and not lab.simulated
    assert "the layouts that fit on the 1 tpu device(s): colocated, reshaped" in lab.summary()
    assert lab.devices_for("reshaped") == (chip,)
    with pytest.raises(
        ValueError, match="no devices here hold the 'split' layout; reachable here: colocated, reshaped"
    ):
        lab.devices_for("split")


@pytest.mark.parametrize("kind", ["TPU v5 lite", "NVIDIA H100"])
@pytest.mark.parametrize("chip_id", [0, 3])
def test_on_one_chip_the_layouts_that_fit_one_device_are_built_on_it_and_split_beside_it(monkeypatch, kind, chip_id):
    """A TPU (or GPU) runtime's single chip: colocated and reshaped (the same chip, another mesh) are
    built on the chip, split on the simulated CPU devices beside it; the summary and the layout
    control's labels say which devices each is built on."""
    cpus = jax.devices("cpu")
    chip = Chip(chip_id, "tpu" if kind.startswith("TPU") else "gpu")
    chip.device_kind = kind
    real = jax.devices
    monkeypatch.setattr(notebook.jax, "devices", lambda platform=None: [chip] if platform is None else real(platform))
    lab = rl.setup(8, quiet=True)
    assert [(f.devices, f.layouts) for f in lab.families] == [
        ((chip,), ("colocated", "reshaped")),
        (tuple(cpus), ("split",)),
    ]
    assert lab.devices_for("colocated") == lab.devices_for("reshaped") == (chip,)
    assert lab.devices_for("split") == tuple(cpus) == lab.devices
    labels = [f.label(layout) for f in lab.families for layout in f.layouts]
    assert labels == [
        f"colocated on {kind} chip {chip_id}",
        f"reshaped on {kind} chip {chip_id}",
        "split on 8 simulated CPU devices",
    ]
    summary = lab.summary()
    assert f"colocated, reshaped: built on {kind} chip {chip_id}" in summary
    assert "split: built on 8 simulated CPU devices" in summary and "not reachable" not in summary


def test_without_an_accelerator_every_layout_is_one_family_on_the_simulated_devices():
    lab = rl.setup(8, quiet=True)
    assert lab.families == ()
    families = lab.layout_families()
    assert [(f.devices, f.layouts, f.where) for f in families] == [
        (lab.devices, ("colocated", "reshaped", "split"), "8 simulated CPU devices")
    ]
    assert all(lab.devices_for(layout) == lab.devices for layout in ("colocated", "reshaped", "split"))
    with pytest.raises(ValueError, match="no devices here hold the 'ring' layout"):
        lab.devices_for("ring")


@pytest.mark.parametrize(
    "devices,words",
    [
        ([Chip(0, "tpu")], "Stand-in chip 0"),
        ([Chip(5, "gpu")], "Stand-in chip 5"),
        ([Chip(0, "tpu"), Chip(1, "tpu")], "2 Stand-in chips"),
        (jax.devices("cpu"), "8 simulated CPU devices"),
        (jax.devices("cpu")[:4], "4 simulated CPU devices"),
        (jax.devices("cpu")[:1], "1 CPU device"),
    ],
)
def test_devices_are_named_in_words(devices, words):
    assert devices_words(devices) == words


def test_devices_in_words_take_one_platform():
    with pytest.raises(ValueError, match="one platform's devices"):
        devices_words([Chip(0, "tpu"), jax.devices("cpu")[0]])
    with pytest.raises(ValueError, match="one platform's devices"):
        devices_words([])


@pytest.mark.cluster
def test_a_cpu_cluster_keeps_its_guard_platform_and_memory_kinds_when_the_default_backend_is_a_gpu(monkeypatch):
    """A cluster on simulated CPU devices beside a GPU: the GPU is JAX's default backend, yet the
    sync is guarded (P13), the report says cpu, and memory kinds are the CPU devices' own."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    cluster = build_cluster(Scenario(layout="reshaped", lora=True))
    report = placement_report(cluster, sync=cluster.sync_weights()).to_json()
    p13 = [d for d in report["decisions"] if d["rule"] == "P13"][-1]
    assert p13["values"]["transfer_guard"] is True
    assert report["platform"] == "cpu" and report["device_count"] == len(jax.devices("cpu"))
    assert report["anchor"]["memory_kind"] == "pinned_host"
    assert report["memory"]["allocator"]["note"].startswith("the cpu devices report no allocator figures")
    # Bytes read from the compiled program, whatever the default backend (never inferred).
    assert report["sync"]["method"].startswith("measured") and report["sync"]["reshard_strategy"] == "xla"
    assert report["sync"]["moved_cross_device_bytes"] == report["sync"]["minimum_cross_device_bytes"] > 0


@pytest.mark.cluster
def test_operations_default_to_the_roles_devices():
    """Arrays made without a placement inside an operation (keys, prompts) land on the role's
    devices, not on JAX's default device: the role context enters its mesh's first device."""
    cluster = build_cluster(Scenario(layout="split"))
    with cluster.state.contexts.enter(Role.ROLLOUT):
        x = jax.numpy.zeros(3)
        key = jax.random.key(0)
    rollout = set(cluster.role_to_mesh[Role.ROLLOUT].devices.flat)
    assert x.devices() <= rollout and key.devices() <= rollout
    assert jax.devices()[0] not in rollout  # the split layout's rollout is devices 4-7


def test_shard_identity_includes_the_platform():
    def shard(device):
        data = types.SimpleNamespace(unsafe_buffer_pointer=lambda: 1234)
        return types.SimpleNamespace(device=device, data=data)

    cpu0 = jax.devices("cpu")[0]
    assert shard_key(shard(cpu0)) != shard_key(shard(Chip(0, "tpu")))


def test_a_mesh_of_devices_this_process_lacks_is_refused_by_platform():
    ghost = Mesh(np.array([Chip(0, "tpu")]).reshape(1, 1), ("fsdp", "tp"))
    r2m = layout_meshes("colocated")
    with pytest.raises(ConfigError, match="tpu device id"):
        ClusterConfig(role_to_mesh={**r2m, Role.ROLLOUT: ghost})


def test_one_cluster_runs_on_one_platform(monkeypatch):
    chips = [Chip(i, "gpu") for i in range(8)]
    real = jax.devices
    monkeypatch.setattr(jax, "devices", lambda platform=None: chips if platform == "gpu" else real(platform))
    r2m = layout_meshes("colocated")
    with pytest.raises(ConfigError, match="mixes platforms"):
        ClusterConfig(role_to_mesh={**r2m, Role.ROLLOUT: make_mesh(chips, (2, 4))})


def test_allocator_figures_come_from_the_devices_given_and_say_what_they_cover():
    stats = {"bytes_in_use": 10, "peak_bytes_in_use": 20, "bytes_limit": 75}
    out = allocator_stats([Chip(0, "gpu", stats), Chip(1, "gpu", stats)])
    assert out["available"] and out["by_device"]["1"]["bytes_limit"] == 75
    assert "preallocates 75%" in out["note"]
    assert not allocator_stats(jax.devices("cpu"))["available"]


@pytest.mark.cluster
def test_p11_log_probs_are_computed_at_the_configured_precision():
    seen = []
    cluster = build_cluster(Scenario())
    with cluster.state.contexts.enter(Role.ACTOR):
        seen.append(jax.config.jax_default_matmul_precision)
    assert seen == ["highest"]
    with pytest.raises(ConfigError, match="matmul_precision"):
        ClusterConfig(role_to_mesh=layout_meshes("colocated"), matmul_precision="fastest")


def test_on_devices_with_memory_of_their_own_the_plan_is_compared_before_building(monkeypatch):
    """On an accelerator the planner's resident bytes per device are compared with what each
    device's allocator has free (``memory_stats()``), before a model is built. Devices that report
    no figures (CPU) are left to the host check; stand-ins report them here."""
    import rlcluster_lab.app.scenario as scenario_module

    scenario = Scenario()
    config = scenario_module.validate(scenario)
    real = jax.devices

    def chips(free: int):
        # What check_memory sees of this platform's devices: stand-ins with allocator figures.
        stats = {"bytes_limit": free + 1000, "bytes_in_use": 1000}
        stand_ins = [Chip(d.id, "cpu", stats) for d in real("cpu")]
        seen = types.SimpleNamespace(devices=lambda platform=None: stand_ins if platform == "cpu" else real(platform))
        monkeypatch.setattr(scenario_module, "jax", seen)

    def no_build(*_args, **_kwargs):
        raise AssertionError("models were built past the devices' memory")

    monkeypatch.setattr(scenario_module, "build_models", no_build)
    chips(free=10**9)
    scenario_module.check_memory(scenario, config)  # roomy devices: accepted
    chips(free=50_000)  # less than the tiny cluster's share of one device
    with pytest.raises(TooLargeError, match=r"device 0 but it has 48.8 KiB free .* memory_stats"):
        scenario_module.check_memory(scenario, config)
    with pytest.raises(TooLargeError, match="memory_stats"):
        scenario_module.build_cluster(scenario)


@pytest.mark.cluster
def test_beside_a_single_chip_the_plan_of_this_machine_is_of_the_devices_the_lab_builds_on(monkeypatch):
    """Notebooks 05 and 08 on a TPU runtime: the chip is JAX's default backend (one host, one
    device) and the lab builds on the 8 simulated CPU devices beside it. The planner's local
    topology is of those devices, so the planned peak sits beside the measured one and a plan of
    the lab's devices as two processes of four has two hosts (it was the chip's one host, with 8
    devices: "host_ids names 1 hosts for 8 devices")."""
    import dataclasses

    from rlcluster_lab.lab.experiments import sync_peaks
    from rlcluster_lab.planner.plan import plan_scenario
    from rlcluster_lab.planner.tables import local_topology

    cpus = jax.devices("cpu")
    scenario = Scenario(layout="reshaped", lora=True)
    cluster = build_cluster(scenario, devices=cpus)
    cluster.sync_weights()
    syncs = {"reshaped, LoRA": cluster.sync_weights().to_json()}
    del cluster
    chip = Chip(0, "tpu", {"bytes_limit": 16 * 2**30, "bytes_in_use": 0})
    real_devices, real_local = jax.devices, jax.local_devices
    monkeypatch.setattr(jax, "devices", lambda platform=None: [chip] if platform is None else real_devices(platform))
    monkeypatch.setattr(jax, "local_devices", lambda backend=None: real_local(backend=backend) if backend else [chip])
    assert local_topology().platform == "tpu"  # the default: JAX's default devices, the chip

    rows = sync_peaks.planned_peak_rows(cpus, {"reshaped, LoRA": scenario}, syncs)  # notebook 05
    assert [r["every device agrees"] for r in rows] == [True, True]
    assert all(r["planned"] == r["measured"] for r in rows)
    topo = local_topology(cpus)
    assert (topo.platform, topo.ids(), topo.host_ids) == ("cpu", tuple(d.id for d in cpus), (0,) * len(cpus))
    assert topo.memory_per_device is None  # the CPU devices' figure, not the chip's
    two_processes = dataclasses.replace(topo, devices_per_host=4, host_ids=None)  # notebook 08
    plan = plan_scenario(Scenario(layout="split", lora=True), two_processes)
    assert [h.host for h in plan.per_host] == [0, 1] and plan.sync["cross_host_bytes"] > 0
    with pytest.raises(ValueError, match="one platform's devices"):
        local_topology([chip, *cpus])
