"""What one RL step holds beside the resident state (L4), for a planned workload: activations
and the rollout's KV cache, from the model's dimensions.

The formulas are ``model.memory``'s, the ones the check before every compiled batch program
reads too (``model.fits``), so a plan and a refusal give the same figure; this module sizes
them by a ``Workload`` (its micro-batch, its rows and lengths). Each term is named
(``FORMULAS``). Gradients (one per trainable parameter, plus a float32 running sum when
accumulating) and update outputs (the step does not donate, so new parameters and optimizer
state sit beside the old) are in ``planner.budget``. The KV cache is in the model config's
dtype, even where the rollout weights are cast.
"""

from __future__ import annotations

from rlcluster_lab.core.model_config import ModelConfig
from rlcluster_lab.model.memory import (
    Split,
    kv_cache_bytes,
    residual_bytes,
    shared_bytes_per_token,
)
from rlcluster_lab.planner.workload import Workload

__all__ = ["FORMULAS", "Split", "Workload", "activation_bytes", "kv_cache_bytes"]
__all__ += ["shared_bytes_per_token"]

WHOLE = Split()  # nothing split: one device holds every head, unit and token


def activation_bytes(
    config: ModelConfig, workload: Workload, split: Split = WHOLE, *, lora_rank: int = 0, value_head: bool = False
) -> dict[str, int]:
    """Activations of one training micro-batch of ``workload`` on one device, by part
    (``model.memory.residual_bytes``).

    ``lora_rank``: the actor trains LoRA adapters of that rank only. ``value_head``: a
    critic (all its parameters train; no vocabulary logits).
    """
    return residual_bytes(
        config,
        workload.train_rows,
        workload.sequence_length,
        workload.max_tokens,
        split,
        lora_rank=lora_rank,
        value_head=value_head,
        remat=workload.remat,
    )


FORMULAS = {
    "activations": "per layer per token: 2 x (8e + p e + 8) [two RMSNorms] + p (2q + 2kv) + 8 head_dim [rotary] "
    "+ heads x (T s + r) [the softmax and its probabilities: s bytes a score, r a row, as the running JAX keeps "
    "them; JAX 0.10: s = 4 + p, r = 8] + 6 p m [gated MLP]; "
    "x layers x rows x T, the rotary terms counted once (the layers run in one scan), "
    "plus per token the final norm and gather index, and per completion token "
    "9 x vocab bytes of logits and 45 bytes of loss terms (p: parameter bytes; T: prompt + completion)",
    "activations_remat": "layers x p e per token (each block's input) + one block's activations + the head",
    "gradients": "one per trainable parameter, its sharding and dtype (+ a float32 running sum when accumulating)",
    "update_outputs": "the step's new trainable parameters and optimizer state, written beside the old ones "
    "(the lab's step does not donate its inputs)",
    "kv_cache": "2 x layers x kv_heads x head_dim x slots x rows x itemsize (the model config's dtype)",
    "layer_in_flight": "one layer of the forward pass beside the stacks: rows x T x (p e [hidden] + 4 S [mask bias] + "
    "4 head_dim [rotary]) + the larger of the attention (rows x heads x T x S x 4, twice on XLA:CPU [scores, with "
    "the bias]; rows x S x p kv [keys or values]; one layer's weights) and the MLP (rows x T x p m, 3 times on "
    "XLA:CPU, 2 elsewhere, 2 more with LoRA [the adapters' products]; p m e [its down projection])",
    "generate": "the KV cache, then the larger of the prefill (layer_in_flight over the prompt, S the slots) and "
    "a decode step (the new cache its layer scan writes beside the old, 4 copies of one layer's keys or values and "
    "one layer's weights)",
    "train_step": "the larger of the forward pass's end (activations + gradients + layer_in_flight) and the update "
    "(gradients + the new optimizer state beside the old)",
}
