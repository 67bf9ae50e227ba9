"""The documented differences from the reference (docs/reference.md), each checked on Tunix itself.

Scenario differences show in a side-by-side build (``compare``) and name the rows they explain;
config differences need no scenario (``config_differences()``). A difference is *observed*
only when its check found it; nothing here is asserted.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from rlcluster_lab.core.config import ClusterConfig, TrainingConfig
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.meshes import layout_meshes
from rlcluster_lab.core.options import RolloutConfig, Scenario
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.shardings import array_leaves
from rlcluster_lab.measure.memory import KINDS, memory_table
from rlcluster_lab.measure.sync import flat_leaves
from rlcluster_lab.tunix.extra import require


@dataclasses.dataclass(frozen=True)
class DifferenceCheck:
    """One documented difference (``readme``: in brief), whether its check found it, what each side showed."""

    id: str
    readme: str
    observed: bool
    lab: str
    tunix: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ScenarioDifference:
    """A documented difference a side-by-side build can show, the rows it explains, and how to
    look for it: the two clusters' facts -> (observed, what the lab showed, what Tunix showed)."""

    id: str
    readme: str
    rows: tuple[str, ...]
    look: Callable[[Mapping[str, Any]], tuple[bool, str, str]]

    def check(self, facts: Mapping[str, Any]) -> DifferenceCheck:
        observed, lab, tunix = self.look(facts)
        return DifferenceCheck(self.id, self.readme, bool(observed), lab, tunix)


def _sync_through_host(facts: Mapping[str, Any]) -> tuple[bool, str, str]:
    lab, tunix = facts["lab_sync"], facts["tunix_sync"]
    refused_host = tunix is not None and not tunix.completed and "host" in (tunix.error or "")
    return (
        lab is not None and refused_host,
        "sync completed under the P13 guard" if lab is not None else "no sync run",
        f"{tunix.outcome}: {tunix.error}" if tunix is not None and tunix.error else "sync completed",
    )


def _vanilla_inputs(facts: Mapping[str, Any]) -> tuple[bool, str, str]:
    lab, tunix = facts["lab_engine_inputs"], facts["tunix_engine_inputs"]
    observed = bool(lab and tunix and lab["rollout_config"] and lab["mesh"])
    return observed and not tunix["rollout_config"] and not tunix["mesh"], str(lab), str(tunix)


def _optimizer_counters(facts: Mapping[str, Any]) -> tuple[bool, str, str]:
    lab, tunix = facts["lab_optimizer"], facts["tunix_optimizer"]
    # Only the counters differ, in each optimizer state: the moments (non-scalar leaves) hold the same bytes.
    observed = bool(lab) and lab.keys() == tunix.keys()
    observed = observed and all(
        lab[n]["moment_bytes"] == tunix[n]["moment_bytes"] and lab[n]["counters"] != tunix[n]["counters"] for n in lab
    )
    return observed, str(lab), str(tunix)


def _offloaded_optimizer(facts: Mapping[str, Any]) -> tuple[bool, str, str]:
    lab, tunix = facts["lab_optimizer_kinds"], facts["tunix_optimizer_kinds"]
    return lab == ["pinned_host"] and tunix == ["device"], ", ".join(lab), ", ".join(tunix)


def _offloaded_own_copy(facts: Mapping[str, Any]) -> tuple[bool, str, str]:
    lab, tunix = facts["lab_rollout_memory"], facts["tunix_rollout_memory"]
    # Only the memory kind differs: the same bytes on the same devices, on host in the lab, on device in Tunix.
    on_device = {d: {"device": sum(kinds.values())} for d, kinds in lab["by_device"].items()}
    observed = (
        facts["lab_engine_owns_weights"]
        and list(lab["by_kind"]) == ["pinned_host"]
        and list(tunix["by_kind"]) == ["device"]
        and lab["bytes"] == tunix["bytes"]
        and on_device == tunix["by_device"]
    )
    return observed, f"rollout in {', '.join(lab['by_kind'])}", f"rollout in {', '.join(tunix['by_kind'])}"


def _own_copy_sync(facts: Mapping[str, Any]) -> tuple[bool, str, str]:
    lab, tunix = facts["lab_sync"], facts["tunix_sync"]
    if lab is None or tunix is None or tunix.report is None or not facts["lab_engine_owns_weights"]:
        return False, "no sync compared", "no sync compared"
    theirs = {leaf.path: leaf for leaf in tunix.report.leaves}
    # Only reuse differs: what device_put kept, the lab's engine copied on the same device.
    observed = (
        lab.reused_bytes == 0
        and tunix.report.reused_bytes > 0
        and (lab.synced_bytes, lab.minimum_cross_device_bytes, lab.anchor_bytes)
        == (tunix.report.synced_bytes, tunix.report.minimum_cross_device_bytes, tunix.report.anchor_bytes)
        and theirs.keys() == {leaf.path for leaf in lab.leaves}
        and all(theirs[leaf.path].reused_bytes <= leaf.copied_same_device_bytes for leaf in lab.leaves)
    )
    return observed, f"reused {lab.reused_bytes:,} bytes", f"reused {tunix.report.reused_bytes:,} bytes"


def _host_views(facts: Mapping[str, Any]) -> tuple[bool, str, str]:
    lab, tunix, apart = facts["lab_models_memory"], facts["tunix_models_memory"], facts["tunix_models_memory_apart"]
    # Counted apart, the views leave Tunix's memory exactly the lab's.
    observed = facts["tunix_host_views"] > 0 and apart == lab and tunix != lab
    return (
        observed,
        str(lab),
        f"{tunix}; {facts['tunix_host_views']} shard(s) are views into a host copy, counted apart: {apart}",
    )


SCENARIO_DIFFERENCES: tuple[ScenarioDifference, ...] = (
    ScenarioDifference(
        "device-put-through-host",
        "on CPU, jax.device_put changes a layout through host memory, which the sync's transfer guard (P13) "
        "forbids; the lab changes layouts device to device, so its sync runs under the guard",
        ("P13 sync outcome", "P13 global steps after the sync", "P13 sync bytes"),
        _sync_through_host,
    ),
    ScenarioDifference(
        "vanilla-engine-inputs",
        "the lab's vanilla engine also receives the TRAIN rollout config and the rollout mesh; the reference's "
        "gets only a cache config",
        ("engine inputs",),
        _vanilla_inputs,
    ),
    ScenarioDifference(
        "optimizer-counters",
        "the lab's optimizer state holds optax's step count replicated over the actor's mesh; Tunix's nnx "
        "optimizer keeps that count and a step counter of its own, each on one device (a few bytes)",
        ("L2 optimizer", "L2 critic optimizer"),
        _optimizer_counters,
    ),
    ScenarioDifference(
        "offload-optimizer-state",
        "with offload_to_cpu, the lab keeps the optimizer state in pinned host memory between updates too; "
        "the reference offloads only model variables",
        ("L2 optimizer memory kinds",),
        _offloaded_optimizer,
    ),
    ScenarioDifference(
        "offload-own-copy-engine",
        "with offload_to_cpu, the lab keeps the rollout of an engine with its own copy (vllm, sglang_jax) in pinned "
        "host memory between uses as every other role; the reference offloads only the vanilla engine's",
        ("L2 rollout",),
        _offloaded_own_copy,
    ),
    ScenarioDifference(
        "own-copy-engine-sync",
        "an engine with its own copy (vllm, sglang_jax) takes a sync into buffers of its own; the reference's "
        "reshard (jax.device_put) hands it the actor's own buffers where a shard already sits where the engine's goes",
        ("P13 sync bytes",),
        _own_copy_sync,
    ),
    ScenarioDifference(
        "device-put-host-view",
        "on CPU, jax.device_put's path through host memory may hand back shards that are views into one host copy "
        "of the source, so two roles resharded from one model can hold the same memory; the lab reshards on the "
        "devices, and no accelerator does that",
        ("L2 shared buffers", "L2 unique bytes less optimizers"),
        _host_views,
    ),
)

DIFFERENCES: tuple[str, ...] = tuple(d.id for d in SCENARIO_DIFFERENCES) + (
    "vllm-version-default",
    "missing-role-meshes",
    "gradient-accumulation-field",
    "rollout-dtypes",
    "p15-names",
)


def memory_apart(
    entries: Mapping[str, Any], ranges: Sequence[tuple[int, int]], handed: frozenset = frozenset()
) -> tuple[int, dict[str, Any]]:
    """L2 of ``entries`` with every view into the handed memory (``build.host_ranges``) counted as a
    buffer of its own, as on a device: the number of views, and the memory JSON. A shard inside
    ``ranges`` is a view unless it is exactly one of the ``handed`` buffers."""
    starts, whole = [lo for lo, _ in ranges], set(ranges)
    names = list(entries)
    ids: dict[tuple[Any, ...], int] = {}
    rows = []
    views = 0
    for e, name in enumerate(names):
        for path, x in flat_leaves(entries[name]).items():
            kind = str(x.sharding.memory_kind)
            for s in x.addressable_shards:
                pointer, nbytes = s.data.unsafe_buffer_pointer(), s.data.nbytes
                key: tuple[Any, ...] = (s.device.platform, s.device.id, kind, pointer)
                # The ranges are disjoint allocations (a host copy may be a shard's own buffer).
                at = bisect.bisect_right(starts, pointer) - 1
                inside = at >= 0 and any(lo <= pointer < hi for lo, hi in ranges[max(at - 1, 0) : at + 1])
                kept = key[:2] + (pointer,) in handed and (pointer, pointer + nbytes) in whole
                if inside and not kept:
                    views += 1
                    key += (name, path)  # this shard alone
                rows.append((e, s.device.id, KINDS.index(kind), nbytes, ids.setdefault(key, len(ids))))
    return views, memory_table(names, *np.array(rows, dtype=np.int64).reshape(-1, 5).T)


def optimizer_facts(state: Any) -> dict[str, Any]:
    """Bytes of the moments (non-scalar leaves) and, per scalar counter, its bytes over all devices."""
    leaves = array_leaves(state)
    moments = sum(s.data.nbytes for x in leaves if x.ndim for s in x.addressable_shards)
    counters = sorted(
        (str(x.dtype), len(x.addressable_shards), sum(s.data.nbytes for s in x.addressable_shards))
        for x in leaves
        if not x.ndim
    )
    return {"moment_bytes": int(moments), "counters": counters}


def config_differences() -> list[DifferenceCheck]:
    """Check the differences that need no side-by-side scenario (``TunixMissingError`` without Tunix)."""
    tunix = require("checking the documented differences")
    return [
        _vllm_version_default(tunix),
        _missing_role_meshes(tunix),
        _gradient_accumulation(tunix),
        _rollout_dtypes(tunix),
        _p15_names(tunix),
    ]


def _vllm_version_default(tunix: Any) -> DifferenceCheck:
    lab = RolloutConfig().rollout_vllm_model_version
    theirs = tunix.base_rollout.RolloutConfig().rollout_vllm_model_version
    return DifferenceCheck(
        "vllm-version-default",
        "RolloutConfig.rollout_vllm_model_version defaults to None in the lab, so P6 refuses the vllm engine "
        "without one; the reference's default is an empty string, which passes its check",
        observed=lab is None and theirs is not None,
        lab=repr(lab),
        tunix=repr(theirs),
    )


def _missing_role_meshes(tunix: Any) -> DifferenceCheck:
    from rlcluster_lab.app.scenario import build_models
    from rlcluster_lab.tunix.adapters import TunixTokenizer, lab_axis_rules
    from rlcluster_lab.tunix.build import tunix_config

    meshes = layout_meshes("colocated")
    only = {Role.ACTOR: meshes[Role.ACTOR], Role.ROLLOUT: meshes[Role.ROLLOUT]}
    lab = ClusterConfig(role_to_mesh=only).role_to_mesh.get(Role.REFERENCE)
    scenario = Scenario()
    models = build_models(scenario, meshes)
    try:
        with lab_axis_rules():
            tunix.rl_cluster.RLCluster(
                tokenizer=TunixTokenizer(), cluster_config=tunix_config(scenario, only), **models
            )
        theirs = "built"
    except KeyError as exc:
        theirs = f"KeyError {exc}"
    return DifferenceCheck(
        "missing-role-meshes",
        "REFERENCE, REWARD and CRITIC meshes left out of role_to_mesh default to the actor's mesh; the "
        "reference raises KeyError",
        observed=lab is only[Role.ACTOR] and theirs.startswith("KeyError"),
        lab="reference mesh = actor mesh" if lab is only[Role.ACTOR] else repr(lab),
        tunix=theirs,
    )


def _gradient_accumulation(tunix: Any) -> DifferenceCheck:
    import optax

    lab_steps = TrainingConfig(mini_batch_size=8, train_micro_batch_size=4).gradient_accumulation_steps
    lab_field = "gradient_accumulation_steps" in {f.name for f in dataclasses.fields(TrainingConfig)}
    training = functools.partial(
        tunix.rl_cluster.RLTrainingConfig, actor_optimizer=optax.sgd(1e-3), eval_every_n_steps=1
    )
    try:
        training(gradient_accumulation_steps=2)
        theirs = "accepted gradient_accumulation_steps=2"
    except ValueError:
        theirs = "a constructor field that must be None (ValueError when set)"
    derived = training(mini_batch_size=8, train_micro_batch_size=4).gradient_accumulation_steps
    return DifferenceCheck(
        "gradient-accumulation-field",
        "gradient_accumulation_steps is a derived read-only property in the lab, a constructor field that must "
        "be None in the reference; both derive mini_batch_size // train_micro_batch_size",
        observed=(not lab_field) and theirs.startswith("a constructor field") and derived == lab_steps,
        lab=f"read-only property, {lab_steps} for 8 // 4",
        tunix=f"{theirs}; derived {derived} for 8 // 4",
    )


def _rollout_dtypes(tunix: Any) -> DifferenceCheck:
    try:
        RolloutConfig(data_type="int8")
        lab = "accepted int8"
    except ConfigError:
        lab = "refused int8 (float32, bfloat16 and float16 only)"
    theirs = tunix.base_rollout.RolloutConfig(data_type=jnp.int8).data_type
    return DifferenceCheck(
        "rollout-dtypes",
        "only float32, bfloat16 and float16 are accepted as the rollout dtype in the lab; the reference takes "
        "any dtype",
        observed=lab.startswith("refused") and theirs is jnp.int8,
        lab=lab,
        tunix=f"accepted {jnp.dtype(theirs).name}",
    )


def _p15_names(tunix: Any) -> DifferenceCheck:
    import rlcluster_lab

    names = sorted(n for n in ("RLCluster", "RLEngine") if hasattr(tunix.rl_cluster, n))
    return DifferenceCheck(
        "p15-names",
        "the lab names one class RLCluster and RLEngine (P15, as a later upstream rl_cluster.py does); "
        "Tunix 0.1.7 exports RLCluster only",
        observed=rlcluster_lab.RLCluster is rlcluster_lab.RLEngine and names == ["RLCluster"],
        lab="RLCluster is RLEngine",
        tunix=", ".join(names),
    )
