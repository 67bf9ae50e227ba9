"""L4 what-if planning: the plan equals the measurement here, and scales without allocating."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import time

import jax
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from pairwise import pairwise
from test_reshard import _cases, reshard

from rlcluster_lab import Role, Scenario, TrainingConfig, build_cluster, placement_report
from rlcluster_lab.cli.main import build_parser, main
from rlcluster_lab.cli.plan import parse_bytes
from rlcluster_lab.core.knobs import ANCHOR_MODES
from rlcluster_lab.core.meshes import LAYOUTS, describe_mesh, make_mesh
from rlcluster_lab.core.options import ENGINES as KNOWN_ENGINES
from rlcluster_lab.core.shardings import PlacementError
from rlcluster_lab.measure import memory_report
from rlcluster_lab.model import MODEL_SIZES
from rlcluster_lab.placement.boxes import plan_reshard, to_box
from rlcluster_lab.placement.layout import Layout, PlannedMesh, shard_boxes
from rlcluster_lab.planner.buffers import Buffers, overlap
from rlcluster_lab.planner.plan import plan_cluster, plan_scenario
from rlcluster_lab.planner.shapes import abstract_leaves
from rlcluster_lab.planner.tables import ARCHITECTURES, TOPOLOGIES, model_config

DEVICES = jax.devices()
MEMORY_KEYS = ("by_role", "by_device", "shared", "unique_bytes", "naive_bytes")
SYNC_KEYS = (
    "lora",
    "synced_bytes",
    "moved_cross_device_bytes",
    "copied_same_device_bytes",
    "reused_bytes",
    "minimum_cross_device_bytes",
    "excess_cross_device_bytes",
    "synced_logical_bytes",
    "anchor_bytes",
    "anchor_mode",
    "arrived_by_device",
    "peak_extra_bytes",
    "plan",
    "leaves",
)
REPORT_KEYS = ("sharing_map", "rollout_branch", "role_to_mesh", "config_role_to_mesh", "mesh_overridden_by_engine")
# Figures a plan gives per leaf that a single-process measurement does not (yet): compared
# wherever the measured leaf has them.
PLAN_ONLY_LEAF_KEYS = ("cross_host_bytes",)


def assert_plan_matches_measurement(scenario: Scenario) -> dict:
    """Plan the scenario, build it, sync once: every memory figure agrees exactly, and so does
    every sync figure where the reshard moved the least the placement forces (always, with the
    minimal strategy). Where a compiled program (xla) moved more, the plan is its lower bound."""
    plan = plan_scenario(scenario).to_json()
    cluster = build_cluster(scenario)
    report = placement_report(cluster).to_json()
    memory = memory_report(cluster).to_json()
    sync = cluster.sync_weights().to_json()
    for key in REPORT_KEYS:
        assert plan[key] == report[key], key
    for key in MEMORY_KEYS:
        assert plan["memory"][key] == memory[key], key
    _assert_sync_matches(plan["sync"], sync, scenario.reshard)
    return plan


def _strip(leaves: list[dict], drop: set[str]) -> list[dict]:
    return [{k: v for k, v in leaf.items() if k not in drop} for leaf in leaves]


def _assert_sync_matches(planned: dict, sync: dict, strategy: str) -> None:
    moved_more = sync["excess_cross_device_bytes"] > 0 or sync["relayed_cross_device_bytes"] > 0
    if strategy == "minimal":
        assert not moved_more
    exact = (
        "lora",
        "synced_bytes",
        "reused_bytes",
        "minimum_cross_device_bytes",
        "synced_logical_bytes",
        "anchor_bytes",
        "anchor_mode",
        "peak_extra_bytes",
        "plan",
    )
    for key in SYNC_KEYS if not moved_more else exact:
        if key == "leaves":
            measured_keys = set().union(*(leaf.keys() for leaf in sync[key]))
            # ``pieces`` (bytes per device pair) is measured only: the plan gives per-device totals.
            drop = {"method", "pieces"} | {k for k in PLAN_ONLY_LEAF_KEYS if k not in measured_keys}
            assert _strip(planned[key], drop) == _strip(sync[key], drop), key
        else:
            assert planned[key] == sync[key], key
    if moved_more:
        arrived = sync["moved_cross_device_bytes"] - sync["relayed_cross_device_bytes"]
        assert arrived >= planned["moved_cross_device_bytes"]
        assert arrived + sync["copied_same_device_bytes"] == (
            planned["moved_cross_device_bytes"] + planned["copied_same_device_bytes"]
        )


# --- plan == measured -------------------------------------------------------------


# Pairwise over layout x LoRA x strategy. Reshaped with the minimal strategy compiles two small
# programs per device (about 20 s here), so it runs once, with full weights; the sync tests reuse it.
LAYOUT_CASES = pairwise(
    {"layout": LAYOUTS, "lora": [False, True], "reshard": ["xla", "minimal"]},
    [
        ("colocated", False, "xla"),
        ("colocated", True, "minimal"),
        ("reshaped", False, "minimal"),
        ("reshaped", True, "xla"),
        ("split", False, "xla"),
        ("split", True, "minimal"),
    ],
)


@pytest.mark.parametrize(
    ("layout", "lora", "reshard"), LAYOUT_CASES, ids=lambda v: {False: "full", True: "lora"}.get(v, v)
)
@pytest.mark.cluster
def test_l4_plan_equals_measured_for_every_layout_and_lora(layout: str, lora: bool, reshard: str) -> None:
    plan = assert_plan_matches_measurement(Scenario(layout=layout, lora=lora, reshard=reshard))
    # P1/P3 as the plan saw them: only the colocated layout shares one set of weights.
    assert plan["rollout_branch"] == ("shared" if layout == "colocated" else "second_copy")


@pytest.mark.parametrize(
    "knobs",
    [
        {"layout": "split", "lora": True, "engine": "vllm"},
        {"layout": "colocated", "lora": True, "engine": "sglang_jax"},
        {"layout": "colocated", "engine": "vllm"},
        {"layout": "colocated", "lora": True, "offload": True},
        {"layout": "split", "offload": True},
        {"layout": "colocated", "lora": True, "engine": "vllm", "offload": True},
        {"layout": "colocated", "lora": True, "lora_separate_base": True},
        {"layout": "split", "lora": True, "rollout_dtype": "bfloat16"},
        {"layout": "colocated", "with_reward": True, "with_critic": True},
        {"layout": "reshaped", "lora": True, "anchor": "trainable"},
        # Replicated leaves kept on their device but moved to pinned host, or cast:
        # copied within the device on both sides.
        {"layout": "reshaped", "offload": True},
        {"layout": "reshaped", "rollout_dtype": "bfloat16"},
        # The minimal strategy with an engine that rearranges the mesh (where XLA moves more).
        {"layout": "colocated", "engine": "vllm", "reshard": "minimal"},
    ],
    ids=lambda k: "-".join(f"{v}" if isinstance(v, str) else k for k, v in k.items()),
)
@pytest.mark.cluster
def test_l4_plan_equals_measured_for_engines_offload_and_options(knobs: dict) -> None:
    assert_plan_matches_measurement(Scenario(**knobs))


@pytest.mark.cluster
def test_l4_plan_equals_measured_with_own_meshes_and_role_rules() -> None:
    # P2 unlinked: the reference on the same chips in another order; the LoRA actor is
    # resharded off the reference's buffers and, as jax.device_put does for the same devices
    # in another order, keeps none of them (not even the replicated norm scales).
    r2m = {
        Role.ACTOR: make_mesh(DEVICES, (2, 4)),
        Role.ROLLOUT: make_mesh(DEVICES, (2, 4)),
        Role.REFERENCE: make_mesh(DEVICES[::-1], (2, 4)),
    }
    scenario = Scenario(lora=True)
    plan = plan_scenario(scenario, role_to_mesh=r2m).to_json()
    cluster = build_cluster(scenario, role_to_mesh=r2m)
    assert plan["sharing_map"]["actor"] == ["rollout"]
    memory = memory_report(cluster).to_json()
    for key in MEMORY_KEYS:
        assert plan["memory"][key] == memory[key], key
    assert not any("reference" in group["roles"] for group in plan["memory"]["shared"])
    # The rollout role with its own logical-axis rules, on an engine that keeps its own copy.
    rules = {
        Role.ROLLOUT: (("embed", "tp"), ("vocab", "fsdp"), ("q_heads", "fsdp"), ("kv_heads", "fsdp"), ("mlp", "fsdp"))
    }
    scenario = Scenario(engine="sglang_jax", layout="split")
    plan = plan_scenario(scenario, logical_axis_rules=rules).to_json()
    cluster = build_cluster(scenario, training_config=TrainingConfig(role_to_logical_axis_rule=rules))
    memory = memory_report(cluster).to_json()
    sync = cluster.sync_weights().to_json()
    for key in MEMORY_KEYS:
        assert plan["memory"][key] == memory[key], key
    _assert_sync_matches(plan["sync"], sync, scenario.reshard)
    assert plan["sync"]["moved_cross_device_bytes"] > 0


@pytest.mark.cluster
def test_l4_plan_equals_measured_optimizer_state_for_another_optimizer() -> None:
    # P12: mu in bfloat16 beside float32 parameters, nu in float32, one step count on the actor's mesh.
    tx = optax.adamw(1e-3, mu_dtype="bfloat16")
    scenario = Scenario(layout="split", lora=True)
    plan = plan_scenario(scenario, optimizer=tx).to_json()
    memory = memory_report(build_cluster(scenario, training_config=TrainingConfig(optimizer=tx))).to_json()
    for key in MEMORY_KEYS:
        assert plan["memory"][key] == memory[key], key


def test_l4_plan_sync_identity_holds_for_every_leaf() -> None:
    # synced = moved across devices + copied within a device + reused, leaf by leaf.
    for knobs in (
        {"layout": "reshaped", "offload": True},
        {"layout": "reshaped", "rollout_dtype": "bfloat16"},
        {"layout": "split", "lora": True},
        {"layout": "colocated"},
    ):
        sync = plan_scenario(Scenario(**knobs)).to_json()["sync"]
        for leaf in sync["leaves"]:
            parts = leaf["moved_cross_device_bytes"] + leaf["copied_same_device_bytes"] + leaf["reused_bytes"]
            assert parts == leaf["synced_bytes"], leaf["path"]
            assert leaf["minimum_cross_device_bytes"] <= leaf["moved_cross_device_bytes"] + leaf["reused_bytes"]


# --- the pieces the plan is made of -----------------------------------------------


MESHES = [
    ((2, 4), DEVICES),
    ((8, 1), DEVICES),
    ((1, 8), DEVICES[::-1]),
    ((4, 2), DEVICES[3:] + DEVICES[:3]),
    ((2, 2), DEVICES[4:]),
    ((2, 2), DEVICES[:4]),
]
SPECS = [P(), P("fsdp"), P(None, "tp"), P("fsdp", "tp"), P("tp", "fsdp"), P(("fsdp", "tp"), None), P(("tp", "fsdp"))]


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("shape,devices", MESHES, ids=lambda x: str(x) if isinstance(x, tuple) else "")
def test_l4_shard_boxes_equal_named_sharding(shape, devices, spec) -> None:
    mesh = make_mesh(devices, shape)
    planned = PlannedMesh.of(mesh)
    array_shape = (16, 24)
    want = {d.id: to_box(i, array_shape) for d, i in NamedSharding(mesh, spec).devices_indices_map(array_shape).items()}
    got = shard_boxes(array_shape, spec, planned)
    assert dict(got) == want
    assert [d for d, _ in got] == [d.id for d in np.asarray(mesh.devices).flat]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    src=st.integers(0, len(MESHES) - 1),
    dst=st.integers(0, len(MESHES) - 1),
    src_spec=st.sampled_from(SPECS),
    dst_spec=st.sampled_from(SPECS),
)
def test_l4_overlap_agrees_with_plan_reshard(src, dst, src_spec, dst_spec) -> None:
    a = PlannedMesh.of(make_mesh(MESHES[src][1], MESHES[src][0]))
    b = PlannedMesh.of(make_mesh(MESHES[dst][1], MESHES[dst][0]))
    shape = (16, 8)
    plans = plan_reshard(shape, shard_boxes(shape, src_spec, a), shard_boxes(shape, dst_spec, b))
    same, lacking = overlap(shape, Layout(a, src_spec, "device"), Layout(b, dst_spec, "device"))
    assert list(same) == [p.reuses_source_buffer for p in plans]
    assert list(lacking) == [sum(x.size() for x in p.pieces if x.src_device != p.device) for p in plans]


def test_l4_reuse_is_per_shard_for_minimal_and_whole_layout_for_one_program() -> None:
    # Rows split in two over 8 devices, then over 4 of them: devices 0, 1 keep their shard,
    # shard by shard (minimal); a compiled program writes new buffers (xla, same device order).
    src_mesh = PlannedMesh.build(range(8), (2, 4))
    for strategy, dst_mesh, want in (
        ("minimal", PlannedMesh.build(range(4), (2, 2)), [True, True, False, False]),
        ("xla", PlannedMesh.build(range(8), (4, 2)), [False] * 8),
    ):
        buf = Buffers(strategy)
        a = buf.new((8, 4), np.float32, src_mesh, P("fsdp", None), "device")
        assert list(buf.kept(a, Layout(dst_mesh, P("fsdp", None), "device"))) == want
        moved = buf.reshard(a, Layout(dst_mesh, P("fsdp", None), "device"))
        assert [o == a.origins[0] for o in moved.origins] == want
        assert not buf.kept(a, Layout(dst_mesh, P("fsdp", None), "pinned_host")).any()  # a memory-kind move copies


def _planned_reuse_matches_the_reshard(case, strategy: str) -> None:
    shape, src, dst = case
    x = jax.device_put(np.zeros(shape, np.float32), src)
    y = reshard(x, dst, strategy=strategy)
    before = {s.device.id: s.data.unsafe_buffer_pointer() for s in x.addressable_shards}
    order = [d.id for d in np.asarray(dst.mesh.devices).flat]
    after = {s.device.id: s.data.unsafe_buffer_pointer() for s in y.addressable_shards}
    measured = [before.get(d) == after[d] for d in order]
    buf = Buffers(strategy)
    a = buf.new(shape, np.float32, PlannedMesh.of(src.mesh), src.spec, "device")
    assert list(buf.kept(a, Layout(PlannedMesh.of(dst.mesh), dst.spec, "device"))) == measured


# Each example compiles a reshard: the count is the hypothesis profile's (tests/conftest.py).
@settings(deadline=None, derandomize=True)
@given(_cases())
def test_l4_planned_reuse_equals_the_minimal_reshard(case) -> None:
    _planned_reuse_matches_the_reshard(case, "minimal")


@settings(deadline=None, derandomize=True)
@given(_cases())
def test_l4_planned_reuse_equals_the_xla_reshard(case) -> None:
    _planned_reuse_matches_the_reshard(case, "xla")


def test_p1_planned_mesh_equality_is_mesh_equality() -> None:
    meshes = [
        make_mesh(DEVICES, (2, 4)),
        make_mesh(DEVICES, (8, 1)),
        make_mesh(DEVICES[::-1], (2, 4)),
        make_mesh(DEVICES, (2, 4), ("data", "model")),
        make_mesh(DEVICES[:4], (2, 2)),
        make_mesh(DEVICES, (2, 4)),
    ]
    for a in meshes:
        for b in meshes:
            assert (PlannedMesh.of(a) == PlannedMesh.of(b)) is (a == b)
        assert describe_mesh(PlannedMesh.of(a)) == describe_mesh(a)


@pytest.mark.parametrize("lora_rank", [0, 4])
@pytest.mark.parametrize("size", ["tiny", "small"])
def test_l4_the_planned_tree_is_one_layer_stack_whatever_the_depth(size: str, lora_rank: int) -> None:
    config = MODEL_SIZES[size]
    leaves = abstract_leaves(config, lora_rank)
    deeper = abstract_leaves(dataclasses.replace(config, num_layers=config.num_layers + 3), lora_rank)
    assert [x.path for x in leaves] == [x.path for x in deeper]
    for leaf, deep in zip(leaves, deeper):
        if leaf.path[0] == "blocks":  # the layer axis leads, unsharded
            assert (leaf.shape[0], deep.shape[0]) == (config.num_layers, config.num_layers + 3)
            assert leaf.shape[1:] == deep.shape[1:] and leaf.spec[:1] in ((), (None,))
        else:
            assert leaf == deep
    assert sum(int(np.prod(x.shape)) for x in leaves if not x.lora) == config.num_params
    assert sum(int(np.prod(x.shape)) for x in leaves if x.lora) == (config.lora_params(lora_rank) if lora_rank else 0)


# --- far beyond this machine ---------------------------------------------------------


def test_l4_70b_on_256_chips_plans_fast_without_allocating() -> None:
    before = len(jax.live_arrays())
    start = time.perf_counter()
    plan = plan_cluster("llama3-70b", "tpu-v5p-256", layout="reshaped", lora_rank=16).to_json()
    elapsed = time.perf_counter() - start
    assert len(jax.live_arrays()) == before
    assert elapsed < 60
    config = model_config("llama3-70b")
    assert plan["source"] == "computed from shapes (no allocation)"
    assert len(plan["role_to_mesh"]["actor"]["device_ids"]) == 256
    assert plan["role_to_mesh"]["rollout"]["shape"] == {"fsdp": 256, "tp": 1}
    assert plan["rollout_branch"] == "second_copy"  # P1: same chips, another mesh
    # Every reference weight is split over all 256 chips, except the norm scales, which every chip holds.
    norms = (2 * config.num_layers + 1) * config.embed_dim
    assert plan["memory"]["by_role"]["reference"]["bytes"] == 2 * (config.num_params + 255 * norms)
    assert plan["sync"]["synced_logical_bytes"] == 2 * config.lora_params(16)
    assert plan["fits"]["all_fit"] is True


def test_l4_fits_and_time_follow_memory_and_bandwidth() -> None:
    # 70B in bf16 is 141 GB: over 8 chips of 16 GB the reference alone does not fit.
    plan = plan_cluster("llama3-70b", "tpu-v5e-8").to_json()
    assert plan["fits"]["by_role"]["reference"]["fits"] is False
    assert plan["fits"]["all_fit"] is False
    big = plan_cluster("llama3-70b", "tpu-v5e-8", memory_per_device=10**12).to_json()
    assert big["fits"]["all_fit"] is True and big["topology"]["memory_source"] == "given"
    split = plan_cluster("llama3-8b", "gpu-8", layout="split", link_bandwidth=1e9).to_json()
    arrived = split["sync"]["arrived_by_device"]
    assert set(arrived) == {"4", "5", "6", "7"}  # the rollout half receives everything
    assert split["sync"]["estimated_seconds"] == pytest.approx(max(arrived.values()) / 1e9)
    local = plan_cluster("tiny", "local").to_json()
    assert local["sync"]["estimated_seconds"] is None  # no bandwidth known for this machine


def test_l4_published_architectures_have_their_parameter_counts_and_sources() -> None:
    published = {"gemma-2b": 2.51e9, "llama3-8b": 8.03e9, "llama3-70b": 70.55e9}
    for name, count in published.items():
        assert model_config(name).num_params == pytest.approx(count, rel=0.005)
        assert ARCHITECTURES[name].source
    for topo in TOPOLOGIES.values():
        assert topo.memory_per_device and topo.link_bandwidth and topo.memory_source and topo.bandwidth_source


def test_l4_a_spec_that_cannot_go_on_a_planned_mesh_fails_like_the_cluster() -> None:
    # Gemma's vocabulary (256128 = 128 * 2001) does not split 256 ways on the vllm mesh.
    with pytest.raises(PlacementError, match="does not divide"):
        plan_cluster("gemma-2b", "tpu-v5p-256", engine="vllm")


def test_l4_bad_inputs_say_what_is_valid() -> None:
    with pytest.raises(ValueError, match="llama3-70b"):
        plan_cluster("llama-9000")
    with pytest.raises(ValueError, match="tpu-v5p-256"):
        plan_cluster("tiny", "tpu-v9")
    with pytest.raises(ValueError, match="colocated"):
        plan_cluster("tiny", layout="diagonal")
    with pytest.raises(ValueError, match="full, trainable"):
        plan_cluster("tiny", anchor="half")


def test_cli_subcommands_spell_every_scenario_knob_the_same_way() -> None:
    """One vocabulary: report, learn and plan take the same scenario flags, with the same choices."""
    parser = build_parser()
    subs = next(a for a in parser._actions if a.dest == "command").choices

    def flags(name: str) -> dict[str, object]:
        return {s: a.choices for a in subs[name]._actions for s in a.option_strings}

    report, learn, plan = flags("report"), flags("learn"), flags("plan")
    shared = set(report) & set(plan)
    for knob in (
        "--layout",
        "--lora",
        "--lora-rank",
        "--lora-separate-base",
        "--engine",
        "--offload",
        "--rollout-dtype",
        "--anchor",
        "--reshard",
        "--reward",
        "--critic",
        "--model-size",
        "--devices",
    ):
        assert knob in shared and knob in learn, knob
    assert report["--layout"] == plan["--layout"] == LAYOUTS
    assert report["--engine"] == plan["--engine"] == KNOWN_ENGINES
    assert report["--anchor"] == plan["--anchor"] == ANCHOR_MODES


# --- CLI -------------------------------------------------------------------------------


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_l4_cli_plan_json_keys() -> None:
    rc, out, _ = _run(
        [
            "plan",
            "--model",
            "llama3-8b",
            "--topology",
            "gpu-8",
            "--lora",
            "--lora-rank",
            "16",
            "--layout",
            "split",
            "--memory-per-device",
            "80GB",
            "--bandwidth",
            "450GB",
            "--json",
        ]
    )
    assert rc == 0
    data = json.loads(out)
    for key in (
        "source",
        "model",
        "topology",
        "layout",
        "engine",
        "lora_rank",
        "offload",
        "anchor",
        "role_to_mesh",
        "sharing_map",
        "rollout_branch",
        "memory",
        "fits",
        "sync",
    ):
        assert key in data, key
    assert set(MEMORY_KEYS) <= set(data["memory"]) and "allocator" not in data["memory"]
    assert set(SYNC_KEYS) | {"estimated_seconds"} <= set(data["sync"])
    assert not {"seconds", "anchor_seconds", "method"} & set(data["sync"])
    assert data["lora_rank"] == 16 and data["topology"]["memory_per_device"] == 80 * 10**9


def test_l4_cli_plan_text() -> None:
    rc, out, _ = _run(["plan", "--model", "gemma-2b", "--topology", "tpu-v5e-8", "--engine", "vllm"])
    assert rc == 0
    assert "rollout branch (P3): shared" in out and "the engine replaced the rollout mesh" in out


@pytest.mark.parametrize(
    "argv,valid",
    [
        (["--model", "gpt-5"], "llama3-70b"),
        (["--topology", "tpu-v9"], "tpu-v5p-256"),
        (["--layout", "diagonal"], "'colocated', 'reshaped', 'split'"),
        (["--engine", "trt"], "'vanilla', 'vllm', 'sglang_jax'"),
        (["--memory-per-device", "lots"], "GiB"),
    ],
)
def test_l4_cli_plan_bad_input_is_one_line_exit_2(argv: list[str], valid: str) -> None:
    rc, out, err = _run(["plan", *argv])
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error:") and valid in err


def test_l4_parse_bytes_units() -> None:
    assert parse_bytes("80GB") == 80e9
    assert parse_bytes("16GiB") == 16 * 2**30
    assert parse_bytes("450e9") == 450e9
    assert parse_bytes("600 GB/s") == 600e9
    with pytest.raises(ValueError):
        parse_bytes("-1GB")


@pytest.mark.parametrize("seed", range(6))
def test_p8_the_sync_re_pins_what_construction_pinned(seed) -> None:
    """The sync pins anew (P13) the anchor construction pinned (P8), but under offload, where the
    snapshot keeps the actor's pinned buffers: over drawn models, LoRA, anchor modes and layouts."""
    rng = np.random.default_rng(seed)
    plan = plan_cluster(
        str(rng.choice(["tiny", "small"])),
        "gpu-8",
        lora_rank=int(rng.choice([0, 2, 4])),
        anchor=str(rng.choice(ANCHOR_MODES)),
        offload=(offload := bool(rng.integers(2))),
        layout=str(rng.choice(["split", "colocated"])),
    )
    (p8,) = [d for d in plan.decisions if d["rule"] == "P8"]
    assert p8["values"]["bytes"] > 0
    assert plan.sync["anchor_bytes"] == (0 if offload else p8["values"]["bytes"])
