"""What users wait for: the CLI, building clusters, the lab's buttons, and the steady weight sync, cold and warm.

    python benchmarks/interactive.py [--quick] [--only cli,build,lab,sync,step,tunix] [--timeout 600]

Every figure is measured, none estimated. Every "cold" figure comes from a
fresh Python process whose JAX persistent compilation cache
(``RLCLUSTER_LAB_COMPILATION_CACHE``) points at a new, empty folder; every
"warm" figure from a fresh process whose folder was filled by an identical
earlier process. Children set the device count and the cache first, then
print one JSON line that this script reads. A child that fails or hangs
(``--timeout``) is reported as "failed" with its stderr tail; the run goes on.

Sections:

1. CLI: wall time of ``python -m rlcluster_lab report ... --sync --json`` as a
   user sees it, next to ``python -c "import jax"`` (interpreter start + import
   jax, subtracted for the targets) and a refused combination (exit code 2).
2. ``build_cluster`` + first sync + steady sync for layout x LoRA x engine
   (tiny model), each scenario in its own fresh process, cold and warm; and
   all twelve scenarios in one fresh process (build + two syncs each).
3. The lab from Python (``PlacementLab(build=False)``): construct, sync,
   training steps and a rebuild after changing knobs, cold and warm.
4. Steady sync handover (``SyncReport.seconds``) against the fastest reshard
   of the same tree on this machine (bare ``jax.device_put`` or a jitted
   identity with the destination shardings), tiny and small models.
5. The first RL step through the public API, cold and warm, with the table of
   the programs it compiled (``interactive_step.py``).
6. The twelve scenarios beside Tunix's own RLCluster (``interactive_step.py``).
7. The compile-hiding machinery, each part's cold figure with it and without it
   (``interactive_hiding.py``).

The header gives the machine's load average (``os.getloadavg()``) at the start
and the end: the machine may be shared, and cold timings move with its load.

Then a table of targets, the raw numbers in ``<out>/interactive.json`` and
a plot in ``<out>/interactive.png``. ``--quick`` runs fewer cases (3-4
minutes on 2 busy cores); the full run about 9. The lab is clicked without
pauses, so a click that waits for background work an earlier click started
(the lab's rehearsal of the next training step) shows that wait, apart.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
import interactive_hiding
import interactive_step

REPO = Path(__file__).resolve().parents[1]
CACHE_ENV = "RLCLUSTER_LAB_COMPILATION_CACHE"
ENGINES = ("vanilla", "vllm")
SECTIONS = ("cli", "build", "lab", "sync", "step", "tunix", "hiding")

# Targets (seconds, or a ratio for the sync).
T_BUILD_COLD = 2.0
T_TWELVE = 14.0
# Every lab click within a second on the standard layouts, within two on a custom rollout mesh.
T_CONSTRUCT = 1.0
T_FIRST_SYNC = 0.5
T_TRAIN_STEP = 1.0
T_CUSTOM_CLICK = 2.0
T_CLI_WARM = 2.0
T_CLI_COLD = 4.0
T_SYNC_RATIO = 1.0

# ------------------------------------------------------------------ child programs
# Each child gets ARGS (JSON) first; the prelude sets the device count and the
# compilation cache before anything else touches JAX.

PRELUDE = r"""
import time
_t0 = time.perf_counter()
import json, os, statistics, sys, traceback
import jax
jax.config.update("jax_num_cpu_devices", ARGS["devices"])
from rlcluster_lab.core.compile_cache import enable_compilation_cache
_cache = enable_compilation_cache()
IMPORT_JAX_S = time.perf_counter() - _t0
_t = time.perf_counter()
_devices = jax.devices()
BACKEND_S = time.perf_counter() - _t


def emit(obj):
    import flax, jaxlib
    obj["child"] = {
        "python": sys.version.split()[0],
        "jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
        "backend": jax.default_backend(), "device_count": len(_devices),
        "cache_dir": str(_cache) if _cache is not None else None,
        "import_jax_and_cache_s": IMPORT_JAX_S, "backend_init_s": BACKEND_S,
    }
    print("@@RESULT@@ " + json.dumps(obj), flush=True)


def error_text(exc):
    return (type(exc).__name__ + ": " + " ".join(str(exc).split()))[:500]
"""

BUILD_CHILD = r"""
_t = time.perf_counter()
from rlcluster_lab import Scenario, build_cluster
IMPORT_LAB_S = time.perf_counter() - _t
REPORT_FIELDS = ("moved_cross_device_bytes", "minimum_cross_device_bytes", "relayed_cross_device_bytes",
                 "synced_bytes", "reused_bytes")
rows = []
cluster = None
_t_all = time.perf_counter()
for sc in ARGS["scenarios"]:
    row = dict(sc)
    try:
        cluster = None  # the previous cluster goes first, as the lab does
        t = time.perf_counter()
        cluster = build_cluster(Scenario(layout=sc["layout"], lora=sc["lora"], engine=sc["engine"],
                                         model_size=sc["size"]))
        row["build_s"] = time.perf_counter() - t
        t = time.perf_counter()
        rep = cluster.sync_weights()
        row["first_sync_wall_s"] = time.perf_counter() - t
        row["first_handover_s"] = rep.seconds
        row["first_includes_compilation"] = bool(getattr(rep, "includes_compilation", False))
        row["reshard_strategy"] = str(getattr(rep, "reshard_strategy", "?"))
        for name in REPORT_FIELDS:
            value = getattr(rep, name, None)
            row[name] = int(value) if value is not None else None
        walls, handovers, compiled = [], [], []
        for _ in range(ARGS["steady"]):
            t = time.perf_counter()
            r = cluster.sync_weights()
            walls.append(time.perf_counter() - t)
            handovers.append(r.seconds)
            compiled.append(bool(getattr(r, "includes_compilation", False)))
        row["steady_wall_s"] = walls
        row["steady_handover_s"] = handovers
        row["steady_includes_compilation"] = compiled
    except Exception as exc:
        row["error"] = error_text(exc)
        row["traceback"] = traceback.format_exc()[-3000:]
    rows.append(row)
cluster = None
TOTAL_S = time.perf_counter() - _t_all
# What was compiled and not yet written to the disk cache (core.compile_cache.WriteBehind),
# written now and timed apart: outside TOTAL_S, as it is outside a person's wait.
from rlcluster_lab.core.compile_cache import flush_cache_writes
_t = time.perf_counter()
flush_cache_writes()
emit({"import_lab_s": IMPORT_LAB_S, "rows": rows, "total_s": TOTAL_S, "written_after_s": time.perf_counter() - _t})
"""

LAB_CHILD = r"""
import threading
_t = time.perf_counter()
from rlcluster_lab.lab.widget.placement_lab import PlacementLab
IMPORT_LAB_S = time.perf_counter() - _t
_t = time.perf_counter()
lab = PlacementLab(build=False)
INIT_S = time.perf_counter() - _t
_baseline_threads = {t.ident for t in threading.enumerate()}


def panel_problems():
    found = []
    for name, out in (getattr(lab, "outputs", None) or {}).items():
        for item in getattr(out, "outputs", ()):
            text = str(item.get("data", {}).get("text/plain", ""))
            if text.startswith("could not draw"):
                found.append(name + ": " + text[:300])
    return found


def read_timings():
    timings = getattr(lab, "timings", None)
    if not timings:
        return None
    try:
        items = dict(timings).items()
    except Exception:
        return repr(timings)[:500]
    out = {}
    for k, v in items:
        try:
            json.dumps(v)
            out[str(k)] = v
        except Exception:
            out[str(k)] = repr(v)[:200]
    return out


actions = []


def act(name, fn, lab_action=True):
    # Work an earlier action left running (a thread this script did not start), at the moment of the click.
    # The lab's own figure for the wait (lab._waited, set by every action that builds, syncs or steps) is read after.
    background = [t.name for t in threading.enumerate() if t.ident not in _baseline_threads and t.is_alive()]
    t = time.perf_counter()
    try:
        fn()
        error = getattr(lab, "error", None)
    except Exception as exc:
        error = "raised " + error_text(exc)
    seconds = time.perf_counter() - t
    waited = getattr(lab, "_waited", None) if lab_action else None
    actions.append({"action": name, "seconds": seconds, "error": error, "has_cluster": lab.cluster is not None,
                    "panel_problems": panel_problems(), "timings": read_timings() if lab_action else None,
                    "background_at_click": background,
                    "waited_for_background_s": float(waited) if isinstance(waited, (int, float)) else None})


def set_knobs():
    lab.knobs.lora.value = True
    lab.knobs.layout.value = "reshaped"


act("construct (first)", lab.construct)
act("construct (again, same knobs)", lab.construct)
act("sync (first)", lab.sync)
act("train_step (first)", lab.train_step)
act("train_step (second)", lab.train_step)
act("set knobs lora=True, layout=reshaped", set_knobs, lab_action=False)
act("construct (LoRA, reshaped)", lab.construct)
act("sync (first, LoRA, reshaped)", lab.sync)


def custom_mesh():
    # The custom rollout mesh a user picks: devices 4-7 of the eight, as 2 x 2.
    from rlcluster_lab.lab.widget.controls import CUSTOM
    lab.knobs.lora.value = False
    lab.knobs.layout.value = CUSTOM
    for toggle in lab.knobs.device_toggles[:4]:
        toggle.value = False
    lab.knobs.rollout_shape.value = (2, 2)


act("set knobs custom rollout mesh: devices 4-7 as 2 x 2", custom_mesh, lab_action=False)
act("construct (custom mesh)", lab.construct)
act("sync (first, custom mesh)", lab.sync)
act("train_step (first, custom mesh)", lab.train_step)
emit({"import_lab_s": IMPORT_LAB_S, "init_s": INIT_S, "actions": actions})
"""

SYNC_CHILD = r"""
import gc
from flax import nnx
from rlcluster_lab import Scenario, build_cluster
from rlcluster_lab.core.compile_cache import flush_cache_writes


def median_of(fn, repeats, warmup):
    for _ in range(warmup):
        fn()
    flush_cache_writes()  # what the warm-ups compiled is written now, never inside a timed run
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def forget_programs():
    # Compiled programs hold memory mappings: start every case without the last one's.
    try:
        from rlcluster_lab.placement.programs import clear_programs
        clear_programs()
    except Exception:
        pass
    jax.clear_caches()


rows = []
for size in ARGS["sizes"]:
    for layout in ARGS["layouts"]:
        for lora in (False, True):
            row = {"size": size, "layout": layout, "lora": lora, "engine": "vanilla"}
            try:
                cluster = build_cluster(Scenario(layout=layout, lora=lora, model_size=size))
                for _ in range(2):
                    cluster.sync_weights()
                flush_cache_writes()
                reports = [cluster.sync_weights() for _ in range(ARGS["repeats"])]
                handovers = [r.seconds for r in reports]
                row["handover_s"] = statistics.median(handovers)
                row["handover_all_s"] = handovers
                row["handover_includes_compilation"] = any(
                    bool(getattr(r, "includes_compilation", False)) for r in reports
                )
                row["reshard_strategy"] = str(getattr(reports[-1], "reshard_strategy", "?"))
                row["moved_cross_device_bytes"] = int(reports[-1].moved_cross_device_bytes)
                kind = nnx.LoRAParam if cluster.trainable_is_lora else nnx.Param
                src = nnx.state(cluster.actor_model, kind)
                dst = nnx.state(cluster.rollout.model(), kind)
                src_leaves, dst_leaves = jax.tree.leaves(src), jax.tree.leaves(dst)
                if [x.shape for x in src_leaves] != [x.shape for x in dst_leaves]:
                    raise RuntimeError("actor and rollout trees differ in their leaves' shapes")
                row["same_tree_structure"] = jax.tree.structure(src) == jax.tree.structure(dst)
                row["same_objects"] = all(a is b for a, b in zip(src_leaves, dst_leaves))
                row["same_shardings"] = all(a.sharding == b.sharding for a, b in zip(src_leaves, dst_leaves))
                row["tree_bytes"] = int(sum(x.nbytes for x in src_leaves))
                shardings = [x.sharding for x in dst_leaves]

                def put():
                    jax.block_until_ready(jax.device_put(src_leaves, shardings))

                def jitted_identity():
                    identity = jax.jit(lambda t: t, out_shardings=shardings)
                    jax.block_until_ready(identity(src_leaves))  # compiled once, before timing
                    return lambda: jax.block_until_ready(identity(src_leaves))

                # Each way is tried on its own: a jitted program needs its inputs and outputs on
                # one set of devices, which the split layout's disjoint meshes are not.
                candidates = {}
                for key, name, make in (("device_put", "device_put", lambda: put),
                                        ("jit_identity", "jit identity", jitted_identity)):
                    try:
                        row[key + "_s"], row[key + "_all_s"] = median_of(make(), ARGS["repeats"], 2)
                        candidates[name] = row[key + "_s"]
                    except Exception as exc:
                        row[key + "_s"] = None
                        row[key + "_error"] = error_text(exc)
                if not candidates:
                    raise RuntimeError(
                        "neither device_put nor a jitted identity ran: " + row.get("device_put_error", "")
                    )
                row["fastest"] = min(candidates, key=candidates.get)
                row["fastest_s"] = candidates[row["fastest"]]
                row["ratio"] = row["handover_s"] / row["fastest_s"] if row["fastest_s"] > 0 else None
                del src, dst, src_leaves, dst_leaves, shardings, cluster
            except Exception as exc:
                row["error"] = error_text(exc)
                row["traceback"] = traceback.format_exc()[-3000:]
            gc.collect()
            forget_programs()
            rows.append(row)
            print(f"  sync vs reshard: {size}/{layout}/{'lora' if lora else 'full'} done", file=sys.stderr, flush=True)
emit({"rows": rows})
"""


# ------------------------------------------------------------------ running children


class Runner:
    def __init__(self, args: Any) -> None:
        self.args = args
        self.root = Path(tempfile.mkdtemp(prefix="rlcluster-interactive-"))
        self.count = 0
        self.started = time.perf_counter()
        self.failures: list[str] = []

    def fresh_cache(self) -> Path:
        self.count += 1
        folder = self.root / f"cache{self.count:03d}"
        folder.mkdir()
        return folder

    def log(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.started:6.0f} s] {text}", file=sys.stderr, flush=True)

    def fail(self, what: str, proc: dict[str, Any], why: str) -> None:
        self.failures.append(f"{what}: {why}")
        print(
            f"\n!!! {what} failed: {why}\n--- stderr tail ---\n{common.tail(proc.get('stderr', ''), 25)}\n---",
            file=sys.stderr,
            flush=True,
        )

    def python(
        self, what: str, body: str, child_args: dict[str, Any], cache: Path, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """A fresh Python process running PRELUDE + body with ``cache`` as its compilation cache
        (``env``: more environment variables)."""
        payload = dict(child_args, devices=self.args.devices)
        code = f"import json as _json\nARGS = _json.loads({json.dumps(json.dumps(payload))})\n" + PRELUDE + body
        self.log(f"{what} (cache {cache.name}, {cache_entries(cache)} entries)")
        proc = common.run_python_child(
            code, env={**(env or {}), CACHE_ENV: str(cache)}, timeout=self.args.timeout, cwd=str(REPO)
        )
        proc["cache_entries_after"] = cache_entries(cache)
        result = proc["result"]
        if proc["timed_out"]:
            self.fail(what, proc, f"timed out after {self.args.timeout} s")
        elif proc["rc"] != 0 or result is None:
            self.fail(what, proc, f"exit code {proc['rc']}, {'no' if result is None else 'a'} result line")
        elif result["child"]["cache_dir"] != str(cache):
            self.fail(what, proc, f"the child's cache folder is {result['child']['cache_dir']}, not {cache}")
            proc["result"] = None
        return {
            "ok": proc["result"] is not None,
            "wall_s": proc["wall_s"],
            "rc": proc["rc"],
            "result": proc["result"],
            "stderr_tail": common.tail(proc["stderr"], 25) if proc["result"] is None else "",
            "cache_entries_after": proc["cache_entries_after"],
        }

    def command(self, what: str, argv: list[str], cache: Path | None) -> dict[str, Any]:
        self.log(what)
        env = {CACHE_ENV: str(cache)} if cache is not None else None
        proc = common.run_process(argv, env=env, timeout=self.args.timeout, cwd=str(REPO))
        return {
            "wall_s": proc["wall_s"],
            "rc": proc["rc"],
            "timed_out": proc["timed_out"],
            "stdout": proc["stdout"],
            "stderr": proc["stderr"],
        }

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def cache_entries(folder: Path) -> int:
    try:
        return sum(1 for _ in folder.iterdir())
    except OSError:
        return 0


def med(values: list[float | None]) -> float | None:
    good = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(good) if good else None


def fmt(x: float | None, scale: float = 1.0) -> Any:
    return "failed" if x is None else x * scale


def na(x: float | None, scale: float = 1.0) -> Any:
    return "n/a" if x is None else x * scale


def nan(x: float | None) -> float:
    return float("nan") if x is None else x


def label(sc: dict[str, Any]) -> str:
    return f"{sc['layout']}/{'lora' if sc['lora'] else 'full'}/{sc['engine']}"


# ------------------------------------------------------------------ 1. CLI


def cli_section(run: Runner, quick: bool) -> dict[str, Any]:
    py = sys.executable
    repeats = 1 if quick else 2
    out: dict[str, Any] = {"repeats": repeats}
    for name, argv in (("python -c pass", [py, "-c", "pass"]), ('python -c "import jax"', [py, "-c", "import jax"])):
        runs = [run.command(name, argv, None) for _ in range(repeats + 1)]
        out[name] = {"wall_s": [r["wall_s"] for r in runs if r["rc"] == 0], "failed": sum(r["rc"] != 0 for r in runs)}
        out[name]["median_s"] = med(out[name]["wall_s"])
    commands = {
        "report --sync --json": ["report", "--sync", "--json"],
        "report --layout reshaped --lora --sync --json": [
            "report",
            "--layout",
            "reshaped",
            "--lora",
            "--sync",
            "--json",
        ],
    }
    out["commands"] = {}
    for name, flags in commands.items():
        argv = [py, "-m", "rlcluster_lab", *flags, "--devices", str(run.args.devices)]
        entry: dict[str, Any] = {"cold_s": [], "warm_s": [], "cache_entries": []}
        for _ in range(repeats):
            cache = run.fresh_cache()
            for state in ("cold", "warm"):
                r = run.command(f"CLI {state}: {name}", argv, cache)
                ok = r["rc"] == 0 and _report_json_ok(r["stdout"])
                if not ok:
                    run.fail(
                        f"CLI {state}: {name}",
                        r,
                        f"exit code {r['rc']}"
                        + (" (timed out)" if r["timed_out"] else "")
                        + ("" if r["rc"] != 0 else ", stdout is not a report with a sync"),
                    )
                entry[f"{state}_s"].append(r["wall_s"] if ok else None)
            entry["cache_entries"].append(cache_entries(cache))
        entry["cold_median_s"] = med(entry["cold_s"]) if all(v is not None for v in entry["cold_s"]) else None
        entry["warm_median_s"] = med(entry["warm_s"]) if all(v is not None for v in entry["warm_s"]) else None
        out["commands"][name] = entry
    # A refused combination: should exit with code 2 before JAX starts (the cache folder is never made).
    name = "report --engine sglang_jax --lora --no-static-lora"
    errs = []
    for _ in range(repeats + 1):
        cache = run.fresh_cache() / "never-created"
        r = run.command(
            f"CLI error: {name}",
            [py, "-m", "rlcluster_lab", "report", "--engine", "sglang_jax", "--lora", "--no-static-lora"],
            cache,
        )
        errs.append(
            {
                "wall_s": r["wall_s"],
                "rc": r["rc"],
                "message": common.tail(r["stderr"], 1)[:300],
                "cache_folder_created": cache.exists(),
            }
        )
        if r["rc"] != 2:
            run.fail(f"CLI error: {name}", r, f"exit code {r['rc']}, expected 2")
    out["error"] = {"command": name, "runs": errs, "median_s": med([e["wall_s"] for e in errs])}
    return out


def _report_json_ok(stdout: str) -> bool:
    try:
        data = json.loads(stdout)
    except ValueError:
        return False
    return isinstance(data, dict) and bool(data.get("sync"))


def print_cli(out: dict[str, Any]) -> None:
    base = out['python -c "import jax"']["median_s"]
    print(f"\n== 1. CLI: wall time of a fresh process as a user sees it (median of {out['repeats']} cold/warm pairs)")
    rows = [
        ["python -c pass (interpreter start)", fmt(out["python -c pass"]["median_s"]), "", "", "", ""],
        ['python -c "import jax"', fmt(base), "", "", "", ""],
    ]
    for name, e in out["commands"].items():
        cold, warm = e["cold_median_s"], e["warm_median_s"]
        rows.append(
            [
                f"python -m rlcluster_lab {name}",
                fmt(cold),
                fmt(warm),
                fmt(None if cold is None or base is None else cold - base),
                fmt(None if warm is None or base is None else warm - base),
                max(e["cache_entries"] or [0]),
            ]
        )
    err = out["error"]
    rows.append(
        [
            f"python -m rlcluster_lab {err['command']}",
            fmt(err["median_s"]),
            "",
            "",
            "",
            f"rc {sorted({e['rc'] for e in err['runs']}, key=str)}, cache made: "
            f"{'yes' if any(e['cache_folder_created'] for e in err['runs']) else 'no'}",
        ]
    )
    print(
        common.table(
            ["command", "cold s", "warm s", "cold - import jax", "warm - import jax", "cache files / note"], rows
        )
    )
    print(f"  error message: {err['runs'][0]['message'] if err['runs'] else ''}")


# ------------------------------------------------------------------ 2. build_cluster + sync


def all_scenarios(layouts: list[str]) -> list[dict[str, Any]]:
    return [
        {"layout": layout, "lora": lora, "engine": engine, "size": "tiny"}
        for layout in layouts
        for lora in (False, True)
        for engine in ENGINES
    ]


QUICK_SCENARIOS = [("colocated", False, "vanilla"), ("reshaped", True, "vanilla"), ("split", True, "vllm")]


def build_section(run: Runner, quick: bool, layouts: list[str]) -> dict[str, Any]:
    scenarios = all_scenarios(layouts)
    if quick:
        scenarios = [s for s in scenarios if (s["layout"], s["lora"], s["engine"]) in QUICK_SCENARIOS]
    out: dict[str, Any] = {"per_process": [], "twelve": {}}
    for sc in scenarios:
        cache = run.fresh_cache()
        entry = {"scenario": sc}
        for state in ("cold", "warm"):
            entry[state] = run.python(
                f"build+sync {state}: {label(sc)}", BUILD_CHILD, {"scenarios": [sc], "steady": 5}, cache
            )
        out["per_process"].append(entry)
    cache = run.fresh_cache()
    twelve = all_scenarios(layouts)
    out["twelve_scenarios"] = twelve
    for state in ("cold", "warm"):
        out["twelve"][state] = run.python(
            f"all {len(twelve)} scenarios in one process, {state}",
            BUILD_CHILD,
            {"scenarios": twelve, "steady": 1},
            cache,
        )
    return out


def _row_of(child: dict[str, Any]) -> dict[str, Any] | None:
    if not child["ok"]:
        return None
    row = child["result"]["rows"][0]
    return None if "error" in row else row


def build_first(row: dict[str, Any] | None) -> float | None:
    return None if row is None else row["build_s"] + row["first_sync_wall_s"]


def print_build(out: dict[str, Any]) -> None:
    print("\n== 2a. build_cluster + first sync + steady sync, tiny model, each scenario in its own fresh process")
    print("   (build and syncs timed inside the child; imports and backend start-up apart; steady = median of 5)")
    for state in ("cold", "warm"):
        rows = []
        for e in out["per_process"]:
            child, row = e[state], _row_of(e[state])
            sc = e["scenario"]
            if row is None:
                err = (child["result"]["rows"][0].get("error") if child["ok"] else None) or "child failed"
                rows.append(
                    [sc["layout"], "lora" if sc["lora"] else "full", sc["engine"], "failed"] + [""] * 8 + [err[:60]]
                )
                continue
            info = child["result"]["child"]
            rows.append(
                [
                    sc["layout"],
                    "lora" if sc["lora"] else "full",
                    sc["engine"],
                    info["import_jax_and_cache_s"] + child["result"]["import_lab_s"],
                    info["backend_init_s"],
                    row["build_s"],
                    row["first_sync_wall_s"],
                    row["first_handover_s"] * 1e3,
                    "yes" if row["first_includes_compilation"] else "no",
                    build_first(row),
                    med(row["steady_handover_s"]) * 1e3,
                    med(row["steady_wall_s"]) * 1e3,
                    f"{row['reshard_strategy']}; moved {row['moved_cross_device_bytes']:,} B "
                    f"(min {row['minimum_cross_device_bytes']:,}, relayed {row['relayed_cross_device_bytes']:,})",
                ]
            )
        print(f"\n-- {state} ({'empty cache' if state == 'cold' else 'cache filled by the identical cold process'})")
        print(
            common.table(
                [
                    "layout",
                    "params",
                    "engine",
                    "imports s",
                    "backend s",
                    "build s",
                    "1st sync s",
                    "1st handover ms",
                    "compiled",
                    "build+1st s",
                    "steady handover ms",
                    "steady sync ms",
                    "strategy; bytes",
                ],
                rows,
            )
        )

    cold, warm = out["twelve"].get("cold"), out["twelve"].get("warm")
    print(
        f"\n== 2b. all {len(out['twelve_scenarios'])} scenarios in ONE fresh process (build + two syncs each; "
        "the previous cluster dropped first)"
    )
    rows = []
    n = (
        len(cold["result"]["rows"])
        if cold and cold["ok"]
        else len(warm["result"]["rows"])
        if warm and warm["ok"]
        else 0
    )
    for i in range(n):
        cells: list[Any] = []
        sc = None
        for child in (cold, warm):
            r = child["result"]["rows"][i] if child and child["ok"] else None
            sc = sc or r
            if r is None or "error" in r:
                cells += ["failed", "", ""]
            else:
                cells += [r["build_s"], r["first_sync_wall_s"], r["steady_wall_s"][0]]
        rows.append([label(sc)] + cells)
    totals: list[Any] = ["total (in process)"]
    walls: list[Any] = ["process wall (with interpreter + imports)"]
    for child in (cold, warm):
        ok = child and child["ok"] and not any("error" in r for r in child["result"]["rows"])
        totals += [fmt(child["result"]["total_s"] if ok else None), "", ""]
        walls += [fmt(child["wall_s"] if ok else None), "", ""]
    rows += [totals, walls]
    print(
        common.table(
            [
                "scenario",
                "cold build s",
                "cold 1st sync s",
                "cold 2nd sync s",
                "warm build s",
                "warm 1st sync s",
                "warm 2nd sync s",
            ],
            rows,
        )
    )


# ------------------------------------------------------------------ 3. the lab


def lab_section(run: Runner, quick: bool) -> dict[str, Any]:
    repeats = 1 if quick else 2
    out: dict[str, Any] = {"repeats": repeats, "cold": [], "warm": []}
    for _ in range(repeats):
        cache = run.fresh_cache()
        for state in ("cold", "warm"):
            out[state].append(run.python(f"lab {state}", LAB_CHILD, {}, cache))
    return out


def lab_action_seconds(runs: list[dict[str, Any]], what: str = "wall") -> dict[str, float | None]:
    """Per action, the median over processes; None where an action failed in any of them.

    ``what``: "wall" (click to done, as a user clicking at once waits), "waited" (the part
    spent waiting for background work an earlier action started, as the lab reports it;
    0 where it reports none) or "minus_wait" (the difference).
    """
    names: list[str] = []
    values: dict[str, list[float | None]] = {}
    for child in runs:
        if not child["ok"]:
            continue
        for a in child["result"]["actions"]:
            if a["action"] not in values:
                names.append(a["action"])
                values[a["action"]] = []
            bad = a["error"] or a["panel_problems"] or (not a["has_cluster"] and not a["action"].startswith("set"))
            waited = a.get("waited_for_background_s") or 0.0
            value = {"wall": a["seconds"], "waited": waited, "minus_wait": a["seconds"] - waited}[what]
            values[a["action"]].append(None if bad else value)
    ok_runs = sum(1 for c in runs if c["ok"])
    return (
        {n: (med(v) if len(v) == ok_runs and all(x is not None for x in v) else None) for n, v in values.items()}
        if ok_runs
        else {}
    )


def print_lab(out: dict[str, Any]) -> None:
    print(
        f"\n== 3. the lab from Python: PlacementLab(build=False), each action timed with its redraw, clicked one "
        f"after another without pause (median of {out['repeats']} fresh process(es) per cache state)"
    )
    wall = {s: lab_action_seconds(out[s]) for s in ("cold", "warm")}
    waited = {s: lab_action_seconds(out[s], "waited") for s in ("cold", "warm")}

    def imports(state: str) -> float | None:
        ok = [c for c in out[state] if c["ok"]]
        return med([c["result"]["child"]["import_jax_and_cache_s"] + c["result"]["import_lab_s"] for c in ok])

    def init(state: str) -> float | None:
        return med([c["result"]["init_s"] for c in out[state] if c["ok"]])

    rows = [
        [
            "import jax + rlcluster_lab.lab.widget.placement_lab (not an action)",
            fmt(imports("cold")),
            "",
            fmt(imports("warm")),
            "",
            "",
            "",
        ],
        ["PlacementLab(build=False)", fmt(init("cold")), "", fmt(init("warm")), "", "", ""],
    ]
    for name in list(dict.fromkeys(list(wall["cold"]) + list(wall["warm"]))):
        problems, background = [], set()
        for state in ("cold", "warm"):
            for c in out[state]:
                for a in c["result"]["actions"] if c["ok"] else []:
                    if a["action"] != name:
                        continue
                    background.update(a.get("background_at_click") or [])
                    if a["error"] or a["panel_problems"]:
                        problems.append(f"{state}: {(a['error'] or '; '.join(a['panel_problems']))[:80]}")

        def w(x: float | None) -> Any:
            return na(None if x is None else (0.0 if x < 1e-3 else x))

        rows.append(
            [
                name,
                fmt(wall["cold"].get(name)),
                w(waited["cold"].get(name)),
                fmt(wall["warm"].get(name)),
                w(waited["warm"].get(name)),
                ", ".join(sorted(background)),
                " | ".join(problems),
            ]
        )
    print(
        common.table(
            ["action", "cold s", "of which waiting", "warm s", "of which waiting", "running at click", "problems"], rows
        )
    )
    print(
        "   'of which waiting': the lab's own figure for the time the click spent waiting for background work an "
        "earlier action started\n   (lab._waited; n/a where the lab has none); 'running at click': threads not "
        "started by this script that were alive when the action was called"
    )
    timed = [
        (state, i, a)
        for state in ("cold", "warm")
        for i, c in enumerate(out[state])
        if c["ok"]
        for a in c["result"]["actions"]
        if a["timings"]
    ]
    if not timed:
        print("  (the lab exposes no lab.timings)")
        return
    if any(not isinstance(a["timings"], dict) for _, _, a in timed):
        for state, i, a in timed:
            print(f"  lab.timings after {a['action']} ({state} #{i + 1}): {a['timings']}")
        return
    keys = list(dict.fromkeys(k for _, _, a in timed for k in a["timings"]))
    print("\n   the lab's own lab.timings after each action (as it reports them; seconds where numeric)")
    print(
        common.table(
            ["state", "action", "total s (timed here)"] + keys,
            [
                [f"{state}" + (f" #{i + 1}" if out["repeats"] > 1 else ""), a["action"], a["seconds"]]
                + [a["timings"].get(k, "") for k in keys]
                for state, i, a in timed
            ],
        )
    )


# ------------------------------------------------------------------ 4. steady sync vs the fastest reshard


def sync_section(run: Runner, quick: bool, layouts: list[str], sizes: list[str], repeats: int) -> dict[str, Any]:
    child = run.python(
        f"steady sync vs fastest reshard ({','.join(sizes)})",
        SYNC_CHILD,
        {"sizes": sizes, "layouts": layouts, "repeats": repeats},
        run.fresh_cache(),
    )
    return {"sizes": sizes, "repeats": repeats, "child": child}


def sync_ratios(out: dict[str, Any]) -> dict[str, float | None]:
    """Median ratio per size and over all rows (None where a row failed)."""
    child = out["child"]
    if not child["ok"]:
        return {s: None for s in out["sizes"]} | {"all": None}
    rows = child["result"]["rows"]
    ratios: dict[str, float | None] = {}
    for key in out["sizes"] + ["all"]:
        sel = [r for r in rows if key in ("all", r["size"])]
        ok = [r["ratio"] for r in sel if r.get("ratio") is not None]
        ratios[key] = statistics.median(ok) if ok and len(ok) == len(sel) else None
    return ratios


def print_sync(out: dict[str, Any]) -> None:
    print(
        f"\n== 4. steady sync handover vs the fastest reshard of the same tree (vanilla engine; median of "
        f"{out['repeats']} after 2 warm-ups)"
    )
    child = out["child"]
    if not child["ok"]:
        print("   failed (see the stderr tail above)")
        return
    rows = []
    for r in child["result"]["rows"]:
        head = [r["size"], r["layout"], "lora" if r["lora"] else "full"]
        if "error" in r:
            rows.append(head + ["failed"] + [""] * 6 + [r["error"][:60]])
            continue
        note = (
            "same objects: nothing moves"
            if r["same_objects"]
            else ("same shardings" if r["same_shardings"] else r["reshard_strategy"])
        )
        if r["handover_includes_compilation"]:
            note += "; a timed sync compiled"
        for key, name in (("device_put", "device_put"), ("jit_identity", "jit identity")):
            if r.get(key + "_error"):
                note += f"; {name} n/a ({r[key + '_error'][:70]})"
        rows.append(
            head
            + [
                r["tree_bytes"],
                r["moved_cross_device_bytes"],
                r["handover_s"] * 1e3,
                na(r["device_put_s"], 1e3),
                na(r["jit_identity_s"], 1e3),
                r["fastest"],
                r["ratio"],
                note,
            ]
        )
    print(
        common.table(
            [
                "size",
                "layout",
                "params",
                "tree B (logical)",
                "moved B (physical)",
                "handover ms",
                "device_put ms",
                "jit identity ms",
                "fastest",
                "handover / fastest",
                "note",
            ],
            rows,
        )
    )
    for key, value in sync_ratios(out).items():
        print(f"  median ratio ({key}): {'failed' if value is None else f'{value:.3g}'}   target <= {T_SYNC_RATIO}")


# ------------------------------------------------------------------ targets, JSON, plot


def targets(results: dict[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = []

    def add(what: str, value: float | None, target: float, unit: str = "s", note: str = "") -> None:
        met = "n/a (failed)" if value is None else ("yes" if value <= target else "no")
        shown = "failed" if value is None else (f"{value:.3g} {unit}" if unit else f"{value:.3g}")
        rows.append([what, shown, f"<= {target:g} {unit}".rstrip(), met, note])

    if "build" in results:
        b = results["build"]
        per = [(label(e["scenario"]), build_first(_row_of(e["cold"]))) for e in b["per_process"]]
        if per:
            worst = None if any(v is None for _, v in per) else max(per, key=lambda p: p[1])
            add(
                "cold process, empty cache: max build_cluster + first sync",
                None if worst is None else worst[1],
                T_BUILD_COLD,
                note=f"over {len(per)} scenario(s), each in its own process" + (f"; worst {worst[0]}" if worst else ""),
            )
        cold = b["twelve"].get("cold")
        ok = cold and cold["ok"] and not any("error" in r for r in cold["result"]["rows"])
        add(
            f"{len(b['twelve_scenarios'])}-scenario run (cold, one fresh process)",
            cold["result"]["total_s"] if ok else None,
            T_TWELVE,
            note=f"build + 2 syncs each, in process; process wall {cold['wall_s']:.1f} s" if ok else "",
        )
    if "lab" in results:
        for state in ("cold", "warm"):
            for what in ("wall", "minus_wait"):
                secs = lab_action_seconds(results["lab"][state], what)
                waits = lab_action_seconds(results["lab"][state], "waited")
                if what == "minus_wait" and not any(w and w > 0.05 for w in waits.values()):
                    continue  # no click waited for background work: the rows above say it all
                how = "clicked at once" if what == "wall" else "minus the wait for background work"
                standard = {k: v for k, v in secs.items() if "custom" not in k}
                constructs = {k: v for k, v in standard.items() if k.startswith("construct")}
                syncs = {k: v for k, v in standard.items() if k.startswith("sync (first")}

                def worst(d: dict[str, float | None], waits=waits, what=what) -> tuple[float | None, str]:
                    if not d or None in d.values():
                        return None, ""
                    k = max(d, key=lambda n: d[n])
                    w = waits.get(k)
                    return d[k], f"worst: {k}" + (
                        f", of which {w:.2f} s waiting" if what == "wall" and w and w > 0.05 else ""
                    )

                value, note = worst(constructs)
                add(
                    f"lab ({state}): max Construct with redraw, {how}",
                    value,
                    T_CONSTRUCT,
                    note=f"over {len(constructs)} constructs; {note}",
                )
                value, note = worst(syncs)
                add(
                    f"lab ({state}): first Sync, {how}",
                    value,
                    T_FIRST_SYNC,
                    note=f"max over the {len(syncs)} first syncs of a new cluster; {note}",
                )
                step = {"train_step (first)": secs.get("train_step (first)")}
                value, note = worst(step)
                add(
                    f"lab ({state}): first Training step, {how}",
                    value,
                    T_TRAIN_STEP,
                    note="compiled in the background after Construct"
                    if any(
                        "rehears" in str(a.get("background_at_click"))
                        for c in results["lab"][state]
                        if c["ok"]
                        for a in c["result"]["actions"]
                    )
                    and what == "wall"
                    else note,
                )
                # A custom rollout mesh (devices 4-7 as 2 x 2): every click of it, against its own target.
                for name in ("construct (custom mesh)", "sync (first, custom mesh)", "train_step (first, custom mesh)"):
                    value, note = worst({name: secs.get(name)})
                    add(f"lab ({state}): {name}, {how}", value, T_CUSTOM_CLICK, note=note)
    if "cli" in results:
        c = results["cli"]
        base = c['python -c "import jax"']["median_s"]
        for name, e in c["commands"].items():
            for state, target in (("warm", T_CLI_WARM), ("cold", T_CLI_COLD)):
                v = e[f"{state}_median_s"]
                add(
                    f"CLI {name} ({state}) - import jax",
                    None if v is None or base is None else v - base,
                    target,
                    note=f"wall {v:.2f} s - python -c 'import jax' {base:.2f} s" if v is not None and base else "",
                )
    interactive_step.target_rows(results, add)
    if "sync" in results:
        for key, value in sync_ratios(results["sync"]).items():
            add(
                f"steady sync handover / fastest reshard, median ({key})",
                value,
                T_SYNC_RATIO,
                unit="",
                note="layouts x LoRA, vanilla",
            )
    return rows


def page_rows(results: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """docs/performance.md's rows of the sections run (``common.page_row``): the slowest cold build and
    first sync here, the step's and Tunix's in ``interactive_step``, the clicks in ``interactive_hiding``."""
    rows = []
    if "build" in results:
        per = [build_first(_row_of(e["cold"])) for e in results["build"]["per_process"]]
        if per and None not in per:
            worst = max(v for v in per if v is not None)
            rows.append(
                common.page_row(
                    "build_first_sync",
                    "clicks",
                    "slowest `build_cluster` + first sync, each scenario in a fresh process, empty cache",
                    where,
                    common.run_value(worst, f"{worst:.2f} s"),
                    common.at_most(T_BUILD_COLD, f"<= {T_BUILD_COLD:g} s"),
                )
            )
    rows += interactive_step.page_rows(results, where)
    if "hiding" in results:
        rows += interactive_hiding.page_rows(results["hiding"], where)
    return rows


def save_plot(path: Path, results: dict[str, Any]) -> None:
    panels = []
    if "build" in results:
        per = results["build"]["per_process"]
        panels.append(
            {
                "labels": [label(e["scenario"]) for e in per],
                "series": {s: [nan(build_first(_row_of(e[s]))) for e in per] for s in ("cold", "warm")},
                "ylabel": "seconds",
                "title": "build_cluster + first sync, fresh process (tiny)",
                "hlines": [(T_BUILD_COLD, "cold target")],
            }
        )
    if "lab" in results:
        cold, warm = lab_action_seconds(results["lab"]["cold"]), lab_action_seconds(results["lab"]["warm"])
        names = [n for n in dict.fromkeys(list(cold) + list(warm)) if not n.startswith("set knobs")]
        panels.append(
            {
                "labels": names,
                "series": {"cold": [nan(cold.get(n)) for n in names], "warm": [nan(warm.get(n)) for n in names]},
                "ylabel": "seconds (log)",
                "title": "lab actions, with redraw",
                "hlines": [
                    (T_CONSTRUCT, "construct target"),
                    (T_FIRST_SYNC, "sync target"),
                    (T_TRAIN_STEP, "step target"),
                ],
                "logy": True,
            }
        )
    if "cli" in results:
        c = results["cli"]
        base = c['python -c "import jax"']["median_s"] or float("nan")
        names = list(c["commands"])
        panels.append(
            {
                "labels": names,
                "series": {s: [nan(c["commands"][n][f"{s}_median_s"]) - base for n in names] for s in ("cold", "warm")},
                "ylabel": "seconds beyond python -c 'import jax'",
                "title": "CLI (targets: cold 4, warm 2)",
                "hlines": [(T_CLI_COLD, "cold target"), (T_CLI_WARM, "warm target")],
            }
        )
    if "sync" in results and results["sync"]["child"]["ok"]:
        rows = results["sync"]["child"]["result"]["rows"]
        panels.append(
            {
                "labels": [f"{r['size']}/{r['layout']}/{'lora' if r['lora'] else 'full'}" for r in rows],
                "series": {"handover / fastest reshard": [nan(r.get("ratio")) for r in rows]},
                "ylabel": "ratio (log)",
                "title": "steady sync handover / fastest reshard",
                "hlines": [(T_SYNC_RATIO, "target (median)")],
                "logy": True,
            }
        )
    if panels:
        common.save_bar_panels(str(path), panels)


def machine_facts(results: dict[str, Any]) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    facts["git"] = git_state()
    return facts


def git_state() -> dict[str, Any]:
    """The commit checked out and the files under src/ that differ from it (the package measured)."""
    head = common.run_process(["git", "rev-parse", "--short", "HEAD"], cwd=str(REPO), timeout=30)
    dirty = common.run_process(["git", "status", "--porcelain", "--", "src"], cwd=str(REPO), timeout=30)
    return {
        "head": head["stdout"].strip() or None,
        "src_changes": [line[3:] for line in dirty["stdout"].splitlines() if line.strip()],
    }


def first_child_facts(results: dict[str, Any]) -> dict[str, Any] | None:
    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            if "child" in x and isinstance(x["child"], dict) and "jax" in x["child"]:
                return x["child"]
            for v in x.values():
                found = walk(v)
                if found:
                    return found
        elif isinstance(x, list):
            for v in x:
                found = walk(v)
                if found:
                    return found
        return None

    return walk(results)


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.set_defaults(sizes="tiny,small", out=str(REPO / "benchmarks" / "results"))
    p.add_argument("--quick", action="store_true", help="fewer cases (about 3 minutes)")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {','.join(SECTIONS)}")
    p.add_argument("--timeout", type=float, default=600, help="seconds before a child process is stopped")
    p.add_argument("--keep-caches", action="store_true", help="keep the temporary compilation-cache folders")
    args = p.parse_args()
    only = [s for s in args.only.split(",") if s]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        p.error(f"unknown section(s) {', '.join(sorted(unknown))}")
    layouts = args.layouts.split(",")
    sizes = ["tiny"] if args.quick else args.sizes.split(",")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    results: dict[str, Any] = {"facts": machine_facts({}), "quick": args.quick, "args": vars(args)}
    run = Runner(args)
    run.log(f"load average (1, 5, 15 min) at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    start = time.perf_counter()
    try:
        measure = {
            "cli": lambda: cli_section(run, args.quick),
            "build": lambda: build_section(run, args.quick, layouts),
            "lab": lambda: lab_section(run, args.quick),
            "sync": lambda: sync_section(run, args.quick, layouts, sizes, args.repeats),
            "step": lambda: interactive_step.step_section(run, args.quick),
            "tunix": lambda: interactive_step.tunix_section(run, args.quick, BUILD_CHILD, all_scenarios(layouts)),
            "hiding": lambda: interactive_hiding.hiding_section(run, args.quick),
        }
        for section in SECTIONS:
            if section in only:
                try:
                    results[section] = measure[section]()
                except Exception as exc:  # noqa: BLE001 - a bug here must not lose the other sections
                    import traceback

                    run.failures.append(f"section {section}: {type(exc).__name__}: {exc}")
                    traceback.print_exc()
        child = first_child_facts(results)
        if child is None:  # no Python child ran (e.g. --only cli): ask one for the versions
            facts = run.python("machine facts", "emit({})\n", {}, run.fresh_cache())
            child = facts["result"]["child"] if facts["ok"] else {}
            results["child_facts"] = child
    finally:
        if args.keep_caches:
            print(f"compilation caches kept in {run.root}", file=sys.stderr)
        else:
            run.cleanup()
    results["facts"]["benchmark_wall_s"] = time.perf_counter() - start
    results["facts"]["load_average_at_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    results["facts"]["git_at_end"] = git_state()
    results["failures"] = run.failures

    f = results["facts"]
    print(f"interactive benchmark, {f['date']}{' (--quick)' if args.quick else ''}")
    print(
        f"machine: {f['cpu_count']} CPUs ({f['cpus_usable']} usable), {f['platform']}; python {f['python']}; "
        f"jax {child.get('jax', '?')}, jaxlib {child.get('jaxlib', '?')}, flax {child.get('flax', '?')}; "
        f"backend {child.get('backend', '?')} with {child.get('device_count', '?')} devices; "
        f"load average (1, 5, 15 min) {', '.join(f'{x:.2f}' for x in f['load_average_at_start'])} at start, "
        f"{', '.join(f'{x:.2f}' for x in f['load_average_at_end'])} at end"
        if f["load_average_at_start"]
        else ""
    )
    for when, g in (("start", f["git"]), ("end", f["git_at_end"])):
        print(
            f"package at {when}: commit {g['head']}"
            + (
                f", uncommitted changes in {len(g['src_changes'])} file(s) under src/: {', '.join(g['src_changes'])}"
                if g["src_changes"]
                else ", src/ clean"
            )
        )
    print(
        "every cold figure: a fresh process with an empty compilation cache; every warm figure: a fresh process "
        "whose cache an identical earlier process filled"
    )
    json_path = out_dir / "interactive.json"
    try:
        target_rows = targets(results)
    except Exception as exc:  # noqa: BLE001 - report it, keep the raw numbers
        target_rows = [["(the targets could not be computed)", f"{type(exc).__name__}: {exc}", "", "", ""]]
    results["targets"] = [dict(zip(["figure", "measured", "target", "met", "note"], r)) for r in target_rows]
    json_path.write_text(json.dumps(results, indent=1, default=str))
    for section, show in (
        ("cli", print_cli),
        ("build", print_build),
        ("lab", print_lab),
        ("sync", print_sync),
        ("step", interactive_step.print_step),
        ("tunix", interactive_step.print_tunix),
        ("hiding", interactive_hiding.print_hiding),
    ):
        if section in results:
            try:
                show(results[section])
            except Exception as exc:  # noqa: BLE001 - one broken table must not hide the others
                print(
                    f"\n(section {section}: the table could not be printed: {type(exc).__name__}: {exc}; "
                    f"the numbers are in {json_path})"
                )
    print("\n== targets")
    print(common.table(["figure", "measured", "target", "met", "note"], target_rows))
    if run.failures:
        print(f"\n{len(run.failures)} failure(s):")
        for line in run.failures:
            print(f"  {line}")
    print(f"\nbenchmark wall time {results['facts']['benchmark_wall_s']:.0f} s")

    print()
    common.emit_rows(page_rows(results, common.machine(child.get("backend") or "cpu")), args.save_row)

    png_path = out_dir / "interactive.png"
    try:
        save_plot(png_path, results)
        print(f"saved {json_path} and {png_path}")
    except Exception as exc:  # noqa: BLE001 - the numbers are saved already
        print(f"saved {json_path}; the plot failed: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
