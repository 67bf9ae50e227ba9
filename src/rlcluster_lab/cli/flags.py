"""The CLI's knob flags, built from the knobs' table (``core.knobs``): each flag's type,
choices, default and help, and the subcommands that take it. Nothing here imports JAX."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from rlcluster_lab.core.knobs import COMMANDS, KNOBS, SCENARIO_KNOBS, Knob

_TYPES = {"int": int, "float": float}


def add_knob_flags(p: argparse.ArgumentParser, command: str, **overrides: dict[str, Any]) -> None:
    """Every knob flag ``command`` takes, in the table's order, each setting its knob's field, and
    ``--json``. ``overrides``: by field, what this command says otherwise (``default``, ``choices``, ``help``)."""
    for knob in KNOBS.values():
        if knob.flag and command in knob.commands:
            names = (knob.flag, knob.alias) if knob.alias else (knob.flag,)
            p.add_argument(*names, dest=knob.field, **_argument(knob, **overrides.get(knob.field, {})))
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _argument(knob: Knob, **override: Any) -> dict[str, Any]:
    """The flag's ``add_argument`` keywords: the knob's type, choices and default, and its
    help with the rules that read it (as its tooltip in the lab) and the default."""
    spec: dict[str, Any] = {"default": knob.default}
    if knob.kind == "bool":  # a flag that turns its knob on (off, when it is on by default)
        spec["action"] = "store_false" if knob.default else "store_true"
    else:
        spec.update(type=_TYPES.get(knob.kind), choices=knob.choices, metavar=knob.name.upper().replace("-", "_"))
    spec.update(override)
    if spec.get("choices"):
        spec.pop("metavar")  # argparse shows the choices instead
    text = spec.pop("help", knob.help)
    if knob.default is True:
        text = f"no {text} (given by default)"
    elif spec["default"] not in (None, False):
        text += f" (default: {spec['default']})"
    spec["help"] = f"{knob.rule}: {text}" if knob.rule else text
    return spec


def fields_given(cls: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The flags that set a field of the dataclass ``cls``, by field."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}


def scenario_from(args: argparse.Namespace, **extra: Any) -> Any:
    """The ``Scenario`` the flags every subcommand takes describe; ``extra`` sets or overrides knobs."""
    from rlcluster_lab.core.options import Scenario

    shared = {k.field: getattr(args, k.field) for k in SCENARIO_KNOBS if k.flag and k.commands == COMMANDS}
    return Scenario(**{**shared, **extra})
