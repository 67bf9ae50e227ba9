"""What the what-if planner (L4) plans for: model sizes and device topologies.

Models: the lab's sizes (``MODEL_SIZES``) and published decoders as *our* architecture
(RMSNorm, rotary positions, gated MLP, no biases) at their dimensions; details that do not
change the projections' parameter counts are not modelled. Topologies: devices, memory,
links and hosts, each figure with the document it comes from; any can be overridden.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Sequence
from typing import Any

import jax

from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.model import MODEL_SIZES, ModelConfig

GB = 10**9


@dataclasses.dataclass(frozen=True)
class Architecture:
    """A published model's dimensions as our ``ModelConfig``, and where they come from."""

    config: ModelConfig
    source: str
    note: str = ""


_LLAMA_VOCAB = (
    "embedding rows 128256 as in the released Meta-Llama-3 config.json (the "
    "128,000-token vocabulary plus 256 reserved special tokens); head size 8192/64 = 128"
)

# Dimensions as published; checkpoints ship in bfloat16, so that is the default dtype. ModelConfig's
# fields: name, vocab_size, embed_dim, num_layers, num_heads, num_kv_heads, head_dim, mlp_dim, max_seq_len.
ARCHITECTURES: dict[str, Architecture] = {
    "gemma-2b": Architecture(
        ModelConfig("gemma-2b", 256128, 2048, 18, 8, 1, 256, 16384, 8192, tie_embeddings=True, param_dtype="bfloat16"),
        source="Gemma Team, 'Gemma: Open Models Based on Gemini Research and Technology' (2024), "
        "Table 1 (2B: d_model 2048, 18 layers, 8 heads, 1 KV head, head size 256, "
        "vocab 256128, tied input/output embeddings); MLP hidden size 16384 per gate/up "
        "projection as in the released config (the table's 32768 counts both)",
        note="the released Hugging Face config trims the vocabulary to 256000 rows",
    ),
    "llama3-8b": Architecture(
        ModelConfig("llama3-8b", 128256, 4096, 32, 32, 8, 128, 14336, 8192, param_dtype="bfloat16"),
        source="Llama Team, 'The Llama 3 Herd of Models' (2024), Table 3 (8B: 32 layers, model "
        "dimension 4096, FFN dimension 14336, 32 attention heads, 8 key/value heads); " + _LLAMA_VOCAB,
    ),
    "llama3-70b": Architecture(
        ModelConfig("llama3-70b", 128256, 8192, 80, 64, 8, 128, 28672, 8192, param_dtype="bfloat16"),
        source="Llama Team, 'The Llama 3 Herd of Models' (2024), Table 3 (70B: 80 layers, model "
        "dimension 8192, FFN dimension 28672, 64 attention heads, 8 key/value heads); " + _LLAMA_VOCAB,
    ),
}


def model_names() -> list[str]:
    return list(MODEL_SIZES) + list(ARCHITECTURES)


def model_config(name: str, *, dtype: str | None = None) -> ModelConfig:
    """Our size or a published architecture by name, optionally in another parameter dtype."""
    if name in MODEL_SIZES:
        config = MODEL_SIZES[name]
    elif name in ARCHITECTURES:
        config = ARCHITECTURES[name].config
    else:
        raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(model_names())}", knobs=("model_size",))
    return config if dtype is None else dataclasses.replace(config, param_dtype=dtype)


def model_source(name: str) -> str:
    if name in ARCHITECTURES:
        arch = ARCHITECTURES[name]
        return arch.source + (f"; {arch.note}" if arch.note else "")
    return "the lab's own model size (rlcluster_lab.model.transformer.MODEL_SIZES)"


@dataclasses.dataclass(frozen=True)
class Topology:
    """Devices to plan on: their count and kind, memory per device, links, and hosts.

    ``link_bandwidth``: bytes/s one device *receives* over its device links (half a datasheet's
    bidirectional figure); ``host_link_bandwidth``: what it receives from other hosts (a GPU's
    network card; inside a TPU slice the same ICI links). A host is the devices of one process:
    ``devices_per_host`` consecutive ids, or ``host_ids`` (one per device, in ``ids()`` order);
    ``host_memory`` is its RAM. Every figure carries the document it comes from (``*_source``).
    ``xla_topology``: the slice as XLA:TPU's compile-only client names it, and its chips per host
    (``core.compile_only``), for a plan checked by XLA (``planner.xla_check``). ``on_chip_memory``:
    the bytes of temporaries a program keeps in the chip's own memory rather than in the device
    memory a program's figure counts (``model.memory.on_chip_bytes``).
    """

    name: str
    device_count: int
    device: str
    platform: str
    memory_per_device: int | None
    link_bandwidth: float | None
    memory_source: str
    bandwidth_source: str
    device_ids: tuple[int, ...] | None = None  # None: 0 .. device_count - 1
    devices_per_host: int | None = None  # None: one host holds every device (unless host_ids says otherwise)
    host_ids: tuple[int, ...] | None = None  # the host of each device, in ids() order
    host_memory: int | None = None
    host_memory_source: str = "unknown: pass host_memory"
    host_link_bandwidth: float | None = None
    host_link_source: str = "unknown: pass host_link_bandwidth"
    xla_topology: tuple[str, tuple[int, int, int]] | None = None
    on_chip_memory: int = 0
    on_chip_source: str = "none: every temporary in device memory"

    def __post_init__(self) -> None:
        per = self.devices_per_host
        if per is not None and (per < 1 or self.device_count % per):
            why = f"must divide the device count: {per} does not divide {self.device_count} ({self.name})"
            raise ConfigError(
                f"devices_per_host {why}",
                knobs=("devices_per_host",),
                problem=f"devices_per_host (--devices-per-host) {why}",
            )
        if self.host_ids is not None and len(self.host_ids) != self.device_count:
            raise ValueError(f"host_ids names {len(self.host_ids)} hosts for {self.device_count} devices ({self.name})")

    def ids(self) -> tuple[int, ...]:
        return self.device_ids if self.device_ids is not None else tuple(range(self.device_count))

    def host_of(self) -> dict[int, int]:
        """Device id -> host index (0 .. hosts - 1, in the order hosts first appear)."""
        ids = self.ids()
        if self.host_ids is not None:
            order = {h: i for i, h in enumerate(dict.fromkeys(self.host_ids))}
            return {d: order[h] for d, h in zip(ids, self.host_ids)}
        per = self.devices_per_host or len(ids)
        return {d: i // per for i, d in enumerate(ids)}

    def hosts(self) -> tuple[tuple[int, ...], ...]:
        """The device ids of each host, by host index."""
        host = self.host_of()
        return tuple(tuple(d for d in host if host[d] == h) for h in sorted(set(host.values())))

    def to_json(self) -> dict[str, Any]:
        """The fields in order, the device ids and host layout written as ``hosts``."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "device_ids":
                out["hosts"] = [list(h) for h in self.hosts()]
            elif f.name not in ("devices_per_host", "host_ids"):
                out[f.name] = getattr(self, f.name)
        return out


# Each figure with the page it is read from. A datasheet's bidirectional link figure is
# halved for what one device receives.
_H100_URL = "https://www.nvidia.com/en-us/data-center/h100/"
_H100 = (
    f"NVIDIA H100 Tensor Core GPU datasheet ({_H100_URL}), SXM5: 80GB HBM3, taken as 80e9 bytes "
    "(74.5 GiB), below the ~79.6 GiB CUDA reports usable, so 'fits' errs on the safe side"
)
_H100_LINK = f"NVIDIA H100 datasheet ({_H100_URL}), SXM5: NVLink 4 900 GB/s bidirectional per GPU; received: 450 GB/s"
_DGX_URL = (
    "https://docs.nvidia.com/dgx-basepod/reference-architecture-infrastructure-foundation-enterprise-ai/"
    "latest/core-components.html"
)
_DGX_MEMORY = f"NVIDIA DGX BasePOD reference architecture, DGX H100 ({_DGX_URL}): 2 TB of DDR5 system memory per node"
_DGX_ONE_HOST = "one node: no host-to-host traffic (for several nodes: InfiniBand NDR, see gpu-2x8)"
_DGX_IB = (
    f"NVIDIA DGX BasePOD reference architecture, DGX H100 ({_DGX_URL}): eight single-port ConnectX-7, up to "
    "400 Gb/s InfiniBand NDR each, one per GPU for the compute fabric; received per GPU: 400 Gb/s = 50 GB/s"
)
_V5E_URL = "https://cloud.google.com/tpu/docs/v5e"
_V5E = f"Cloud TPU docs, TPU v5e ({_V5E_URL}): HBM2 capacity 16 GB per chip, taken as 16e9 bytes (the lower reading)"
_V5E_LINK = (
    f"Cloud TPU docs, TPU v5e ({_V5E_URL}): bidirectional ICI bandwidth 400 GBps per chip (1,600 Gbps); "
    "received: 200 GB/s"
)
_V5E_HOST = (
    f"Cloud TPU docs, TPU v5e ({_V5E_URL}): 8-chip VM ct5lp-hightpu-8t, 384 GB RAM per VM (the spec table's "
    "'DRAM per host 512 GiB' is the larger reading); a 2x4 slice is one host"
)
_V5E_HOST_LINK = (
    f"Cloud TPU docs, TPU v5e ({_V5E_URL}): one host, no host-to-host traffic; between slices the data-center "
    "network is 2 x 100 Gbps NICs per host (multislice, not planned here)"
)
_V5P_URL = "https://cloud.google.com/tpu/docs/v5p"
_V5P = (
    f"Cloud TPU docs, TPU v5p ({_V5P_URL}): HBM2e capacity 95 GB per chip (95 GiB in the docs' spec table), "
    "taken as 95e9 bytes (the lower reading)"
)
_V5P_LINK = (
    f"Cloud TPU docs, TPU v5p ({_V5P_URL}): bidirectional ICI bandwidth 1,200 GBps per chip (4,800 Gbps); "
    "received: 600 GB/s"
)
_V5P_HOST = f"Cloud TPU docs, TPU v5p ({_V5P_URL}): a VM (host) holds 4 chips and 448 GB of RAM"
_V5P_HOST_LINK = (
    f"Cloud TPU docs, TPU v5p ({_V5P_URL}): inside one slice the chips of different hosts are joined by ICI, "
    "so host-to-host bytes travel at the ICI rate (600 GB/s received); the data-center network (50 Gbps per "
    "chip) joins slices (multislice, not planned here)"
)


_ON_CHIP = (
    "measured: the largest allocation in the vector memory (VMEM) that XLA:TPU's buffer assignment made for the "
    "lab's step programs compiled for a {chip} slice ({slice}; llama3-8b and the large preset; libtpu 0.0.42.1, "
    "2026-12-07): {n} bytes; a program whose temporaries fit there keeps none in HBM"
)


def _gpu(name: str, nodes: int) -> Topology:
    return Topology(
        name,
        8 * nodes,
        f"{nodes}x HGX node of 8 NVIDIA H100 SXM5 80GB" if nodes > 1 else "8x NVIDIA H100 SXM5 80GB (one HGX node)",
        "gpu",
        80 * GB,
        450e9,
        _H100,
        _H100_LINK,
        devices_per_host=8,
        host_memory=2000 * GB,
        host_memory_source=_DGX_MEMORY,
        host_link_bandwidth=50e9,
        host_link_source=_DGX_IB if nodes > 1 else _DGX_ONE_HOST + "; " + _DGX_IB,
    )


def _v5p(chips: int, grid: str) -> Topology:
    return Topology(
        f"tpu-v5p-{chips}",
        chips,
        f"TPU v5p slice of {chips} chips ({chips // 4} hosts of 4)",
        "tpu",
        95 * GB,
        600e9,
        _V5P,
        _V5P_LINK,
        devices_per_host=4,
        host_memory=448 * GB,
        host_memory_source=_V5P_HOST,
        host_link_bandwidth=600e9,
        host_link_source=_V5P_HOST_LINK,
        xla_topology=(f"v5p:{grid}", (2, 2, 1)),
        on_chip_memory=50_266_112,
        on_chip_source=_ON_CHIP.format(chip="v5p", slice="v5p:4x4x4", n="50,266,112"),
    )


TOPOLOGIES: dict[str, Topology] = {
    "gpu-8": _gpu("gpu-8", 1),
    "gpu-2x8": _gpu("gpu-2x8", 2),
    "tpu-v5e-8": Topology(
        "tpu-v5e-8",
        8,
        "TPU v5e slice of 8 chips (one host)",
        "tpu",
        16 * GB,
        200e9,
        _V5E,
        _V5E_LINK,
        devices_per_host=8,
        host_memory=384 * GB,
        host_memory_source=_V5E_HOST,
        host_link_bandwidth=200e9,
        host_link_source=_V5E_HOST_LINK,
        xla_topology=("v5e:2x4", (2, 4, 1)),
        on_chip_memory=117_440_512,
        on_chip_source=_ON_CHIP.format(chip="v5e", slice="v5e:2x4", n="117,440,512"),
    ),
    "tpu-v5p-8": _v5p(8, "2x2x2"),
    "tpu-v5p-64": _v5p(64, "4x4x4"),
    "tpu-v5p-256": _v5p(256, "4x8x8"),
}


def topology_names() -> list[str]:
    return ["local"] + list(TOPOLOGIES)


def local_topology(devices: Sequence[Any] | None = None) -> Topology:
    """This machine's devices as a topology, by their real ids (on CPU: the simulated devices):
    ``devices``, the ones a cluster is built on (a notebook's ``lab.devices``), or else JAX's
    default devices (``jax.devices()``, what ``build_cluster`` builds on by default).

    A plan of "this machine" must be of the devices the lab builds on: beside a single chip
    the notebooks build on the simulated CPU devices, not on the default backend's chip.
    Hosts are JAX's processes (``device.process_index``): under a multi-process run every
    process sees every global device, and its own are one host.

    Raises:
        ValueError: ``devices`` is empty or mixes platforms (a topology is of one platform).
    """
    devices = list(jax.devices() if devices is None else devices)
    platforms = sorted({d.platform for d in devices})
    if len(platforms) != 1:
        raise ValueError(
            f"the local topology is of one platform's devices, got {len(devices)} device(s) of "
            f"{', '.join(platforms) or 'no platform'}: pass the devices one cluster is built on (lab.devices)"
        )
    platform = platforms[0]
    # Read from a device of this process: under a multi-process run the others are not addressable.
    me = jax.process_index()
    mine = next((d for d in devices if d.process_index == me), None) or jax.local_devices(backend=platform)[0]
    stats = mine.memory_stats() if hasattr(mine, "memory_stats") else None
    limit = int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None
    try:
        ram = int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not every system names these
        ram = None
    return Topology(
        name="local",
        device_count=len(devices),
        device=f"{len(devices)}x {devices[0].device_kind} ({platform})",
        platform=platform,
        memory_per_device=limit,
        link_bandwidth=None,
        memory_source="device.memory_stats()['bytes_limit']"
        if limit is not None
        else "unknown: this backend reports no memory limit (CPU); pass memory_per_device",
        bandwidth_source="unknown for this machine; pass link_bandwidth",
        device_ids=tuple(int(d.id) for d in devices),
        host_ids=tuple(int(d.process_index) for d in devices),
        host_memory=ram,
        host_memory_source="this machine's physical memory (os.sysconf); processes on one machine share it"
        if ram is not None
        else "unknown on this system; pass host_memory",
        host_link_source="unknown for this machine; pass host_link_bandwidth",
    )


def topology(name: str) -> Topology:
    """A topology by name (``topology_names()``)."""
    if name == "local":
        return local_topology()
    if name not in TOPOLOGIES:
        raise ConfigError(
            f"unknown topology {name!r}; choose one of {', '.join(topology_names())}", knobs=("topology",)
        )
    return TOPOLOGIES[name]


def with_figures(
    topo: Topology,
    *,
    memory_per_device: int | None = None,
    link_bandwidth: float | None = None,
    devices_per_host: int | None = None,
    host_memory: int | None = None,
    host_link_bandwidth: float | None = None,
) -> Topology:
    """``topo`` with the figures given (None keeps the topology's; the source of one given reads
    "given"); each must be positive."""
    changes: dict[str, Any] = {}
    for field, value, source, cast in (
        ("memory_per_device", memory_per_device, "memory_source", int),
        ("link_bandwidth", link_bandwidth, "bandwidth_source", float),
        ("host_memory", host_memory, "host_memory_source", int),
        ("host_link_bandwidth", host_link_bandwidth, "host_link_source", float),
    ):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
            raise ValueError(f"{field.replace('_', ' ')} must be a positive number, got {value!r:.40}")
        changes[field] = cast(value)
        changes[source] = "given"
    if (per := devices_per_host) is not None:
        if isinstance(per, bool) or not isinstance(per, numbers.Integral) or per < 1:
            raise ValueError(f"devices per host must be a positive int, got {per!r}")
        changes["devices_per_host"] = int(per)
        changes["host_ids"] = None  # consecutive ids, devices_per_host to a host
    return dataclasses.replace(topo, **changes) if changes else topo
