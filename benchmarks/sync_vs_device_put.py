"""Weight-sync handover time against a bare ``jax.device_put`` of the same tree to the same shardings.

    python benchmarks/sync_vs_device_put.py [--sizes tiny,small,base,large] [--layouts ...]

For each layout, LoRA on/off and model size, times the handover part of
``cluster.sync_weights()`` (``SyncReport.seconds``: the engine's reshard and
update, until ready) and ``jax.device_put(params, destination shardings)``
of the same filtered tree, without the transfer guard (on CPU, device_put
gathers through host memory when the layout changes, which the sync may not
do). Prints the median of each and their ratio, the median ratio overall,
and saves a plot. Also times a colocated shared sync against an empty call:
the bookkeeping overhead, in microseconds.
"""

from __future__ import annotations

import statistics
import sys

import common


def main() -> None:
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    common.setup(args)
    import jax
    from flax import nnx

    from rlcluster_lab.app.scenario import Scenario, build_cluster
    from rlcluster_lab.placement.programs import clear_programs

    rows = []
    labels = []
    ratios = []
    for size, layout, lora in common.cases(args):
        cluster = build_cluster(Scenario(layout=layout, lora=lora, model_size=size))
        kind = nnx.LoRAParam if lora else nnx.Param
        dst = jax.tree.map(lambda x: x.sharding, nnx.state(cluster.rollout.model(), kind))

        # The sync reads the actor's state before its clock starts; so does the floor.
        params = nnx.state(cluster.actor_model, kind)

        def floor(params=params, dst=dst) -> None:
            jax.block_until_ready(jax.device_put(params, dst))

        def handover(cluster=cluster) -> float:
            return cluster.sync_weights().seconds

        for _ in range(2):
            handover()
        sync_s = statistics.median(handover() for _ in range(args.repeats))
        put_s = common.median_seconds(floor, args.repeats)
        rep = cluster.sync_weights()
        ratio = sync_s / put_s
        ratios.append(ratio)
        labels.append(f"{size}/{layout}{'/lora' if lora else ''}")
        rows.append(
            [
                size,
                layout,
                "lora" if lora else "full",
                rep.synced_bytes,
                rep.moved_cross_device_bytes,
                sync_s * 1e3,
                put_s * 1e3,
                ratio,
            ]
        )
        del cluster
        # Compiled programs hold memory mappings: start every case without the last one's.
        clear_programs()
        jax.clear_caches()
        print(f"  done {labels[-1]}", file=sys.stderr, flush=True)
    print(f"platform {jax.default_backend()}, {jax.device_count()} devices; median of {args.repeats} runs")
    print(
        common.table(
            ["size", "layout", "params", "synced B", "cross-device B", "sync ms", "device_put ms", "ratio"], rows
        )
    )
    print(f"median ratio sync / device_put: {statistics.median(ratios):.2f} (goal <= 1.1)")
    common.save_bar_plot(
        f"{args.out}/sync_vs_device_put.png",
        labels,
        {"sync / device_put": ratios},
        "time ratio",
        "weight sync vs bare jax.device_put (1.0 = the floor)",
        hline=1.0,
    )

    # Colocated and shared: nothing moves, so what is left is the bookkeeping.
    cluster = build_cluster(Scenario(layout="colocated"))

    def empty() -> None:
        pass

    sync_total = common.median_seconds(cluster.sync_weights, args.repeats * 3)
    handover = statistics.median(cluster.sync_weights().seconds for _ in range(args.repeats * 3))
    empty_s = common.median_seconds(empty, args.repeats * 3)
    rep = cluster.sync_weights()
    print()
    print(f"colocated shared sync (tiny): nothing moves (reused {rep.reused_bytes:,} of {rep.synced_bytes:,} bytes)")
    print(
        common.table(
            ["what", "microseconds"],
            [
                ["empty call", empty_s * 1e6],
                ["handover (reshard + update + ready)", handover * 1e6],
                ["whole sync_weights (with accounting and anchor re-pin)", sync_total * 1e6],
                ["anchor re-pin alone", rep.anchor_seconds * 1e6],
            ],
        )
    )


if __name__ == "__main__":
    main()
