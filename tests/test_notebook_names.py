"""What the notebooks name of the lab exists: a module, function, knob or attribute that a
notebook's text or stored output names, and that the lab no longer has, fails here (and a
dotted ``rlcluster_lab.x.y`` name in docs/, the README or CONTRIBUTING).

Read from the committed files alone (sources and stored outputs), with no kernel and no JAX
compile: dotted ``rlcluster_lab.x.y`` names resolve; every name a notebook imports from the
lab resolves, and so does each ``alias.attr`` on it; attributes of the objects the notebook
makes from the lab (``lab = rl.setup()``: ``lab.devices``) exist on their class; and every
``Scenario(knob=...)`` names a knob ``Scenario`` has.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import re
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import rlcluster_lab as rl

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
DOTTED = re.compile(r"\brlcluster_lab(?:\.[A-Za-z_]\w*)+")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
MISSING = object()


def _resolve(path: str) -> Any:
    """The object a dotted path names (a module, then attributes), or MISSING."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name, MISSING)
            if obj is MISSING:
                return MISSING
        return obj
    return MISSING


def _code(source: str) -> ast.Module | None:
    """A code cell as Python, its IPython magics left out."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _instance_attributes(cls: type) -> set[str]:
    """What an instance of ``cls`` has: its class's names, dataclass fields, and what its
    methods assign to ``self``."""
    names = set(dir(cls))
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls)}
    for klass in cls.__mro__:
        names |= set(getattr(klass, "__annotations__", {}))
        try:
            tree = ast.parse(inspect.getsource(klass))
        except (OSError, TypeError, SyntaxError, IndentationError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return names


def _returns(fn: Any) -> type | None:
    """The class a call of ``fn`` returns: ``fn`` itself for a class, else its return annotation."""
    if isinstance(fn, type):
        return fn
    try:
        hint = typing.get_type_hints(fn).get("return")
    except Exception:  # an annotation that names a type-checking-only import: not checked
        return None
    hint = typing.get_origin(hint) or hint
    return hint if isinstance(hint, type) else None


@dataclasses.dataclass
class Notebook:
    """A notebook's texts: code sources, Markdown, stored outputs."""

    name: str
    code: list[str]
    markdown: list[str]
    outputs: list[str]

    @classmethod
    def read(cls, path: Path) -> Notebook:
        nb = json.loads(path.read_text())
        code, markdown, outputs = [], [], []
        for cell in nb["cells"]:
            (code if cell["cell_type"] == "code" else markdown).append("".join(cell["source"]))
            for out in cell.get("outputs", []):
                outputs.append("".join(out.get("text", "")))
                for value in out.get("data", {}).values():
                    outputs.append(
                        value if isinstance(value, str) else "".join(value) if isinstance(value, list) else ""
                    )
        return cls(path.stem, code, markdown, outputs)

    def inline_code(self) -> list[str]:
        return [m for text in self.markdown for m in INLINE_CODE.findall(text)]

    def problems(self) -> list[str]:
        """Every name of the lab this notebook names and the lab does not have."""
        found = [f"{name}: no such name in the lab" for name in self._dotted() if _resolve(name) is MISSING]
        aliases, made = self._imports(found)
        texts = self.code + self.inline_code()
        for alias, target in aliases.items():
            # ``rl`` is the package itself: what its outputs name of it is checked too.
            where = texts + self.outputs if alias == "rl" else texts
            for attr in _attributes(alias, where):
                if getattr(target, attr, MISSING) is MISSING:
                    found.append(f"{alias}.{attr}: {getattr(target, '__name__', target)} has no {attr}")
        for variable, classes in made.items():
            have = set().union(*(_instance_attributes(c) for c in classes))
            where = texts + self.outputs if variable == "lab" else self.code
            for attr in _attributes(variable, where) - have:
                found.append(f"{variable}.{attr}: {' or '.join(c.__name__ for c in classes)} has no {attr}")
        knobs = {f.name for f in dataclasses.fields(rl.Scenario)}
        for text in texts:
            for call in re.finditer(r"\bScenario\(([^()]*)\)", text):
                for knob in set(re.findall(r"\b(\w+)\s*=(?!=)", call.group(1))) - knobs:
                    found.append(f"Scenario({knob}=...): Scenario has no knob {knob}")
        return sorted(set(found))

    def _dotted(self) -> set[str]:
        return {m.group(0) for text in self.code + self.markdown + self.outputs for m in DOTTED.finditer(text)}

    def _imports(self, found: list[str]) -> tuple[dict[str, Any], dict[str, set[type]]]:
        """What the notebook imports from the lab (alias -> object) and the variables it makes
        by calling one of those (variable -> the classes they can hold)."""
        aliases: dict[str, Any] = {}
        made: dict[str, set[type]] = {}
        trees = [t for t in map(_code, self.code) if t is not None]
        for tree in trees:
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for a in node.names:
                        if a.name.split(".")[0] == "rlcluster_lab":
                            aliases[a.asname or a.name] = _resolve(a.name)
                elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "rlcluster_lab":
                    for a in node.names:
                        aliases[a.asname or a.name] = _resolve(f"{node.module}.{a.name}")
        for alias, target in list(aliases.items()):
            if target is MISSING:
                found.append(f"import of {alias}: the lab has no such name")
                del aliases[alias]
        for tree in trees:
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call)):
                    continue
                target, call = node.targets[0], node.value.func
                if not isinstance(target, ast.Name):
                    continue
                if isinstance(call, ast.Name) and call.id in aliases:
                    fn = aliases[call.id]
                elif isinstance(call, ast.Attribute) and isinstance(call.value, ast.Name) and call.value.id in aliases:
                    fn = getattr(aliases[call.value.id], call.attr, None)
                else:
                    fn = None
                cls = _returns(fn) if fn is not None else None
                if cls is not None and cls.__module__.startswith("rlcluster_lab"):
                    made.setdefault(target.id, set()).add(cls)
        return aliases, made


def _attributes(name: str, texts: Iterable[str]) -> set[str]:
    """The attributes read on ``name`` in ``texts`` (``name.attr``, not ``other.name.attr``)."""
    pattern = re.compile(rf"(?<![\w.]){re.escape(name)}\.([A-Za-z_]\w*)")
    return {m.group(1) for text in texts for m in pattern.finditer(text)}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_what_a_notebook_names_of_the_lab_exists(path: Path) -> None:
    assert Notebook.read(path).problems() == []


def test_what_the_docs_name_of_the_lab_exists() -> None:
    named = {(p.name, m.group(0)) for p in DOCS for m in DOTTED.finditer(p.read_text())}
    assert len(named) > 20
    assert sorted((doc, name) for doc, name in named if _resolve(name) is MISSING) == []


def test_a_name_the_lab_no_longer_has_is_found() -> None:
    # A notebook of our own, naming what the lab has and what it does not.
    notebook = Notebook(
        "made up",
        code=[
            "import rlcluster_lab as rl\nfrom rlcluster_lab.lab.experiments import runs as ex\nlab = rl.setup()",
            "rl.build_cluster(rl.Scenario(layout='split', lora=True, colour='red'))\nrl.gone()",
            "ex.nothing_here(lab.devices, lab.chips)",
            "from rlcluster_lab.lab.rule_code.view import show_old_rule",
        ],
        markdown=["`rlcluster_lab.rules.sharing.p1_link_actor_rollout` and `rl.make_mesh`, not `rl.make_grid`"],
        outputs=["see rlcluster_lab.lab.retired_figures.draw and rl.old_knob()"],
    )
    assert notebook.problems() == [
        "Scenario(colour=...): Scenario has no knob colour",
        "ex.nothing_here: rlcluster_lab.lab.experiments.runs has no nothing_here",
        "import of show_old_rule: the lab has no such name",
        "lab.chips: LabDevices has no chips",
        "rl.gone: rlcluster_lab has no gone",
        "rl.make_grid: rlcluster_lab has no make_grid",
        "rl.old_knob: rlcluster_lab has no old_knob",
        "rlcluster_lab.lab.retired_figures.draw: no such name in the lab",
    ]
