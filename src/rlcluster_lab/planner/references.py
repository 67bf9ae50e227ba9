"""Published memory figures the planner's formulas are held to (L4), with their sources.

The tests plan the same case and compare where the assumptions match ours: parameters and
gradients in one dtype, ``optax.adam`` moments in that dtype, no float32 master copy. So a
float32 run holds 4 + 4 + 8 = 16 bytes per trained parameter (ZeRO's mixed precision Adam:
2 + 2 + 12) and a bfloat16 run 2 + 2 + 4 = 8.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PublishedFigure:
    """A figure from a paper or a framework's documentation, and what it assumes."""

    name: str
    value: float
    unit: str
    what: str
    assumptions: str
    source: str
    composition: tuple[tuple[str, float], ...] = ()  # its parts, where the source gives them


PUBLISHED: tuple[PublishedFigure, ...] = (
    PublishedFigure(
        "zero_mixed_precision_adam",
        16,
        "bytes per parameter",
        "model states of mixed-precision Adam training: fp16 parameters and gradients, fp32 master "
        "weights, momentum and variance (K = 12)",
        "mixed precision with an fp32 master copy; activations not included",
        "Rajbhandari et al. 2020, 'ZeRO: Memory Optimizations Toward Training Trillion Parameter Models', "
        "section 3.1 (https://arxiv.org/abs/1910.02054)",
        (("parameters", 2), ("gradients", 2), ("optimizer", 12)),
    ),
    PublishedFigure(
        "hf_fp32_adamw",
        16,
        "bytes per parameter",
        "fp32 training with AdamW: weights 4, gradients 4, optimizer states 8 bytes per parameter",
        "fp32 parameters and gradients, AdamW's two fp32 states; activations not included",
        "Hugging Face Transformers documentation, 'GPU memory usage' "
        "(https://huggingface.co/docs/transformers/model_memory_anatomy)",
        (("parameters", 4), ("gradients", 4), ("optimizer", 8)),
    ),
    PublishedFigure(
        "d2l_llama3_8b_fp32",
        128e9,
        "bytes",
        "Llama 3 8B in fp32: weights 32 GB, and with a gradient and Adam's two states per parameter "
        "four times as much, 128 GB, before a single example",
        "8 billion parameters (rounded), fp32, Adam; activations not included",
        "Zhang et al., 'Dive into Deep Learning', section 5.2 'Parameters, State, and Memory' "
        "(https://d2l.ai/chapter_builders-guide/parameters-state-memory.html)",
    ),
    PublishedFigure(
        "llamafactory_full_pure_bf16",
        8,
        "GB per billion parameters",
        "estimated GPU memory of full fine-tuning in pure bf16: 8x GB for an x-billion-parameter model "
        "(7B: 60 GB, 70B: 600 GB)",
        "parameters, gradients and Adam's states all in bf16 (no fp32 copy); the table's estimate",
        "LLaMA-Factory README, 'Hardware Requirement' table, row 'Full (pure_bf16)' "
        "(https://github.com/hiyouga/LLaMA-Factory#hardware-requirement)",
    ),
    PublishedFigure(
        "llamafactory_lora_16bit",
        2,
        "GB per billion parameters",
        "estimated GPU memory of LoRA / freeze tuning in 16 bits: 2x GB for an x-billion-parameter model",
        "a frozen bf16 base (2 bytes per parameter) and small adapters; the table's estimate",
        "LLaMA-Factory README, 'Hardware Requirement' table, row 'Freeze/LoRA/GaLore/APOLLO/BAdam' "
        "(https://github.com/hiyouga/LLaMA-Factory#hardware-requirement)",
    ),
)
