"""L4, everything a step fills: the planner's activations, gradients, update outputs, KV cache,
hosts and verdict, held to JAX's own accounting, the compiler, live buffers and published figures."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.ad_checkpoint import print_saved_residuals
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_plan import MESHES, SPECS, _run

from rlcluster_lab import Scenario, build_cluster
from rlcluster_lab.core.meshes import make_mesh
from rlcluster_lab.measure import memory_report
from rlcluster_lab.model import MODEL_SIZES
from rlcluster_lab.model.init import abstract_model
from rlcluster_lab.model.lora import is_lora
from rlcluster_lab.model.scoring import abstract_score_model
from rlcluster_lab.model.transformer import init_cache
from rlcluster_lab.placement.layout import Layout, PlannedMesh, shard_boxes
from rlcluster_lab.planner.buffers import host_overlap
from rlcluster_lab.planner.plan import plan_cluster, plan_scenario
from rlcluster_lab.planner.references import PUBLISHED
from rlcluster_lab.planner.step_memory import Split, Workload, activation_bytes, kv_cache_bytes, shared_bytes_per_token
from rlcluster_lab.planner.tables import TOPOLOGIES, Topology, local_topology
from rlcluster_lab.training import step as step_module
from rlcluster_lab.training.critic import ppo_value_sums
from rlcluster_lab.training.step import _sharding_key, grpo_sums, jitted_update, token_mean

GIB = 1 << 30
_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "bool": 1, "i32": 4, "u32": 4}


# --- activations: the formula is what JAX's reverse mode keeps ----------------------------


def _saved_residual_bytes(loss, *args) -> int:
    """Bytes of what ``jax.vjp`` of ``loss`` keeps for the backward pass, parsed from
    ``jax.ad_checkpoint.print_saved_residuals``; inputs, constants and literals are not
    activations (they exist anyway) and are left out."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(loss, *args)
    total = 0
    for line in out.getvalue().splitlines():
        dtype, shape, what = re.match(r"(\w+)\[([\d,]*)\] (.*)", line).groups()
        if any(k in what for k in ("from the argument", "from a constant", "from a literal")):
            continue
        total += int(np.prod([int(n) for n in shape.split(",") if n])) * _DTYPE_BYTES[dtype]
    return total


def _batch(rows: int, prompt: int, completion: int, *, critic: bool = False) -> dict:
    sd = jax.ShapeDtypeStruct
    batch = {"prompt_tokens": sd((rows, prompt), jnp.int32), "completion_tokens": sd((rows, completion), jnp.int32)}
    floats = ("old_values", "returns") if critic else ("old_logps", "ref_logps")
    batch.update({k: sd((rows, completion), jnp.float32) for k in floats})
    if not critic:
        batch["advantages"] = sd((rows,), jnp.float32)
    return batch


def _residuals(config, rows: int, prompt: int, completion: int, kind: str) -> int:
    if kind == "critic":
        graphdef, trainable, frozen = nnx.split(abstract_score_model(config), nnx.Param, ...)

        def loss(params, batch):
            model = nnx.merge(graphdef, params, frozen)
            return token_mean(*ppo_value_sums(model, batch, pad_id=0, clip_range_value=0.2))[0]

        return _saved_residual_bytes(loss, trainable, _batch(rows, prompt, completion, critic=True))
    lora = 4 if kind == "lora" else 0
    graphdef, trainable, frozen = nnx.split(abstract_model(config, lora), nnx.LoRAParam if lora else nnx.Param, ...)
    # Frozen weights as constants: the loss is differentiated in the trainable ones only.
    frozen = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), frozen)

    def loss(params, batch):
        model = nnx.merge(graphdef, params, frozen)
        sums = grpo_sums(model, batch, pad_id=0, temperature=jnp.float32(1.0), beta=0.04, epsilon=0.2)
        return token_mean(*sums)[0]

    return _saved_residual_bytes(loss, trainable, _batch(rows, prompt, completion))


@pytest.mark.parametrize("kind", ["full", "lora", "critic"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("size,rows,prompt,completion", [("tiny", 2, 16, 16), ("tiny", 3, 5, 7), ("small", 2, 9, 4)])
def test_l4_activation_formula_equals_what_jax_saves_for_the_backward_pass(size, rows, prompt, completion, dtype, kind):
    config = dataclasses.replace(MODEL_SIZES[size], param_dtype=dtype)
    work = Workload(rollout_batch_size=rows, prompt_length=prompt, max_tokens=completion, kv_cache_size=64)
    planned = activation_bytes(config, work, lora_rank=4 if kind == "lora" else 0, value_head=kind == "critic")
    assert sum(planned.values()) == _residuals(config, rows, prompt, completion, kind)


def test_l4_remat_keeps_each_layers_input_and_recomputes_one_layer() -> None:
    config = MODEL_SIZES["small"]
    work = Workload()
    full = activation_bytes(config, work)
    remat = activation_bytes(config, dataclasses.replace(work, remat=True))
    tokens = work.train_rows * work.sequence_length
    assert remat["layer_inputs"] == config.num_layers * 4 * config.embed_dim * tokens
    # Without remat the scan keeps what every layer shares (the rotary terms) once, not per layer.
    shared = shared_bytes_per_token(config) * tokens
    assert remat["one_layer_recomputed"] * config.num_layers == full["layers"] + (config.num_layers - 1) * shared
    assert remat["head"] == full["head"]
    assert sum(remat.values()) < sum(full.values()) / 3


def test_l4_activations_split_over_the_axes_the_rules_give_each_dimension() -> None:
    config = MODEL_SIZES["tiny"]
    work = Workload()
    mesh = PlannedMesh.build(range(8), (2, 4))
    split = Split.of(mesh, (("embed", "fsdp"), ("vocab", "tp"), ("q_heads", "tp"), ("kv_heads", "tp"), ("mlp", "tp")))
    assert split == Split(embed=2, q_heads=4, kv_heads=4, mlp=4, vocab=4)
    one, eight = sum(activation_bytes(config, work).values()), sum(activation_bytes(config, work, split).values())
    # Every row on every device; heads and MLP units a quarter; the residual stream half.
    assert one / 4 < eight < one / 2
    # Two kv heads over four tensor-parallel devices: one head each (not split further); every row.
    assert kv_cache_bytes(config, 16, 128, split) == kv_cache_bytes(config, 16, 128) // 2


# --- the compiled step and live buffers at the lab's sizes --------------------------------


@contextlib.contextmanager
def _optimizer_in_scope(tx):
    """The step reads its optimizer while it traces, from where ``_Programs.call`` puts it."""
    local = step_module._STEPS._local
    outer = getattr(local, "tx", None)
    local.tx = tx
    try:
        yield
    finally:
        local.tx = outer


def _compiled_step(graphdef, trainable, frozen, opt_state, tx, work: Workload, mesh=None):
    """XLA's memory analysis of the lab's own GRPO step (``jitted_update``) at the workload's
    shapes; nothing runs."""
    keep = (_sharding_key(trainable), _sharding_key(opt_state))

    def sums_fn(model, batch, temperature):
        return grpo_sums(model, batch, pad_id=0, temperature=temperature, beta=0.04, epsilon=0.2)

    program = jitted_update(graphdef, keep, 1, sums_fn, "grpo_train_step")
    replicated = None if mesh is None else NamedSharding(mesh, P())
    batch = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=replicated)
        for k, v in _batch(work.train_rows, work.prompt_length, work.max_tokens).items()
    }
    with _optimizer_in_scope(tx):
        compiled = program.lower(
            trainable, frozen, opt_state, batch, jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated)
        ).compile()
    n_outputs = len(jax.tree.leaves(compiled.output_shardings))
    return compiled.memory_analysis(), n_outputs


METRICS = 5  # loss, kl, clip_fraction, grad_norm, rejected: float32 scalars


def _per_device(tree) -> dict[int, int]:
    out: dict[int, int] = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            out[shard.device.id] = out.get(shard.device.id, 0) + shard.data.nbytes
    return out


def _live_step_terms(scenario: Scenario, *, gradients: bool = True):
    """The plan, and from the live cluster: the actor's split state and (``gradients``) its
    gradients, each in its parameter's layout."""
    plan = plan_scenario(scenario)
    work = Workload.of_scenario(scenario)
    cluster = build_cluster(scenario)
    actor = cluster.actor_model
    graphdef, trainable, frozen = nnx.split(actor, nnx.LoRAParam if is_lora(actor) else nnx.Param, ...)
    rows, prompt, completion = work.train_rows, work.prompt_length, work.max_tokens
    batch = {
        "prompt_tokens": np.ones((rows, prompt), np.int32),
        "completion_tokens": np.ones((rows, completion), np.int32),
        "advantages": np.ones((rows,), np.float32),
        "old_logps": np.zeros((rows, completion), np.float32),
        "ref_logps": np.zeros((rows, completion), np.float32),
    }

    def loss(params):
        model = nnx.merge(graphdef, params, frozen)
        return token_mean(*grpo_sums(model, batch, pad_id=0, temperature=1.0, beta=0.04, epsilon=0.2))[0]

    # Each gradient in its parameter's layout, as the step keeps its parameters.
    grads = None
    if gradients:
        grads = jax.jit(jax.grad(loss), out_shardings=jax.tree.map(lambda x: x.sharding, trainable))(trainable)
    on_actor = [b for b in plan.per_device if "actor_update" in b.phases]
    return plan, work, cluster, (graphdef, trainable, frozen), grads, on_actor


@pytest.mark.parametrize("knobs", [{"layout": "colocated"}, {"layout": "split", "lora": True}], ids=["full", "lora"])
@pytest.mark.cluster
def test_l4_gradients_and_update_outputs_equal_live_buffers(knobs: dict) -> None:
    """Gradients as live buffers; the step's outputs have its inputs' layouts (it pins them),
    so they are the live trainable parameters and optimizer state again."""
    plan, _, cluster, (_, trainable, _), grads, on_actor = _live_step_terms(Scenario(**knobs))
    assert _per_device(grads) == {b.device: b.phases["actor_update"]["gradients"] for b in on_actor}
    outputs = _per_device((trainable, cluster.optimizer_state))
    assert outputs == {b.device: b.phases["actor_update"]["update_outputs"] for b in on_actor}
    assert all(b.phases["actor_update"]["activations"] > 0 for b in on_actor)


@pytest.mark.slow  # compiles the training step for eight devices: about a minute on two cores
@pytest.mark.cluster
def test_l4_the_compiled_step_holds_what_the_plan_counts() -> None:
    """XLA's memory analysis of the lab's own step (nothing runs): its outputs are exactly the
    planned update outputs (plus the metrics and one 8-byte entry per output buffer, the
    tuple XLA returns); its temporaries, where activations and gradients live, track the
    plan's figures only roughly, since XLA fuses, trims and adds to JAX's saved set (measured
    here 2.06 for this layout: 17.4 MB of temporaries against 8.5 MB planned; 1.94 while the
    attention mask was a boolean array JAX kept, which the plan counted and XLA did not)."""
    scenario = Scenario()
    plan, work, cluster, (graphdef, trainable, frozen), _, on_actor = _live_step_terms(scenario, gradients=False)
    mesh = jax.tree.leaves(trainable)[0].sharding.mesh
    tx = cluster.cluster_config.training_config.actor_optimizer()
    analysis, n_outputs = _compiled_step(graphdef, trainable, frozen, cluster.optimizer_state, tx, work, mesh)
    for budget in on_actor:
        update = budget.phases["actor_update"]
        assert analysis.output_size_in_bytes == update["update_outputs"] + 4 * METRICS + 8 * n_outputs
        assert 0.5 < analysis.temp_size_in_bytes / (update["gradients"] + update["activations"]) < 2.5


@pytest.mark.cluster
def test_l4_kv_cache_is_the_engines_cache() -> None:
    scenario = Scenario(layout="split")
    plan = plan_scenario(scenario)
    cluster = build_cluster(scenario)
    engine = cluster.rollout
    slots = engine.cache_size if engine.cache_size is not None else scenario.kv_cache_size
    cache = init_cache(engine.model().config, plan.workload["rollout_batch_size"], slots)
    assert plan.step["kv_cache_bytes"] == cache.k.nbytes + cache.v.nbytes
    # Per rollout device: every row, the kv heads over the tensor axis.
    rollout = set(plan.role_to_mesh["rollout"]["device_ids"])
    for budget in plan.per_device:
        kv = budget.phases.get("generate", {}).get("kv_cache", 0)
        assert kv == (plan.step["kv_cache_per_device"] if budget.device in rollout else 0)
    assert plan.step["kv_cache_per_device"] * plan.step["rollout_split"]["kv_heads"] == plan.step["kv_cache_bytes"]


# --- published figures ---------------------------------------------------------------------


FIGURES = {f.name: f for f in PUBLISHED}


def _state(model: str, **knobs) -> dict:
    plan = plan_cluster(model, "gpu-8", **knobs)
    return {**plan.step["actor_training_state"], "base_params": plan.model["num_params"]}


def test_l4_bytes_per_parameter_match_the_published_arithmetic() -> None:
    ours = _state("tiny")["bytes_per_parameter"]  # the lab trains in float32 with adam
    hf = dict(FIGURES["hf_fp32_adamw"].composition)
    assert {k: ours[k] for k in hf} == pytest.approx(hf, abs=1e-3)  # 4 + 4 + 8, part by part
    zero = FIGURES["zero_mixed_precision_adam"]
    # The same 16 bytes per parameter as mixed-precision Adam, in another composition:
    # ZeRO keeps fp16 parameters and gradients and an fp32 master copy (2 + 2 + 12).
    assert ours["total"] == pytest.approx(zero.value, abs=1e-3)
    assert ours["parameters"] != dict(zero.composition)["parameters"]


def test_l4_an_8b_model_matches_published_memory_tables() -> None:
    fp32 = _state("llama3-8b", dtype="float32")
    assert fp32["total"] == pytest.approx(FIGURES["d2l_llama3_8b_fp32"].value, rel=0.005)  # 8.03e9 vs "8B"
    bf16 = _state("llama3-8b")
    per_billion = bf16["total"] / 1e9 / (bf16["num_params"] / 1e9)
    assert per_billion == pytest.approx(FIGURES["llamafactory_full_pure_bf16"].value, rel=1e-3)
    lora = _state("llama3-8b", lora_rank=16)  # the frozen base and rank-16 adapters with their state
    per_billion = lora["total"] / lora["base_params"]
    assert per_billion == pytest.approx(FIGURES["llamafactory_lora_16bit"].value, rel=0.03)
    for figure in PUBLISHED:
        assert "http" in figure.source and figure.assumptions


# --- hosts -----------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    src=st.integers(0, len(MESHES) - 1),
    dst=st.integers(0, len(MESHES) - 1),
    src_spec=st.sampled_from(SPECS),
    dst_spec=st.sampled_from(SPECS),
    per_host=st.sampled_from([1, 2, 4, 8]),
)
def test_l4_cross_host_elements_are_those_no_device_of_the_host_holds(src, dst, src_spec, dst_spec, per_host) -> None:
    a = PlannedMesh.of(make_mesh(MESHES[src][1], MESHES[src][0]))
    b = PlannedMesh.of(make_mesh(MESHES[dst][1], MESHES[dst][0]))
    shape = (16, 8)
    hosts = tuple((d, d // per_host) for d in range(8))
    got = host_overlap(shape, Layout(a, src_spec, "device"), Layout(b, dst_spec, "device"), hosts)
    # Element by element: which hosts hold each element of the source.
    held = np.zeros((8 // per_host, *shape), dtype=bool)
    for d, box in shard_boxes(shape, src_spec, a):
        held[(d // per_host, *(slice(lo, hi) for lo, hi in box))] = True
    # A box several devices of one host need crosses once, for the first of them in mesh order.
    want, seen = [], set()
    for d, box in shard_boxes(shape, dst_spec, b):
        first = (d // per_host, box) not in seen
        seen.add((d // per_host, box))
        want.append(int((~held[(d // per_host, *(slice(lo, hi) for lo, hi in box))]).sum()) if first else 0)
    assert list(got) == want


def _two_hosts() -> Topology:
    return dataclasses.replace(local_topology(), devices_per_host=4, host_ids=None)


def test_l4_split_layout_over_two_hosts_sends_every_synced_byte_across() -> None:
    split = plan_scenario(Scenario(layout="split"), _two_hosts())
    sync = split.sync
    # Each block crosses once into the rollout's host (the logical size); the copies a
    # replicated leaf needs on the host's other devices are made there.
    assert sync["cross_host_bytes"] == sync["synced_logical_bytes"] > 0
    assert sync["within_host_cross_device_bytes"] == sync["moved_cross_device_bytes"] - sync["cross_host_bytes"] > 0
    assert [h.sync_cross_host_bytes for h in split.per_host] == [0, sync["cross_host_bytes"]]
    leaves = sync["leaves"]
    assert sum(leaf["cross_host_bytes"] for leaf in leaves) == sync["cross_host_bytes"]
    # One host: the same sync crosses no host boundary.
    assert plan_scenario(Scenario(layout="split")).sync["cross_host_bytes"] == 0
    # Colocated and shared: nothing moves at all.
    assert plan_scenario(Scenario(), _two_hosts()).sync["cross_host_bytes"] == 0
    # Reshaped, (2, 4) to (8, 1): each rollout device's rows lie on the four actor devices of
    # its own host, so nothing crosses; with two devices to a host, part of it does.
    reshaped = plan_scenario(Scenario(layout="reshaped"), _two_hosts()).sync
    assert reshaped["cross_host_bytes"] == 0 < reshaped["moved_cross_device_bytes"]
    pairs = dataclasses.replace(local_topology(), devices_per_host=2, host_ids=None)
    reshaped = plan_scenario(Scenario(layout="reshaped"), pairs).sync
    assert 0 < reshaped["cross_host_bytes"] < reshaped["moved_cross_device_bytes"]


@pytest.mark.parametrize(
    "knobs", [{"layout": "split", "lora": True}, {"layout": "colocated", "offload": True}, {"layout": "reshaped"}]
)
@pytest.mark.cluster
def test_l4_per_host_figures_are_the_per_device_walk_grouped_by_host(knobs: dict) -> None:
    """What each process's walk of its own shards would report: the live cluster's per-device
    figures, summed over the devices of each host."""
    scenario = Scenario(**knobs)
    plan = plan_scenario(scenario, _two_hosts())
    measured = memory_report(build_cluster(scenario)).to_json()
    assert [h.device_ids for h in plan.per_host] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    for host in plan.per_host:
        for role, info in measured["by_role"].items():
            want: dict[str, int] = {}
            for d, kinds in info["by_device"].items():
                if int(d) in host.device_ids:
                    for kind, n in kinds.items():
                        want[kind] = want.get(kind, 0) + n
            assert dict(host.by_role.get(role, {})) == want, (host.host, role)
        unique: dict[str, int] = {}
        for d, kinds in measured["by_device"].items():
            if int(d) in host.device_ids:
                for kind, n in kinds.items():
                    unique[kind] = unique.get(kind, 0) + n
        assert dict(host.by_kind) == unique
        # Host RAM holds the host's pinned buffers (the anchor, offloaded roles)...
        pinned = unique.get("pinned_host", 0)
        # ...and on CPU, whose device memory is RAM, the devices' bytes too.
        assert host.ram_bytes >= pinned + unique.get("device", 0)
    json.dumps(plan.to_json())  # the per-host API serialises


def test_l4_host_ram_that_does_not_fit_is_named() -> None:
    plan = plan_cluster("llama3-8b", "gpu-8", offload=True, host_memory=5 * 10**10).to_json()
    assert plan["fits"]["all_fit"] is False
    assert plan["fits"]["hosts"]["fits"] is False
    assert "host 0 needs" in plan["fits"]["reason"] and "of RAM" in plan["fits"]["reason"]
    assert plan["topology"]["host_memory_source"] == "given"


# --- the verdict at scale -----------------------------------------------------------------


def test_l4_70b_full_fine_tuning_on_gpu_8_no_longer_fits_and_says_why() -> None:
    plan = plan_cluster("llama3-70b", "gpu-8").to_json()
    fits = plan["fits"]
    # What the planner counted before (parameters, optimizer state, anchor, sync peak): 65.7 GiB.
    assert fits["resident"]["max_device_bytes"] / GIB == pytest.approx(65.72, abs=0.01)
    assert fits["all_fit"] is False and fits["peak"]["fits"] is False
    assert fits["peak"]["phase"] == "actor_update"
    terms = fits["peak"]["terms"]
    params = plan["model"]["num_params"]
    # Gradients: one bfloat16 value per parameter, an eighth of them per device.
    assert sum(d["phases"]["actor_update"]["gradients"] for d in plan["per_device"]) >= 2 * params
    assert terms["gradients"] / GIB == pytest.approx(2 * params / 8 / GIB, rel=0.01)
    reason = fits["reason"]
    assert reason.startswith("device ") and "74.5 GiB" in reason and "update outputs" in reason
    # Not a matter of the workload: a step of one row, rematerialised, still does not fit.
    small = Workload(rollout_batch_size=1, prompt_length=16, max_tokens=16, kv_cache_size=32, remat=True)
    assert plan_cluster("llama3-70b", "gpu-8", workload=small).fits["all_fit"] is False
    # With LoRA the same model fits the node.
    assert plan_cluster("llama3-70b", "gpu-8", lora_rank=16).fits["all_fit"] is True


def test_l4_every_topology_cites_its_host_figures() -> None:
    for topo in TOPOLOGIES.values():
        assert topo.host_memory and topo.host_link_bandwidth
        for source in (topo.memory_source, topo.bandwidth_source, topo.host_memory_source, topo.host_link_source):
            assert "https://" in source, (topo.name, source)
        assert sum(len(h) for h in topo.hosts()) == topo.device_count
    assert [len(h) for h in TOPOLOGIES["tpu-v5p-64"].hosts()] == [4] * 16
    assert TOPOLOGIES["gpu-2x8"].hosts() == (tuple(range(8)), tuple(range(8, 16)))


def test_l4_workload_refuses_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="kv_cache_size"):
        Workload(prompt_length=120, max_tokens=16, kv_cache_size=128)
    with pytest.raises(ValueError, match="rollout_batch_size"):
        Workload(rollout_batch_size=0)
    with pytest.raises(ValueError, match="micro_batch_size"):
        Workload(micro_batch_size=0)
    with pytest.raises(ValueError, match="devices_per_host must divide"):
        dataclasses.replace(TOPOLOGIES["gpu-8"], devices_per_host=3)


def test_l4_gradient_accumulation_keeps_a_float32_sum() -> None:
    whole = plan_cluster("llama3-8b", "gpu-8").per_device[0].phases["actor_update"]
    micro = plan_cluster("llama3-8b", "gpu-8", workload=Workload(micro_batch_size=4)).per_device[0]
    micro = micro.phases["actor_update"]
    assert micro["gradients"] == whole["gradients"] * 3  # bfloat16 gradient + float32 running sum
    # Four rows' activations at a time: the step's largest point is then its update, not the forward's end.
    assert "activations" not in micro and micro["new_optimizer_state"] > 0 and whole["activations"] > 0


# --- CLI -------------------------------------------------------------------------------------


def test_l4_cli_plan_shows_the_terms_hosts_and_reason() -> None:
    rc, out, _ = _run(["plan", "--model", "llama3-70b", "--topology", "gpu-8"])
    assert rc == 0
    assert "DOES NOT FIT: device 0 (host 0) needs" in out
    for text in (
        "gradients",
        "new optimizer state",
        "update outputs",
        "kv cache",
        "host 0 (devices 0..7)",
        "across hosts",
    ):
        assert text in out, text
    rc, out, _ = _run(
        ["plan", "--model", "llama3-8b", "--topology", "gpu-2x8", "--layout", "split", "--lora", "--json"]
    )
    data = json.loads(out)
    assert [h["device_ids"] for h in data["per_host"]] == [list(range(8)), list(range(8, 16))]
    # Split over two nodes: each adapter block crosses once into the rollout's node.
    assert data["sync"]["cross_host_bytes"] == data["sync"]["synced_logical_bytes"] > 0
    assert {"host", "by_role", "by_kind", "ram", "ram_bytes", "sync_cross_host_bytes"} <= set(data["per_host"][0])
    assert data["workload"]["rollout_batch_size"] == 16 and data["fits"]["all_fit"] is True


@pytest.mark.parametrize(
    "argv,says",
    [
        # Named as the flags to change (issue 21), never as Workload or Topology fields.
        (["--prompt-length", "0"], "--prompt-length must be a positive int"),
        (["--prompt-length", "200", "--kv-cache-size", "128"], "--kv-cache-size is 128"),
        (["--devices-per-host", "3"], "--devices-per-host must divide"),
        (["--host-memory", "lots"], "--host-memory"),
    ],
)
def test_l4_cli_plan_bad_workload_is_one_line_exit_2(argv: list[str], says: str) -> None:
    rc, out, err = _run(["plan", *argv])
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and says in err


@pytest.mark.cluster
def test_l4_the_compiled_sampler_holds_about_what_the_generate_phase_counts() -> None:
    """XLA's temporaries for the lab's sampler (``model.sampling``) at the workload's shapes,
    beside the plan's generate phase (cache, prefill logits, one layer's attention): measured
    0.83 of the plan on one device, 1.33 on eight (colocated) and 1.24 on the split layout's four."""
    from rlcluster_lab.model.sampling import _SAMPLER, model_compiler_options

    scenario = Scenario(layout="split")
    plan = plan_scenario(scenario)
    work = Workload.of_scenario(scenario)
    cluster = build_cluster(scenario)
    graphdef, state = nnx.split(cluster.rollout.model())
    replicated = NamedSharding(jax.tree.leaves(state)[0].sharding.mesh, P())
    prompts = jax.ShapeDtypeStruct((work.rollout_batch_size, work.prompt_length), jnp.int32, sharding=replicated)
    # The sampler as the lab compiles it (with its platform's and size's compiler options).
    compiled = (
        _SAMPLER.jitted(model_compiler_options(graphdef, state))
        .lower(
            graphdef,
            state,
            prompts,
            np.int64(0),  # the seed, as ``sample`` passes it
            np.float32(1.0),
            max_new_tokens=work.max_tokens,
            cache_size=work.kv_cache_size,
            greedy=False,
            eos_id=1,
            pad_id=0,
        )
        .compile()
    )
    rollout = plan.role_to_mesh["rollout"]["device_ids"]
    generate = next(b for b in plan.per_device if b.device == rollout[0]).phases["generate"]
    assert 0.5 < compiled.memory_analysis().temp_size_in_bytes / sum(generate.values()) < 2.0
