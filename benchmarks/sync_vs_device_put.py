"""Weight-sync handover time against the fastest reshard of the same tree, and its peak against the chunk size.

    python benchmarks/sync_vs_device_put.py [--sizes tiny,small,base,large] [--layouts ...]
        [--chunks 0,1048576,262144]

1. For each layout, LoRA on/off and model size, times the handover part of
   ``cluster.sync_weights(peak=False)`` (``SyncReport.seconds``: the engine's reshard
   and update, until ready; the sync the learner makes) and, beside it, of the sync
   whose transient peak is walked (``peak=True``, as the lab asks), against the faster of ``jax.device_put(params,
   destination shardings)`` and a jitted copy with the destination shardings
   (the same floor as ``benchmarks/interactive.py``'s sync section), both without
   the transfer guard (on CPU, device_put gathers through host memory when the
   layout changes, which the sync may not do; a jitted copy cannot run
   across the split layout's disjoint devices). Prints the medians, their ratio,
   the median ratio overall, and saves a plot.
2. With ``--chunks``, for the reshaped full-parameter sync of each size: the
   transient peak (busiest device, device memory, measured) and the handover's
   median time per chunk size (0: one piece), beside the planner's peak.

The machine may be shared: run it more than once and compare medians (the
figures carry ``uptime``'s load at start and end).
"""

from __future__ import annotations

import os
import statistics
import sys

import common


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def page_rows(labels: list[str], ratios: list[float], put_ratios: list[float], where: str) -> list[dict]:
    """docs/performance.md's rows (``common.page_row``): the median and the worst case over the
    fastest reshard, and the worst case over one ``device_put`` as new buffers."""
    worst = max(range(len(ratios)), key=lambda i: ratios[i])
    worst_put = max(range(len(put_ratios)), key=lambda i: put_ratios[i])
    median = statistics.median(ratios)
    return [
        common.page_row(
            "sync.median",
            "sync",
            "steady sync / the fastest reshard, median over the cases",
            where,
            common.run_value(median, f"{median:.2f} ({len(ratios)} cases)"),
            common.at_most(1.0, "<= 1.0"),
        ),
        common.page_row(
            "sync.worst",
            "sync",
            "steady sync / the fastest reshard, worst case",
            where,
            common.run_value(ratios[worst], f"{ratios[worst]:.2f} ({labels[worst]})"),
            common.at_most(1.5, "<= 1.5"),
        ),
        common.page_row(
            "sync.worst_device_put",
            "sync",
            "steady sync / one `device_put` as new buffers, worst case",
            where,
            common.run_value(put_ratios[worst_put], f"{put_ratios[worst_put]:.2f} ({labels[worst_put]})"),
            common.at_most(1.0, "<= 1.0"),
        ),
    ]


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--chunks", default="", help="comma-separated sync_chunk_bytes to sweep (0: one piece)")
    p.add_argument("--engine", default="vanilla", help="the rollout engine (vllm keeps weights of its own: on one chip")
    p.add_argument("--dtypes", default="float32", help="comma-separated rollout dtypes (e.g. float32,bfloat16)")
    args = p.parse_args()
    common.setup(args)
    import jax

    import rlcluster_lab as rl
    from rlcluster_lab.app.scenario import Scenario, build_cluster
    from rlcluster_lab.measure.sync import sync_floor
    from rlcluster_lab.placement.programs import clear_programs
    from rlcluster_lab.planner.plan import plan_scenario

    print(f"load average at start: {_load()}")
    # On a single chip the lab builds colocated and reshaped on it (the rollout's mesh a second Mesh
    # over the same chip); elsewhere on the simulated devices.
    lab = rl.setup(quiet=True)
    rows, labels, ratios, put_ratios = [], [], [], []
    for (size, layout, lora), dtype in ((c, d) for c in common.cases(args) for d in args.dtypes.split(",")):
        scenario = Scenario(
            layout=layout,
            lora=lora,
            model_size=size,
            engine=args.engine,
            rollout_dtype=None if dtype == "float32" else dtype,
        )
        cluster = build_cluster(scenario, devices=lab.devices_for(layout))
        for _ in range(2):
            cluster.sync_weights()
        # The sync as the learner makes it (no peak walk); and with its transient peak walked, as the
        # lab and `report --sync` ask (the walk's own time is left out of either figure, its events not).
        sync_s = statistics.median(cluster.sync_weights(peak=False).seconds for _ in range(args.repeats))
        walked_s = statistics.median(cluster.sync_weights().seconds for _ in range(args.repeats))
        rep = cluster.sync_weights()
        # The sync reads the actor's state before its clock starts; so do the floors (measure.sync.sync_floor).
        floors = sync_floor(cluster, rep, args.repeats)
        fastest = min((k for k, v in floors.items() if v is not None), key=lambda k: floors[k])
        ratio = sync_s / floors[fastest]
        ratios.append(ratio)
        put_ratios.append(sync_s / floors["device_put"])
        labels.append(f"{size}/{layout}{'/lora' if lora else ''}{'' if dtype == 'float32' else '/' + dtype}")
        jit_ms = "n/a" if floors["compiled copy"] is None else floors["compiled copy"] * 1e3
        rows.append(
            [size, layout, ("lora" if lora else "full") + ("" if dtype == "float32" else f" {dtype}")]
            + [rep.synced_bytes, rep.moved_cross_device_bytes]
            + [sync_s * 1e3, walked_s * 1e3, floors["device_put"] * 1e3, jit_ms, fastest, ratio]
        )
        del cluster
        # Compiled programs hold memory mappings: start every case without the last one's.
        clear_programs()
        jax.clear_caches()
        print(f"  done {labels[-1]}", file=sys.stderr, flush=True)
    where = rl.core.devices.devices_words(lab.devices_for("colocated"))
    print(f"{where}, engine {args.engine}; median of {args.repeats} runs")
    head = [
        "size",
        "layout",
        "params",
        "synced B",
        "cross-device B",
        "sync ms",
        "with peak ms",
        "device_put ms",
        "jit ms",
    ]
    print(common.table(head + ["fastest", "sync / fastest"], rows))
    print(f"median ratio sync / fastest reshard: {statistics.median(ratios):.2f} (target <= 1.0)")
    first = lab.devices_for("colocated")[0]
    print()
    common.emit_rows(
        page_rows(labels, ratios, put_ratios, common.machine(first.platform, first.device_kind)), args.save_row
    )
    common.save_bar_plot(
        f"{args.out}/sync_vs_device_put.png",
        labels,
        {"sync / fastest reshard": ratios},
        "time ratio",
        "weight sync vs the fastest reshard of the same tree (1.0 = the floor)",
        hline=1.0,
    )

    if args.chunks:
        sweep = []
        for size in args.sizes.split(","):
            for chunk in (int(c) or None for c in args.chunks.split(",")):
                scenario = Scenario(layout="reshaped", model_size=size, sync_chunk_bytes=chunk)
                planned = plan_scenario(scenario, sync_programs=True).sync["transient_peak"]
                cluster = build_cluster(scenario)
                for _ in range(2):
                    cluster.sync_weights()
                reports = [cluster.sync_weights() for _ in range(args.repeats)]
                peak = reports[-1].peak
                sweep.append(
                    [size, "one piece" if chunk is None else chunk, peak.chunks, peak.largest_chunk_bytes]
                    + [peak.max_bytes.get("device", 0), planned["max_bytes"].get("device", 0)]
                    + [statistics.median(r.seconds for r in reports) * 1e3]
                )
                del cluster, reports
                clear_programs()
                jax.clear_caches()
                print(f"  done {size}/{chunk}", file=sys.stderr, flush=True)
        print("\nreshaped full-parameter sync: chunk size against the transient peak (busiest device, device memory)")
        head = ["size", "chunk B", "chunks", "largest chunk B", "peak B (measured)", "peak B (planned)", "sync ms"]
        print(common.table(head, sweep))
    print(f"load average at end: {_load()}")


if __name__ == "__main__":
    main()
