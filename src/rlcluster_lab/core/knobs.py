"""Every knob a person turns, declared once (JAX-free): its type, range or choices, default, help,
the rules that read it, its lab widget and its CLI flag.

``Scenario``'s fields, the CLI's flags, the lab's controls and the planner's shared knobs are
derived from this table. A refusal names the knobs that fix it (``ConfigError.knobs``), which
``describe`` says as the label on the screen or the flag.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar

from rlcluster_lab.core import model_config
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.model_config import DTYPES, dtype_name

Audience = Literal["lab", "cli"]
T = TypeVar("T")

# The vocabulary: every knob's values are read from here, so one knob is spelled one way everywhere.
LAYOUTS: tuple[str, ...] = ("colocated", "reshaped", "split")
ENGINES: tuple[str, ...] = ("vanilla", "vllm", "sglang_jax")
# Every engine but the built-in sampler stands in for an external server's placement.
ENGINE_LABELS: dict[str, str] = {e: e if e == "vanilla" else f"{e} (JAX placement stand-in)" for e in ENGINES}
ANCHOR_MODES: tuple[str, ...] = ("full", "trainable")
RESHARD_STRATEGIES: tuple[str, ...] = ("xla", "minimal")
# The lab's preset sizes, from the model's own table (``core.model_config``), so a size is spelled once.
MODEL_SIZES: tuple[str, ...] = tuple(model_config.MODEL_SIZES)
COMMANDS: tuple[str, ...] = ("report", "learn", "plan")


def as_int(value: Any, name: str, *, low: int | None = None, knobs: Sequence[str] = ()) -> int:
    """``value`` as a plain ``int`` (a NumPy integer converted, so a report of it is still JSON); a bool,
    a float, anything else or a value below ``low`` is refused (``ConfigError`` naming ``name``)."""
    bound = f" >= {low}" if low is not None else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an int{bound}, got {type(value).__name__} {value!r:.40}", knobs=knobs)
    if low is not None and value < low:
        raise ConfigError(f"{name} must be an int{bound}, got {value}", knobs=knobs)
    return int(value)


def as_float(value: Any, name: str, *, knobs: Sequence[str] = ()) -> float:
    """``value`` as a plain ``float``: any real number but a bool, else a ``ConfigError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a number, got {type(value).__name__} {value!r:.40}", knobs=knobs)
    return float(value)


def as_bool(value: Any, name: str, *, knobs: Sequence[str] = ()) -> bool:
    """``value`` as a plain ``bool``: True, False or a NumPy bool; anything else (``"no"``, 1) is refused
    with a ``ConfigError`` naming ``name``."""
    if isinstance(value, bool) or (getattr(getattr(value, "dtype", None), "kind", None) == "b" and not value.shape):
        return bool(value)
    raise ConfigError(f"{name} must be True or False, got {type(value).__name__} {value!r:.40}", knobs=knobs)


# What each kind of value is, as a dataclass field's annotation.
_TYPES = {"bool": "bool", "int": "int", "float": "float", "choice": "str", "dtype": "str", "text": "str"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Knob:
    """One knob: the value it holds, who reads it, and how the lab and the CLI show it (``label``
    and ``flag`` have no default: every knob says whether it is a widget and a flag)."""

    field: str  # the Scenario field (or learner or plan setting) it sets, as refusals name it
    name: str  # the flag without dashes; the lab's CSS class rl-<name>
    # "bool", "int", "float", "choice" (of ``choices``), "dtype" (held as its name), "text", or "lab" (no value)
    kind: str
    default: Any = None  # its value when not given (None is a value too)
    help: str  # what it does: the CLI's help, the widget's tooltip after the rule ids
    rule: str | None = None  # the rules that read it ("P13")
    label: str | None  # the lab widget's label (None: not in the lab)
    widget: str = ""  # "checkbox", "dropdown", "number box" or "buttons"
    flag: str | None  # the CLI flag (None: not a flag); ``alias``: a second spelling of it
    alias: str | None = None
    commands: tuple[str, ...] = COMMANDS  # the subcommands that take the flag
    choices: tuple[str, ...] | None = None  # the values of a "choice" or "dtype" knob
    options: tuple[tuple[str, Any], ...] | None = None  # the widget's (label, value) pairs (a false value: None)
    low: int | None = None  # the least value of an "int"
    # The refusal's message ({value}, {choices}, {said}: the field and its flag); None: the default wording.
    refusal: str | None = None
    planner: bool = False  # PlanRequest takes it, as it is, under the same name

    def said(self, audience: Audience) -> str | None:
        """The knob as the audience sees it: the flag, or the widget's quoted label (None: it has none)."""
        if audience == "cli":
            return self.flag
        return f"the '{self.label}' {self.widget}" if self.label else None

    @property
    def tooltip(self) -> str:
        """The widget's tooltip: the rules that read the knob, and what it does."""
        return f"{self.rule}: {self.help}" if self.rule else self.help

    def check(self, value: Any) -> Any:
        """``value`` as the knob holds it (a plain number, a dtype's name), else a ``ConfigError`` naming
        the knob: a value of another type, out of range or not one of the choices."""
        knobs = (self.field,)
        if value is None and self.default is None:
            return None
        if self.kind == "bool":
            return as_bool(value, self.field, knobs=knobs)
        if self.kind == "float":
            return as_float(value, self.field, knobs=knobs)
        if self.kind == "dtype":
            return dtype_name(value, self.field)
        if self.kind == "int":
            whole = not isinstance(value, bool) and isinstance(value, numbers.Integral)
            if self.default is not None:  # a number first says it is not one; a knob that may be None says its rule
                value = as_int(value, self.field, knobs=knobs)
            if not whole or (self.low is not None and value < self.low):
                raise self.refused(value)
            return int(value)
        if self.choices is not None and value not in self.choices:
            raise self.refused(value)
        return value

    def refused(self, value: Any) -> ConfigError:
        """The refusal of ``value``, in the knob's words."""
        default = (
            "unknown {noun} {value!r}; choose one of {choices}"
            if self.choices
            else "{said} must be at least {low}, got {value}"
        )
        text = (self.refusal or default).format(
            value=value,
            noun=self.field.replace("_", " "),
            choices=", ".join(self.choices or ()),
            said=f"{self.field} ({self.flag})",
            low=self.low,
        )
        return ConfigError(text, knobs=(self.field,))


# fmt: off
# A Scenario's knobs, in the order of its fields (``core.options.Scenario``).
SCENARIO_KNOBS: tuple[Knob, ...] = (
    Knob(field="layout", name="layout", kind="choice", default="colocated", choices=LAYOUTS, planner=True,
         rule="P1", label="layout", widget="dropdown", flag="--layout",
         help="standard device layout, the mesh of every role: actor and rollout on one mesh share one model"),
    Knob(field="lora", name="lora", kind="bool", default=False,
         rule="P2, P4, P12, P13", label="LoRA actor", widget="checkbox", flag="--lora",
         help="LoRA actor over the reference's own frozen buffers: the reference is linked to the actor and shares "
         "its backbone, the optimizer trains only the adapters, and a sync hands over only them"),
    Knob(field="lora_rank", name="lora-rank", kind="int", default=4, low=1, planner=True,
         rule="P12, P13", label="LoRA rank", widget="number box", flag="--lora-rank",
         help="the LoRA adapters' rank (with LoRA): their inner dimension, so the size of what the optimizer trains "
         "and a sync hands over (at most the model's largest useful rank)"),
    Knob(field="lora_separate_base", name="lora-separate-base", kind="bool", default=False, planner=True,
         rule="P4", label="LoRA over a separate copy of the base (P4 warns)", widget="checkbox",
         flag="--lora-separate-base",
         help="build the LoRA actor over its own copy of the base, so reference and actor hold two backbones "
         "(an avoidable copy: the cluster warns)"),
    Knob(field="engine", name="engine", kind="choice", default="vanilla", choices=ENGINES, planner=True,
         options=tuple((label, e) for e, label in ENGINE_LABELS.items()),
         rule="P3, P7", label="rollout engine", widget="dropdown", flag="--engine",
         help="rollout engine (vllm and sglang_jax are placement stand-ins written in JAX): vanilla loads a second "
         "copy when the rollout is not linked to the actor, the others get the actor as initial value; an engine "
         "with a mesh of its own replaces the rollout mesh"),
    Knob(field="offload", name="offload", kind="bool", default=False, planner=True,
         rule="P14", label="offload to pinned host (P14)", widget="checkbox", flag="--offload",
         help="offload_to_cpu: every role waits in pinned host memory between uses and comes to device for its work"),
    Knob(field="rollout_dtype", name="rollout-dtype", kind="dtype", choices=DTYPES, planner=True,
         options=(("as given (float32)", ""), *((d, d) for d in DTYPES)),
         rule="P3, P5", label="rollout dtype", widget="dropdown", flag="--rollout-dtype",
         help="dtype the vanilla engine's second copy of the actor is cast to as it is loaded onto the rollout "
         "mesh (default: as given)"),
    Knob(field="model_size", name="model-size", kind="choice", default="tiny", choices=MODEL_SIZES,
         rule="L2, L3", label="model size", widget="dropdown", flag="--model-size", alias="--model",
         help="the lab's model size, whose dimensions scale every byte figure (memory, sync)"),
    Knob(field="with_reward", name="reward", kind="bool", default=False, planner=True,
         rule="P5", label="reward model", widget="checkbox", flag="--reward",
         help="a reward model, loaded onto the reward mesh (the actor's in these layouts)"),
    Knob(field="with_critic", name="critic", kind="bool", default=False, planner=True,
         rule="P5", label="critic model", widget="checkbox", flag="--critic",
         help="a critic (value model), loaded onto the critic mesh (the actor's in these layouts); the learner then "
         "takes PPO-style steps"),
    # The flag turns the settings off; the checkbox (on by default) turns them on.
    Knob(field="sglang_static_lora", name="static-lora", kind="bool", default=True,
         rule="P6", label="static-LoRA settings for sglang_jax (P6)", widget="checkbox", flag="--no-static-lora",
         help="static-LoRA settings for the sglang_jax engine, which it needs for a LoRA actor"),
    Knob(field="anchor", name="anchor", kind="choice", default="full", choices=ANCHOR_MODES, planner=True,
         options=(("full actor state", "full"), ("trainable parameters only", "trainable")),
         rule="P8", label="anchor (P8)", widget="dropdown", flag="--anchor",
         help="what is pinned to host at construction and at every sync: the actor's full state, or (with LoRA) "
         "only its adapters"),
    Knob(field="reshard", name="reshard", kind="choice", default="xla", choices=RESHARD_STRATEGIES, planner=True,
         refusal="unknown reshard strategy {value!r}; choose one of {choices}",
         rule="P5, P13", label=None, flag="--reshard",
         help="how layouts change: xla (one compiled program, bytes read from its collectives) or minimal "
         "(exactly what each device lacks)"),
    Knob(field="sync_chunk_bytes", name="sync-chunk-bytes", kind="int", low=1, planner=True,
         refusal="{said} must be a whole number of bytes >= 1 (a sync then hands its leaves over in chunks of at "
         "most that many bytes), or None for one piece; got {value!r}",
         options=(("one piece", 0), ("16 KiB", 16 << 10), ("64 KiB", 64 << 10), ("256 KiB", 256 << 10),
                  ("1 MiB", 1 << 20)),
         rule="P13", label="sync chunks (P13)", widget="dropdown", flag="--sync-chunk-bytes",
         help="hand a weight sync over in chunks of at most this many bytes of leaves, each committed and its old "
         "arrays dropped before the next: a lower transient peak, one reshard per chunk (default: one piece)"),
    # The rollout's settings: ``learn`` samples max_tokens, ``plan`` sizes a step by both (``planner.Workload``).
    Knob(field="max_tokens", name="max-tokens", kind="int", default=16, low=1, commands=("learn", "plan"),
         label=None, flag="--max-tokens", help="completion tokens per row"),
    Knob(field="temperature", name="temperature", kind="float", default=1.0,
         label=None, flag=None, help="sampling temperature (0: greedy)"),
    Knob(field="kv_cache_size", name="kv-cache-size", kind="int", default=128, commands=("plan",),
         label=None, flag="--kv-cache-size", help="KV cache slots per row"),
    Knob(field="seed", name="seed", kind="int", default=0,
         label=None, flag=None, help="seed of the models' initial values"),
)


def _flag(command: str, field: str, name: str, kind: str, default: Any, text: str) -> Knob:
    """A knob that is one subcommand's flag alone."""
    return Knob(field=field, name=name, kind=kind, default=default, help=text, label=None, flag=f"--{name}",
                commands=(command,))


KNOBS: dict[str, Knob] = {k.field: k for k in (
    *SCENARIO_KNOBS,
    # Lab only: the custom rollout mesh's devices and shape (the CLI builds standard layouts).
    Knob(field="rollout_devices", name="rollout-devices", kind="lab", rule="P1",
         label="rollout devices", widget="buttons", flag=None, help="the devices of the custom rollout mesh"),
    Knob(field="rollout_shape", name="rollout-shape", kind="lab", rule="P1",
         label="rollout shape", widget="dropdown", flag=None,
         help="the same devices in another shape are another mesh, so the rollout gets a second copy"),
    # CLI only: the simulated device count (checked by ``core.options.check_device_count``) ...
    Knob(field="devices", name="devices", kind="int", default=8, label=None, flag="--devices",
         help="simulated CPU device count (ignored on GPUs and TPUs)"),
    # ... the CPU backend alone, where a GPU or a TPU chip would be opened (a chip another process holds) ...
    Knob(field="cpu", name="cpu", kind="bool", default=False, label=None, flag="--cpu",
         help="run on the simulated CPU devices alone, leaving this machine's GPUs or TPU chips alone"),
    # ... a report's launch over several processes (``multiprocess.launcher``: processes x devices-per-process) ...
    _flag("report", "processes", "processes", "int", 1,
          "build the cluster over this many processes on this machine (JAX's multi-process runtime; 1: in this "
          "process)"),
    _flag("report", "devices_per_process", "devices-per-process", "int", 4,
          "simulated CPU devices of each process with --processes"),
    _flag("report", "timeout", "timeout", "float", None,
          "seconds the whole multi-process run may take (default 900); then every process is stopped"),
    # ... the learner's settings (``learn``: ``LearnerConfig``, ``TrainingConfig``) ...
    _flag("learn", "steps", "steps", "int", 30, "global steps to run"),
    _flag("learn", "prompts_per_step", "prompts-per-step", "int", 4, "prompts sampled per step"),
    _flag("learn", "group_size", "group-size", "int", 4, "completions per prompt, compared within their group"),
    _flag("learn", "mini_batch_size", "mini-batch-size", "int", 8, "completions per optimizer update"),
    _flag("learn", "train_micro_batch_size", "micro-batch-size", "int", None,
          "train micro-batch size: each mini-batch update accumulates mini/micro micro-batch gradients"),
    _flag("learn", "num_iterations", "iterations", "int", 1, "passes over the same batch per global step"),
    _flag("learn", "learning_rate", "learning-rate", "float", 3e-3, "the actor's learning rate"),
    # ... and what ``plan`` alone takes (a paper cluster's topology and its step's shapes, ``planner.Workload``).
    _flag("plan", "topology", "topology", "text", "local",
          "local (this machine's devices), gpu-8, gpu-2x8, tpu-v5e-8, tpu-v5p-8, tpu-v5p-64, tpu-v5p-256"),
    _flag("plan", "rollout_vllm_tensor_parallel_size", "vllm-tp", "int", None,
          "vllm engine's tensor-parallel size (default: all)"),
    _flag("plan", "devices_per_host", "devices-per-host", "int", None,
          "devices of one host (process), consecutive ids (default: the topology's)"),
    _flag("plan", "rollout_batch_size", "rollout-batch-size", "int", 16, "completions sampled at once"),
    _flag("plan", "prompt_length", "prompt-length", "int", 112, "prompt tokens per row"),
    _flag("plan", "micro_batch_size", "micro-batch-size", "int", None,
          "rows per training micro-batch (default: the whole batch in one piece)"),
)}
# fmt: on
PLANNER_KNOBS: tuple[Knob, ...] = tuple(k for k in SCENARIO_KNOBS if k.planner)


def knob_dataclass(knobs: Iterable[Knob]) -> Callable[[type[T]], type[T]]:
    """Make a class a frozen dataclass of its own fields, then ``knobs`` with their defaults, each
    checked by its knob before the class's own ``__post_init__`` (a field the class declares is its own)."""

    def make(cls: type[T]) -> type[T]:
        own = dict(cls.__dict__.get("__annotations__", {}))
        added = [k for k in knobs if k.field not in own]
        types = {k.field: _TYPES.get(k.kind, "Any") + (" | None" if k.default is None else "") for k in added}
        cls.__annotations__ = {**own, **types}
        for knob in added:
            setattr(cls, knob.field, knob.default)
        after = cls.__dict__.get("__post_init__")

        def __post_init__(self: Any) -> None:
            for knob in added:
                object.__setattr__(self, knob.field, knob.check(getattr(self, knob.field)))
            if after is not None:
                after(self)

        cls.__post_init__ = __post_init__  # type: ignore[attr-defined]
        return dataclasses.dataclass(frozen=True)(cls)

    return make


def knobs_of(exc: BaseException) -> tuple[Knob, ...]:
    """The knobs an error names as its fix (none for an error that names none)."""
    return tuple(KNOBS[f] for f in getattr(exc, "knobs", ()) if f in KNOBS)


def describe(exc: BaseException, audience: Audience, command: str | None = None) -> str:
    """The message of ``exc`` for the lab or the CLI (``audience``): its "field (--flag)" mentions
    said as the audience's own names, then a sentence naming what to change. ``command``: the CLI's
    subcommand, whose flags alone are named."""
    text = " ".join(str(getattr(exc, "problem", None) or exc).split()) or type(exc).__name__
    knobs = tuple(k for k in knobs_of(exc) if command is None or command in k.commands)
    # Every "field (--flag)" in the text is said the audience's way; on the CLI a flag this command
    # does not take (learn has no --kv-cache-size) is said in the knob's words.
    for knob in KNOBS.values():
        said = knob.said(audience)
        if said and knob.flag:
            if audience == "cli" and command is not None and command not in knob.commands:
                said = knob.help
            text = text.replace(f"{knob.field} ({knob.flag})", said if audience == "cli" else f"'{knob.label}'")
    names = [s for s in (k.said(audience) for k in knobs) if s]
    if not names:
        return text
    lead = "The flag to change" if audience == "cli" else "What to change"
    alternatives = f" (or {', '.join(names[1:])})" if len(names) > 1 else ""
    return f"{text.rstrip('.')}. {lead}: {names[0]}{alternatives}."
