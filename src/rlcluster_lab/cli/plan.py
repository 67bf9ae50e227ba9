"""The ``plan`` subcommand (L4): its own flags, running a plan, and its text form (apart from
``planner.plan`` so that building the parser imports no JAX)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlcluster_lab.cli.flags import add_knob_flags, fields_given, scenario_from
from rlcluster_lab.cli.text import plan_text
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.knobs import KNOBS
from rlcluster_lab.core.limits import fmt_bytes, parse_bytes
from rlcluster_lab.core.options import DTYPES, MODEL_SIZES
from rlcluster_lab.planner.workload import Workload
from rlcluster_lab.rules.validation import check_scenario


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
        kinds = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in info["by_kind"].items())
        lines.append(
            f"  {role:<9} {fmt_bytes(info['bytes']):>12} ({kinds}); "
            f"busiest device {fmt_bytes(verdict['max_device_bytes'])}{ok}"
        )
    for group in mem["shared"]:
        roles, nbytes = ", ".join(group["roles"]), fmt_bytes(group["bytes"])
        lines.append(f"  shared by {roles}: {nbytes} in {group['buffers']} buffers")
    lines.append(f"  unique {fmt_bytes(mem['unique_bytes'])}, naive sum {fmt_bytes(mem['naive_bytes'])}")
    per = fits["memory_per_device"]
    lines.append(
        f"per device: {'unknown' if per is None else fmt_bytes(per)} ({fits['memory_source']}); resident busiest "
        f"{fmt_bytes(fits['resident']['max_device_bytes'])}, with sync peak "
        f"{fmt_bytes(fits['with_sync_peak']['max_device_bytes'])}"
    )
    lines += _step_lines(data)
    lines.append(
        f"sync (P13, {'LoRA parameters' if sync['lora'] else 'all parameters'}): synced "
        f"{fmt_bytes(sync['synced_bytes'])}, moved across devices {fmt_bytes(sync['moved_cross_device_bytes'])}, "
        f"copied within a device {fmt_bytes(sync['copied_same_device_bytes'])}, reused "
        f"{fmt_bytes(sync['reused_bytes'])}; anchor re-pinned {fmt_bytes(sync['anchor_bytes'])}"
    )
    lines.append(
        f"  across hosts {fmt_bytes(sync.get('cross_host_bytes', 0))} (at least), between devices of one host "
        f"{fmt_bytes(sync.get('within_host_cross_device_bytes', sync['moved_cross_device_bytes']))}"
    )
    lines += plan_text(sync)
    busiest = max(sync["arrived_by_device"].values(), default=0)
    secs = sync["estimated_seconds"]
    rate = "unknown bandwidth" if t["link_bandwidth"] is None else f"{t['link_bandwidth'] / 1e9:,.0f} GB/s"
    host_rate = t.get("host_link_bandwidth")
    if host_rate is not None and sync.get("cross_host_bytes"):
        rate += f" within a host, {host_rate / 1e9:,.0f} GB/s from other hosts"
    lines.append(
        f"  busiest device receives {fmt_bytes(busiest)}; at {rate}: "
        + ("unknown (no bandwidth)" if secs is None else f"{secs * 1e3:,.3f} ms")
    )
    for kind in ("device", "pinned_host"):
        peak = max((k.get(kind, 0) for k in sync["peak_extra_bytes"].values()), default=0)
        lines.append(f"  peak extra {kind} bytes on one device during the sync: {fmt_bytes(peak)}")
    transient = sync.get("transient_peak")
    if transient:
        from rlcluster_lab.measure.sync_peak import chunk_words  # imports JAX: not when the parser is built

        top = transient["max_bytes"]
        lines.append(
            "  transient peak on one device (new arrays before the old go, staging, arrays in flight"
            + (", program temporaries" if transient["method"]["program_temporaries"].startswith("computed") else "")
            + f"): device memory {fmt_bytes(top.get('device', 0))}, "
            + f"pinned host {fmt_bytes(top.get('pinned_host', 0))}; "
            + chunk_words(transient, fmt_bytes)
        )
    verdict = {None: "unknown (no memory per device known: pass --memory-per-device)", True: "everything fits"}
    lines.append("fits: " + verdict.get(fits["all_fit"], f"DOES NOT FIT: {fits['reason']}"))
    if "xla_check" in data:
        from rlcluster_lab.planner.xla_check import check_lines  # imports JAX: not when the parser is built

        lines += check_lines(data["xla_check"], t["name"])
    return "\n".join(lines)


def _terms(terms: Mapping[str, int], top: int = 8) -> str:
    ranked = sorted(((v, k) for k, v in terms.items() if v), reverse=True)[:top]
    return ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" for v, k in ranked) or "nothing"


def _step_lines(data: Mapping[str, Any]) -> list[str]:
    """The workload, the busiest device at its peak, each phase there, and every host."""
    work, step, fits = data.get("workload"), data.get("step"), data["fits"]
    if not work or not step:
        return []
    micro = work["micro_batch_size"]
    lines = [
        f"step: {work['rollout_batch_size']} rows of {work['prompt_length']} prompt + {work['max_tokens']} "
        f"completion tokens, KV cache of {work['kv_cache_size']} slots, trained "
        + (f"in micro-batches of {micro}" if micro else "in one piece")
        + (", every layer rematerialised" if work["remat"] else ", no rematerialisation (as the lab's step)")
    ]
    state = step.get("actor_training_state")
    if state:
        per = state["bytes_per_parameter"]
        lines.append(
            f"  actor's training state {fmt_bytes(state['total'])}: {per['total']:.2f} bytes per parameter "
            f"(parameters {per['parameters']:.2f}, gradients {per['gradients']:.2f}, optimizer {per['optimizer']:.2f})"
        )
    peak = fits.get("peak") or {}
    devices = {d["device"]: d for d in data.get("per_device", [])}
    top = devices.get(peak.get("device"))
    if top is not None:
        phase = (top["peak_phase"] or "rest").replace("_", " ")
        lines.append(
            f"  busiest device {top['device']} (host {top['host']}) peaks at {fmt_bytes(top['peak_bytes'])} "
            f"during {phase}: {_terms(peak.get('terms', {}))}"
        )
        for name, terms in top["phases"].items():
            lines.append(f"    {name.replace('_', ' '):<13} +{fmt_bytes(sum(terms.values()))}: {_terms(terms)}")
    hosts = data.get("per_host", [])
    shown = hosts if len(hosts) <= 4 else [h for h in hosts if h["host"] == (fits.get("hosts") or {}).get("host")]
    if len(hosts) > len(shown):
        lines.append(f"  {len(hosts)} hosts; the fullest:")
    for h in shown:
        ids, cap = h["device_ids"], h["host_memory"]
        lines.append(
            f"  host {h['host']} (devices {ids[0]}..{ids[-1]}): busiest device {fmt_bytes(h['device_peak_bytes'])}; "
            f"RAM {fmt_bytes(h['ram_bytes'])}"
            + ("" if cap is None else f" of {fmt_bytes(cap)}")
            + (f" ({_terms(h['ram'], 4)})" if h["ram"] else "")
            + f"; a sync brings {fmt_bytes(h['sync_cross_host_bytes'])} from other hosts"
        )
    return lines


def add_plan_arguments(p: Any) -> None:
    """The flags of ``plan``: the knob flags it takes (``cli.flags``) and the figures of a paper cluster."""
    model = KNOBS["model_size"].help + ", or a published architecture (gemma-2b, llama3-8b, llama3-70b)"
    cache = "KV cache slots per row (default: prompt + completion tokens)"
    add_knob_flags(
        p, "plan", model_size={"choices": None, "help": model}, kv_cache_size={"default": None, "help": cache}
    )
    dtype = "parameter dtype (default: the model's: float32 for our sizes, bfloat16 for published ones)"
    p.add_argument("--dtype", choices=DTYPES, default=None, help=dtype)
    topology = "(default: the topology's, see its source)"
    # Byte counts and rates, read by parse_bytes (None: the topology's figure).
    for flag, text in (
        ("--memory-per-device", f"bytes per device, e.g. 80GB or 16GiB {topology}"),
        ("--bandwidth", f"bytes/s one device receives, e.g. 450GB {topology}"),
        ("--host-memory", "RAM per host, e.g. 2TB (default: the topology's)"),
        ("--host-bandwidth", "bytes/s one device receives from other hosts, e.g. 50GB (default: the topology's)"),
    ):
        p.add_argument(flag, default=None, help=text)
    remat = "plan a step that rematerialises every layer (the lab's does not)"
    p.add_argument("--remat", action="store_true", help=remat)
    check = (
        "compile the step's programs for the topology (XLA:TPU's compile-only client for a TPU slice, this "
        "machine's devices for local; nothing allocated) and print XLA's bytes per device beside the planner's"
    )
    p.add_argument("--xla-check", action="store_true", help=check)
    p.add_argument("--libtpu", default=None, metavar="DIR", help="with --xla-check: a folder libtpu was installed in")


def check_plan_flags(args: Any) -> None:
    """Flags that contradict each other, refused before the backend starts: ``--devices`` sets
    the simulated devices that ``--topology local`` plans on, and a named topology has its own.

    Raises:
        ConfigError: naming both flags.
    """
    if args.libtpu is not None and not args.xla_check:
        problem = "--libtpu names the folder --xla-check compiles with"
        raise ConfigError(f"{problem}: add --xla-check, or drop --libtpu", problem=problem)
    if args.topology != "local" and args.devices != KNOBS["devices"].default:
        problem = (
            f"--devices {args.devices} sets the simulated devices that --topology local plans on; topology "
            f"{args.topology} has devices of its own"
        )
        raise ConfigError(
            f"{problem}: drop --devices, or plan on --topology local", knobs=("devices", "topology"), problem=problem
        )


def run_plan_command(args: Any) -> dict[str, Any]:
    """Run ``plan`` from parsed flags; returns the JSON, or ``{'_text': ...}`` without --json."""
    from rlcluster_lab.core.shardings import PlacementError
    from rlcluster_lab.planner.plan import plan_scenario
    from rlcluster_lab.planner.tables import model_config

    # The knobs are checked as a Scenario's are; the model may be a published one here,
    # and the LoRA rank is checked against its dimensions.
    lab_size = args.model_size in MODEL_SIZES
    scenario = scenario_from(args, model_size=args.model_size if lab_size else "tiny")
    check_scenario(scenario, model=model_config(args.model_size, dtype=args.dtype))
    cache = args.kv_cache_size if args.kv_cache_size is not None else args.prompt_length + args.max_tokens
    workload = Workload(**{**fields_given(Workload, args), "kv_cache_size": cache})
    try:
        plan = plan_scenario(
            scenario,
            args.topology,
            model=args.model_size,
            dtype=args.dtype,
            vllm_tensor_parallel_size=args.rollout_vllm_tensor_parallel_size,
            workload=workload,
            devices_per_host=args.devices_per_host,
            memory_per_device=_bytes(args.memory_per_device, "--memory-per-device", int),
            link_bandwidth=_bytes(args.bandwidth, "--bandwidth"),
            host_memory=_bytes(args.host_memory, "--host-memory", int),
            host_link_bandwidth=_bytes(args.host_bandwidth, "--host-bandwidth"),
        )
    except PlacementError as err:
        # A mesh the model cannot be split over: the planner's meshes follow the topology's devices
        # (this machine's simulated ones for --topology local), and the vllm engine's its own
        # tensor-parallel size (P7).
        own_mesh = err.role == "rollout" and args.engine == "vllm"
        err.knobs = (("rollout_vllm_tensor_parallel_size", "engine") if own_mesh else ()) + (
            ("devices", "topology") if args.topology == "local" else ("topology",)
        )
        raise
    data = plan.to_json()
    if args.xla_check:
        from rlcluster_lab.planner.xla_check import check_devices, check_plan

        data["xla_check"] = check_plan(plan, check_devices(plan.request.topology, args.libtpu))
    return data if args.json else {"_text": format_plan(data)}


def _bytes(value: str | None, flag: str, kind: type = float) -> Any:
    """A byte count or rate a flag gives (None: not given, the topology's figure)."""
    return None if value is None else kind(parse_bytes(value, flag))
