"""The import graph of ``spanner_queues`` has no cycle, and the runtime never imports the emulator.

The emulator front is a distribution of its own (``emulator/``, package
``spanner_queues_emulator``): only the app's test kit (``spanner_queues.testing``) imports it,
and it imports neither the app nor Django.

Every module of the package is parsed with ``ast``; every ``import`` and ``from ... import`` node
counts, wherever it sits: at module level, inside functions and methods, inside ``try`` blocks.
Imports inside functions hide a cycle, they do not remove it.

Choice: imports under ``if TYPE_CHECKING:`` are left out. They are never executed (every module
has ``from __future__ import annotations``), so they only name types for the checker; a lower
layer may name a higher layer's type in an annotation without depending on it at run time.

``from pkg import name`` is an edge to ``pkg.name`` when that is a module of the package, else to
``pkg``. Importing ``pkg.sub`` runs ``pkg/__init__.py`` too, but that implicit edge is not drawn:
the package ``__init__`` modules here are thin (docstrings, re-exports of their own submodules).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import spanner_queues

PACKAGE = "spanner_queues"
ROOT = Path(spanner_queues.__file__).resolve().parent

# The testing side: the test kit (which starts emulator processes). Nothing else imports it.
TESTING = ("spanner_queues.testing",)
EMULATOR = "spanner_queues_emulator"
EMULATOR_ROOT = ROOT.parent / "emulator" / EMULATOR


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        found[_module_name(path)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """All import nodes of ``tree``, skipping the bodies of ``if TYPE_CHECKING:`` blocks."""
    nodes: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            nodes.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return nodes


def _edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    targets.add(alias.name)
            continue
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        if source.split(".")[0] != PACKAGE:
            continue
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            targets.add(sub if sub in modules else source)
    return {t for t in targets if t in modules}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (at run time)."""
    modules = _modules()
    return {name: _edges(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, and modules importing themselves
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        found.append(sorted(component))
    return found


def _describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return f"{len(component)} modules: " + "; ".join(edges)


def test_the_graph_sees_imports_inside_functions() -> None:
    graph = import_graph()
    # the tasks app's ready() imports its runner inside a method: the graph must see it.
    assert "spanner_queues.contrib.tasks.runner" in graph["spanner_queues.contrib.tasks.apps"]
    assert "spanner_queues.engines.base" in graph["spanner_queues.engines"]


#: issue 21's bound on imports inside functions, for the whole package
MAX_INNER_IMPORTS = 15


def _inner_imports() -> list[tuple[Path, int]]:
    """(file, line) of every import inside a function of the package (migrations aside)."""
    found = set()
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.update(
                    (path, sub.lineno)
                    for sub in ast.walk(node)
                    if isinstance(sub, (ast.Import, ast.ImportFrom))
                )
    return sorted(found)


def test_imports_inside_functions_are_few_and_say_why() -> None:
    """Imports sit at the top of their modules. One stays inside a function only where an
    optional dependency or app cannot be required, or where Django or pytest imports the module
    before the app registry is ready; a comment on its line or the line above says which."""
    inner = _inner_imports()
    assert len(inner) <= MAX_INNER_IMPORTS, [f"{p.relative_to(ROOT)}:{n}" for p, n in inner]
    unexplained = []
    for path, line in inner:
        lines = path.read_text().splitlines()
        if "#" not in lines[line - 1] and "#" not in lines[line - 2]:
            unexplained.append(f"{path.relative_to(ROOT)}:{line}: {lines[line - 1].strip()}")
    assert not unexplained, "imports inside functions without a reason:\n" + "\n".join(unexplained)


def test_cycle_detection_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert cycles(graph) == [["a", "b", "c"], ["d"]]


def test_no_import_cycle() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles in spanner_queues:\n" + "\n".join(
        _describe(graph, c) for c in found
    )


def test_runtime_modules_do_not_import_the_emulator() -> None:
    graph = import_graph()
    offenders = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if not _within(module, TESTING)
        for target in targets
        if _within(target, TESTING)
    )
    assert not offenders, "runtime modules importing the testing side:\n" + "\n".join(offenders)


def _top_level_imports(path: Path) -> set[str]:
    """The top-level package of every absolute import in ``path`` (inside functions too)."""
    names: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_test_kit_imports_the_emulator_distribution() -> None:
    offenders = sorted(
        name
        for name, path in _modules().items()
        if not _within(name, TESTING) and EMULATOR in _top_level_imports(path)
    )
    assert not offenders, f"modules of the app importing {EMULATOR}: {offenders}"


def test_the_emulator_distribution_imports_neither_the_app_nor_django() -> None:
    paths = sorted(EMULATOR_ROOT.rglob("*.py"))
    assert len(paths) > 5, EMULATOR_ROOT
    offenders = sorted(
        f"{path.relative_to(EMULATOR_ROOT)} -> {top}"
        for path in paths
        for top in _top_level_imports(path) & {PACKAGE, "django", "django_spanner"}
    )
    assert not offenders, "the emulator distribution importing the app or Django:\n" + "\n".join(
        offenders
    )


# The floor of the layer picture (docs: CONTRIBUTING.md): the engines, Spanner SQL, row storage
# and shared value types. They must not reach up to the verbs or anything above them.
LOWER = (
    "spanner_queues.engines",
    "spanner_queues.storage",
    "spanner_queues.options",
    "spanner_queues.keys",
    "spanner_queues.message",
    "spanner_queues.payload",
    "spanner_queues.conf",
    "spanner_queues.drivers",
    "spanner_queues.transactions",
    "spanner_queues.exceptions",
    "spanner_queues.semantics",
    "spanner_queues.failures",
    "spanner_queues.causes",
    "spanner_queues.clock",
)
UPPER = (
    "spanner_queues.models",
    "spanner_queues.api",
    "spanner_queues.deadletter",
    "spanner_queues.queues",
    "spanner_queues.monitoring",
    "spanner_queues.controls",
    "spanner_queues.signals",
    "spanner_queues.receivers",
    "spanner_queues.worker",
    "spanner_queues.patterns",
    "spanner_queues.outbox",
    "spanner_queues.contrib",
    "spanner_queues.admin",
    "spanner_queues.checks",
    "spanner_queues.management",
    "spanner_queues.apps",
    "spanner_queues.introspection",
)


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_engines_and_below_do_not_import_the_verbs_or_above() -> None:
    graph = import_graph()
    offenders = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if _within(module, LOWER)
        for target in targets
        if _within(target, UPPER)
    )
    assert not offenders, "lower layers reaching up:\n" + "\n".join(offenders)


ENGINES = {"spanner_queues.engines.table", "spanner_queues.engines.native"}
#: outside the engines, no module imports one of their modules (queuegrants did, for the
#: native dialect's SQL names: it asks the handler, ``engines.spanner_sql``)
READS_AN_ENGINE: dict[str, str] = {}


def test_each_engine_is_self_contained() -> None:
    """An engine is one module or one package: nothing outside it imports it (callers reach it
    through the handler, ``SPANNER_QUEUES[alias]["ENGINE"]``, and the seam), and it imports no
    other engine."""
    graph = import_graph()
    assert "spanner_queues.engines.native.receive" in graph["spanner_queues.engines.native"]
    offenders = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        for engine in ENGINES
        if _within(target, (engine,))
        and not _within(module, (engine,))
        and READS_AN_ENGINE.get(module) != target
    )
    assert not offenders, "modules reaching into an engine:\n" + "\n".join(offenders)


CONTRIB = "spanner_queues.contrib"
#: the one module outside the optional apps that may import one (when it is installed)
READS_CONTRIB = {"spanner_queues.management.commands.queuegrants"}


def test_nothing_but_queuegrants_imports_the_optional_apps() -> None:
    """The apps under ``contrib/`` are optional: the core runs without them installed, so no
    core module imports them (``queuegrants`` reads the tasks app's tables, behind
    ``apps.is_installed``)."""
    graph = import_graph()
    assert "spanner_queues.contrib.tasks.models" in graph["spanner_queues.contrib.tasks.backend"]
    offenders = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if not _within(module, (CONTRIB,)) and module not in READS_CONTRIB
        for target in targets
        if _within(target, (CONTRIB,))
    )
    assert not offenders, "core modules importing an optional app:\n" + "\n".join(offenders)


def test_the_clock_is_the_bottom_layer() -> None:
    """``clock`` is read by every layer (the worker's threads included): it imports nothing of
    the package, so any module may import it without a cycle."""
    assert import_graph()["spanner_queues.clock"] == set()


CONTRIBUTING = ROOT.parent / "CONTRIBUTING.md"


def _layers() -> dict[str, int]:
    """CONTRIBUTING.md's layer table: module or package prefix -> its layer (1 top, 7 floor)."""
    layers = {}
    for line in CONTRIBUTING.read_text().splitlines():
        row = line.split("|")
        if len(row) < 3 or not row[1].strip()[:1].isdigit():
            continue
        number = int(row[1].strip().split(".", 1)[0])
        for name in re.findall(r"`([a-z_/]+)`", row[1]):
            layers[f"{PACKAGE}." + name.strip("/").replace("/", ".")] = number
    return layers


def _layer_of(module: str, layers: dict[str, int]) -> int | None:
    best = max((p for p in layers if _within(module, (p,))), key=len, default=None)
    return layers[best] if best else None


def test_every_import_follows_the_layers_of_contributing() -> None:
    """No module imports a layer above its own (CONTRIBUTING.md's table), but for the one
    exception it states: the engine handler (``engines/__init__``), which layer 6 may import."""
    layers = _layers()
    assert layers[f"{PACKAGE}.controls"] == 4 and layers[f"{PACKAGE}.clock"] == 7
    offenders = []
    for module, targets in import_graph().items():
        own = _layer_of(module, layers)
        if own is None:
            continue
        for target in targets:
            theirs = _layer_of(target, layers)
            if own == 6 and target == f"{PACKAGE}.engines":
                continue
            if theirs is not None and theirs < own:
                offenders.append(f"{module} (layer {own}) -> {target} (layer {theirs})")
    assert not offenders, "imports reaching up a layer:\n" + "\n".join(sorted(offenders))


def test_every_module_has_a_layer_or_a_side() -> None:
    layers = _layers()
    sides = (*TESTING, f"{PACKAGE}.contrib")
    unplaced = sorted(
        m
        for m in import_graph()
        if m != PACKAGE and _layer_of(m, layers) is None and not _within(m, sides)
    )
    assert not unplaced, "modules missing from CONTRIBUTING.md's layer table: " + ", ".join(
        unplaced
    )


def test_the_worker_names_no_database_driver() -> None:
    """Lock ordering for single-writer databases (SQLite) is the vendor floor's business
    (``transactions.holding``), not the worker's: no module of ``worker/`` imports
    ``drivers``."""
    offenders = sorted(
        f"{module} -> {PACKAGE}.drivers"
        for module, targets in import_graph().items()
        if _within(module, (f"{PACKAGE}.worker",)) and f"{PACKAGE}.drivers" in targets
    )
    assert not offenders, "the worker reaches the drivers:\n" + "\n".join(offenders)


def test_the_test_kit_says_how_to_install_the_front_when_it_is_missing(monkeypatch) -> None:
    import importlib
    import sys

    import pytest

    monkeypatch.setitem(sys.modules, EMULATOR, None)  # as when it is not installed
    monkeypatch.delitem(sys.modules, "spanner_queues.testing.emulator", raising=False)
    with pytest.raises(ImportError, match=r"spanner-queues-emulator: pip install \./emulator"):
        importlib.import_module("spanner_queues.testing.emulator")
    monkeypatch.delitem(sys.modules, "spanner_queues.testing.emulator", raising=False)
