"""Each program at the matmul precision it needs (core.precision): the programs whose results
P11 compares (the sampler's and the log-prob programs) at the cluster's ``matmul_precision``,
the optimizer steps and the reward model's and critic's scores at the platform's default. On a
CPU the precision changes no float32 product, so no result could tell a swap: the assignment is
read from the text of the programs a learner step hands to XLA, where every product names its
precision (and which JAX's persistent cache keys on)."""

from __future__ import annotations

import re

import jax
import pytest

from rlcluster_lab import Scenario, build_cluster
from rlcluster_lab.app.learner import GRPOLearner, LearnerConfig
from rlcluster_lab.core.compile_options import ProgramFamily
from rlcluster_lab.core.precision import PROGRAMS, precision_of
from rlcluster_lab.model.logps import LOGPS

# The programs' names in XLA (their Python functions'): their rows of the table, and the
# precision their products must name in a cluster at the default "highest".
PROGRAM_OF = {
    "_generate": ("sampler", "HIGHEST"),  # P11 compares the sampler's log-probs
    "_logps": ("log-probs", "HIGHEST"),  # and the anchor's and the live actor's
    "_scores": ("scores", "DEFAULT"),
    "grpo_train_step": ("train step", "DEFAULT"),
    "value_train_step": ("train step", "DEFAULT"),
}
DUMPED = re.compile(r"jax_ir\d+_jit_(?P<name>.+)_compile\.mlir")


def _product_precisions(text: str) -> set[str]:
    """The precisions the program's matrix products name, e.g. ``{"HIGHEST"}``."""
    dots = [line for line in text.splitlines() if "stablehlo.dot" in line]
    assert dots, "a program of the model with no matrix product"
    return {m for line in dots for m in re.findall(r"precision = \[(\w+), \1\]", line)} | (
        {"(none)"} if any("precision = [" not in line for line in dots) else set()
    )


def test_the_table_keeps_what_p11_compares_exact_and_the_rest_at_the_default():
    assert {p for p, row in PROGRAMS.items() if row.compared} == {"sampler", "log-probs"}
    assert precision_of("log-probs", "highest") == "highest" and precision_of("sampler", None) is None
    assert precision_of("train step", "highest") is None and precision_of("scores", "highest") is None
    assert all("P11" in row.why for row in PROGRAMS.values())
    with pytest.raises(KeyError):
        ProgramFamily(lambda x: x, "update")  # a name the table lacks is refused


def test_a_compared_program_follows_the_contexts_precision_and_is_keyed_on_it():
    with jax.default_matmul_precision("highest"):
        exact = LOGPS.jitted(None)
    with jax.default_matmul_precision("default"):
        default = LOGPS.jitted(None)
    assert exact is not default and LOGPS.jitted(None) not in (exact, default)


@pytest.mark.cluster
def test_a_learner_step_lowers_the_compared_programs_at_highest_and_the_updates_at_the_default(tmp_path):
    """Every program of a first learner step with a reward model and a critic, as handed to XLA
    (``jax_dump_ir_to``: the module compiled or looked up in the persistent cache)."""
    cluster = build_cluster(Scenario(with_reward=True, with_critic=True, max_tokens=4))
    assert cluster.cluster_config.matmul_precision == "highest"
    learner = GRPOLearner(
        cluster, LearnerConfig(steps=1, prompts_per_step=2, group_size=2, critic=True), use_reward_model=True
    )
    before = jax.config.read("jax_dump_ir_to")
    jax.config.update("jax_dump_ir_to", str(tmp_path))
    try:
        learner.step()
    finally:
        jax.config.update("jax_dump_ir_to", before)
    seen: dict[str, set[str]] = {}
    for path in tmp_path.glob("*.mlir"):
        name = DUMPED.fullmatch(path.name)
        if name and name["name"] in PROGRAM_OF:
            seen.setdefault(name["name"], set()).update(_product_precisions(path.read_text()))
    assert set(seen) == set(PROGRAM_OF), f"programs lowered: {sorted(seen)}"
    for name, precisions in seen.items():
        program, wanted = PROGRAM_OF[name]
        assert precisions == {wanted}, f"{name} ({program}) lowered at {precisions}, not {wanted}"
