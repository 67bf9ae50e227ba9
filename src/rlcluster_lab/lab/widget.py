"""The placement lab: every knob of a scenario as a widget, and live panels.

The panels read the placement report (``placement_report(cluster,
sync=...).to_json()``) and draw it with the notebooks' own figure functions (SVG,
drawn in milliseconds; ``lab.display``); nothing here decides where a model lives. Only core ipywidgets
are used: each figure is put into an ``Output`` widget as display data (no
ipympl, which Colab does not run). A panel whose part of the report did not
change is not drawn again.

A rebuild releases the previous cluster first, so only one cluster's buffers
are alive at a time, on CPU and on an accelerator alike.
"""

from __future__ import annotations

import contextlib
import gc
import html
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import ipywidgets as widgets
import jax

from rlcluster_lab.app.learner import GRPOLearner, LearnerConfig, StepRecord
from rlcluster_lab.app.report import placement_report
from rlcluster_lab.app.scenario import build_cluster, validate
from rlcluster_lab.cluster import RLCluster
from rlcluster_lab.core.compile_cache import count_compilations
from rlcluster_lab.core.knobs import knobs_of
from rlcluster_lab.lab.controls import KNOB_WIDTH, Knobs
from rlcluster_lab.lab.display import Display, changes_since
from rlcluster_lab.lab.rehearsal import rehearse_next_step
from rlcluster_lab.placement.programs import trim_compiled_programs

# The column of knobs and buttons: the widest knob and a margin.
LEFT_WIDTH = KNOB_WIDTH + 20


def live_buffer_bytes() -> int:
    """Bytes of every live JAX buffer in this process, each buffer counted once.

    A reshard may reuse a buffer inside a new array object, so buffers are
    keyed by (device, pointer) rather than summed per array.
    """
    seen: dict[tuple[int, int], int] = {}
    for x in jax.live_arrays():
        if x.is_deleted():
            continue
        for shard in x.addressable_shards:
            seen[(shard.device.id, shard.data.unsafe_buffer_pointer())] = shard.data.nbytes
    return sum(seen.values())


class PlacementLab:
    """Knobs, buttons and live panels for one cluster at a time.

    Display it in a notebook cell (``PlacementLab(build=True)``). The same
    actions are methods (``construct``, ``sync``, ``train_step``), which is
    how the tests drive it.
    """

    def __init__(
        self,
        *,
        devices: Sequence[jax.Device] | None = None,
        build: bool = False,
        step_config: LearnerConfig | None = None,
        rehearse: bool = True,
    ) -> None:
        """``devices``: what layouts are built on (default ``jax.devices()``; a
        notebook passes ``rl.setup().devices``). ``rehearse``: after each
        Construct, compile the programs of a training step in the background
        (``lab.rehearsal.rehearse_next_step``), so that pressing Training step, after the
        few seconds that takes, runs a step instead of compiling one."""
        self.devices = list(devices) if devices is not None else jax.devices()
        self.rehearse = rehearse
        self._rehearsal: threading.Thread | None = None
        self.rehearsal_error: str | None = None
        self.step_config = step_config or LearnerConfig(steps=1, prompts_per_step=2, group_size=4)
        self._cluster: RLCluster | None = None
        self._learner: GRPOLearner | None = None
        self._sync: Any = None
        self._report: dict[str, Any] | None = None
        self._steps: list[StepRecord] = []
        # What the last Construct changed against the cluster before it (branches, bytes).
        self.changes: list[str] = []
        self.timings: dict[str, Any] = {}  # seconds of the last action's phases
        self.knobs = Knobs(self.devices)
        self.display = Display()
        self._make_buttons()
        self.widget = self._assemble()
        self._refresh_buttons()
        if build:
            self.construct()

    # ------------------------------------------------------------------ widgets

    def _make_buttons(self) -> None:
        self.construct_button = widgets.Button(description="Construct", button_style="primary", icon="cubes")
        self.sync_button = widgets.Button(description="Sync weights", icon="refresh")
        self.step_button = widgets.Button(description="Training step", icon="forward")
        self.progress = widgets.IntProgress(
            value=0,
            min=0,
            max=4,
            # Thin, and hidden rather than removed, so nothing below it moves when it shows.
            layout=widgets.Layout(width=f"{KNOB_WIDTH}px", height="8px", visibility="hidden"),
        )
        self.status = widgets.HTML()
        self.construct_button.on_click(lambda _b: self.construct())
        self.sync_button.on_click(lambda _b: self.sync())
        self.step_button.on_click(lambda _b: self.train_step())
        for name, w in {
            "construct": self.construct_button,
            "sync": self.sync_button,
            "step": self.step_button,
            "status": self.status,
        }.items():
            w.add_class(f"rl-{name}")

    def _assemble(self) -> widgets.Widget:
        """Knobs and buttons in a fixed-width column, the views in tabs beside it: at 1600 x 1000
        the buttons and the view of the last action are on screen together."""
        d = self.display
        actions = widgets.HBox([self.construct_button, self.sync_button, self.step_button])
        left = widgets.VBox(
            [d.style, actions, self.progress, self.status, d.error_box, self.knobs.widget, d.changes],
            layout=widgets.Layout(width=f"{LEFT_WIDTH}px", flex="0 0 auto", margin="0 12px 0 0"),
        )
        left.add_class("rl-controls")
        # Beside the knobs while the views get 480 px or more; under them on a narrower screen.
        d.tabs.layout = widgets.Layout(flex="1 1 480px", min_width="0")
        root = widgets.HBox([left, d.tabs], layout=widgets.Layout(align_items="flex-start", flex_flow="row wrap"))
        root.add_class("rl-lab")
        return root

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    # ------------------------------------------------------------------ state

    @property
    def cluster(self) -> RLCluster | None:
        return self._cluster

    @property
    def report(self) -> dict[str, Any] | None:
        """The report the panels show now (None when no cluster is live)."""
        return self._report

    def release(self) -> str:
        """Drop the live cluster so its buffers are freed; says what happened."""
        if self._cluster is None:
            return "no cluster was live"
        ref = weakref.ref(self._cluster)
        self._cluster = self._learner = None
        self._sync = self._report = None
        self._steps = []
        gc.collect()
        # Compiled programs are kept (bounded caches): the next build with the same
        # layouts reuses them instead of compiling again.
        trim_compiled_programs()
        if ref() is not None and self._rehearsal is not None and self._rehearsal.is_alive():
            # The rehearsal of its training step holds it until its compilation ends (a
            # build does not wait for that); then nothing holds it and its buffers go.
            return (
                "the previous cluster is held by the background compilation of its training step, "
                "still running: its buffers are freed when that ends"
            )
        if ref() is not None:
            # Someone else (a notebook variable) holds it; deleting its buffers
            # under them would break their object, so say so instead.
            return (
                "the previous cluster is still referenced elsewhere (e.g. a notebook variable), "
                "so its buffers stay alive"
            )
        return "previous cluster released"

    # ------------------------------------------------------------------ actions

    def construct(self) -> None:
        """Build the cluster the knobs describe, replacing the live one."""
        with self._busy(f"building a {self.knobs.model_size.value} cluster"):
            try:
                # Every check a build makes runs before anything is released: a
                # combination that cannot work leaves the live cluster and its
                # panels as they are.
                scenario = self.knobs.scenario()
                role_to_mesh = self.knobs.role_to_mesh()
                validate(scenario, devices=self.devices, role_to_mesh=role_to_mesh)
            except Exception as exc:  # noqa: BLE001 - shown in the panel, the lab stays usable
                self._show_error(exc, kept=self._cluster is not None)
                return
            self._stage(1, "releasing the previous cluster")
            previous = self._report
            released = self.release()
            self._stage(2, f"building the models and constructing the cluster ({scenario.model_size})")
            start = time.perf_counter()
            try:
                cluster = build_cluster(scenario, devices=self.devices, role_to_mesh=role_to_mesh)
            except Exception as exc:  # noqa: BLE001 - the cluster's own error, shown as it is
                self._show_error(exc, kept=False)
                self.display.clear("no cluster: construction failed (see the error above)")
                return
            self.timings = {"action": "construct", "work": time.perf_counter() - start}
            self._cluster = cluster
            self._learner = GRPOLearner(cluster, self.step_config)
            self._clear_error()
            self._stage(3, "measuring")
            self._refresh_report()
            self.changes = changes_since(previous, self._report)
            self._stage(4, "drawing")
            self._draw_all()
            self.display.show("flow")
            self._set_status(f"constructed ({released}); {self._timing_text()}")
            self._start_rehearsal()

    def sync(self) -> None:
        """P13: sync the actor's weights into the rollout engine and show what moved."""
        if self._cluster is None:
            self._set_status("construct a cluster first")
            return
        with self._busy("syncing weights"):
            start = time.perf_counter()
            try:
                self._sync = self._cluster.sync_weights()
            except Exception as exc:  # noqa: BLE001
                self._show_error(exc, kept=True)
                return
            self.timings = {"action": "sync", "work": time.perf_counter() - start}
            self._clear_error()
            self._refresh_report()
            self._draw_all()
            self.display.show("sync")
            self._set_status(f"synced: global step {self._cluster.global_steps}; {self._timing_text()}")

    def train_step(self) -> None:
        """One GRPO step on cluster operations (generate, reward, update, sync)."""
        if self._cluster is None or self._learner is None:
            self._set_status("construct a cluster first")
            return
        with self._busy("taking a training step", needs_rehearsal=True):
            start = time.perf_counter()
            try:
                record = self._learner.step()
            except Exception as exc:  # noqa: BLE001
                self._show_error(exc, kept=True)
                return
            self.timings = {"action": "train_step", "work": time.perf_counter() - start}
            self._steps.append(record)
            self._sync = record.sync
            self._clear_error()
            self._refresh_report()
            self._draw_all()
            self.display.show("steps")
            self._set_status(f"step {record.step}: mean reward {record.mean_reward:.3f}; {self._timing_text()}")

    # ------------------------------------------------------------------ drawing

    def _refresh_report(self) -> None:
        assert self._cluster is not None
        start = time.perf_counter()
        self._report = placement_report(self._cluster, sync=self._sync).to_json()
        self.timings["report"] = time.perf_counter() - start

    def _timing_text(self) -> str:
        """What the last action cost, as measured: the work, the report, the redraw."""
        t = self.timings
        redrawn = ", ".join(t.get("redrawn", [])) or "nothing"
        waited = getattr(self, "_waited", 0.0)
        built = getattr(self, "_compiled", [])
        compiled = sum(not cached for _, _, cached in built)
        loaded = len(built) - compiled
        return (
            f"{t.get('work', 0):.2f} s work, {t.get('report', 0):.2f} s report, "
            f"{t.get('draw', 0):.2f} s drawing (redrawn: {redrawn})"
            + (f"; compiled {compiled} program(s)" if compiled else "; nothing compiled")
            + (f", read {loaded} from the compilation cache" if loaded else "")
            + (f", after {waited:.1f} s waiting for the step's programs to compile" if waited > 0.05 else "")
        )

    def _draw_all(self) -> None:
        assert self._report is not None
        self.timings["draw"], self.timings["redrawn"] = self.display.draw(self._report, self._steps, self.changes)

    def _show_error(self, exc: BaseException, *, kept: bool) -> None:
        self.display.show_error(exc, kept=kept)
        self.knobs.mark_at_fault(k.field for k in knobs_of(exc))
        self._set_status("error (see below)")

    def _clear_error(self) -> None:
        self.display.clear_error()
        self.knobs.mark_at_fault(())

    @property
    def error(self) -> str | None:
        """The last action's error (type: message), None after a success."""
        return self.display.error

    @property
    def summary(self) -> widgets.HTML:
        return self.display.summary

    # ------------------------------------------------------------------ status

    def _start_rehearsal(self) -> None:
        """Compile the next training step's programs on a background thread (changes nothing)."""
        learner = self._learner
        if not self.rehearse or learner is None:
            return
        previous = self._rehearsal

        def work() -> None:
            if previous is not None:
                previous.join()  # one rehearsal at a time: two would only compete for the cores
            try:
                rehearse_next_step(learner)
            except Exception as exc:  # noqa: BLE001 - the real step will show the real error
                self.rehearsal_error = f"{type(exc).__name__}: {exc}"

        self.rehearsal_error = None
        # Not a daemon: the interpreter waits for it at exit. A daemon thread stopped inside an
        # XLA compilation aborts the whole process ("terminate called ... exception not rethrown").
        self._rehearsal = threading.Thread(target=work, name="rlcluster-lab-rehearsal", daemon=False)
        self._rehearsal.start()

    def wait_for_rehearsal(self) -> float:
        """Wait until a running rehearsal is done; returns the seconds waited."""
        start = time.perf_counter()
        if self._rehearsal is not None:
            self._rehearsal.join()
            self._rehearsal = None
        return time.perf_counter() - start

    @contextlib.contextmanager
    def _busy(self, what: str, *, needs_rehearsal: bool = False) -> Iterator[None]:
        buttons = (self.construct_button, self.sync_button, self.step_button)
        for b in buttons:
            b.disabled = True
        # A training step uses what the rehearsal compiles: it lets a rehearsal still
        # running finish first (then finds its programs ready, or waits as long as it
        # would have compiling them). Construct and Sync do not wait for it.
        self._waited = self.wait_for_rehearsal() if needs_rehearsal else 0.0
        self.progress.value = 0
        self.progress.layout.visibility = "visible"
        self._set_status(f"busy: {what} ...")
        try:
            with count_compilations() as compiled:
                self._compiled = compiled
                yield
        finally:
            self.timings["compiled"] = sum(not cached for _, _, cached in compiled)
            self.timings["from_cache"] = sum(cached for _, _, cached in compiled)
            self.timings["compile_seconds"] = sum(t for _, t, _ in compiled)
            self.progress.layout.visibility = "hidden"
            self._refresh_buttons()

    def _stage(self, value: int, what: str) -> None:
        self.progress.value = value
        self._set_status(f"busy: {what} ...")

    def _set_status(self, text: str) -> None:
        self.status.value = f"<span>{html.escape(text)}</span>"

    def _refresh_buttons(self) -> None:
        self.construct_button.disabled = False
        self.sync_button.disabled = self.step_button.disabled = self._cluster is None
