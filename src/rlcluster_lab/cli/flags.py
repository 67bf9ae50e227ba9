"""The scenario flags every subcommand shares, derived from the one vocabulary (``core.options``).
Nothing here imports JAX."""

from __future__ import annotations

import argparse
from typing import Any

from rlcluster_lab.core.options import ANCHOR_MODES, DTYPES, ENGINES, LAYOUTS, MODEL_SIZES, RESHARD_STRATEGIES


def add_scenario_flags(p: argparse.ArgumentParser, *, planner: bool = False) -> None:
    """The knobs of a ``Scenario`` as flags (``planner``: ``--model`` also takes published
    architectures, which only the planner can hold)."""
    for flag, choices, default, text in (
        ("--layout", LAYOUTS, "colocated", "standard device layout (default: colocated)"),
        ("--engine", ENGINES, "vanilla", "rollout engine; vllm and sglang_jax are placement stand-ins written in JAX"),
        ("--rollout-dtype", DTYPES, None, "dtype of the vanilla engine's second copy"),
        (
            "--anchor",
            ANCHOR_MODES,
            "full",
            "anchor snapshot: the actor's full state (reference) or only the LoRA adapters",
        ),
        (
            "--reshard",
            RESHARD_STRATEGIES,
            "xla",
            "how layouts change: xla (one compiled program, bytes read from its collectives) "
            "or minimal (exactly what each device lacks)",
        ),
    ):
        p.add_argument(flag, choices=choices, default=default, help=text)
    for flag, text in (
        ("--lora", "LoRA actor over the reference's own frozen buffers"),
        ("--lora-separate-base", "build the LoRA actor over a copy of the base (P4 warns: avoidable copy)"),
        ("--offload", "offload_to_cpu: roles live in pinned host memory between uses"),
        ("--reward", "add a reward model"),
        ("--critic", "add a critic"),
        ("--no-static-lora", "do not give the sglang_jax engine static-LoRA settings (P6 then refuses a LoRA actor)"),
        ("--json", "print one JSON object"),
    ):
        p.add_argument(flag, action="store_true", help=text)
    p.add_argument("--lora-rank", type=int, default=4, help="LoRA rank with --lora (default 4)")
    p.add_argument(
        "--sync-chunk-bytes",
        type=int,
        default=None,
        metavar="N",
        help="hand a weight sync over in chunks of at most N bytes of leaves, each committed and its old "
        "arrays dropped before the next (bounds the sync's peak; default: one piece)",
    )
    p.add_argument(
        "--model-size",
        "--model",
        dest="model_size",
        default="tiny",
        choices=None if planner else MODEL_SIZES,
        help=f"the lab's model size ({', '.join(MODEL_SIZES)})"
        + (" or a published architecture (gemma-2b, llama3-8b, llama3-70b)" if planner else ""),
    )
    p.add_argument("--devices", type=int, default=8, help="simulated CPU device count (ignored on GPUs and TPUs)")


def scenario_from(args: argparse.Namespace, **extra: Any) -> Any:
    """The ``Scenario`` the flags describe; ``extra`` sets or overrides knobs."""
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
