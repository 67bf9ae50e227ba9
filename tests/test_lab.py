"""The placement lab driven headless: set widget values, click buttons, read the panels.

Every assertion is about what the report and the figures show after a click,
as the rules say they must.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import jax  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from hypothesis import example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rlcluster_lab.lab.widget import placement_lab as lab_module  # noqa: E402
from rlcluster_lab.lab.widget.controls import CUSTOM, shape_options  # noqa: E402
from rlcluster_lab.lab.widget.display import VIEWS  # noqa: E402
from rlcluster_lab.lab.widget.placement_lab import PlacementLab  # noqa: E402


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


def png(lab: PlacementLab, panel: str) -> str:
    """The panel's first figure (SVG markup)."""
    data = lab.display.outputs[panel].outputs[0]["data"]
    assert "image/svg+xml" in data, f"panel {panel} shows no figure: {data.get('text/plain')}"
    return data["image/svg+xml"]


def panel_text(lab: PlacementLab, panel: str) -> str:
    return lab.display.outputs[panel].outputs[0]["data"]["text/plain"]


@pytest.fixture
def lab() -> PlacementLab:
    lab = PlacementLab(rehearse=False)
    yield lab
    lab.release()


def build(lab: PlacementLab) -> dict:
    lab.construct_button.click()
    assert lab.error is None, lab.error
    assert lab.report is not None
    return lab.report


def test_knobs_become_the_scenario(lab: PlacementLab) -> None:
    lab.knobs.layout.value = "split"
    lab.knobs.lora.value = True
    lab.knobs.lora_rank.value = 8
    lab.knobs.engine.value = "sglang_jax"
    lab.knobs.sglang_static_lora.value = False
    lab.knobs.offload.value = True
    lab.knobs.rollout_dtype.value = "bfloat16"
    lab.knobs.model_size.value = "small"
    lab.knobs.with_reward.value = True
    lab.knobs.anchor.value = "trainable"
    s = lab.knobs.scenario()
    assert (s.layout, s.lora, s.lora_rank, s.engine, s.sglang_static_lora) == ("split", True, 8, "sglang_jax", False)
    assert (s.offload, s.rollout_dtype, s.model_size, s.with_reward, s.with_critic, s.anchor) == (
        True,
        "bfloat16",
        "small",
        True,
        False,
        "trainable",
    )
    assert lab.knobs.role_to_mesh() is None
    lab.knobs.rollout_dtype.value = ""
    assert lab.knobs.scenario().rollout_dtype is None


def test_knobs_and_buttons_beside_the_views_in_tabs(lab: PlacementLab) -> None:
    # At 1600 x 1000 the buttons and the last action's view are on screen together
    # (tests/browser checks the pixels): one fixed column of knobs, the views in tabs.
    top, body = lab.widget.children  # the status across the lab's width, above the knobs and views
    assert lab.status.widget in top.children
    controls, tabs = body.children
    assert "rl-controls" in controls._dom_classes and controls.layout.width == f"{lab_module.LEFT_WIDTH}px"
    actions = controls.children[0].children[0]  # in its slot, beside its note
    assert lab.construct_button in actions.children
    assert lab.knobs.widget in controls.children
    assert tabs is lab.display.tabs
    assert [tabs.get_title(i) for i in range(len(tabs.children))] == [t for _, t in VIEWS]
    lab.display.show("memory")
    assert lab.display.shown == "memory" and tabs.selected_index == 3


def test_before_construct_only_construct_is_enabled(lab: PlacementLab) -> None:
    assert not lab.construct_button.disabled
    assert lab.sync_button.disabled and lab.step_button.disabled
    assert lab.cluster is None and lab.report is None


@pytest.mark.cluster
def test_construct_fills_every_panel_from_the_report(lab: PlacementLab) -> None:
    report = build(lab)
    for panel in ("flow", "grid", "memory"):
        assert png(lab, panel)
    assert "press Sync weights" in panel_text(lab, "sync")
    assert report["sync"] is None and report["memory"]["unique_bytes"] > 0
    assert "sharing map" in lab.summary.value and report["rollout_branch"] in lab.summary.value
    assert not lab.sync_button.disabled and not lab.step_button.disabled
    assert plt.get_fignums() == []  # every figure closed after drawing


@pytest.mark.cluster
def test_P1_reshaped_layout_is_a_second_copy_and_the_panels_change(lab: PlacementLab) -> None:
    colocated = build(lab)
    assert "rollout" in colocated["sharing_map"]["actor"]
    assert colocated["rollout_branch"] == "shared"
    before = {p: png(lab, p) for p in ("flow", "grid", "memory")}
    summary = lab.summary.value
    lab.knobs.layout.value = "reshaped"
    reshaped = build(lab)
    assert reshaped["sharing_map"]["actor"] == []
    assert reshaped["rollout_branch"] == "second_copy"
    # Same eight chips, another mesh: the rollout holds its own bytes (P1, P3).
    assert reshaped["memory"]["unique_bytes"] > colocated["memory"]["unique_bytes"]
    for panel, image in before.items():
        assert png(lab, panel) != image, panel
    assert lab.summary.value != summary


@pytest.mark.cluster
def test_P1_custom_rollout_mesh_same_devices_same_shape_is_shared(lab: PlacementLab) -> None:
    lab.knobs.layout.value = CUSTOM
    assert lab.knobs.custom_box.layout.display == "flex"
    assert all(t.value for t in lab.knobs.device_toggles)
    lab.knobs.rollout_shape.value = (2, 4)
    assert build(lab)["rollout_branch"] == "shared"
    lab.knobs.rollout_shape.value = (8, 1)
    assert build(lab)["rollout_branch"] == "second_copy"


@pytest.mark.cluster
def test_custom_rollout_mesh_on_picked_devices(lab: PlacementLab) -> None:
    lab.knobs.layout.value = CUSTOM
    for toggle in lab.knobs.device_toggles[:4]:
        toggle.value = False
    assert [label for label, _ in lab.knobs.rollout_shape.options][0] == "2 x 2"
    report = build(lab)
    assert report["role_to_mesh"]["rollout"]["device_ids"] == [4, 5, 6, 7]
    assert report["sharing_map"]["actor"] == []
    by_device = report["memory"]["by_role"]["rollout"]["by_device"]
    assert sorted(int(d) for d in by_device) == [4, 5, 6, 7]


@pytest.mark.cluster
def test_P2_lora_links_the_reference(lab: PlacementLab) -> None:
    lab.knobs.layout.value = "reshaped"
    plain = build(lab)
    assert "reference" not in plain["sharing_map"]["actor"]
    flow = png(lab, "flow")
    lab.knobs.lora.value = True
    lora = build(lab)
    assert lora["lora"] and "reference" in lora["sharing_map"]["actor"]
    assert lora["reference_shares_backbone"]
    assert png(lab, "flow") != flow


@pytest.mark.cluster
def test_P4_separate_base_warning_is_shown(lab: PlacementLab) -> None:
    lab.knobs.lora.value = True
    lab.knobs.lora_separate_base.value = True
    report = build(lab)
    assert any(w.startswith("P4") for w in report["warnings"])
    assert "avoidable copy" in lab.summary.value


@pytest.mark.cluster
def test_P7_vllm_engine_replaces_the_rollout_mesh(lab: PlacementLab) -> None:
    lab.knobs.engine.value = "vllm"
    report = build(lab)
    assert report["mesh_overridden_by_engine"]
    assert "P7" in lab.summary.value


@pytest.mark.cluster
def test_P14_offload_moves_memory_to_pinned_host(lab: PlacementLab) -> None:
    on_device = build(lab)["memory"]
    lab.knobs.offload.value = True
    offloaded = build(lab)["memory"]
    kinds = {k for entry in offloaded["by_role"].values() for k in entry["by_kind"]}
    assert "pinned_host" in kinds
    assert (
        offloaded["by_role"]["actor"]["by_kind"].get("device", 0) < on_device["by_role"]["actor"]["by_kind"]["device"]
    )


@pytest.mark.cluster
def test_P3_rollout_dtype_casts_the_second_copy(lab: PlacementLab) -> None:
    lab.knobs.layout.value = "reshaped"
    f32 = build(lab)["memory"]["by_role"]["rollout"]["bytes"]
    lab.knobs.rollout_dtype.value = "bfloat16"
    bf16 = build(lab)["memory"]["by_role"]["rollout"]["bytes"]
    assert bf16 < f32


@pytest.mark.cluster
def test_model_size_grows_memory(lab: PlacementLab) -> None:
    tiny = build(lab)["memory"]["unique_bytes"]
    lab.knobs.model_size.value = "small"
    assert build(lab)["memory"]["unique_bytes"] > 4 * tiny


@pytest.mark.cluster
def test_P6_cluster_error_is_shown_and_the_lab_stays_usable(lab: PlacementLab) -> None:
    build(lab)
    lab.knobs.engine.value = "sglang_jax"
    lab.knobs.lora.value = True
    lab.knobs.sglang_static_lora.value = False
    before = lab.cluster
    drawn = png(lab, "flow")
    lab.construct_button.click()
    assert lab.error is not None and lab.error.startswith("ConfigError")
    # The message sits beside the checkbox it names (the first of them), which is outlined.
    note = lab.notes.note("sglang_static_lora")
    assert lab.notes.shown == "sglang_static_lora" and note.layout.display == "block"
    assert "static-LoRA" in note.value  # the cluster's own message
    # It names the checkbox to change (its label on screen), not RolloutConfig's fields, and outlines it.
    assert "What to change: the 'static-LoRA settings for sglang_jax (P6)' checkbox" in lab.error
    assert "RolloutConfig" not in lab.error and "rollout_sglang_jax" not in lab.error
    assert lab.knobs.sglang_static_lora.description == "static-LoRA settings for sglang_jax (P6)"
    assert "rl-at-fault" in lab.knobs.sglang_static_lora._dom_classes
    assert "rl-at-fault" not in lab.knobs.layout._dom_classes
    # Refused before anything was released: the previous cluster stays live and drawn.
    assert lab.cluster is before and lab.report is not None
    assert "still the previous one" in note.value and "still the previous one" in lab.status.text
    assert lab.status.text.startswith("Refused: see the note by the outlined knob.")
    assert not lab.sync_button.disabled and not lab.step_button.disabled
    assert png(lab, "flow") == drawn
    lab.knobs.sglang_static_lora.value = True
    report = build(lab)
    assert report["engine"] == "sglang_jax"
    assert lab.notes.shown is None and note.layout.display == "none"
    assert not any("rl-at-fault" in w._dom_classes for w in lab.knobs.named().values())


def test_p1_custom_mesh_offers_only_shapes_that_divide_the_model() -> None:
    lab = PlacementLab(rehearse=False)
    lab.knobs.layout.value = CUSTOM
    for toggle in lab.knobs.device_toggles[3:]:
        toggle.value = False  # 3 devices: neither 3 x 1 nor 1 x 3 divides a dimension of 64
    assert lab.knobs.rollout_shape.options == ()
    assert "Pick 1, 2, 4 or 8 devices" in lab.knobs.custom_note.value
    assert "must divide its dimensions 64 by a and 32, 64, 128, 264 by b" in lab.knobs.custom_note.value
    lab.construct_button.click()
    # Refused before any build, in the widget's words, the device buttons outlined and the note beside them.
    assert lab.error is not None and lab.error.startswith("ConfigError")
    assert "What to change: the 'rollout devices' buttons (or the 'model size' dropdown)" in lab.error
    assert "fsdp" not in lab.error and "(" + "'" not in lab.error.split("What to change")[0]
    assert "rl-at-fault" in lab.knobs.devices_box._dom_classes and lab.notes.shown == "rollout_devices"
    lab.knobs.device_toggles[3].value = True  # 4 devices: every shape of 4 divides the tiny model
    assert [label for label, _ in lab.knobs.rollout_shape.options] == ["2 x 2", "1 x 4", "4 x 1"]


def test_custom_mesh_marks_the_picked_devices() -> None:
    knobs = PlacementLab(rehearse=False).knobs
    knobs.device_toggles[2].value = False
    styles = [(t.value, t.button_style) for t in knobs.device_toggles]
    assert styles[2] == (False, "")
    assert all(style == (True, "info") for i, style in enumerate(styles) if i != 2)


@pytest.mark.cluster
def test_knob_error_keeps_the_live_cluster(lab: PlacementLab) -> None:
    report = build(lab)
    cluster = lab.cluster
    lab.knobs.layout.value = CUSTOM
    for toggle in lab.knobs.device_toggles:
        toggle.value = False
    lab.construct_button.click()
    assert lab.error is not None and "No device picked" in lab.error
    assert "rl-at-fault" in lab.knobs.devices_box._dom_classes
    assert "still the previous one" in lab.notes.note("rollout_devices").value
    assert lab.cluster is cluster and lab.report is report
    assert not lab.sync_button.disabled


@pytest.mark.cluster
def test_an_engine_mesh_that_cannot_hold_the_model_keeps_the_live_cluster(
    lab: PlacementLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The vllm stand-in's own mesh (P7) over 16 devices cannot split the vocabulary; here a 3-device
    # mesh stands in for it. Checked before the live cluster is released, the note by the engine.
    import jax

    from rlcluster_lab.core.meshes import make_mesh
    from rlcluster_lab.engines.own_copy import VllmStyleEngine

    report = build(lab)
    cluster = lab.cluster
    three = make_mesh(jax.devices()[:3], (1, 3))
    monkeypatch.setattr(VllmStyleEngine, "settle_mesh", classmethod(lambda cls, mesh, config: three))
    lab.knobs.engine.value = "vllm"
    lab.construct_button.click()
    assert lab.error is not None and lab.error.startswith("PlacementError: the rollout model"), lab.error
    assert "still the previous one" in lab.notes.note("engine").value
    assert lab.cluster is cluster and lab.report is report
    lab.sync_button.click()
    assert lab.error is None, lab.error


@pytest.mark.cluster
def test_a_memory_refusal_keeps_the_live_cluster_usable(lab: PlacementLab, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlcluster_lab.core.limits import LIMIT_ENV

    report = build(lab)
    cluster, drawn = lab.cluster, png(lab, "memory")
    # The tiny cluster and its steps fit in 5 MB; the small model's cluster (about 37 MB) does not.
    monkeypatch.setenv(LIMIT_ENV, "5MB")
    lab.knobs.model_size.value = "small"
    lab.construct_button.click()
    assert lab.error is not None and lab.error.startswith("TooLargeError"), lab.error
    assert "the small model" in lab.error and "4.8 MiB may be allocated" in lab.error
    # Refused before anything was released: the previous cluster stays live, drawn and usable.
    assert lab.cluster is cluster and lab.report is report
    assert "still the previous one" in lab.status.text
    assert png(lab, "memory") == drawn
    assert not lab.sync_button.disabled and not lab.step_button.disabled
    lab.sync_button.click()
    assert lab.error is None, lab.error
    assert lab.report["sync"] is not None and lab.cluster.global_steps == 1
    lab.step_button.click()
    assert lab.error is None, lab.error
    assert lab.cluster is cluster and lab.cluster.global_steps == 2


@pytest.mark.cluster
def test_P13_sync_button_shows_bytes_moved(lab: PlacementLab) -> None:
    build(lab)
    assert lab.display.shown == "flow"  # Construct shows the decisions it took
    lab.sync_button.click()
    assert lab.display.shown == "sync"  # Sync shows what moved
    colocated = lab.report["sync"]
    assert colocated is not None and colocated["moved_cross_device_bytes"] == 0
    assert colocated["reused_bytes"] == colocated["synced_bytes"] > 0
    image = png(lab, "sync")
    lab.knobs.layout.value = "split"
    build(lab)
    assert lab.report["sync"] is None  # a new cluster has not synced yet
    lab.sync_button.click()
    split = lab.report["sync"]
    assert split["moved_cross_device_bytes"] >= split["minimum_cross_device_bytes"] > 0
    assert png(lab, "sync") != image
    assert lab.cluster.global_steps == 1


@pytest.mark.cluster
def test_training_step_runs_on_cluster_operations(lab: PlacementLab) -> None:
    lab.knobs.lora.value = True
    build(lab)
    lab.step_button.click()
    assert lab.error is None, lab.error
    assert lab.cluster.global_steps == 1  # the step ended with its sync (P13)
    assert lab.report["sync"] is not None and lab.report["sync"]["lora"]
    assert "mean reward" in lab.display.step_log.value
    assert lab.display.shown == "steps"
    assert png(lab, "sync")


@pytest.mark.cluster
def test_busy_state_while_constructing(lab: PlacementLab, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}
    real = lab_module.build_cluster

    def spy(*args, **kwargs):
        seen["disabled"] = (lab.construct_button.disabled, lab.sync_button.disabled, lab.step_button.disabled)
        seen["progress"] = lab.status.progress.layout.visibility
        seen["status"] = lab.status.text
        seen["busy"] = "rl-busy" in lab.status.sentence._dom_classes
        return real(*args, **kwargs)

    monkeypatch.setattr(lab_module, "build_cluster", spy)
    lab.knobs.model_size.value = "small"
    build(lab)
    assert seen["disabled"] == (True, True, True)
    assert seen["progress"] == "visible" and seen["busy"]
    assert seen["status"].startswith("Construct: building the small models and the cluster: ")
    assert " s so far" in seen["status"]
    assert lab.status.progress.layout.visibility == "hidden" and not lab.construct_button.disabled
    assert "rl-busy" not in lab.status.sentence._dom_classes


@pytest.mark.cluster
def test_rebuilding_releases_old_clusters_after_a_sync_and_a_step(lab: PlacementLab) -> None:
    # Exact bytes against one cluster's: any old cluster kept (one or the last ten) shows at the
    # first rebuild after it, so eight rebuilds, with a sync and a training step among them, show
    # what twenty did.
    build(lab)
    after_first = live_buffer_bytes()
    assert after_first > 0
    for i in range(8):
        if i == 2:
            lab.sync_button.click()
        if i == 5:
            lab.step_button.click()
        build(lab)
    assert live_buffer_bytes() == after_first


@pytest.mark.cluster
def test_release_says_when_someone_else_holds_the_cluster(lab: PlacementLab) -> None:
    before = live_buffer_bytes()
    build(lab)
    held = lab.cluster
    assert "still referenced" in lab.release()
    del held
    build(lab)
    assert lab.release() == "previous cluster released"
    assert live_buffer_bytes() == before


@pytest.mark.cluster
def test_release_says_when_the_background_compilation_holds_the_cluster(lab: PlacementLab) -> None:
    import threading

    build(lab)
    done = threading.Event()
    # What a rehearsal does: a thread that holds the cluster until its compilation ends.
    lab.background._thread = threading.Thread(target=lambda held=lab.cluster: done.wait())
    lab.background._thread.start()
    try:
        assert "held by the background compilation" in lab.release()
    finally:
        done.set()
        lab.background.join()


@pytest.mark.cluster
def test_lab_builds_on_the_devices_it_is_given() -> None:
    import jax

    lab = PlacementLab(devices=jax.devices()[:4], rehearse=False)
    try:
        assert [t.description for t in lab.knobs.device_toggles] == ["0", "1", "2", "3"]
        lab.knobs.layout.value = "split"
        report = build(lab)
        assert report["role_to_mesh"]["actor"]["device_ids"] == [0, 1]
        assert report["role_to_mesh"]["rollout"]["device_ids"] == [2, 3]
        assert sorted(report["memory"]["by_device"]) == ["0", "1", "2", "3"]
    finally:
        lab.release()


@pytest.mark.cluster
def test_memory_panel_shows_per_device_and_per_role(lab: PlacementLab) -> None:
    build(lab)
    images = [o["data"].get("image/svg+xml") for o in lab.display.outputs["memory"].outputs]
    assert len(images) == 2 and all(images) and images[0] != images[1]


def test_shape_options_list_the_standard_shape_first() -> None:
    assert shape_options(8)[0] == ("2 x 4", (2, 4))
    assert {v for _, v in shape_options(8)} == {(2, 4), (1, 8), (4, 2), (8, 1)}
    assert shape_options(0) == []


@pytest.mark.parametrize("size", ["tiny", "small"])
@pytest.mark.parametrize("count", range(1, 9))
def test_p1_shape_options_are_the_shapes_the_placement_accepts(size: str, count: int) -> None:
    # Against the model itself: a shape is offered exactly when every parameter's spec divides (check_spec).
    import jax
    from flax import nnx
    from jax.sharding import PartitionSpec

    from rlcluster_lab.core.meshes import DEFAULT_LOGICAL_AXIS_RULES, make_mesh
    from rlcluster_lab.core.shardings import PlacementError, check_spec, resolve_specs
    from rlcluster_lab.model import abstract_model

    state = nnx.state(abstract_model(size, lora_rank=4))
    spec_tree = nnx.to_pure_dict(resolve_specs(state, DEFAULT_LOGICAL_AXIS_RULES))
    specs = jax.tree.leaves(spec_tree, is_leaf=lambda x: isinstance(x, PartitionSpec) or x is None)
    shapes = [leaf.shape for leaf in jax.tree.leaves(nnx.to_pure_dict(state))]
    assert len(specs) == len(shapes) > 0
    accepted = []
    for a in range(1, count + 1):
        if count % a:
            continue
        mesh = make_mesh(jax.devices()[:count], (a, count // a))
        try:
            for spec, shape in zip(specs, shapes, strict=True):
                check_spec(spec, shape, mesh, "actor")
        except PlacementError:
            continue
        accepted.append((a, count // a))
    assert sorted(v for _, v in shape_options(count, size)) == sorted(accepted)


@pytest.mark.cluster
def test_a_rehearsal_after_construct_leaves_the_training_step_nothing_to_compile() -> None:
    from rlcluster_lab.core.compile_cache import count_compilations

    lab = PlacementLab(rehearse=True)
    try:
        lab.construct()
        assert lab.background.join() >= 0 and lab.background.error is None
        assert lab.cluster.global_steps == 0  # the rehearsal changed nothing
        with count_compilations() as compiled:
            lab.train_step()
        assert lab.error is None and lab.cluster.global_steps == 1
        assert compiled == [], f"the step compiled {compiled}"
        assert lab.timings["compiled"] == 0
    finally:
        lab.release()


@pytest.mark.cluster
def test_p13_one_step_counter_the_global_step_in_the_status_and_the_step_log(lab: PlacementLab) -> None:
    from rlcluster_lab.core.limits import fmt_bytes

    report = build(lab)
    assert lab.status.text.startswith("Constructed in ")
    held = fmt_bytes(report["memory"]["unique_bytes"])
    assert f"Rollout: same object (P3); {held} held on 8 simulated CPU devices (measured)." in (lab.status.text)
    lab.sync_button.click()
    assert lab.cluster.global_steps == 1 and "now at global step 1:" in lab.status.text
    lab.step_button.click()  # a step ends with a sync: the same counter moves on
    assert lab.cluster.global_steps == 2 and "now at global step 2: mean reward" in lab.status.text
    log = lab.display.step_log.value
    assert "<th>global step</th>" in log and "<tr><td>2</td>" in log
    assert "step 0" not in lab.status.text + log


# --- clicks in any order ----------------------------------------------------------------------

# A knob change as a user makes one: any value the control offers (the model stays tiny: a size
# costs minutes); the custom mesh's device buttons flipped; the shape picked among those offered.
_CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "layout": st.sampled_from(["colocated", "reshaped", "split", CUSTOM]),
        "lora": st.booleans(),
        "lora_rank": st.sampled_from([1, 4, 8, 64]),
        "lora_separate_base": st.booleans(),
        "engine": st.sampled_from(["vanilla", "vllm", "sglang_jax"]),
        "offload": st.booleans(),
        "rollout_dtype": st.sampled_from(["", "float32", "bfloat16"]),
        "with_reward": st.booleans(),
        "with_critic": st.booleans(),
        "sglang_static_lora": st.booleans(),
        "anchor": st.sampled_from(["full", "trainable"]),
        "sync_chunk_bytes": st.sampled_from([0, 16 << 10, 1 << 20]),
        "flip_devices": st.lists(st.integers(0, 7), max_size=4),
        "shape": st.integers(0, 3),
    },
)
_ACTIONS = st.lists(
    st.one_of(st.tuples(st.just("construct"), _CHANGES), st.tuples(st.sampled_from(["sync", "step"]), st.none())),
    min_size=2,
    max_size=5,
)


def _change(lab: PlacementLab, changes: dict) -> None:
    knobs = lab.knobs
    for field, value in changes.items():
        control = knobs.by_field().get(field)
        if control is not None and not control.disabled:  # a user cannot set a greyed-out control
            control.value = value
    for i in changes.get("flip_devices", []):
        knobs.device_toggles[i].value = not knobs.device_toggles[i].value
    if "shape" in changes and knobs.rollout_shape.options and not knobs.rollout_shape.disabled:
        options = knobs.rollout_shape.options
        knobs.rollout_shape.value = options[changes["shape"] % len(options)][1]


@pytest.mark.cluster
@given(_ACTIONS)
# Both refusals, always: a custom mesh no shape fits beside a live cluster, then a sync of that
# cluster; a P6 refusal before any cluster, then a step that cannot be clicked.
@example([("construct", {}), ("construct", {"layout": CUSTOM, "flip_devices": [0, 1, 2]}), ("sync", None)])
@example([("construct", {"lora": True, "engine": "sglang_jax", "sglang_static_lora": False}), ("step", None)])
def test_any_sequence_of_clicks_answers_each_or_refuses_it_and_keeps_the_live_cluster(actions) -> None:
    """Whatever a user sets and clicks, in any order: a click either answers (a new cluster built
    as the controls say, or one more global step) or refuses with a note by the knob to change,
    the cluster shown before still live and usable. Nothing escapes a click."""
    lab = PlacementLab(rehearse=False)
    try:
        for name, changes in actions:
            if name == "construct":
                _change(lab, changes)
            button = {"construct": lab.construct_button, "sync": lab.sync_button, "step": lab.step_button}[name]
            if button.disabled:
                assert name != "construct" and lab.cluster is None  # only a live cluster syncs or steps
                continue
            before = lab.cluster
            steps = None if before is None else before.global_steps
            button.click()
            if lab.error is not None:
                assert lab.cluster is before, lab.error
                assert lab.notes.shown is not None and lab.status.text.startswith("Refused"), lab.error
                assert lab.sync_button.disabled == lab.step_button.disabled == (before is None)
                continue
            assert lab.report is not None and lab.cluster is not None
            if name == "construct":
                assert lab.cluster is not before and lab.cluster.global_steps == 0
                scenario = lab.knobs.scenario()
                assert (lab.report["lora"], lab.report["engine"], lab.report["offload_to_cpu"]) == (
                    scenario.lora,
                    scenario.engine,
                    scenario.offload,
                )
            else:
                assert lab.cluster is before and lab.cluster.global_steps == steps + 1
                assert lab.report["sync"] is not None
            assert not lab.sync_button.disabled and not lab.step_button.disabled
    finally:
        lab.release()
