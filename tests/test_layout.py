"""The package layout follows FAE's flow: no import from a later stage into an earlier one, no cycle.

Stages, earliest first: shared helpers and data sources; ``fae_torchrec.stats`` (which rows are hot);
``fae_torchrec.modules`` (the split module) and ``fae_torchrec.models`` (models built on such modules);
``planner`` (placing its parts); ``fae_torchrec.train``; the front ends (``fae_torchrec`` itself, its
command line, the training recipe). Imports are read with ``ast``, those inside functions and
``TYPE_CHECKING`` blocks included, so nothing runs.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Module-name prefixes in stage order; a module may import from its own stage and earlier ones.
STAGES = (
    (
        "fae_torchrec.torchrec_compat",
        "fae_torchrec.units",
        "fae_torchrec.checks",
        "fae_torchrec.collectives",
        "fae_torchrec.trace",
        "fae_torchrec.seeds",
        "fae_torchrec.tables",
        "fae_torchrec.arguments",
        "fae_torchrec.command_line",
        "fae_torchrec.defaults",
        "fae_torchrec.logs",
        "fae_torchrec.threads",
        "fae_torchrec.data",
    ),
    ("fae_torchrec.stats",),
    ("fae_torchrec.modules", "fae_torchrec.models"),
    ("planner",),
    ("fae_torchrec.train",),
    ("fae_torchrec.cli", "fae_torchrec.recipes"),
)
#: The package's own ``__init__`` re-exports every stage: a front end like the command line.
FRONT = len(STAGES) - 1
#: Trees whose modules are checked for cycles (benchmarks, examples and tests import the library too).
TREES = ("fae_torchrec", "planner", "benchmarks", "examples", "tests")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for tree in TREES for p in sorted((ROOT / tree).rglob("*.py"))}


def _imports(name: str, source: str, known: set[str], is_package: bool = False) -> set[str]:
    """The project modules the ``source`` of module ``name`` imports: ``from package import name``
    counts as the submodule ``package.name`` when that is a module, else as ``package``."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {module for module in found if module in known}


def _stage(module: str) -> int | None:
    if module == "fae_torchrec":
        return FRONT
    for index, prefixes in enumerate(STAGES):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {
        name: _imports(name, path.read_text(), known, path.name == "__init__.py")
        for name, path in modules.items()
    }


def test_every_library_module_has_a_stage(graph):
    library = [m for m in graph if m.split(".")[0] in ("fae_torchrec", "planner")]
    assert [m for m in library if _stage(m) is None] == []
    assert len(library) > 30  # the walk found the package


def test_no_module_imports_a_later_stage(graph):
    backwards = [
        f"{module} (stage {_stage(module)}) imports {imported} (stage {_stage(imported)})"
        for module, imports in graph.items()
        if _stage(module) is not None
        for imported in sorted(imports)
        if _stage(imported) is not None and _stage(imported) > _stage(module)
    ]
    assert backwards == []


def test_no_import_cycle(graph):
    cycles: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                cycles.append([*path[path.index(imported) :], imported])
            elif imported not in state:
                visit(imported, [*path, imported])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


#: The model-agnostic stages: what they do for DLRM on Criteo they do for TBSM on Taobao.
GENERIC = ("fae_torchrec.stats", "fae_torchrec.modules", "fae_torchrec.models", "fae_torchrec.train")


def _dataset_names(source: str) -> set[str]:
    """The identifiers of ``source`` (names, attributes, imports) that name a data set."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.alias):
            found.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
    return {name for name in found if any(word in name.lower() for word in ("criteo", "kaggle", "cat_names"))}


def test_generic_stages_name_no_data_set(graph):
    """Profiler, hot set, split module, models, partition, schedule and router take feature names
    from the data they are given, never Criteo's."""
    modules = _modules()
    named = {
        module: sorted(_dataset_names(modules[module].read_text()))
        for module in graph
        if any(module == p or module.startswith(p + ".") for p in GENERIC)
    }
    assert len(named) > 20 and "fae_torchrec.train.router" in named
    assert {module: names for module, names in named.items() if names} == {}
    assert _dataset_names("from fae_torchrec.data.criteo import DEFAULT_CAT_NAMES") == {
        "fae_torchrec.data.criteo", "DEFAULT_CAT_NAMES"
    }  # fmt: skip


#: The library proper, which a trainer calls with values, not a command line's options.
LIBRARY = ("fae_torchrec.data", "fae_torchrec.stats", "fae_torchrec.modules", "fae_torchrec.train", "planner")


def _argparse_bound(source: str) -> bool:
    """Whether ``source`` imports ``argparse`` or the command line's parsers (``fae_torchrec.arguments``)."""
    for node in ast.walk(ast.parse(source)):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom):
            names = [node.module or "", *(f"{node.module}.{alias.name}" for alias in node.names)]
        if any(name in ("argparse", "fae_torchrec.arguments") for name in names):
            return True
    return False


def test_the_library_takes_no_command_line(graph):
    """No module of the library's stages imports argparse or the command line's parsers: a trainer
    calls them with values, and the command lines parse into those (recipes, cli)."""
    modules = _modules()
    library = [m for m in graph if any(m == p or m.startswith(p + ".") for p in LIBRARY)]
    assert len(library) > 40 and "planner.fae_planner" in library
    assert [m for m in library if _argparse_bound(modules[m].read_text())] == []
    assert _argparse_bound("import argparse") and _argparse_bound("from fae_torchrec.arguments import share")
    assert _argparse_bound("from fae_torchrec import arguments") and not _argparse_bound("import numpy")


#: The longest a library function may be, in lines from its ``def`` to its end, docstring included.
LONGEST = 60


def _long_functions(name: str, source: str) -> set[str]:
    """The functions of module ``name`` longer than ``LONGEST`` lines, by qualified name."""
    long = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                if child.end_lineno - child.lineno + 1 > LONGEST:
                    long.add(f"{prefix}{child.name}")
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(source), f"{name}.")
    return long


def test_no_library_function_is_longer_than_60_lines(graph):
    """Functions of the library and its front ends stay short enough to read whole."""
    modules = _modules()
    library = [m for m in graph if m.split(".")[0] in ("fae_torchrec", "planner")]
    found = set().union(*(_long_functions(m, modules[m].read_text()) for m in library))
    assert found == set()
    assert _long_functions("m", "class A:\n    def f(self):\n" + "        x = 1\n" * 60) == {"m.A.f"}
    assert _long_functions("m", "def f():\n" + "    x = 1\n" * 59) == set()


def test_the_checks_catch_what_they_look_for():
    """The walk resolves the forms a backward import or a cycle would take."""
    known = {"fae_torchrec.stats", "fae_torchrec.stats.hot_set", "fae_torchrec.train.step", "planner"}
    source = (
        "import numpy\nfrom ..train import step\nfrom fae_torchrec.stats import HotSet\n"
        "def later():\n    import planner\n"
    )
    found = _imports("fae_torchrec.stats.probe", source, known)
    assert found == {"fae_torchrec.train.step", "fae_torchrec.stats", "planner"}
    assert _stage("fae_torchrec.train.step") > _stage("fae_torchrec.stats.probe")
    assert _stage("planner") > _stage("fae_torchrec.modules.fae_embedding_bag")


#: Where the docs tell users to import each public name from (version 0.1.0 was never released: no
#: name keeps a second home).
PUBLIC_NAMES = {
    "fae_torchrec": (
        "AccessProfiler AccessStats BatchRouter Checkpoints EmbeddingOptimizer FAEEmbeddingBagCollection "
        "FAEPrefetchTrainPipeline FAETrainPipeline HotColdPartition HotSet evaluate prepare_data train_step "
        "unfused_optimizer"
    ),
    "fae_torchrec.data": (
        "BlockSource ColumnarSource KAGGLE_TABLE_SIZES CriteoNpyReader CriteoTsvReader SampleBlock Schema "
        "SyntheticCriteo criteo_table_configs load_schema scaled_table_sizes"
    ),
    "fae_torchrec.data.criteo": (
        "MLPERF_MAX_ROWS TABLE_SETS TERABYTE_TABLE_SIZES read_table_sizes table_sizes"
    ),
    "fae_torchrec.modules": (
        "SplitFeatures gather_full_state_dict load_full_state_dict load_initial_tables part_table_name"
    ),
    "fae_torchrec.stats": (
        "FeatureIds Holdout RowRanking ShareCurve ShareEstimate estimate_hot_share hot_share_curve "
        "measure_hot_share"
    ),
    "fae_torchrec.tables": "TableLayout row_bytes",
    "fae_torchrec.train": "CheckpointError RoutedBatch Step make_schedule",
    "fae_torchrec.units": "format_bytes parse_bytes",
    "planner": "FAEShardingPlanner make_topology",
    "planner.baseline": (
        "BaselinePlan default_planner dry_run hbm_planner scaleup_planner torchrec_default_plan"
    ),
    "planner.cache_sizing": "cache_load_factors",
    "planner.cache_statistics": "AccessCacheStatistics",
    "planner.constraints": "fae_constraints",
    "planner.enumerator": "OrderedEnumerator",
    "planner.report": "FAEPlanReport PartPlacement RankTotals",
    "fae_torchrec.recipes": "DLRM TBSM RecipeConfig parse_args recipe_config train",
}


@pytest.mark.parametrize("module", sorted(PUBLIC_NAMES))
def test_public_names_import_from_where_the_docs_say(module):
    """Each public name imports from its package, and a package that lists its names (``__all__``) lists
    it; the lean top levels hold nothing else."""
    imported = importlib.import_module(module)
    names = PUBLIC_NAMES[module].split()
    for name in names:
        assert getattr(imported, name) is not None, name
        assert name in getattr(imported, "__all__", names), name
    if module in ("fae_torchrec", "planner"):
        assert sorted(imported.__all__) == sorted(names)
        with pytest.raises(AttributeError):  # no second home for a name of a stage
            getattr(imported, {"fae_torchrec": "make_schedule", "planner": "dry_run"}[module])


def test_the_top_level_api_is_lean_and_importing_it_configures_nothing():
    """At most 20 names at the top of ``fae_torchrec`` and ``planner`` (the rest in their stages'
    packages); importing them, the command line and the recipe changes no plotting backend and writes
    nothing."""
    probe = (
        "import matplotlib\n"
        "matplotlib.use('svg')\n"
        "import fae_torchrec, planner, fae_torchrec.cli, fae_torchrec.recipes, fae_torchrec.stats.plots\n"
        "print(len(fae_torchrec.__all__) + len(planner.__all__), matplotlib.get_backend())\n"
    )
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    count, backend = run.stdout.split()
    assert int(count) <= 20 and backend == "svg", run.stdout
    assert run.stderr == "", run.stderr
