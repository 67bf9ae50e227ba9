"""Code beside the decision (L1): a rule's own function from the rules layer, shown next to
the decision it just took, with the inputs it read and the branch it returned, and, on
request, Tunix's own lines for the rule (``lab.rule_code.reference_lines``).

The function is found, not named by hand: a decision records the test it made (the
``Decision.test`` string), and exactly one function of the rule writes that string. The
source shown is the one the cluster ran (``inspect.getsource``), without its docstring,
which ``docs/rules.md`` already carries.
"""

from __future__ import annotations

import ast
import dataclasses
import html
import inspect
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlcluster_lab.core.trace import Decision, jsonable
from rlcluster_lab.lab.rule_code.reference_lines import CAPTION, ReferenceCode, highlight, inline_html, reference_code
from rlcluster_lab.rules.catalogue import find_rule

_COLUMN = "flex:1 1 480px;overflow-x:auto"


@dataclasses.dataclass(frozen=True)
class RuleCode:
    """A rule function's source with the decision it took: shows as highlighted HTML in a
    notebook and as plain text elsewhere."""

    rule: str
    function: str  # module.qualname
    source: str  # the function without its docstring
    first_line: int  # line number of ``def`` in its file
    path: str  # the file, relative to the package
    decision: Mapping[str, Any] | None
    title: str = ""  # the rule's title, as declared beside its functions
    note: str = ""  # for a rule with no function of its own (then ``function`` is empty), what holds it
    reference: ReferenceCode | None = None  # the reference's own lines, when asked for

    @property
    def heading(self) -> str:
        """``P3 (the rollout model)``: the rule id with its declared title."""
        return f"{self.rule} ({self.title})" if self.title else self.rule

    def text(self) -> str:
        """The source, then what the decision read and returned, then the reference's lines, as
        plain text."""
        if self.function:
            lines = [f"# {self.heading}: {self.function}  ({self.path}, line {self.first_line})", self.source.rstrip()]
        else:
            lines = [f"# {self.heading}: no function of its own. {self.note}"]
        if self.decision is not None:
            lines += ["", f"# the decision it took: {self.decision.get('test')}"]
            lines += [f"#   read  {key} = {value!r}" for key, value in (self.decision.get("values") or {}).items()]
            lines += [f"#   branch  {self.decision.get('branch')!r}", f"#   outcome {self.decision.get('outcome')!r}"]
        if self.reference is not None:
            lines += ["", self.reference.text()]
        return "\n".join(lines)

    __str__ = text

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text())

    def _repr_html_(self) -> str:
        """The rule's code, the reference's lines beside it when asked for, and what the decision
        read and returned."""
        said = (
            f"<code>{html.escape(self.function)}</code> · {html.escape(self.path)}, line {self.first_line}"
            if self.function
            else inline_html(self.note)
        )
        head = f"<div style='{CAPTION}'><b>{html.escape(self.heading)}</b> · {said}</div>"
        columns = [f"<div style='{_COLUMN}'>{highlight(self.source)}</div>"] if self.function else []
        if self.reference is not None:
            columns.append(f"<div style='{_COLUMN}'>{self.reference._repr_html_()}</div>")
        if self.decision is not None:
            rows = "".join(
                f"<tr><td><code>{html.escape(str(k))}</code></td><td><code>{html.escape(repr(v))}</code></td></tr>"
                for k, v in (self.decision.get("values") or {}).items()
            )
            columns.append(
                "<div style='font:12px sans-serif;min-width:260px;max-width:420px'>"
                f"<div><b>what it read</b></div><table style='font-size:12px'>{rows}</table>"
                "<div style='margin-top:6px'><b>branch</b> "
                f"<code>{html.escape(str(self.decision.get('branch')))}</code></div>"
                f"<div><b>outcome</b> {html.escape(str(self.decision.get('outcome')))}</div></div>"
            )
        return (
            f"<div>{head}<div style='display:flex;gap:16px;align-items:flex-start;flex-wrap:wrap'>"
            f"{''.join(columns)}</div></div>"
        )


def _without_docstring(fn: Callable[..., object]) -> tuple[str, int]:
    """The function from its ``def`` line on, without its docstring, and that line's number.

    The decorator that registers it with its rule (``@P3.function``) is left out too: every
    rule function has one, and the rule is named above the code."""
    lines, first = inspect.getsourcelines(fn)
    source = textwrap.dedent("".join(lines))
    node = ast.parse(source).body[0]
    kept = source.splitlines(keepends=True)
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        del kept[body[0].lineno - 1 : body[0].end_lineno]
    return "".join(kept[node.lineno - 1 :]), first + node.lineno - 1


def _functions(rule: str) -> Sequence[Callable[..., object]]:
    """The functions registered with the rule's declaration (``rules.registry``)."""
    entry = find_rule(rule)
    if not entry.functions:
        raise ValueError(f"{rule} has no function of its own: {entry.note}")
    return entry.functions


def _as_dict(decision: Decision | Mapping[str, Any]) -> dict[str, Any]:
    return decision.to_json() if isinstance(decision, Decision) else {k: jsonable(v) for k, v in decision.items()}


def _decisions_of(source: Any) -> list[dict[str, Any]]:
    """Decisions from a cluster (its trace), a report (its ``decisions``) or a list of them."""
    if (trace := getattr(source, "trace", None)) is not None:
        return [d.to_json() for d in trace]
    if isinstance(source, Mapping):
        return [dict(d) for d in source.get("decisions", [])]
    decisions = getattr(source, "decisions", None)
    return [_as_dict(d) for d in (source if decisions is None else decisions)]


def _pattern(node: ast.expr) -> str:
    """A regular expression for the strings an expression can evaluate to: literals exactly,
    f-string fields and anything computed as ``.*``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(_pattern(v) if isinstance(v, ast.Constant) else ".*" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _pattern(node.left) + _pattern(node.right)
    if isinstance(node, ast.IfExp):
        return f"(?:{_pattern(node.body)}|{_pattern(node.orelse)})"
    return ".*"


def _test_patterns(fn: Callable[..., object]) -> list[str]:
    """The tests a function can record: the second argument of each ``Decision(...)`` it builds."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Decision"]
    tests = [
        c.args[1] if len(c.args) > 1 else next((k.value for k in c.keywords if k.arg == "test"), None) for c in calls
    ]
    return [_pattern(test) for test in tests if test is not None]


def rule_function(rule: str, decision: Decision | Mapping[str, Any] | None = None) -> Callable[..., object]:
    """The function of ``rule`` that took ``decision`` (the one whose source writes the
    decision's test); the rule's first function when no decision is given."""
    functions = _functions(rule)
    if decision is None:
        return functions[0]
    test = str(_as_dict(decision).get("test", ""))
    for fn in functions:
        if any(re.fullmatch(pattern, test, flags=re.DOTALL) for pattern in _test_patterns(fn)):
            return fn
    raise ValueError(f"no function of {rule} ({', '.join(f.__name__ for f in functions)}) records the test {test!r}")


def show_rule(
    source: Any = None,
    rule: str = "",
    *,
    which: int = 0,
    where: Mapping[str, Any] | None = None,
    reference: bool = False,
) -> RuleCode:
    """A rule's own code next to the decision it took, and Tunix's own lines for it.

    Args:
        source: a constructed cluster, a report (dict or dataclass with ``decisions``), or a
            list of decisions; ``None`` shows the rule's first function with no decision.
        rule: the rule id, e.g. ``"P3"`` (``show_rule("P3")`` alone reads as ``show_rule(None, "P3")``).
        which: among the rule's decisions (after ``where``), the one to show, in the order taken.
        where: keep only decisions whose ``values`` have these items (e.g. ``{"role": "actor"}``).
        reference: also show the lines of the installed Tunix's ``rl_cluster.py`` that take the
            rule (``reference_code``); without Tunix, which lines of which release to open.

    Returns:
        A ``RuleCode``: highlighted HTML in a notebook, plain text when printed.

    Raises:
        ValueError: unknown rule, a rule with no function (unless ``reference``: then its note
            and the reference's lines), or no such decision in ``source``.
    """
    if isinstance(source, str) and not rule:
        source, rule = None, source
    entry = find_rule(rule)  # an unknown rule fails first
    if reference and not entry.functions:
        return RuleCode(rule, "", "", 0, "", None, entry.title, entry.note, reference_code(rule))
    _functions(rule)  # a rule without a function fails next
    decision: dict[str, Any] | None = None
    if source is not None:
        found = [d for d in _decisions_of(source) if d.get("rule") == rule]
        found = [d for d in found if all(d.get("values", {}).get(k) == jsonable(v) for k, v in (where or {}).items())]
        if not found:
            raise ValueError(f"no {rule} decision recorded here{' with ' + str(dict(where)) if where else ''}")
        if not -len(found) <= which < len(found):
            raise ValueError(f"{rule} was decided {len(found)} time(s) here; which={which} is out of range")
        decision = found[which]
    fn = rule_function(rule, decision)
    code, first = _without_docstring(fn)
    path = fn.__module__.replace(".", "/") + ".py"
    shown = reference_code(rule) if reference else None
    return RuleCode(rule, f"{fn.__module__}.{fn.__qualname__}", code, first, path, decision, entry.title, "", shown)
