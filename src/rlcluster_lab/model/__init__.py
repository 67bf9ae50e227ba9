"""Our own small language model: the transformer, its LoRA adapters, initialisation without
compiling, log-probabilities, a byte tokenizer, KV-cache sampling, reward and value models,
and checkpoints (so a role can be given as a path). Nothing is downloaded."""

from rlcluster_lab.model.init import abstract_model, init_model, materialize
from rlcluster_lab.model.logps import forward_logps, logps_from_state, mask_pad_logits
from rlcluster_lab.model.lora import LoRALinear, is_lora, with_lora
from rlcluster_lab.model.transformer import (
    MODEL_SIZES,
    KVCache,
    ModelConfig,
    TransformerLM,
    apply_rope,
    get_model_config,
    init_cache,
)
from rlcluster_lab.model.values import initial_values

__all__ = [
    "KVCache",
    "LoRALinear",
    "MODEL_SIZES",
    "ModelConfig",
    "TransformerLM",
    "abstract_model",
    "apply_rope",
    "forward_logps",
    "get_model_config",
    "initial_values",
    "init_cache",
    "init_model",
    "is_lora",
    "logps_from_state",
    "mask_pad_logits",
    "materialize",
    "with_lora",
]
