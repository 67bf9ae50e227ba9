"""The placement lab: every knob of a scenario as a widget, and live panels.

The panels read the placement report (``placement_report(cluster,
sync=...).to_json()``) and draw it with ``rlcluster_lab.panels`` (SVG, drawn in
milliseconds); nothing here decides where a model lives. Only core ipywidgets
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
import json
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import ipywidgets as widgets
import jax

from rlcluster_lab import panels
from rlcluster_lab.cluster import RLCluster
from rlcluster_lab.config import KNOWN_ENGINES
from rlcluster_lab.learner import GRPOLearner, LearnerConfig, StepRecord
from rlcluster_lab.meshes import default_shape, layout_meshes, make_mesh, reachable_layouts
from rlcluster_lab.model import MODEL_SIZES
from rlcluster_lab.report import placement_report
from rlcluster_lab.compile_cache import count_compilations, trim_compiled_programs
from rlcluster_lab.roles import Role
from rlcluster_lab.scenario import ROLLOUT_DTYPES, Scenario, build_cluster, validate

CUSTOM = "custom"
_ENGINE_LABELS = {
    "vanilla": "vanilla",
    "vllm": "vllm (JAX placement stand-in)",
    "sglang_jax": "sglang_jax (JAX placement stand-in)",
}
_PANELS = ("flow", "grid", "memory", "sync")
_TITLES = {
    "flow": "Decision flow (L1): the branches that fired are highlighted",
    "grid": "Devices: which role holds what, on which device",
    "memory": "Memory (L2): physical bytes per device and per role, by memory kind",
    "sync": "Weight sync (P13, L3): bytes against the minimum the placement allows",
}


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


def shape_options(count: int) -> list[tuple[str, tuple[int, int]]]:
    """Every (fsdp, tp) arrangement of ``count`` devices, the lab's standard one first."""
    shapes = [default_shape(count)] if count else []
    shapes += [(a, count // a) for a in range(1, count + 1) if count % a == 0 and (a, count // a) not in shapes]
    return [(f"{a} x {b}", (a, b)) for a, b in shapes]


def svg_output(svg: str, alt: str) -> dict[str, Any]:
    """One display-data output holding an SVG figure (``panels``)."""
    return {"output_type": "display_data", "data": {"image/svg+xml": str(svg), "text/plain": alt}, "metadata": {}}


def text_output(text: str) -> dict[str, Any]:
    return {"output_type": "display_data", "data": {"text/plain": text}, "metadata": {}}


class _SyncRecorder:
    """The cluster as the learner sees it, keeping what its own sync reported.

    The learner syncs at the end of every step (P13); the sync panel shows
    that measured sync instead of syncing a second time.
    """

    def __init__(self, cluster: RLCluster) -> None:
        self._cluster = cluster
        self.last_sync: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)

    def sync_weights(self) -> Any:
        self.last_sync = self._cluster.sync_weights()
        return self.last_sync


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
        (``GRPOLearner.rehearse``), so that pressing Training step, after the
        few seconds that takes, runs a step instead of compiling one."""
        self.devices = list(devices) if devices is not None else jax.devices()
        self.rehearse = rehearse
        self._rehearsal: threading.Thread | None = None
        self.rehearsal_error: str | None = None
        self.step_config = step_config or LearnerConfig(steps=1, prompts_per_step=2, group_size=4)
        self._cluster: RLCluster | None = None
        self._recorder: _SyncRecorder | None = None
        self._learner: GRPOLearner | None = None
        self._sync: Any = None
        self._report: dict[str, Any] | None = None
        self._steps: list[StepRecord] = []
        self._drawn: dict[str, str] = {}  # panel -> the data its figures were drawn from
        self.timings: dict[str, Any] = {}  # seconds of the last action's phases
        self.error: str | None = None
        self._make_knobs()
        self._make_panels()
        self.widget = self._assemble()
        self._update_custom_visibility()
        self._refresh_buttons()
        if build:
            self.construct()

    # ------------------------------------------------------------------ widgets

    def _make_knobs(self) -> None:
        style = {"description_width": "130px"}
        wide = widgets.Layout(width="330px")
        auto = widgets.Layout(width="auto")
        layouts = reachable_layouts(self.devices) + [CUSTOM]
        self.layout = widgets.Dropdown(
            options=[(name if name != CUSTOM else "custom rollout mesh", name) for name in layouts],
            value=layouts[0], description="layout", style=style, layout=wide,
        )
        self.device_toggles = [
            widgets.ToggleButton(value=True, description=str(d.id), tooltip=str(d), layout=widgets.Layout(width="38px"))
            for d in self.devices
        ]
        self.rollout_shape = widgets.Dropdown(description="rollout shape", style=style, layout=wide)
        self.custom_note = widgets.HTML()
        self.custom_box = widgets.VBox(
            [widgets.HTML("<b>rollout devices</b>"), widgets.HBox(self.device_toggles), self.rollout_shape, self.custom_note]
        )
        self.lora = widgets.Checkbox(value=False, description="LoRA actor", indent=False, layout=auto)
        self.lora_rank = widgets.BoundedIntText(value=4, min=1, max=64, description="LoRA rank", style=style, layout=wide)
        self.lora_separate_base = widgets.Checkbox(
            value=False, description="LoRA over a separate copy of the base (P4 warns)", indent=False, layout=auto
        )
        self.engine = widgets.Dropdown(
            options=[(_ENGINE_LABELS.get(e, e), e) for e in KNOWN_ENGINES], value="vanilla",
            description="rollout engine", style=style, layout=wide,
        )
        self.static_lora = widgets.Checkbox(
            value=True, description="static-LoRA settings for sglang_jax (P6)", indent=False, layout=auto
        )
        self.offload = widgets.Checkbox(value=False, description="offload to pinned host (P14)", indent=False, layout=auto)
        self.rollout_dtype = widgets.Dropdown(
            options=[("as given (float32)", "")] + [(d, d) for d in ROLLOUT_DTYPES], value="",
            description="rollout dtype", style=style, layout=wide,
        )
        self.model_size = widgets.Dropdown(
            options=list(MODEL_SIZES), value="tiny", description="model size", style=style, layout=wide
        )
        self.with_reward = widgets.Checkbox(value=False, description="reward model", indent=False, layout=auto)
        self.with_critic = widgets.Checkbox(value=False, description="critic model", indent=False, layout=auto)
        self.anchor = widgets.Dropdown(
            options=[("full actor state", "full"), ("trainable parameters only", "trainable")], value="full",
            description="anchor (P8)", style=style, layout=wide,
        )
        self.construct_button = widgets.Button(description="Construct", button_style="primary", icon="cubes")
        self.sync_button = widgets.Button(description="Sync weights", icon="refresh")
        self.step_button = widgets.Button(description="Training step", icon="forward")
        self.progress = widgets.IntProgress(value=0, min=0, max=4, layout=widgets.Layout(width="200px", visibility="hidden"))
        self.status = widgets.HTML()

        self.construct_button.on_click(lambda _b: self.construct())
        self.sync_button.on_click(lambda _b: self.sync())
        self.step_button.on_click(lambda _b: self.train_step())
        self.layout.observe(lambda _c: self._update_custom_visibility(), names="value")
        for toggle in self.device_toggles:
            toggle.observe(lambda _c: self._update_shape_options(), names="value")
        self._update_shape_options()

        # Class names let a browser test find each control.
        for name, w in {
            "layout": self.layout, "lora": self.lora, "lora-rank": self.lora_rank,
            "lora-separate-base": self.lora_separate_base, "engine": self.engine, "static-lora": self.static_lora,
            "offload": self.offload, "rollout-dtype": self.rollout_dtype, "model-size": self.model_size,
            "reward": self.with_reward, "critic": self.with_critic, "anchor": self.anchor,
            "construct": self.construct_button, "sync": self.sync_button, "step": self.step_button,
            "status": self.status, "rollout-shape": self.rollout_shape,
        }.items():
            w.add_class(f"rl-{name}")

    def _make_panels(self) -> None:
        self.error_box = widgets.HTML(layout=widgets.Layout(display="none"))
        self.error_box.add_class("rl-error")
        self.summary = widgets.HTML()
        self.summary.add_class("rl-summary")
        self.step_log = widgets.HTML()
        self.step_log.add_class("rl-step-log")
        self.outputs = {name: widgets.Output(layout=widgets.Layout(min_height="120px")) for name in _PANELS}
        for name, out in self.outputs.items():
            out.add_class(f"rl-panel-{name}")

    def _assemble(self) -> widgets.Widget:
        column = widgets.Layout(margin="0 16px 0 0")
        knobs = widgets.HBox(
            [
                widgets.VBox([self.layout, self.custom_box, self.model_size, self.anchor], layout=column),
                widgets.VBox([self.lora, self.lora_rank, self.lora_separate_base, self.engine, self.static_lora], layout=column),
                widgets.VBox([self.offload, self.rollout_dtype, self.with_reward, self.with_critic], layout=column),
            ],
            layout=widgets.Layout(flex_flow="row wrap"),
        )
        actions = widgets.HBox(
            [self.construct_button, self.sync_button, self.step_button, self.progress, self.status],
            layout=widgets.Layout(align_items="center"),
        )
        # Each panel keeps its figure's own width and they wrap: side by side on
        # a wide screen, one under the other on a narrow one.
        cells = [
            widgets.VBox([widgets.HTML(f"<b>{html.escape(_TITLES[name])}</b>"), self.outputs[name]],
                         layout=widgets.Layout(border="1px solid #ddd", padding="4px", margin="0 8px 8px 0"))
            for name in _PANELS
        ]
        grid = widgets.Box(cells, layout=widgets.Layout(flex_flow="row wrap", align_items="flex-start"))
        root = widgets.VBox([knobs, actions, self.error_box, self.summary, grid, self.step_log])
        root.add_class("rl-lab")
        return root

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def _update_custom_visibility(self) -> None:
        self.custom_box.layout.display = "flex" if self.layout.value == CUSTOM else "none"

    def _update_shape_options(self) -> None:
        options = shape_options(len(self.picked_devices()))
        self.rollout_shape.options = options
        if options:
            # New options leave no selection; the standard shape is the natural one.
            self.rollout_shape.value = options[0][1]
        main = default_shape(len(self.devices))
        self.custom_note.value = (
            f"<small>actor, reference, reward, critic: all {len(self.devices)} devices as "
            f"{main[0]} x {main[1]}. Pick them all as {main[0]} x {main[1]} and P1 sees one mesh; "
            "the same devices in another shape are another mesh.</small>"
        )

    def picked_devices(self) -> list[jax.Device]:
        return [d for d, t in zip(self.devices, self.device_toggles) if t.value]

    # ------------------------------------------------------------------ knobs -> scenario

    def scenario(self) -> Scenario:
        """The knobs as a Scenario (its own checks raise ConfigError)."""
        layout = "colocated" if self.layout.value == CUSTOM else self.layout.value
        return Scenario(
            layout=layout,
            lora=self.lora.value,
            lora_rank=int(self.lora_rank.value),
            lora_separate_base=self.lora_separate_base.value,
            engine=self.engine.value,
            offload=self.offload.value,
            rollout_dtype=self.rollout_dtype.value or None,
            model_size=self.model_size.value,
            with_reward=self.with_reward.value,
            with_critic=self.with_critic.value,
            sglang_static_lora=self.static_lora.value,
            anchor=self.anchor.value,
        )

    def role_to_mesh(self) -> dict[Role, Any] | None:
        """None for a standard layout; with the custom layout, the picked rollout mesh."""
        if self.layout.value != CUSTOM:
            return None
        picked = self.picked_devices()
        if not picked:
            raise ValueError("the custom rollout mesh needs at least one device: pick some with the device buttons")
        # P1: the trainer roles keep the standard mesh; the rollout mesh is that
        # very mesh only when all its devices are picked in the standard shape.
        meshes = layout_meshes("colocated", self.devices)
        meshes[Role.ROLLOUT] = make_mesh(picked, self.rollout_shape.value or default_shape(len(picked)))
        return meshes

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
        self._cluster = self._recorder = self._learner = None
        self._sync = self._report = None
        self._steps = []
        gc.collect()
        # Compiled programs are kept (bounded caches): the next build with the same
        # layouts reuses them instead of compiling again.
        trim_compiled_programs()
        if ref() is not None:
            # Someone else (a notebook variable) holds it; deleting its buffers
            # under them would break their object, so say so instead.
            return "the previous cluster is still referenced elsewhere (e.g. a notebook variable), so its buffers stay alive"
        return "previous cluster released"

    # ------------------------------------------------------------------ actions

    def construct(self) -> None:
        """Build the cluster the knobs describe, replacing the live one."""
        with self._busy(f"building a {self.model_size.value} cluster"):
            try:
                # Every check a build makes runs before anything is released: a
                # combination that cannot work leaves the live cluster and its
                # panels as they are.
                scenario = self.scenario()
                role_to_mesh = self.role_to_mesh()
                validate(scenario, devices=self.devices, role_to_mesh=role_to_mesh)
            except Exception as exc:  # noqa: BLE001 - shown in the panel, the lab stays usable
                self._show_error(exc, kept=self._cluster is not None)
                return
            self._stage(1, "releasing the previous cluster")
            released = self.release()
            self._stage(2, f"building the models and constructing the cluster ({scenario.model_size})")
            start = time.perf_counter()
            try:
                cluster = build_cluster(scenario, devices=self.devices, role_to_mesh=role_to_mesh)
            except Exception as exc:  # noqa: BLE001 - the cluster's own error, shown as it is
                self._show_error(exc, kept=False)
                self._clear_panels("no cluster: construction failed (see the error above)")
                return
            self.timings = {"action": "construct", "work": time.perf_counter() - start}
            self._cluster = cluster
            self._recorder = _SyncRecorder(cluster)
            self._learner = GRPOLearner(self._recorder, self.step_config)  # type: ignore[arg-type]
            self._clear_error()
            self._stage(3, "measuring")
            self._refresh_report()
            self._stage(4, "drawing")
            self._draw_all()
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
            self._set_status(f"synced: global step {self._cluster.global_steps}; {self._timing_text()}")

    def train_step(self) -> None:
        """One GRPO step on cluster operations (generate, reward, update, sync)."""
        if self._cluster is None or self._learner is None or self._recorder is None:
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
            self._sync = self._recorder.last_sync
            self._clear_error()
            self._refresh_report()
            self._draw_all()
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
        return (f"{t.get('work', 0):.2f} s work, {t.get('report', 0):.2f} s report, "
                f"{t.get('draw', 0):.2f} s drawing (redrawn: {redrawn})"
                + (f"; compiled {compiled} program(s)" if compiled else "; nothing compiled")
                + (f", read {loaded} from the compilation cache" if loaded else "")
                + (f", after {waited:.1f} s waiting for the step's programs to compile" if waited > 0.05 else ""))

    def _draw_all(self) -> None:
        """Redraw the panels whose data changed since they were last drawn; returns nothing.

        Each panel's figures are pure functions of part of the report (the
        decisions, the memory, the sync): a panel whose part is unchanged keeps
        its figures, and the time each drawing took is kept in ``timings``.
        """
        report = self._report
        assert report is not None
        start = time.perf_counter()
        self.summary.value = summary_html(report)
        self.step_log.value = steps_html(self._steps)
        sync = report.get("sync")
        memory = report["memory"]
        draws: dict[str, tuple[Any, list[Callable[[], Any]] | str]] = {
            "flow": ((report["decisions"], report["sharing_map"], report["rollout_branch"], report["anchor"]),
                     [lambda: panels.decision_flow(report)]),
            "grid": ((report["role_to_mesh"], report["config_role_to_mesh"], memory),
                     [lambda: panels.device_grid(report)]),
            "memory": (memory, [lambda: panels.memory_by_device(memory), lambda: panels.memory_by_role(memory)]),
            "sync": (sync, [lambda: panels.sync_bytes(sync)] if sync
                     else "no sync measured yet: press Sync weights (P13)"),
        }
        redrawn = []
        for name, (data, draw) in draws.items():
            key = json.dumps(data, sort_keys=True, default=str)
            if self._drawn.get(name) == key:
                continue
            self.outputs[name].outputs = self._render(name, draw)
            self._drawn[name] = key
            redrawn.append(name)
        self.timings["draw"] = time.perf_counter() - start
        self.timings["redrawn"] = redrawn

    def _render(self, name: str, draw: list[Callable[[], Any]] | str) -> tuple[dict[str, Any], ...]:
        if isinstance(draw, str):
            return (text_output(draw),)
        try:
            return tuple(svg_output(fig(), _TITLES[name]) for fig in draw)
        except Exception as exc:  # noqa: BLE001 - one broken figure must not take the lab down
            return (text_output(f"could not draw this panel: {type(exc).__name__}: {exc}"),)

    def _clear_panels(self, text: str) -> None:
        self._drawn = {}
        self.summary.value = ""
        self.step_log.value = ""
        for out in self.outputs.values():
            out.outputs = (text_output(text),)

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
                learner.rehearse()
            except Exception as exc:  # noqa: BLE001 - the real step will show the real error
                self.rehearsal_error = f"{type(exc).__name__}: {exc}"

        self.rehearsal_error = None
        self._rehearsal = threading.Thread(target=work, name="rlcluster-lab-rehearsal", daemon=True)
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

    def _show_error(self, exc: BaseException, *, kept: bool) -> None:
        message = " ".join(str(exc).split())
        self.error = f"{type(exc).__name__}: {message}"
        after = (
            "The cluster shown below is still the previous one."
            if kept
            else "No cluster is live now; change the knobs and press Construct."
        )
        self.error_box.value = (
            f"<div style='border:1px solid #c00;background:#fee;padding:6px'>"
            f"<b>{html.escape(type(exc).__name__)}</b>: {html.escape(message)}<br><i>{after}</i></div>"
        )
        self.error_box.layout.display = "block"
        self._set_status("error (see below)")

    def _clear_error(self) -> None:
        self.error = None
        self.error_box.value = ""
        self.error_box.layout.display = "none"


def summary_html(report: dict[str, Any]) -> str:
    """The report's headline facts: sharing map, rollout branch, meshes, anchor, memory, warnings."""
    rows = "".join(
        f"<tr><td>{html.escape(role)}</td><td>{html.escape(', '.join(others) or '(none)')}</td>"
        f"<td>{_mesh_text(report['role_to_mesh'].get(role))}</td></tr>"
        for role, others in report["sharing_map"].items()
    )
    memory = report.get("memory") or {}
    lines = [
        f"platform <b>{html.escape(str(report['platform']))}</b>, {report['device_count']} device(s); "
        f"engine <b>{html.escape(report['engine'])}</b>"
        + ("; LoRA actor" if report["lora"] else "")
        + ("; offload to pinned host" if report["offload_to_cpu"] else ""),
        f"rollout branch (P3): <b>{html.escape(report['rollout_branch'])}</b>; "
        f"rollout samples with the actor's own buffers: <b>{report['rollout_shares_actor_weights']}</b>; "
        f"reference shares the actor's backbone: <b>{report['reference_shares_backbone']}</b>",
    ]
    if report.get("mesh_overridden_by_engine"):
        lines.append("P7: the engine replaced the rollout mesh; the sharing map was built from the config's meshes")
    anchor = report["anchor"]
    lines.append(f"anchor (P8): {anchor['bytes']:,} bytes in {html.escape(str(anchor['memory_kind']))}")
    if memory:
        lines.append(
            f"memory (measured, physical bytes): {memory['unique_bytes']:,} in unique buffers, "
            f"{memory['naive_bytes']:,} if every role held its own"
        )
    warnings = "".join(f"<li>{html.escape(w)}</li>" for w in report["warnings"])
    return (
        "<div class='rl-sharing'><b>sharing map (P1, P2)</b>"
        "<table style='text-align:left'><tr><th>role</th><th>shares weights with</th><th>mesh (after construction)</th></tr>"
        f"{rows}</table></div>"
        + "".join(f"<div>{line}</div>" for line in lines)
        + (f"<ul class='rl-warnings'>{warnings}</ul>" if warnings else "")
    )


def _mesh_text(mesh: dict[str, Any] | None) -> str:
    if not mesh:
        return "(not present)"
    shape = " x ".join(f"{k}={v}" for k, v in mesh["shape"].items())
    return html.escape(f"{shape} on devices {mesh['device_ids']}")


def steps_html(steps: Sequence[StepRecord]) -> str:
    if not steps:
        return ""
    rows = "".join(
        f"<tr><td>{s.step}</td><td>{s.mean_reward:.3f}</td><td>{s.loss:+.4f}</td><td>{s.kl:.2e}</td>"
        f"<td>{s.optimizer_steps}</td></tr>"
        for s in steps
    )
    return (
        "<b>training steps</b> (toy reward: lowercase letters in the completion)"
        "<table style='text-align:left'><tr><th>step</th><th>mean reward</th><th>loss</th><th>kl</th><th>optimizer steps</th></tr>"
        f"{rows}</table>"
    )
