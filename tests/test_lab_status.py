"""The lab's status: a wait is shown the moment it begins and redrawn while it lasts; the
sentence keeps one height; a refusal sits beside its knob; the output carries a picture of
the lab for renderers without widgets.

Nothing here is timed: a wait is a stub whose ``join`` records what the status said when it
was called, and the redraw loop is driven by a stub event that records how long it was asked
to wait between redraws.
"""

from __future__ import annotations

import html
import itertools
import re
import threading
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stored_reports import stored

from rlcluster_lab.app.learner import StepRecord
from rlcluster_lab.core.waits import Building, program_words
from rlcluster_lab.lab.widget import display
from rlcluster_lab.lab.widget import placement_lab as widget_module
from rlcluster_lab.lab.widget import status as sentences
from rlcluster_lab.lab.widget.controls import CUSTOM
from rlcluster_lab.lab.widget.placement_lab import PlacementLab
from rlcluster_lab.lab.widget.status import STATUS_HEIGHT_PX, TICK_SECONDS, StatusLine, Ticker, wait_text
from rlcluster_lab.model import MODEL_SIZES


@pytest.fixture
def lab() -> PlacementLab:
    return PlacementLab(rehearse=False)


class StubCompile:
    """A background compile that is still running; its ``join`` notes what the status said."""

    def __init__(self, lab: PlacementLab) -> None:
        self.lab = lab
        self.running = True
        self.error = None
        self.seen: dict[str, object] = {}

    def programs(self) -> list[str]:
        return ["jit(_generate)", "jit(_logps)"]

    def join(self) -> float:
        self.seen["status"] = self.lab.status.text
        self.seen["busy"] = "rl-busy" in self.lab.status.sentence._dom_classes
        self.seen["buttons"] = self.lab.step_button.disabled
        self.running = False
        return 0.0


class StubLearner:
    def __init__(self, lab: PlacementLab) -> None:
        self.lab = lab
        self.seen: dict[str, str] = {}

    def step(self):
        self.seen["status"] = self.lab.status.text
        raise RuntimeError("stub step: stops here")


def test_a_training_step_clicked_during_the_background_compile_says_so_before_it_waits(lab):
    # Issue: the status was set only after the wait for the background compile ended.
    stub = StubCompile(lab)
    learner = StubLearner(lab)
    lab.background, lab._cluster, lab._learner = stub, object(), learner
    lab.step_button.click()
    said = stub.seen["status"]
    assert said.startswith("Training step: waiting for the background compile of its programs: ")
    assert "compiled 2: sampling completions, per-token log-probs" in said
    assert stub.seen["busy"] and stub.seen["buttons"]
    # Then the step itself says what it does, before it starts.
    assert learner.seen["status"].startswith("Training step: sampling, scoring, updating, syncing: ")
    # The stub step failed: the status says so, not busy any more.
    assert lab.status.text == "Failed: see the note by the buttons. The cluster shown is still the previous one."
    assert "<b>RuntimeError</b>: stub step: stops here" in lab.notes.note("actions").value
    assert not lab.status.busy


class StubEvent:
    """``threading.Event`` for the redraw loop: records each timeout, is set after ``rounds``."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.timeouts: list[float] = []

    def wait(self, timeout: float) -> bool:
        self.timeouts.append(timeout)
        return len(self.timeouts) > self.rounds

    def set(self) -> None:
        self.rounds = 0


def test_a_wait_is_shown_at_once_then_redrawn_at_most_half_a_second_apart():
    clock = iter([10.0, 10.0, 10.25, 10.5, 10.75, 11.0])
    shown: list[str] = []
    event = StubEvent(rounds=3)
    ticker = Ticker(shown.append, lambda t: f"{t:.2f}", clock=lambda: next(clock), stop=event)
    ticker.start()  # shows at once; its thread runs the loop
    ticker._thread.join()
    assert shown == ["0.00", "0.25", "0.50", "0.75"]
    assert event.timeouts and all(t == TICK_SECONDS <= 0.5 for t in event.timeouts)


def test_a_wait_shows_a_new_stage_at_once():
    status = StatusLine()
    with status.waiting("Construct: releasing", "construct:tiny") as wait:
        wait.what = "Construct: building"
        assert status.text.startswith("Construct: building: ")  # not at the next redraw
    status.say("done")
    assert status.text == "done" and not status.busy


def test_wait_text_names_the_program_being_built_now():
    from rlcluster_lab.core.waits import Building

    building = (Building("compiling", "jit(grpo_train_step)", 1.94),)
    text = wait_text("Training step", 3.0, None, ["jit(_generate)"], building)
    # The work in a reader's words, never a function's name; the program's place in the wait.
    assert text == "Training step: 3.0 s so far; compiling the actor's optimizer step (1.9 s), program 2"


def test_wait_text_names_what_it_waits_for_the_seconds_the_estimate_and_the_programs():
    text = wait_text("Sync weights", 1.234, 0.5, ["jit(_generate)", "jit(identity)", "jit(cast)", "jit(mystery)"])
    assert text == (
        "Sync weights: 1.2 s so far (last time 0.5 s); compiled 4, latest: "
        "a reshard between two layouts, a cast to the rollout's dtype, another program"
    )
    assert wait_text("Construct", 0.0) == "Construct: 0.0 s so far"
    assert program_words("jit(grpo_train_step)") == "the actor's optimizer step"
    assert program_words("jit(something_internal)") == "another program"


def test_the_last_wait_of_a_kind_is_the_next_ones_estimate():
    status = StatusLine()
    from rlcluster_lab.core.waits import WAITS

    with status.waiting("Sync weights", "sync:test-estimate"):
        assert "last time" not in status.text
    first = WAITS.last("sync:test-estimate")
    assert first is not None
    with status.waiting("Sync weights", "sync:test-estimate"):
        assert f"(last time {first:.1f} s)" in status.text
    assert status.text.startswith("Sync weights: ")  # the last redraw stays until the action's sentence


def test_the_status_spans_the_labs_width_above_the_knobs_and_wraps_rather_than_being_cut(lab):
    # At 1280 x 800 the knobs' column is a third of the lab: a sentence there was cut after two
    # lines. Above the knobs and the views it has the lab's width, two lines at least, and
    # wraps onto more (tests/browser checks the pixels at both sizes).
    top, body = lab.widget.children
    assert lab.status.widget in top.children and lab.status.progress in top.children
    assert lab.status.widget.layout.width == lab.status.progress.layout.width == "100%"
    left = body.children[0]
    assert lab.status.widget not in left.children and lab.knobs.widget in left.children
    for text in ("short", "a long sentence " * 40):
        lab.status.say(text, "details " * 50)
        assert lab.status.text == text and text in lab.status.sentence.value
        assert lab.status.sentence.layout.height is None
        assert lab.status.sentence.layout.min_height == f"{STATUS_HEIGHT_PX}px"
    rule = next(line for line in display.STYLE.splitlines() if ".rl-status .widget-html-content" in line)
    assert "overflow: hidden" not in rule and "line-clamp" not in rule and "white-space: normal" in rule
    # Details are behind the toggle, placed after the knobs: showing them moves no knob.
    assert lab.status.details.layout.display == "none"
    lab.status.toggle.value = True
    assert lab.status.details.layout.display == "block"
    assert left.children.index(lab.status.details) > left.children.index(lab.knobs.widget)


def test_a_refusal_sits_beside_its_knob_and_moves_nothing(lab):
    lab.knobs.engine.value = "sglang_jax"
    lab.knobs.lora.value = True
    lab.knobs.sglang_static_lora.value = False
    left = lab.widget.children[1].children[0]
    before = [id(c) for c in left.children]
    lab.construct_button.click()  # refused by the checks, before any build
    assert lab.notes.shown == "sglang_static_lora"
    note = lab.notes.note("sglang_static_lora")
    # In the knob's own slot, out of the flow (display.STYLE: .rl-note is absolutely placed).
    slot = next(
        w
        for w in _boxes(lab.widget)
        if "rl-slot" in getattr(w, "_dom_classes", ()) and lab.knobs.sglang_static_lora in w.children
    )
    assert note in slot.children and "rl-note" in note._dom_classes
    assert [id(c) for c in left.children] == before
    assert lab.status.text == "Refused: see the note by the outlined knob. No cluster is live now."


def _boxes(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _boxes(child)


def test_sentences_name_one_step_counter():
    sync = {"global_step": 3, "arrived_cross_device_bytes": 0, "relayed_cross_device_bytes": 0, "synced_bytes": 2048}
    assert sentences.synced(sync, 0.05) == (
        "Synced in 0.05 s, now at global step 3: 0 B of the 2.0 KiB synced came from other devices (measured)."
    )
    assert sentences.stepped(4, 0.25, 1.2) == "Training step done in 1.2 s, now at global step 4: mean reward 0.250."


def test_a_rejected_optimizer_step_is_said_in_the_status_and_the_step_log():
    from rlcluster_lab.app.learner import StepRecord
    from rlcluster_lab.lab.widget.display import steps_html

    why = "1 of 2 optimizer steps kept the previous parameters and optimizer state: the loss is not finite"
    assert sentences.stepped(4, 0.25, 1.2, rejected=why) == (
        f"Training step done in 1.2 s, now at global step 4: mean reward 0.250. Rejected: {why}."
    )
    kept = StepRecord(step=0, mean_reward=0.5, loss=0.1, kl=0.0, optimizer_steps=2, sync=None)
    rejected = StepRecord(
        step=1, mean_reward=0.5, loss=float("nan"), kl=0.0, optimizer_steps=2, sync=None, rejected_steps=1, rejected=why
    )
    log = steps_html([kept, rejected])
    assert "<td>2</td></tr>" in log  # the first: no rejection, the count alone
    assert f"<td>2 (<span title='{why}'>1 rejected</span>)</td>" in log


def test_the_output_carries_a_picture_of_the_lab_not_the_widgets_repr(lab):
    bundle = lab._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert not bundle["text/plain"].startswith("HBox(")
    html = bundle["text/html"]
    assert "rl-lab-picture" in html and "<style" not in html and "<svg" not in html
    assert "LoRA actor" in html and "Decision flow" in html  # the knobs, the views' tabs
    # The knobs in the order the column shows them.
    assert (
        html.index(">layout<") < html.index(">model size<") < html.index(">LoRA actor<") < html.index(">critic model<")
    )
    assert lab.status.text in html


def test_the_background_compile_runs_one_at_a_time_and_records_its_programs():
    from rlcluster_lab.lab.widget.rehearsal import BackgroundCompile

    gate = threading.Event()
    compile_ = BackgroundCompile()
    # A thread standing for a running rehearsal: join waits for it.
    compile_._thread = threading.Thread(target=gate.wait)
    compile_._thread.start()
    assert compile_.running
    gate.set()
    compile_.join()
    assert not compile_.running and compile_.programs() == []


# ------------------------------------------------------------------ a lab on a stand-in cluster


class StandInCluster:
    """What the lab asks of a cluster between its report's reads: a sync, the step counter."""

    def __init__(self) -> None:
        self.global_steps = 0

    def sync_weights(self) -> SimpleNamespace:
        self.global_steps += 1
        return SimpleNamespace(global_step=self.global_steps)


class StandInLearner:
    def __init__(self, cluster: StandInCluster, config: object) -> None:
        self.cluster = cluster

    def step(self) -> StepRecord:
        return StepRecord(1, 0.5, 0.1, 0.0, 1, sync=self.cluster.sync_weights())


@pytest.fixture
def stand_in(monkeypatch) -> PlacementLab:
    """A lab whose builds give a stand-in cluster and whose report is a stored one: the widget's
    own code runs (its status, knobs and views), no cluster is built. ``lab.built`` lists the
    scenarios it was asked to build."""
    lab = PlacementLab(rehearse=False)
    lab.built = []

    def build(scenario, *, devices, role_to_mesh):
        lab.built.append(scenario)
        return StandInCluster()

    def report(cluster, sync=None):
        data = stored("colocated-lora")
        data["sync"] = None if sync is None else {**data["sync"], "global_step": sync.global_step}
        return SimpleNamespace(to_json=lambda: data)

    monkeypatch.setattr(widget_module, "build_cluster", build)
    monkeypatch.setattr(widget_module, "placement_report", report)
    monkeypatch.setattr(widget_module, "GRPOLearner", StandInLearner)
    return lab


def _record(lab: PlacementLab) -> list[str]:
    """Every text the status line shows from now on."""
    shown: list[str] = []
    real = lab.status._show
    lab.status._show = lambda text: (shown.append(text), real(text))[1]
    return shown


def _seconds(pattern: str, texts: list[str]) -> list[float]:
    return [float(m) for t in texts for m in re.findall(pattern, t)]


def test_every_time_the_status_says_counts_from_the_click_on_one_clock(stand_in):
    # Issue: "0.5 s so far" then "Constructed in 0.2 s"; a 6.1 s wait then "done in 2.1 s".
    lab = stand_in
    readings = itertools.count()
    lab.status.clock = lambda: 0.25 * next(readings)  # every reading a quarter second later
    shown = _record(lab)
    lab.construct()
    said = _seconds(r"(\d+\.\d) s so far", shown)
    assert said and lab.status.text.startswith("Constructed in ")
    assert max(said) <= _seconds(r"^Constructed in (\d+\.\d) s", [lab.status.text])[0]
    # A training step clicked while the background compile runs, begun 6 s before the click (what
    # the lab read before it counted from the click): the click is where its seconds start.
    stub = StubCompile(lab)
    stub.started, stub.last_seconds = time.perf_counter() - 6.0, 9.7
    lab.background = stub
    shown.clear()
    lab.step_button.click()
    said = _seconds(r"(\d+\.\d) s so far", shown)
    assert any(t.startswith("Training step: waiting for the background compile") for t in shown)
    total = _seconds(r"^Training step done in (\d+\.\d) s", [lab.status.text])
    assert said and total and max(said) <= total[0], (shown, lab.status.text)
    waited = _seconds(r"\((\d+\.\d) s of it waiting for the background compile\)", [lab.status.text])
    assert waited and waited[0] <= total[0]


def test_a_program_shown_compiling_during_the_wait_is_named_when_it_ends(stand_in, monkeypatch):
    # The wait said "compiling ..." and then the details "nothing compiled".
    lab = stand_in
    now = (Building("compiling", "jit(grpo_train_step)", 1.9),)
    monkeypatch.setattr(sentences, "building_now", lambda: now)
    shown = _record(lab)
    lab.construct()
    assert any("compiling the actor's optimizer step (1.9 s)" in t for t in shown)
    details = lab.status.details.value
    assert "nothing compiled" not in details
    shown_words = "the actor&#x27;s optimizer step"
    assert f"built meanwhile in another thread (the background compile), as shown: {shown_words}" in details


def test_a_knob_changed_since_construct_is_marked_and_sync_says_it_used_the_constructed_cluster(stand_in):
    # Issue: a new sync chunk size was silently ignored by Sync while the panels showed the old cluster.
    lab = stand_in
    lab.construct()
    assert all(note.layout.display == "none" for note in lab.display.stale.values())
    lab.knobs.sync_chunk_bytes.value = 16 << 10
    pending = [f for f, w in lab.knobs.outlined().items() if "rl-pending" in w._dom_classes]
    assert pending == ["sync_chunk_bytes"]
    label = lab.knobs.sync_chunk_bytes.description
    for view, note in lab.display.stale.items():
        assert note.layout.display == "block", view
        assert f"not applied until Construct: {label} one piece \u2192 16 KiB" in note.value
    assert "not applied until Construct" in lab._repr_mimebundle_()["text/html"]  # the picture says it too
    lab.sync()
    assert lab.status.text.startswith(
        f"Sync used the constructed cluster ({label}: one piece, not 16 KiB): Construct to apply the knobs. Synced in "
    )
    # A knob that does not apply now (the LoRA rank without LoRA) is not pending.
    lab.knobs.lora_rank.value = 8
    assert lab.pending() == [(label, "one piece", "16 KiB")]
    lab.construct()
    assert lab.built[-1].sync_chunk_bytes == 16 << 10
    assert lab.pending() == [] and all(note.layout.display == "none" for note in lab.display.stale.values())
    assert not any("rl-pending" in w._dom_classes for w in lab.knobs.outlined().values())
    lab.knobs.sync_chunk_bytes.value = 0
    lab.knobs.sync_chunk_bytes.value = 16 << 10  # back to what was constructed: nothing pending
    assert lab.pending() == []


@pytest.mark.parametrize("details", ["", "0.2 s from the click"])
def test_an_answer_reaches_the_page_before_the_busy_mark_leaves(details: str) -> None:
    """Each widget change is a message of its own, shown in order: the sentence and details
    change first, then the busy mark goes, so a page (or a test waiting for "not busy and a new
    sentence") never takes the wait's last text for the answer."""
    status = StatusLine()
    order: list[str] = []
    status.sentence.observe(lambda c: order.append(c.name), names=["value", "_dom_classes"])
    status.details.observe(lambda c: order.append("details"), names=["value"])
    with status.waiting("Sync weights: handing over", "sync:tiny"):
        pass
    order.clear()
    status.say("Synced in 0.2 s.", details)
    assert order[-1] == "_dom_classes" and "rl-busy" not in status.sentence._dom_classes
    assert order[0] == "value" and (not details or "details" in order)


class StubSyncCluster:
    def __init__(self, lab: PlacementLab) -> None:
        self.lab = lab
        self.seen: dict[str, str] = {}

    def sync_weights(self):
        self.seen["status"] = self.lab.status.text
        raise RuntimeError("stub sync: stops here")

    def devices(self):
        # The devices whose allocator the sync reads: the live cluster's own.
        return self.lab.devices[:1]


@pytest.mark.parametrize("allocator", [True, False])
def test_a_sync_waits_for_the_background_compile_only_where_the_allocator_peak_would_count_it(
    lab, monkeypatch, allocator
):
    # The allocator keeps one peak per process: a rehearsal's arrays made during the sync would
    # count as the sync's. Devices without allocator figures measure the sync's own arrays only.
    read = []
    monkeypatch.setattr(
        widget_module,
        "allocator_before",
        lambda devices: read.append(devices) or ({"0": (0, 0)} if allocator else None),
    )
    stub, cluster = StubCompile(lab), StubSyncCluster(lab)
    lab.background, lab._cluster = stub, cluster
    lab.sync_button.click()
    if allocator:
        assert stub.seen["status"].startswith("Sync weights: waiting for the background compile to finish: ")
        assert stub.seen["busy"] and not stub.running
    else:
        assert "status" not in stub.seen and stub.running
    assert cluster.seen["status"].startswith("Sync weights: handing the actor's weights to the rollout: ")
    assert "<b>RuntimeError</b>: stub sync: stops here" in lab.notes.note("actions").value
    assert read == [lab.devices[:1]]  # the live cluster's devices (a single chip's layouts are on the chip)


# A knob change that always changes something, as a user makes one after a refusal.
_KNOB_CHANGES = {
    "a device button": lambda knobs, i: setattr(
        knobs.device_toggles[i % 8], "value", not knobs.device_toggles[i % 8].value
    ),
    "LoRA": lambda knobs, _i: setattr(knobs.lora, "value", not knobs.lora.value),
    "offload": lambda knobs, _i: setattr(knobs.offload, "value", not knobs.offload.value),
    "reward model": lambda knobs, _i: setattr(knobs.with_reward, "value", not knobs.with_reward.value),
    "engine": lambda knobs, i: setattr(
        knobs.engine, "value", [v for v in ("vanilla", "vllm", "sglang_jax") if v != knobs.engine.value][i % 2]
    ),
    "sync chunk": lambda knobs, i: setattr(
        knobs.sync_chunk_bytes,
        "value",
        [v for _, v in knobs.sync_chunk_bytes.options if v != knobs.sync_chunk_bytes.value][i % 2],
    ),
}


def _refuse(lab: PlacementLab, cause: str, picked: int) -> None:
    """Set knobs the checks refuse (before any build) and press Construct."""
    if cause == "custom mesh":
        lab.knobs.layout.value = CUSTOM
        for toggle in lab.knobs.device_toggles[picked:]:
            toggle.value = False  # 3, 5, 6 or 7 devices: no shape of them divides the tiny model
    else:
        lab.knobs.engine.value = "sglang_jax"
        lab.knobs.lora.value = True
        lab.knobs.sglang_static_lora.value = False
    lab.construct_button.click()
    assert lab.notes.shown is not None and lab.status.text.startswith("Refused")


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    cause=st.sampled_from(["custom mesh", "static LoRA"]),
    picked=st.sampled_from([3, 5, 6, 7]),
    change=st.sampled_from(sorted(_KNOB_CHANGES)),
    which=st.integers(0, 15),
)
def test_a_refusals_note_is_gone_as_soon_as_any_knob_changes(cause, picked, change, which):
    """Custom rollout mesh, three devices picked, Construct refused; pick a fourth (or change any
    other knob): the note, its outline and the status' refusal belong to the settings before."""
    lab = PlacementLab(rehearse=False)
    _refuse(lab, cause, picked)
    said = lab.notes.text
    _KNOB_CHANGES[change](lab.knobs, which)
    assert lab.notes.shown is None and all(lab.notes.note(n).layout.display == "none" for n in lab.knobs.outlined())
    assert not any("rl-at-fault" in w._dom_classes for w in lab.knobs.outlined().values())
    assert not lab.status.text.startswith("Refused") and "The knobs changed since the refusal" in lab.status.text
    assert said in html.unescape(lab.status.details.value)  # what it said, kept for the settings before


@settings(max_examples=12, deadline=None, derandomize=True)
@given(size=st.sampled_from(sorted(MODEL_SIZES)), rank=st.integers(-2, 3000), offset=st.sampled_from([None, 0, 1]))
def test_a_lora_rank_the_model_does_not_allow_is_said_where_it_is_chosen_never_clamped(size, rank, offset):
    """The rank box keeps what was typed; above the model's largest useful rank (or below 1) the
    note beside it says so in the words Construct refuses it with, and goes once it is fixed."""
    bound = MODEL_SIZES[size].max_lora_rank
    rank = rank if offset is None else bound + offset
    lab = PlacementLab(rehearse=False)
    lab.knobs.lora.value = True
    lab.knobs.model_size.value = size
    lab.knobs.lora_rank.value = rank
    assert lab.knobs.lora_rank.value == rank  # not clamped
    allowed = 1 <= rank <= bound
    if allowed:
        assert lab.notes.shown is None
        return
    said = f"between 1 and {bound} for the {size} model" if rank > bound else "must be at least 1"
    assert lab.notes.shown == "lora_rank" and said in lab.notes.text
    note = lab.notes.text
    lab.construct_button.click()  # refused before any build, in the same words
    assert lab.cluster is None and lab.error == note
    lab.knobs.lora_rank.value = bound  # fixed: the refusal's note is gone, and no rank note comes back
    assert lab.notes.shown is None and "The knobs changed since the refusal" in lab.status.text
