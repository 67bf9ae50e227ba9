"""The public API: what each namespace lists in ``__all__`` is what type checkers see and what
it serves, imported on first use; ``import rlcluster_lab`` alone imports no JAX; names that
moved to their own namespace still resolve at the top level."""

from __future__ import annotations

import importlib
import pathlib
import subprocess
import sys

import grimp
import pytest

from rlcluster_lab.core.exports import lazy_exports, typed_imports

NAMESPACES = (
    "rlcluster_lab",
    "rlcluster_lab.lab",
    "rlcluster_lab.multiprocess",
    "rlcluster_lab.planner",
    "rlcluster_lab.rules",
)


@pytest.mark.parametrize("name", NAMESPACES)
def test_every_name_in_all_resolves_to_its_typed_import(name: str) -> None:
    module = importlib.import_module(name)
    typed = typed_imports(pathlib.Path(module.__file__).read_text(), name)
    assert sorted(module.__all__) == sorted(typed)
    for public in module.__all__:
        home, attribute = typed[public]
        assert getattr(module, public) is getattr(importlib.import_module(home), attribute), public


@pytest.mark.parametrize("name", NAMESPACES)
def test_an_unknown_name_is_an_attribute_error(name: str) -> None:
    module = importlib.import_module(name)
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018


@pytest.mark.cluster
def test_import_rlcluster_lab_alone_imports_no_jax() -> None:
    code = (
        "import sys\n"
        "import rlcluster_lab, rlcluster_lab.lab, rlcluster_lab.planner, rlcluster_lab.multiprocess, "
        "rlcluster_lab.rules\n"
        "print(sorted(m for m in ('jax', 'flax', 'optax') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[]", out.stdout


def test_moved_names_still_resolve_at_the_top_level_but_are_not_listed() -> None:
    import rlcluster_lab as rl
    import rlcluster_lab.core.meshes as meshes
    import rlcluster_lab.lab as lab
    import rlcluster_lab.planner as planner

    assert rl.PlacementLab is lab.PlacementLab
    assert rl.LabDevices is lab.LabDevices
    assert rl.plan_cluster is planner.plan_cluster and rl.Plan is planner.Plan
    assert rl.mesh_from_ids is meshes.mesh_from_ids
    for moved in (
        "PlacementLab",
        "LabDevices",
        "Plan",
        "PlannedMesh",
        "plan_cluster",
        "plan_scenario",
        "mesh_from_ids",
    ):
        assert moved not in rl.__all__ and moved not in dir(rl), moved


def test_all_and_the_typed_imports_must_agree(tmp_path: pathlib.Path) -> None:
    init = tmp_path / "__init__.py"
    init.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from json import dumps, loads\n")
    with pytest.raises(ValueError, match=r"imported but not in __all__: \['loads'\]"):
        lazy_exports("pkg", str(init), ["dumps"])


def test_a_plain_import_under_type_checking_is_refused() -> None:
    with pytest.raises(ValueError, match="names no single object"):
        typed_imports("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import json\n", "pkg")


def test_no_module_takes_a_name_through_the_face_of_its_own_subpackage() -> None:
    """A subpackage's face loads its names on first use (``lazy_exports``), so a module that took
    a sibling's name through it, at module level or inside a function, would tie the two by an
    arrow that import-linter's acyclic_siblings contract does not see (an import of the face is
    not one between siblings): a circle could hide there. A module names its sibling's module.
    The top level's face is left to the layers contract, which follows chains through it;
    ``__main__`` is run, never imported."""
    graph = grimp.build_graph("rlcluster_lab", cache_dir=None)  # imports for type checking too
    through_face = [
        f"{module} -> {face}"
        for module in sorted(graph.modules)
        if not module.endswith(".__main__")
        for face in graph.find_modules_directly_imported_by(module)
        if face != "rlcluster_lab" and module.startswith(face + ".")
    ]
    assert through_face == []
