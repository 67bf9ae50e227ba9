"""The first GRPO learner step of a preset, cold and with the compilation cache filled, and the
warm step after it, phase by phase: the first-step rows of docs/performance.md on a chip.

    python benchmarks/first_step.py [--sizes small,large] [--lora] [--repeats 5] [--no-build-ahead]
        [--learn large] [--floor path/to/floor.py]

For each size, two fresh processes share one new compilation-cache folder:

1. cold (the folder empty): set up the devices, build the colocated cluster on the
   chip (``rl.setup().devices_for("colocated")``; on a machine without one, on the
   simulated CPU devices), take one ``GRPOLearner.step`` (4 prompts x 4, 16 sampled
   tokens), every program it compiled listed with its seconds, and P11's gaps and the
   step's KL (the update's forward at the platform's default precision against the
   reference's exact log-probs, ``core.precision``); the cache writes flushed apart;
   then ``--repeats`` warm steps, each timed by phase (generate, log-probs, update,
   sync and the sync's anchor re-pin).
2. cached (the folder the cold one filled): the same build and first step.

``--learn`` sizes: ``python -m rlcluster_lab learn --model-size SIZE --steps 3`` as a user
runs it, in a fresh process with an empty compilation cache: its wall time (opening the
chip included) and the P11 gap it prints.

On a chip the cold first step is best read beside the same programs written in plain JAX (a
scanned layer stack, at the platform's default precision) compiled on the same machine:
``--floor`` runs such a script (a file of the user's; it prints one line per program, ``SIZE
scan|loop full|lora PROGRAM trace+lower Xs compile Ys run Zms``) in a process of its own
first, and the summary line puts the cold first step over the scanned programs' trace and
compile seconds. The summary (``SUMMARY_MARKER``, one JSON line) gathers every figure.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
from interactive import CACHE_ENV, PRELUDE

REPO = Path(__file__).resolve().parents[1]
SUMMARY_MARKER = "first-step summary: "
LEARN_STEPS = 3
# The line ``learn`` prints for P11's anchor-vs-sampler gap (cli.main).
P11_LINE = re.compile(r"P11: max \|anchor - sampler\|: (?P<gap>\S+)")
FLOOR_LINE = re.compile(
    r"(?P<size>\w+) (?P<how>scan|loop)\s+(?P<train>full|lora) (?P<program>\w+)\s+"
    r"trace\+lower\s+(?P<trace>[\d.]+)s compile\s+(?P<compile>[\d.]+)s run\s+(?P<run>[\d.]+)ms"
)

CHILD = r"""
import collections
import rlcluster_lab as rl
from rlcluster_lab import GRPOLearner, LearnerConfig, Scenario, build_cluster
from rlcluster_lab.core.compile_cache import count_compilations, flush_cache_writes
from rlcluster_lab.core.precision import PROGRAMS, precision_of

t = time.perf_counter()
lab = rl.setup(quiet=True)
devices = lab.devices_for("colocated")
cluster = build_cluster(Scenario(layout="colocated", model_size=ARGS["size"], lora=ARGS["lora"]), devices=devices)
learner = GRPOLearner(cluster, LearnerConfig(prompts_per_step=4, group_size=4))
if not ARGS["build_ahead"]:
    learner.builds_ahead = False
build_s = time.perf_counter() - t

# Each warm step's seconds by phase: the cluster's calls, timed from outside.
phase = collections.defaultdict(float)
for name in ("generate", "per_token_logps", "update_actor", "sync_weights"):
    call = getattr(cluster, name)

    def timed(*a, _call=call, _name=name, **k):
        t0 = time.perf_counter()
        try:
            return _call(*a, **k)
        finally:
            phase[_name] += time.perf_counter() - t0

    setattr(cluster, name, timed)

with count_compilations() as built:
    t = time.perf_counter()
    learner.step()
    first_s = time.perf_counter() - t
t = time.perf_counter()
flush_cache_writes()
written_after_s = time.perf_counter() - t
warm = []
for _ in range(ARGS["repeats"]):
    phase.clear()
    t = time.perf_counter()
    record = learner.step()
    total = time.perf_counter() - t
    warm.append({"total_s": total, **{k + "_s": v for k, v in phase.items()},
                 "sync_handover_s": record.sync.seconds, "anchor_repin_s": record.sync.anchor_seconds})
first = [p for p in learner.p11 if p.steps_taken_before == 0]
emit({"devices": str(devices[0]), "platform": devices[0].platform, "kind": devices[0].device_kind,
      "build_s": build_s, "first_s": first_s, "written_after_s": written_after_s,
      "programs": [[name, seconds, bool(cached)] for name, seconds, cached in built], "warm": warm,
      "p11_anchor_vs_sampler": max(p.anchor_vs_sampler for p in learner.p11),
      "p11_live_vs_anchor_first": max(p.live_vs_anchor for p in first),
      "first_step_kl": learner.history[0].kl,
      "precisions": {name: precision_of(name, cluster.cluster_config.matmul_precision) for name in PROGRAMS}})
"""


def run(size: str, args: argparse.Namespace, cache: Path, which: str) -> dict[str, Any] | None:
    payload = {
        "size": size,
        "lora": args.lora,
        "build_ahead": not args.no_build_ahead,
        "repeats": args.repeats,
        "devices": 8,
    }
    code = f"import json as _json\nARGS = _json.loads({json.dumps(json.dumps(payload))})\n" + PRELUDE + CHILD
    started = time.perf_counter()
    proc = common.run_python_child(code, env={CACHE_ENV: str(cache)}, timeout=args.timeout, cwd=str(REPO))
    wall = time.perf_counter() - started
    if proc["result"] is None:
        print(f"!!! {size} {which} failed (rc {proc['rc']}):\n{common.tail(proc.get('stderr', ''), 30)}", flush=True)
        return None
    out = proc["result"]
    out["process_wall_s"] = wall
    return out


def show(size: str, which: str, out: dict[str, Any]) -> None:
    programs = out["programs"]
    compiled = sum(s for _, s, cached in programs if not cached)
    print(
        f"\n{size} {which} on {out['devices']}: build {out['build_s']:.1f} s, first learner step "
        f"{out['first_s']:.1f} s ({len(programs)} programs, {compiled:.1f} s compiling; cache writes after "
        f"{out['written_after_s']:.1f} s; process {out['process_wall_s']:.0f} s)",
        flush=True,
    )
    for name, seconds, cached in sorted(programs, key=lambda p: -p[1])[:12]:
        print(f"    {seconds:7.2f} s  {'cache' if cached else 'built'}  {name}")
    if which == "cold" and out["warm"]:
        keys = [k for k in out["warm"][0] if k.endswith("_s")]
        print(
            "    warm steps: "
            + "; ".join(f"{k[:-2]} " + "/".join(f"{w.get(k, 0):.3f}" for w in out["warm"]) for k in keys)
        )


def page_rows(size: str, args: argparse.Namespace, cold: dict[str, Any], cached: dict[str, Any] | None) -> list[dict]:
    """docs/performance.md's rows of one size (``common.page_row``); its targets are the large preset's."""
    where = common.machine(cold.get("platform", "cpu"), cold.get("kind"))
    how = (", LoRA" if args.lora else "") + (", nothing built ahead" if args.no_build_ahead else "")
    large = size == "large"
    compiled = sum(s for _, s, was_cached in cold["programs"] if not was_cached)
    rows = [
        common.page_row(
            f"first_step.cold.{size}{how}",
            "first step",
            f"{size} preset{how}, first learner step, cold",
            where,
            common.run_value(cold["first_s"], f"{cold['first_s']:.1f} s ({compiled:.1f} s compiling)"),
        )
    ]
    if cached is not None:
        rows.append(
            common.page_row(
                f"first_step.cached.{size}{how}",
                "first step",
                f"{size} preset{how}, first learner step, cache filled",
                where,
                common.run_value(cached["first_s"], f"{cached['first_s']:.1f} s"),
                common.at_most(3.0, "<= 3 s") if large else None,
            )
        )
    if cold["warm"]:
        low, high = min(w["total_s"] for w in cold["warm"]), max(w["total_s"] for w in cold["warm"])
        rows.append(
            common.page_row(
                f"first_step.warm.{size}{how}",
                "first step",
                f"{size} preset{how}, a warm learner step",
                where,
                common.run_value([low, high], f"{low:.3f}-{high:.3f} s"),
                common.at_most(0.15, "<= 0.15 s") if large else None,
            )
        )
    return rows


def learn_cold(size: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """``learn --model-size SIZE --steps 3`` in a fresh process on an empty compilation cache:
    its wall time as seen from here and the P11 gap it prints (None when it failed)."""
    cache = Path(tempfile.mkdtemp(prefix="rlcluster-learn-"))
    argv = [sys.executable, "-m", "rlcluster_lab", "learn", "--model-size", size, "--steps", str(LEARN_STEPS)]
    try:
        proc = common.run_process(argv, env={CACHE_ENV: str(cache)}, timeout=args.timeout, cwd=str(REPO))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    found = P11_LINE.search(proc["stdout"])
    if proc["rc"] != 0 or found is None:
        print(f"!!! learn {size} failed (rc {proc['rc']}):\n{common.tail(proc['stdout'] + proc['stderr'], 30)}")
        return None
    print(f"\nlearn --model-size {size} --steps {LEARN_STEPS}, cold: {proc['wall_s']:.1f} s; {found[0]}", flush=True)
    return {"wall_s": proc["wall_s"], "p11_anchor_vs_sampler": float(found["gap"]), "stdout": proc["stdout"]}


def learn_rows(size: str, out: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The page's rows of one ``learn`` run on ``where``: its wall time and P11's gap (targets: large's)."""
    large = size == "large"
    command = f"learn --model-size {size} --steps {LEARN_STEPS}"
    gap = out["p11_anchor_vs_sampler"]
    return [
        common.page_row(
            f"first_step.learn.{size}",
            "first step",
            f"`{command}`, cold (a fresh process, an empty cache): from the command to its exit",
            where,
            common.run_value(out["wall_s"], f"{out['wall_s']:.1f} s"),
            common.at_most(25.0, "< 25 s") if large else None,
        ),
        common.page_row(
            f"first_step.p11.{size}",
            "first step",
            f"P11: max |anchor - sampler| log-prob, as `{command}` prints it",
            where,
            common.run_value(gap, f"{gap:.1e}"),
            common.at_most(1e-4, "<= 1e-4"),
        ),
    ]


def floor_seconds(path: str, sizes: list[str], args: argparse.Namespace) -> dict[str, Any] | None:
    """The floor script's programs (``FLOOR_LINE``) in a process of its own, per size: each
    program's trace + lower + compile seconds, and the scanned step's (generate, log-probs and
    the train step, full or with ``--lora`` the LoRA train step) added up."""
    proc = common.run_process([sys.executable, path, *sizes], timeout=args.timeout, cwd=str(REPO))
    lines = [m.groupdict() for m in FLOOR_LINE.finditer(proc["stdout"])]
    if proc["rc"] != 0 or not lines:
        print(f"!!! floor failed (rc {proc['rc']}):\n{common.tail(proc['stdout'] + proc['stderr'], 30)}")
        return None
    out: dict[str, Any] = {}
    for size in sizes:
        programs = {
            f"{m['how']} {m['train']} {m['program']}": float(m["trace"]) + float(m["compile"])
            for m in lines
            if m["size"] == size
        }
        train = "scan lora train_step" if args.lora else "scan full train_step"
        parts = ("scan full generate", "scan full logps", train)
        if all(k in programs for k in parts):
            out[size] = {"programs": programs, "scan_s": sum(programs[k] for k in parts)}
    print("\nfloor (trace + compile s): " + json.dumps(out), flush=True)
    return out


def summary(results: dict[str, Any], sizes: list[str]) -> dict[str, Any]:
    """Every figure of the run in one object, with the issue's targets read against them."""
    out: dict[str, Any] = {}
    floor = results.get("floor") or {}
    for size in sizes:
        cold, cached = results.get(f"{size} cold"), results.get(f"{size} cached")
        if not cold:
            continue
        warm = [w["total_s"] for w in cold["warm"]]
        compiled = sorted(([n, round(t, 2)] for n, t, hit in cold["programs"] if not hit), key=lambda x: -x[1])
        row = {
            "open_chip_s": cold["child"]["backend_init_s"],
            "build_s": cold["build_s"],
            "cold_s": cold["first_s"],
            "cached_s": cached["first_s"] if cached else None,
            "warm_s": [min(warm), max(warm)] if warm else None,
            "p11_anchor_vs_sampler": cold["p11_anchor_vs_sampler"],
            "p11_live_vs_anchor_first": cold["p11_live_vs_anchor_first"],
            "first_step_kl": cold["first_step_kl"],
            "precisions": cold["precisions"],
            "compiled_s": compiled[:8],  # the slowest programs it compiled, [name, seconds]
        }
        if size in floor:
            row["floor_scan_s"] = floor[size]["scan_s"]
            row["cold_over_floor"] = cold["first_s"] / floor[size]["scan_s"]
        out[size] = row
    for size, learned in results.get("learn", {}).items():
        if learned:
            out.setdefault(size, {})["learn_cold_wall_s"] = learned["wall_s"]
            out[size]["learn_p11_anchor_vs_sampler"] = learned["p11_anchor_vs_sampler"]
    large = out.get("large", {})
    checks = {
        "cold_over_floor <= 1.2": {s: r["cold_over_floor"] <= 1.2 for s, r in out.items() if "cold_over_floor" in r},
        "large cached <= 3.0 s": _at_most(large.get("cached_s"), 3.0),
        "large warm <= 0.15 s": _at_most((large.get("warm_s") or [None, None])[1], 0.15),
        "P11 <= 1e-4": {s: _at_most(_worst_gap(r), 1e-4) for s, r in out.items()},
        "large learn cold < 25 s": _at_most(large.get("learn_cold_wall_s"), 25.0),
    }
    return {"sizes": out, "targets": checks}


def _worst_gap(row: dict[str, Any]) -> float | None:
    """The larger of P11's anchor-vs-sampler gaps a size's first step and its ``learn`` run showed."""
    gaps = [row[k] for k in ("p11_anchor_vs_sampler", "learn_p11_anchor_vs_sampler") if row.get(k) is not None]
    return max(gaps) if gaps else None


def _at_most(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--lora", action="store_true")
    p.add_argument("--no-build-ahead", action="store_true", help="the learner's first step builds nothing ahead")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--timeout", type=float, default=400)
    p.add_argument("--json", default="", help="save every child's figures here")
    p.add_argument("--learn", default="", help="sizes to run `learn --model-size SIZE --steps 3` for, cold")
    p.add_argument("--floor", default="", help="a plain-JAX floor script to run first (its sizes: small, large)")
    common.add_row_options(p)
    args = p.parse_args()
    results: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    sizes = args.sizes.split(",")
    floor_sizes = [s for s in sizes if s in ("small", "large")]
    if args.floor and floor_sizes:
        results["floor"] = floor_seconds(args.floor, floor_sizes, args)
    for size in sizes:
        cache = Path(tempfile.mkdtemp(prefix="rlcluster-first-step-"))
        try:
            for which in ("cold", "cached"):
                out = run(size, args, cache, which)
                results[f"{size} {which}"] = out
                if out is None:
                    break
                show(size, which, out)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        if results.get(f"{size} cold"):
            rows += page_rows(size, args, results[f"{size} cold"], results.get(f"{size} cached"))
    results["learn"] = {size: learn_cold(size, args) for size in args.learn.split(",") if size}
    # The machine, as a first-step child saw it (this process never opens the chip: a child could not).
    seen = next((results[f"{s} cold"] for s in sizes if results.get(f"{s} cold")), None)
    for size, learned in results["learn"].items():
        if learned and seen:
            rows += learn_rows(size, learned, common.machine(seen["platform"], seen.get("kind")))
    print()
    common.emit_rows(rows, args.save_row)
    print(SUMMARY_MARKER + json.dumps(summary(results, sizes)), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    children = [results.get(f"{s} {w}") for s in sizes for w in ("cold", "cached")] + list(results["learn"].values())
    return 0 if all(children) and results.get("floor", {}) is not None else 1


if __name__ == "__main__":
    sys.exit(main())
