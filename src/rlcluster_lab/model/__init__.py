"""Our own small language model: the transformer, its LoRA adapters, initialisation without
compiling, log-probabilities, a byte tokenizer, KV-cache sampling, reward and value models,
and checkpoints (so a role can be given as a path). Nothing is downloaded."""

from rlcluster_lab.model.init import abstract_model, init_model
from rlcluster_lab.model.logps import forward_logps, logps_from_state
from rlcluster_lab.model.lora import LoRALinear, is_lora, with_lora
from rlcluster_lab.model.transformer import MODEL_SIZES, ModelConfig, TransformerLM, get_model_config, init_cache

__all__ = [
    "LoRALinear",
    "MODEL_SIZES",
    "ModelConfig",
    "TransformerLM",
    "abstract_model",
    "forward_logps",
    "get_model_config",
    "init_cache",
    "init_model",
    "is_lora",
    "logps_from_state",
    "with_lora",
]
