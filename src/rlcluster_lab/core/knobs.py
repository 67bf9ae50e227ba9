"""One table of the knobs a person turns: each one's lab widget and CLI flag (JAX-free).

A refusal names the knobs that would fix it (``ConfigError.knobs``: ``Scenario`` field
names); ``describe`` says them in the reader's terms, the widget's label in the lab and
the flag in the CLI. The lab's widgets take their labels from this table too, so the
label an error names is the label on the screen.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Audience = Literal["lab", "cli"]


@dataclasses.dataclass(frozen=True)
class Knob:
    """One knob: the field it sets, its widget in the lab, its flag in the CLI.

    Attributes:
        field: the ``Scenario`` field (or learner setting) it sets.
        name: the short name (the flag without dashes; the lab's CSS class ``rl-<name>``).
        label: the lab widget's label (None: not a widget in the lab).
        widget: what kind of widget the label is on ("checkbox", "dropdown", "number box").
        flag: the CLI flag (None: not a flag).
    """

    field: str
    name: str
    label: str | None
    widget: str
    flag: str | None

    def said(self, audience: Audience) -> str | None:
        """The knob as the audience sees it: the flag, or the widget's quoted label (None: it has none)."""
        if audience == "cli":
            return self.flag
        return f"the '{self.label}' {self.widget}" if self.label else None


KNOBS: dict[str, Knob] = {
    k.field: k
    for k in (
        Knob("layout", "layout", "layout", "dropdown", "--layout"),
        Knob("lora", "lora", "LoRA actor", "checkbox", "--lora"),
        Knob("lora_rank", "lora-rank", "LoRA rank", "number box", "--lora-rank"),
        Knob(
            "lora_separate_base",
            "lora-separate-base",
            "LoRA over a separate copy of the base (P4 warns)",
            "checkbox",
            "--lora-separate-base",
        ),
        Knob("engine", "engine", "rollout engine", "dropdown", "--engine"),
        # The flag turns the settings off; the checkbox (on by default) turns them on.
        Knob(
            "sglang_static_lora",
            "static-lora",
            "static-LoRA settings for sglang_jax (P6)",
            "checkbox",
            "--no-static-lora",
        ),
        Knob("offload", "offload", "offload to pinned host (P14)", "checkbox", "--offload"),
        Knob("rollout_dtype", "rollout-dtype", "rollout dtype", "dropdown", "--rollout-dtype"),
        Knob("model_size", "model-size", "model size", "dropdown", "--model-size"),
        Knob("with_reward", "reward", "reward model", "checkbox", "--reward"),
        Knob("with_critic", "critic", "critic model", "checkbox", "--critic"),
        Knob("anchor", "anchor", "anchor (P8)", "dropdown", "--anchor"),
        Knob("reshard", "reshard", None, "dropdown", "--reshard"),
        Knob("sync_chunk_bytes", "sync-chunk-bytes", "sync chunks (P13)", "dropdown", "--sync-chunk-bytes"),
        # Lab only: the custom rollout mesh's devices and shape (the CLI builds standard layouts).
        Knob("rollout_devices", "rollout-devices", "rollout devices", "buttons", None),
        Knob("rollout_shape", "rollout-shape", "rollout shape", "dropdown", None),
        # CLI only: the simulated device count, and the learner's settings (``learn``).
        Knob("devices", "devices", None, "number", "--devices"),
        Knob("max_tokens", "max-tokens", None, "number", "--max-tokens"),
        Knob("learning_rate", "learning-rate", None, "number", "--learning-rate"),
        Knob("mini_batch_size", "mini-batch-size", None, "number", "--mini-batch-size"),
        Knob("train_micro_batch_size", "micro-batch-size", None, "number", "--micro-batch-size"),
        Knob("num_iterations", "iterations", None, "number", "--iterations"),
        Knob("steps", "steps", None, "number", "--steps"),
        Knob("prompts_per_step", "prompts-per-step", None, "number", "--prompts-per-step"),
        Knob("group_size", "group-size", None, "number", "--group-size"),
        # CLI only: what ``plan`` alone takes (a paper cluster's topology and step shapes).
        Knob("topology", "topology", None, "text", "--topology"),
        Knob("rollout_vllm_tensor_parallel_size", "vllm-tp", None, "number", "--vllm-tp"),
        Knob("devices_per_host", "devices-per-host", None, "number", "--devices-per-host"),
        Knob("rollout_batch_size", "rollout-batch-size", None, "number", "--rollout-batch-size"),
        Knob("prompt_length", "prompt-length", None, "number", "--prompt-length"),
        Knob("kv_cache_size", "kv-cache-size", None, "number", "--kv-cache-size"),
        Knob("micro_batch_size", "micro-batch-size", None, "number", "--micro-batch-size"),
    )
}


def knobs_of(exc: BaseException) -> tuple[Knob, ...]:
    """The knobs an error names as its fix (none for an error that names none)."""
    return tuple(KNOBS[f] for f in getattr(exc, "knobs", ()) if f in KNOBS)


def describe(exc: BaseException, audience: Audience) -> str:
    """The error's message for the lab or the CLI: the knobs it names said as widgets or flags.

    The message's "field (--flag)" mentions become the audience's own name, and a
    last sentence names what to change ("the flag to change: --lora-rank").
    Without knobs the message is returned as it is, on one line.

    Args:
        exc: the error (usually a ``ConfigError`` with ``knobs``).
        audience: "lab" (widget labels) or "cli" (flags).
    """
    problem = getattr(exc, "problem", None)
    text = " ".join(str(problem or exc).split()) or type(exc).__name__
    knobs = knobs_of(exc)
    for knob in knobs:
        said = knob.said(audience)
        if said and knob.flag:
            text = text.replace(f"{knob.field} ({knob.flag})", said if audience == "cli" else f"'{knob.label}'")
    names = [s for s in (k.said(audience) for k in knobs) if s]
    if not names:
        return text
    lead = "The flag to change" if audience == "cli" else "What to change"
    alternatives = f" (or {', '.join(names[1:])})" if len(names) > 1 else ""
    return f"{text.rstrip('.')}. {lead}: {names[0]}{alternatives}."
