"""A plan checked by the compiler that would run it (L4): the programs of one RL step lowered
from shapes alone and compiled for the plan's devices, XLA's bytes per device beside the
planner's (``model.memory``, the figure the live check before compiling reads too).

The programs are the lab's own, as an RL step runs them: the sampler with its KV cache on the
rollout's mesh, the anchor's and the reference's log-prob programs, and the actor's optimizer
step (the critic's and the reward model's programs are not checked). Each is lowered over
``jax.ShapeDtypeStruct``s that carry the plan's shardings (the model's parameters in the
role's layout, optimizer state as ``init_optimizer_state`` lays it out, the batch as host
arrays of its shape) inside the role's context (its mesh, logical axis rules and matmul
precision), and compiled: nothing is allocated or run. The devices are XLA:TPU's compile-only
client's for a TPU topology (``core.compile_only``), this process's for ``local``.

XLA's figure for a program is ``compiled.memory_analysis()``'s arguments + outputs +
temporaries - aliased, per device (an SPMD program's, alike on every device of its mesh); a
program XLA refuses for memory counts as not fitting, with the figure its message names. A
device holds what its program needs and what else the plan keeps there (the resident
buffers that are not the program's arguments), so each side's verdict is: for every program
and device, that sum at most the memory per device.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from flax.traverse_util import flatten_dict, unflatten_dict
from jax.sharding import PartitionSpec

from rlcluster_lab.cluster.construct import Placed
from rlcluster_lab.core.compile_cache import uncached
from rlcluster_lab.core.compile_only import compile_only_devices
from rlcluster_lab.core.config import ClusterConfig, TrainingConfig
from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.trace import Trace
from rlcluster_lab.measure.program_memory import xla_memory
from rlcluster_lab.model import abstract_model
from rlcluster_lab.model.fits import xla_figures
from rlcluster_lab.model.logps import LOGPS, model_compiler_options
from rlcluster_lab.model.lora import trained_params
from rlcluster_lab.model.memory import ProgramBytes, Split, generate_program, logps_program, update_program
from rlcluster_lab.model.sampling import lowered_generate
from rlcluster_lab.model.tokenizer import ByteTokenizer
from rlcluster_lab.placement.layout import Layout, PlannedMesh
from rlcluster_lab.placement.xla import layout_sharding
from rlcluster_lab.planner.budget import _per_device
from rlcluster_lab.planner.buffers import Buffers, PlannedArray
from rlcluster_lab.planner.plan import Plan, _construct, _plan
from rlcluster_lab.planner.request import PlanRequest
from rlcluster_lab.planner.tables import Topology
from rlcluster_lab.training.step import abstract_optimizer_state, train_step

PathKey = tuple[Any, ...]
# The precision the programs P11 compares run at in a cluster built with the defaults (core.precision).
MATMUL_PRECISION = {f.name: f.default for f in dataclasses.fields(ClusterConfig)}["matmul_precision"]
# Within this share of XLA's figure the planner's counts as agreeing.
AGREES_WITHIN = 0.10


@dataclasses.dataclass(frozen=True)
class ProgramCheck:
    """One program compiled by XLA beside the planner's figure, on the busiest device of its mesh
    (the program's bytes plus what else the plan keeps there)."""

    program: str
    role: str
    device: int
    planned: ProgramBytes
    xla: Mapping[str, int]  # memory_analysis: argument, output, temp, alias (bytes per device)
    xla_bytes: int | None  # None: XLA refused it without naming a figure
    refused: str | None  # XLA's refusal, in its words
    others: int  # what else the plan keeps on the device (resident buffers that are not the program's inputs)
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "program": self.program,
            "role": self.role,
            "planned_bytes": self.planned.total,
            "xla_bytes": self.xla_bytes,
            "device": self.device,
            "planned": self.planned.to_json(),
            "xla": dict(self.xla),
            "refused": self.refused,
            "other_resident_bytes": self.others,
            "compile_seconds": round(self.seconds, 2),
        }


def check_devices(topo: Topology, libtpu: str | None = None) -> dict[int, Any]:
    """The devices to compile the plan's programs for, by the plan's device ids: a TPU slice's
    from XLA:TPU's compile-only client (in its own order, which groups each host's chips as the
    plan's consecutive ids do), or this process's for ``local``.

    Raises:
        ValueError: a topology XLA cannot be asked about here (a GPU one).
        ConfigError: no libtpu (``core.compile_only``).
    """
    if topo.xla_topology is not None:
        name, per_host = topo.xla_topology
        return dict(zip(topo.ids(), compile_only_devices(name, per_host, libtpu)))
    if topo.name == "local":
        wanted = set(topo.ids())
        return {int(d.id): d for d in jax.devices(topo.platform) if int(d.id) in wanted}
    raise ValueError(
        "XLA's check compiles for a TPU slice with XLA:TPU's compile-only client, or for this machine's "
        f"devices (--topology local); {topo.name} is neither"
    )


@dataclasses.dataclass(frozen=True)
class StepProgram:
    """One program of an RL step on paper: what it is, whose, on which mesh, the plan's arrays it
    reads (parameters, optimizer state), the planner's figure for it on a device of its mesh, and
    how to lower it over abstract arrays on given devices."""

    program: str
    role: Role
    mesh: PlannedMesh
    inputs: tuple[PlannedArray, ...]
    planned: Callable[[int], ProgramBytes]
    lower: Callable[[Mapping[int, Any]], Any]


def step_programs(req: PlanRequest, placed: Placed) -> list[StepProgram]:
    """The programs one RL step compiles for ``req``'s plan (``app.learner``'s order)."""
    work, tok, training = req.workload, ByteTokenizer(), TrainingConfig(optimizer=req.optimizer)
    ids = {"eos_id": tok.eos_id, "pad_id": tok.pad_id}
    rows, prompt, new, slots = work.rollout_batch_size, work.prompt_length, work.max_tokens, work.kv_cache_size
    tokens, completion, temperature = np.zeros((rows, prompt), np.int32), np.zeros((rows, new), np.int32), 1.0
    scores_reference = placed.reference is not None and training.beta > 0
    floats = ("old_logps", "ref_logps") if scores_reference else ("old_logps",)
    batch = {"prompt_tokens": tokens, "completion_tokens": completion, "advantages": np.zeros(rows, np.float32)}
    batch |= {k: np.zeros((rows, new), np.float32) for k in floats}
    # Where the platform keeps a program's temporaries (model.memory): fused or not, on chip or not.
    where = {"platform": req.topology.platform, "on_chip": req.topology.on_chip_memory}

    def figure(
        program: Callable[..., ProgramBytes],
        role: Role,
        mesh: PlannedMesh,
        inputs: Sequence[PlannedArray],
        host: Sequence[Any],
        *shape: int,
        **more: Any,
    ) -> Callable[[int], ProgramBytes]:
        split = Split.of(mesh, req.rules(role))
        return lambda d: program(req.model, *shape, _on_device(inputs, d, host), split, **where, **more)

    def logps(role: Role, arrays: Mapping[PathKey, PlannedArray], rank: int) -> StepProgram:
        mesh, inputs, host = next(iter(arrays.values())).mesh, tuple(arrays.values()), (tokens, completion, 1.0)

        def lower(devices: Mapping[int, Any]) -> Any:
            graphdef, state = _abstract_model(req, arrays, rank, devices)
            program = LOGPS.jitted(model_compiler_options(graphdef, state))
            return program.lower(graphdef, state, tokens, completion, ids["pad_id"], np.float32(temperature))

        planned = figure(logps_program, role, mesh, inputs, host, rows, prompt, new, lora_rank=rank)
        return StepProgram("log-probs", role, mesh, inputs, planned, lower)

    rollout, actor = placed.engine.model, placed.actor
    r_mesh, r_inputs = next(iter(rollout.arrays.values())).mesh, tuple(rollout.arrays.values())

    def generate(devices: Mapping[int, Any]) -> Any:
        graphdef, state = _abstract_model(req, rollout.arrays, rollout.lora_rank, devices)
        return lowered_generate(graphdef, state, tokens, max_new_tokens=new, cache_size=slots, **ids)

    a_mesh, a_inputs = placed.role_to_mesh[Role.ACTOR], (*actor.arrays.values(), *placed.optimizer)
    trained = [a for p, a in actor.arrays.items() if p in actor.lora_paths or not placed.lora]

    def update(devices: Mapping[int, Any]) -> Any:
        graphdef, state = _abstract_model(req, actor.arrays, actor.lora_rank, devices)
        graphdef, trainable, frozen = nnx.split(nnx.merge(graphdef, state), trained_params(placed.lora), ...)
        tx = training.actor_optimizer()
        opt_state = abstract_optimizer_state(tx, trainable, _mesh(a_mesh, devices))
        knobs = {"beta": training.beta, "epsilon": training.epsilon, "micro_batch_size": work.micro_batch_size}
        args = (trainable, frozen, opt_state, batch, temperature)
        return train_step(graphdef, tx, *args, pad_id=ids["pad_id"], **knobs, lower=True)

    host = (tokens, np.int64(0), 1.0)  # the prompts, the seed, the temperature
    planned = figure(
        generate_program, Role.ROLLOUT, r_mesh, r_inputs, host, rows, prompt, new, slots, lora_rank=rollout.lora_rank
    )
    out = [StepProgram("generate", Role.ROLLOUT, r_mesh, r_inputs, planned, generate)]
    # The anchor's log-probs run the actor's graph over the anchor, brought to the actor's devices (P10).
    out.append(logps(Role.ACTOR, placed.anchor, actor.lora_rank))
    if scores_reference:
        out.append(logps(Role.REFERENCE, placed.reference.arrays, 0))
    u_split = Split.of(a_mesh, req.rules(Role.ACTOR))

    def update_bytes(d: int) -> ProgramBytes:
        held = [
            _on_device(a_inputs, d, (*batch.values(), 1.0)),
            _on_device(trained, d),
            _on_device(placed.optimizer, d),
        ]
        leaves = len(trained) + len(placed.optimizer) + 5  # it returns the parameters, optimizer state, metrics
        shape = (work.train_rows, prompt, new)
        more = {"accumulating": work.accumulates, "lora_rank": actor.lora_rank}
        return update_program(req.model, *shape, *held, leaves, u_split, **where, **more)

    out.append(StepProgram("train step", Role.ACTOR, a_mesh, a_inputs, update_bytes, update))
    return out


def _on_device(arrays: Sequence[PlannedArray], d: int, host: Sequence[Any] = ()) -> int:
    """A program's inputs on device ``d``: each array's shard there, and the host values (the batch,
    the scalars) whole, in the type JAX gives them (an int64 seed is int32 without x64)."""
    shards = sum(a.shard_bytes for a in arrays if d in a.mesh.device_ids)
    return shards + sum(np.size(x) * jax.dtypes.canonicalize_dtype(np.asarray(x).dtype).itemsize for x in host)


def _mesh(planned: PlannedMesh, devices: Mapping[int, Any]) -> jax.sharding.Mesh:
    return layout_sharding(Layout(planned, PartitionSpec(), "device"), devices).mesh


def _abstract_model(
    req: PlanRequest, arrays: Mapping[PathKey, PlannedArray], lora_rank: int, devices: Mapping[int, Any]
) -> tuple[Any, Any]:
    """The lab's model at the plan's dimensions as a graphdef and a state of abstract arrays, each
    with its planned sharding in device memory (an operation brings its role there first, P14)."""
    graphdef, state = nnx.split(abstract_model(req.model, lora_rank))
    leaves = {
        p: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=layout_sharding(a.layout.in_kind("device"), devices))
        for p in flatten_dict(nnx.to_pure_dict(state))
        for a in (arrays[p],)
    }
    nnx.replace_by_pure_dict(state, unflatten_dict(leaves))
    return graphdef, state


def _compiled_bytes(lowered: Any) -> tuple[dict[str, int], int | None, str | None]:
    """XLA's terms for a lowered program (bytes per device), its figure, and its refusal if any
    (a refusal that is not for memory is raised): a refused program's figure is what XLA's
    message says it needs (``model.fits.xla_figures``)."""
    try:
        # Not through the persistent cache: a compile-only client's executable cannot be read back.
        with uncached():
            terms, _ = xla_memory(lowered)
    except Exception as err:  # noqa: BLE001 - XLA's own error type differs between releases
        text = str(err)
        if "RESOURCE_EXHAUSTED" not in text:
            raise
        figures = xla_figures(text)
        return {}, None if figures is None else figures[0], text.splitlines()[0]
    return terms, terms["argument"] + terms["output"] + terms["temp"] - terms["alias"], None


def check_plan(plan: Plan, devices: Mapping[int, Any]) -> dict[str, Any]:
    """Every program of ``plan``'s step compiled for ``devices`` (``check_devices``): per program
    the planner's bytes and XLA's on its busiest device, and whether each says the plan fits."""
    req = plan.request
    if req is None:
        raise ValueError("this plan carries no request to check (plan it with planner.plan_cluster)")
    placed = _construct(req, Buffers(req.reshard), Trace())
    resident = {b.device: sum(b.resident.values()) for b in plan.per_device}
    seen: dict[int, tuple[dict[str, int], int | None, str | None, float]] = {}
    checks = []
    for sp in step_programs(req, placed):
        mesh = _mesh(sp.mesh, devices)
        start = time.perf_counter()
        with jax.set_mesh(mesh), nnx.logical_axis_rules(list(req.rules(sp.role))):
            with jax.default_matmul_precision(MATMUL_PRECISION):
                lowered = sp.lower(devices)
        key = hash(lowered.as_text())
        if key not in seen:  # one program for two roles (the reference's and the anchor's, alike) compiles once
            seen[key] = (*_compiled_bytes(lowered), time.perf_counter() - start)
        xla, xla_bytes, refused, seconds = seen[key]
        held = _per_device(list(sp.inputs), "device")
        planned = {d: sp.planned(d) for d in sp.mesh.device_ids}
        others = {d: resident.get(d, 0) - held.get(d, 0) for d in sp.mesh.device_ids}
        d = max(sp.mesh.device_ids, key=lambda i: planned[i].total + others[i])
        check = ProgramCheck(sp.program, sp.role.value, d, planned[d], xla, xla_bytes, refused, others[d], seconds)
        checks.append(check)
    out = summary(checks, req.topology.memory_per_device)
    # The sync's reshard programs, where its route compiles any, compiled for these devices: its
    # transient peak on paper beside the one with XLA's temporaries.
    synced = _plan(req, sync_devices=list(devices.values())).sync["transient_peak"]
    out["sync"] = {
        "compiles_programs": any(any(ph["temporaries"].values()) for ph in synced["phases"]),
        "planned_peak_bytes": int(plan.sync["transient_peak"]["max_bytes"].get("device", 0)),
        "xla_peak_bytes": int(synced["max_bytes"].get("device", 0)),
    }
    return out


def summary(checks: Sequence[ProgramCheck], limit: int | None) -> dict[str, Any]:
    """The check's JSON: every program, and whether each side says the plan fits (every program's
    bytes plus what else its busiest device keeps, at most ``limit``; a program XLA refused does
    not fit). None where no limit is known."""

    def fits(totals: Sequence[int | None]) -> bool | None:
        if any(t is None for t in totals):  # a program XLA refused
            return False
        return None if limit is None else all(t + c.others <= limit for t, c in zip(totals, checks))

    planner = fits([c.planned.total for c in checks])
    xla = fits([None if c.refused else c.xla_bytes for c in checks])
    return {
        "programs": [c.to_json() for c in checks],
        "fits": {"planner": planner, "xla": xla},
        "memory_per_device": limit,
        "agree_within": AGREES_WITHIN,
        "method": "each program lowered from abstract arrays with the plan's shardings and compiled for the "
        "topology's devices (nothing allocated); XLA's bytes: compiled.memory_analysis() arguments + outputs + "
        "temporaries - aliased, per device; the planner's: model.memory's figure for the program",
    }


# Why a term of the planner's figure may differ from XLA's, said beside a program that differs.
WHY = {
    "arguments": "the shards of the plan's arrays the program reads and the batch, from shapes; XLA pads an "
    "array to its tiles",
    "outputs": "what the program returns, from shapes",
    "temporaries": "the buffers alive at the program's fullest point, from shapes (model.memory: every row on each "
    "device, the residual stream split as the embedding dimension is; on a TPU the float32 casts fused, a float32 "
    "model's operands of its products kept in bfloat16, temporaries that fit the chip's vector memory kept there); "
    "XLA's buffer assignment shares, fuses or places some of them otherwise",
}


def check_lines(check: Mapping[str, Any], topology: str) -> list[str]:
    """``check_plan``'s JSON in words: per program the planner's bytes and XLA's on its busiest
    device, the term that differs most where they differ by more than ``AGREES_WITHIN`` and why,
    and each side's verdict."""
    lines = [f"XLA's check: the step's programs compiled for {topology} from shapes (nothing allocated)"]
    for p in check["programs"]:
        planned, xla = p["planned"], p["xla"]
        head = (
            f"  {p['program']:<10} {p['role']:<9} device {p['device']:<4} planner {fmt_bytes(p['planned_bytes']):>10}"
        )
        if p["refused"] is not None:
            named = "" if p["xla_bytes"] is None else f" (it needs {fmt_bytes(p['xla_bytes'])})"
            lines.append(f"{head}, XLA refused it{named}: {p['refused']}")
            continue
        ratio = p["planned_bytes"] / p["xla_bytes"] - 1 if p["xla_bytes"] else 0.0
        lines.append(
            f"{head}, XLA {fmt_bytes(p['xla_bytes']):>10} ({ratio:+.1%}; compiled in {p['compile_seconds']:.1f} s)"
        )
        if abs(ratio) > check["agree_within"]:
            sides = {
                "arguments": (planned["arguments"], xla["argument"]),
                "outputs": (planned["outputs"], xla["output"]),
                "temporaries": (sum(planned["temporaries"].values()), xla["temp"]),
            }
            term = max(sides, key=lambda k: abs(sides[k][0] - sides[k][1]))
            ours, theirs = sides[term]
            parts = ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in planned["temporaries"].items() if v)
            detail = f" ({parts})" if term == "temporaries" and parts else ""
            lines.append(
                f"    differs most in its {term}: planner {fmt_bytes(ours)}{detail}, XLA {fmt_bytes(theirs)}: "
                f"{WHY[term]}"
            )
        if p["other_resident_bytes"]:
            lines.append(
                f"    beside it the device keeps {fmt_bytes(p['other_resident_bytes'])} of the plan's other arrays"
            )
    sync = check.get("sync")
    if sync and sync["compiles_programs"]:
        lines.append(
            f"  sync's reshard programs compiled: transient device peak {fmt_bytes(sync['planned_peak_bytes'])} on "
            f"paper, {fmt_bytes(sync['xla_peak_bytes'])} with XLA's temporaries"
        )
    elif sync:
        lines.append("  the sync compiles no program here: whole shards move between meshes, or none move")
    words = {True: "fits", False: "DOES NOT FIT", None: "unknown (no memory per device known)"}
    fits = check["fits"]
    lines.append(f"  fits: planner {words[fits['planner']]}, XLA {words[fits['xla']]}")
    return lines
