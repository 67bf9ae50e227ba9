"""Code beside the decision: every decision a cluster records leads back to the one rule
function that wrote it, shown without its docstring, with the inputs it read; and Tunix's own
lines for the rule, found by syntax in the installed rl_cluster.py, never stored here."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re

import pytest

import rlcluster_lab as rl
from rlcluster_lab.lab.rule_code import reference_lines
from rlcluster_lab.lab.rule_code.reference_lines import locate, reference_code
from rlcluster_lab.lab.rule_code.view import _test_patterns, rule_function, show_rule
from rlcluster_lab.rules import LAB_RULES, RULES, find_rule
from rlcluster_lab.rules.registry import REFERENCE, Locator

ROOT = pathlib.Path(__file__).resolve().parents[1]
INSTALLED = reference_lines._installed_reference()
needs_tunix = pytest.mark.skipif(INSTALLED is None, reason=f"Tunix is not installed: {REFERENCE.install_hint}")

# What each rule's lines must hold in the pinned release: a few words of each key statement
# (never a whole line of it, see the last test).
KEY_STATEMENTS = {
    "P1": ("r2m[Role.ACTOR] ==", "r2m[Role.ROLLOUT]"),
    "P2": ("isinstance(actor, nnx.Module)", "is_lora_enabled(actor)", "Role.REFERENCE", "_propagate_backbone"),
    "P3": ("Role.ROLLOUT in self._backbone_sharing_map", 'rollout_engine == "vanilla"', "else:"),
    "P4": ("if reference:", "r2m[Role.REFERENCE]", "logging.warning("),
    "P5": ("def _load_model(", "reshard_pytree(", "get_partition_spec("),
    "P6": ("rollout_config is None", "Mode.TRAIN", "not in [", '"config")', "model_version is None", "NotImplemented"),
    "P7": ('hasattr(self._rollout, "mesh")', "r2m[Role.ROLLOUT] ="),
    "P8": ("self._anchor_policy_state =", '"pinned_host"'),
    "P9": ("def generate(", "Role.ROLLOUT", "self.rollout.generate("),
    "P10": ("batch_size == 0", "_anchor_policy_state is None", "default_memory_kind", "compute_per_token_logps("),
    "P12": ("def update_actor(", "def update_critic(", "actor_trainer.train("),
    "P13": ("def sync_weights(", "transfer_guard", "update_params(", "global_steps += 1"),
    "P14": ("offload_to_cpu", "def _update_models_sharing", "def _maybe_load_model_from_cpu(", "def _maybe_offload"),
    "P15": ("class RLCluster",),
}


@pytest.fixture(scope="module")
def split_lora():
    cluster = rl.build_cluster(rl.Scenario(layout="split", lora=True, engine="vllm"))
    cluster.sync_weights()
    return cluster


@pytest.mark.cluster  # reads the decisions of a live cluster
def test_every_recorded_decision_finds_its_function(split_lora):
    by_rule = {e.rule: e.functions for e in RULES}
    seen = set()
    for decision in split_lora.trace:
        fn = rule_function(decision.rule, decision)
        assert fn in by_rule[decision.rule]
        # Exactly one function of the rule can write this test: the match is not a guess.
        matching = [
            f
            for f in by_rule[decision.rule]
            if any(re.fullmatch(p, decision.test, flags=re.DOTALL) for p in _test_patterns(f))
        ]
        assert matching == [fn], (decision.rule, decision.test)
        seen.add(decision.rule)
    assert {"P1", "P2", "P3", "P4", "P5", "P7", "P8", "P13"} <= seen


@pytest.mark.cluster  # reads the decisions of a live cluster
def test_shown_code_is_the_function_without_its_docstring(split_lora):
    code = show_rule(split_lora, "P3")
    assert code.function == "rlcluster_lab.rules.rollout.p3_rollout_model"
    assert code.source.startswith("def p3_rollout_model(")
    assert "Tests:" not in code.source and '"""' not in code.source
    assert code.decision is not None and code.decision["branch"] == "engine_initial_value"
    text = code.text()
    assert "read  engine = 'vllm'" in text and "branch  'engine_initial_value'" in text
    assert "<table" in code._repr_html_()


def test_shown_code_starts_at_its_def_line_under_the_rules_declared_title():
    code = show_rule(None, "P3")
    source = pathlib.Path(rl.__file__).parent.joinpath(code.path.removeprefix("rlcluster_lab/")).read_text()
    assert source.splitlines()[code.first_line - 1].startswith("def p3_rollout_model(")
    assert code.title == find_rule("P3").title
    assert code.text().startswith(f"# P3 ({find_rule('P3').title}): ")


def test_p10_the_shown_guard_says_no_public_call_reaches_it():
    """Construction pins the anchor (P8), so the missing-anchor guard is shown as unreachable."""
    shown = show_rule(None, "P10").text()
    assert "raise ValueError(ANCHOR_MISSING)" in shown
    assert "Unreachable through the public API: construction pins the anchor (P8)" in shown
    assert "cannot fire through the public API" in find_rule("P10").functions[0].__doc__


@pytest.mark.cluster  # reads the decisions of a live cluster
def test_which_and_where_select_a_decision(split_lora):
    actor = show_rule(split_lora, "P5", where={"role": "actor"})
    assert actor.decision["values"]["role"] == "actor"
    assert show_rule(split_lora, "P13").function.endswith("p13_sync")


@pytest.mark.cluster  # reads the decisions of a live cluster
def test_bad_requests_say_what_to_do(split_lora):
    with pytest.raises(ValueError, match="unknown rule 'P99'"):
        show_rule(split_lora, "P99")
    with pytest.raises(ValueError, match="no function of its own"):
        show_rule(split_lora, "P15")
    with pytest.raises(ValueError, match="out of range"):
        show_rule(split_lora, "P1", which=5)
    assert show_rule(None, "P1").decision is None


def test_every_rule_of_the_reference_declares_where_it_takes_it():
    """Every placement rule but P11 (stated in P10's lines) has lines in the reference; the
    lab's own additions have none."""
    assert {e.rule for e in RULES if e.reference} == set(KEY_STATEMENTS)
    assert not any(e.reference for e in LAB_RULES)


@needs_tunix
@pytest.mark.parametrize("rule", sorted(KEY_STATEMENTS, key=lambda r: int(r[1:])))
def test_the_reference_lines_of_each_rule_are_found_in_the_installed_tunix(rule):
    path, version = INSTALLED
    if version != REFERENCE.version:
        pytest.skip(f"the locators follow {REFERENCE.version}; {version} is installed")
    lines = path.read_text().splitlines()
    shown = reference_code(rule)
    assert shown.note == "" and shown.version == REFERENCE.version and shown.file == str(path)
    assert len(shown.spans) >= len(find_rule(rule).reference)
    for span in shown.spans:
        assert 1 <= span.first <= span.last <= len(lines) and span.source.strip()
        # The lines shown are the file's own lines at the numbers shown.
        assert [line.strip() for line in span.source.splitlines()] == [
            line.strip() for line in lines[span.first - 1 : span.last]
        ]
    found = "\n".join(span.source for span in shown.spans)
    for key in KEY_STATEMENTS[rule]:
        assert key in found, (rule, key)


@needs_tunix
def test_show_rule_puts_the_reference_lines_beside_the_rules_own_code():
    path, version = INSTALLED
    code = show_rule(None, "P1", reference=True)
    assert code.function.endswith("p1_link_actor_rollout") and code.reference is not None
    span = code.reference.spans[0]
    assert span.function == "RLCluster._init_backbone_sharing_map"
    text = code.text()
    assert f"# Tunix's own lines: {REFERENCE.distribution} {version}, {REFERENCE.path}" in text
    assert f"RLCluster._init_backbone_sharing_map, lines {span.first}-{span.last}" in text
    assert f"{span.first:>5}  if self.r2m[Role.ACTOR] ==" in text
    page = code._repr_html_()
    assert "Tunix&#x27;s own lines" in page and f">{span.first}</span>" in page  # numbered from the file's line
    assert show_rule(None, "P1").reference is None  # only when asked for
    assert show_rule("P1", reference=True) == code  # the rule alone, without a source


def test_a_rule_the_reference_has_no_lines_for_says_so():
    for rule in ("P11", "L2"):
        code = show_rule(None, rule, reference=True)
        assert code.function == "" and code.note == find_rule(rule).note
        assert code.reference.spans == () and f"has no lines for {rule}" in code.text()
    p15 = show_rule(None, "P15", reference=True)
    assert "no function of its own" in p15.text() and "RLEngine" in p15.text()
    if INSTALLED is not None:
        assert p15.reference.spans[0].source.startswith("class RLCluster")


def test_without_tunix_the_lab_names_the_lines_to_open(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name.split(".")[0] == "tunix" else real(name, *a)
    )
    code = show_rule(None, "P13", reference=True)
    note = code.reference.note
    assert code.reference.spans == () and code.reference.version is None
    assert "Tunix is not installed here" in note and "RLCluster.sync_weights" in note
    assert "google-tunix 0.1.7" in note and "https://github.com/google/tunix/blob/v0.1.7/tunix/rl/rl_cluster.py" in note
    assert 'pip install -e ".[tunix]"' in note
    assert "<a href='https://github.com/google/tunix/blob/v0.1.7/tunix/rl/rl_cluster.py'" in code._repr_html_()


# Our own stand-in for another release: the class renamed with an alias, one method gone.
OTHER_RELEASE = """
class Engine:
    def sync_weights(self):
        if self.mesh == self.other:
            pass

    def helper(self):
        pass


RLCluster = Engine
"""


def test_a_locator_finds_by_syntax_follows_an_alias_and_says_what_is_missing():
    (sync,) = locate(Locator("RLCluster.sync_weights"), OTHER_RELEASE)
    assert (sync.first, sync.last) == (3, 5) and sync.source.startswith("def sync_weights(self):")
    (test,) = locate(Locator("RLCluster.sync_weights", "If", uses=("mesh", "==")), OTHER_RELEASE)
    assert (test.first, test.last) == (4, 5)
    head, alias = locate(Locator("RLCluster"), OTHER_RELEASE)
    assert (head.source, alias.source) == ("class Engine:\n", "RLCluster = Engine\n")
    with pytest.raises(LookupError, match="RLCluster has no _init_cluster"):
        locate(Locator("RLCluster._init_cluster"), OTHER_RELEASE)
    with pytest.raises(LookupError, match="has no `If` statement mentioning mesh, !="):
        locate(Locator("RLCluster.sync_weights", "If", uses=("mesh", "!=")), OTHER_RELEASE)
    with pytest.raises(ValueError, match="not a statement"):
        locate(Locator("RLCluster.sync_weights", "Compare"), OTHER_RELEASE)


def _stored_lines() -> dict[pathlib.Path, list[str]]:
    """Every text file of the project, as its stripped non-empty lines; a notebook by its cells'
    sources. Its stored outputs are left out: they are what a run displayed (``show_rule(...,
    reference=True)`` shows lines read from the installed Tunix) and are rewritten by each run."""
    out = {}
    for path in [*ROOT.glob("*.*"), ROOT / "Makefile", *(ROOT / "src").rglob("*"), *ROOT.glob("[bdnt]*/**/*")]:
        if path.suffix not in {".py", ".md", ".ipynb", ".toml", ".json", ".txt", ".yml", ".yaml", ""}:
            continue
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".ipynb":
            text = "\n".join("".join(cell["source"]) for cell in json.loads(text)["cells"])
        out[path] = [line.strip() for line in text.splitlines() if line.strip()]
    return out


def _copied_runs(lines: list[str], theirs: list[str]) -> list[str]:
    """Runs of two or more consecutive ``lines`` that are consecutive in ``theirs`` too, of 80
    characters or more: a shorter run is an import or an argument list the lab's API mirrors
    (``reference: ... = None,``), not copied code."""
    at: dict[str, list[int]] = {}
    for j, line in enumerate(theirs):
        at.setdefault(line, []).append(j)
    runs = []
    for i, line in enumerate(lines):
        for j in at.get(line, ()):
            if i and j and lines[i - 1] == theirs[j - 1]:
                continue  # inside a run already counted from its start
            n = 0
            while i + n < len(lines) and j + n < len(theirs) and lines[i + n] == theirs[j + n]:
                n += 1
            if n >= 2 and len("".join(lines[i : i + n])) >= 80:
                runs.append(" / ".join(lines[i : i + n]))
    return runs


@needs_tunix
def test_no_tunix_source_text_is_stored_in_the_project():
    path, _ = INSTALLED
    theirs = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    # The guard sees a copy: every span show_rule displays, pasted as it is shown, is found.
    for entry in RULES:
        for span in reference_code(entry.rule).spans:
            pasted = [line.strip() for line in span.source.splitlines() if line.strip()]
            assert len(pasted) < 2 or len("".join(pasted)) < 80 or _copied_runs(pasted, theirs), span.where
    stored = _stored_lines()
    assert ROOT / "src" / "rlcluster_lab" / "lab" / "rule_code" / "reference_lines.py" in stored and len(stored) > 100
    copied = {str(p.relative_to(ROOT)): _copied_runs(lines, theirs) for p, lines in stored.items()}
    assert {p: runs for p, runs in copied.items() if runs} == {}
