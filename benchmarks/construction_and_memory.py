"""Construction time per layout and model size, and memory held (unique) against every role its own copy (naive).

    python benchmarks/construction_and_memory.py [--sizes tiny,small,base,large] [--layouts ...]

Construction is timed from the models already built to a cluster ready to
sample (``RLCluster(...)``: sharing map, loads, engine, optimizer, anchor);
building the models themselves is not counted. Memory is the measured walk
of live buffers (L2), in physical bytes (every device shard counted).
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings

import common


def main() -> None:
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    common.setup(args)
    import gc

    import jax

    from rlcluster_lab import RLCluster, memory_report
    from rlcluster_lab.app.scenario import Scenario, build_models
    from rlcluster_lab.core.config import ClusterConfig, TrainingConfig
    from rlcluster_lab.core.meshes import layout_meshes
    from rlcluster_lab.placement.programs import clear_programs

    rows = []
    labels = []
    ratios = []
    for size, layout, lora in common.cases(args):
        scenario = Scenario(layout=layout, lora=lora, model_size=size)
        r2m = layout_meshes(layout)
        config = ClusterConfig(
            role_to_mesh=r2m, rollout_config=scenario.rollout_config(), training_config=TrainingConfig()
        )
        times = []
        cluster = None
        for _ in range(max(3, args.repeats // 2)):
            models = build_models(scenario, r2m)
            del cluster
            gc.collect()
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cluster = RLCluster(cluster_config=config, **models)
            jax.block_until_ready(jax.tree.leaves(cluster.anchor_policy_state))
            times.append(time.perf_counter() - start)
            del models
        mem = memory_report(cluster)
        ratio = mem.unique_bytes / mem.naive_bytes
        ratios.append(ratio)
        labels.append(f"{size}/{layout}{'/lora' if lora else ''}")
        rows.append(
            [
                size,
                layout,
                "lora" if lora else "full",
                statistics.median(times[1:]) * 1e3,
                mem.unique_bytes,
                mem.naive_bytes,
                ratio,
            ]
        )
        # Compiled programs hold memory mappings: start every case without the last one's.
        clear_programs()
        jax.clear_caches()
        print(f"  done {labels[-1]}", file=sys.stderr, flush=True)
        del cluster
        gc.collect()
    print(f"platform {jax.default_backend()}, {jax.device_count()} devices; construction: median after one warm-up")
    print(common.table(["size", "layout", "params", "construct ms", "unique B", "naive B", "unique / naive"], rows))
    common.save_bar_plot(
        f"{args.out}/memory_unique_vs_naive.png",
        labels,
        {"unique / naive": ratios},
        "ratio (physical bytes)",
        "memory held vs every role its own copy",
        hline=1.0,
    )
    common.save_bar_plot(
        f"{args.out}/construction_ms.png",
        labels,
        {"construction": [r[3] for r in rows]},
        "milliseconds",
        "RLCluster construction time",
    )


if __name__ == "__main__":
    main()
