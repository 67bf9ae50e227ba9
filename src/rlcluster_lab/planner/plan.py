"""What-if planning (L4): the cluster's placement, memory and sync bytes on paper.

``plan_cluster`` takes a model (one of the lab's sizes or a published
architecture, ``plan_tables``), a topology (``local`` or a table entry) and
the knobs of a ``Scenario``, and returns a ``Plan``: which mesh each role gets,
the sharing map, the rollout branch, per-role per-device bytes, whether each
role fits a per-device memory, and what a weight sync moves and how long the
link bandwidth says that takes. No array is allocated, so a 70B model on 256
chips plans in seconds on a laptop. ``plan_cli`` holds the ``plan``
subcommand and the text form.

The rules are the cluster's own code, not a copy: planned meshes go through
``meshes.layout_meshes`` and the vllm engine's ``rearranged_device_grid``
(P7); the sharing map is ``sharing.build_sharing_map`` (P1, P2) and the
rollout branch ``sharing.rollout_branch`` (P3); parameter trees come from
``nnx.eval_shape`` over the real constructors and partition specs from the
cluster's logical-axis rules (``plan_shapes``); a spec that cannot go on a
mesh fails in ``placement.check_spec`` with the cluster's message.

What the plan models of the placement itself (the tests compare it with a
walk of a live cluster's buffers for every layout x LoRA, the own-copy
engines, offload, a separate LoRA base, reward and critic models):

- Buffers. Each array is a shard per device of its mesh; a shard lives in a
  buffer identified by where it was made. A reshard (P5) keeps a source
  buffer where the destination shard is exactly the source shard on the same
  device in the same memory kind (on CPU the lab reshards shard by shard, so
  this holds shard by shard; on GPU/TPU ``jax.device_put`` reuses buffers only
  when the whole layout is equivalent), unless a copy is asked for or a dtype
  cast happens; every other shard is a new buffer. A model already on the
  target mesh is kept as is (P5).
- Construction follows ``Scenario``/``build_models`` and the cluster: the
  reference is placed on its mesh; the actor is a copy of it, or with LoRA
  adapters built over its buffers (a copy with ``lora_separate_base``); the
  rollout model is the actor (shared), a second load of the actor as given,
  cast to the rollout dtype (second_copy), or the engine's own copy on its
  mesh (vllm, sglang_jax: always a copy, in the actor's dtype); reward and
  critic are placed on their meshes; the optimizer state has a leaf per
  trainable parameter with its sharding (adam's mu, nu) and any other leaf
  (the step count) replicated on the actor's mesh; the anchor (P8) is the
  actor's full state pinned to host in new buffers, or with
  ``anchor="trainable"`` and a LoRA actor only the adapters, the backbone
  being the actor's own buffers.
- Offload (P14). Every role ends in pinned_host in buffers of its own, except
  what the cluster keeps together: a rollout on the shared branch with the
  vanilla engine is the actor; a reference linked to the actor (P2) holds the
  actor's frozen buffers (loading a shared role updates the others); the
  anchor is the actor's own pinned buffers (pinning keeps leaves already in
  pinned_host, so the snapshot adds nothing).

Sync (P13), per the lab's SyncReport definitions: the filter is LoRAParam
for a LoRA actor, else Param; the source is the actor's leaves, the
destination the rollout model's. For each destination shard on device d with
box B: *reused* if the reshard keeps the source buffer (same rule as above;
never for an engine that owns its weights, nor with a dtype cast); else the
elements of B inside the source shard on d are *copied_same_device* and the
rest *moved_cross_device* (a plan moves no more than the placement forces);
minimum_cross_device = |B| - |B & local source box|
(``boxes.minimum_cross_device_elements``, 0 when reused). Bytes are
counted in the source dtype; synced is the sum over destination shards, so
synced = moved + copied + reused for every leaf. (Decided here: a shard
that is the local source shard but lands in a new buffer, because the
destination is in pinned_host or in another dtype, counts as copied within
its device. The measured report counts copies from the reshard's transfer
log, which misses this one where the layout is equivalent and the
destination is pinned_host, or where the destination casts, so there its
copied bytes are lower and its leaf sum falls short of synced.) ``arrived_by_device`` is the cross-device bytes
arriving on each device. ``anchor_bytes`` is what the sync pins anew: the
full state (or adapters only with ``anchor="trainable"``); 0 under offload,
where the actor is already pinned and the snapshot keeps its buffers.
``peak_extra_bytes[device][kind]`` is the new destination buffers on that
device in the destination dtype (they exist before the old ones are
released) plus the new anchor buffers under pinned_host; transient buffers
inside a reshard (a cast's source-dtype copy, a memory-kind round trip) are
not counted. ``estimated_seconds`` = max over devices of arrived bytes /
link bandwidth, the bandwidth being what one device can receive (half a
datasheet's bidirectional figure): a lower bound that ignores latency,
multi-hop routes and contention.

Across hosts (a host is the devices of one process, ``Topology.hosts``): each
destination shard's ``cross_host_bytes`` are the elements no source shard on
its host holds, the least that must cross from another host (the rest of
what moves stays between devices of one host); ``estimated_seconds`` takes
the within-host bytes over the device link and the cross-host bytes over the
host link, the two at once.

Fits (``planner.budget``): a device's peak is its resident bytes (each buffer
once) plus the largest phase of a step (generate's KV cache; an update's
gradients, activations and outputs; a sync's new buffers), with the formulas
of ``planner.step_memory`` at the plan's ``Workload``; a host's peak is its
RAM (pinned and offloaded state, the anchor, a sync's newly pinned anchor).
Everything fits when every device and every host is within its memory and
every role fits one device (an offloaded role comes to device for its
operation, P14); ``fits["reason"]`` names the device or host and its largest
terms when not. ``per_device`` and ``per_host`` hold the figures
(``DeviceBudget``, ``HostBudget``); ``resident`` and ``with_sync_peak`` keep
their earlier meaning (device-kind bytes, and those plus the sync's peak).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import optax

from rlcluster_lab.cluster.construct import Request, construct
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.meshes import DEFAULT_LOGICAL_AXIS_RULES, LAYOUTS, describe_mesh, layout_meshes
from rlcluster_lab.core.options import (
    ANCHOR_MODES,
    ENGINES,
    RESHARD_STRATEGIES,
    check_sync_chunk_bytes,
    check_tensor_parallel_size,
    dtype_name,
)
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.trace import Trace
from rlcluster_lab.model import ModelConfig
from rlcluster_lab.planner.accounting import SOURCE, UNITS, fits_summary, memory_summary, sync_summary
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
from rlcluster_lab.planner.shapes import PlannedMesh
from rlcluster_lab.planner.step_memory import FORMULAS, Split, Workload, activation_bytes, kv_cache_bytes
from rlcluster_lab.planner.sync_peak import plan_sync_peak
from rlcluster_lab.planner.tables import Topology, model_config, model_source, with_figures
from rlcluster_lab.planner.tables import topology as get_topology
from rlcluster_lab.rules.sharing import sharing_map_json
from rlcluster_lab.rules.steps import p13_sync_order
from rlcluster_lab.rules.validation import check_lora_rank

Rules = tuple[tuple[str, Any], ...]
PathKey = tuple[Any, ...]
Model = dict[PathKey, PlannedArray]


# --------------------------------------------------------------------------- the request


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """The knobs of one plan (those of a ``Scenario``, plus model, topology and dtypes)."""

    model: ModelConfig
    model_name: str
    topology: Topology
    layout: str = "colocated"
    lora_rank: int = 0  # 0: no LoRA
    lora_separate_base: bool = False
    engine: str = "vanilla"
    vllm_tensor_parallel_size: int | None = None
    offload: bool = False
    anchor: str = "full"
    rollout_dtype: Any = None  # a name or a JAX/NumPy dtype; held as its name
    with_reward: bool = False
    with_critic: bool = False
    role_to_mesh: Mapping[Role, PlannedMesh] | None = None  # overrides the layout's meshes
    logical_axis_rules: Mapping[Role, Rules] | None = None
    optimizer: optax.GradientTransformation | None = None  # default: adam, as TrainingConfig
    critic_optimizer: optax.GradientTransformation | None = None  # default: adam, as TrainingConfig
    reshard: str = "xla"
    workload: Workload = Workload()
    sync_chunk_bytes: int | None = None
    sync_programs: bool = False  # compile the sync's reshard programs for their temporaries

    def __post_init__(self) -> None:
        check_sync_chunk_bytes(self.sync_chunk_bytes)
        if self.reshard not in RESHARD_STRATEGIES:
            raise ConfigError(
                f"unknown reshard strategy {self.reshard!r}; choose one of {', '.join(RESHARD_STRATEGIES)}"
            )
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}; choose one of {', '.join(LAYOUTS)}")
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")
        if self.anchor not in ANCHOR_MODES:
            raise ValueError(f"unknown anchor mode {self.anchor!r}; choose one of {', '.join(ANCHOR_MODES)}")
        if self.lora_rank < 0:
            raise ValueError(f"LoRA rank must be >= 0 (0: no LoRA), got {self.lora_rank}")
        if self.lora_rank:
            check_lora_rank(self.lora_rank, self.model)
        check_tensor_parallel_size(self.vllm_tensor_parallel_size)
        if self.lora_separate_base and not self.lora_rank:
            raise ConfigError("lora_separate_base needs LoRA: the separate base is the LoRA actor's frozen part")
        if self.rollout_dtype is not None:  # a name or a JAX/NumPy dtype; the plan reads the name
            object.__setattr__(self, "rollout_dtype", dtype_name(self.rollout_dtype, "rollout_dtype"))

    def rules(self, role: Role) -> Rules:
        rules = (self.logical_axis_rules or {}).get(role)
        return _freeze_rules(rules if rules is not None else DEFAULT_LOGICAL_AXIS_RULES)


def _freeze_rules(rules: Any) -> Rules:
    return tuple((str(k), tuple(v) if isinstance(v, list) else v) for k, v in rules)


# --------------------------------------------------------------------------- the plan


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

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def host(self, index: int) -> HostBudget:
        """The budget of host ``index`` (``per_host`` by host index)."""
        for h in self.per_host:
            if h.host == index:
                return h
        raise KeyError(f"this plan has hosts {[h.host for h in self.per_host]}, not {index}")


def plan_cluster(
    model: str | ModelConfig = "tiny",
    topology: str | Topology = "local",
    *,
    layout: str = "colocated",
    lora_rank: int | None = None,
    lora_separate_base: bool = False,
    engine: str = "vanilla",
    vllm_tensor_parallel_size: int | None = None,
    offload: bool = False,
    anchor: str = "full",
    dtype: str | None = None,
    rollout_dtype: str | None = None,
    with_reward: bool = False,
    with_critic: bool = False,
    role_to_mesh: Mapping[Role | str, Any] | None = None,
    logical_axis_rules: Mapping[Role | str, Any] | None = None,
    optimizer: optax.GradientTransformation | None = None,
    critic_optimizer: optax.GradientTransformation | None = None,
    memory_per_device: int | None = None,
    link_bandwidth: float | None = None,
    reshard: str = "xla",
    workload: Workload | None = None,
    devices_per_host: int | None = None,
    host_memory: int | None = None,
    host_link_bandwidth: float | None = None,
    sync_chunk_bytes: int | None = None,
    sync_programs: bool = False,
) -> Plan:
    """Plan a cluster: meshes, sharing, memory per role and device, fits, sync bytes.

    ``model``: a name from ``plan_tables.model_names()`` or a ``ModelConfig``
    (``dtype`` overrides its parameter dtype). ``topology``: a name from
    ``plan_tables.topology_names()`` or a ``Topology``; ``memory_per_device``
    (bytes) and ``link_bandwidth`` (bytes/s a device receives) override its
    figures. ``role_to_mesh`` replaces the layout's meshes per role (real
    ``Mesh`` objects or ``PlannedMesh``); roles left out keep the layout's.
    ``optimizer`` / ``critic_optimizer``: the actor's and (``with_critic``) the
    critic's optimizers, whose states are planned (default: adam each).
    ``workload``: the step's shapes (rows, prompt and completion lengths, cache
    slots, micro-batch, rematerialisation) that activations and the KV cache
    scale with (default: the lab's default step, ``Workload()``).
    ``devices_per_host``, ``host_memory`` (bytes) and ``host_link_bandwidth``
    (bytes/s a device receives from other hosts) override the topology's.
    ``sync_chunk_bytes`` plans a sync handed over in chunks (``ClusterConfig.sync_chunk_bytes``);
    ``sync_programs`` compiles the sync's reshard programs (no array is allocated) so its
    transient peak includes their temporaries; it needs the topology's devices in this
    process (the ``local`` topology).
    """
    if isinstance(model, ModelConfig):
        config = model if dtype is None else dataclasses.replace(model, param_dtype=dtype)
        name = config.name
    else:
        config, name = model_config(model, dtype=dtype), model
    figures = dict(
        memory_per_device=memory_per_device,
        link_bandwidth=link_bandwidth,
        devices_per_host=devices_per_host,
        host_memory=host_memory,
        host_link_bandwidth=host_link_bandwidth,
    )
    if isinstance(topology, Topology):
        topo = with_figures(topology, **figures)
    else:
        topo = get_topology(topology, **figures)
    request = PlanRequest(
        model=config,
        model_name=name,
        topology=topo,
        layout=layout,
        lora_rank=int(lora_rank or 0),
        lora_separate_base=lora_separate_base,
        engine=engine,
        vllm_tensor_parallel_size=vllm_tensor_parallel_size,
        offload=offload,
        anchor=anchor,
        rollout_dtype=rollout_dtype,
        with_reward=with_reward,
        with_critic=with_critic,
        role_to_mesh=None
        if role_to_mesh is None
        else {Role.parse(r): PlannedMesh.of(m) for r, m in role_to_mesh.items()},
        logical_axis_rules=None
        if logical_axis_rules is None
        else {Role.parse(r): _freeze_rules(v) for r, v in logical_axis_rules.items()},
        optimizer=optimizer,
        critic_optimizer=critic_optimizer,
        reshard=reshard,
        workload=Workload() if workload is None else workload,
        sync_chunk_bytes=sync_chunk_bytes,
        sync_programs=sync_programs,
    )
    return _plan(request)


def plan_scenario(scenario: Any, topology: str | Topology = "local", **overrides: Any) -> Plan:
    """The plan of a ``Scenario``'s knobs (the same ones ``build_cluster`` takes); its
    workload is the scenario's token counts (``Workload.of_scenario``) unless given."""
    knobs = dict(
        workload=Workload.of_scenario(scenario),
        layout=scenario.layout,
        lora_rank=scenario.lora_rank if scenario.lora else 0,
        lora_separate_base=scenario.lora_separate_base,
        engine=scenario.engine,
        offload=scenario.offload,
        anchor=getattr(scenario, "anchor", "full"),
        rollout_dtype=scenario.rollout_dtype,
        with_reward=scenario.with_reward,
        with_critic=scenario.with_critic,
        reshard=getattr(scenario, "reshard", "xla"),
        sync_chunk_bytes=getattr(scenario, "sync_chunk_bytes", None),
    )
    knobs.update(overrides)
    return plan_cluster(scenario.model_size, topology, **knobs)


# --------------------------------------------------------------------------- construction


@dataclasses.dataclass
class _Placed:
    """The roles of a planned cluster, after construction."""

    models: dict[str, Model]  # actor, rollout, reference, reward, critic, anchor
    optimizer: list[PlannedArray]
    critic_optimizer: list[PlannedArray] | None
    role_to_mesh: dict[Role, PlannedMesh]
    config_role_to_mesh: dict[Role, PlannedMesh]
    sharing_map: Any
    branch: str
    trace: Trace
    buffers: Buffers
    lora: bool
    trainable: frozenset[PathKey]  # what a sync hands over (P13) and the optimizer trains (P12)
    owns_weights: bool


def _meshes(req: PlanRequest) -> dict[Role, PlannedMesh]:
    topo = req.topology
    try:
        r2m = layout_meshes(req.layout, list(topo.ids()), make=PlannedMesh.build)
    except ValueError as err:
        raise ValueError(f"{err} (planning for {topo.name}: {topo.device_count} device(s))") from None
    if req.role_to_mesh:
        r2m.update(req.role_to_mesh)
    known = set(topo.ids())
    for role, mesh in r2m.items():
        unknown = sorted(set(mesh.device_ids) - known)
        if unknown:
            raise ValueError(
                f"the {role.value} mesh uses device id(s) {unknown} that topology {topo.name} does not have "
                f"(ids {min(known)}..{max(known)})"
            )
    return r2m


def _construct(req: PlanRequest) -> _Placed:
    """The cluster's own construction (``cluster.construct``), run on arrays on paper."""
    buf = Buffers(req.reshard, req.topology.ids()[0])
    r2m = _meshes(req)
    tx = req.optimizer if req.optimizer is not None else optax.adam(3e-3)
    ex = PlannedExecutor(
        buf,
        req.model,
        {role: req.rules(role) for role in Role},
        req.engine,
        req.vllm_tensor_parallel_size,
        tx,
        req.critic_optimizer,
    )
    # Scenario.build_models places the models it makes without rules: the family's defaults.
    given = given_models(
        buf,
        req.model,
        r2m,
        lora_rank=req.lora_rank,
        lora_separate_base=req.lora_separate_base,
        with_reward=req.with_reward,
        with_critic=req.with_critic,
        default_rules=_freeze_rules(DEFAULT_LOGICAL_AXIS_RULES),
    )
    trace = Trace()
    placed = construct(
        ex,
        Request(
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
        ),
        trace,
    )
    actor = placed.actor
    models = {"actor": actor.arrays, "rollout": placed.engine.model.arrays, "reference": placed.reference.arrays}
    for name in ("critic", "reward"):
        role_model = getattr(placed, name)
        if role_model is not None:
            models[name] = role_model.arrays
    models["anchor"] = placed.anchor
    trainable = frozenset(p for p in actor.arrays if p in actor.lora_paths or not placed.lora)
    return _Placed(
        models,
        placed.optimizer,
        placed.critic_optimizer,
        placed.role_to_mesh,
        placed.config_role_to_mesh,
        placed.sharing_map,
        placed.rollout_branch.value,
        trace,
        buf,
        placed.lora,
        trainable,
        placed.engine.owns_weights,
    )


# --------------------------------------------------------------------------- assembling a plan


def _plan(req: PlanRequest) -> Plan:
    placed = _construct(req)
    entries: dict[str, list[PlannedArray]] = {name: list(m.values()) for name, m in placed.models.items()}
    entries["optimizer"] = placed.optimizer
    if placed.critic_optimizer is not None:
        entries["critic_optimizer"] = placed.critic_optimizer
    memory = memory_summary(entries)
    topo = req.topology
    host_of = topo.host_of()
    sync = sync_summary(
        placed.buffers,
        placed.models["actor"],
        placed.models["rollout"],
        placed.trainable,
        lora=placed.lora,
        copy=placed.owns_weights,
        anchor_mode=req.anchor,
        offload=req.offload,
        link_bandwidth=topo.link_bandwidth,
        strategy=req.reshard,
        host_of=host_of,
        host_link_bandwidth=topo.host_link_bandwidth,
    )
    sync["transient_peak"] = plan_sync_peak(
        placed.models["actor"],
        placed.models["rollout"],
        placed.models["anchor"],
        placed.trainable,
        copy=placed.owns_weights,
        offload=req.offload,
        partial_anchor=placed.lora and req.anchor == "trainable",
        chunk_bytes=req.sync_chunk_bytes,
        strategy=req.reshard,
        order=p13_sync_order(req.sync_chunk_bytes, req.offload),
        programs=_local_devices(topo) if req.sync_programs else None,
    )
    phases, step = _step_phases(req, placed)
    per_device, per_host = budgets(
        entries, phases, sync, topo.ids(), host_of, topo.memory_per_device, topo.host_memory, topo.platform
    )
    fits = fits_summary(memory, sync, topo.memory_per_device, topo.memory_source)
    fits.update(verdict(fits["by_role"], per_device, per_host, topo.memory_per_device, topo.host_memory))
    fits["host_memory_source"] = topo.host_memory_source
    fits["rule"] = (
        "everything fits when every device's peak (its resident bytes, each buffer once, plus the largest "
        "phase of a step: generate's KV cache, an update's gradients, activations and outputs, a sync's new "
        "buffers) is at most the memory per device, every role fits one device (an offloaded role comes to "
        "device for its operation), and every host's RAM peak is at most the host memory (when known)"
    )
    present = {Role.ACTOR, Role.ROLLOUT, Role.REFERENCE}
    present |= {Role.REWARD} if req.with_reward else set()
    present |= {Role.CRITIC} if req.with_critic else set()
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
        layout=req.layout,
        engine=req.engine,
        lora_rank=req.lora_rank,
        offload=req.offload,
        anchor=req.anchor,
        rollout_dtype=req.rollout_dtype,
        role_to_mesh={r.value: describe_mesh(m) for r, m in placed.role_to_mesh.items() if r in present},
        config_role_to_mesh={r.value: describe_mesh(m) for r, m in placed.config_role_to_mesh.items() if r in present},
        mesh_overridden_by_engine=placed.role_to_mesh[Role.ROLLOUT] != placed.config_role_to_mesh[Role.ROLLOUT],
        sharing_map=sharing_map_json(placed.sharing_map),
        rollout_branch=placed.branch,
        memory=memory,
        fits=fits,
        sync=sync,
        decisions=placed.trace.to_json(),
        workload=req.workload.to_json(),
        step=step,
        per_device=per_device,
        per_host=per_host,
    )


def _local_devices(topo: Topology) -> list[Any]:
    """This process's devices with the topology's ids, to compile the sync's programs on."""
    try:
        devices = {int(d.id): d for d in jax.devices(topo.platform)}
    except RuntimeError:
        devices = {}
    missing = [i for i in topo.ids() if i not in devices]
    if missing:
        raise ValueError(
            f"sync_programs compiles the sync's reshard programs on this process's devices, but topology "
            f"{topo.name} has device id(s) {missing[:5]} that are not here; plan it with sync_programs=False "
            "(the peak then leaves the programs' temporaries out)"
        )
    return [devices[i] for i in topo.ids()]


def _step_phases(req: PlanRequest, placed: _Placed) -> tuple[dict[str, dict[int, dict[str, int]]], dict[str, Any]]:
    """What each phase of a step adds per device (``budget``), and the step's figures."""
    config, work = req.model, req.workload
    actor = placed.models["actor"]
    actor_split = Split.of(placed.role_to_mesh[Role.ACTOR], req.rules(Role.ACTOR))
    rollout_mesh = placed.role_to_mesh[Role.ROLLOUT]
    rollout_split = Split.of(rollout_mesh, req.rules(Role.ROLLOUT))
    trainers = {
        "actor_update": Trainer(
            list(actor.values()),
            [actor[p] for p in sorted(placed.trainable, key=lambda k: "/".join(map(str, k)))],
            placed.optimizer,
            actor_split,
            lora_rank=req.lora_rank,
        )
    }
    step: dict[str, Any] = {
        "source": "computed from the model's dimensions and the workload (planner.step_memory)",
        "formulas": FORMULAS,
        "actor_split": dataclasses.asdict(actor_split),
        "rollout_split": dataclasses.asdict(rollout_split),
        "activations_per_device": {
            "actor": activation_bytes(config, work, actor_split, lora_rank=req.lora_rank),
        },
        "kv_cache_per_device": kv_cache_bytes(config, work.rollout_batch_size, work.kv_cache_size, rollout_split),
        "kv_cache_bytes": kv_cache_bytes(config, work.rollout_batch_size, work.kv_cache_size),
        "actor_training_state": training_state(
            trainers["actor_update"],
            work,
            config.num_params + (config.lora_params(req.lora_rank) if req.lora_rank else 0),
        ),
    }
    if placed.critic_optimizer is not None and "critic" in placed.models:
        critic = list(placed.models["critic"].values())
        critic_split = Split.of(placed.role_to_mesh[Role.CRITIC], req.rules(Role.CRITIC))
        trainers["critic_update"] = Trainer(critic, critic, placed.critic_optimizer, critic_split, value_head=True)
        step["critic_split"] = dataclasses.asdict(critic_split)
        step["activations_per_device"]["critic"] = activation_bytes(config, work, critic_split, value_head=True)
    phases = {name: update_phase(config, t, work, req.offload) for name, t in trainers.items()}
    phases["generate"] = generate_phase(
        config, list(placed.models["rollout"].values()), rollout_mesh.device_ids, rollout_split, work, req.offload
    )
    return phases, step


__all__ = [
    "ANCHOR_MODES",
    "DeviceBudget",
    "HostBudget",
    "Plan",
    "PlanRequest",
    "Workload",
    "SOURCE",
    "UNITS",
    "fits_summary",
    "memory_summary",
    "plan_cluster",
    "plan_scenario",
    "sync_summary",
]
