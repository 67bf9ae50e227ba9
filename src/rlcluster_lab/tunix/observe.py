"""Reading a constructed Tunix ``RLCluster``: its models, meshes and sharing map, and each
construction decision as it shows in that state (L1, observed). Tunix records no trace: a
decision is read back from what construction left and, where only the state before tells (P5,
P7, the P4 warning), from what the cluster was handed (``Given``); each record says which."""

from __future__ import annotations

import enum
from typing import Any

import numpy as np
from flax import nnx

from rlcluster_lab.core.meshes import describe_mesh
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.shardings import array_leaves, memory_kinds
from rlcluster_lab.measure.sync import flat_leaves
from rlcluster_lab.model import is_lora
from rlcluster_lab.placement.buffers import sharing_backbone, state_bytes
from rlcluster_lab.placement.transfers import shard_keys
from rlcluster_lab.rules.anchor import AnchorBranch
from rlcluster_lab.rules.loading import LoadBranch, OffloadBranch
from rlcluster_lab.rules.reference import ReferenceBranch
from rlcluster_lab.rules.rollout import MeshBranch, RolloutBranch
from rlcluster_lab.rules.sharing import LinkBranch, same_devices, shares
from rlcluster_lab.rules.steps import ParamsBranch
from rlcluster_lab.tunix.adapters import lab_role
from rlcluster_lab.tunix.build import Given, leaf_layouts

OBSERVED = "observed: read back from the constructed cluster's state"
OBSERVED_GIVEN = "observed: the cluster's state against what it was handed"
# Tunix's own words for a P4 warning (rl_cluster.py logs it when a linked reference holds its own backbone).
P4_WARNING_MARK = "backbone"


def tunix_models(cluster: Any) -> dict[str, nnx.Module]:
    """Role name -> the module Tunix holds for it (the rollout: the module its engine samples with)."""
    out = {"actor": cluster.actor_trainer.model, "rollout": cluster.rollout.model()}
    worker = cluster.inference_worker
    for name in ("reference", "reward", "critic"):
        if name in worker._models:  # noqa: SLF001  (the worker has no public listing of its roles)
            out[name] = worker.get_model(name)
    critic_trainer = getattr(cluster, "_critic_trainer", None)
    if critic_trainer is not None:
        out["critic"] = critic_trainer.model
    return out


def tunix_entries(cluster: Any) -> dict[str, Any]:
    """Entry name -> the state Tunix holds for it (L2): each model's, the anchor's, each optimizer state."""
    entries = {name: nnx.state(model) for name, model in tunix_models(cluster).items()}
    anchor = anchor_state(cluster)
    if anchor is not None:
        entries["anchor"] = anchor
    # Each trainer's optimizer's own state (its step count and the optax state), not the model it trains.
    entries["optimizer"] = nnx.state(cluster.actor_trainer.optimizer)
    critic_trainer = getattr(cluster, "_critic_trainer", None)
    if critic_trainer is not None:
        entries["critic_optimizer"] = nnx.state(critic_trainer.optimizer)
    return entries


def sharing_map(cluster: Any) -> dict[Role, tuple[Role, ...]]:
    """Tunix's backbone sharing map, in the lab's roles."""
    raw = cluster._backbone_sharing_map  # noqa: SLF001  (no public accessor in 0.1.7)
    return {lab_role(r): tuple(lab_role(o) for o in others) for r, others in raw.items() if others}


def role_meshes(cluster: Any, present: set[Role] | None = None) -> dict[Role, Any]:
    """Each role's mesh as constructed (after P7), for the roles present."""
    return {lab_role(r): m for r, m in cluster.r2m.items() if present is None or lab_role(r) in present}


def engine_name(cluster: Any) -> str:
    """The engine as the config names it: a string, or the engine class's name."""
    engine = cluster.cluster_config.rollout_engine
    if isinstance(engine, str):
        return engine
    return "vllm" if getattr(engine, "__name__", "") == "VllmStandInRollout" else getattr(engine, "__name__", "custom")


def observation(
    rule: str, test: str, values: dict[str, Any], outcome: str, branch: Any, source: str = OBSERVED
) -> dict[str, Any]:
    """A decision as the lab's trace records it (the branch as its value: "linked", ...), with its ``source``."""
    value = branch.value if isinstance(branch, enum.Enum) else str(branch)
    return {"rule": rule, "test": test, "values": values, "outcome": outcome, "branch": value, "source": source}


def observed_decisions(cluster: Any, given: Given | None = None) -> list[dict[str, Any]]:
    """The construction decisions (P1-P5, P7, P8, P12, P14) as the cluster's state shows them; without
    ``given``, P5 is left out, P1 and P7 read the constructed mesh, and P4 buffer identity alone."""
    models = tunix_models(cluster)
    smap = sharing_map(cluster)
    meshes = role_meshes(cluster)
    asked = dict(given.role_to_mesh) if given is not None else {}
    engine = engine_name(cluster)
    own_mesh = getattr(cluster.rollout, "mesh", None)  # the mesh the engine exposes (P7)
    replaced = own_mesh is not None and meshes.get(Role.ROLLOUT) is own_mesh
    actor_mesh = asked.get(Role.ACTOR, meshes[Role.ACTOR])
    rollout_asked = asked.get(Role.ROLLOUT, None if replaced else meshes[Role.ROLLOUT])
    rollout_text = describe_mesh(rollout_asked) if rollout_asked is not None else None
    equal = bool(rollout_asked == actor_mesh) if rollout_asked is not None else None
    source = OBSERVED_GIVEN if given is not None else OBSERVED
    actor, reference = models["actor"], models.get("reference")
    link = shares(smap, Role.ACTOR, Role.ROLLOUT)
    ref_link = shares(smap, Role.ACTOR, Role.REFERENCE)
    with_actor = list(smap.get(Role.ACTOR, ()))
    propagated = [(a, b) for a in with_actor for b in with_actor if a != b and shares(smap, a, b)]
    out = [
        observation(
            "P1",
            "role_to_mesh[ACTOR] == role_to_mesh[ROLLOUT] (read from the sharing map)",
            {
                "actor_mesh": describe_mesh(actor_mesh),
                "rollout_mesh": rollout_text,
                "same_devices": same_devices(actor_mesh, rollout_asked) if rollout_asked is not None else None,
                "equal": equal,
            },
            "linked: rollout and actor may share weights" if link else "not linked: the rollout gets its own weights",
            LinkBranch.LINKED if link else LinkBranch.NOT_LINKED,
            source,
        ),
        observation(
            "P2",
            "LoRA actor, a reference, reference mesh == actor mesh (read from the sharing map)",
            {
                "actor_has_lora": is_lora(actor),
                "has_reference": reference is not None,
                "meshes_equal": bool(meshes.get(Role.REFERENCE) == meshes[Role.ACTOR]),
            },
            "actor and reference linked both ways" if ref_link else "reference not linked",
            LinkBranch.LINKED if ref_link else LinkBranch.NOT_LINKED,
        ),
        observation(
            "P2",
            "propagate: roles linked to ACTOR are linked to each other (read from the sharing map)",
            {"linked_to_actor": [r.value for r in with_actor]},
            f"{len(propagated)} link(s) between roles linked to the actor",
            LinkBranch.PROPAGATED,
        ),
    ]
    if given is not None:
        out.append(_load_decision("actor", actor, given, "actor", meshes[Role.ACTOR]))
    branch = RolloutBranch.ENGINE_INITIAL_VALUE if engine != "vanilla" else RolloutBranch.SECOND_COPY
    branch = RolloutBranch.SHARED if link else branch
    out.append(
        observation(
            "P3",
            "ROLLOUT in sharing_map[ACTOR]; else engine == 'vanilla' (the map and the engine read back)",
            {
                "rollout_linked_to_actor": link,
                "engine": engine,
                "rollout_dtype": _dtype_name(cluster.cluster_config.rollout_config),
            },
            {
                RolloutBranch.SHARED: "the engine was handed the actor model",
                RolloutBranch.SECOND_COPY: "the actor was loaded a second time onto the rollout mesh",
                RolloutBranch.ENGINE_INITIAL_VALUE: f"the {engine} engine was handed the trainer's model",
            }[branch],
            branch,
        )
    )
    if given is not None and branch is RolloutBranch.SECOND_COPY:
        out.append(_load_decision("rollout", models["rollout"], given, "actor", meshes[Role.ROLLOUT]))
    for name in ("reference", "reward", "critic"):
        if given is not None and name in models:
            out.append(_load_decision(name, models[name], given, name, meshes[Role(name)]))
    if reference is not None:
        out.append(_reference_decision(cluster, reference, actor, ref_link, given))
    wrt = getattr(cluster.actor_trainer.optimizer, "wrt", None)
    lora_wrt = wrt is nnx.LoRAParam
    out += [
        observation(
            "P7",
            "the engine exposes a non-None mesh (read from the built engine)",
            {
                "engine": engine,
                "exposes_mesh": own_mesh is not None,
                "config_rollout_mesh": rollout_text,
                "engine_mesh": describe_mesh(own_mesh) if own_mesh is not None else None,
                "sharing_map_rebuilt": (link != equal) if equal is not None else None,
                "still_registered_as_sharing": link,
            },
            "role_to_mesh[ROLLOUT] is the engine's mesh" if replaced else "role_to_mesh[ROLLOUT] as configured",
            MeshBranch.REPLACED if replaced else MeshBranch.KEPT,
            source,
        ),
        observation(
            "P12",
            "actor trainable parameters (the optimizer's wrt filter)",
            {"lora": lora_wrt, "wrt": getattr(wrt, "__name__", str(wrt))},
            "optimizer over LoRA parameters only" if lora_wrt else "optimizer over all parameters",
            ParamsBranch.LORA if lora_wrt else ParamsBranch.ALL,
        ),
    ]
    if cluster.cluster_config.offload_to_cpu:
        for name, model in models.items():
            kinds = memory_kinds(nnx.state(model))
            out.append(
                observation(
                    "P14",
                    f"{name}: memory kind after construction",
                    {"role": name, "memory_kinds": kinds},
                    f"{name} in {', '.join(kinds)}",
                    OffloadBranch.OFFLOADED if kinds == ["pinned_host"] else "stays on device",
                )
            )
    if has_anchor(cluster):
        out.append(anchor_decision(cluster))
    return out


def has_anchor(cluster: Any) -> bool:
    """Whether this Tunix version keeps an anchor policy state (P8)."""
    return hasattr(cluster, "_anchor_policy_state")


def anchor_state(cluster: Any) -> Any:
    """The anchor policy state, or None where the version keeps none (or it is not set)."""
    return getattr(cluster, "_anchor_policy_state", None)


def anchor_decision(cluster: Any) -> dict[str, Any]:
    """P8 as the anchor state shows it: the whole actor state or its trainable part, where, how big."""
    anchor = anchor_state(cluster)
    actor_leaves = len(array_leaves(nnx.state(cluster.actor_trainer.model)))
    held = len(array_leaves(anchor)) if anchor is not None else 0
    full = held == actor_leaves
    return observation(
        "P8",
        "the anchor policy state: the actor's whole state on pinned host (read back)",
        {
            "global_steps": int(cluster.global_steps),
            "anchor": "full" if full else "trainable",
            "bytes": state_bytes(anchor) if anchor is not None else 0,
        },
        f"anchor holds {held} of the actor's {actor_leaves} leaves in {', '.join(memory_kinds(anchor) or ['-'])}",
        AnchorBranch.FULL if full else AnchorBranch.TRAINABLE,
    )


def _load_decision(role: str, model: nnx.Module, given: Given, source: str, mesh: Any) -> dict[str, Any]:
    """P5: kept as is when every leaf the role holds is one of the handed model's buffers, or
    keeps that leaf's layout where an offload (P14) only moved it to another memory kind."""
    state = nnx.state(model)
    leaves = flat_leaves(state)
    before = given.buffers.get(source, frozenset())
    layouts = given.layouts.get(source, {})
    offload = bool(given.offload)
    now = leaf_layouts(state) if offload else {}
    kept = sum(
        shard_keys(x) <= before or (offload and path in layouts and now.get(path) == layouts[path])
        for path, x in leaves.items()
    )
    on_mesh = sum(getattr(x.sharding, "mesh", None) == mesh for x in leaves.values())
    whole = kept == len(leaves)
    first = next(iter(leaves.values()), None)
    return observation(
        "P5",
        f"{role}: every leaf kept from the model handed in (buffer identity; layout where offloaded)",
        {
            "role": role,
            "leaves_on_target": kept,
            "leaves": len(leaves),
            "leaves_on_mesh": on_mesh,
            "memory_kind": ", ".join(memory_kinds(state)),
            "dtype": str(np.dtype(first.dtype)) if first is not None else None,
        },
        "kept as is" if whole else f"resharded onto the target mesh ({len(leaves) - kept} of {len(leaves)} leaves new)",
        LoadBranch.KEPT if whole else LoadBranch.RESHARDED,
        OBSERVED_GIVEN,
    )


def _reference_decision(
    cluster: Any, reference: nnx.Module, actor: nnx.Module, linked: bool, given: Given | None
) -> dict[str, Any]:
    shares = sharing_backbone(reference, actor)
    warned = None if given is None else any(P4_WARNING_MARK in m for m in given.logged)
    if not linked:
        branch, outcome = ReferenceBranch.OWN_WEIGHTS, "reference holds its own weights on its mesh"
    elif warned or (given is None and not shares):
        # Tunix decides when the reference is loaded, and says so by its warning; with offload,
        # P14 may join the two copies afterwards, so the buffers now can share when it warned.
        branch, outcome = ReferenceBranch.AVOIDABLE_COPY, "two copies of the backbone when the reference was loaded"
    else:
        branch, outcome = ReferenceBranch.ONE_BACKBONE, "one backbone in memory"
    if warned:
        outcome += "; Tunix logged its avoidable-copy warning"
    return observation(
        "P4",
        "reference linked to actor: its frozen buffers are the actor's (buffer identity)",
        {
            "linked": linked,
            "shares_buffers": shares,
            "offload_to_cpu": bool(cluster.cluster_config.offload_to_cpu),
            "warning_logged": warned,
        },
        outcome,
        branch,
        OBSERVED_GIVEN if given is not None else OBSERVED,
    )


def _dtype_name(rollout_config: Any) -> str | None:
    if isinstance(rollout_config, dict):  # per mode: the TRAIN entry is the one engines are built with
        rollout_config = next(v for k, v in rollout_config.items() if getattr(k, "value", k) == "train")
    dtype = getattr(rollout_config, "data_type", None)
    return None if dtype is None else str(np.dtype(dtype))
