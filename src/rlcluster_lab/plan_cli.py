"""The ``plan`` subcommand (L4): flags, running a plan, and its text form.

Kept apart from ``plan`` so that building the CLI parser imports no JAX: the
device count must be set before the backend starts.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LAYOUTS = ("colocated", "reshaped", "split")
ENGINES = ("vanilla", "vllm", "sglang_jax")
ANCHOR_MODES = ("full", "trainable")


def _size(n: int | float | None) -> str:
    if n is None:
        return "unknown"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{int(n):,} B"


def format_plan(data: Mapping[str, Any]) -> str:
    """A readable summary of a plan's JSON."""
    m, t, mem, fits, sync = data["model"], data["topology"], data["memory"], data["fits"], data["sync"]
    lines = [
        f"plan ({data['source']}): {m['name']} ({m['num_params']:,} params, {m['param_dtype']}"
        + (f", LoRA rank {data['lora_rank']}: {m['lora_params']:,} adapter params" if data["lora_rank"] else "")
        + f") on {t['name']}: {t['device']}",
        f"layout {data['layout']}, engine {data['engine']}"
        + (", offload to pinned host" if data["offload"] else "") + f", anchor {data['anchor']}",
        "meshes:",
    ]
    for role, mesh in data["role_to_mesh"].items():
        shape = "x".join(f"{k}={v}" for k, v in mesh["shape"].items())
        ids = mesh["device_ids"]
        lines.append(f"  {role:<9} {shape:<16} devices {ids[0]}..{ids[-1]} ({len(ids)})")
    if data["mesh_overridden_by_engine"]:
        lines.append("  (the engine replaced the rollout mesh; the sharing map was built from the config's meshes)")
    lines.append("sharing map: " + "; ".join(f"{r} -> {', '.join(o) or '-'}" for r, o in data["sharing_map"].items()))
    lines.append(f"rollout branch (P3): {data['rollout_branch']}")
    lines.append(f"memory ({mem['units']}):")
    for role, info in mem["by_role"].items():
        verdict = fits["by_role"][role]
        ok = "" if verdict["fits"] is None else ("  fits" if verdict["fits"] else "  DOES NOT FIT")
        kinds = ", ".join(f"{k} {_size(v)}" for k, v in info["by_kind"].items())
        lines.append(f"  {role:<9} {_size(info['bytes']):>12} ({kinds}); busiest device "
                     f"{_size(verdict['max_device_bytes'])}{ok}")
    for group in mem["shared"]:
        lines.append(f"  shared by {', '.join(group['roles'])}: {_size(group['bytes'])} in {group['buffers']} buffers")
    lines.append(f"  unique {_size(mem['unique_bytes'])}, naive sum {_size(mem['naive_bytes'])}")
    per = fits["memory_per_device"]
    lines.append(f"per device: {_size(per)} ({fits['memory_source']}); resident busiest "
                 f"{_size(fits['resident']['max_device_bytes'])}, with sync peak "
                 f"{_size(fits['with_sync_peak']['max_device_bytes'])}"
                 + ("" if fits["all_fit"] is None else ("; everything fits" if fits["all_fit"] else "; DOES NOT FIT")))
    lines.append(f"sync (P13, {'LoRA parameters' if sync['lora'] else 'all parameters'}): synced "
                 f"{_size(sync['synced_bytes'])}, moved across devices {_size(sync['moved_cross_device_bytes'])}, "
                 f"copied within a device {_size(sync['copied_same_device_bytes'])}, reused "
                 f"{_size(sync['reused_bytes'])}; anchor re-pinned {_size(sync['anchor_bytes'])}")
    busiest = max(sync["arrived_by_device"].values(), default=0)
    secs = sync["estimated_seconds"]
    rate = "unknown bandwidth" if t["link_bandwidth"] is None else f"{t['link_bandwidth'] / 1e9:,.0f} GB/s"
    lines.append(f"  busiest device receives {_size(busiest)}; at {rate}: "
                 + ("unknown (no bandwidth)" if secs is None else f"{secs * 1e3:,.3f} ms"))
    for kind in ("device", "pinned_host"):
        peak = max((k.get(kind, 0) for k in sync["peak_extra_bytes"].values()), default=0)
        lines.append(f"  peak extra {kind} bytes on one device during the sync: {_size(peak)}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(text: str) -> float:
    """'80GB', '16GiB', '450e9', '2.5 TB' -> bytes; a trailing '/s' is allowed for rates."""
    s = str(text).strip().lower().replace(" ", "").removesuffix("/s")
    number = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(number):]
    if unit not in _UNITS:
        raise ValueError(f"cannot read {text!r} as bytes: unknown unit {unit!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"cannot read {text!r} as bytes; write e.g. 80GB, 16GiB or 450e9") from None
    if value <= 0:
        raise ValueError(f"{text!r} must be positive")
    return value


def add_plan_arguments(p: Any) -> None:
    """The ``plan`` subcommand's flags (cli.py builds the parser)."""
    p.add_argument("--model", default="tiny", help="our sizes (tiny, small, base, large) or a published "
                   "architecture (gemma-2b, llama3-8b, llama3-70b)")
    p.add_argument("--topology", default="local", help="local (this machine's devices), gpu-8, tpu-v5e-8, "
                   "tpu-v5p-8, tpu-v5p-64, tpu-v5p-256")
    p.add_argument("--lora", type=int, default=0, metavar="RANK", help="LoRA rank of the actor (0: no LoRA)")
    p.add_argument("--layout", default="colocated", help="colocated, reshaped or split")
    p.add_argument("--engine", default="vanilla", help="vanilla, vllm or sglang_jax")
    p.add_argument("--vllm-tp", type=int, default=None, help="vllm engine's tensor-parallel size (default: all)")
    p.add_argument("--offload", action="store_true", help="offload_to_cpu: roles live in pinned host between uses")
    p.add_argument("--anchor", default="full", help="full (the actor's state) or trainable (LoRA adapters only)")
    p.add_argument("--lora-separate-base", action="store_true", help="the LoRA actor's base is a copy (P4)")
    p.add_argument("--dtype", default=None, help="parameter dtype (default: the model's: float32 for our "
                   "sizes, bfloat16 for published ones)")
    p.add_argument("--rollout-dtype", default=None, help="dtype of the vanilla engine's second copy")
    p.add_argument("--reward", action="store_true", help="add a reward model")
    p.add_argument("--critic", action="store_true", help="add a critic")
    p.add_argument("--memory-per-device", default=None, help="bytes per device, e.g. 80GB or 16GiB "
                   "(default: the topology's, see its source)")
    p.add_argument("--bandwidth", default=None, help="bytes/s one device receives, e.g. 450GB "
                   "(default: the topology's, see its source)")
    p.add_argument("--devices", type=int, default=8, help="simulated CPU device count for --topology local")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_plan_command(args: Any) -> dict[str, Any]:
    """Run ``plan`` from parsed flags; returns the JSON, or ``{'_text': ...}`` without --json."""
    from rlcluster_lab.plan import plan_cluster

    for flag, value, valid in (("--layout", args.layout, LAYOUTS), ("--engine", args.engine, ENGINES),
                               ("--anchor", args.anchor, ANCHOR_MODES)):
        if value not in valid:
            raise ValueError(f"unknown {flag} {value!r}; choose one of {', '.join(valid)}")
    if args.lora < 0:
        raise ValueError(f"--lora must be >= 0 (0: no LoRA), got {args.lora}")
    plan = plan_cluster(
        args.model,
        args.topology,
        layout=args.layout,
        lora_rank=args.lora,
        lora_separate_base=args.lora_separate_base,
        engine=args.engine,
        vllm_tensor_parallel_size=args.vllm_tp,
        offload=args.offload,
        anchor=args.anchor,
        dtype=args.dtype,
        rollout_dtype=args.rollout_dtype,
        with_reward=args.reward,
        with_critic=args.critic,
        memory_per_device=None if args.memory_per_device is None else int(parse_bytes(args.memory_per_device)),
        link_bandwidth=None if args.bandwidth is None else parse_bytes(args.bandwidth),
    )
    data = plan.to_json()
    return data if args.json else {"_text": format_plan(data)}
