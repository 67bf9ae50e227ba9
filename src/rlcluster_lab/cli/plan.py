"""The ``plan`` subcommand (L4): its own flags, running a plan, and its text form.

Kept apart from ``planner.plan`` so that building the CLI parser imports no
JAX: the device count must be set before the backend starts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rlcluster_lab.cli.flags import scenario_from
from rlcluster_lab.core.options import DTYPES, MODEL_SIZES


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
        + (", offload to pinned host" if data["offload"] else "")
        + f", anchor {data['anchor']}",
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
        lines.append(
            f"  {role:<9} {_size(info['bytes']):>12} ({kinds}); busiest device {_size(verdict['max_device_bytes'])}{ok}"
        )
    for group in mem["shared"]:
        lines.append(f"  shared by {', '.join(group['roles'])}: {_size(group['bytes'])} in {group['buffers']} buffers")
    lines.append(f"  unique {_size(mem['unique_bytes'])}, naive sum {_size(mem['naive_bytes'])}")
    per = fits["memory_per_device"]
    lines.append(
        f"per device: {_size(per)} ({fits['memory_source']}); resident busiest "
        f"{_size(fits['resident']['max_device_bytes'])}, with sync peak "
        f"{_size(fits['with_sync_peak']['max_device_bytes'])}"
        + ("" if fits["all_fit"] is None else ("; everything fits" if fits["all_fit"] else "; DOES NOT FIT"))
    )
    lines.append(
        f"sync (P13, {'LoRA parameters' if sync['lora'] else 'all parameters'}): synced "
        f"{_size(sync['synced_bytes'])}, moved across devices {_size(sync['moved_cross_device_bytes'])}, "
        f"copied within a device {_size(sync['copied_same_device_bytes'])}, reused "
        f"{_size(sync['reused_bytes'])}; anchor re-pinned {_size(sync['anchor_bytes'])}"
    )
    busiest = max(sync["arrived_by_device"].values(), default=0)
    secs = sync["estimated_seconds"]
    rate = "unknown bandwidth" if t["link_bandwidth"] is None else f"{t['link_bandwidth'] / 1e9:,.0f} GB/s"
    lines.append(
        f"  busiest device receives {_size(busiest)}; at {rate}: "
        + ("unknown (no bandwidth)" if secs is None else f"{secs * 1e3:,.3f} ms")
    )
    for kind in ("device", "pinned_host"):
        peak = max((k.get(kind, 0) for k in sync["peak_extra_bytes"].values()), default=0)
        lines.append(f"  peak extra {kind} bytes on one device during the sync: {_size(peak)}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def parse_bytes(text: str, name: str = "value") -> float:
    """'80GB', '16GiB', '450e9', '2.5 TB' -> bytes; a trailing '/s' is allowed for rates.

    Raises:
        ValueError: text that is not a positive, finite number of bytes; the message names ``name``.
    """
    s = str(text).strip().lower().replace(" ", "").removesuffix("/s")
    number = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(number) :]
    if unit not in _UNITS:
        raise ValueError(
            f"{name}: cannot read {text!r} as bytes: unknown unit {unit!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"{name}: cannot read {text!r} as bytes; write e.g. 80GB, 16GiB or 450e9") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive, finite number of bytes (e.g. 80GB), got {text!r}")
    return value


def add_plan_arguments(p: Any) -> None:
    """The flags only ``plan`` has; the scenario's knobs come from ``cli.flags``."""
    p.add_argument(
        "--topology",
        default="local",
        help="local (this machine's devices), gpu-8, tpu-v5e-8, tpu-v5p-8, tpu-v5p-64, tpu-v5p-256",
    )
    p.add_argument("--vllm-tp", type=int, default=None, help="vllm engine's tensor-parallel size (default: all)")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="parameter dtype (default: the model's: float32 for our sizes, bfloat16 for published ones)",
    )
    p.add_argument(
        "--memory-per-device",
        default=None,
        help="bytes per device, e.g. 80GB or 16GiB (default: the topology's, see its source)",
    )
    p.add_argument(
        "--bandwidth",
        default=None,
        help="bytes/s one device receives, e.g. 450GB (default: the topology's, see its source)",
    )


def run_plan_command(args: Any) -> dict[str, Any]:
    """Run ``plan`` from parsed flags; returns the JSON, or ``{'_text': ...}`` without --json."""
    from rlcluster_lab.planner.plan import plan_cluster
    from rlcluster_lab.planner.tables import model_config

    # The knobs are checked as a Scenario's are; the model may be a published one here,
    # and the LoRA rank is checked against its dimensions.
    lab_size = args.model_size in MODEL_SIZES
    scenario = scenario_from(args, model_size=args.model_size if lab_size else "tiny")
    scenario.check(model=model_config(args.model_size, dtype=args.dtype))
    plan = plan_cluster(
        args.model_size,
        args.topology,
        layout=args.layout,
        lora_rank=args.lora_rank if args.lora else 0,
        lora_separate_base=args.lora_separate_base,
        engine=args.engine,
        vllm_tensor_parallel_size=args.vllm_tp,
        offload=args.offload,
        anchor=args.anchor,
        dtype=args.dtype,
        rollout_dtype=args.rollout_dtype,
        with_reward=args.reward,
        with_critic=args.critic,
        reshard=args.reshard,
        memory_per_device=None
        if args.memory_per_device is None
        else int(parse_bytes(args.memory_per_device, "--memory-per-device")),
        link_bandwidth=None if args.bandwidth is None else parse_bytes(args.bandwidth, "--bandwidth"),
    )
    data = plan.to_json()
    return data if args.json else {"_text": format_plan(data)}
