"""The experiments the notebooks run on live clusters, each one call that returns plain data,
and the tables made of their results (``format_table``).

Clusters are built through ``Scenario``/``build_cluster`` (or the public ``RLCluster`` for
the P6 error cases) and results read from their reports, so a notebook shows what the CLI
and the tests see; nothing here decides where a model lives. The planner's side is
``lab.experiments.what_if``.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from flax import nnx

from rlcluster_lab.app.learner import GRPOLearner, LearnerConfig, LearnerResult
from rlcluster_lab.app.report import placement_report
from rlcluster_lab.app.scenario import Scenario, build_cluster
from rlcluster_lab.core.config import ClusterConfig, ConfigError, RolloutConfig, TrainingConfig
from rlcluster_lab.core.devices import devices_words
from rlcluster_lab.core.meshes import default_shape, layout_meshes, make_mesh, reachable_layouts
from rlcluster_lab.core.roles import Mode, Role
from rlcluster_lab.lab.experiments.step_phases import EVEN_PROMPTS
from rlcluster_lab.lab.figures.style import on_where
from rlcluster_lab.lab.notebook.setup import LabDevices, layout_devices, layouts_held
from rlcluster_lab.model import init_model
from rlcluster_lab.rl_cluster import RLCluster
from rlcluster_lab.rules.sharing import sharing_map, sharing_map_json

Tick = Callable[[Any], None]
T = TypeVar("T")
R = TypeVar("R")


def each(cases: Iterable[tuple[str, T]], run: Callable[[T], R], progress: Tick | None = None) -> dict[str, R]:
    """``run`` of each labelled case, the memory of one freed before the next (``gc.collect``)."""
    out = {}
    for label, case in cases:
        out[label] = run(case)
        gc.collect()
        if progress:
            progress(label)
    return out


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows of dicts as a fixed-width text table (stable: same rows, same text)."""
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())
    cells = [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    table = [columns, ["-" * w for w in widths], *cells]  # the heading, its rule, the rows
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in table)


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"  # byte counts: digits grouped so they read at a glance
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


# --------------------------------------------------------------------------- any notebook


def layout_rows(devices: Devices) -> list[dict[str, Any]]:
    """Each standard layout that can be built (on ``lab.notebook.setup.layout_devices`` of it): the actor's
    mesh and the rollout's, and the devices it is built on when layouts are built on different ones."""
    rows, wheres = [], {}
    for layout in layouts_held(devices):
        on = layout_devices(devices, layout)
        meshes = layout_meshes(layout, on)
        actor, rollout = _mesh_text(meshes[Role.ACTOR]), _mesh_text(meshes[Role.ROLLOUT])
        rows.append({"layout": layout, "actor, reference, reward, critic": actor, "rollout": rollout})
        wheres[layout] = {"where": devices_words(on)}
    return where_column(rows, wheres)


def _mesh_text(mesh: Any) -> str:
    ids = [int(d.id) for d in np.asarray(mesh.devices).flat]
    shape = "x".join(f"{k}={v}" for k, v in dict(mesh.shape).items())
    if len(ids) == 1:
        return f"{shape} on device {ids[0]}"
    return f"{shape} on devices {ids[0]}-{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) else f"{shape} on {ids}"


# Where the experiments build: the devices themselves, or what ``setup()`` returned, whose
# ``devices_for(layout)`` puts each layout on its own devices.
Devices = LabDevices | Sequence[jax.Device]


def reports_for(
    scenarios: Mapping[str, Scenario], devices: Devices, progress: Tick | None = None
) -> dict[str, dict[str, Any]]:
    """Build each scenario's cluster (on ``lab.notebook.setup.layout_devices`` of its layout) and keep only
    its placement report (JSON)."""

    def report(scenario: Scenario) -> dict[str, Any]:
        return placement_report(build_cluster(scenario, devices=layout_devices(devices, scenario.layout))).to_json()

    return each(scenarios.items(), report, progress)


def where_column(rows: list[dict[str, Any]], reports: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (one per report, in order) with an "on" column naming each one's devices, when
    they come from different devices (a single chip beside simulated CPU devices); as they are
    when every report names the same ``where`` (the tables' heading then says it once)."""
    wheres = [str(r.get("where") or "") for r in reports.values()]
    return rows if len(set(wheres)) <= 1 else [{**row, "on": where} for row, where in zip(rows, wheres)]


def decision_lines(report: Mapping[str, Any], rules: Sequence[str]) -> str:
    """The report's decisions for some rules, one line each: rule, what was tested, outcome."""
    return "\n".join(
        f"{d['rule']:<4} {d['test']}  ->  {d['outcome']}" for d in report["decisions"] if d["rule"] in rules
    )


# --------------------------------------------------------------------------- 01: meshes and the sharing map


def mesh_identity(devices: Sequence[jax.Device]) -> list[dict[str, Any]]:
    """P1's test, ``==`` on meshes, for meshes over the same devices built different ways. JAX interns
    meshes: the same devices, shape, axis names and axis types give back one object; change any of
    the four and it is another mesh (the lab's axes are all Auto: the rows vary the rest)."""
    devices = list(devices)
    n = len(devices)
    shape = default_shape(n)
    base = make_mesh(devices, shape)
    cases = [
        ("same devices, same shape, same names", make_mesh(devices, shape)),
        (f"same devices as ({n}, 1)", make_mesh(devices, (n, 1))),
        ("same devices and shape, axes named data/model", make_mesh(devices, shape, ("data", "model"))),
        ("same devices in reverse order", make_mesh(devices[::-1], shape)),
    ]
    return [
        {"built as": label, "shape": str(tuple(m.devices.shape)), "same object": m is base, "== (P1)": m == base}
        for label, m in cases
    ]


def sharing_maps(devices: Sequence[jax.Device]) -> list[dict[str, Any]]:
    """The sharing map (P1, P2, propagation) of every reachable layout, with and without LoRA:
    a pure function of the meshes and two facts about the models, so no model is built."""
    rows = []
    for layout in reachable_layouts(devices):
        for lora in (False, True):
            smap = sharing_map_json(sharing_map_of(devices, layout, lora=lora)[0])
            rows.append({"layout": layout, "LoRA": lora, **{r: smap[r] for r in ("actor", "rollout", "reference")}})
    return rows


def sharing_map_of(devices: Sequence[jax.Device], layout: str, *, lora: bool) -> tuple[Any, list[Any]]:
    """The sharing map of a layout's meshes and its decisions (P1, P2, propagation), from the
    rule functions construction calls, for an actor and a reference given as modules."""
    return sharing_map(
        layout_meshes(layout, devices),
        actor_is_module=True,
        actor_has_lora=lora,
        has_reference=True,
        reference_is_module=True,
    )


# --------------------------------------------------------------------------- 02: rollout and reference memory


MEMORY_SCENARIOS: dict[str, dict[str, Any]] = {
    "full actor": {"lora": False},
    "LoRA over the reference": {"lora": True},
    "LoRA over a copy": {"lora": True, "lora_separate_base": True},
}


def memory_comparison(layout: str, devices: Devices, progress: Tick | None = None) -> dict[str, dict[str, Any]]:
    """Placement reports of the same layout with a full actor, a LoRA actor sharing the
    reference's backbone, and a LoRA actor over a copy of it (P2-P4)."""
    scenarios = {label: Scenario(layout=layout, **knobs) for label, knobs in MEMORY_SCENARIOS.items()}
    return reports_for(scenarios, devices, progress)


def memory_rows(reports: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per scenario: P3's branch, P4's warning, and the physical bytes per entry."""
    rows = [
        {
            "scenario": label,
            "P3 rollout": rep["rollout_branch"],
            "P4 warning": any(w.startswith("P4") for w in rep["warnings"]),
            **{e: rep["memory"]["by_role"].get(e, {}).get("bytes", 0) for e in ("actor", "rollout", "reference")},
            "held once": rep["memory"]["unique_bytes"],
            "summed per role": rep["memory"]["naive_bytes"],
        }
        for label, rep in reports.items()
    ]
    return where_column(rows, {label: rep["memory"] for label, rep in reports.items()})


def copy_growth_line(reports: Mapping[str, Mapping[str, Any]], shared: str, copied: str) -> str:
    """How much more the cluster ``copied`` holds once than ``shared`` (its "held once" bytes), beside
    the reference's backbone in ``shared``: the avoidable copy P4 warns of, in the devices' own
    physical bytes (on eight devices replicated leaves count on each; on one chip once)."""
    more = reports[copied]["memory"]["unique_bytes"]
    less = reports[shared]["memory"]["unique_bytes"]
    backbone = reports[shared]["memory"]["by_role"]["reference"]["bytes"]
    same = "exactly" if more - less == backbone else "not"
    where = on_where(reports[copied]["memory"])
    return (
        f'"held once" grows by {more:,} - {less:,} = {more - less:,} bytes: {same} the reference\'s '
        f"backbone ({backbone:,} bytes)" + ("," + where if where else "")
    )


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

    def cluster(actor: Callable[[], Any] = tiny, **config: Any) -> Callable[[], Any]:
        """A P6 case: the public constructor with these config fields."""
        return lambda: RLCluster(actor=actor(), cluster_config=ClusterConfig(role_to_mesh=meshes, **config))

    lora = Scenario(layout="colocated", lora=True, engine="sglang_jax", sglang_static_lora=False)
    cases: list[tuple[str, Callable[[], Any]]] = [
        ("rollout_config=None", cluster(rollout_config=None)),
        ("per-mode dict without TRAIN", cluster(rollout_config={Mode.EVAL: RolloutConfig()})),
        ("rollout_engine='tgi'", cluster(rollout_engine="tgi")),
        ("vanilla, model without .config", cluster(NoConfig)),
        ("vllm without a model version", cluster(rollout_engine="vllm")),
        ("sglang_jax, LoRA actor, no static LoRA", lambda: build_cluster(lora, devices=devices)),
        ("engine class that is not a RolloutEngine", cluster(rollout_engine=NotAnEngine)),
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
        gc.collect()
    return rows


def engine_rows(devices: Sequence[jax.Device]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """P3 and P7 for each built-in engine on the colocated layout, and each engine's report. The map
    is built from the config's meshes before any engine exists, so a colocated run stays registered
    as sharing even when the engine keeps its own copy on a mesh of its own."""
    engines = ("vanilla", "sglang_jax", "vllm")
    reports = reports_for({engine: Scenario(layout="colocated", engine=engine) for engine in engines}, devices)
    rows = [
        {
            "engine": engine,
            "P3 branch": rep["rollout_branch"],
            "map links actor-rollout": "rollout" in rep["sharing_map"]["actor"],
            "samples with actor buffers": rep["rollout_shares_actor_weights"],
            "P7 mesh replaced": rep["mesh_overridden_by_engine"],
            "rollout mesh": "x".join(f"{k}={v}" for k, v in rep["role_to_mesh"]["rollout"]["shape"].items()),
            "rollout bytes": rep["memory"]["by_role"]["rollout"]["bytes"],
        }
        for engine, rep in reports.items()
    ]
    return rows, reports


# --------------------------------------------------------------------------- 04: P11 and the anchor (P8)


def p11_run(
    devices: Sequence[jax.Device], *, steps: int, mini_batch_size: int, iterations: int, progress: Tick | None = None
) -> dict[str, Any]:
    """A short GRPO run (batch 16: 4 prompts x 4) whose every optimizer step records the P11 gaps; returns its JSON."""
    cluster = build_cluster(
        Scenario(layout="colocated", max_tokens=8),
        devices=devices,
        training_config=TrainingConfig(learning_rate=3e-3, mini_batch_size=mini_batch_size, num_iterations=iterations),
    )
    config = LearnerConfig(steps=steps, prompts_per_step=4, group_size=4)
    result: LearnerResult = GRPOLearner(cluster, config, prompts=EVEN_PROMPTS).run(
        progress=(lambda s: progress(f"mean reward {s.mean_reward:.2f}")) if progress else None
    )
    out = result.to_json()
    out["config"] = {"batch_size": 16, "mini_batch_size": mini_batch_size, "iterations": iterations, "steps": steps}
    return out


def anchor_rows(reports: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What the anchor (P8) holds in each report, and where."""
    return [
        {
            "scenario": label,
            "anchor mode": r["anchor"].get("mode", "full"),
            "memory kind": r["anchor"]["memory_kind"],
            "anchor bytes": r["anchor"]["bytes"],
            "actor bytes": r["memory"]["by_role"]["actor"]["bytes"],
        }
        for label, r in reports.items()
    ]


def p11_compare(
    devices: Sequence[jax.Device], steps: int = 8, progress: Tick | None = None
) -> dict[str, dict[str, Any]]:
    """One short run per (mini-batch size, iterations) setting, batch 16; label -> run JSON.
    ``progress`` is called once per GRPO step of every run."""
    settings = ((16, 1), (8, 1), (8, 2))
    cases = [(f"mini-batch {mini}, {it} iteration{'s' if it > 1 else ''}", (mini, it)) for mini, it in settings]
    return each(
        cases, lambda s: p11_run(devices, steps=steps, mini_batch_size=s[0], iterations=s[1], progress=progress)
    )


# Live and anchor agree within this many nats (float noise is ~1e-6).
P11_TOLERANCE = 1e-4


def p11_setting_rows(runs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per setting: optimizer steps per global step, and on how many of them live == anchor."""

    def agree(recs: Sequence[Mapping[str, Any]], key: str) -> str:
        return f"{sum(r[key] <= P11_TOLERANCE for r in recs)} of {len(recs)}"

    return [
        {
            "setting": label,
            "optimizer steps per global step": len(run["p11"]) // max(run["config"]["steps"], 1),
            "live == anchor": agree(run["p11"], "live_vs_anchor"),
            "anchor == sampler": agree(run["p11"], "anchor_vs_sampler"),
        }
        for label, run in runs.items()
    ]


def p11_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per (iteration, mini-batch) position in a global step: do live and anchor agree
    (within ``P11_TOLERANCE``)? The anchor and the sampler must agree everywhere."""
    groups: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for rec in result["p11"]:
        groups.setdefault((rec["iteration"], rec["rows"][0]), []).append(rec)
    return [
        {
            "iteration": iteration,
            "rows": f"{recs[0]['rows'][0]}-{recs[0]['rows'][1]}",
            "optimizer steps before": recs[0]["steps_taken_before"],
            "live == anchor": all(r["live_vs_anchor"] <= P11_TOLERANCE for r in recs),
            "anchor == sampler": all(r["anchor_vs_sampler"] <= P11_TOLERANCE for r in recs),
        }
        for (iteration, _start), recs in sorted(groups.items())
    ]


# --------------------------------------------------------------------------- 05: weight sync (P13, L3)


SYNC_COLUMNS = (
    "synced_bytes",
    "moved_cross_device_bytes",
    "relayed_cross_device_bytes",
    "copied_same_device_bytes",
    "reused_bytes",
    "minimum_cross_device_bytes",
    "synced_logical_bytes",
)


def sync_matrix(devices: Devices, engine: str = "vanilla", progress: Tick | None = None) -> dict[str, dict[str, Any]]:
    """The measured sync (L3) of each layout, with a full and a LoRA actor. Each cluster syncs
    twice and the second is kept: the first also compiles the resharding programs, which is not
    what a sync costs in a run."""

    def second_sync(scenario: Scenario) -> dict[str, Any]:
        cluster = build_cluster(scenario, devices=layout_devices(devices, scenario.layout))
        cluster.sync_weights()
        return cluster.sync_weights().to_json()

    cases = [
        (f"{layout}, {'LoRA' if lora else 'full'}", Scenario(layout=layout, lora=lora, engine=engine))
        for layout in layouts_held(devices)
        for lora in (False, True)
    ]
    return each(cases, second_sync, progress)


def sync_rows(syncs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Byte counts of each measured sync (physical bytes), without timings, so they compare run to run."""
    rows = [{"run": label, **{k.replace("_bytes", ""): s[k] for k in SYNC_COLUMNS}} for label, s in syncs.items()]
    return where_column(rows, syncs)


def sync_time_rows(syncs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Measured seconds of each sync and of its anchor re-pin (they vary run to run)."""
    return [
        {
            "run": label,
            "sync ms": f"{s['seconds'] * 1e3:.2f}",
            "anchor ms": f"{s['anchor_seconds'] * 1e3:.2f}",
            "moved MB/s": f"{s['moved_cross_device_bytes'] / max(s['seconds'], 1e-9) / 1e6:.0f}",
        }
        for label, s in syncs.items()
    ]
