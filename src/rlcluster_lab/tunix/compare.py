"""``side_by_side``: Tunix's cluster and the lab's for one scenario (same models, same meshes),
decision by decision and figure by figure. A differing row names the documented difference
that explains it only where that difference's own check (``differences``) found it in these
two clusters; a differing row without one is *unexplained*.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import Mesh

from rlcluster_lab import ConfigError, Scenario, SyncReport, TrainingConfig, build_cluster, placement_report
from rlcluster_lab.app.scenario import validate
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.trace import seen
from rlcluster_lab.rules.loading import P5Values
from rlcluster_lab.rules.sharing import P2PropagationValues
from rlcluster_lab.rules.validation import check_scenario
from rlcluster_lab.tunix.build import build_tunix_cluster
from rlcluster_lab.tunix.differences import SCENARIO_DIFFERENCES, DifferenceCheck, memory_apart, optimizer_facts
from rlcluster_lab.tunix.extra import require
from rlcluster_lab.tunix.observe import tunix_entries
from rlcluster_lab.tunix.report import TunixReport, inspect
from rlcluster_lab.tunix.sync import TunixSync

# The model roles (P5); they and the anchor are the state entries whose memory is compared role by role (L2).
ROLES = ("actor", "rollout", "reference", "reward", "critic")


@dataclasses.dataclass(frozen=True)
class Row:
    """One decision or figure on both sides. ``difference``: the documented difference that
    explains a disagreement (None when they agree, or when none does: then it is unexplained)."""

    item: str
    rule: str
    lab: Any
    tunix: Any
    agree: bool
    difference: str | None = None

    @property
    def unexplained(self) -> bool:
        return not self.agree and self.difference is None


@dataclasses.dataclass(frozen=True)
class SideBySide:
    """The two clusters of one scenario compared: the rows, the scenario differences checked on
    them (observed or not), both reports (the lab's as JSON) and one sync of each."""

    scenario: Scenario
    rows: tuple[Row, ...]
    differences: tuple[DifferenceCheck, ...]
    lab_report: Mapping[str, Any]
    tunix_report: TunixReport
    lab_sync: SyncReport | None
    tunix_sync: TunixSync | None

    @property
    def differing(self) -> list[Row]:
        return [r for r in self.rows if not r.agree]

    @property
    def unexplained(self) -> list[Row]:
        return [r for r in self.rows if r.unexplained]

    def table(self, width: int = 38) -> str:
        """The rows as plain text: item, agreement, and the two values (shortened to ``width``)."""
        lines = [f"{'item':<34} {'':<8} {'lab':<{width}} tunix"]
        for r in self.rows:
            mark = "equal" if r.agree else "differs"
            lines.append(f"{r.item:<34} {mark:<8} {_short(r.lab, width):<{width}} {_short(r.tunix, width)}")
            if not r.agree:
                lines.append(f"{'':<43}why: {r.difference or 'UNEXPLAINED'}")
        return "\n".join(lines)

    def summary(self) -> dict[str, Any]:
        """One line for a table of scenarios: what agrees, Tunix's sync, and what explains the rest."""
        decisions = [r for r in self.rows if r.rule.startswith("P") and not r.rule.startswith("P13")]
        figures = [r for r in self.rows if r not in decisions]
        return {
            "layout": self.scenario.layout,
            "LoRA": self.scenario.lora,
            "engine": self.scenario.engine,
            "decisions equal": f"{sum(r.agree for r in decisions)} of {len(decisions)}",
            "figures equal": f"{sum(r.agree for r in figures)} of {len(figures)}",
            "Tunix's sync": self.tunix_sync.outcome if self.tunix_sync is not None else "not run",
            "the rest differ by": sorted({r.difference or "UNEXPLAINED" for r in self.differing}),
        }


def side_by_side(
    scenario: Scenario,
    *,
    sync: bool = True,
    devices: Sequence[jax.Device] | None = None,
    role_to_mesh: Mapping[Role, Mesh] | None = None,
    training_config: TrainingConfig | None = None,
) -> SideBySide:
    """Build Tunix's cluster and the lab's for ``scenario`` and compare them decision by decision.

    Args:
        scenario: the knobs (engine vanilla or vllm; see ``build_tunix_cluster``).
        sync: also run one weight sync on each and compare them (P13, L3).
        devices: the devices the layout is built on.
        role_to_mesh: meshes that replace the layout's, handed to both clusters as
            ``build_cluster`` takes them (a role left out gets the actor's mesh).
        training_config: the actor's optimizer settings, the same for both.

    Raises:
        ConfigError: a scenario the lab refuses, an engine Tunix cannot run here, the trainable
            anchor (Tunix has only the full one), or a ``role_to_mesh`` that is not roles to meshes.
        PlacementError: a ``role_to_mesh`` mesh whose shape does not divide a model's dimensions.
        TunixMissingError: Tunix is not installed.
        TypeError: ``scenario`` is not a ``Scenario``.
    """
    check_scenario(scenario)  # a Scenario, and its knobs' refusals first
    if scenario.anchor != "full":
        raise ConfigError(
            f"anchor={scenario.anchor!r} is the lab's own cheaper anchor; Tunix 0.1.7 always pins the actor's "
            "whole state (P8), so there is nothing to compare it with. Compare with anchor='full'",
            knobs=("anchor",),
        )
    # Checked once, before either cluster is built; both sides then get the same meshes.
    meshes = dict(
        validate(scenario, devices=devices, training_config=training_config, role_to_mesh=role_to_mesh).role_to_mesh
    )
    build = build_tunix_cluster(scenario, role_to_mesh=meshes, training_config=training_config)
    cluster = build_cluster(scenario, role_to_mesh=meshes, training_config=training_config)
    tunix_report = inspect(build)
    lab_report = placement_report(cluster).to_json()
    tunix_memory = tunix_report.memory.to_json()
    entries = tunix_entries(build.cluster)
    views, apart = memory_apart(entries, build.given.host_ranges, frozenset().union(*build.given.buffers.values()))
    facts: dict[str, Any] = {
        "lab_engine_inputs": {
            "rollout_config": cluster.rollout.rollout_config is not None,
            "mesh": isinstance(cluster.rollout.given_mesh, Mesh),
            "cache_size": cluster.rollout.cache_size,
        },
        "tunix_engine_inputs": _tunix_engine_inputs(build.cluster),
        "lab_engine_owns_weights": bool(getattr(cluster.rollout, "owns_weights", False)),
        "lab_optimizer": _optimizers(cluster.optimizer_state, cluster.critic_optimizer_state),
        "tunix_optimizer": _optimizers(entries["optimizer"], entries.get("critic_optimizer")),
        "lab_optimizer_kinds": _kinds_of(lab_report["memory"], "optimizer"),
        "tunix_optimizer_kinds": _kinds_of(tunix_memory, "optimizer"),
        "lab_rollout_memory": lab_report["memory"]["by_role"]["rollout"],
        "tunix_rollout_memory": tunix_memory["by_role"]["rollout"],
        "lab_models_memory": _models_memory(lab_report["memory"]),
        "tunix_models_memory": _models_memory(tunix_memory),
        "tunix_models_memory_apart": _models_memory(apart),
        "tunix_host_views": views,
        # Last: what the sync changes is read above, before it.
        "lab_sync": cluster.sync_weights() if sync else None,
        "tunix_sync": tunix_report.sync() if sync else None,
    }
    checks = {d.id: d.check(facts) for d in SCENARIO_DIFFERENCES}
    rows = []
    for row in _rows(lab_report, tunix_report.to_json(), facts):
        # A difference explains a row only where its own check found it in these two clusters.
        why = [d.id for d in SCENARIO_DIFFERENCES if row.item in d.rows and checks[d.id].observed]
        if not row.agree and why:
            row = dataclasses.replace(row, difference=why[0])
        rows.append(row)
    return SideBySide(
        scenario=scenario,
        rows=tuple(rows),
        differences=tuple(checks.values()),
        lab_report=lab_report,
        tunix_report=tunix_report,
        lab_sync=facts["lab_sync"],
        tunix_sync=facts["tunix_sync"],
    )


def _decision(report: Mapping[str, Any], rule: str, role: str | None = None, test: str | None = None) -> Any:
    for d in report["decisions"]:
        if d["rule"] != rule or (role is not None and seen(d, P5Values).role != role):
            continue
        if test is not None and (d["branch"] == "propagated") != (test == "propagated"):
            continue
        return d
    return None


def _row(item: str, rule: str, lab: Any, tunix: Any) -> Row:
    return Row(item, rule, lab, tunix, lab == tunix)


def _rows(lab: Mapping[str, Any], tunix: Mapping[str, Any], facts: Mapping[str, Any]) -> list[Row]:
    def read(item: str, rule: str, what: Callable[[Mapping[str, Any]], Any]) -> Row:
        """The row of one figure, read the same way from both reports."""
        return _row(item, rule, what(lab), what(tunix))

    def branch(item: str, rule: str, **kw: Any) -> Row:
        return read(item, rule, lambda report: (_decision(report, rule, **kw) or {}).get("branch"))

    def present(*found: Row) -> list[Row]:
        """The rows of what at least one side has (a role, an optimizer)."""
        return [row for row in found if row.lab is not None or row.tunix is not None]

    def key(item: str, rule: str, name: str) -> Row:
        return read(item, rule, lambda report: report[name])

    def linked(report: Mapping[str, Any]) -> list[str]:
        return sorted(seen(_decision(report, "P2", test="propagated") or {}, P2PropagationValues).linked_to_actor or [])

    rows = [
        branch("P1 actor/rollout link", "P1"),
        branch("P2 LoRA reference link", "P2", test="link"),
        read("P2 roles linked to the actor", "P2", linked),
        key("sharing map", "P1, P2", "sharing_map"),
        key("P3 what the rollout samples with", "P3", "rollout_branch"),
        key("P3 rollout holds actor buffers", "P3", "rollout_shares_actor_weights"),
    ]
    rows += present(*(branch(f"P5 load {role}", "P5", role=role) for role in ROLES))
    rows += [
        branch("P4 reference backbone", "P4"),
        key("P4 reference shares the backbone", "P4", "reference_shares_backbone"),
        read("P4 warnings", "P4", lambda report: sum(1 for w in report["warnings"] if str(w).startswith("P4"))),
        branch("P7 engine mesh", "P7"),
        key("P7 mesh replaced", "P7", "mesh_overridden_by_engine"),
        key("role meshes as constructed", "P5, P7", "role_to_mesh"),
        key("role meshes as asked", "P1", "config_role_to_mesh"),
        branch("P12 optimizer trains", "P12"),
        key("P8 anchor", "P8", "anchor"),
    ]
    if facts["tunix_engine_inputs"] is not None:
        rows.append(_row("engine inputs", "engine", facts["lab_engine_inputs"], facts["tunix_engine_inputs"]))
    for name in (*ROLES, "anchor"):
        rows += present(read(f"L2 {name}", "L2", lambda report, name=name: report["memory"]["by_role"].get(name)))
    rows.append(read("L2 optimizer", "L2", lambda report: _bytes_of(report["memory"], "optimizer")))
    rows += present(read("L2 critic optimizer", "L2", lambda report: _bytes_of(report["memory"], "critic_optimizer")))
    rows += [
        read("L2 optimizer memory kinds", "L2", lambda report: _kinds_of(report["memory"], "optimizer")),
        read("L2 shared buffers", "L2", lambda report: _models_memory(report["memory"])["shared"]),
        read("L2 unique bytes less optimizers", "L2", lambda report: _models_memory(report["memory"])["unique_bytes"]),
    ]
    lab_sync, tunix_sync = facts["lab_sync"], facts["tunix_sync"]
    if lab_sync is not None and tunix_sync is not None:
        tunix_bytes = _sync_bytes(tunix_sync.report) if tunix_sync.report is not None else None
        lab_params = "LoRA params" if lab_sync.lora else "all params"
        rows += [
            _row("P13 sync outcome", "P13", "completed", tunix_sync.outcome),
            _row("P13 sync hands over", "P13", lab_params, tunix_sync.decision["branch"]),
            _row("P13 global steps after the sync", "P13", lab_sync.global_step, tunix_sync.global_steps_after),
            _row("P13 sync bytes", "P13, L3", _sync_bytes(lab_sync), tunix_bytes),
        ]
    return rows


def _models_memory(memory: Mapping[str, Any]) -> dict[str, Any]:
    """The buffers roles share, and the unique bytes less the optimizer states' (fresh buffers of
    their own, compared on their own rows)."""
    optimizers = sum(_bytes_of(memory, name) or 0 for name in ("optimizer", "critic_optimizer"))
    return {
        "shared": [(tuple(g["roles"]), g["bytes"]) for g in memory["shared"]],
        "unique_bytes": memory["unique_bytes"] - optimizers,
    }


def _optimizers(actor: Any, critic: Any) -> dict[str, Any]:
    """``optimizer_facts`` of the actor's optimizer state and, where there is one, the critic's."""
    return {"optimizer": optimizer_facts(actor)} | (
        {} if critic is None else {"critic_optimizer": optimizer_facts(critic)}
    )


def _bytes_of(memory: Mapping[str, Any], name: str) -> int | None:
    return (memory["by_role"].get(name) or {}).get("bytes")


def _kinds_of(memory: Mapping[str, Any], name: str) -> list[str]:
    return sorted((memory["by_role"].get(name) or {}).get("by_kind", ()))


def _sync_bytes(report: SyncReport) -> dict[str, int]:
    """What both sides measure the same way: every destination shard, reuse by identity, the minimum."""
    return {
        "synced": report.synced_bytes,
        "reused": report.reused_bytes,
        "minimum_cross_device": report.minimum_cross_device_bytes,
        "anchor": report.anchor_bytes,
    }


def _tunix_engine_inputs(cluster: Any) -> dict[str, Any] | None:
    """What Tunix's built-in vanilla engine and its sampler hold of its inputs: a rollout config,
    a mesh, the KV cache size (None for other engines)."""
    engine = cluster.rollout
    if type(engine).__name__ != "VanillaRollout":
        return None
    rollout_config_type = type(cluster.get_rollout_config(mode=require().rl_cluster.Mode.TRAIN))
    held = list(vars(engine).values()) + [v for s in vars(engine).values() for v in getattr(s, "__dict__", {}).values()]
    cache = next((v for v in held if hasattr(v, "cache_size")), None)
    return {
        "rollout_config": any(isinstance(v, rollout_config_type) for v in held),
        "mesh": any(isinstance(v, Mesh) for v in held),
        "cache_size": getattr(cache, "cache_size", None),
    }


def _short(value: Any, width: int) -> str:
    text = str(value)
    return text if len(text) <= width else text[: width - 3] + "..."
