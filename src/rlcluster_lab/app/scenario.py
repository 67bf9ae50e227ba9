"""From knobs to a cluster: the CLI, the notebooks and the tests turn their knobs into a
``Scenario`` (JAX-free) and call ``build_cluster``."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from flax import nnx

from rlcluster_lab.core.config import ClusterConfig, TrainingConfig
from rlcluster_lab.core.limits import check_fits, check_fits_devices, device_free_bytes, limit_bytes
from rlcluster_lab.core.meshes import DEFAULT_LOGICAL_AXIS_RULES, layout_meshes, reachable_layouts
from rlcluster_lab.core.options import Scenario
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.shardings import PlacementError, check_spec
from rlcluster_lab.engines import ENGINES
from rlcluster_lab.model import MODEL_SIZES, get_model_config, init_model, with_lora
from rlcluster_lab.model.scoring import init_score_model
from rlcluster_lab.placement.layout import PlannedMesh
from rlcluster_lab.placement.place import place_model
from rlcluster_lab.placement.programs import trim_compiled_programs
from rlcluster_lab.planner.plan import plan_scenario
from rlcluster_lab.planner.shapes import abstract_leaves
from rlcluster_lab.planner.tables import local_topology
from rlcluster_lab.rl_cluster import RLCluster
from rlcluster_lab.rules.validation import check_scenario


def build_models(scenario: Scenario, role_to_mesh: dict[Role, Any]) -> dict[str, nnx.Module]:
    """Actor, reference (and reward/critic when asked), each created on its role's mesh; values
    are drawn on the host and placed in one transfer per model (no program compiled)."""
    mesh = role_to_mesh[Role.REFERENCE]
    reference = init_model(scenario.model_size, seed=scenario.seed, mesh=mesh)
    if scenario.lora:
        base = place_model(reference, mesh, copy=True) if scenario.lora_separate_base else reference
        actor = with_lora(base, scenario.lora_rank, seed=scenario.seed + 1)
    else:
        actor = place_model(reference, mesh, copy=True, role="actor")
    models: dict[str, nnx.Module] = {"actor": actor, "reference": reference}
    if scenario.with_reward:
        models["reward"] = init_score_model(scenario.model_size, seed=scenario.seed + 2, mesh=role_to_mesh[Role.REWARD])
    if scenario.with_critic:
        models["critic"] = init_score_model(scenario.model_size, seed=scenario.seed + 3, mesh=role_to_mesh[Role.CRITIC])
    return models


def cluster_config(
    scenario: Scenario, role_to_mesh: dict[Role, Any], training_config: TrainingConfig | None = None
) -> ClusterConfig:
    """The ``ClusterConfig`` a scenario asks for on these meshes (validated, nothing allocated)."""
    return ClusterConfig(
        role_to_mesh=role_to_mesh,
        rollout_config=scenario.rollout_config(),
        rollout_engine=scenario.engine,
        offload_to_cpu=scenario.offload,
        training_config=training_config or TrainingConfig(),
        anchor=scenario.anchor,
        reshard=scenario.reshard,
        sync_chunk_bytes=scenario.sync_chunk_bytes,
    )


def validate(
    scenario: Scenario,
    *,
    devices: Sequence[jax.Device] | None = None,
    training_config: TrainingConfig | None = None,
    role_to_mesh: dict[Role, Any] | None = None,
) -> ClusterConfig:
    """Every check a build would make, nothing allocated or compiled: the knobs (P6), the layout on
    these devices, the ``ClusterConfig``, and every role's partition specs from the models' shapes;
    returns the config. Raises ``ConfigError`` or ``ValueError`` with the fix, ``TypeError`` for a
    non-``Scenario``."""
    check_scenario(scenario)
    if role_to_mesh is None:
        r2m = layout_meshes(scenario.layout, devices)
    else:  # anything but a mapping is refused by ClusterConfig, naming role_to_mesh
        r2m = dict(role_to_mesh) if isinstance(role_to_mesh, Mapping) else role_to_mesh
    config = cluster_config(scenario, r2m, training_config)
    meshes = dict(config.role_to_mesh)
    # P7: an engine that arranges the devices its own way (the vllm stand-in) keeps its copy there.
    meshes[Role.ROLLOUT] = ENGINES[scenario.engine].settle_mesh(meshes[Role.ROLLOUT], config.rollout_config)
    err = _unplaceable(scenario, scenario.model_size, config.logical_axis_rules, meshes)
    if err is not None:
        # The knobs that can fix it: the engine when its own mesh is the one that cannot hold the
        # model, the device count, and the model size only when another size fits these meshes.
        own_mesh = err.role == Role.ROLLOUT.value and meshes[Role.ROLLOUT] is not config.role_to_mesh[Role.ROLLOUT]
        another_fits = any(
            m != scenario.model_size and not _unplaceable(scenario, m, config.logical_axis_rules, meshes)
            for m in MODEL_SIZES
        )
        knobs = ("engine",) * own_mesh + ("devices",) + ("model_size",) * another_fits
        problem = err.problem if another_fits else f"{err.problem}; no other model size fits these meshes either"
        raise PlacementError(str(err), knobs=knobs, problem=problem, role=err.role)
    return config


def buildable_layouts(devices: Sequence[Any]) -> list[str]:
    """The standard layouts over ``devices`` whose meshes split every role's parameters for at least
    one model size (over 6 devices none: a (3, 2) mesh divides no model). Decided on paper: whether
    a mesh divides a model depends on its shape alone."""
    return list(_buildable(len(devices)))


@functools.lru_cache(maxsize=64)
def _buildable(count: int) -> tuple[str, ...]:
    def holds(layout: str) -> bool:  # some model size, on the layout's meshes
        meshes = layout_meshes(layout, list(range(count)), make=PlannedMesh.build)
        return any(_unplaceable(Scenario(layout=layout), m, lambda role: None, meshes) is None for m in MODEL_SIZES)

    return tuple(layout for layout in reachable_layouts(range(count)) if holds(layout))


def _unplaceable(
    scenario: Scenario, model_size: str, rules_of: Callable[[Role], Any], meshes: Mapping[Role, Any]
) -> PlacementError | None:
    """``check_spec``'s refusal for the first role whose ``model_size`` parameters its mesh cannot
    split, or None. ``rules_of(role)``: the role's logical axis rules (None: the defaults)."""
    size = get_model_config(model_size)
    lora = scenario.lora_rank if scenario.lora else 0
    roles = [(Role.ACTOR, "lm", lora), (Role.ROLLOUT, "lm", lora), (Role.REFERENCE, "lm", 0)]
    roles += [(Role.REWARD, "score", 0)] if scenario.with_reward else []
    roles += [(Role.CRITIC, "score", 0)] if scenario.with_critic else []
    for role, kind, rank in roles:
        rules = rules_of(role)
        leaves = abstract_leaves(size, rank, kind, tuple(rules) if rules is not None else DEFAULT_LOGICAL_AXIS_RULES)
        try:
            for shape, spec in {(leaf.shape, leaf.spec) for leaf in leaves}:
                check_spec(spec, shape, meshes[role], role.value)
        except PlacementError as err:
            return err
    return None


# Model-sized copies a cluster holds at most per device: actor, a separate LoRA base, reference,
# rollout, anchor, adam moments (2), reward, critic, its adam moments (2), one spare.
_MAX_COPIES = 12
# NumPy draws every initial value in float32 (``model.values.initial_values``).
_DRAW_ITEMSIZE = 4


def check_memory(
    scenario: Scenario, config: ClusterConfig, replacing: Mapping[str, Mapping[str, int]] | None = None
) -> None:
    """Refuse a scenario whose models would not fit in host memory, before any is built: the planner's
    estimate on the config's own meshes, plus one model's initial values while they are drawn (the
    plan is skipped when every role as a float32 copy on every device fits). ``replacing``: the
    memory by device of a cluster the caller releases first, counted as free, so a refusal leaves
    that cluster as it was.

    Raises:
        TooLargeError: the estimate exceeds ``core.limits.limit_bytes()``; the message gives both
            figures and how to ask for less.
    """
    # The engine's KV cache for one prompt, whatever the batch (a batch is checked by generate).
    # Its fix names the knobs: the CLI's report and learn take no --kv-cache-size, so they name --model-size.
    check_fits(
        rollout_bytes(scenario, 1),
        f"a KV cache of {scenario.kv_cache_size:,} slots",
        "lower kv_cache_size or choose a smaller model_size",
        knobs=("kv_cache_size", "model_size"),
    )
    size = get_model_config(scenario.model_size)
    params = size.num_params + (size.lora_params(scenario.lora_rank) if scenario.lora else 0)
    draw = size.num_params * _DRAW_ITEMSIZE
    platform = next(iter(config.role_to_mesh.values())).devices.flat[0].platform
    devices = jax.devices(platform)
    # Devices that report their allocator's figures (accelerators) are compared with the plan too.
    reporting = [d for d in devices if device_free_bytes(d) is not None]
    # What the replaced cluster frees: on CPU every byte is the host's; elsewhere its host kinds.
    held = (replacing or {}).items()
    freed_host = sum(n for _, kinds in held for k, n in kinds.items() if platform == "cpu" or k != "device")
    freed_device = {} if platform == "cpu" else {int(d): int(kinds.get("device", 0)) for d, kinds in held}
    bound = _MAX_COPIES * params * _DRAW_ITEMSIZE * len(devices) + draw + (1 << 20)
    if bound <= limit_bytes(freed_host) and not reporting:
        return
    training = config.training_config
    memory = plan_scenario(
        scenario,
        local_topology(devices),
        role_to_mesh=dict(config.role_to_mesh),
        logical_axis_rules=training.role_to_logical_axis_rule,
        optimizer=training.optimizer,
    ).memory
    if platform == "cpu":
        placed = int(memory["unique_bytes"])
    else:
        placed = sum(int(kinds.get("pinned_host", 0)) for kinds in memory["by_device"].values())
    roles = ["actor", "reference", "rollout"] + ["reward"] * scenario.with_reward + ["critic"] * scenario.with_critic
    what = (
        f"building this scenario (the {scenario.model_size} model"
        + (f" with LoRA rank {scenario.lora_rank}" if scenario.lora else "")
        + f" as {', '.join(roles)} on {len(devices)} {platform} device(s))"
    )
    # The Scenario's fields here; the lab and the CLI name their own widgets and flags for the knobs.
    fix = "ask for less: a smaller model_size, fewer roles (with_reward, with_critic), lora=True or fewer devices"
    knobs = ("model_size", "with_reward", "with_critic", "lora", "devices")
    check_fits(placed + draw, what, fix, freed_host, knobs=knobs)
    # On devices with memory of their own: the planner's resident bytes per device against each allocator's free.
    resident = {int(d): int(kinds.get("device", 0)) for d, kinds in memory["by_device"].items()}
    check_fits_devices(resident, reporting, what, fix, freed_device, knobs=knobs)


def rollout_bytes(scenario: Scenario, rows: int) -> int:
    """Bytes one rollout of ``rows`` completions holds at once, from shapes: the engine's KV cache and
    the float32 logits of every slot (the models themselves are ``check_memory``'s)."""
    size, slots = get_model_config(scenario.model_size), scenario.kv_cache_size
    return size.kv_cache_bytes(rows, slots) + int(rows) * slots * size.vocab_size * 4


def build_cluster(
    scenario: Scenario,
    *,
    devices: Sequence[jax.Device] | None = None,
    training_config: TrainingConfig | None = None,
    role_to_mesh: dict[Role, Any] | None = None,
) -> RLCluster:
    """Build the scenario's models and meshes and construct the cluster, after every check that
    follows from the knobs (``validate``, ``check_memory``). ``devices``: those the layout is built
    on (default ``jax.devices()``); ``role_to_mesh``: meshes that replace the layout's.

    Raises:
        ConfigError: for a combination that cannot work, with the fix.
        TooLargeError: the models would need more host memory than may be allocated; nothing was built.
    """
    config = validate(scenario, devices=devices, training_config=training_config, role_to_mesh=role_to_mesh)
    check_memory(scenario, config)
    # A long session builds many clusters: keep the compiled programs under the bound.
    trim_compiled_programs()
    models = build_models(scenario, dict(config.role_to_mesh))
    with warnings.catch_warnings():
        # The cluster keeps its own record of P4 warnings (cluster.warnings).
        warnings.simplefilter("ignore")
        return RLCluster(tokenizer=None, cluster_config=config, **models)
