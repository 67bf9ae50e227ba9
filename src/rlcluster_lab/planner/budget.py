"""Whether a planned cluster fits (L4): every device's bytes through a step's phases, every
host's RAM, and the reason when something does not fit.

A device holds its resident state (each buffer once, for its first holder in report order)
and, while a phase of a step runs, that phase's transient bytes: ``generate`` (the sampler's
temporaries, its KV cache among them, and its outputs; under offload the rollout weights,
brought to device: P14), ``actor_update`` and ``critic_update`` (the optimizer step's
temporaries: one micro-batch's activations, the gradients, the layer in flight; and its
outputs, the new parameters and optimizer state; under offload the role's state, brought to
device) and ``sync`` (its transient device peak, ``planner.sync_peak``). The programs' figures
are ``model.memory``'s, the ones each program is checked with before it is compiled
(``model.fits``), for the topology's platform. Phases run one after another, so a device's
peak is its resident bytes plus its largest phase. A host's RAM holds its devices' host-kind
buffers and the sync's pinned-host peak; on CPU it holds its devices' bytes too. The log-prob
programs, smaller than the optimizer step over the same rows, are not a phase of their own.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlcluster_lab.measure.memory import KINDS, MEMORY_ENTRIES
from rlcluster_lab.model.memory import generate_program, update_program
from rlcluster_lab.planner.buffers import PlannedArray, distinct_buffers, shard_rows
from rlcluster_lab.planner.step_memory import Split, Workload
from rlcluster_lab.planner.tables import Topology

PHASES = ("generate", "actor_update", "critic_update", "sync")


def sync_device_terms(sync: Mapping[str, Any]) -> dict[int, dict[str, int]]:
    """Per device, the sync's device-memory peak (the plan's ``transient_peak``) split into
    arrays and program temporaries (at the phase where the device's peak is)."""
    peak = sync["transient_peak"]
    out: dict[int, dict[str, int]] = {}
    for d, kinds in peak["by_device"].items():
        top = int(kinds.get("device", 0))
        if not top:
            continue
        for ph in peak["phases"]:
            arrays = int(ph["arrays"].get(d, {}).get("device", 0))
            temps = int(ph["temporaries"].get(d, 0))
            if arrays + temps == top:
                out[int(d)] = {k: v for k, v in (("sync_arrays", arrays), ("sync_program_temporaries", temps)) if v}
                break
    return out


@dataclasses.dataclass(frozen=True)
class DeviceBudget:
    """One device's bytes: ``resident`` per entry (a shared buffer for the first in report
    order), ``phases[phase][term]`` while each runs, ``peak_bytes`` = resident + the largest
    phase (``peak_phase``)."""

    device: int
    host: int
    resident: Mapping[str, int]
    phases: Mapping[str, Mapping[str, int]]
    peak_bytes: int
    peak_phase: str | None
    memory: int | None
    fits: bool | None

    def terms_at_peak(self) -> dict[str, int]:
        """Every term that fills the device at its peak, resident and transient."""
        out = {k: v for k, v in self.resident.items() if v}
        if self.peak_phase is not None:
            out.update({k: v for k, v in self.phases[self.peak_phase].items() if v})
        return out


@dataclasses.dataclass(frozen=True)
class HostBudget:
    """One host (the devices of one process): what its devices hold, and its RAM.

    ``by_role[entry][kind]``: each entry's buffers on this host (as that process's walk
    counts them); ``by_kind``: every buffer once; ``ram[term]``: host RAM at the host's
    peak; ``sync_cross_host_bytes`` / ``sync_within_host_bytes``: what a sync brings from
    other hosts / moves between this host's devices.
    """

    host: int
    device_ids: tuple[int, ...]
    by_role: Mapping[str, Mapping[str, int]]
    by_kind: Mapping[str, int]
    ram: Mapping[str, int]
    ram_bytes: int
    ram_phase: str | None
    host_memory: int | None
    fits: bool | None
    device_peak_bytes: int
    sync_cross_host_bytes: int
    sync_within_host_bytes: int


def _per_device(arrays: Sequence[PlannedArray], kind: str | None = None, itemsize: int | None = None) -> Counter:
    """Bytes per device of ``arrays``: every shard, or with ``kind`` each buffer of that kind once
    (``itemsize``: in that many bytes per element instead of each array's own)."""
    rows = shard_rows([arrays], itemsize)
    sel = np.arange(len(rows["device"]))
    if kind is not None:
        sel = distinct_buffers(rows)
        sel = sel[rows["kind"][sel] == KINDS.index(kind)]
    devices, inverse = np.unique(rows["device"][sel], return_inverse=True)
    sums = np.zeros(len(devices), dtype=np.int64)
    np.add.at(sums, inverse, rows["bytes"][sel])
    return Counter({int(d): int(n) for d, n in zip(devices, sums) if n})


def logical_bytes(arrays: Sequence[PlannedArray], itemsize: int | None = None) -> int:
    """Bytes of ``arrays`` counted once each, however they are sharded or replicated."""
    return sum(int(np.prod(a.shape, dtype=np.int64)) * (itemsize or a.dtype.itemsize) for a in arrays)


def training_state(trainer: Trainer, workload: Workload, parameters: int) -> dict[str, float]:
    """The trained role's model states once each (not per device): parameters, gradients and
    optimizer state, in bytes and per parameter, to hold against published figures
    (``planner.references``)."""
    state = {
        "parameters": logical_bytes(trainer.arrays),
        "gradients": logical_bytes(trainer.trainable)
        + (logical_bytes(trainer.trainable, 4) if workload.accumulates else 0),
        "optimizer": logical_bytes(trainer.optimizer),
    }
    total = sum(state.values())
    return {
        **state,
        "total": total,
        "num_params": parameters,
        "bytes_per_parameter": {k: v / parameters for k, v in {**state, "total": total}.items()},
    }


@dataclasses.dataclass(frozen=True)
class Trainer:
    """A role that trains: its arrays, the trainable ones, its optimizer state, where it runs."""

    arrays: Sequence[PlannedArray]
    trainable: Sequence[PlannedArray]
    optimizer: Sequence[PlannedArray]
    split: Split
    lora_rank: int = 0
    value_head: bool = False


def update_phase(
    config: Any, trainer: Trainer, workload: Workload, offload: bool, platform: str = "cpu"
) -> dict[int, dict[str, int]]:
    """Per device of the trainer's mesh, what one optimizer step adds: its program's temporaries on
    ``platform`` (``model.memory.update_program``, the figure the step is checked with before it
    is compiled) and its outputs, the new parameters and optimizer state beside the old."""
    trained, optimizer = _per_device(trainer.trainable), _per_device(trainer.optimizer)
    outputs = trained + optimizer
    leaves = len(trainer.trainable) + len(trainer.optimizer) + 5  # and the five metrics
    brought = _per_device(trainer.arrays, "pinned_host") + _per_device(trainer.optimizer, "pinned_host")

    def program(d: int) -> dict[str, int]:
        return update_program(
            config,
            workload.train_rows,
            workload.prompt_length,
            workload.max_tokens,
            0,
            trained[d],
            optimizer[d],
            leaves,
            trainer.split,
            platform=platform,
            accumulating=workload.accumulates,
            lora_rank=trainer.lora_rank,
            value_head=trainer.value_head,
            remat=workload.remat,
        ).temporaries

    return {
        d: {**program(d), "update_outputs": outputs[d]} | ({"offloaded_state": brought[d]} if offload else {})
        for d in sorted(set(trained) | set(outputs))
    }


def generate_phase(
    config: Any,
    rollout: Sequence[PlannedArray],
    devices: Sequence[int],
    split: Split,
    workload: Workload,
    offload: bool,
    platform: str = "cpu",
) -> dict[int, dict[str, int]]:
    """Per rollout device, what a generate call adds: its program's temporaries on ``platform``
    (``model.memory.generate_program``: the KV cache and the prefill or a decode step) and its
    outputs, and under offload the rollout weights brought to device."""
    sampler = generate_program(
        config,
        workload.rollout_batch_size,
        workload.prompt_length,
        workload.max_tokens,
        workload.kv_cache_size,
        0,
        split,
        platform=platform,
    )
    terms = {**sampler.temporaries, "sampled": sampler.outputs}
    brought = _per_device(rollout, "pinned_host")
    return {d: terms | ({"offloaded_state": brought[d]} if offload else {}) for d in devices}


def budgets(
    entries: Mapping[str, Sequence[PlannedArray]],
    phases: Mapping[str, Mapping[int, Mapping[str, int]]],
    sync: Mapping[str, Any],
    topo: Topology,
) -> tuple[tuple[DeviceBudget, ...], tuple[HostBudget, ...]]:
    """Every device's and every host's budget on ``topo`` from the planned arrays and the phases."""
    host_of, memory_per_device = topo.host_of(), topo.memory_per_device
    names = [n for n in MEMORY_ENTRIES if n in entries]
    rows = shard_rows([entries[n] for n in names])
    span = 1 + max(int(rows["device"].max(initial=0)), max(host_of, default=0))
    host = np.zeros(span, dtype=np.int64)
    host[list(host_of)] = list(host_of.values())
    hosts = int(host.max(initial=0)) + 1

    def table(sel: np.ndarray, at: np.ndarray, size: int) -> np.ndarray:
        """Bytes of the selected rows by (``at`` index, entry, memory kind)."""
        out = np.zeros((size, len(names), len(KINDS)), dtype=np.int64)
        np.add.at(out, (at[sel], rows["entry"][sel], rows["kind"][sel]), rows["bytes"][sel])
        return out

    # Rows are in report order, so a buffer's first row is its first holder's.
    held = table(distinct_buffers(rows), rows["device"], span)
    held_by_host = np.zeros((hosts, *held.shape[1:]), dtype=np.int64)
    np.add.at(held_by_host, host, held)
    # Per entry, its own buffers (a buffer another entry also holds counts for both).
    own = table(distinct_buffers(rows, per_entry=True), host[rows["device"]], hosts)

    def kinds(row: np.ndarray) -> dict[str, int]:
        return {KINDS[k]: int(v) for k, v in enumerate(row) if v}

    kind_device = KINDS.index("device")
    resident = {d: {names[e]: int(n) for e, n in enumerate(held[d, :, kind_device]) if n} for d in sorted(host_of)}
    host_ram = held_by_host.sum(axis=2) - held_by_host[:, :, kind_device]
    host_resident = {h: {names[e]: int(n) for e, n in enumerate(host_ram[h]) if n} for h in range(hosts)}
    by_role = {h: {names[e]: kinds(own[h, e]) for e in range(len(names)) if own[h, e].any()} for h in range(hosts)}
    by_kind = {h: kinds(held_by_host[h].sum(axis=0)) for h in range(hosts)}
    phase_terms: dict[int, dict[str, dict[str, int]]] = {d: {} for d in resident}
    for phase, by_device in phases.items():
        for d, terms in by_device.items():
            phase_terms.setdefault(d, {})[phase] = dict(terms)
    for d, terms in sync_device_terms(sync).items():
        phase_terms.setdefault(d, {})["sync"] = terms
    devices = []
    for d in sorted(phase_terms):
        res = resident.get(d, {})
        ph = {p: phase_terms[d][p] for p in PHASES if p in phase_terms[d]}
        top = max(ph, key=lambda p: sum(ph[p].values()), default=None)
        peak = sum(res.values()) + (sum(ph[top].values()) if top is not None else 0)
        fits = None if memory_per_device is None else peak <= memory_per_device
        devices.append(DeviceBudget(d, host_of.get(d, 0), res, ph, peak, top, memory_per_device, fits))
    return tuple(devices), _hosts(devices, host_resident, by_role, by_kind, sync, topo)


def _hosts(
    devices: Sequence[DeviceBudget],
    host_resident: Mapping[int, Mapping[str, int]],
    by_role: Mapping[int, Mapping[str, Mapping[str, int]]],
    by_kind: Mapping[int, Mapping[str, int]],
    sync: Mapping[str, Any],
    topo: Topology,
) -> tuple[HostBudget, ...]:
    pinned_peak = {int(d): int(k.get("pinned_host", 0)) for d, k in sync["transient_peak"]["by_device"].items()}
    out = []
    for h, ids in enumerate(topo.hosts()):
        mine = [b for b in devices if b.host == h]
        ram_resident: Counter = Counter(host_resident.get(h, {}))
        phase_ram: dict[str, Counter] = {}
        if new_pinned := sum(pinned_peak.get(d, 0) for d in ids):
            phase_ram["sync"] = Counter(sync_new_pinned=new_pinned)
        if topo.platform == "cpu":  # a CPU device's memory is this host's RAM
            for b in mine:
                ram_resident.update({f"device:{name}": n for name, n in b.resident.items()})
            for phase in PHASES:
                extra: Counter = Counter()
                for b in mine:
                    extra.update({f"device:{t}": n for t, n in b.phases.get(phase, {}).items()})
                if extra:
                    phase_ram.setdefault(phase, Counter()).update(extra)
        top = max(phase_ram, key=lambda p: sum(phase_ram[p].values()), default=None)
        ram = {k: v for k, v in {**ram_resident, **(phase_ram[top] if top else {})}.items() if v}
        total = sum(ram.values())
        moved = sync.get("by_host", {}).get(str(h), {})
        out.append(
            HostBudget(
                h,
                tuple(sorted(ids)),
                dict(by_role.get(h, {})),
                dict(by_kind.get(h, {})),
                ram,
                total,
                top,
                topo.host_memory,
                None if topo.host_memory is None else total <= topo.host_memory,
                max((b.peak_bytes for b in mine), default=0),
                int(moved.get("cross_host_bytes", 0)),
                int(moved.get("within_host_bytes", 0)),
            )
        )
    return tuple(out)


def gib(n: int | float | None) -> str:
    """Bytes as GiB, one decimal ("-" for unknown)."""
    return "-" if n is None else f"{n / (1 << 30):,.1f} GiB"


def _terms_text(terms: Mapping[str, int], top: int = 4) -> str:
    ranked = sorted(((v, k) for k, v in terms.items() if v), reverse=True)
    text = ", ".join(f"{k.replace('_', ' ')} {gib(v)}" for v, k in ranked[:top])
    return text + (f" (+ {len(ranked) - top} smaller)" if len(ranked) > top else "")


def verdict(
    roles: Mapping[str, Mapping[str, Any]],
    devices: Sequence[DeviceBudget],
    hosts: Sequence[HostBudget],
    topo: Topology,
) -> dict[str, Any]:
    """Whether everything fits on ``topo``, the worst device and host, and why not."""
    memory_per_device, host_memory = topo.memory_per_device, topo.host_memory
    worst_device = max(devices, key=lambda b: b.peak_bytes, default=None)
    worst_host = max(hosts, key=lambda h: h.ram_bytes, default=None)
    reasons = []
    over = [b for b in devices if b.fits is False]
    if over:
        b = max(over, key=lambda b: b.peak_bytes - (b.memory or 0))
        where = f"during {b.peak_phase.replace('_', ' ')}" if b.peak_phase else "at rest"
        reasons.append(
            f"device {b.device} (host {b.host}) needs {gib(b.peak_bytes)} {where}, over its "
            f"{gib(memory_per_device or 0)}: {_terms_text(b.terms_at_peak())}"
            + (f"; {len(over)} of {len(devices)} devices are over" if len(over) > 1 else "")
        )
    for role, v in roles.items():
        if v.get("fits") is False:
            reasons.append(
                f"the {role} alone holds {gib(v['max_device_bytes'])} on its busiest device, over "
                f"{gib(memory_per_device or 0)}"
            )
    hosts_over = [h for h in hosts if h.fits is False]
    if hosts_over:
        h = max(hosts_over, key=lambda h: h.ram_bytes)
        reasons.append(
            f"host {h.host} needs {gib(h.ram_bytes)} of RAM"
            + (f" during {h.ram_phase.replace('_', ' ')}" if h.ram_phase else "")
            + f", over its {gib(host_memory or 0)}: {_terms_text(h.ram)}"
        )
    known = memory_per_device is not None
    devices_fit = None if not known else not over and all(v.get("fits") is not False for v in roles.values())
    hosts_fit = None if host_memory is None else not hosts_over
    all_fit = None if devices_fit is None else devices_fit and hosts_fit is not False
    return {
        "peak": {
            "max_device_bytes": 0 if worst_device is None else worst_device.peak_bytes,
            "device": None if worst_device is None else worst_device.device,
            "host": None if worst_device is None else worst_device.host,
            "phase": None if worst_device is None else worst_device.peak_phase,
            "terms": {} if worst_device is None else worst_device.terms_at_peak(),
            "fits": devices_fit,
        },
        "hosts": {
            "max_host_bytes": 0 if worst_host is None else worst_host.ram_bytes,
            "host": None if worst_host is None else worst_host.host,
            "host_memory": host_memory,
            "fits": hosts_fit,
        },
        "all_fit": all_fit,
        "reason": "; ".join(reasons) if reasons else None,
        "rule": "everything fits when every device's peak (its resident bytes, each buffer once, plus the "
        "largest phase of a step: generate's KV cache, an update's gradients, activations and outputs, a sync's "
        "new buffers) is at most the memory per device, every role fits one device (an offloaded role comes to "
        "device for its operation), and every host's RAM peak is at most the host memory (when known)",
    }
