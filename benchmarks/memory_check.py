"""The device's memory limit: a learner step the device cannot hold is refused before anything is
compiled, and each batch program's planned bytes beside XLA's own memory analysis.

    python benchmarks/memory_check.py                    # one TPU v5e chip: a few minutes
    python benchmarks/memory_check.py --sizes tiny,small --rows 4,16,32   # a CPU dry run

Prints one JSON object per line:

1. ``refusal``: the large preset's colocated cluster on one device, and a learner asked for 64
   prompts x 16 completions in one optimizer step (``TrainingConfig()``: the whole batch). The
   seconds from this process's start to the lab's refusal (and of the step call alone), its
   words, and whether the sampler, the log-prob program or the optimizer step compiled.
   ``trains_after``: a 4 x 4 step on the same cluster. A device without allocator figures (CPU)
   gets a simulated memory, ``--device-memory`` (default 15.75 GiB, a v5e chip's).
2. ``program``: for each size, row count and program, the planner's bytes on the device and
   XLA's (``compiled.memory_analysis()``: arguments + outputs + temporaries - aliased), from
   ``measure.program_memory`` (lowered over abstract arrays and compiled; nothing runs). A
   program XLA refuses for memory gives its message instead of its figure.
"""

from __future__ import annotations

import argparse
import json
import os
import time

START = time.perf_counter()

V5E_HBM = "15.75GiB"  # what XLA:TPU reports available on one v5e chip


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


def refusal(args: argparse.Namespace) -> None:
    import jax

    from rlcluster_lab import GRPOLearner, LearnerConfig, Scenario, build_cluster
    from rlcluster_lab.core.compile_cache import count_compilations
    from rlcluster_lab.core.limits import DEVICE_LIMIT_ENV, device_free_bytes

    device = jax.devices()[0]
    simulated = device_free_bytes(device) is None
    if simulated:
        os.environ[DEVICE_LIMIT_ENV] = args.device_memory
    cluster = build_cluster(Scenario(model_size=args.size), devices=[device])
    built = time.perf_counter() - START
    learner = GRPOLearner(cluster, LearnerConfig(steps=1, prompts_per_step=args.prompts, group_size=args.group))
    start = time.perf_counter()
    refused, message = False, None
    with count_compilations() as compiled:
        try:
            learner.step()
        except MemoryError as exc:  # the lab's TooLargeError
            refused, message = True, str(exc)
    emit(
        {
            "check": "refusal",
            "device": f"{device.platform} {getattr(device, 'device_kind', '')}".strip(),
            "device_memory": f"simulated {args.device_memory}" if simulated else "memory_stats()",
            "size": args.size,
            "batch": f"{args.prompts} x {args.group}",
            "refused": refused,
            "seconds_from_start": round(time.perf_counter() - START, 2),
            "build_seconds_from_start": round(built, 2),
            "step_seconds": round(time.perf_counter() - start, 3),
            "compiled": sorted({name for name, _, _ in compiled}),
            "message": message,
        }
    )
    start = time.perf_counter()
    record = GRPOLearner(cluster, LearnerConfig(steps=1, prompts_per_step=4, group_size=4)).step()
    emit(
        {
            "check": "trains_after",
            "loss": record.loss,
            "mean_reward": record.mean_reward,
            "global_steps": cluster.global_steps,
            "seconds": round(time.perf_counter() - start, 2),
        }
    )
    if simulated:
        del os.environ[DEVICE_LIMIT_ENV]


def programs(args: argparse.Namespace) -> None:
    import jax

    from rlcluster_lab.measure.program_memory import PROGRAMS, compare
    from rlcluster_lab.model import MODEL_SIZES

    device = jax.devices()[0]
    for size in args.sizes.split(","):
        for rows in (int(r) for r in args.rows.split(",")):
            for program in PROGRAMS:
                row = {"check": "program", "platform": device.platform, "size": size, "rows": rows}
                row |= {"prompt": args.prompt, "completion": args.completion, "lora_rank": args.lora_rank}
                try:
                    compared = compare(
                        program,
                        MODEL_SIZES[size],
                        rows,
                        args.prompt,
                        args.completion,
                        slots=args.slots,
                        lora_rank=args.lora_rank,
                        device=device,
                    )
                except Exception as exc:  # noqa: BLE001 - XLA refusing a program is a row of its own
                    if "RESOURCE_EXHAUSTED" not in str(exc):
                        raise
                    emit(row | {"program": program, "xla_refused": " ".join(str(exc).split())[:300]})
                    continue
                emit(row | compared.to_json())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="large", help="the refusal's model size")
    p.add_argument("--prompts", type=int, default=64, help="the refusal's prompts per step")
    p.add_argument("--group", type=int, default=16, help="the refusal's completions per prompt")
    p.add_argument("--device-memory", default=V5E_HBM, help="a simulated device memory where the device has none")
    p.add_argument("--sizes", default="small,large", help="the comparison's model sizes")
    p.add_argument("--rows", default="8,64,256", help="the comparison's row counts")
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens per row (the lab's bucket)")
    p.add_argument("--completion", type=int, default=16, help="completion tokens per row")
    p.add_argument("--slots", type=int, default=128, help="the sampler's KV cache slots")
    p.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters of this rank (0: none)")
    p.add_argument("--skip", default="", help="comma-separated parts to leave out: refusal, programs")
    args = p.parse_args()
    skip = set(args.skip.split(","))
    if "refusal" not in skip:
        refusal(args)
    if "programs" not in skip:
        programs(args)


if __name__ == "__main__":
    main()
