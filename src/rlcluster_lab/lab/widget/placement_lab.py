"""The placement lab: every knob of a scenario as a widget, and live panels.

The panels draw the placement report (``placement_report(cluster, sync=...).to_json()``)
with the notebooks' own figure functions (``lab.widget.display``); nothing here decides where a
model lives. The status says what each action does while it does it (``lab.widget.status``), and a
refusal's message sits beside the knob it names (``Notes``) until any knob changes. A rebuild releases the previous
cluster first, so only one cluster's buffers are alive at a time, on CPU and on an
accelerator alike.
"""

from __future__ import annotations

import contextlib
import gc
import html
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import ipywidgets as widgets
import jax

from rlcluster_lab.app.learner import GRPOLearner, LearnerConfig, StepRecord
from rlcluster_lab.app.report import placement_report
from rlcluster_lab.app.scenario import build_cluster, check_memory, validate
from rlcluster_lab.core.compile_cache import count_compilations
from rlcluster_lab.core.knobs import describe, knobs_of
from rlcluster_lab.core.meshes import device_list
from rlcluster_lab.lab.figures.flow import changes_since
from rlcluster_lab.lab.notebook.setup import LayoutFamily
from rlcluster_lab.lab.notebook.warm import STEP_SIZES
from rlcluster_lab.lab.widget import status as sentences
from rlcluster_lab.lab.widget.controls import KNOB_WIDTH, Knobs
from rlcluster_lab.lab.widget.display import Display, mimebundle
from rlcluster_lab.lab.widget.rehearsal import BackgroundCompile
from rlcluster_lab.lab.widget.status import StatusLine
from rlcluster_lab.measure.sync import with_floor
from rlcluster_lab.measure.sync_peak import allocator_before
from rlcluster_lab.placement.programs import trim_compiled_programs
from rlcluster_lab.rl_cluster import RLCluster

# The column of knobs and buttons: the widest knob and a margin.
LEFT_WIDTH = KNOB_WIDTH + 20


class PlacementLab:
    """Knobs, buttons and live panels for one cluster at a time: display it in a notebook cell
    (``PlacementLab(build=True)``). The actions are methods too (``construct``, ``sync``,
    ``train_step``), which is how the tests drive it."""

    def __init__(
        self,
        *,
        devices: Sequence[jax.Device] | None = None,
        families: Sequence[LayoutFamily] | None = None,
        build: bool = False,
        rehearse: bool = True,
    ) -> None:
        """``devices``: what layouts are built on (default ``jax.devices()``; a notebook passes
        ``rl.setup().devices``). ``families``: which layouts are built on which devices
        (``rl.setup().families``). ``rehearse``: after each Construct, compile a training step's
        programs in the background (``lab.widget.rehearsal``), so that Training step runs instead of compiling."""
        self.devices = device_list(devices)  # refused before any widget is made
        self.rehearse = rehearse
        self.background = BackgroundCompile()
        self.step_config = LearnerConfig(**STEP_SIZES)  # the step the warm start compiles ahead (``lab.notebook.warm``)
        self._cluster: RLCluster | None = None
        self._learner: GRPOLearner | None = None
        self._sync: Any = None
        self._report: dict[str, Any] | None = None
        self._steps: list[StepRecord] = []
        self.changes: list[str] = []  # what the last Construct changed against the cluster before it
        self.timings: dict[str, Any] = {}  # seconds of the last action's phases
        self.error: str | None = None  # the last action's error (type: message), None after a success
        self._waited = 0.0  # seconds the last action waited for the background compile
        self._compiled: list[tuple[str, float, bool]] = []  # programs the running action built
        # Each family's devices refused as ``devices`` are (not a list of JAX devices, one listed twice).
        checked = [LayoutFamily(tuple(device_list(f.devices, "families")), f.layouts) for f in families or ()]
        self.knobs = Knobs(self.devices, checked)
        self._constructed: dict[str, tuple[str, str]] | None = None  # the knobs' settings at the last Construct
        self._failed = False  # whether the note shown is a failure's (else a refusal's)
        self._from_action = False  # whether the note shown is an action's (a refusal or failure), not the rank box's
        self.display, self.status, self.notes = Display(), StatusLine(), Notes()
        self._make_buttons()
        self.widget = self._assemble()
        self._refresh_buttons()
        self.knobs.on_change(self._knobs_changed)
        self.status.say("Press Construct to build the cluster the knobs describe.")
        if build:
            self.construct()

    def _make_buttons(self) -> None:
        self.construct_button = widgets.Button(description="Construct", button_style="primary", icon="cubes")
        self.sync_button = widgets.Button(description="Sync weights", icon="refresh")
        self.step_button = widgets.Button(description="Training step", icon="forward")
        self.construct_button.on_click(lambda _b: self.construct())
        self.sync_button.on_click(lambda _b: self.sync())
        self.step_button.on_click(lambda _b: self.train_step())
        for name, w in {"construct": self.construct_button, "sync": self.sync_button, "step": self.step_button}.items():
            w.add_class(f"rl-{name}")

    def _assemble(self) -> widgets.Widget:
        """The status across the lab's width, then knobs and buttons in a fixed-width column and
        the views in tabs beside it: at 1600 x 1000 and 1280 x 800 the buttons and the view of
        the last action are on screen together, and the status wraps rather than being cut off.
        What can change height (the changes, the details) comes after the knobs, so no knob
        moves."""
        d, s = self.display, self.status
        actions = widgets.HBox([self.construct_button, self.sync_button, self.step_button])
        left = widgets.VBox(
            [actions, self.knobs.widget, d.changes, s.details],
            layout=widgets.Layout(width=f"{LEFT_WIDTH}px", flex="0 0 auto", margin="0 12px 0 0"),
        ).add_class("rl-controls")
        self.notes.wrap(left, {**self.knobs.outlined(), "actions": actions})
        # Beside the knobs while the views get 480 px or more; under them on a narrower screen.
        d.tabs.layout = widgets.Layout(flex="1 1 480px", min_width="0")
        body = widgets.HBox([left, d.tabs], layout=widgets.Layout(align_items="flex-start", flex_flow="row wrap"))
        top = widgets.VBox([d.style, s.progress, s.widget], layout=widgets.Layout(width="100%"))
        return widgets.VBox([top, body], layout=widgets.Layout(width="100%")).add_class("rl-lab")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        # The live widget, and a picture of it for renderers that cannot draw one (display.mimebundle).
        return mimebundle(self.widget._repr_mimebundle_(**kwargs), self.knobs, self.display, self.status.text)

    @property
    def cluster(self) -> RLCluster | None:
        return self._cluster

    @property
    def report(self) -> dict[str, Any] | None:
        """The report the panels show now (None when no cluster is live)."""
        return self._report

    @property
    def summary(self) -> widgets.HTML:
        return self.display.summary

    def release(self) -> str:
        """Drop the live cluster so its buffers are freed; says what happened."""
        if self._cluster is None:
            return "no cluster was live"
        ref = weakref.ref(self._cluster)
        self._cluster = self._learner = self._sync = self._report = None
        self._steps = []
        gc.collect()
        trim_compiled_programs()  # bounded: the next build of the same layouts reuses what is kept
        if ref() is not None and self.background.running:
            return (
                "the previous cluster is held by the background compilation of its training step, "
                "still running: its buffers are freed when that ends"
            )
        if ref() is not None:
            # Deleting its buffers under whoever holds it would break their object: say so instead.
            return (
                "the previous cluster is still referenced elsewhere (e.g. a notebook variable), "
                "so its buffers stay alive"
            )
        return "previous cluster released"

    def construct(self) -> None:
        """Build the cluster the knobs describe, replacing the live one."""
        size = self.knobs.model_size.value
        with self._busy():
            try:
                # Every check a build makes runs before anything is released: a combination that
                # cannot work, or a cluster that would not fit in memory (counting what releasing
                # the live one frees), leaves the live cluster and its panels as they are.
                scenario = self.knobs.scenario()
                role_to_mesh = self.knobs.role_to_mesh()
                devices = self.knobs.layout_devices()
                config = validate(scenario, devices=devices, role_to_mesh=role_to_mesh)
                # What releasing the live cluster frees counts only on the platform it was on.
                same = self._report is not None and self._report["platform"] == devices[0].platform
                check_memory(scenario, config, self._report["memory"]["by_device"] if same else None)
            except Exception as exc:  # noqa: BLE001 - shown beside its knob, the lab stays usable
                self._show_error(exc, kept=self._cluster is not None)
                return
            # One wait from the click to the drawing, saying which stage it is in; its seconds and the
            # sentence's count from the click (the status' one clock).
            with self._waiting("construct", "Construct: releasing the previous cluster") as wait:
                self.status.stage(1)
                previous, released = self._report, self.release()
                wait.what = f"Construct: building the {size} models and the cluster"
                self.status.stage(2)
                start = self.status.clock()
                try:
                    cluster = build_cluster(scenario, devices=devices, role_to_mesh=role_to_mesh)
                except Exception as exc:  # noqa: BLE001 - the cluster's own error, shown as it is
                    self._constructed = None
                    self.pending()
                    self._show_error(exc, kept=False, failed=True)
                    self.display.clear("no cluster: construction failed (see the note beside the buttons)")
                    return
                self.timings = {"action": "construct", "work": self.status.clock() - start}
                self._cluster, self._learner = cluster, GRPOLearner(cluster, self.step_config)
                # With a rehearsal, the first Training step finds its programs built: no helpers.
                self._learner.builds_ahead = not self.rehearse
                self._learner.sync_peak = True  # the sync view shows a training step's peak
                self._constructed = self.knobs.settings()
                wait.what = "Construct: measuring the placement and drawing it"
                self.status.stage(3)
                self._refresh_report()
                self.changes = changes_since(previous, self._report)
                self._draw("flow")
            self._done(sentences.constructed(self._report, self._total()), released)
            if self.rehearse:
                self.background.start(self._learner)

    def sync(self) -> None:
        """P13: sync the actor's weights into the rollout engine and show what moved."""
        if self._cluster is None:
            self.status.say("Construct a cluster first.")
            return
        with self._busy():
            if self.background.running and allocator_before(self._cluster.devices()):
                # The sync's allocator peak is one per process: arrays the rehearsal makes meanwhile
                # would count in it, so the sync waits for it (devices without allocator figures
                # measure the sync's own arrays only, and need not wait).
                self._wait_for_background("Sync weights: waiting for the background compile to finish")
            with self._waiting("sync", "Sync weights: handing the actor's weights to the rollout") as wait:
                start = self.status.clock()
                try:
                    self._sync = self._cluster.sync_weights()
                except Exception as exc:  # noqa: BLE001
                    self._show_error(exc, kept=True, failed=True)
                    return
                self.timings = {"action": "sync", "work": self.status.clock() - start}
                self._sync = self._floored(self._sync)
                wait.what = "Sync weights: measuring what moved and drawing it"
                self._refresh_report()
                self._draw("sync")
            # A knob changed since Construct is not the cluster's: the sync ran as constructed, and says so.
            self._done(self._unapplied("Sync") + sentences.synced(self._report["sync"], self._total()))

    def train_step(self) -> None:
        """One GRPO step on cluster operations (generate, reward, update, sync)."""
        if self._cluster is None or self._learner is None:
            self.status.say("Construct a cluster first.")
            return
        with self._busy():
            # A training step uses what the background compile builds: it lets one still running
            # finish first (then finds its programs ready).
            self._wait_for_background("Training step: waiting for the background compile of its programs")
            with self._waiting("step", "Training step: sampling, scoring, updating, syncing") as wait:
                start = self.status.clock()
                try:
                    record = self._learner.step()
                except Exception as exc:  # noqa: BLE001
                    self._show_error(exc, kept=True, failed=True)
                    return
                self.timings = {"action": "train_step", "work": self.status.clock() - start}
                self._steps.append(record)
                self._sync = self._floored(record.sync)
                wait.what = "Training step: measuring and drawing"
                self._refresh_report()
                self._draw("steps")
            self._done(
                self._unapplied("Training step")
                + sentences.stepped(
                    self._cluster.global_steps, record.mean_reward, self._total(), self._waited, record.rejected
                )
            )

    def _wait_for_background(self, what: str) -> None:
        """Let a background compile still running finish, saying ``what`` the moment it is clicked."""
        if not self.background.running:
            return
        with self._waiting("background", what, self.background.programs):
            start = self.status.clock()
            self.background.join()
            self._waited = self.status.clock() - start

    def _waiting(self, action: str, what: str, programs: Callable[[], list[str]] | None = None) -> Any:
        """The status' wait for ``action``: comparable with the same action's on the same model size."""
        return self.status.waiting(what, f"{action}:{self.knobs.model_size.value}", programs=programs or self._programs)

    def _programs(self) -> list[str]:
        return [name for name, _, _ in list(self._compiled)]

    def pending(self) -> list[tuple[str, str, str]]:
        """The knobs changed since the last Construct (label, setting then, setting now): marked on
        the knobs, and every view labelled as showing the constructed cluster (called on every
        knob change)."""
        changed = self.knobs.mark_pending(self._constructed if self._cluster is not None else None)
        self.display.mark_stale(changed)
        return changed

    def _knobs_changed(self) -> None:
        """After any knob change: the knobs changed since Construct are marked (``pending``), and
        a refusal's or failure's note, which belongs to the settings that caused it, is taken
        down with its outline; the status says so, and its details keep what was said then."""
        self.pending()
        if self.status.busy:
            return
        if self.notes.shown is not None and self._from_action:
            said = self.notes.text
            self.notes.clear()
            self.knobs.mark_at_fault(())
            self._from_action = False
            outlived = sentences.note_outlived(self._failed, self._cluster is not None)
            self.status.say(outlived, sentences.said_before(said or ""))
        self._say_rank()

    def _say_rank(self) -> None:
        """A LoRA rank the model size does not allow is said beside the rank box as it is chosen,
        in the words Construct would refuse it with (never clamped); the note goes when it is fixed."""
        problem = self.knobs.rank_problem()
        if problem is not None and not self._from_action:
            self.notes.show("lora_rank", "ConfigError", problem, "Construct refuses it.")
        elif problem is None and self.notes.shown == "lora_rank" and not self._from_action:
            self.notes.clear()

    def _unapplied(self, action: str) -> str:
        said = sentences.not_applied(action, self.pending())
        return f"{said} " if said else ""

    def _total(self) -> float:
        """Seconds since the click, on the status' clock (what every time the status says counts from)."""
        self.timings["total"] = self.status.elapsed()
        return self.timings["total"]

    def _floored(self, sync: Any) -> Any:
        """The sync's report with one device_put of the same tree timed beside it (the sync view
        draws both); as it was where that cannot be measured (it needs a moment's copy of the tree)."""
        try:
            return with_floor(self._cluster, sync)
        except Exception:  # noqa: BLE001 - a figure beside the sync, never a reason to lose it
            return sync

    def _refresh_report(self) -> None:
        start = self.status.clock()
        self._report = placement_report(self._cluster, sync=self._sync).to_json()
        self.timings["report"] = self.status.clock() - start

    def _draw(self, view: str) -> None:
        """Redraw what changed and show ``view``, the one the action changed."""
        self.error = None
        self.notes.clear()
        self._from_action = False
        self.knobs.mark_at_fault(())
        self.timings["draw"], self.timings["redrawn"] = self.display.draw(self._report, self._steps, self.changes)
        self.display.show(view)
        self.pending()

    def _done(self, sentence: str, released: str = "") -> None:
        shown = self.status.building_shown
        self.status.say(sentence, sentences.details(self.timings, self._compiled, self._waited, released, shown))

    def _show_error(self, exc: BaseException, *, kept: bool, failed: bool = False) -> None:
        """The message beside the first knob it names (outlined with the others), or beside the
        buttons; the status says where it is and which cluster is live."""
        message = describe(exc, "lab")
        self.error = f"{type(exc).__name__}: {message}"
        named = knobs_of(exc)
        marked = self.knobs.mark_at_fault(k.field for k in named)
        first = next((k.field for k in named if k.field in marked), "actions")  # the likeliest fix first
        self.notes.show(first, type(exc).__name__, message, sentences.LIVE_AFTER[kept])
        self._failed, self._from_action = failed, True
        self.status.say(sentences.refused(kept, first != "actions", failed=failed), self.error)

    @contextlib.contextmanager
    def _busy(self) -> Iterator[None]:
        for b in (self.construct_button, self.sync_button, self.step_button):
            b.disabled = True
        self.status.begin()
        self._waited = 0.0
        try:
            with count_compilations() as compiled:
                self._compiled = compiled
                yield
        finally:
            self.timings["compiled"] = sum(not cached for _, _, cached in compiled)
            self.timings["from_cache"] = sum(cached for _, _, cached in compiled)
            self.timings["compile_seconds"] = sum(t for _, t, _ in compiled)
            self.status.done()
            self._refresh_buttons()

    def _refresh_buttons(self) -> None:
        self.construct_button.disabled = False
        self.sync_button.disabled = self.step_button.disabled = self._cluster is None


class Notes:
    """One hidden note per named control, shown beside it on demand (one at a time): a refusal's
    message by the knob it names, over the views and out of the page's flow (``.rl-note``), so
    showing or hiding it moves nothing."""

    def __init__(self) -> None:
        self._notes: dict[str, widgets.HTML] = {}
        self.shown: str | None = None  # the control whose note is shown
        self.text: str | None = None  # what it says

    def wrap(self, box: widgets.Box, targets: Mapping[str, widgets.Widget]) -> None:
        """Put each of ``targets`` found inside ``box`` (at any depth of boxes) into a slot with
        its own note; the rest of the layout is unchanged."""
        by_id = {id(w): name for name, w in targets.items()}
        children = []
        for child in box.children:
            name = by_id.get(id(child))
            if name is not None:
                note = widgets.HTML(layout=widgets.Layout(display="none")).add_class("rl-note")
                self._notes[name] = note.add_class(f"rl-note-{name}")
                child = widgets.VBox([child, note]).add_class("rl-slot")
            elif isinstance(child, widgets.Box):
                self.wrap(child, targets)
            children.append(child)
        box.children = tuple(children)

    def show(self, name: str, title: str, message: str, after: str) -> None:
        """Show the note beside ``name`` (hiding any other): a bold title, the message, and a
        last line in italics."""
        self.clear()
        note = self._notes[name]
        note.value = f"<b>{html.escape(title)}</b>: {html.escape(message)}<br><i>{html.escape(after)}</i>"
        note.layout.display = "block"
        self.shown, self.text = name, f"{title}: {message}"

    def clear(self) -> None:
        for note in self._notes.values():
            note.value = ""
            note.layout.display = "none"
        self.shown = self.text = None

    def note(self, name: str) -> widgets.HTML:
        """The note widget beside ``name``."""
        return self._notes[name]
