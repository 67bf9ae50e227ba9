"""What-if planning (L4): the cluster's placement, memory and sync bytes on paper (``Plan``).
Nothing is allocated, so a 70B model on 256 chips plans in seconds.

The rules are the cluster's own code: ``cluster.construct`` runs with a ``PlannedExecutor``,
so meshes, the sharing map and every branch come from the rule functions, parameter trees
from ``nnx.eval_shape`` over the real constructors (``planner.shapes``), and a spec that
cannot go on a mesh fails in ``check_spec`` with the cluster's message. The tests compare a
plan with a live cluster's buffers: buffers kept through a reshard (P5), the rollout as the
actor, a second load or the engine's copy (P3), optimizer state per trainable leaf (P12), the
anchor (P8), offload (P14, P2), and the sync's transient peak (``planner.sync_peak``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax

from rlcluster_lab.cluster.construct import Placed, Request, construct
from rlcluster_lab.core.config import TrainingConfig
from rlcluster_lab.core.knobs import PLANNER_KNOBS
from rlcluster_lab.core.meshes import describe_mesh, layout_meshes
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.trace import Trace
from rlcluster_lab.engines import ENGINES
from rlcluster_lab.engines.base import leaf_path
from rlcluster_lab.model import ModelConfig
from rlcluster_lab.placement.layout import PlannedMesh
from rlcluster_lab.planner.accounting import SOURCE, fits_summary, memory_summary, sync_summary
from rlcluster_lab.planner.budget import (
    DeviceBudget,
    HostBudget,
    Trainer,
    budgets,
    generate_phase,
    training_state,
    update_phase,
    verdict,
)
from rlcluster_lab.planner.buffers import Buffers, PlannedArray
from rlcluster_lab.planner.executor import PlannedExecutor, given_models
from rlcluster_lab.planner.request import PlanRequest, freeze_rules
from rlcluster_lab.planner.step_memory import FORMULAS, Split, Workload, activation_bytes, kv_cache_bytes
from rlcluster_lab.planner.sync_peak import plan_sync_peak
from rlcluster_lab.planner.tables import Topology, model_config, model_source, with_figures
from rlcluster_lab.planner.tables import topology as get_topology
from rlcluster_lab.rules.anchor import anchor_is_partial
from rlcluster_lab.rules.sharing import sharing_map_json

PathKey = tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Plan:
    """A placement computed from shapes; ``to_json`` gives the planner JSON."""

    model: dict[str, Any]
    topology: dict[str, Any]
    layout: str
    engine: str
    lora_rank: int
    offload: bool
    anchor: str
    rollout_dtype: str | None
    role_to_mesh: dict[str, dict[str, Any]]
    config_role_to_mesh: dict[str, dict[str, Any]]
    mesh_overridden_by_engine: bool
    sharing_map: dict[str, list[str]]
    rollout_branch: str
    memory: dict[str, Any]
    fits: dict[str, Any]
    sync: dict[str, Any]
    decisions: list[dict[str, Any]]
    workload: dict[str, Any] = dataclasses.field(default_factory=dict)
    step: dict[str, Any] = dataclasses.field(default_factory=dict)
    per_device: tuple[DeviceBudget, ...] = ()
    per_host: tuple[HostBudget, ...] = ()
    source: str = SOURCE
    # What was planned, for what checks the plan (``planner.xla_check``); not in the JSON.
    request: PlanRequest | None = dataclasses.field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(dataclasses.replace(self, request=None))
        del out["request"]
        return out


def plan_cluster(
    model: str | ModelConfig = "tiny",
    topology: str | Topology = "local",
    *,
    dtype: str | None = None,
    lora_rank: int | None = None,
    role_to_mesh: Mapping[Role | str, Any] | None = None,
    logical_axis_rules: Mapping[Role | str, Any] | None = None,
    workload: Workload | None = None,
    memory_per_device: int | None = None,
    link_bandwidth: float | None = None,
    devices_per_host: int | None = None,
    host_memory: int | None = None,
    host_link_bandwidth: float | None = None,
    **knobs: Any,
) -> Plan:
    """Plan a cluster: meshes, sharing, memory per role and device, fits, sync bytes.

    ``model``: a name from ``tables.model_names()`` or a ``ModelConfig`` (``dtype`` overrides
    its parameter dtype). ``topology``: a name from ``tables.topology_names()`` or a
    ``Topology``, whose figures ``memory_per_device``, ``link_bandwidth``,
    ``devices_per_host``, ``host_memory`` and ``host_link_bandwidth`` override
    (``tables.with_figures``). ``lora_rank``: None or 0 for no LoRA. ``role_to_mesh``: per
    role, a ``Mesh`` or ``PlannedMesh`` instead of the layout's. ``workload``: the step's
    shapes (default ``Workload()``). ``knobs``: the rest of ``PlanRequest``'s fields: the
    knobs a plan shares with a ``Scenario`` (``layout``, ``lora_separate_base``, ``engine``,
    ``offload``, ``anchor``, ``rollout_dtype``, ``with_reward``, ``with_critic``, ``reshard``,
    ``sync_chunk_bytes``: a sync in chunks), ``vllm_tensor_parallel_size``, ``optimizer`` /
    ``critic_optimizer`` (default adam), and ``sync_programs``, which compiles the sync's
    programs (nothing allocated) to count their temporaries and needs the topology's devices
    here (``local``).
    """
    if isinstance(model, ModelConfig):
        config = model if dtype is None else dataclasses.replace(model, param_dtype=dtype)
        name = config.name
    else:
        config, name = model_config(model, dtype=dtype), model
    topo = with_figures(
        topology if isinstance(topology, Topology) else get_topology(topology),
        memory_per_device=memory_per_device,
        link_bandwidth=link_bandwidth,
        devices_per_host=devices_per_host,
        host_memory=host_memory,
        host_link_bandwidth=host_link_bandwidth,
    )
    request = PlanRequest(
        model=config,
        model_name=name,
        topology=topo,
        lora_rank=lora_rank or 0,
        role_to_mesh=None
        if role_to_mesh is None
        else {Role.parse(r): PlannedMesh.of(m) for r, m in role_to_mesh.items()},
        logical_axis_rules=None
        if logical_axis_rules is None
        else {Role.parse(r): freeze_rules(v) for r, v in logical_axis_rules.items()},
        workload=Workload() if workload is None else workload,
        **knobs,
    )
    return _plan(request)


def plan_scenario(scenario: Any, topology: str | Topology = "local", **overrides: Any) -> Plan:
    """The plan of a ``Scenario``'s knobs (the same ones ``build_cluster`` takes); its
    workload is the scenario's token counts (``Workload.of_scenario``) unless given, its
    model the scenario's size unless ``model`` is given."""
    knobs = {k.field: getattr(scenario, k.field) for k in PLANNER_KNOBS}
    knobs.update(lora_rank=scenario.lora_rank if scenario.lora else 0, workload=Workload.of_scenario(scenario))
    return plan_cluster(**{"model": scenario.model_size, "topology": topology, **knobs, **overrides})


def _meshes(req: PlanRequest) -> dict[Role, PlannedMesh]:
    topo = req.topology
    try:
        r2m = layout_meshes(req.layout, list(topo.ids()), make=PlannedMesh.build)
    except ValueError as err:
        raise ValueError(f"{err} (planning for {topo.name}: {topo.device_count} device(s))") from None
    r2m.update(req.role_to_mesh or {})
    known = set(topo.ids())
    for role, mesh in r2m.items():
        if unknown := sorted(set(mesh.device_ids) - known):
            raise ValueError(
                f"the {role.value} mesh uses device id(s) {unknown} that topology {topo.name} does not have "
                f"(ids {min(known)}..{max(known)})"
            )
    return r2m


def _construct(req: PlanRequest, buf: Buffers, trace: Trace) -> Placed:
    """The cluster's own construction (``cluster.construct``), run on arrays on paper."""
    r2m = _meshes(req)
    rules = {role: req.rules(role) for role in Role}
    tx = TrainingConfig(optimizer=req.optimizer, critic_optimizer=req.critic_optimizer)  # adam unless given
    ex = PlannedExecutor(
        buf, req.model, rules, ENGINES[req.engine], req.vllm_tensor_parallel_size, tx.actor_optimizer(), tx.critic_tx()
    )
    given = given_models(buf, req, r2m)
    request = Request(
        actor=given["actor"],
        reference=given["reference"],
        reward=given.get("reward"),
        critic=given.get("critic"),
        role_to_mesh=r2m,
        engine_kind=req.engine,
        engine_name=req.engine,
        rollout_dtype=req.rollout_dtype,
        offload_to_cpu=req.offload,
        anchor_mode=req.anchor,
        actor_is_module=True,
        reference_is_module=True,
    )
    return construct(ex, request, trace)


def _plan(req: PlanRequest, sync_devices: list[Any] | None = None) -> Plan:
    """``req`` planned; ``sync_devices``: the devices to compile the sync's programs for (by id;
    None: this process's when ``req.sync_programs``)."""
    buf, trace = Buffers(req.reshard), Trace()
    placed = _construct(req, buf, trace)
    actor = placed.actor
    models = {"actor": actor.arrays, "rollout": placed.engine.model.arrays, "reference": placed.reference.arrays}
    models.update({n: getattr(placed, n).arrays for n in ("critic", "reward") if getattr(placed, n) is not None})
    models["anchor"] = placed.anchor
    # What a sync hands over (P13) and the optimizer trains (P12).
    trainable = frozenset(p for p in actor.arrays if p in actor.lora_paths or not placed.lora)
    entries: dict[str, list[PlannedArray]] = {name: list(m.values()) for name, m in models.items()}
    entries["optimizer"] = placed.optimizer
    if placed.critic_optimizer is not None:
        entries["critic_optimizer"] = placed.critic_optimizer
    memory = memory_summary(entries)
    topo = req.topology
    sync = sync_summary(
        buf,
        models["actor"],
        models["rollout"],
        trainable,
        lora=placed.lora,
        copy=placed.engine.owns_weights,
        anchor_mode=req.anchor,
        strategy=req.reshard,
        topo=topo,
    )
    sync["transient_peak"], lines = plan_sync_peak(
        models["actor"],
        models["rollout"],
        models["anchor"],
        trainable,
        copy=placed.engine.owns_weights,
        offload=req.offload,
        partial_anchor=anchor_is_partial(req.anchor, placed.lora),
        chunk_bytes=req.sync_chunk_bytes,
        strategy=req.reshard,
        programs=sync_devices or (_local_devices(topo) if req.sync_programs else None),
    )
    sync["plan"] = list(lines)
    phases, step = _step_phases(req, placed, models, trainable)
    per_device, per_host = budgets(entries, phases, sync, topo)
    fits = fits_summary(memory, sync, topo.memory_per_device, topo.memory_source)
    fits.update(verdict(fits["by_role"], per_device, per_host, topo))
    fits["host_memory_source"] = topo.host_memory_source
    present = {Role(name) for name in models if name != "anchor"}
    config = req.model
    model = {
        "name": req.model_name,
        **dataclasses.asdict(config),
        "num_params": config.num_params,
        "lora_params": config.lora_params(req.lora_rank) if req.lora_rank else 0,
        "architecture": "the lab's decoder (rlcluster_lab.model.transformer.TransformerLM) at these dimensions",
        "source": model_source(req.model_name),
    }
    return Plan(
        model=model,
        topology=topo.to_json(),
        **{k: getattr(req, k) for k in ("layout", "engine", "lora_rank", "offload", "anchor", "rollout_dtype")},
        role_to_mesh={r.value: describe_mesh(m) for r, m in placed.role_to_mesh.items() if r in present},
        config_role_to_mesh={r.value: describe_mesh(m) for r, m in placed.config_role_to_mesh.items() if r in present},
        mesh_overridden_by_engine=placed.mesh_overridden_by_engine,
        sharing_map=sharing_map_json(placed.sharing_map),
        rollout_branch=placed.rollout_branch.value,
        memory=memory,
        fits=fits,
        sync=sync,
        decisions=trace.to_json(),
        workload=req.workload.to_json(),
        step=step,
        per_device=per_device,
        per_host=per_host,
        request=req,
    )


def _local_devices(topo: Topology) -> list[Any]:
    """This process's devices with the topology's ids, to compile the sync's programs on."""
    try:
        devices = {int(d.id): d for d in jax.devices(topo.platform)}
    except RuntimeError:
        devices = {}
    if missing := [i for i in topo.ids() if i not in devices]:
        raise ValueError(
            f"sync_programs compiles the sync's reshard programs on this process's devices, but topology "
            f"{topo.name} has device id(s) {missing[:5]} that are not here; plan it with sync_programs=False "
            "(the peak then leaves the programs' temporaries out)"
        )
    return [devices[i] for i in topo.ids()]


def _step_phases(
    req: PlanRequest, placed: Placed, models: Mapping[str, Mapping[PathKey, PlannedArray]], trainable: frozenset
) -> tuple[dict[str, dict[int, dict[str, int]]], dict[str, Any]]:
    """What each phase of a step adds per device (``budget``), and the step's figures."""
    config, work, rank = req.model, req.workload, req.lora_rank
    actor = models["actor"]
    actor_split = Split.of(placed.role_to_mesh[Role.ACTOR], req.rules(Role.ACTOR))
    rollout_mesh = placed.role_to_mesh[Role.ROLLOUT]
    rollout_split = Split.of(rollout_mesh, req.rules(Role.ROLLOUT))
    trained = [actor[p] for p in sorted(trainable, key=leaf_path)]
    trainers = {"actor_update": Trainer(list(actor.values()), trained, placed.optimizer, actor_split, lora_rank=rank)}
    step: dict[str, Any] = {
        "source": "computed from the model's dimensions and the workload (planner.step_memory)",
        "formulas": FORMULAS,
        "actor_split": dataclasses.asdict(actor_split),
        "rollout_split": dataclasses.asdict(rollout_split),
        "activations_per_device": {"actor": activation_bytes(config, work, actor_split, lora_rank=rank)},
        "kv_cache_per_device": kv_cache_bytes(config, work.rollout_batch_size, work.kv_cache_size, rollout_split),
        "kv_cache_bytes": kv_cache_bytes(config, work.rollout_batch_size, work.kv_cache_size),
        "actor_training_state": training_state(
            trainers["actor_update"], work, config.num_params + (config.lora_params(rank) if rank else 0)
        ),
    }
    if placed.critic_optimizer is not None and "critic" in models:
        critic = list(models["critic"].values())
        critic_split = Split.of(placed.role_to_mesh[Role.CRITIC], req.rules(Role.CRITIC))
        trainers["critic_update"] = Trainer(critic, critic, placed.critic_optimizer, critic_split, value_head=True)
        step["critic_split"] = dataclasses.asdict(critic_split)
        step["activations_per_device"]["critic"] = activation_bytes(config, work, critic_split, value_head=True)
    platform = req.topology.platform
    phases = {name: update_phase(config, t, work, req.offload, platform) for name, t in trainers.items()}
    phases["generate"] = generate_phase(
        config, list(models["rollout"].values()), rollout_mesh.device_ids, rollout_split, work, req.offload, platform
    )
    return phases, step
