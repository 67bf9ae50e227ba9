"""What one compiled program of the lab's model holds on a device, from shapes (L4).

The planner's figures (``planner.step_memory``, ``planner.budget``) and the check every
batch program passes before it is compiled (``model.fits``) both read this module, so the
figure a plan prints is the one a refusal gives. Each term is named (``FORMULAS``).

Activations (``residual_bytes``) are the residuals ``jax.vjp`` keeps for one micro-batch's
backward pass; the tests hold every term to ``jax.ad_checkpoint.print_saved_residuals`` of the
real loss. With ``remat=True`` (``jax.checkpoint`` per block, Chen et al. 2016) each layer keeps
only its input and one layer is recomputed at a time; the lab's step does not rematerialise.
Per device (``Split``): every row of the batch, heads, MLP units and the vocabulary divided over
the axes the role's rules give them (tensor parallelism), and the residual stream over the axes
the embedding dimension is divided over (its values across the layers are as the parameters'
split leaves them: XLA's sharding propagation carries it from the weights to the activations).

A program's figure (``ProgramBytes``) is what XLA's ``compiled.memory_analysis()`` counts:
its arguments, its outputs and its temporaries, less what an output shares with an argument
(the lab donates nothing: none). Arguments and outputs are exact from shapes; temporaries are
the largest set of buffers the program holds at once, at one of its points (a layer's
attention or MLP, the logits, a decode step, the optimizer update), each buffer counted from
the shapes, which buffers are live at once read from XLA's buffer assignment of the lab's own
programs (XLA:CPU at the lab's compile options; XLA:TPU for a v5e chip, compiled here without
one). XLA:CPU computes each elementwise step into a buffer of its own (``UNFUSED``); XLA:TPU
and XLA:GPU fuse them into the products around them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlcluster_lab.core.model_config import ModelConfig

F32 = 4  # float32 bytes: statistics, softmax, scores and logits are kept in float32
UNFUSED = ("cpu",)  # platforms whose XLA writes each elementwise step to a buffer of its own
# Platforms whose default matmul precision multiplies float32 in one bfloat16 pass (TPUs): there XLA
# keeps what the backward pass multiplies in bfloat16, at the train step's precision (core.precision).
BF16_PRODUCTS = ("tpu",)


@dataclasses.dataclass(frozen=True)
class Split:
    """How a mesh divides a step's tensors on each device: the residual stream (``embed``), heads,
    MLP units and vocabulary, each the product of the mesh axes the role's rules map it to. The
    rows of a batch are never divided: the lab's programs take the batch as host arrays with no
    sharding, and XLA's sharding propagation, given weights divided only along their embedding,
    head, MLP and vocabulary dimensions, leaves every row on every device of the mesh (the
    buffers XLA:CPU and XLA:TPU assign for the lab's steps on fsdp x tp meshes hold every row;
    so do the arguments the live check reads, ``model.fits.split_of``)."""

    embed: int = 1
    q_heads: int = 1
    kv_heads: int = 1
    mlp: int = 1
    vocab: int = 1

    @classmethod
    def of(cls, mesh: Any, rules: Any) -> Split:
        """The split of ``mesh`` (anything with a ``shape`` mapping of axis sizes) under ``rules``."""
        sizes = dict(mesh.shape)
        mapping = {str(k): v for k, v in rules}

        def ways(name: str) -> int:
            target = mapping.get(name)
            axes = () if target is None else (target,) if isinstance(target, str) else tuple(target)
            axes = tuple(a for a in axes if a in sizes)
            return math.prod(sizes[a] for a in axes)

        q, kv, mlp, vocab = ways("q_heads"), ways("kv_heads"), ways("mlp"), ways("vocab")
        return cls(embed=ways("embed"), q_heads=q, kv_heads=kv, mlp=mlp, vocab=vocab)


def _per(n: int, ways: int) -> int:
    """What one device holds of n things split ``ways`` ways (at least one: a head is not split)."""
    return max(1, -(-n // max(1, ways)))


def itemsize(config: ModelConfig) -> int:
    return int(np.dtype(config.dtype).itemsize)


def norm_bytes_per_token(
    config: ModelConfig, *, trainable_scale: bool = True, split: Split = Split(), operands: int | None = None
) -> int:
    """One RMSNorm's residuals per token on one device: the float32 input, the float32 normalised
    value (only where the scale trains), the output (a product's operand: ``operands`` bytes, the
    model's dtype by default), over the device's share of the residual stream, and two float32
    statistics."""
    e = _per(config.embed_dim, split.embed)
    out = itemsize(config) if operands is None else operands
    return F32 * e + (F32 * e if trainable_scale else 0) + out * e + 2 * F32


def layer_bytes_per_token(
    config: ModelConfig, keys: int, split: Split = Split(), lora_rank: int = 0, operands: int | None = None
) -> int:
    """One block's residuals per token of a row that attends over ``keys`` tokens, on one
    device. With LoRA (frozen norm scales) the normalised values are not kept; each of the
    seven adapted projections keeps its input times ``lora_a`` (rank values). ``operands``: the
    bytes of what the backward pass multiplies (the norms' outputs, q, k, v, the attention's
    output and probabilities, the MLP's product, the adapters' inner values; ``operand_bytes``),
    the model's dtype by default."""
    p, hd = itemsize(config), config.head_dim
    o = p if operands is None else operands
    per_score, per_row = softmax_residuals(config.dtype)
    heads = _per(config.num_heads, split.q_heads)
    kv = _per(config.num_kv_heads, split.kv_heads) * hd
    q = heads * hd
    mlp = _per(config.mlp_dim, split.mlp)
    return (
        2 * norm_bytes_per_token(config, trainable_scale=not lora_rank, split=split, operands=o)
        + o * (2 * q + 2 * kv)  # q, attention output; k, v
        + 4 * (hd // 2) * F32  # rotary sin and cos of q and k
        + heads * (keys * (per_score - p + o) + per_row)  # the softmax, its probabilities (softmax_residuals)
        + (5 * p + o) * mlp  # gate, up, three SiLU intermediates; their product
        + 7 * o * lora_rank  # x @ lora_a of q, k, v, o, gate, up, down
    )


def operand_bytes(config: ModelConfig, platform: str) -> int:
    """The bytes of each value a train step keeps for the backward pass's products: the model's
    dtype, or bfloat16 where the platform's default precision (the train step's, core.precision)
    multiplies float32 in one bfloat16 pass (``BF16_PRODUCTS``): XLA:TPU keeps a float32 model's
    operands in bfloat16 (read from its buffer assignment of the large preset's step)."""
    return min(itemsize(config), 2) if platform in BF16_PRODUCTS else itemsize(config)


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

    scores, values = jax.ShapeDtypeStruct((rows, keys), jnp.float32), jax.ShapeDtypeStruct((keys, width), dtype)
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
        per_token = norm_bytes_per_token(config, split=split) + 4
        return rows * (tokens * per_token + completion * VALUE_LOSS_BYTES_PER_COMPLETION_TOKEN) + (
            F32 * config.embed_dim + F32
        )
    vocab = _per(config.vocab_size, split.vocab)
    per_completion = vocab * (1 + 2 * F32) + LOSS_BYTES_PER_COMPLETION_TOKEN
    constant = F32 * config.embed_dim + 2 * F32
    per_token = constant if lora_rank else norm_bytes_per_token(config, split=split) + 4
    return rows * (tokens * per_token + completion * per_completion + LOSS_BYTES_PER_ROW) + constant


def residual_bytes(
    config: ModelConfig,
    rows: int,
    tokens: int,
    completion: int,
    split: Split = Split(),
    *,
    lora_rank: int = 0,
    value_head: bool = False,
    remat: bool = False,
    operands: int | None = None,
) -> dict[str, int]:
    """Activations of one training micro-batch of ``rows`` rows of ``tokens`` tokens (the last
    ``completion`` of them scored) on one device, by part: what the backward pass reads.

    ``lora_rank``: the actor trains LoRA adapters of that rank only. ``value_head``: a critic
    (all its parameters train; no vocabulary logits). ``remat``: every layer rematerialised.
    ``operands``: the bytes of the values the backward pass multiplies (``operand_bytes``).
    """
    per_token = layer_bytes_per_token(config, tokens, split, lora_rank, operands)
    layer = per_token * rows * tokens + 2 * F32 * config.embed_dim  # + the two norm scales broadcast to float32
    head = head_bytes(config, rows, tokens, completion, split, lora_rank=lora_rank, value_head=value_head)
    if remat:
        inputs = config.num_layers * itemsize(config) * _per(config.embed_dim, split.embed) * rows * tokens
        return {"layer_inputs": inputs, "one_layer_recomputed": layer, "head": head}
    # The scan over the layer stack keeps what every layer shares once, not once per layer.
    shared = shared_bytes_per_token(config) * rows * tokens
    return {"layers": config.num_layers * layer - (config.num_layers - 1) * shared, "head": head}


def kv_cache_bytes(config: ModelConfig, rows: int, slots: int, split: Split = Split()) -> int:
    """The rollout's KV cache on one device: every row, the kv heads divided over the tensor axes."""
    return config.kv_cache_bytes(rows, slots, _per(config.num_kv_heads, split.kv_heads))


@dataclasses.dataclass(frozen=True)
class ProgramBytes:
    """One compiled program's bytes on one device, as XLA's ``compiled.memory_analysis()``
    counts them: ``arguments`` + ``outputs`` + the ``temporaries`` (by term) - ``aliased`` -
    ``on_chip`` (temporaries kept in the chip's own memory, ``on_chip_bytes``)."""

    program: str
    arguments: int
    outputs: int
    temporaries: Mapping[str, int]
    aliased: int = 0
    on_chip: int = 0

    @property
    def temporary_bytes(self) -> int:
        return sum(self.temporaries.values())

    @property
    def total(self) -> int:
        return self.arguments + self.outputs + self.temporary_bytes - self.aliased - self.on_chip

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "temporaries": dict(self.temporaries), "total": self.total}


def on_chip_bytes(temporaries: int, on_chip: int) -> int:
    """The temporaries a program keeps off the device memory ``memory_analysis`` counts: all of them
    where they fit in ``on_chip`` bytes of the chip's own memory (a TPU's vector memory, VMEM, into
    which XLA:TPU's memory-space assignment puts them; ``planner.tables.Topology.on_chip_memory``),
    else none (a program whose temporaries do not fit keeps, in the lab's programs, nearly all of
    them in HBM); 0 on a device without such memory."""
    return temporaries if 0 < temporaries <= on_chip else 0


def _program(name: str, arguments: int, outputs: int, temporaries: dict[str, int], on_chip: int) -> ProgramBytes:
    return ProgramBytes(
        name, arguments, outputs, temporaries, on_chip=on_chip_bytes(sum(temporaries.values()), on_chip)
    )


def _largest(*points: dict[str, int]) -> dict[str, int]:
    """The point of a program that holds the most at once (its temporaries there, by term)."""
    return dict(max(points, key=lambda terms: sum(terms.values())))


def _tuple_table(outputs: int, platform: str) -> int:
    """XLA:CPU returns several outputs as a tuple: a table of one 8-byte pointer per output."""
    return 8 * outputs if outputs > 1 and platform in UNFUSED else 0


def layer_weight_bytes(config: ModelConfig, split: Split = Split(), lora_rank: int = 0) -> int:
    """One layer's weights on one device (its projections, adapters and norm scales)."""
    e, hd = config.embed_dim, config.head_dim
    q = _per(config.num_heads, split.q_heads) * hd
    kv = _per(config.num_kv_heads, split.kv_heads) * hd
    m = _per(config.mlp_dim, split.mlp)
    adapters = lora_rank * (7 * e + 2 * q + 2 * kv + 3 * m)
    return itemsize(config) * (2 * e * q + 2 * e * kv + 3 * e * m + 2 * e + adapters)


def forward_terms(
    config: ModelConfig,
    rows: int,
    queries: int,
    keys: int,
    split: Split = Split(),
    *,
    platform: str,
    lora_rank: int = 0,
) -> dict[str, int]:
    """What one layer of a forward pass over ``rows`` rows (on this device) of ``queries`` tokens attending to
    ``keys`` holds at once, on one device, beside the stacks it reads and writes: the hidden
    state, the mask's float32 bias and the rotary tables throughout, and at the larger of its
    two points either the attention (float32 scores, on XLA:CPU also the scores with the bias
    added; one transposed copy of the keys or values; the layer's weights, sliced from the stack)
    or the MLP (gate, up and, on XLA:CPU, their product; the down projection's slice)."""
    p, e, hd = itemsize(config), config.embed_dim, config.head_dim
    heads = _per(config.num_heads, split.q_heads)
    kv = _per(config.num_kv_heads, split.kv_heads) * hd
    mlp = _per(config.mlp_dim, split.mlp)
    unfused = platform in UNFUSED
    common = {
        "hidden": rows * queries * _per(e, split.embed) * p,
        "mask_bias": rows * queries * keys * F32,
        "rotary": rows * queries * hd * F32,
    }
    attention = {
        "scores": (2 if unfused else 1) * rows * heads * queries * keys * F32,
        "keys_values": rows * keys * kv * p,
        "layer_weights": layer_weight_bytes(config, split, lora_rank),
    }
    # With LoRA each adapted projection adds its low-rank product, of its output's size, to the frozen one's.
    products = {
        "mlp": ((3 if unfused else 2) + (2 if lora_rank else 0)) * rows * queries * mlp * p,
        "layer_weights": mlp * e * p,
    }
    return common | _largest(attention, products)


def logps_program(
    config: ModelConfig,
    rows: int,
    prompt: int,
    completion: int,
    arguments: int,
    split: Split = Split(),
    *,
    platform: str,
    lora_rank: int = 0,
    on_chip: int = 0,
) -> ProgramBytes:
    """The log-prob program (``model.logps``) over ``rows`` rows of ``prompt`` + ``completion``
    tokens: a forward pass, then the float32 logits of every position and the log-softmax of the
    completion's. ``arguments``: the bytes of its inputs on the device. ``on_chip``: the chip's own
    memory for temporaries (``on_chip_bytes``; 0: none), as for the other programs."""
    tokens, vocab = prompt + completion, _per(config.vocab_size, split.vocab)
    head = {
        "hidden": rows * tokens * _per(config.embed_dim, split.embed) * itemsize(config),
        # XLA:TPU and XLA:GPU fuse the float32 cast into the log-softmax: the logits stay in the model's dtype.
        "logits": rows * tokens * vocab * (F32 if platform in UNFUSED else itemsize(config)),
        "log_softmax": rows * completion * vocab * F32,
    }
    layer = forward_terms(config, rows, tokens, tokens, split, platform=platform, lora_rank=lora_rank)
    return _program("log-probs", arguments, rows * completion * F32, _largest(layer, head), on_chip)


# One decode step runs the layers in a scan over the cache, writing a new cache beside the old,
# and per layer holds four copies of one layer's keys or values (read out of the stack, transposed
# for its product, written back), counted from XLA:CPU's buffer assignment of the lab's sampler.
DECODE_LAYER_COPIES = 4


def generate_program(
    config: ModelConfig,
    rows: int,
    prompt: int,
    new_tokens: int,
    slots: int,
    arguments: int,
    split: Split = Split(),
    *,
    platform: str,
    lora_rank: int = 0,
    on_chip: int = 0,
) -> ProgramBytes:
    """The sampler (``model.sampling``): ``rows`` prompts of ``prompt`` tokens, ``new_tokens``
    sampled into a KV cache of ``slots`` slots. Its larger point is the prefill (the cache and
    one layer's forward over the prompt, attending to every slot) or a decode step (the cache
    and the copies of one layer's keys and values the step makes). Outputs: the sampled ids
    (int32) and their log-probs (float32). ``on_chip``: as for ``logps_program``."""
    kv = kv_cache_bytes(config, rows, slots, split)
    layer = rows * slots * _per(config.num_kv_heads, split.kv_heads) * config.head_dim
    prefill = {"kv_cache": kv} | forward_terms(
        config, rows, prompt, slots, split, platform=platform, lora_rank=lora_rank
    )
    decode = {
        "kv_cache": kv,
        "new_kv_cache": kv,
        "decode_copies": DECODE_LAYER_COPIES * layer * itemsize(config),
        "layer_weights": layer_weight_bytes(config, split, lora_rank),
    }
    outputs = 2 * rows * new_tokens * F32 + _tuple_table(2, platform)
    return _program("generate", arguments, outputs, _largest(prefill, decode), on_chip)


def update_program(
    config: ModelConfig,
    rows: int,
    prompt: int,
    completion: int,
    arguments: int,
    trainable: int,
    optimizer: int,
    leaves: int,
    split: Split = Split(),
    *,
    platform: str,
    accumulating: bool = False,
    lora_rank: int = 0,
    on_chip: int = 0,
    value_head: bool = False,
    remat: bool = False,
) -> ProgramBytes:
    """The optimizer step (``training.step.jitted_update``) over a micro-batch of ``rows`` rows.

    ``trainable`` and ``optimizer``: the bytes of the trained parameters and the optimizer
    state on the device; ``leaves``: how many arrays the step returns (new parameters and
    optimizer state, five float32 metrics). Its larger point is the end of the forward pass
    (every layer's residuals, the gradients it will fill, plus a float32 running sum when
    ``accumulating``, and the layer in flight) or the update (the gradients and the new
    optimizer state beside the old: the step keeps the old until it knows the new are finite).
    Outputs: the new parameters and optimizer state, and the metrics.
    ``on_chip``: as for ``logps_program``; ``remat``: a step that rematerialises every layer.
    """
    tokens = prompt + completion
    o = operand_bytes(config, platform)
    acts = residual_bytes(
        config, rows, tokens, completion, split, lora_rank=lora_rank, value_head=value_head, remat=remat, operands=o
    )
    gradients = trainable + (trainable * F32 // itemsize(config) if accumulating else 0)
    forward = {
        "activations": sum(acts.values()),
        "gradients": gradients,
        "layer_in_flight": sum(
            forward_terms(config, rows, tokens, tokens, split, platform=platform, lora_rank=lora_rank).values()
        ),
    }
    if lora_rank:  # differentiated, an adapted MLP keeps one more product of its width in flight
        forward["adapter_products"] = rows * tokens * _per(config.mlp_dim, split.mlp) * itemsize(config)
    update = {"gradients": gradients, "new_optimizer_state": optimizer}
    outputs = trainable + optimizer + 5 * F32 + _tuple_table(leaves, platform)
    return _program("train step", arguments, outputs, _largest(forward, update), on_chip)
