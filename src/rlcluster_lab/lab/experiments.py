"""The experiments the notebooks run, each one call that returns plain data.

A notebook cell calls one of these and hands the result to ``viz`` or prints
it with ``format_table``; the cells hold no logic of their own. Every
function builds its clusters through ``Scenario``/``build_cluster`` (or the
public ``RLCluster`` for the P6 error cases) and reads results from the
reports, so what a notebook shows is what the CLI and the tests see.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from rlcluster_lab.app.report import placement_report
from rlcluster_lab.app.scenario import Scenario, build_cluster
from rlcluster_lab.cluster import RLCluster
from rlcluster_lab.core.config import ClusterConfig, ConfigError, RolloutConfig
from rlcluster_lab.core.meshes import layout_meshes, make_mesh, reachable_layouts
from rlcluster_lab.core.roles import Mode, Role

# The experiments of notebooks 04-08 live in their own module; a notebook reaches all here.
from rlcluster_lab.lab.run_experiments import (  # noqa: F401
    EVEN_PROMPTS,
    PLAN_CHECKS,
    SYNC_COLUMNS,
    Tick,
    anchor_rows,
    collect,
    offload_timeline,
    p11_compare,
    p11_rows,
    p11_run,
    p11_setting_rows,
    plan_vs_measured,
    sync_matrix,
    sync_rows,
    sync_time_rows,
    timeline_rows,
    what_if_rows,
)
from rlcluster_lab.model import init_model
from rlcluster_lab.rules.sharing import build_sharing_map, sharing_map_json


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows of dicts as a fixed-width text table (stable: same rows, same text)."""
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())
    cells = [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"  # byte counts: digits grouped so they read at a glance
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


# --------------------------------------------------------------------------- any notebook


def layout_rows(devices: Sequence[jax.Device]) -> list[dict[str, Any]]:
    """Each standard layout the devices can form: the actor's mesh and the rollout's."""
    rows = []
    for layout in reachable_layouts(devices):
        meshes = layout_meshes(layout, devices)
        rows.append(
            {
                "layout": layout,
                "actor, reference, reward, critic": _mesh_text(meshes[Role.ACTOR]),
                "rollout": _mesh_text(meshes[Role.ROLLOUT]),
            }
        )
    return rows


def _mesh_text(mesh: Any) -> str:
    ids = [int(d.id) for d in np.asarray(mesh.devices).flat]
    shape = "x".join(f"{k}={v}" for k, v in dict(mesh.shape).items())
    return f"{shape} on devices {ids[0]}-{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) else f"{shape} on {ids}"


def reports_for(
    scenarios: Mapping[str, Scenario], devices: Sequence[jax.Device], progress: Tick | None = None
) -> dict[str, dict[str, Any]]:
    """Build each scenario's cluster and keep only its placement report (JSON)."""
    out = {}
    for label, scenario in scenarios.items():
        out[label] = placement_report(build_cluster(scenario, devices=devices)).to_json()
        collect()
        if progress:
            progress(label)
    return out


def decision_lines(report: Mapping[str, Any], rules: Sequence[str]) -> str:
    """The report's decisions for some rules, one line each: rule, what was tested, outcome."""
    return "\n".join(
        f"{d['rule']:<4} {d['test']}  ->  {d['outcome']}" for d in report["decisions"] if d["rule"] in rules
    )


# --------------------------------------------------------------------------- 01: meshes and the sharing map


def mesh_identity(devices: Sequence[jax.Device]) -> list[dict[str, Any]]:
    """P1's test, ``==`` on meshes, for meshes over the same devices built different ways.

    JAX interns meshes: building the same devices, shape and axis names twice
    gives back one object. Change any of the three and it is another mesh.
    """
    devices = list(devices)
    n = len(devices)
    base = make_mesh(devices, _shape(n))
    cases = [
        ("same devices, same shape, same names", make_mesh(devices, _shape(n))),
        (f"same devices as ({n}, 1)", make_mesh(devices, (n, 1))),
        ("same devices and shape, axes named data/model", make_mesh(devices, _shape(n), ("data", "model"))),
        ("same devices in reverse order", make_mesh(devices[::-1], _shape(n))),
    ]
    return [
        {"built as": label, "shape": str(tuple(m.devices.shape)), "same object": m is base, "== (P1)": m == base}
        for label, m in cases
    ]


def _shape(n: int) -> tuple[int, int]:
    from rlcluster_lab.core.meshes import default_shape

    return default_shape(n)


def sharing_maps(devices: Sequence[jax.Device]) -> list[dict[str, Any]]:
    """The sharing map (P1, P2, propagation) of every reachable layout, with and without LoRA.

    A pure function of the meshes and two facts about the models, so no model
    is built here.
    """
    rows = []
    for layout in reachable_layouts(devices):
        meshes = layout_meshes(layout, devices)
        for lora in (False, True):
            smap = sharing_map_json(
                build_sharing_map(
                    meshes,
                    actor_is_module=True,
                    actor_has_lora=lora,
                    has_reference=True,
                    reference_is_module=True,
                )
            )
            rows.append(
                {
                    "layout": layout,
                    "LoRA": lora,
                    "actor": smap["actor"],
                    "rollout": smap["rollout"],
                    "reference": smap["reference"],
                }
            )
    return rows


# --------------------------------------------------------------------------- 02: rollout and reference memory


MEMORY_SCENARIOS: dict[str, dict[str, Any]] = {
    "full actor": {"lora": False},
    "LoRA over the reference": {"lora": True},
    "LoRA over a copy": {"lora": True, "lora_separate_base": True},
}


def memory_comparison(
    layout: str, devices: Sequence[jax.Device], progress: Tick | None = None
) -> dict[str, dict[str, Any]]:
    """Placement reports of the same layout with a full actor, a LoRA actor sharing the
    reference's backbone, and a LoRA actor over a copy of it (P2-P4)."""
    return reports_for(
        {label: Scenario(layout=layout, **knobs) for label, knobs in MEMORY_SCENARIOS.items()}, devices, progress
    )


def memory_rows(reports: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per scenario: P3's branch, P4's warning, and the physical bytes per entry."""
    rows = []
    for label, rep in reports.items():
        mem = rep["memory"]
        row = {
            "scenario": label,
            "P3 rollout": rep["rollout_branch"],
            "P4 warning": any(w.startswith("P4") for w in rep["warnings"]),
        }
        for entry in ("actor", "rollout", "reference"):
            row[entry] = mem["by_role"].get(entry, {}).get("bytes", 0)
        row["held once"] = mem["unique_bytes"]
        row["summed per role"] = mem["naive_bytes"]
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- 03: P6 errors


def p6_errors(devices: Sequence[jax.Device]) -> list[dict[str, str]]:
    """Each P6 check, triggered on purpose; every one fails before any model is placed."""
    meshes = layout_meshes("colocated", devices)

    class NoConfig(nnx.Module):
        def __init__(self) -> None:
            self.w = nnx.Param(np.ones((4, 4), np.float32))

    class NotAnEngine:
        pass

    tiny = functools.partial(init_model, "tiny")
    lora = Scenario(layout="colocated", lora=True, engine="sglang_jax", sglang_static_lora=False)
    cases: list[tuple[str, Callable[[], Any]]] = [
        (
            "rollout_config=None",
            lambda: RLCluster(actor=tiny(), cluster_config=ClusterConfig(role_to_mesh=meshes, rollout_config=None)),
        ),
        (
            "per-mode dict without TRAIN",
            lambda: RLCluster(
                actor=tiny(),
                cluster_config=ClusterConfig(role_to_mesh=meshes, rollout_config={Mode.EVAL: RolloutConfig()}),
            ),
        ),
        (
            "rollout_engine='tgi'",
            lambda: RLCluster(actor=tiny(), cluster_config=ClusterConfig(role_to_mesh=meshes, rollout_engine="tgi")),
        ),
        (
            "vanilla, model without .config",
            lambda: RLCluster(actor=NoConfig(), cluster_config=ClusterConfig(role_to_mesh=meshes)),
        ),
        (
            "vllm without a model version",
            lambda: RLCluster(actor=tiny(), cluster_config=ClusterConfig(role_to_mesh=meshes, rollout_engine="vllm")),
        ),
        ("sglang_jax, LoRA actor, no static LoRA", lambda: build_cluster(lora, devices=devices)),
        (
            "engine class that is not a RolloutEngine",
            lambda: RLCluster(
                actor=tiny(), cluster_config=ClusterConfig(role_to_mesh=meshes, rollout_engine=NotAnEngine)
            ),
        ),
    ]
    rows = []
    for label, make in cases:
        try:
            make()
        except (ConfigError, NotImplementedError) as exc:
            # P6 raises ValueError (ConfigError) for a bad value and NotImplementedError for an
            # engine of a kind the cluster does not support, as the reference does.
            rows.append({"case": label, "error": f"{type(exc).__name__}: " + " ".join(str(exc).split())})
        else:
            rows.append({"case": label, "error": "(no error: the check did not fire)"})
        collect()
    return rows


def engine_rows(
    devices: Sequence[jax.Device], layout: str = "colocated"
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """P3 and P7 for each built-in engine on one layout; also returns each engine's report.

    The map is built from the config's meshes before any engine exists, so a
    colocated run stays registered as sharing even when the engine keeps its
    own copy on a mesh of its own.
    """
    rows, reports = [], {}
    for engine in ("vanilla", "sglang_jax", "vllm"):
        rep = placement_report(build_cluster(Scenario(layout=layout, engine=engine), devices=devices)).to_json()
        reports[engine] = rep
        mesh = rep["role_to_mesh"]["rollout"]
        rows.append(
            {
                "engine": engine,
                "P3 branch": rep["rollout_branch"],
                "map links actor-rollout": "rollout" in rep["sharing_map"]["actor"],
                "samples with actor buffers": rep["rollout_shares_actor_weights"],
                "P7 mesh replaced": rep["mesh_overridden_by_engine"],
                "rollout mesh": "x".join(f"{k}={v}" for k, v in mesh["shape"].items()),
                "rollout bytes": rep["memory"]["by_role"]["rollout"]["bytes"],
            }
        )
        collect()
    return rows, reports


__all__ = [
    "EVEN_PROMPTS",
    "MEMORY_SCENARIOS",
    "anchor_rows",
    "decision_lines",
    "engine_rows",
    "layout_rows",
    "reports_for",
    "format_table",
    "memory_comparison",
    "memory_rows",
    "mesh_identity",
    "offload_timeline",
    "plan_vs_measured",
    "what_if_rows",
    "p11_compare",
    "p11_rows",
    "p11_run",
    "p11_setting_rows",
    "p6_errors",
    "sharing_maps",
    "sync_matrix",
    "sync_rows",
    "sync_time_rows",
    "timeline_rows",
]
