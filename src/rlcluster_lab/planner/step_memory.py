"""What one RL step holds beside the resident state (L4): activations, gradients, the
training step's outputs and the rollout's KV cache, from the model's dimensions.

The formulas count the lab's own model and training step, each term named (``FORMULAS``
and the comments), so it can be checked. Activations (``activation_bytes``) are the
residuals ``jax.vjp`` keeps for one micro-batch's backward pass; the tests hold every term
to ``jax.ad_checkpoint.print_saved_residuals`` of the real loss. XLA keeps about as much
(its temporaries were 0.89x-1.39x of activations plus gradients for the lab's steps; the
tests bound the ratio). With ``remat=True`` (``jax.checkpoint`` per block, Chen et al.
2016) each layer keeps only its input and one layer is recomputed at a time; the lab's
step does not rematerialise.

Per device, rows split over the axes no tensor uses (data parallelism), heads, MLP units
and the vocabulary over the axes the role's rules give them (tensor parallelism), the
residual stream whole on every device (Korthikanti et al. 2022, without sequence
parallelism). Gradients (one per trainable parameter, plus a float32 running sum when
accumulating) and update outputs (the step does not donate, so new parameters and
optimizer state sit beside the old) are in ``planner.budget``. The KV cache is in the
model config's dtype, even where the rollout weights are cast.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from rlcluster_lab.core.model_config import ModelConfig
from rlcluster_lab.planner.workload import Workload

if TYPE_CHECKING:
    from rlcluster_lab.placement.layout import PlannedMesh

F32 = 4  # float32 bytes: statistics, softmax and logits are kept in float32


@dataclasses.dataclass(frozen=True)
class Split:
    """How a mesh divides a step's tensors: the batch's rows, and heads, MLP units and
    vocabulary (each the product of the mesh axes the role's rules map it to)."""

    rows: int = 1
    q_heads: int = 1
    kv_heads: int = 1
    mlp: int = 1
    vocab: int = 1

    @classmethod
    def of(cls, mesh: PlannedMesh, rules: Any) -> Split:
        sizes = dict(mesh.shape)
        mapping = {str(k): v for k, v in rules}
        used: set[str] = set()

        def ways(name: str) -> int:
            target = mapping.get(name)
            axes = () if target is None else (target,) if isinstance(target, str) else tuple(target)
            axes = tuple(a for a in axes if a in sizes)
            used.update(axes)
            return math.prod(sizes[a] for a in axes)

        q, kv, mlp, vocab = ways("q_heads"), ways("kv_heads"), ways("mlp"), ways("vocab")
        rows = math.prod(n for a, n in sizes.items() if a not in used)
        return cls(rows=rows, q_heads=q, kv_heads=kv, mlp=mlp, vocab=vocab)


def _per(n: int, ways: int) -> int:
    """What one device holds of n things split ``ways`` ways (at least one: a head is not split)."""
    return max(1, -(-n // max(1, ways)))


def itemsize(config: ModelConfig) -> int:
    return int(np.dtype(config.dtype).itemsize)


def norm_bytes_per_token(config: ModelConfig, *, trainable_scale: bool = True) -> int:
    """One RMSNorm's residuals per token: the float32 input, the float32 normalised value
    (only where the scale trains), the output in the model's dtype, two float32 statistics."""
    e = config.embed_dim
    return F32 * e + (F32 * e if trainable_scale else 0) + itemsize(config) * e + 2 * F32


def layer_bytes_per_token(config: ModelConfig, keys: int, split: Split = Split(), lora_rank: int = 0) -> int:
    """One block's residuals per token of a row that attends over ``keys`` tokens, on one
    device. With LoRA (frozen norm scales) the normalised values are not kept; each of the
    seven adapted projections keeps its input times ``lora_a`` (rank values)."""
    p, hd = itemsize(config), config.head_dim
    per_score, per_row = softmax_residuals(config.dtype)
    heads = _per(config.num_heads, split.q_heads)
    kv = _per(config.num_kv_heads, split.kv_heads) * hd
    q = heads * hd
    mlp = _per(config.mlp_dim, split.mlp)
    return (
        2 * norm_bytes_per_token(config, trainable_scale=not lora_rank)
        + p * (2 * q + 2 * kv)  # q, attention output; k, v
        + 4 * (hd // 2) * F32  # rotary sin and cos of q and k
        + heads * (keys * per_score + per_row)  # the softmax and its probabilities (softmax_residuals)
        + 6 * p * mlp  # gate, up, three SiLU intermediates, their product
        + 7 * p * lora_rank  # x @ lora_a of q, k, v, o, gate, up, down
    )


@functools.cache
def softmax_residuals(dtype: str) -> tuple[int, int]:
    """Bytes the backward pass keeps of the attention's softmax, cast to the model's ``dtype`` and
    multiplied by the values: per score, and per row of scores. Asked of the running JAX once (the
    residuals of ``jax.vjp`` over the same three operations on a small shape), since releases keep
    different things: JAX 0.10 keeps the float32 exponentials, two float32 row statistics and the
    probabilities; JAX 0.12 the float32 softmax and the probabilities (one array where the model is
    float32)."""
    import jax
    import jax.numpy as jnp

    rows, keys, width = 3, 5, 7  # distinct, so each residual's last axis says what it is

    def attend(scores: jax.Array, values: jax.Array) -> jax.Array:
        return jax.nn.softmax(scores, axis=-1).astype(dtype) @ values

    scores, values = jnp.zeros((rows, keys), jnp.float32), jnp.zeros((keys, width), dtype)
    # The residuals as the variables of a traced program, so that one value kept for two uses counts
    # once (in a float32 model the float32 softmax is its probabilities).
    traced = jax.make_jaxpr(lambda s, v: jax.vjp(attend, s, v)[1])(scores, values)
    kept = [v.aval for v in dict.fromkeys(v for v in traced.jaxpr.outvars if hasattr(v, "aval"))]
    per_score = sum(a.dtype.itemsize for a in kept if a.shape == (rows, keys))
    per_row = sum(a.dtype.itemsize for a in kept if a.shape in ((rows, 1), (rows,)))
    return per_score, per_row


def shared_bytes_per_token(config: ModelConfig) -> int:
    """The part of ``layer_bytes_per_token`` that is the same in every layer: the rotary sin and
    cos of q and k. The layers run in one scan, which computes and keeps these once for all of
    them. (The attention mask arrives as a float32 bias added to the scores, which the backward
    pass does not need: nothing of it is kept.)"""
    return 4 * (config.head_dim // 2) * F32


# The losses' per-completion-token terms: for the actor (``training.step.grpo_sums`` and
# ``model.logps.forward_logps``) the picked token's index (int32), the pad mask (bool) and
# ten float32 values (the mask as float32, the log-softmax's normaliser, the picked log-prob,
# the ratio, three clip intermediates, two quotients and the KL's exponential); for the
# critic (``training.critic.ppo_value_sums``) the pad mask and ten float32 values.
LOSS_BYTES_PER_COMPLETION_TOKEN = 4 + 1 + 10 * F32
VALUE_LOSS_BYTES_PER_COMPLETION_TOKEN = 1 + 10 * F32
# Per row the advantage broadcast over the completion (float32); per step float32 scalars.
LOSS_BYTES_PER_ROW = F32


def head_bytes(
    config: ModelConfig,
    rows: int,
    tokens: int,
    completion: int,
    split: Split = Split(),
    *,
    lora_rank: int = 0,
    value_head: bool = False,
) -> int:
    """Residuals outside the blocks, on one device.

    Per token the final norm and the embedding's gather index; per completion token the
    logits (pad mask, float32 masked logits and log-softmax over the device's share of the
    vocabulary) and the loss's terms. With LoRA (frozen embedding, norms and head) the final
    norm keeps its float32 input and statistics, and its scale broadcast to float32 (the
    scan runs the first block as every other, so the blocks' count stands).
    ``value_head``: a critic, whose head is a scalar (no logits).
    """
    if value_head:
        per_token = norm_bytes_per_token(config) + 4
        return rows * (tokens * per_token + completion * VALUE_LOSS_BYTES_PER_COMPLETION_TOKEN) + (
            F32 * config.embed_dim + F32
        )
    vocab = _per(config.vocab_size, split.vocab)
    per_completion = vocab * (1 + 2 * F32) + LOSS_BYTES_PER_COMPLETION_TOKEN
    constant = F32 * config.embed_dim + 2 * F32
    per_token = constant if lora_rank else norm_bytes_per_token(config) + 4
    return rows * (tokens * per_token + completion * per_completion + LOSS_BYTES_PER_ROW) + constant


def activation_bytes(
    config: ModelConfig, workload: Workload, split: Split = Split(), *, lora_rank: int = 0, value_head: bool = False
) -> dict[str, int]:
    """Activations of one training micro-batch on one device, by part.

    ``lora_rank``: the actor trains LoRA adapters of that rank only. ``value_head``: a
    critic (all its parameters train; no vocabulary logits).
    """
    rows = _per(workload.train_rows, split.rows)
    tokens = workload.sequence_length
    per_token = layer_bytes_per_token(config, tokens, split, lora_rank)
    layer = per_token * rows * tokens + 2 * F32 * config.embed_dim  # + the two norm scales broadcast to float32
    head = head_bytes(config, rows, tokens, workload.max_tokens, split, lora_rank=lora_rank, value_head=value_head)
    if workload.remat:
        inputs = config.num_layers * itemsize(config) * config.embed_dim * rows * tokens
        return {"layer_inputs": inputs, "one_layer_recomputed": layer, "head": head}
    # The scan over the layer stack keeps what every layer shares once, not once per layer.
    shared = shared_bytes_per_token(config) * rows * tokens
    return {"layers": config.num_layers * layer - (config.num_layers - 1) * shared, "head": head}


def kv_cache_bytes(config: ModelConfig, rows: int, slots: int, split: Split = Split()) -> int:
    """The rollout's KV cache on one device: rows split over the data-parallel axes, kv heads over the tensor ones."""
    return config.kv_cache_bytes(_per(rows, split.rows), slots, _per(config.num_kv_heads, split.kv_heads))


def prefill_bytes(config: ModelConfig, workload: Workload, split: Split = Split()) -> dict[str, int]:
    """What the sampler's prefill holds beside the cache, on one device: the float32 logits
    at every prompt position (``model.sampling`` keeps the whole (rows, prompt, vocab) array
    and reads its last position), and one layer's attention over the cache's slots: the mask's
    float32 bias (``model.transformer.mask_bias``, one per row, shared by the heads) and per head
    float32 scores and exponentials and probabilities in the model's dtype."""
    rows = _per(workload.rollout_batch_size, split.rows)
    heads = _per(config.num_heads, split.q_heads)
    vocab = _per(config.vocab_size, split.vocab)
    prompt, slots = workload.prompt_length, workload.kv_cache_size
    return {
        "prefill_logits": rows * prompt * vocab * F32,
        "prefill_attention": rows * prompt * slots * (F32 + heads * (2 * F32 + itemsize(config))),
    }


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
    "prefill": "rows x prompt x vocab x 4 (float32 logits at every prompt position) + rows x prompt x slots x "
    "(4 + heads x (8 + p)) (one layer's attention over the cache: the mask's bias, scores, exponentials, "
    "probabilities)",
}
