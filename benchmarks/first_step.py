"""The first GRPO learner step of a preset, cold and with the compilation cache filled, and the
warm step after it, phase by phase: the first-step rows of docs/performance.md on a chip.

    python benchmarks/first_step.py [--sizes small,large] [--lora] [--repeats 5] [--no-build-ahead]

For each size, two fresh processes share one new compilation-cache folder:

1. cold (the folder empty): set up the devices, build the colocated cluster on the
   chip (``rl.setup().devices_for("colocated")``; on a machine without one, on the
   simulated CPU devices), take one ``GRPOLearner.step`` (4 prompts x 4, 16 sampled
   tokens), every program it compiled listed with its seconds; the cache writes
   flushed apart; then ``--repeats`` warm steps, each timed by phase (generate,
   log-probs, update, sync and the sync's anchor re-pin).
2. cached (the folder the cold one filled): the same build and first step.

On a chip the cold first step is best read beside the same programs written in plain JAX (a
scanned layer stack, the same precision) compiled on the same machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
from interactive import CACHE_ENV, PRELUDE

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import collections
import rlcluster_lab as rl
from rlcluster_lab import GRPOLearner, LearnerConfig, Scenario, build_cluster
from rlcluster_lab.core.compile_cache import count_compilations, flush_cache_writes

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
emit({"devices": str(devices[0]), "platform": devices[0].platform, "kind": devices[0].device_kind,
      "build_s": build_s, "first_s": first_s, "written_after_s": written_after_s,
      "programs": [[name, seconds, bool(cached)] for name, seconds, cached in built], "warm": warm})
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
                common.at_most(0.30, "<= 0.30 s") if large else None,
            )
        )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--lora", action="store_true")
    p.add_argument("--no-build-ahead", action="store_true", help="the learner's first step builds nothing ahead")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--timeout", type=float, default=400)
    p.add_argument("--json", default="", help="save every child's figures here")
    common.add_row_options(p)
    args = p.parse_args()
    results: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for size in args.sizes.split(","):
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
    print()
    common.emit_rows(rows, args.save_row)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
