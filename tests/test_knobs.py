"""Refusals name the knob to change as the reader sees it: the flag in the CLI, the widget in the lab.

The one table (``core.knobs``) is checked against the CLI's parser, so every
flag it names is a flag the CLI takes.
"""

from __future__ import annotations

import dataclasses
import inspect

import ipywidgets as widgets
import jax
import pytest

from rlcluster_lab.app.scenario import validate
from rlcluster_lab.cli.main import EXIT_BAD_INPUT, build_parser, main
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.knobs import KNOBS, PLANNER_KNOBS, SCENARIO_KNOBS, Knob, describe, knobs_of
from rlcluster_lab.core.meshes import make_mesh
from rlcluster_lab.core.options import Scenario
from rlcluster_lab.core.shardings import PlacementError
from rlcluster_lab.engines.own_copy import VllmStyleEngine
from rlcluster_lab.lab.widget.controls import Knobs
from rlcluster_lab.planner.request import PlanRequest
from rlcluster_lab.rules.validation import check_scenario


def refusal(**knobs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        check_scenario(Scenario(**knobs))
    return info.value


def _subcommands() -> dict[str, object]:
    return build_parser()._subparsers._group_actions[0].choices


def test_every_flag_in_the_table_is_a_flag_the_cli_takes():
    flags = {option for sub in _subcommands().values() for action in sub._actions for option in action.option_strings}
    named = {knob.flag for knob in KNOBS.values() if knob.flag}
    assert named <= flags, named - flags


def _inside(box: widgets.Widget) -> set[int]:
    """Every widget shown inside ``box``, at any depth."""
    return {id(box)} | {i for child in getattr(box, "children", ()) for i in _inside(child)}


def test_a_knob_is_on_every_surface_it_names_and_on_no_other():
    # Every knob says whether it is a widget and a flag: neither has a default.
    for attribute in ("label", "flag"):
        assert inspect.signature(Knob).parameters[attribute].default is inspect.Parameter.empty
    # Scenario: its fields are the table's scenario knobs, in order, with their defaults.
    assert [(f.name, f.default) for f in dataclasses.fields(Scenario)] == [(k.field, k.default) for k in SCENARIO_KNOBS]
    # CLI: a knob's flag is an option of exactly the subcommands it names, and sets its field; an
    # option that sets a knob's field is that knob's flag.
    for command, sub in _subcommands().items():
        actions = {a.dest: a for a in sub._actions}
        for knob in KNOBS.values():
            takes = knob.flag is not None and command in knob.commands
            assert (knob.field in actions and knob.flag in actions[knob.field].option_strings) == takes, knob.field
        assert all(a.option_strings[0] == KNOBS[a.dest].flag for a in sub._actions if a.dest in KNOBS), command
    # Lab: a knob with a label is a control of its kind, shown in the column; every control is a knob.
    lab = Knobs(jax.devices()[:8])
    controls = lab.outlined()
    assert set(controls) == {k.field for k in KNOBS.values() if k.label}
    kinds = {
        "checkbox": widgets.Checkbox,
        "dropdown": widgets.Dropdown,
        "number box": widgets.IntText,
    }  # unbounded: nothing clamped
    for field, control in controls.items():
        assert isinstance(control, kinds.get(KNOBS[field].widget, widgets.Box)), field
        assert id(control) in _inside(lab.widget), field
    # Planner: the Scenario knobs a PlanRequest takes are the table's planner knobs.
    planned = {f.name for f in dataclasses.fields(PlanRequest)} & {k.field for k in SCENARIO_KNOBS}
    assert planned == {k.field for k in PLANNER_KNOBS}


def test_p6_refusal_names_the_flag_in_the_cli_and_the_checkbox_in_the_lab():
    exc = refusal(engine="sglang_jax", lora=True, sglang_static_lora=False)
    assert [k.field for k in knobs_of(exc)] == ["sglang_static_lora", "lora", "engine"]
    # The API's own message still says what to set in RolloutConfig ...
    assert "rollout_sglang_jax_enable_static_lora" in str(exc)
    # ... the CLI and the lab say which of their own knobs to change instead.
    cli = describe(exc, "cli")
    assert "RolloutConfig" not in cli and "rollout_sglang_jax" not in cli
    assert cli.endswith("The flag to change: --no-static-lora (or --lora, --engine).")
    lab = describe(exc, "lab")
    assert "RolloutConfig" not in lab and "--" not in lab
    assert "What to change: the 'static-LoRA settings for sglang_jax (P6)' checkbox" in lab
    assert "the 'LoRA actor' checkbox, the 'rollout engine' dropdown" in lab


def test_a_field_named_with_its_flag_reads_as_the_flag_or_the_widget():
    exc = refusal(lora=True, lora_rank=65)
    assert str(exc).startswith("lora_rank (--lora-rank) must be between 1 and 64")
    assert describe(exc, "cli").startswith("--lora-rank must be between 1 and 64")
    assert describe(exc, "lab").startswith("'LoRA rank' must be between 1 and 64")
    assert describe(exc, "lab").endswith("the 'LoRA rank' number box (or the 'model size' dropdown).")


def test_a_knob_the_audience_does_not_have_is_left_out():
    # The lab has no device-count knob (it builds on the devices it was given); the CLI has --devices.
    check_scenario(Scenario(layout="split"), device_count=8)
    with pytest.raises(ConfigError) as info:
        check_scenario(Scenario(layout="split"), device_count=3)
    exc = info.value
    assert describe(exc, "cli").endswith("The flag to change: --layout (or --devices).")
    assert describe(exc, "lab").endswith("What to change: the 'layout' dropdown.")


def test_a_mesh_the_model_cannot_be_split_over_names_the_device_count():
    # `report --devices 6 --model-size small`: the standard layout's mesh follows the device count,
    # and no model size of the lab splits over its (3, 2) shape, so the size is not offered as a fix.
    with pytest.raises(PlacementError) as info:
        validate(Scenario(model_size="small"), devices=jax.devices()[:6])
    exc = info.value
    assert "Pick a mesh shape whose ('fsdp',) size divides 128" in str(exc)  # the API's own fix
    cli = describe(exc, "cli")
    assert "Pick a mesh shape" not in cli
    assert cli.endswith(
        "which does not divide it; no other model size fits these meshes either. The flag to change: --devices."
    )
    assert "What to change" not in describe(exc, "lab")  # the lab has no device-count knob: beside the buttons


def test_a_rollout_the_engines_own_mesh_cannot_hold_is_refused_before_a_build_naming_the_engine(monkeypatch):
    # The vllm stand-in keeps its copy on a mesh of its own (P7; over 16 devices tensor parallelism
    # 16 does not divide the vocabulary): the checks before a build place the rollout there, so a
    # build (and the lab's Construct, which checks before it releases its cluster) is refused first.
    three = make_mesh(jax.devices()[:3], (1, 3))
    monkeypatch.setattr(VllmStyleEngine, "settle_mesh", classmethod(lambda cls, mesh, config: three))
    validate(Scenario(engine="sglang_jax"))  # the other engines keep the rollout mesh they are given
    with pytest.raises(PlacementError, match="the rollout model has a dimension") as info:
        validate(Scenario(engine="vllm"))
    assert [k.field for k in knobs_of(info.value)] == ["engine", "devices"]
    assert describe(info.value, "cli").endswith("The flag to change: --engine (or --devices).")
    assert describe(info.value, "lab").endswith("What to change: the 'rollout engine' dropdown.")


def test_an_error_without_knobs_is_its_message_on_one_line():
    assert describe(ValueError("two\n   lines"), "cli") == "two lines"
    assert describe(ConfigError("no knob here"), "lab") == "no knob here"
    assert describe(ConfigError("", knobs=("not-a-knob",)), "cli") == "ConfigError"


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["report", "--engine", "sglang_jax", "--lora", "--no-static-lora"], "--no-static-lora"),
        (["report", "--lora-separate-base"], "--lora-separate-base needs --lora"),
        (["report", "--lora", "--lora-rank", "65"], "--lora-rank must be between 1 and 64"),
        (["learn", "--mini-batch-size", "6", "--micro-batch-size", "4"], "--micro-batch-size"),
    ],
)
def test_cli_refusal_names_the_flag_and_exits_2(capsys, argv, flag):
    assert main(argv) == EXIT_BAD_INPUT == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert flag in err and "The flag to change: --" in err
    assert "RolloutConfig" not in err
