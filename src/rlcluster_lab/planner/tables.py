"""What the what-if planner (L4) plans for: model sizes and device topologies.

Models: the lab's own sizes (``MODEL_SIZES``) and a table of published
decoder architectures expressed as our ``ModelConfig``. A table entry is *our*
architecture (RMSNorm, rotary positions, gated MLP, no biases) at the published
dimensions, so its parameter tree is the one the lab would build at that size;
details of the original that do not change the parameter count of the
projections (activation, norm offsets, rope scaling, soft-capping) are not
modelled.

Topologies: device count, memory per device and link bandwidth, each with the
document it comes from. Every figure can be overridden per plan.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

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

# Dimensions as published; checkpoints ship in bfloat16, so that is the default dtype.
ARCHITECTURES: dict[str, Architecture] = {
    "gemma-2b": Architecture(
        ModelConfig(
            "gemma-2b",
            vocab_size=256128,
            embed_dim=2048,
            num_layers=18,
            num_heads=8,
            num_kv_heads=1,
            head_dim=256,
            mlp_dim=16384,
            max_seq_len=8192,
            tie_embeddings=True,
            param_dtype="bfloat16",
        ),
        source="Gemma Team, 'Gemma: Open Models Based on Gemini Research and Technology' (2024), "
        "Table 1 (2B: d_model 2048, 18 layers, 8 heads, 1 KV head, head size 256, "
        "vocab 256128, tied input/output embeddings); MLP hidden size 16384 per gate/up "
        "projection as in the released config (the table's 32768 counts both)",
        note="the released Hugging Face config trims the vocabulary to 256000 rows",
    ),
    "llama3-8b": Architecture(
        ModelConfig(
            "llama3-8b",
            vocab_size=128256,
            embed_dim=4096,
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            mlp_dim=14336,
            max_seq_len=8192,
            param_dtype="bfloat16",
        ),
        source="Llama Team, 'The Llama 3 Herd of Models' (2024), Table 3 (8B: 32 layers, model "
        "dimension 4096, FFN dimension 14336, 32 attention heads, 8 key/value heads); " + _LLAMA_VOCAB,
    ),
    "llama3-70b": Architecture(
        ModelConfig(
            "llama3-70b",
            vocab_size=128256,
            embed_dim=8192,
            num_layers=80,
            num_heads=64,
            num_kv_heads=8,
            head_dim=128,
            mlp_dim=28672,
            max_seq_len=8192,
            param_dtype="bfloat16",
        ),
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
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(model_names())}")
    return config if dtype is None else dataclasses.replace(config, param_dtype=dtype)


def model_source(name: str) -> str:
    if name in ARCHITECTURES:
        arch = ARCHITECTURES[name]
        return arch.source + (f"; {arch.note}" if arch.note else "")
    return "the lab's own model size (rlcluster_lab.model.transformer.MODEL_SIZES)"


@dataclasses.dataclass(frozen=True)
class Topology:
    """Devices to plan on: their count and kind, memory per device, link bandwidth.

    ``link_bandwidth`` is the rate at which one device can *receive* over its
    device-to-device links (bytes/s): half a datasheet's bidirectional figure.
    ``platform`` picks the resharding behaviour the plan reproduces (on CPU the
    lab reshards shard by shard and reuses a shard already in place; elsewhere
    JAX's device_put reuses buffers only when the whole layout is equivalent).
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

    def ids(self) -> tuple[int, ...]:
        return self.device_ids if self.device_ids is not None else tuple(range(self.device_count))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "device_count": self.device_count,
            "device": self.device,
            "platform": self.platform,
            "memory_per_device": self.memory_per_device,
            "link_bandwidth": self.link_bandwidth,
            "memory_source": self.memory_source,
            "bandwidth_source": self.bandwidth_source,
        }


_H100 = (
    "NVIDIA H100 Tensor Core GPU datasheet, SXM5: 80GB HBM3, taken as 80e9 bytes (74.5 GiB), "
    "below the ~79.6 GiB CUDA reports usable, so 'fits' errs on the safe side"
)
_H100_LINK = "NVIDIA H100 datasheet, SXM5: NVLink 900 GB/s bidirectional per GPU; received: 450 GB/s"
_V5E = "Cloud TPU docs, TPU v5e: HBM2 capacity 16 GB per chip, taken as 16e9 bytes (the lower reading)"
_V5E_LINK = "Cloud TPU docs, TPU v5e: bidirectional ICI bandwidth 400 GBps per chip (1,600 Gbps); received: 200 GB/s"
_V5P = (
    "Cloud TPU docs, TPU v5p: HBM2e capacity 95 GB per chip (95 GiB in the docs' spec table), "
    "taken as 95e9 bytes (the lower reading)"
)
_V5P_LINK = "Cloud TPU docs, TPU v5p: bidirectional ICI bandwidth 1,200 GBps per chip (4,800 Gbps); received: 600 GB/s"

TOPOLOGIES: dict[str, Topology] = {
    "gpu-8": Topology("gpu-8", 8, "8x NVIDIA H100 SXM5 80GB (one HGX node)", "gpu", 80 * GB, 450e9, _H100, _H100_LINK),
    "tpu-v5e-8": Topology("tpu-v5e-8", 8, "TPU v5e slice of 8 chips", "tpu", 16 * GB, 200e9, _V5E, _V5E_LINK),
    "tpu-v5p-8": Topology("tpu-v5p-8", 8, "TPU v5p slice of 8 chips", "tpu", 95 * GB, 600e9, _V5P, _V5P_LINK),
    "tpu-v5p-64": Topology("tpu-v5p-64", 64, "TPU v5p slice of 64 chips", "tpu", 95 * GB, 600e9, _V5P, _V5P_LINK),
    "tpu-v5p-256": Topology("tpu-v5p-256", 256, "TPU v5p slice of 256 chips", "tpu", 95 * GB, 600e9, _V5P, _V5P_LINK),
}


def topology_names() -> list[str]:
    return ["local"] + list(TOPOLOGIES)


def local_topology() -> Topology:
    """This process's devices, by their real ids (on CPU: the simulated devices)."""
    devices = jax.devices()
    stats = devices[0].memory_stats() if hasattr(devices[0], "memory_stats") else None
    limit = int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None
    platform = devices[0].platform
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
    )


def topology(name: str, *, memory_per_device: int | None = None, link_bandwidth: float | None = None) -> Topology:
    """A topology by name, with its memory and bandwidth optionally overridden."""
    if name == "local":
        topo = local_topology()
    elif name in TOPOLOGIES:
        topo = TOPOLOGIES[name]
    else:
        raise ValueError(f"unknown topology {name!r}; choose one of {', '.join(topology_names())}")
    if memory_per_device is not None:
        if memory_per_device <= 0:
            raise ValueError(f"memory per device must be positive, got {memory_per_device}")
        topo = dataclasses.replace(topo, memory_per_device=int(memory_per_device), memory_source="given")
    if link_bandwidth is not None:
        if link_bandwidth <= 0:
            raise ValueError(f"link bandwidth must be positive, got {link_bandwidth}")
        topo = dataclasses.replace(topo, link_bandwidth=float(link_bandwidth), bandwidth_source="given")
    return topo
