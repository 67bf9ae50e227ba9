"""Tunix's own RLCluster (the [tunix] extra) beside the lab's: the twelve standard scenarios, and a few
more where the documented differences show (random configurations: tests/test_tunix_random.py).

layout {colocated, reshaped, split} x LoRA {off, on} x engine {vanilla, vllm}. vLLM does not run
on CPU, so the vllm scenarios hand Tunix the lab's vllm-style stand-in as a Tunix engine class
(``rlcluster_lab.tunix.standin``); Tunix's cluster takes every decision itself. Each scenario is
built once per module on both sides (``side_by_side``) and the tests read the comparison.
Without Tunix installed, only the tests that need no Tunix run; the others skip, saying why.
"""

from __future__ import annotations

import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from rlcluster_lab import Role, Scenario
from rlcluster_lab import tunix as rt
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.meshes import make_mesh
from rlcluster_lab.measure.sync import flat_leaves
from rlcluster_lab.model import is_lora
from rlcluster_lab.placement.boxes import shard_boxes
from rlcluster_lab.tunix import differences, extra
from rlcluster_lab.tunix import sync as tunix_sync

# Tunix's trainer enters its meshes with `with mesh:`, which this JAX deprecates; the warning is Tunix's.
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*with mesh.*context manager has been deprecated:DeprecationWarning"),
    pytest.mark.cluster,  # the lab's cluster and Tunix's, built side by side (and a fresh interpreter)
]

needs_tunix = pytest.mark.skipif(not rt.available(), reason=f"Tunix is not installed: {rt.INSTALL_HINT}")

SCENARIOS = [
    Scenario(layout=layout, lora=lora, engine=engine)
    for layout in ("colocated", "reshaped", "split")
    for lora in (False, True)
    for engine in ("vanilla", "vllm")
]
IDS = [f"{s.layout}-{'lora' if s.lora else 'full'}-{s.engine}" for s in SCENARIOS]
# Beyond the twelve: offload, where one more documented difference shows (the optimizer state's memory kind).
OFFLOAD = Scenario(layout="split", lora=True, offload=True)
# The vllm stand-in with offload: the lab offloads its rollout, Tunix only a vanilla engine's.
OWN_COPY_OFFLOAD = Scenario(layout="split", engine="vllm", offload=True)
# Custom meshes: the actor and the rollout on devices 4 and 6 as (1, 2), which the vllm stand-in keeps
# as its own mesh (P7 fires, the mesh stays), the reference on all eight.
KEPT_MESH = Scenario(lora=True, engine="vllm")
KEPT_MESHES = (("actor", (4, 6), (1, 2)), ("rollout", (4, 6), (1, 2)), ("reference", tuple(range(8)), (2, 4)))
# Shows only where JAX's host copy happens to be aligned (its address is the allocator's), so no
# scenario is sure to show it; test_l2_shards_tunix_holds_as_views_* makes it show by aligning the copies.
BY_CHANCE = ("device-put-host-view",)


def _meshes(spec) -> dict[Role, jax.sharding.Mesh]:
    devices = {d.id: d for d in jax.devices()}
    return {Role(role): make_mesh([devices[i] for i in ids], shape) for role, ids, shape in spec}


@pytest.fixture(scope="module")
def compared():
    """(Scenario, meshes) -> its side-by-side, each built (both clusters, one sync each) once per module."""
    done: dict[tuple, rt.SideBySide] = {}

    def get(scenario: Scenario, meshes=None) -> rt.SideBySide:
        if (scenario, meshes) not in done:
            r2m = _meshes(meshes) if meshes is not None else None
            done[scenario, meshes] = rt.side_by_side(scenario, role_to_mesh=r2m)
        return done[scenario, meshes]

    return get


def _rows(result: rt.SideBySide, rule: str) -> list[rt.Row]:
    rows = [r for r in result.rows if r.rule == rule]
    assert rows, f"no row for {rule}"
    return rows


def _assert_equal(result: rt.SideBySide, rule: str) -> None:
    for row in _rows(result, rule):
        assert row.agree, f"{row.item}: lab {row.lab!r} vs Tunix {row.tunix!r}"


# ------------------------------------------------------------------------------ without Tunix


def test_importing_the_lab_never_imports_tunix():
    code = (
        "import sys, rlcluster_lab, rlcluster_lab.tunix, rlcluster_lab.cli.main; "
        "rlcluster_lab.Scenario; "
        "assert 'tunix' not in sys.modules, 'tunix was imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_a_missing_tunix_says_how_to_install_the_extra(monkeypatch):
    monkeypatch.setattr(extra, "available", lambda: False)
    with pytest.raises(rt.TunixMissingError, match=r'pip install -e "\.\[tunix\]"'):
        rt.require("this test")
    with pytest.raises(rt.TunixMissingError, match="building Tunix's RLCluster"):
        rt.build_tunix_cluster(Scenario())


# ------------------------------------------------------------------------------ decisions equal


@needs_tunix
@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_p1_actor_rollout_link_equal(compared, scenario):
    _assert_equal(compared(scenario), "P1")


@needs_tunix
@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_p1_the_flow_says_same_devices_alike_for_both_clusters(compared, scenario):
    # One test of "same devices" (rules.sharing.same_devices): the flow's P1 row reads it from
    # either report, and both clusters place the actor and the rollout on the same meshes.
    from rlcluster_lab.lab.figures.flow import flow_rows

    result = compared(scenario)
    lab_row, tunix_row = (
        next(r for r in flow_rows(report) if r.key == "P1").detail
        for report in (result.lab_report, result.tunix_report.to_json())
    )
    expected = "yes" if scenario.layout in ("colocated", "reshaped") else "no"
    assert f"same devices: {expected}" in lab_row, lab_row
    assert tunix_row == lab_row


@needs_tunix
@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_p2_reference_link_and_propagation_equal(compared, scenario):
    _assert_equal(compared(scenario), "P2")


@needs_tunix
@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_p3_rollout_model_equal(compared, scenario):
    _assert_equal(compared(scenario), "P3")


@needs_tunix
@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_p4_reference_backbone_equal(compared, scenario):
    _assert_equal(compared(scenario), "P4")


@needs_tunix
@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_p5_loading_equal(compared, scenario):
    _assert_equal(compared(scenario), "P5")


@needs_tunix
@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_p7_engine_mesh_equal(compared, scenario):
    result = compared(scenario)
    _assert_equal(result, "P7")
    # The stand-in exposes its own mesh, so P7 fires on Tunix's side exactly for vllm.
    assert result.tunix_report.mesh_overridden_by_engine == (scenario.engine == "vllm")


@needs_tunix
@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_p8_anchor_equal(compared, scenario):
    _assert_equal(compared(scenario), "P8")


@needs_tunix
@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_p12_trainable_parameters_equal(compared, scenario):
    _assert_equal(compared(scenario), "P12")


@needs_tunix
@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_l2_memory_per_role_equal(compared, scenario):
    result = compared(scenario)
    for row in _rows(result, "L2"):
        if row.item == "L2 optimizer":
            continue  # the optimizer's counters: a documented difference, checked below
        assert row.agree, f"{row.item}: {row.lab!r} vs {row.tunix!r}"


# ------------------------------------------------------------------------------ differences


@needs_tunix
@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_every_differing_row_is_a_documented_difference_observed_in_that_scenario(compared, scenario):
    result = compared(scenario)
    assert not result.unexplained, "\n" + result.table()
    observed = {d.id for d in result.differences if d.observed}
    assert {r.difference for r in result.differing} <= observed


@needs_tunix
def test_p4_p5_p14_offload_decisions_equal_and_differences_documented(compared):
    result = compared(OFFLOAD)
    for rule in ("P4", "P5", "P12"):
        _assert_equal(result, rule)
    for row in _rows(result, "L2"):
        # Memory per role and memory kind after construction: both offload the models (P14).
        assert row.agree or row.difference is not None, f"{row.item}: {row.lab!r} vs {row.tunix!r}"
    assert not result.unexplained, "\n" + result.table()


@needs_tunix
def test_every_documented_scenario_difference_is_observed_in_some_scenario(compared):
    results = [compared(s) for s in [*SCENARIOS, OFFLOAD, OWN_COPY_OFFLOAD]] + [compared(KEPT_MESH, KEPT_MESHES)]
    observed = {d.id for r in results for d in r.differences if d.observed}
    expected = {d.id for d in differences.SCENARIO_DIFFERENCES} - set(BY_CHANCE)
    assert observed - set(BY_CHANCE) == expected
    for result in results:
        assert not result.unexplained, "\n" + result.table()


@needs_tunix
def test_p14_offload_own_copy_engine_is_the_rollouts_memory_kind_alone(compared):
    result = compared(OWN_COPY_OFFLOAD)
    row = next(r for r in result.rows if r.item == "L2 rollout")
    assert row.difference == "offload-own-copy-engine"
    assert row.lab["by_kind"] == {"pinned_host": row.tunix["by_kind"]["device"]}


@needs_tunix
def test_p13_own_copy_engine_copies_where_tunix_device_put_keeps_the_actors_buffers(compared):
    result = compared(KEPT_MESH, KEPT_MESHES)
    lab, tunix = result.lab_sync, result.tunix_sync.report
    # The engine's shardings are the actor's: device_put keeps every shard, the lab's engine copies each.
    assert tunix.reused_bytes == tunix.synced_bytes > 0 and lab.reused_bytes == 0
    assert lab.copied_same_device_bytes == lab.synced_bytes
    row = next(r for r in result.rows if r.item == "P13 sync bytes")
    assert row.difference == "own-copy-engine-sync"


@needs_tunix
def test_p7_an_engine_mesh_equal_to_the_one_asked_replaces_nothing_on_either_side(compared):
    result = compared(KEPT_MESH, KEPT_MESHES)
    assert result.tunix_report.engine == "vllm"
    row = next(r for r in result.rows if r.item == "P7 mesh replaced")
    assert row.lab is False and row.tunix is False
    _assert_equal(result, "P7")


def _aligned_host_copies(models):
    """Give every array of ``models`` a host copy at a 64-byte-aligned address, the one JAX's
    device_put reads on its host path: CPU then hands back views into it (as it does by chance)."""
    for model in models.values():
        for x in flat_leaves(nnx.state(model)).values():
            value = np.asarray(x)
            raw = np.empty(value.nbytes + 64, dtype=np.uint8)
            start = -raw.ctypes.data % 64
            copy = raw[start : start + value.nbytes].view(value.dtype).reshape(value.shape)
            copy[...] = value
            copy.flags.writeable = False
            x._npy_value = copy  # jax.Array's cached host value
    return models


@needs_tunix
def test_l2_shards_tunix_holds_as_views_of_one_host_copy_are_the_documented_cpu_artifact(monkeypatch):
    from rlcluster_lab.tunix import build

    made = build.build_models
    monkeypatch.setattr(build, "build_models", lambda *a: _aligned_host_copies(made(*a)))
    # Actor and rollout both resharded from the handed actor (on the reference's mesh) through host.
    meshes = (("actor", (0, 7), (1, 2)), ("rollout", (0, 4, 1, 5), (1, 4)), ("reference", (0, 6), (2, 1)))
    result = rt.side_by_side(Scenario(), role_to_mesh=_meshes(meshes), sync=False)
    check = next(d for d in result.differences if d.id == "device-put-host-view")
    assert check.observed, check
    rows = {r.item: r for r in result.rows}
    assert not rows["L2 shared buffers"].agree
    assert rows["L2 shared buffers"].difference == "device-put-host-view"
    assert not result.unexplained, "\n" + result.table()


@needs_tunix
@pytest.mark.parametrize("check", rt.DIFFERENCES[len(differences.SCENARIO_DIFFERENCES) :])
def test_documented_config_difference_is_observed(check):
    results = {d.id: d for d in rt.config_differences()}
    assert results[check].observed, results[check]


# ------------------------------------------------------------------------------ the sync (P13, L3)


def _layout_changes(cluster) -> bool:
    """Whether some synced leaf's shards hold other boxes, mesh position by mesh position."""
    actor = cluster.actor_trainer.model
    kind = nnx.LoRAParam if is_lora(actor) else nnx.Param
    src = nnx.to_flat_state(nnx.state(actor, kind))
    dst = dict(nnx.to_flat_state(nnx.state(cluster.rollout.model(), kind)))
    for path, var in src:
        a, b = var.get_value(), dst[path].get_value()
        by_pos = []
        for x in (a, b):
            boxes = dict(shard_boxes(x))
            by_pos.append([boxes[d.id] for d in np.asarray(x.sharding.mesh.devices).flat])
        if by_pos[0] != by_pos[1]:
            return True
    return False


@needs_tunix
@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_p13_tunix_sync_is_refused_exactly_where_a_leaf_changes_layout(compared, scenario):
    result = compared(scenario)
    refused = not result.tunix_sync.completed
    assert refused == _layout_changes(result.tunix_report.cluster)
    assert result.lab_sync is not None  # the lab's sync of the same scenario runs under the same guard


@needs_tunix
def test_p13_a_refused_tunix_sync_changes_nothing(compared):
    refused = [compared(s).tunix_sync for s in SCENARIOS if not compared(s).tunix_sync.completed]
    assert refused
    for sync in refused:
        assert "host-to-device" in sync.error
        assert sync.rollout_unchanged and not sync.anchor_repinned
        assert sync.global_steps_after == sync.global_steps_before
        assert sync.report is None


@needs_tunix
def test_p13_reshaped_full_parameter_sync_is_refused_by_the_guard(compared):
    sync = compared(Scenario(layout="reshaped")).tunix_sync
    assert sync.outcome == tunix_sync.REFUSED
    assert "disallowed" in sync.guard


@needs_tunix
def test_l3_completed_tunix_sync_accounts_for_every_byte(compared):
    done = [compared(s).tunix_sync for s in SCENARIOS if compared(s).tunix_sync.completed]
    assert done
    for sync in done:
        rep = sync.report
        assert rep.synced_bytes == (
            rep.moved_cross_device_bytes
            - rep.relayed_cross_device_bytes
            + rep.copied_same_device_bytes
            + rep.reused_bytes
        )
        assert rep.moved_cross_device_bytes >= rep.minimum_cross_device_bytes
        assert sync.global_steps_after == sync.global_steps_before + 1 and sync.anchor_repinned
        # What device_put copied is inferred, and each such leaf says so.
        for leaf in rep.leaves:
            if leaf.synced_bytes > leaf.reused_bytes:
                assert leaf.method.startswith("inferred")


# ------------------------------------------------------------------------------ inspect


@needs_tunix
def test_l2_inspect_counts_a_buffer_several_roles_hold_once(compared):
    memory = compared(Scenario(layout="colocated", lora=True)).tunix_report.memory
    backbone = memory.by_role["reference"]["bytes"]
    groups = {tuple(g["roles"]): g["bytes"] for g in memory.shared}
    assert groups[("actor", "rollout", "reference")] == backbone
    assert memory.naive_bytes - memory.unique_bytes >= 2 * backbone


@needs_tunix
def test_inspect_of_a_cluster_built_elsewhere_says_what_it_cannot_read():
    build = rt.build_tunix_cluster(Scenario(layout="split", engine="vllm"))
    report = rt.inspect(build.cluster)
    assert all(d["source"].startswith("observed") for d in report.decisions)
    assert not [d for d in report.decisions if d["rule"] == "P5"]
    assert any("not readable from the object alone" in n for n in report.notes)
    # P7 replaced the rollout mesh; the one asked for is gone from the object, so it is not shown.
    assert report.mesh_overridden_by_engine and "rollout" not in report.config_role_to_mesh


@needs_tunix
def test_lab_figures_draw_a_tunix_report(compared):
    from rlcluster_lab.lab.figures.flow import flow_rows
    from rlcluster_lab.lab.figures.memory import memory_by_role
    from rlcluster_lab.lab.figures.placement import decision_flow, device_grid
    from rlcluster_lab.lab.figures.sync import sync_bytes

    result = compared(Scenario(layout="split", lora=True))
    report = result.tunix_report.to_json()
    fired = {row.key: row.fired for row in flow_rows(report)}
    assert fired["P3"] == "second_copy" and fired["P4"] == "one backbone"
    for draw, arg in (
        (decision_flow, report),
        (device_grid, report),
        (memory_by_role, report["memory"]),
        (sync_bytes, result.tunix_sync.report.to_json()),
    ):
        assert draw(arg).startswith("<svg")


@needs_tunix
def test_p8_side_by_side_refuses_the_labs_trainable_anchor():
    with pytest.raises(ConfigError, match="anchor='full'"):
        rt.side_by_side(Scenario(lora=True, anchor="trainable"))


@needs_tunix
@pytest.mark.parametrize(
    ("meshes", "message"),
    [
        ("colocated", "role_to_mesh must be a dict from Role to jax.sharding.Mesh, got str"),
        ({Role.ACTOR: None}, r"role_to_mesh has no mesh for rollout"),
        ({Role.ACTOR: "mesh", Role.ROLLOUT: "mesh"}, r"role_to_mesh\[actor\] is str"),
    ],
)
def test_side_by_side_refuses_bad_role_to_mesh_naming_it_before_building(monkeypatch, meshes, message):
    from rlcluster_lab.tunix import compare

    monkeypatch.setattr(compare, "build_tunix_cluster", lambda *a, **k: pytest.fail("built before checking"))
    with pytest.raises(ConfigError, match=message):
        rt.side_by_side(Scenario(), role_to_mesh=meshes)


@needs_tunix
def test_build_refuses_an_engine_tunix_cannot_run_here():
    with pytest.raises(ConfigError, match="sglang_jax"):
        rt.build_tunix_cluster(Scenario(engine="sglang_jax"))
