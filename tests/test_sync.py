"""P13 measured (L3): what a sync moves, pairwise over layout x LoRA x engine x strategy; the cheaper anchor."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from pairwise import pairwise

from rlcluster_lab import Scenario, SyncReport, TrainBatch, build_cluster, placement_report
from rlcluster_lab.cluster import sync as sync_module
from rlcluster_lab.measure import flat_leaves
from rlcluster_lab.measure.sync import SyncObserver
from rlcluster_lab.placement import events
from rlcluster_lab.placement.buffers import buffer_keys, state_bytes
from rlcluster_lab.rules.steps import SyncOrder, p13_sync_order

pytestmark = pytest.mark.cluster  # every sync here is a live cluster's

LAYOUTS = ["colocated", "reshaped", "split"]
ENGINES = ["vanilla", "vllm", "sglang_jax"]


def _filtered(cluster):
    kind = nnx.LoRAParam if cluster.trainable_is_lora else nnx.Param
    return nnx.state(cluster.actor_model, kind), nnx.state(cluster.rollout.model(), kind)


# Pairwise over layout x LoRA x engine x strategy, each branch below being a matter of one
# factor or two; and on every layout the xla strategy runs with an engine that keeps the config
# mesh, where it must move exactly the minimum, since what XLA moves depends on the meshes. The
# reshaped layout takes the minimal strategy with full weights only, the case test_plan.py
# compiles too (its programs are read back from the compilation cache).
SYNC_CASES = pairwise(
    {"layout": LAYOUTS, "lora": [False, True], "engine": ENGINES, "reshard": ["xla", "minimal"]},
    [
        ("colocated", False, "vanilla", "xla"),
        ("colocated", True, "vllm", "minimal"),
        ("colocated", True, "sglang_jax", "minimal"),
        ("reshaped", False, "vanilla", "minimal"),
        ("reshaped", True, "vllm", "xla"),
        ("reshaped", False, "sglang_jax", "xla"),
        ("split", True, "vanilla", "minimal"),
        ("split", False, "vllm", "xla"),
        ("split", True, "sglang_jax", "xla"),
    ],
)


@pytest.mark.parametrize(("layout", "lora", "engine", "reshard"), SYNC_CASES, ids=lambda v: str(v))
def test_p13_sync_bytes_match_the_shardings(layout, lora, engine, reshard):
    cluster = build_cluster(Scenario(layout=layout, lora=lora, engine=engine, reshard=reshard))
    source, _ = _filtered(cluster)
    source_keys = buffer_keys(source)
    logical = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(source))
    rep = cluster.sync_weights()  # under P13's CPU transfer guard
    assert isinstance(rep, SyncReport)
    _, dest = _filtered(cluster)
    # Units: physical bytes, every destination shard counted.
    assert rep.synced_bytes == state_bytes(dest)
    assert rep.synced_logical_bytes == logical
    # Every destination byte: arrived from another device, made on its own, or reused.
    assert rep.synced_bytes == (
        rep.moved_cross_device_bytes - rep.relayed_cross_device_bytes + rep.copied_same_device_bytes + rep.reused_bytes
    )
    assert rep.moved_cross_device_bytes - rep.relayed_cross_device_bytes >= rep.minimum_cross_device_bytes
    if reshard == "minimal" or engine != "vllm":
        # The minimal strategy moves exactly what the shardings force, and so does XLA for
        # the lab's layouts; onto the vllm engine's rearranged mesh XLA may move more
        # (test_p13_xla_moves_more_than_the_minimum_onto_the_vllm_mesh).
        assert rep.moved_cross_device_bytes == rep.minimum_cross_device_bytes
        assert rep.excess_cross_device_bytes == rep.relayed_cross_device_bytes == 0
    assert sum(rep.arrived_by_device.values()) == rep.moved_cross_device_bytes
    assert rep.method.startswith("measured")
    if lora:
        assert {leaf.path.rsplit("/", 1)[-1] for leaf in rep.leaves} == {"lora_a", "lora_b"}
    if layout == "colocated" and engine == "vanilla":
        # Shared: the proof is buffer identity, nothing moved or copied.
        assert rep.reused_bytes == rep.synced_bytes
        assert rep.moved_cross_device_bytes == rep.copied_same_device_bytes == 0
        assert buffer_keys(dest) == source_keys
    elif layout == "split":
        # Disjoint devices: every synced byte crosses.
        assert rep.moved_cross_device_bytes - rep.relayed_cross_device_bytes == rep.synced_bytes > 0
    else:
        assert rep.reused_bytes < rep.synced_bytes
        assert not (buffer_keys(dest) & source_keys) or rep.reused_bytes > 0
    if engine != "vanilla":
        # The engine owns its copy: nothing of the trainer's is reused.
        assert rep.reused_bytes == 0


def test_p13_xla_moves_more_than_the_minimum_onto_the_vllm_mesh():
    """XLA reshards (2,4) onto the engine's (1,8) mesh in two hops (an all-to-all, then a
    permutation): the report shows the bytes moved twice as relayed, and the excess."""
    xla = build_cluster(Scenario(engine="vllm")).sync_weights()
    minimal = build_cluster(Scenario(engine="vllm", reshard="minimal")).sync_weights()
    assert xla.minimum_cross_device_bytes == minimal.minimum_cross_device_bytes > 0
    assert minimal.moved_cross_device_bytes == minimal.minimum_cross_device_bytes
    assert xla.excess_cross_device_bytes > 0 and xla.relayed_cross_device_bytes > 0
    assert xla.reshard_strategy == "xla" and minimal.reshard_strategy == "minimal"
    # Both strategies leave the same weights in the engine.
    assert xla.synced_bytes == minimal.synced_bytes


def test_p13_reshaped_moves_exactly_the_shard_overlap():
    cluster = build_cluster(Scenario(layout="reshaped"))
    source, dest_before = _filtered(cluster)
    src = flat_leaves(source)
    dst = flat_leaves(dest_before)
    expected = 0
    for path, x in src.items():
        y = dst[path]
        for s in y.addressable_shards:
            need = np.ones(y.shape, bool)
            need[s.index] = False
            mine = np.zeros(y.shape, bool)
            mine[s.index] = True
            for t in x.addressable_shards:
                if t.device.id == s.device.id:
                    mine[t.index] = False
            expected += int(mine.sum()) * x.dtype.itemsize
    rep = cluster.sync_weights()
    assert rep.moved_cross_device_bytes == expected > 0
    assert 0 < rep.moved_cross_device_bytes < rep.synced_bytes


def test_p13_peak_extra_counts_new_destination_buffers_and_the_anchor():
    cluster = build_cluster(Scenario(layout="split", lora=True))
    rep = cluster.sync_weights()
    device = {d: k.get("device", 0) for d, k in rep.peak_extra_bytes.items()}
    pinned = {d: k.get("pinned_host", 0) for d, k in rep.peak_extra_bytes.items()}
    assert sum(device.values()) == rep.synced_bytes  # float32 both sides: new buffers = synced
    assert {d for d, n in device.items() if n} == {"4", "5", "6", "7"}
    assert sum(pinned.values()) == rep.anchor_bytes == state_bytes(nnx.state(cluster.actor_model))
    shared = build_cluster(Scenario(layout="colocated")).sync_weights()
    assert all(k.get("device", 0) == 0 for k in shared.peak_extra_bytes.values())


def test_p13_the_sync_runs_the_order_p13_decided(monkeypatch):
    """The sync executes P13's order (``SyncOrder``), not the config: its chunks, and where a
    failed sync restores the rollout from (here the old arrays, though the anchor covers them)."""
    cluster = build_cluster(Scenario(layout="reshaped"))  # asks for one piece
    order = SyncOrder(chunk_bytes=160 << 10, restore_from_anchor=False, offload=False)
    monkeypatch.setattr(sync_module, "p13_sync_order", lambda *args: order)
    report = cluster.sync_weights()
    assert report.peak.chunks > 2 and report.to_json()["transient_peak"]["order"] == order.text
    commits, emit = [], events.emit

    def fail_at_the_third_commit(event):
        commits.append(event == events.Phase("commit"))
        if sum(commits) == 3:
            raise RuntimeError("chunk 3 failed")
        return emit(event)

    monkeypatch.setattr(events, "emit", fail_at_the_third_commit)
    with pytest.raises(RuntimeError, match="chunk 3") as info:
        cluster.sync_weights()
    assert "(its old arrays)" in "".join(info.value.__notes__) and cluster.global_steps == 1


def test_p13_sync_order_in_words_is_the_reports():
    """The order's fields, and its words as every sync report and plan records them."""
    assert p13_sync_order(None, False) == SyncOrder(None, False, False)
    assert p13_sync_order(1000, False, anchor_covers=False) == SyncOrder(1000, False, False)
    # How many chunks the handover took is the report's to say (chunk_words), not the order's.
    assert p13_sync_order(1000, True).text == (
        "the handover, each chunk committed and its old arrays dropped, each piece "
        "staged to device memory and written back to pinned host before the next, then the anchor re-pin "
        "(the actor's own pinned buffers)"
    )
    assert SyncOrder(1000, False, False).text == (
        "the handover, each chunk committed and its old arrays kept to the end for a rollback, then the anchor re-pin"
    )
    assert SyncOrder(None, False, False).text == (
        "the handover in one piece (the old arrays kept until the end for a rollback), then the anchor re-pin"
    )


def test_p13_report_json_keys_and_leaf_rows():
    cluster = build_cluster(Scenario(layout="reshaped", lora=True))
    data = placement_report(cluster, sync=cluster.sync_weights()).to_json()
    sync = data["sync"]
    for key in (
        "synced_bytes",
        "moved_cross_device_bytes",
        "copied_same_device_bytes",
        "reused_bytes",
        "minimum_cross_device_bytes",
        "synced_logical_bytes",
        "anchor_bytes",
        "seconds",
        "leaves",
    ):
        assert key in sync
    assert "physical" in sync["units"]
    assert sync["seconds"] > 0
    # Reshaped copies need programs; they are built once per set of shardings.
    assert cluster.sync_weights().includes_compilation is False
    leaf = sync["leaves"][0]
    assert set(leaf) >= {"path", "dtype", "shape", "src_sharding", "dst_sharding", "synced_bytes"}
    assert "P(" in leaf["src_sharding"] and "devices" in leaf["dst_sharding"]
    assert sum(r["synced_bytes"] for r in sync["leaves"]) == sync["synced_bytes"]


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_p13_p14_sync_with_offload_accounts_the_same_way(layout, lora):
    cluster = build_cluster(Scenario(layout=layout, lora=lora, offload=True))
    rep = cluster.sync_weights()
    assert rep.relayed_cross_device_bytes == 0
    assert rep.synced_bytes == rep.moved_cross_device_bytes + rep.copied_same_device_bytes + rep.reused_bytes
    assert rep.moved_cross_device_bytes == rep.minimum_cross_device_bytes
    _, dest = _filtered(cluster)
    assert {x.sharding.memory_kind for x in jax.tree.leaves(dest)} == {"pinned_host"}


def test_p13_cast_to_the_rollout_dtype_is_a_copy_within_the_device():
    cluster = build_cluster(Scenario(layout="reshaped", rollout_dtype="bfloat16"))
    rep = cluster.sync_weights()
    assert rep.synced_bytes == rep.moved_cross_device_bytes + rep.copied_same_device_bytes + rep.reused_bytes
    assert rep.reused_bytes == 0  # every destination buffer is a new bfloat16 one
    assert rep.moved_cross_device_bytes == rep.minimum_cross_device_bytes
    assert {leaf.dst_dtype for leaf in rep.leaves} == {"bfloat16"}
    # Peak counts the new destination buffers in their own dtype: half the float32 bytes.
    assert sum(k.get("device", 0) for k in rep.peak_extra_bytes.values()) * 2 == rep.synced_bytes


def _batch(cluster, n=4):
    out = cluster.generate(["abc", "hello", "xyz", "ok"][:n])
    return out, TrainBatch(
        prompt_tokens=out.left_padded_prompt_tokens,
        completion_tokens=out.tokens,
        advantages=np.linspace(-1, 1, n).astype(np.float32),
        old_logps=out.logprobs,
        ref_logps=np.asarray(cluster.get_ref_per_token_logps(out.left_padded_prompt_tokens, out.tokens)),
    )


@pytest.mark.parametrize("layout", ["colocated", "split"])
def test_p8_trainable_anchor_gives_the_full_anchors_log_probs(layout):
    full = build_cluster(Scenario(layout=layout, lora=True, anchor="full"))
    part = build_cluster(Scenario(layout=layout, lora=True, anchor="trainable"))
    out, batch = _batch(full)
    for cluster in (full, part):
        cluster.sync_weights()
        cluster.update_actor(batch)  # the live actor moves away from the anchor
    args = (out.left_padded_prompt_tokens, out.tokens)
    a = np.asarray(full.get_actor_per_token_logps(*args))
    b = np.asarray(part.get_actor_per_token_logps(*args))
    np.testing.assert_array_equal(a, b)
    live = np.asarray(part.get_live_actor_per_token_logps(*args))
    assert np.abs(live - b).max() > 0  # the anchor is not the live actor (P11)
    rep_full, rep_part = full.sync_weights(), part.sync_weights()
    adapters = state_bytes(nnx.state(part.actor_model, nnx.LoRAParam))
    assert rep_part.anchor_bytes == adapters
    assert rep_full.anchor_bytes == state_bytes(nnx.state(full.actor_model))
    assert rep_part.anchor_mode == "trainable" and rep_full.anchor_mode == "full"


def test_p8_trainable_anchor_without_lora_is_the_full_state():
    cluster = build_cluster(Scenario(anchor="trainable"))
    assert cluster.sync_weights().anchor_bytes == state_bytes(nnx.state(cluster.actor_model))


def test_anchor_mode_must_be_known():
    from rlcluster_lab import ClusterConfig, ConfigError, layout_meshes

    with pytest.raises(ConfigError, match="anchor must be one of full, trainable"):
        ClusterConfig(role_to_mesh=layout_meshes("colocated"), anchor="adapters")


def _anchor_buffers(cluster):
    anchor = flat_leaves(cluster.state.placed.anchor)
    return [s.data.unsafe_buffer_pointer() for x in anchor.values() for s in x.addressable_shards]


def _actors_buffers(cluster):
    """The buffers of the actor's leaves the anchor holds (all, or the adapters), in the anchor's order."""
    live = dict(flat_leaves(nnx.state(cluster.actor_model)))
    anchor = flat_leaves(cluster.state.placed.anchor)
    return [s.data.unsafe_buffer_pointer() for k in anchor for s in live[k].addressable_shards]


# Drawn from what a cluster can be built with: layout, LoRA, the anchor mode, offload, chunks, engine.
REPIN_CASES = [
    dict(zip(("layout", "lora", "anchor", "offload", "sync_chunk_bytes", "engine"), case))
    for case in zip(
        *(
            np.random.default_rng(8).choice(np.asarray(values, dtype=object), 6)
            for values in (LAYOUTS, [False, True], ["full", "trainable"], [False, True], [None, 48 << 10], ENGINES)
        )
    )
]


@pytest.mark.parametrize("knobs", REPIN_CASES, ids=lambda k: "-".join(map(str, k.values())))
def test_p8_the_anchor_is_rewritten_over_its_own_buffers_unless_something_else_holds_them(knobs):
    cluster = build_cluster(Scenario(**knobs))
    offload = knobs["offload"]
    before = _anchor_buffers(cluster)
    cluster.sync_weights()
    # Nothing else holds the anchor: its copy went over the old buffers (under offload it keeps the actor's).
    assert _anchor_buffers(cluster) == (_actors_buffers(cluster) if offload else before)
    kept = cluster.pinned_anchor_state  # a snapshot the caller keeps ...
    kept_values = [np.asarray(x) for x in jax.tree.leaves(kept)]
    cluster.update_actor(_batch(cluster)[1])
    cluster.sync_weights()
    # ... keeps its buffers and its values; the new anchor went to buffers of its own.
    assert not any(x.is_deleted() for x in jax.tree.leaves(kept))
    assert all(map(np.array_equal, (np.asarray(x) for x in jax.tree.leaves(kept)), kept_values))
    held = {s.data.unsafe_buffer_pointer() for x in jax.tree.leaves(kept) for s in x.addressable_shards}
    assert not set(_anchor_buffers(cluster)) & held or offload  # under offload both are the actor's, untrained
    del kept
    twin = cluster.isolated()  # the rehearsal's twin shares the anchor's arrays: neither writes over them
    before = _anchor_buffers(cluster)
    twin.sync_weights()
    assert _anchor_buffers(cluster) == before
    assert not any(x.is_deleted() for x in jax.tree.leaves(cluster.state.placed.anchor))
    del twin
    cluster.sync_weights()
    anchor = dict(flat_leaves(cluster.state.placed.anchor))
    live = dict(flat_leaves(nnx.state(cluster.actor_model)))
    assert anchor and all(np.array_equal(anchor[k], live[k]) for k in anchor)
    assert _anchor_buffers(cluster) == (_actors_buffers(cluster) if offload else before)


def test_p8_a_fault_measuring_an_anchor_written_over_commits_the_sync(monkeypatch):
    cluster = build_cluster(Scenario(layout="reshaped"))
    steps = cluster.global_steps

    def fail(*args, **kwargs):
        raise RuntimeError("fault injected")

    monkeypatch.setattr(SyncObserver, "anchor", fail)
    with pytest.raises(RuntimeError, match="fault injected") as info:
        cluster.sync_weights()
    assert "sync_weights finished before this error" in "".join(info.value.__notes__)
    assert cluster.global_steps == steps + 1
    anchor = dict(flat_leaves(cluster.state.placed.anchor))
    live = dict(flat_leaves(nnx.state(cluster.actor_model)))
    rollout = dict(flat_leaves(nnx.state(cluster.rollout.model(), nnx.Param)))
    assert all(np.array_equal(anchor[k], live[k]) for k in anchor)
    assert all(np.array_equal(rollout[k], live[k]) for k in rollout)
    monkeypatch.undo()
    assert cluster.sync_weights().global_step == steps + 2
