"""Our own small language model: the transformer, its LoRA adapters, initialisation without
compiling, log-probabilities, a byte tokenizer, KV-cache sampling, reward and value models,
and checkpoints (so a role can be given as a path). Nothing is downloaded."""

from rlcluster_lab.model.init import abstract_model, host_values, init_model, materialize
from rlcluster_lab.model.logps import forward_logps, logps_from_state, mask_pad_logits
from rlcluster_lab.model.lora import LoRALinear, is_lora, with_lora
from rlcluster_lab.model.transformer import (
    DEFAULT_LOGICAL_AXIS_RULES,
    MESH_AXES,
    MODEL_SIZES,
    KVCache,
    ModelConfig,
    TransformerLM,
    apply_rope,
    get_model_config,
    init_cache,
)

__all__ = [
    "DEFAULT_LOGICAL_AXIS_RULES",
    "KVCache",
    "LoRALinear",
    "MESH_AXES",
    "MODEL_SIZES",
    "ModelConfig",
    "TransformerLM",
    "abstract_model",
    "apply_rope",
    "forward_logps",
    "get_model_config",
    "host_values",
    "init_cache",
    "init_model",
    "is_lora",
    "logps_from_state",
    "mask_pad_logits",
    "materialize",
    "with_lora",
]
