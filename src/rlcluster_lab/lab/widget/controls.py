"""The lab's knobs: one widget per knob of a ``Scenario``, and the scenario they describe.

Each control is built from its knob in the one table (``core.knobs``: kind, label, options
or range, default, tooltip; the layouts are those these devices can hold); nothing here
decides where a model lives. The ``PlacementLab`` (``lab.widget.placement_lab``) owns the buttons and
the panels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import ipywidgets as widgets
import jax

from rlcluster_lab.app.scenario import Scenario
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.knobs import KNOBS, SCENARIO_KNOBS, Knob, describe
from rlcluster_lab.core.meshes import (
    default_shape,
    fitting_shapes,
    layout_meshes,
    make_mesh,
    reachable_layouts,
    sharded_dims,
)
from rlcluster_lab.core.roles import Role
from rlcluster_lab.lab.notebook.setup import LayoutFamily
from rlcluster_lab.model import MODEL_SIZES
from rlcluster_lab.rules.anchor import anchor_is_partial
from rlcluster_lab.rules.validation import check_lora_rank

CUSTOM = "custom"
# One column of knobs: every label and every choice shown whole (the widest choice,
# "sglang_jax (JAX placement stand-in)", needs about 250 px beside a 120 px label).
KNOB_WIDTH = 400
LABEL_WIDTH = 120
# The knobs shown as one widget each (the custom mesh's device buttons are a row of their own).
CONTROLS = tuple(k for k in KNOBS.values() if k.label and k.widget != "buttons")


def label(field: str) -> str:
    """The knob's label on screen: the one ``core.knobs`` table, which errors name too."""
    text = KNOBS[field].label
    assert text is not None, f"{field} is not a lab knob"
    return text


def control(knob: Knob, options: Sequence[tuple[str, Any]] | None = None) -> widgets.Widget:
    """The knob's widget: its kind, label, options (``options``: what these devices offer) or
    range, default and tooltip, from the one table (``core.knobs``)."""
    common = {"description": knob.label, "tooltip": knob.tooltip}
    if knob.widget == "checkbox":
        return widgets.Checkbox(value=knob.default, indent=False, layout=widgets.Layout(width="auto"), **common)
    style, wide = {"description_width": f"{LABEL_WIDTH}px"}, widgets.Layout(width=f"{KNOB_WIDTH}px")
    if knob.widget == "number box":
        # Unbounded: a bounded box would clamp a typed rank without a word. A rank the model size
        # does not allow is said beside the box as it is typed (``Knobs.rank_problem``) and refused
        # by Construct with the same words (``rules.validation.check_lora_rank``).
        return widgets.IntText(value=knob.default, style=style, layout=wide, **common)
    options = list(options or knob.options or knob.choices or ())
    value = options[0][1] if knob.default is None and options else knob.default
    return widgets.Dropdown(options=options, value=value, style=style, layout=wide, **common)


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
        devices: the devices the layouts are built on (and the custom rollout mesh picks from).
        families: which layouts are built on which devices (``LabDevices.families``); the layout
            menu then names where each is built. None: every layout ``devices`` can form, on them.
    """

    def __init__(self, devices: Sequence[jax.Device], families: Sequence[LayoutFamily] | None = None) -> None:
        self.devices = list(devices)
        self.families = tuple(families or ())
        self._make()
        self.widget = self._assemble()
        self._update_custom_visibility()

    def _make(self) -> None:
        # Every control but the custom mesh's device buttons is built from its knob; the layouts
        # offered are those these devices can hold.
        layouts = [(f.label(n), n) for f in self.families for n in f.layouts] or [
            (n, n) for n in reachable_layouts(self.devices)
        ]
        layouts.append(("custom rollout mesh", CUSTOM))
        for knob in CONTROLS:
            setattr(self, knob.field, control(knob, layouts if knob.field == "layout" else None))
        self.device_toggles = [
            widgets.ToggleButton(value=True, description=str(d.id), tooltip=str(d), layout=widgets.Layout(width="44px"))
            for d in self.devices
        ]
        self.devices_box = widgets.HBox(self.device_toggles, layout=widgets.Layout(flex_flow="row wrap"))
        self.custom_note = widgets.HTML(layout=widgets.Layout(width=f"{KNOB_WIDTH}px"))
        title = widgets.HTML(f"<b>{label('rollout_devices')}</b> (picked: filled)")
        self.custom_box = widgets.VBox([title, self.devices_box, self.rollout_shape, self.custom_note])
        self.layout.observe(lambda _c: self._update_custom_visibility(), names="value")
        for knob in (self.lora, self.engine):
            knob.observe(lambda _c: self._update_applicability(), names="value")
        for widget in [*self.device_toggles, self.model_size]:
            widget.observe(lambda _c: self._update_shape_options(), names="value")
        self._update_shape_options()
        for name, w in self.named().items():
            w.add_class(f"rl-{name}")  # lets a browser test find each control
        for toggle, d in zip(self.device_toggles, self.devices):
            toggle.add_class(f"rl-device-{d.id}")
        self._update_applicability()

    def named(self) -> dict[str, widgets.Widget]:
        """Every knob by its name (the CLI flag's, without the dashes; ``core.knobs``)."""
        return {KNOBS[field].name: widget for field, widget in self.by_field().items()}

    def by_field(self) -> dict[str, widgets.Widget]:
        """Every knob by the ``Scenario`` field it sets (``rollout_shape``: the custom mesh's shape)."""
        return {k.field: getattr(self, k.field) for k in CONTROLS}

    def outlined(self) -> dict[str, widgets.Widget]:
        """What a refusal can outline, by the field it names: every knob, and the custom mesh's
        device buttons (``rollout_devices``)."""
        return {**self.by_field(), "rollout_devices": self.devices_box}

    def _assemble(self) -> widgets.Widget:
        """One column, grouped by concern: where the roles live (P1), the model, LoRA (P2, P4)
        and the anchor (P8), the engine (P3, P6, P7), memory (P14) and the extra roles (P5)."""
        column = (
            "layout custom_box model_size lora lora_rank lora_separate_base anchor engine sglang_static_lora "
            "rollout_dtype offload sync_chunk_bytes with_reward with_critic"
        )
        return widgets.VBox([getattr(self, name) for name in column.split()])

    def settings(self) -> dict[str, tuple[str, str]]:
        """Every knob that applies now, by field: its label and its setting as the widget shows it
        (a disabled knob is not read; the custom mesh's knobs count only with the custom layout)."""
        custom = self.layout.value == CUSTOM
        return {
            field: self.shown(field)
            for field, widget in self.outlined().items()
            if not getattr(widget, "disabled", False) and (custom or field not in ("rollout_shape", "rollout_devices"))
        }

    def shown(self, field: str) -> tuple[str, str]:
        """A knob's label and its setting as the widget shows it (the custom mesh's devices: the picked ones)."""
        if field == "rollout_devices":
            return label(field), ", ".join(str(d.id) for d in self.picked_devices()) or "none"
        widget = self.by_field()[field]
        return str(widget.description), knob_value(widget)

    def mark_pending(self, before: dict[str, tuple[str, str]] | None) -> list[tuple[str, str, str]]:
        """Mark the knobs whose setting differs from ``before`` (``settings`` at the last Construct;
        None: no cluster, nothing pending), and only those; returns (label, setting then, setting
        now) per changed knob, top to bottom."""
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
        """Outline the knobs a refusal names (``ConfigError.knobs``), and only those; returns the
        fields marked (those that are knobs here)."""
        wanted = set(fields)
        for field, widget in self.outlined().items():
            (widget.add_class if field in wanted else widget.remove_class)("rl-at-fault")
        return [field for field in self.outlined() if field in wanted]

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
        for field, w in self.by_field().items():
            name = KNOBS[field].name
            w.disabled = name in off
            w.tooltip = KNOBS[field].tooltip + (f" (not used now: {off[name]})" if name in off else "")

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
        note = (
            f"actor, reference, reward, critic: all {len(self.devices)} devices as {main[0]} x {main[1]}. Pick them "
            f"all as {main[0]} x {main[1]} and P1 sees one mesh; the same devices in another shape are another mesh."
            if options
            else self._no_shape_reason(picked)
        )
        self.custom_note.value = f"<small>{note}</small>"

    def _no_shape_reason(self, picked: int) -> str:
        """Why the shape menu is empty, in the widgets' words."""
        if not picked:
            return f"No device picked: pick the {label('rollout_devices')} with the buttons above."
        dims = sharded_dims(MODEL_SIZES[self.model_size.value])
        # How many picked devices some shape can hold the model on.
        counts = [str(n) for n in range(1, len(self.devices) + 1) if shape_options(n, self.model_size.value)]
        either = ", ".join(counts[:-1]) + f" or {counts[-1]}" if len(counts) > 1 else counts[0]
        return (
            f"No {label('rollout_shape')} of {picked} devices fits the {self.model_size.value} model: a shape "
            f"a x b must divide its dimensions {', '.join(map(str, dims['fsdp']))} by a and "
            f"{', '.join(map(str, dims['tp']))} by b. Pick {either} devices, or another {label('model_size')}."
        )

    def layout_devices(self) -> list[jax.Device]:
        """The devices the chosen layout is built on: its family's, else ``devices`` (the custom
        rollout mesh's trainer roles are on ``devices`` too)."""
        chosen = self.layout.value
        return next((list(f.devices) for f in self.families if chosen in f.layouts), self.devices)

    def rank_problem(self) -> str | None:
        """Why Construct would refuse the LoRA rank the box shows on the chosen model size, in
        its words: the knob's own check (at least 1), then the model's bound (P12's adapters:
        ``rules.validation.check_lora_rank``). None: it would not, or no LoRA uses the rank."""
        if self.lora_rank.disabled:
            return None
        try:
            check_lora_rank(KNOBS["lora_rank"].check(self.lora_rank.value), MODEL_SIZES[self.model_size.value])
        except ConfigError as exc:
            return describe(exc, "lab")
        return None

    def picked_devices(self) -> list[jax.Device]:
        return [d for d, t in zip(self.devices, self.device_toggles) if t.value]

    def scenario(self) -> Scenario:
        """The knobs as a Scenario (its own checks raise ConfigError)."""
        shown = self.by_field()
        knobs = {k.field: shown[k.field].value for k in SCENARIO_KNOBS if k.field in shown}
        knobs.update({f: v or None for f, v in knobs.items() if KNOBS[f].default is None})  # the options for None
        if knobs["layout"] == CUSTOM:
            knobs["layout"] = "colocated"  # the trainer roles' meshes; ``role_to_mesh`` adds the rollout's
        # A knob that does not apply is not used (it is disabled, not cleared): P4 reads it only with LoRA.
        knobs["lora_separate_base"] = knobs["lora_separate_base"] and knobs["lora"]
        return Scenario(**knobs)

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
