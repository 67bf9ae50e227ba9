"""L2 memory per role, and the byte accounting of a reshard (L3) over random shardings."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from test_reshard import _cases

from rlcluster_lab import Scenario, build_cluster, memory_report, placement_report
from rlcluster_lab.measure import memory_of
from rlcluster_lab.measure.sync import TransferLog, shard_facts, sync_ledger, sync_report
from rlcluster_lab.placement.boxes import to_box
from rlcluster_lab.placement.buffers import state_bytes
from rlcluster_lab.placement.events import listening
from rlcluster_lab.placement.reshard import reshard_many

# Every example reshards onto fresh shardings and compiles: the count is the hypothesis profile's
# (tests/conftest.py: 12 in `make test`, 40 with HYPOTHESIS_PROFILE=thorough).
COMPILING = settings(deadline=None, derandomize=True)


# --- L2 on clusters ---------------------------------------------------------------


def _check_totals(mem: dict) -> None:
    """Every total is the sum of its parts."""
    assert mem["unique_bytes"] == sum(sum(k.values()) for k in mem["by_device"].values())
    assert mem["naive_bytes"] == sum(r["bytes"] for r in mem["by_role"].values())
    for r in mem["by_role"].values():
        assert r["bytes"] == sum(r["by_kind"].values()) == sum(sum(k.values()) for k in r["by_device"].values())


@pytest.mark.cluster
def test_l2_colocated_rollout_is_the_actor_counted_once():
    cluster = build_cluster(Scenario(layout="colocated"))
    mem = memory_report(cluster).to_json()
    _check_totals(mem)
    actor = state_bytes(nnx.state(cluster.actor_model))
    assert mem["by_role"]["actor"]["bytes"] == actor
    assert mem["by_role"]["rollout"]["bytes"] == actor
    groups = {tuple(g["roles"]): g["bytes"] for g in mem["shared"]}
    assert groups[("actor", "rollout")] == actor
    assert mem["naive_bytes"] - mem["unique_bytes"] == actor


@pytest.mark.cluster
def test_l2_split_holds_two_copies_and_nothing_shared():
    cluster = build_cluster(Scenario(layout="split"))
    mem = memory_report(cluster).to_json()
    _check_totals(mem)
    assert mem["shared"] == []
    assert mem["unique_bytes"] == mem["naive_bytes"]
    # The rollout copy lives only on the rollout devices, the actor only on its own.
    assert set(mem["by_role"]["rollout"]["by_device"]) == {"4", "5", "6", "7"}
    assert set(mem["by_role"]["actor"]["by_device"]) == {"0", "1", "2", "3"}


@pytest.mark.cluster
def test_l2_lora_reference_shares_the_backbone_unless_built_on_a_copy():
    shared = memory_report(build_cluster(Scenario(layout="split", lora=True))).to_json()
    ref = shared["by_role"]["reference"]["bytes"]
    groups = {tuple(g["roles"]): g["bytes"] for g in shared["shared"]}
    assert groups[("actor", "reference")] == ref
    copied = build_cluster(Scenario(layout="split", lora=True, lora_separate_base=True))
    assert any("avoidable copy" in w for w in copied.warnings)
    separate = memory_report(copied).to_json()
    assert not any("reference" in g["roles"] for g in separate["shared"])
    # P4's avoidable copy costs exactly one more backbone.
    assert separate["unique_bytes"] - shared["unique_bytes"] == ref


@pytest.mark.cluster
def test_l2_anchor_and_optimizer_are_entries_of_their_own():
    cluster = build_cluster(Scenario(layout="colocated", lora=True))
    mem = memory_report(cluster).to_json()
    assert mem["by_role"]["anchor"]["by_kind"] == {"pinned_host": state_bytes(nnx.state(cluster.actor_model))}
    adapters = state_bytes(nnx.state(cluster.actor_model, nnx.LoRAParam))
    # Adam: two moments per trainable (adapter) parameter, plus a replicated step count.
    assert mem["by_role"]["optimizer"]["bytes"] >= 2 * adapters
    assert mem["by_role"]["optimizer"]["bytes"] < 2 * adapters + 8 * 16


@pytest.mark.cluster
def test_l2_offload_puts_every_role_in_pinned_host():
    cluster = build_cluster(Scenario(layout="reshaped", lora=True, offload=True, with_reward=True, with_critic=True))
    mem = memory_report(cluster).to_json()
    _check_totals(mem)
    for role, r in mem["by_role"].items():
        assert set(r["by_kind"]) == {"pinned_host"}, role
    assert {"reward", "critic"} <= set(mem["by_role"])


@pytest.mark.cluster
def test_l2_trainable_anchor_pins_only_adapters():
    full = build_cluster(Scenario(layout="reshaped", lora=True, anchor="full"))
    part = build_cluster(Scenario(layout="reshaped", lora=True, anchor="trainable"))
    m_full = memory_report(full).to_json()
    m_part = memory_report(part).to_json()
    adapters = state_bytes(nnx.state(part.actor_model, nnx.LoRAParam))
    backbone = state_bytes(nnx.state(part.actor_model, nnx.Not(nnx.LoRAParam)))
    assert m_full["by_role"]["anchor"]["by_kind"] == {"pinned_host": adapters + backbone}
    # The trainable anchor reads its backbone from the actor: only adapters are pinned.
    assert m_part["by_role"]["anchor"]["by_kind"]["pinned_host"] == adapters
    assert m_full["unique_bytes"] - m_part["unique_bytes"] == backbone
    assert placement_report(part).to_json()["anchor"] == {
        "mode": "trainable",
        "memory_kind": "pinned_host",
        "bytes": adapters,
    }


@pytest.mark.cluster
def test_l2_every_counted_buffer_is_live():
    cluster = build_cluster(Scenario(layout="reshaped", lora=True, engine="vllm"))
    mem = memory_report(cluster).to_json()
    live = {}
    for x in jax.live_arrays():
        for s in x.addressable_shards:
            live[(s.device.id, s.data.unsafe_buffer_pointer())] = s.data.nbytes
    assert mem["unique_bytes"] <= sum(live.values())


@pytest.mark.cluster
def test_l2_allocator_figures_are_not_invented_on_cpu():
    cluster = build_cluster(Scenario())
    alloc = memory_report(cluster).to_json()["allocator"]
    assert alloc["available"] is False
    assert alloc["by_device"] == {}
    assert "memory_stats" in alloc["note"]


def test_l2_shared_buffer_counted_once_across_named_states():
    x = jax.device_put(np.ones((8, 4), np.float32), jax.devices()[0])
    mem = memory_of({"a": {"w": x}, "b": {"w": x, "v": x}}).to_json()
    assert mem["unique_bytes"] == 128
    assert mem["naive_bytes"] == 256
    assert mem["shared"] == [{"roles": ["a", "b"], "bytes": 128, "buffers": 1, "by_device": {"0": {"device": 128}}}]


# --- L3 accounting over random shardings -----------------------------------------------


def _lacking_elements(x: jax.Array, y: jax.Array) -> int:
    """Brute force: destination elements that no source shard on the same device holds."""
    shape = x.shape
    total = 0
    for s in y.addressable_shards:
        want = np.zeros(shape, bool)
        want[s.index] = True
        for t in x.addressable_shards:
            if t.device.id == s.device.id:
                want[t.index] = False
        total += int(want.sum())
    return total


def _accounted(case, copy, strategy):
    shape, src, dst = case
    host = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    x = jax.device_put(host, src)
    facts = shard_facts(x)
    log = TransferLog()
    with listening(log):
        (y,) = reshard_many([x], [dst], copy=copy, labels=["w"], strategy=strategy)
    jax.block_until_ready(y)
    rep = sync_report(
        sync_ledger({"w": facts}, {"w": y}, log),
        log,
        lora=False,
        seconds=0.0,
        new_anchor_shards=[],
        anchor_mode="full",
        anchor_seconds=0.0,
        global_step=1,
    )
    return host, x, y, rep


@COMPILING
@given(_cases(), st.booleans())
def test_l3_minimal_accounting_adds_up_and_moves_only_the_minimum(case, copy):
    host, x, y, rep = _accounted(case, copy, "minimal")
    physical = sum(s.data.nbytes for s in y.addressable_shards)
    assert rep.synced_bytes == physical
    assert rep.relayed_cross_device_bytes == 0
    assert rep.synced_bytes == rep.moved_cross_device_bytes + rep.copied_same_device_bytes + rep.reused_bytes
    assert rep.minimum_cross_device_bytes == 4 * _lacking_elements(x, y)
    assert rep.moved_cross_device_bytes == rep.minimum_cross_device_bytes
    assert rep.synced_logical_bytes == host.nbytes
    assert sum(rep.arrived_by_device.values()) == rep.moved_cross_device_bytes
    if copy:
        assert rep.reused_bytes == 0
    old = {(s.device.id, s.data.unsafe_buffer_pointer()) for s in x.addressable_shards}
    reused = sum(s.data.nbytes for s in y.addressable_shards if (s.device.id, s.data.unsafe_buffer_pointer()) in old)
    assert rep.reused_bytes == reused
    np.testing.assert_array_equal(np.asarray(y), host)


@COMPILING
@given(_cases(), st.booleans())
def test_l3_xla_accounting_adds_up_and_never_undercuts_the_minimum(case, copy):
    """The compiled program's collectives, traced per destination shard: every byte accounted for."""
    host, x, y, rep = _accounted(case, copy, "xla")
    physical = sum(s.data.nbytes for s in y.addressable_shards)
    assert rep.synced_bytes == physical
    assert rep.synced_bytes == (
        rep.moved_cross_device_bytes - rep.relayed_cross_device_bytes + rep.copied_same_device_bytes + rep.reused_bytes
    )
    assert rep.minimum_cross_device_bytes == 4 * _lacking_elements(x, y)
    # What arrived as destination data cannot be less than what the placement forces.
    assert rep.moved_cross_device_bytes - rep.relayed_cross_device_bytes >= rep.minimum_cross_device_bytes
    assert rep.excess_cross_device_bytes >= 0
    assert sum(rep.arrived_by_device.values()) == rep.moved_cross_device_bytes
    if copy:
        assert rep.reused_bytes == 0
    np.testing.assert_array_equal(np.asarray(y), host)


def test_l3_report_exposes_a_reshard_that_moves_more_than_needed(monkeypatch):
    """A planner that ignores the local copy makes the report show the excess."""
    from rlcluster_lab.placement import boxes, programs, route

    def wasteful(shape, src_boxes, dst_boxes):
        plans = boxes.plan_reshard(shape, src_boxes, dst_boxes)
        out = []
        for plan in plans:
            pieces = []
            for p in plan.pieces:
                others = [d for d, b in src_boxes if b == p.src_box and d != plan.device]
                pieces.append(boxes.Piece(others[0], p.src_box, p.box) if others else p)
            out.append(boxes.BlockPlan(plan.device, plan.box, tuple(pieces)))
        return out

    mesh_src = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("fsdp", "tp"))
    mesh_dst = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("fsdp", "tp"))
    P = jax.sharding.PartitionSpec
    x = jax.device_put(np.ones((8, 8), np.float32), jax.sharding.NamedSharding(mesh_src, P("fsdp", None)))
    dst = jax.sharding.NamedSharding(mesh_dst, P("fsdp", None))
    monkeypatch.setattr(route, "plan_reshard", wasteful)
    programs.clear_programs()  # schedules are cached per sharding set; plan afresh
    facts = shard_facts(x)
    log = TransferLog()
    with listening(log):
        (y,) = reshard_many([x], [dst], labels=["w"], strategy="minimal")
    rep = sync_report(
        sync_ledger({"w": facts}, {"w": y}, log),
        log,
        lora=False,
        seconds=0.0,
        new_anchor_shards=[],
        anchor_mode="full",
        anchor_seconds=0.0,
        global_step=1,
    )
    programs.clear_programs()
    assert rep.excess_cross_device_bytes > 0
    assert rep.moved_cross_device_bytes > rep.minimum_cross_device_bytes


def test_l3_minimum_counts_partial_overlap_only_for_the_rest():
    """A destination shard half covered by its own device's source shard needs only the other half."""
    from rlcluster_lab.placement.boxes import minimum_cross_device_elements

    src = [(0, ((0, 4), (0, 8))), (1, ((4, 8), (0, 8)))]
    dst = [(0, ((0, 8), (0, 4))), (1, ((0, 8), (4, 8)))]
    assert minimum_cross_device_elements(src, dst) == [16, 16]
    assert to_box((slice(None), slice(2, 4)), (3, 8)) == ((0, 3), (2, 4))
