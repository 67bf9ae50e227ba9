"""What the docs name exists: every name a page writes in backticks that can be checked is checked.

test_notebook_names.py resolves the full ``rlcluster_lab.x.y`` names; the docs mostly write
shorter ones, which drift the same way (a function renamed, a key moved). Here, from the
committed Markdown alone (docs/*.md, README.md, CONTRIBUTING.md):

- a dotted name (``events.wants``, ``core.waits.waiting(label)``, ``RLCluster.build_ahead``,
  ``Plan.per_device``, ``rl.setup()``): resolved when its first part is the package (``rl``,
  ``rlcluster_lab``), one of its modules (by its path's tail: ``events`` is
  ``placement.events``), one of its classes (an attribute its instances have), a JSON object
  of a plan or a report (``fits.reason``: a key that object has), a variable the docs give a
  type (``cluster``: an ``RLCluster``), or a library module (``jax.device_put``); a name whose
  first part is none of these is not checked;
- a file (``cluster/sync.py``, ``tests/test_x.py::test_y_*``): it exists, under the repository,
  ``src/`` or the package, and a test pattern matches a test in it; Tunix's own paths are
  looked up in the installed Tunix when it is there;
- a flag (``--sync-chunk-bytes``, ``--engine {vanilla,vllm,sglang_jax}``): an option of the
  CLI, with those choices, unless it is written for another tool (below);
- a command (``python -m rlcluster_lab plan --json``), in backticks or on a line of a code
  block: the CLI's parser takes it; ``python -m rlcluster_lab.x`` names a module that exists.

A name is checked wherever it is written, so a misspelt one fails: nothing is skipped because
it failed, only because its first part is not the lab's.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import importlib
import importlib.util
import json
import pkgutil
import re
import shlex
import typing
from pathlib import Path
from typing import Any

import pytest
from test_notebook_names import MISSING, _instance_attributes, _resolve

from rlcluster_lab.cli.flags import scenario_from
from rlcluster_lab.cli.main import build_parser
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.knobs import KNOBS

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "rlcluster_lab"
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
# Flags the docs write for other tools: Jupyter's, pytest-xdist's; XLA's own flags start with --xla_.
FOREIGN_FLAGS = {"--allow-root": "jupyter lab", "--dist": "pytest-xdist"}
# Library modules a name may start with, as the docs abbreviate them.
LIBRARIES = {
    "jax": "jax",
    "jnp": "jax.numpy",
    "lax": "jax.lax",
    "np": "numpy",
    "nnx": "flax.nnx",
    "functools": "functools",
    "gc": "gc",
}
# Variables the docs use for an object of the lab, and its class.
VARIABLES = {
    "cluster": "rlcluster_lab.rl_cluster.RLCluster",
    "lab": "rlcluster_lab.lab.notebook.setup.LabDevices",
    "plan": "rlcluster_lab.planner.plan.Plan",
}


def _spans(text: str) -> list[str]:
    return SPAN.findall(text)


def _code_lines(text: str) -> list[str]:
    return [line for block in FENCE.findall(text) for line in block.splitlines()]


@functools.cache
def _modules() -> dict[str, str]:
    """Every module of the package, by its dotted path inside the package (``placement.events``)."""
    found = {}
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="rlcluster_lab."):
        if info.name.endswith("__main__"):  # running it is what importing it does
            continue
        found[info.name.removeprefix("rlcluster_lab.")] = info.name
    return found


@functools.cache
def _classes() -> dict[str, list[type]]:
    """Every class the package's modules define, by name (a module that cannot be imported here,
    for want of an optional extra, is left out)."""
    by_name: dict[str, list[type]] = {}
    for full in _modules().values():
        try:
            module = importlib.import_module(full)
        except ImportError:
            continue
        for name, obj in vars(module).items():
            if isinstance(obj, type) and obj.__module__ == full:
                by_name.setdefault(name, []).append(obj)
    return by_name


@functools.cache
def _json_objects() -> dict[str, set[str]]:
    """The keys of each JSON object at the top of a plan or a report: a plan of each layout, with
    and without LoRA, on the lab's devices and on two hosts, and every stored report."""
    from rlcluster_lab import Scenario
    from rlcluster_lab.planner import plan_cluster, plan_scenario

    tops: list[dict[str, Any]] = [
        plan_scenario(Scenario(layout=layout, lora=lora)).to_json()
        for layout in ("colocated", "reshaped", "split")
        for lora in (False, True)
    ]
    tops.append(plan_cluster("tiny", "gpu-2x8", layout="split", lora_rank=4).to_json())
    tops += [json.loads(p.read_text()) for p in sorted((ROOT / "tests" / "data" / "reports").glob("*.json"))]
    keys: dict[str, set[str]] = {}
    for top in tops:
        for name, value in top.items():
            if isinstance(value, dict):
                keys.setdefault(name, set()).update(value)
    return keys


def _attribute_of_instance(classes: list[type], attr: str) -> bool:
    return any(attr in _instance_attributes(cls) for cls in classes)


def _module_names(first: str) -> list[str]:
    """The package's modules a name's first part can mean: ``core`` (a subpackage) or
    ``events`` (the tail of ``placement.events``)."""
    modules = _modules()
    return [full for rel, full in modules.items() if rel == first or rel.endswith(f".{first}")]


def _resolves(obj: Any, parts: list[str]) -> bool:
    """Whether ``parts`` are attributes of ``obj`` one after the other; on a class, of its
    instances (a dataclass field's type, when a class, takes the next part)."""
    for part in parts:
        if isinstance(obj, type):
            if part not in _instance_attributes(obj):
                return False
            hint = _field_types(obj).get(part)
            if not isinstance(hint, type):
                return True  # an attribute whose type is not a class: what follows is not checked
            obj = hint
            continue
        obj = getattr(obj, part, MISSING)
        if obj is MISSING:
            return False
    return True


def _field_types(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # a hint naming a type-checking-only import
        return {}


def _json_key_written(root: str, key: str) -> bool:
    """Whether the package's source writes or reads ``key`` on a JSON object called ``root``
    (``sync["processes"]``, ``out["sync"]["processes"]``): a key only some reports have (a
    multi-process run's)."""
    pattern = re.compile(rf'\b{root}"?\]?\[\s*"{key}"\s*\]')
    return any(pattern.search(p.read_text()) for p in PACKAGE.rglob("*.py"))


def _tunix_has(name: str) -> bool | None:
    """Whether Tunix's ``rl_cluster.py`` defines ``RLCluster.<name>`` (None: Tunix is not installed)."""
    where = _installed("tunix")
    if where is None:
        return None
    return re.search(rf"^\s+def {re.escape(name)}\(", (where / "tunix/rl/rl_cluster.py").read_text(), re.M) is not None


def _library(first: str, rest: list[str]) -> bool:
    """Whether a library name (``jax.experimental.topologies``) resolves: modules first, then attributes."""
    parts = [LIBRARIES[first], *rest]
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return _resolves(obj, parts[cut:])
    return False


def dotted_problem(name: str, tunix: bool = False) -> str | None:
    """Why ``name`` (``a.b.c``, a call or subscript after it already cut off) names nothing the
    lab has; None when it resolves, or when its first part is not the lab's. ``tunix``: the
    name is written about Tunix's own ``rl_cluster.py`` (``RLCluster._load_model``).

    A first part can mean several things (``sync``: a module, a report's object; ``lab``: the
    subpackage, the notebooks' set-up object): the name resolves when one of them has it."""
    parts = name.split(".")
    first, rest = parts[0], parts[1:]
    if tunix and first == "RLCluster" and len(rest) == 1:
        has = _tunix_has(rest[0])
        return None if has is not False else f"Tunix's RLCluster has no {rest[0]}"
    if first in ("rl", "rlcluster_lab"):
        return None if _resolve("rlcluster_lab." + ".".join(rest)) is not MISSING else "no such name in the package"
    if first in LIBRARIES:
        return None if _library(first, rest) else f"{LIBRARIES[first]} has no {'.'.join(rest)}"
    # (what the name would be, whether it has the rest, the rest)
    meanings: list[tuple[str, bool, list[str]]] = []
    for cut in range(len(parts) - 1, 0, -1):  # the longest module path first: core.compile_cache.x
        head = ".".join(parts[:cut])
        modules = [full for rel, full in _modules().items() if rel == head or rel.endswith("." + head)]
        for full in modules:
            try:
                module = importlib.import_module(full)
            except ImportError:
                return None  # an optional extra's module: not checked here
            meanings.append((full, _resolves(module, parts[cut:]), parts[cut:]))
        if modules:
            break
    if first in _classes():
        meanings.append((first, any(_resolves(cls, rest) for cls in _classes()[first]), rest))
    if first in VARIABLES:
        meanings.append((VARIABLES[first], _resolves(_resolve(VARIABLES[first]), rest), rest))
    if first in _json_objects():
        has = rest[0] in _json_objects()[first] or _json_key_written(first, rest[0])
        meanings.append((f"a plan's or a report's {first}", has, rest[:1]))
    if not meanings or any(has for _, has, _ in meanings):
        return None
    if len(meanings) == 1:
        what, _, tail = meanings[0]
        return f"{what} has no {'.'.join(tail)}"
    return f"neither {' nor '.join(what for what, _, _ in meanings)} has {'.'.join(rest)}"


def _dotted_names(span: str) -> list[str]:
    """The dotted names a span writes as a name: the span itself, a call or subscript cut off
    (``core.waits.waiting(label)`` -> ``core.waits.waiting``); not a file name, a number or text."""
    head = re.split(r"[(\[ ]", span, maxsplit=1)[0]
    if not DOTTED.fullmatch(head) or re.search(r"\.(py|md|toml|json|ipynb|yml|png|txt|html)$", head):
        return []
    return [head]


def _installed(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    return Path(spec.origin).parent.parent if spec and spec.origin else None


def path_problem(span: str) -> str | None:
    """Why a file name in a span (``cluster/sync.py``, ``tests/test_x.py::test_y_*``) names no file
    (or no test) of the repository; None when it does."""
    path, _, pattern = span.partition("::")
    if path.startswith("tunix/"):
        where = _installed("tunix")
        return None if where is None or (where / path).exists() else f"the installed Tunix has no {path}"
    bases = [ROOT, ROOT / "src", PACKAGE]
    found = [base / path for base in bases if (base / path).exists()]
    if not found and "/" not in path:  # a bare file name: anywhere in the sources, the tests, the benchmarks
        found = [p for d in ("src", "tests", "benchmarks", "notebooks") for p in (ROOT / d).rglob(path)]
    if not found:
        return "no such file"
    if pattern:
        source = found[0].read_text()
        tests = re.findall(r"^(?:async )?def (test_\w+)", source, re.M)
        if not fnmatch.filter(tests, pattern):
            return f"no test matches {pattern}"
    return None


@functools.cache
def _options() -> dict[str, argparse.Action]:
    """Every option of every subcommand, by its flag."""
    parser = build_parser()
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                for a in sub._actions:
                    for flag in a.option_strings:
                        out[flag] = a
    return out


@functools.cache
def _benchmark_flags() -> set[str]:
    """The flags the benchmark scripts declare (``add_argument("--only", ...)``), read from their source."""
    return {
        m.group(1)
        for p in (ROOT / "benchmarks").rglob("*.py")
        for m in re.finditer(r"add_argument\(\s*\"(--[\w-]+)\"", p.read_text())
    }


def flag_problem(span: str) -> str | None:
    """Why a flag span (``--reshard``, ``--engine {vanilla,vllm}``, ``--devices N``) is no option
    of the CLI (or offers other choices); None when it is, or when it is another tool's."""
    flag, _, after = span.partition(" ")
    flag = flag.split("=")[0]
    if flag in FOREIGN_FLAGS or flag.startswith("--xla_"):
        return None
    action = _options().get(flag)
    if action is None:
        return None if flag in _benchmark_flags() else "no subcommand of the CLI takes it, nor a benchmark"
    choices = re.fullmatch(r"\{([^}]*)\}", after.strip())
    offered = action.choices or next((k.choices for k in KNOBS.values() if k.flag == flag), None) or ()
    if choices and set(choices.group(1).split(",")) != {str(c) for c in offered}:
        return f"its choices are {sorted(map(str, offered))}"
    return None


def command_problem(line: str) -> str | None:
    """Why a command line of the lab's (``python -m rlcluster_lab plan --json  # what-if``) would be
    refused by the parser, or names a module that does not exist; None when it runs."""
    command = line.split("#")[0].split("|")[0].split(">")[0].strip()
    words = shlex.split(command)
    if words[:2] != ["python", "-m"] or len(words) < 3 or not words[2].startswith("rlcluster_lab"):
        return None
    if words[2] != "rlcluster_lab":
        return None if importlib.util.find_spec(words[2]) else f"no module {words[2]}"
    if any(w.isupper() or "[" in w or "..." in w for w in words[3:]):
        return None  # a synopsis (NAME, [--lora]), not a command
    try:
        args = build_parser().parse_args(words[3:])
    except SystemExit:
        return "the parser refuses it"
    if args.command in ("report", "learn"):  # their knobs' values are checked as the command checks them
        try:
            scenario_from(args)
        except ConfigError as err:
            return f"refused: {err}"
    return None


PATH = re.compile(r"[\w./-]+\.(?:py|md|toml|yml|ipynb|json)(?:::\S+)?")


def problems(page: Path) -> list[str]:
    """What ``page`` names that does not exist, one line each."""
    text = page.read_text()
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        tunix = "tunix/rl/rl_cluster.py" in paragraph
        for span in _spans(paragraph):
            why = None
            words = span.split()
            if span.startswith("--"):
                why = flag_problem(span)
            elif span.startswith("python -m "):
                why = command_problem(span)
            elif len(words) > 1 and words[0] == "python" and PATH.fullmatch(words[1]):
                why = path_problem(words[1])
            elif PATH.fullmatch(span):
                # A placeholder (notebooks/NN_name.md) names no one file.
                why = None if re.search(r"\b[A-Z]{2,}(?:_|\b)", span) else path_problem(span)
            else:
                why = next(filter(None, (dotted_problem(n, tunix) for n in _dotted_names(span))), None)
            if why:
                found.append(f"{page.name}: `{span}`: {why}")
    for line in _code_lines(text):
        if line.startswith("python -m rlcluster_lab"):
            why = command_problem(line)
            if why:
                found.append(f"{page.name}: {line.strip()!r}: {why}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_what_a_page_names_exists(page: Path) -> None:
    assert problems(page) == []


def test_each_kind_of_name_the_lab_no_longer_has_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "`events.described_once` and `events.LEDGER`; `fits.per_device` and `fits.reason`; `Plan.per_device`;\n"
        "`core.waits.waiting(label)` and `core.waits.hurry(label)`; `RLCluster.build_ahead`, `RLCluster.fly`;\n"
        "`cluster.sync_weights()`, `cluster.fly()`; `rl.setup()`, `rl.unset()`; `jax.device_put`, `jax.put`;\n"
        "`cluster/sync.py`, `cluster/gone.py`, `tests/test_sync.py::test_p13_*`, `tests/test_sync.py::test_nope_*`;\n"
        "`--reshard`, `--reshard-all`, `--engine {vanilla,vllm,sglang_jax}`, `--engine {vanilla,vllm}`,\n"
        "`--allow-root`; `python -m rlcluster_lab plan --json`, `python -m rlcluster_lab plan --yaml`,\n"
        "`python -m rlcluster_lab.rules > docs/rules.md`, `python -m rlcluster_lab.gone`; `d.values.lora`\n"
        "```bash\npython -m rlcluster_lab report --layout diagonal\npython -m rlcluster_lab report --lora-rank 0\n```\n"
    )
    found = problems(page)
    # Which names are found (the messages say why; a module added to the lab may add a meaning).
    assert [line.split(": ", 2)[1] for line in found] == [
        "`events.described_once`",
        "`fits.per_device`",
        "`core.waits.hurry(label)`",
        "`RLCluster.fly`",
        "`cluster.fly()`",
        "`rl.unset()`",
        "`jax.put`",
        "`cluster/gone.py`",
        "`tests/test_sync.py::test_nope_*`",
        "`--reshard-all`",
        "`--engine {vanilla,vllm}`",
        "`python -m rlcluster_lab plan --yaml`",
        "`python -m rlcluster_lab.gone`",
        "'python -m rlcluster_lab report --layout diagonal'",
        "'python -m rlcluster_lab report --lora-rank 0'",
    ]
    assert "page.md: `events.described_once`: rlcluster_lab.placement.events has no described_once" in found
    assert any(line.startswith("page.md: `fits.per_device`: ") and "fits has" in line for line in found)
    assert "page.md: `--engine {vanilla,vllm}`: its choices are ['sglang_jax', 'vanilla', 'vllm']" in found
    assert (
        "page.md: 'python -m rlcluster_lab report --lora-rank 0': refused: "
        "lora_rank (--lora-rank) must be at least 1, got 0"
    ) in found


def _checked(name: str) -> bool:
    """Whether ``dotted_problem`` has a meaning to check ``name`` against (its first part is the
    lab's, a library's, or one of the docs' variables or JSON objects)."""
    first = name.split(".")[0]
    known = {"rl", "rlcluster_lab", *LIBRARIES, *VARIABLES, *_classes(), *_json_objects()}
    return first in known or any(rel.split(".")[-1] == first or rel == first for rel in _modules())


def test_the_checks_reach_names_of_every_kind_in_the_docs() -> None:
    # Guards the scope: a change that made the checks pass over whole kinds of names would
    # otherwise pass unnoticed.
    spans = [s for p in PAGES for s in _spans(p.read_text())]
    assert sum(_checked(n) for s in spans for n in _dotted_names(s)) > 150
    assert sum(1 for s in spans if s.startswith("--")) > 30
    assert sum(1 for s in spans if PATH.fullmatch(s) and "::" in s) > 20
