"""The lab's knobs: one widget per knob of a ``Scenario``, and the scenario they describe.

The choices come from the one vocabulary (``core.options``, via the layouts
these devices can hold); nothing here decides where a model lives. The
``PlacementLab`` (``lab.widget``) owns the buttons and the panels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import ipywidgets as widgets
import jax

from rlcluster_lab.app.scenario import ROLLOUT_DTYPES, Scenario
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.knobs import KNOBS
from rlcluster_lab.core.meshes import (
    default_shape,
    fitting_shapes,
    layout_meshes,
    make_mesh,
    reachable_layouts,
    sharded_dims,
)
from rlcluster_lab.core.options import ENGINE_LABELS, ENGINES
from rlcluster_lab.core.roles import Role
from rlcluster_lab.model import MODEL_SIZES
from rlcluster_lab.rules.anchor import anchor_is_partial

CUSTOM = "custom"
# One column of knobs: every label and every choice shown whole (the widest choice,
# "sglang_jax (JAX placement stand-in)", needs about 250 px beside a 120 px label).
KNOB_WIDTH = 400
LABEL_WIDTH = 120


def label(field: str) -> str:
    """The knob's label on screen: the one ``core.knobs`` table, which errors name too."""
    text = KNOBS[field].label
    assert text is not None, f"{field} is not a lab knob"
    return text


# What each knob changes, by the rule that reads it (shown as the knob's tooltip).
TOOLTIPS = {
    "layout": "P1: actor and rollout on one mesh share one model; the layout sets role_to_mesh for every role",
    "lora": "P2, P4, P12: a LoRA actor links the reference to the actor (P2), lets it share the actor's "
    "backbone (P4), and the optimizer trains only the adapters (P12); P13 syncs only the adapters",
    "lora-rank": "P12, P13: the adapters' inner dimension, so the size of what the optimizer trains and the "
    "sync hands over (at most the model's largest useful rank)",
    "lora-separate-base": "P4: the LoRA actor wraps its own copy of the base, so reference and actor hold "
    "two backbones; the cluster warns (AvoidableCopyWarning)",
    "engine": "P3: vanilla loads a second copy when the rollout is not linked to the actor, other engines "
    "get the actor as initial value; P7: an engine that exposes a mesh replaces the rollout mesh",
    "static-lora": "P6: the sglang_jax engine refuses a LoRA actor without static-LoRA settings",
    "offload": "P14: every role waits in pinned host memory between uses and comes to device for its work",
    "rollout-dtype": "P3, P5: a second copy of the actor is cast to this dtype as it is loaded onto the rollout mesh",
    "model-size": "L2, L3: the model's dimensions: every byte figure (memory, sync) scales with it",
    "reward": "P5: a reward model, loaded onto the reward mesh (the actor's in these layouts)",
    "critic": "P5: a critic (value model), loaded onto the critic mesh (the actor's in these layouts)",
    "anchor": "P8: what is pinned to host at construction and at every sync: the actor's whole state, "
    "or (with LoRA) only its adapters",
    "rollout-shape": "P1: the same devices in another shape are another mesh, so the rollout gets a second copy",
    "sync-chunk-bytes": "P13: a sync hands the weights over in chunks of at most this many bytes of leaves, "
    "each committed and its old arrays dropped before the next: a lower transient peak, one reshard per chunk",
}
# The sync's chunk sizes the lab offers (0: one piece).
SYNC_CHUNKS = [("one piece", 0), ("16 KiB", 16 << 10), ("64 KiB", 64 << 10), ("256 KiB", 256 << 10), ("1 MiB", 1 << 20)]


def knob_value(widget: widgets.Widget) -> str:
    """A knob's setting as the widget shows it."""
    if isinstance(widget, widgets.Dropdown):
        return str(widget.label)
    if isinstance(widget, widgets.Checkbox | widgets.ToggleButton):
        return "on" if widget.value else "off"
    return str(widget.value)


def shape_options(count: int, model_size: str = "tiny") -> list[tuple[str, tuple[int, int]]]:
    """The (fsdp, tp) arrangements of ``count`` devices that can hold the model (every sharded
    dimension divisible by its axis' size, ``core.meshes.fitting_shapes``), the standard one first."""
    return [(f"{a} x {b}", (a, b)) for a, b in fitting_shapes(count, MODEL_SIZES[model_size])]


class Knobs:
    """The scenario's knobs as widgets, laid out in ``self.widget``.

    Args:
        devices: the devices the layouts are built on.
    """

    def __init__(self, devices: Sequence[jax.Device]) -> None:
        self.devices = list(devices)
        self._make()
        self.widget = self._assemble()
        self._update_custom_visibility()

    def _make(self) -> None:
        style = {"description_width": f"{LABEL_WIDTH}px"}
        wide = widgets.Layout(width=f"{KNOB_WIDTH}px")
        auto = widgets.Layout(width="auto")

        def check(field: str, value: bool = False) -> widgets.Checkbox:
            return widgets.Checkbox(value=value, description=label(field), indent=False, layout=auto)

        def menu(field: str, options: Any, value: Any) -> widgets.Dropdown:
            return widgets.Dropdown(options=options, value=value, description=label(field), style=style, layout=wide)

        layouts = reachable_layouts(self.devices) + [CUSTOM]
        self.layout = menu("layout", [(n if n != CUSTOM else "custom rollout mesh", n) for n in layouts], layouts[0])
        self.device_toggles = [
            widgets.ToggleButton(value=True, description=str(d.id), tooltip=str(d), layout=widgets.Layout(width="44px"))
            for d in self.devices
        ]
        self.devices_box = widgets.HBox(self.device_toggles, layout=widgets.Layout(flex_flow="row wrap"))
        self.rollout_shape = widgets.Dropdown(description=label("rollout_shape"), style=style, layout=wide)
        self.custom_note = widgets.HTML(layout=widgets.Layout(width=f"{KNOB_WIDTH}px"))
        self.custom_box = widgets.VBox(
            [
                widgets.HTML(f"<b>{label('rollout_devices')}</b> (picked: filled)"),
                self.devices_box,
                self.rollout_shape,
                self.custom_note,
            ]
        )
        self.lora = check("lora")
        self.lora_rank = widgets.BoundedIntText(
            value=4, min=1, max=64, description=label("lora_rank"), style=style, layout=wide
        )
        self.lora_separate_base = check("lora_separate_base")
        self.engine = menu("engine", [(ENGINE_LABELS.get(e, e), e) for e in ENGINES], "vanilla")
        self.static_lora = check("sglang_static_lora", True)
        self.offload = check("offload")
        self.rollout_dtype = menu("rollout_dtype", [("as given (float32)", "")] + [(d, d) for d in ROLLOUT_DTYPES], "")
        self.model_size = menu("model_size", list(MODEL_SIZES), "tiny")
        self.with_reward = check("with_reward")
        self.with_critic = check("with_critic")
        anchors = [("full actor state", "full"), ("trainable parameters only", "trainable")]
        self.anchor = menu("anchor", anchors, "full")
        self.sync_chunk_bytes = menu("sync_chunk_bytes", SYNC_CHUNKS, 0)
        self.layout.observe(lambda _c: self._update_custom_visibility(), names="value")
        for knob in (self.lora, self.engine):
            knob.observe(lambda _c: self._update_applicability(), names="value")
        for toggle in self.device_toggles:
            toggle.observe(lambda _c: self._update_shape_options(), names="value")
        self.model_size.observe(lambda _c: self._update_shape_options(), names="value")
        self._update_shape_options()

        # Class names let a browser test find each control.
        for name, w in self.named().items():
            w.add_class(f"rl-{name}")
            w.tooltip = TOOLTIPS[name]
        self._update_applicability()

    def named(self) -> dict[str, widgets.Widget]:
        """Every knob by its name (the CLI flag's, without the dashes; ``core.knobs``)."""
        return {KNOBS[field].name: widget for field, widget in self.by_field().items()}

    def by_field(self) -> dict[str, widgets.Widget]:
        """Every knob by the ``Scenario`` field it sets (``rollout_shape``: the custom mesh's shape)."""
        fields = (
            "layout lora lora_rank lora_separate_base engine sglang_static_lora offload rollout_dtype model_size "
            "with_reward with_critic anchor sync_chunk_bytes rollout_shape"
        )
        return {f: getattr(self, "static_lora" if f == "sglang_static_lora" else f) for f in fields.split()}

    def outlined(self) -> dict[str, widgets.Widget]:
        """What a refusal can outline, by the field it names: every knob, and the custom mesh's
        device buttons (``rollout_devices``)."""
        return {**self.by_field(), "rollout_devices": self.devices_box}

    def _assemble(self) -> widgets.Widget:
        """One column, grouped by concern: where the roles live (P1), the model, LoRA (P2, P4)
        and the anchor (P8), the engine (P3, P6, P7), memory (P14) and the extra roles (P5)."""
        column = (
            "layout custom_box model_size lora lora_rank lora_separate_base anchor engine static_lora rollout_dtype "
            "offload sync_chunk_bytes with_reward with_critic"
        )
        return widgets.VBox([getattr(self, name) for name in column.split()])

    def settings(self) -> dict[str, tuple[str, str]]:
        """Every knob that applies now, by field: its label and its setting as the widget shows it
        (a disabled knob is not read; the custom mesh's knobs count only with the custom layout)."""
        custom = self.layout.value == CUSTOM
        out = {}
        for field, widget in self.outlined().items():
            if getattr(widget, "disabled", False) or (field in ("rollout_shape", "rollout_devices") and not custom):
                continue
            if field == "rollout_devices":
                out[field] = (label(field), ", ".join(str(d.id) for d in self.picked_devices()) or "none")
            else:
                out[field] = (str(widget.description), knob_value(widget))
        return out

    def mark_pending(self, before: dict[str, tuple[str, str]] | None) -> list[tuple[str, str, str]]:
        """Mark the knobs whose setting differs from ``before`` (``settings`` at the last
        Construct; None: no cluster, nothing pending), and only those.

        Returns:
            (label, setting then, setting now) per changed knob, top to bottom.
        """
        now, then = self.settings(), before or {}
        # A knob that applies on one side only changed because another did, which is listed.
        changed = [f for f in now if f in then and now[f] != then[f]]
        for field, widget in self.outlined().items():
            (widget.add_class if field in changed else widget.remove_class)("rl-pending")
        return [(now[f][0], then[f][1], now[f][1]) for f in changed]

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after any knob (or device button) changes."""
        for widget in [*self.by_field().values(), *self.device_toggles]:
            widget.observe(lambda _c: callback(), names="value")

    def mark_at_fault(self, fields: Iterable[str]) -> list[str]:
        """Outline the knobs a refusal names (``ConfigError.knobs``), and only those.

        Returns:
            The fields marked (those that are knobs here).
        """
        wanted = set(fields)
        marked = []
        for field, widget in self.outlined().items():
            if field in wanted:
                widget.add_class("rl-at-fault")
                marked.append(field)
            else:
                widget.remove_class("rl-at-fault")
        return marked

    def not_applicable(self) -> dict[str, str]:
        """The knobs the current choices make irrelevant, each with the reason (shown, and disabled)."""
        out = {}
        if not self.lora.value:
            why = "only with a LoRA actor"
            out.update({"lora-rank": why, "lora-separate-base": why})
            # P8 pins only the adapters when the mode is 'trainable' *and* the actor has LoRA.
            if not anchor_is_partial("trainable", actor_has_lora=False):
                out["anchor"] = "without LoRA both settings pin the actor's whole state (P8)"
        if self.engine.value != "sglang_jax" or not self.lora.value:
            out["static-lora"] = "only for the sglang_jax engine with a LoRA actor (P6)"
        return out

    def _update_applicability(self) -> None:
        off = self.not_applicable()
        for name, w in self.named().items():
            w.disabled = name in off
            w.tooltip = TOOLTIPS[name] + (f" (not used now: {off[name]})" if name in off else "")

    def _update_custom_visibility(self) -> None:
        self.custom_box.layout.display = "flex" if self.layout.value == CUSTOM else "none"

    def _update_shape_options(self) -> None:
        for toggle in self.device_toggles:
            # Picked devices stand out, filled in colour; the others stay plain.
            toggle.button_style = "info" if toggle.value else ""
        picked = len(self.picked_devices())
        options = shape_options(picked, self.model_size.value)
        self.rollout_shape.options = options
        if options:
            # New options leave no selection; the standard shape is the natural one.
            self.rollout_shape.value = options[0][1]
        main = default_shape(len(self.devices))
        self.custom_note.value = (
            "<small>"
            + (
                f"actor, reference, reward, critic: all {len(self.devices)} devices as "
                f"{main[0]} x {main[1]}. Pick them all as {main[0]} x {main[1]} and P1 sees one mesh; "
                "the same devices in another shape are another mesh."
                if options
                else self._no_shape_reason(picked)
            )
            + "</small>"
        )

    def fitting_counts(self) -> list[int]:
        """How many picked devices some shape can hold the model on."""
        return [n for n in range(1, len(self.devices) + 1) if shape_options(n, self.model_size.value)]

    def _no_shape_reason(self, picked: int) -> str:
        """Why the shape menu is empty, in the widgets' words."""
        if not picked:
            return f"No device picked: pick the {label('rollout_devices')} with the buttons above."
        dims = sharded_dims(MODEL_SIZES[self.model_size.value])
        counts = [str(n) for n in self.fitting_counts()]
        either = ", ".join(counts[:-1]) + f" or {counts[-1]}" if len(counts) > 1 else counts[0]
        return (
            f"No {label('rollout_shape')} of {picked} devices fits the {self.model_size.value} model: a shape "
            f"a x b must divide its dimensions {', '.join(map(str, dims['fsdp']))} by a and "
            f"{', '.join(map(str, dims['tp']))} by b. Pick {either} devices, or another {label('model_size')}."
        )

    def picked_devices(self) -> list[jax.Device]:
        return [d for d, t in zip(self.devices, self.device_toggles) if t.value]

    def scenario(self) -> Scenario:
        """The knobs as a Scenario (its own checks raise ConfigError)."""
        layout = "colocated" if self.layout.value == CUSTOM else self.layout.value
        return Scenario(
            layout=layout,
            lora=self.lora.value,
            lora_rank=int(self.lora_rank.value),
            # A knob that does not apply is not used (it is disabled, not cleared): P4 reads it only with LoRA.
            lora_separate_base=self.lora_separate_base.value and self.lora.value,
            engine=self.engine.value,
            offload=self.offload.value,
            rollout_dtype=self.rollout_dtype.value or None,
            model_size=self.model_size.value,
            with_reward=self.with_reward.value,
            with_critic=self.with_critic.value,
            sglang_static_lora=self.static_lora.value,
            anchor=self.anchor.value,
            sync_chunk_bytes=int(self.sync_chunk_bytes.value) or None,
        )

    def role_to_mesh(self) -> dict[Role, Any] | None:
        """None for a standard layout; with the custom layout, the picked rollout mesh."""
        if self.layout.value != CUSTOM:
            return None
        picked = self.picked_devices()
        if not picked or not self.rollout_shape.options:
            reason = self._no_shape_reason(len(picked))
            raise ConfigError(reason, knobs=("rollout_devices",) if not picked else ("rollout_devices", "model_size"))
        # P1: the trainer roles keep the standard mesh; the rollout mesh is that
        # very mesh only when all its devices are picked in the standard shape.
        meshes = layout_meshes("colocated", self.devices)
        meshes[Role.ROLLOUT] = make_mesh(picked, self.rollout_shape.value or default_shape(len(picked)))
        return meshes
