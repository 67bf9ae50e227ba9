"""The accelerator check: what the lab does on a real GPU or TPU chip, in one table.

Run on a machine with an accelerator (one GPU, or a single TPU chip)::

    python benchmarks/accelerator_check.py            # about 2-4 minutes on one GPU

It exercises every accelerator-only path and prints what it measured:

- the notebooks' set-up (``rl.setup()``): what it found, where layouts are built;
- on the chip itself, the layouts one chip allows: colocated; a second mesh
  over the same chip (other axis names: P1 sees another mesh, so a second
  copy); offload to pinned host; LoRA; the trainable anchor. For each: the
  sync's bytes (read from the compiled program), its seconds, the memory
  walk, and the allocator's own figures;
- P11 on the chip: |anchor - sampler| log-prob gap with the programs P11
  compares (``core.precision``) at the platform's default matmul precision and
  at ``highest``;
- a smoke run of notebook 00 (the first cell and a cluster) through nbclient.

On a machine without an accelerator it runs the same checks on CPU and says
so in the table's header (a dry run of the script, not a result).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import common

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-notebook", action="store_true", help="skip the notebook smoke run")
    parser.add_argument("--json", default="benchmarks/results/accelerator_check.json", help="where to save the rows")
    common.add_row_options(parser)
    args = parser.parse_args()

    import jax

    jax.config.update("jax_num_cpu_devices", 8)  # the simulated devices beside a single chip

    import rlcluster_lab as rl
    from rlcluster_lab.core.compile_cache import count_compilations
    from rlcluster_lab.core.meshes import make_mesh

    lab = rl.setup(quiet=True)
    chip = list(lab.accelerator_devices) or list(jax.devices())
    on_chip = bool(lab.accelerator_devices)
    where = f"{len(chip)} {chip[0].platform} device(s) ({getattr(chip[0], 'device_kind', '?')})"
    header = [
        f"accelerator check, {datetime.date.today().isoformat()}: "
        + (f"on {where}" if on_chip else f"NO ACCELERATOR: a dry run on {where}"),
        "set-up: " + lab.summary().replace("\n", "; "),
    ]
    one = chip[:1]
    meshes = {
        "colocated": make_mesh(one, (1, 1)),
        # The same chip under other axis names: another Mesh, so P1 links nothing (a second copy).
        "second mesh": make_mesh(one, (1, 1), ("data", "model")),
    }
    rules = (("embed", "data"), ("vocab", "model"), ("q_heads", "model"), ("kv_heads", "model"), ("mlp", "model"))
    cases = [
        ("colocated", {}, "colocated"),
        ("second mesh (same chip)", {}, "second mesh"),
        ("colocated, offload", {"offload": True}, "colocated"),
        ("colocated, LoRA", {"lora": True}, "colocated"),
        ("colocated, LoRA, trainable anchor", {"lora": True, "anchor": "trainable"}, "colocated"),
    ]
    rows = []
    for name, knobs, layout in cases:
        scenario = rl.Scenario(**knobs)
        actor_mesh = meshes["colocated"]
        r2m = {role: actor_mesh for role in rl.Role}
        training = None
        if layout == "second mesh":
            r2m[rl.Role.ROLLOUT] = meshes["second mesh"]
            training = rl.TrainingConfig(role_to_logical_axis_rule={rl.Role.ROLLOUT: rules})
        start = time.perf_counter()
        try:
            with count_compilations() as built:
                cluster = rl.build_cluster(scenario, role_to_mesh=r2m, training_config=training)
                build = time.perf_counter() - start
                first = cluster.sync_weights()
            steady = cluster.sync_weights()
            report = rl.placement_report(cluster, sync=steady).to_json()
        except Exception as exc:  # noqa: BLE001 - a failing case is a row, not the end of the check
            rows.append({"case": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        alloc = report["memory"]["allocator"]
        in_use = sum(v.get("bytes_in_use", 0) for v in alloc.get("by_device", {}).values())
        rows.append(
            {
                "case": name,
                "platform": report["platform"],
                "branch": report["rollout_branch"],
                "build_s": round(build, 3),
                "programs built": len(built),
                "first_sync_s": round(first.seconds, 4),
                "steady_sync_ms": round(steady.seconds * 1e3, 2),
                "synced": steady.synced_bytes,
                "moved": steady.moved_cross_device_bytes,
                "minimum": steady.minimum_cross_device_bytes,
                "reused": steady.reused_bytes,
                "method": steady.method[:40],
                "held (walk)": report["memory"]["unique_bytes"],
                "allocator in use": in_use if alloc.get("available") else "none",
            }
        )
        del cluster

    p11 = []
    for precision in (None, "highest"):
        learner_cluster = _cluster_at(rl, meshes["colocated"], precision)
        result = rl.GRPOLearner(learner_cluster, rl.LearnerConfig(steps=2, prompts_per_step=2, group_size=4)).run()
        gap = max(p.anchor_vs_sampler for p in result.p11)
        p11.append(
            {
                "precision": precision or "platform default",
                "max |anchor - sampler|": float(gap),
                "within 1e-4": bool(gap < 1e-4),
            }
        )

    smoke = "skipped"
    if not args.no_notebook:
        smoke = _notebook_smoke()

    print("\n".join(header))
    _print_table(rows)
    print()
    _print_table(p11)
    print(f"\nnotebook 00 smoke run: {smoke}")
    out = REPO / args.json
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"header": header, "rows": rows, "p11": p11, "notebook": smoke}, indent=2, default=str))
    print(f"saved {out}")
    where = common.machine(chip[0].platform, getattr(chip[0], "device_kind", None), len(chip))
    common.emit_rows(page_rows(rows, where) if on_chip else [], args.save_row)
    return 0 if all("error" not in r for r in rows) else 1


def page_rows(rows: list[dict], where: str) -> list[dict]:
    """docs/performance.md's rows (``common.page_row``): per case, the walk's bytes beside the
    allocator's bytes in use (on an accelerator: a CPU has no allocator figures)."""
    out = []
    for r in rows:
        walk, alloc = r.get("held (walk)"), r.get("allocator in use")
        if isinstance(walk, int) and isinstance(alloc, int) and alloc:
            out.append(
                common.page_row(
                    f"memory.{r['case']}",
                    "memory",
                    f"{r['case']}: bytes held (walk) / the allocator's bytes in use",
                    where,
                    common.run_value(walk / alloc, f"{walk:,} B / {alloc:,} B"),
                )
            )
    return out


def _cluster_at(rl, mesh, precision):
    """A colocated cluster on ``mesh`` whose programs P11 compares run at ``precision`` (None: the
    platform's default; ``core.precision``)."""
    import dataclasses

    from rlcluster_lab.app.scenario import build_models, cluster_config

    scenario = rl.Scenario(max_tokens=8)
    r2m = {role: mesh for role in rl.Role}
    config = dataclasses.replace(
        cluster_config(scenario, r2m, rl.TrainingConfig(mini_batch_size=4)), matmul_precision=precision
    )
    return rl.RLCluster(cluster_config=config, **build_models(scenario, r2m))


def _notebook_smoke() -> str:
    code = (
        "import nbformat, nbclient; nb = nbformat.read('notebooks/00_start_here.ipynb', as_version=4); "
        "nb.cells = [c for c in nb.cells if c.cell_type == 'code'][:4]; "
        "nbclient.NotebookClient(nb, timeout=600).execute(); print('ok')"
    )
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=900)
    took = time.perf_counter() - start
    return f"ok in {took:.0f} s" if run.returncode == 0 else f"FAILED: {run.stderr.strip()[-300:]}"


def _print_table(rows: list[dict]) -> None:
    if not rows:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cells = [keys] + [[str(r.get(k, "")) for k in keys] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(keys))]
    for i, row in enumerate(cells):
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    raise SystemExit(main())
