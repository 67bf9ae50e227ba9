"""The scenario flags every subcommand shares, derived from the one vocabulary (``core.options``).

``report``, ``learn`` and ``plan`` spell each knob the same way; ``plan``
adds what only a paper cluster has (a topology, a published architecture,
link figures). Nothing here imports JAX.
"""

from __future__ import annotations

import argparse
from typing import Any

from rlcluster_lab.core.options import ANCHOR_MODES, DTYPES, ENGINES, LAYOUTS, MODEL_SIZES, RESHARD_STRATEGIES


def add_scenario_flags(p: argparse.ArgumentParser, *, planner: bool = False) -> None:
    """The knobs of a ``Scenario`` as flags (``planner``: ``--model`` also takes published
    architectures, which only the planner can hold)."""
    p.add_argument("--layout", default="colocated", choices=LAYOUTS, help="standard device layout (default: colocated)")
    p.add_argument("--lora", action="store_true", help="LoRA actor over the reference's own frozen buffers")
    p.add_argument("--lora-rank", type=int, default=4, help="LoRA rank with --lora (default 4)")
    p.add_argument(
        "--lora-separate-base",
        action="store_true",
        help="build the LoRA actor over a copy of the base (P4 warns: avoidable copy)",
    )
    p.add_argument(
        "--engine",
        default="vanilla",
        choices=ENGINES,
        help="rollout engine; vllm and sglang_jax are placement stand-ins written in JAX",
    )
    p.add_argument(
        "--offload", action="store_true", help="offload_to_cpu: roles live in pinned host memory between uses"
    )
    p.add_argument("--rollout-dtype", choices=DTYPES, default=None, help="dtype of the vanilla engine's second copy")
    sizes = ", ".join(MODEL_SIZES)
    p.add_argument(
        "--model-size",
        "--model",
        dest="model_size",
        default="tiny",
        choices=None if planner else MODEL_SIZES,
        help=f"the lab's model size ({sizes})"
        + (" or a published architecture (gemma-2b, llama3-8b, llama3-70b)" if planner else ""),
    )
    p.add_argument(
        "--anchor",
        choices=ANCHOR_MODES,
        default="full",
        help="anchor snapshot: the actor's full state (reference) or only the LoRA adapters",
    )
    p.add_argument(
        "--reshard",
        choices=RESHARD_STRATEGIES,
        default="xla",
        help="how layouts change: xla (one compiled program, bytes read from its collectives) "
        "or minimal (exactly what each device lacks)",
    )
    p.add_argument(
        "--sync-chunk-bytes",
        type=int,
        default=None,
        metavar="N",
        help="hand a weight sync over in chunks of at most N bytes of leaves, each committed and its old "
        "arrays dropped before the next (bounds the sync's peak; default: one piece)",
    )
    p.add_argument("--reward", action="store_true", help="add a reward model")
    p.add_argument("--critic", action="store_true", help="add a critic")
    p.add_argument(
        "--no-static-lora",
        action="store_true",
        help="do not give the sglang_jax engine static-LoRA settings (P6 then refuses a LoRA actor)",
    )
    p.add_argument("--devices", type=int, default=8, help="simulated CPU device count (ignored on GPUs and TPUs)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def scenario_from(args: argparse.Namespace, **extra: Any) -> Any:
    """The ``Scenario`` the flags describe (checked when it is made); ``extra`` sets or
    overrides knobs (``plan`` replaces a published model's name with a lab size)."""
    from rlcluster_lab.core.options import Scenario

    knobs: dict[str, Any] = dict(
        layout=args.layout,
        lora=args.lora,
        lora_rank=args.lora_rank,
        lora_separate_base=args.lora_separate_base,
        engine=args.engine,
        offload=args.offload,
        rollout_dtype=args.rollout_dtype,
        model_size=args.model_size,
        with_reward=args.reward,
        with_critic=args.critic,
        sglang_static_lora=not args.no_static_lora,
        anchor=args.anchor,
        reshard=args.reshard,
        sync_chunk_bytes=args.sync_chunk_bytes,
    )
    knobs.update(extra)
    return Scenario(**knobs)
