"""The worker's shape in three figures, on any commit (issue 30): the path of one message, the
members of the ``Worker`` other modules touch, and the functions over 60 lines.

    .venv/bin/python benchmarks/worker_shape.py                 # this checkout
    .venv/bin/python benchmarks/worker_shape.py /tmp/old --json # another checkout (a worktree)

**(a) The path of one message** through a real worker. In a child process started in the
checkout (``PYTHONPATH`` is the checkout, ``DJANGO_SETTINGS_MODULE=tests.settings``: the table
engine on a fresh SQLite file), ``migrate`` runs, one ``tests.workerapp`` ``WorkItems`` message
is sent (payload ``{}``: its receiver ``work`` writes one ``WorkLog`` row in the ack
transaction), and ``call_command("runqueueworker", "workerapp.WorkItems", "--burst")`` runs with
``sys.setprofile`` and ``threading.setprofile`` set. Every Python call into a file under the
checkout's ``spanner_queues/`` is recorded per thread as a call tree (plus the receiver's own
frame, the marker). The path of the message is the union of two subtrees:

- the **intake**: the subtree of the function that called the outermost ``receive`` (a
  function of that name in ``spanner_queues/``, not inside another one) whose return value was
  non-empty, i.e. the step that received the message and handed it on;
- the **run**: the subtree of the outermost ancestor of the receiver's frame that was entered
  after that ``receive`` returned (loops entered before it, such as an executor thread's, are
  not part of it): the receiver, the ack in its transaction, the outcome and its accounting.

Calls on other threads (the renewer, the watchdog) and the worker's start and stop are not
counted. Reported: distinct files, distinct functions (file and qualified name), total calls
(every call, nested ones included; each resumption of a generator or a context manager counts
as a call, as the profiler reports it) and cross-file calls (a ``spanner_queues`` function
calling one in another file: the back and forth between modules).

**(b) Members of the Worker that other modules touch**: by AST, in every module of
``spanner_queues/`` but ``worker/__init__.py`` that imports the name ``Worker``, attribute
accesses ``worker.X``,
``self.worker.X`` and ``self._worker.X`` (read or written); the figure is the number of
distinct ``X`` (and of those, how many the modules of the ``worker/`` package touch); the
written ones are listed.

**(c) Functions over 60 lines**: by AST, every ``def`` (methods and nested functions included)
in ``spanner_queues/`` with ``end_lineno - lineno + 1 > 60`` (``lineno`` is the ``def`` line,
decorators excluded). The emulator front (``emulator/``) is listed beside, not counted.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LONG = 60
WORKER_NAMES = {"worker", "_worker"}


# --- (b) and (c): the AST figures ------------------------------------------------------------
def _modules(package: Path) -> Iterator[Path]:
    yield from sorted(p for p in package.rglob("*.py") if "migrations" not in p.parts)


def _worker_object(node: ast.expr) -> bool:
    """``worker``, ``self.worker`` or ``self._worker``."""
    if isinstance(node, ast.Name):
        return node.id == "worker"
    return (
        isinstance(node, ast.Attribute)
        and node.attr in WORKER_NAMES
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _imports_worker(tree: ast.Module) -> bool:
    """Whether the module imports the name ``Worker`` (at run time or for type checking): the
    modules whose ``worker`` is one (the drill's ``worker`` is a child process)."""
    return any(
        isinstance(node, ast.ImportFrom) and any(a.name == "Worker" for a in node.names)
        for node in ast.walk(tree)
    )


def worker_members(package: Path) -> dict[str, Any]:
    """The members of the ``Worker`` touched outside ``worker/__init__.py``: by name, the
    modules that touch it and whether any writes it."""
    touched: dict[str, set[str]] = {}
    written: set[str] = set()
    init = package / "worker" / "__init__.py"
    for path in _modules(package):
        if path == init:
            continue
        tree = ast.parse(path.read_text(), str(path))
        if not _imports_worker(tree):
            continue
        rel = str(path.relative_to(package.parent))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _worker_object(node.value):
                touched.setdefault(node.attr, set()).add(rel)
                if isinstance(node.ctx, ast.Store | ast.Del):
                    written.add(node.attr)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute):
                if _worker_object(node.target.value):
                    written.add(node.target.attr)
    inside = package.name + "/worker/"
    return {
        "count": len(touched),
        "by_worker_package": sum(
            1 for mods in touched.values() if any(m.startswith(inside) for m in mods)
        ),
        "members": {name: sorted(mods) for name, mods in sorted(touched.items())},
        "written": sorted(written),
    }


def long_functions(package: Path, base: Path) -> list[dict[str, Any]]:
    """Every function of more than ``LONG`` lines under ``package``, longest first."""
    found = []
    for path in _modules(package):
        tree = ast.parse(path.read_text(), str(path))
        found.extend(_long_in(tree, str(path.relative_to(base))))
    return sorted(found, key=lambda f: (-f["lines"], f["file"], f["function"]))


def _long_in(tree: ast.Module, rel: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                if lines > LONG:
                    found.append({"file": rel, "function": name, "lines": lines})
                visit(child, f"{name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


# --- (a): the path of one message -----------------------------------------------------------
@dataclass(eq=False)
class Node:
    """One call of a recorded function, on one thread."""

    file: str
    name: str
    start: int
    parent: Node | None
    end: int = -1
    returned: bool = False
    children: list[Node] = field(default_factory=list)

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            yield from child.walk()

    def ancestors(self) -> Iterator[Node]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent


def message_path(roots: list[Node], marker_file: str) -> dict[str, Any]:
    """The figures of (a) from the call trees of every thread (``roots``)."""
    nodes = [n for root in roots for n in root.walk()]
    received = [
        n
        for n in nodes
        if n.name.rsplit(".", 1)[-1] == "receive"
        and n.returned
        and n.file != marker_file
        and not any(a.name.rsplit(".", 1)[-1] == "receive" for a in n.ancestors())
    ]
    if not received:
        raise SystemExit("no receive call returned the message")
    receive = min(received, key=lambda n: n.start)
    intake = receive.parent if receive.parent is not None else receive
    markers = [n for n in nodes if n.file == marker_file]
    if not markers:
        raise SystemExit("the receiver never ran")
    marker = min(markers, key=lambda n: n.start)
    unit = marker
    for ancestor in marker.ancestors():
        if ancestor.start > receive.end:
            unit = ancestor
    counted = {id(n): n for top in (intake, unit) for n in top.walk() if n.file != marker_file}
    calls = list(counted.values())
    cross = sum(
        1 for n in calls if n.parent is not None and n.parent.file not in (n.file, marker_file)
    )
    files: dict[str, int] = {}
    for n in calls:
        files[n.file] = files.get(n.file, 0) + 1
    return {
        "files": len(files),
        "functions": len({(n.file, n.name) for n in calls}),
        "calls": len(calls),
        "cross_file_calls": cross,
        "intake": f"{intake.file}:{intake.name}",
        "run": f"{unit.file}:{unit.name}",
        "calls_by_file": dict(sorted(files.items(), key=lambda kv: (-kv[1], kv[0]))),
    }


def trace_child(checkout: Path) -> None:
    """Runs in the child: migrate, send one message, run the worker in burst under the
    profiler; prints the figures of (a) as JSON."""
    import threading

    import django

    django.setup()
    from django.core.management import call_command

    import spanner_queues

    package = Path(spanner_queues.__file__).resolve().parent
    if package != (checkout / "spanner_queues").resolve():
        raise SystemExit(f"imported {package}, not the checkout's")
    call_command("migrate", verbosity=0)
    from tests.workerapp.models import WorkItems, WorkLog

    WorkItems.send(id="shape", payload={})
    marker_file = str(Path(sys.modules["tests.workerapp.receivers"].__file__ or "").resolve())
    prefix = str(package) + os.sep
    roots: list[Node] = []
    stacks: dict[int, list[Node]] = {}
    seq = iter(range(1 << 62))
    rel: dict[str, str | None] = {}

    def relative(filename: str) -> str | None:
        if filename not in rel:
            path = str(Path(filename).resolve()) if filename.endswith(".py") else ""
            if path == marker_file:
                rel[filename] = marker_file
            elif path.startswith(prefix):
                rel[filename] = str(Path(path).relative_to(package.parent))
            else:
                rel[filename] = None
        return rel[filename]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        file = relative(frame.f_code.co_filename)
        if file is None:
            return
        stack = stacks.setdefault(threading.get_ident(), [])
        if event == "call":
            parent = stack[-1] if stack else None
            node = Node(file, frame.f_code.co_qualname, next(seq), parent)
            (parent.children if parent is not None else roots).append(node)
            stack.append(node)
        elif stack:
            node = stack.pop()
            node.end = next(seq)
            node.returned = isinstance(arg, list | tuple) and len(arg) > 0

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        call_command("runqueueworker", "workerapp.WorkItems", "--burst", verbosity=0)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    if WorkItems.objects.exists() or not WorkLog.objects.exists():
        raise SystemExit("the message was not processed")
    print(json.dumps(message_path(roots, marker_file)))


def measure_path(checkout: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sq-shape-") as tmp:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "SQ_DATABASE_NAME": str(Path(tmp) / "db.sqlite3"),
            "SQ_VAR_DIR": tmp,
            "PYTHONPATH": str(checkout),
        }
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(checkout)],
            env=env,
            cwd=checkout,
            capture_output=True,
            text=True,
            timeout=300,
        )
    if done.returncode:
        raise SystemExit(f"the traced worker failed:\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _commit(checkout: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", nargs="?", type=Path, default=ROOT)
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    if args.child:
        trace_child(checkout)
        return
    package = checkout / "spanner_queues"
    emulator = checkout / "emulator" / "spanner_queues_emulator"
    figures: dict[str, Any] = {
        "commit": _commit(checkout),
        "message_path": measure_path(checkout),
        "worker_members": worker_members(package),
        "long_functions": long_functions(package, checkout),
        "long_functions_emulator": (
            long_functions(emulator, checkout) if emulator.is_dir() else []
        ),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    path, members = figures["message_path"], figures["worker_members"]
    print(f"commit {figures['commit']} ({checkout})")
    print(f"{'figure':<52} {'value':>6}")
    rows = [
        ("(a) files one message crosses", path["files"]),
        ("(a) functions one message calls", path["functions"]),
        ("(a) calls one message makes", path["calls"]),
        ("(a) of which cross-file", path["cross_file_calls"]),
        ("(b) Worker members other modules touch", members["count"]),
        ("(b) of which touched in worker/", members["by_worker_package"]),
        ("(b) of which written", len(members["written"])),
        (f"(c) functions over {LONG} lines in spanner_queues/", len(figures["long_functions"])),
        ("    beside: in the emulator front", len(figures["long_functions_emulator"])),
    ]
    for label, value in rows:
        print(f"{label:<52} {value:>6}")
    print(f"\n(a) intake {path['intake']}; run {path['run']}; calls by file:")
    for file, n in path["calls_by_file"].items():
        print(f"    {n:>4}  {file}")
    print("\n(b) members (written: *):")
    for name, mods in members["members"].items():
        star = "*" if name in members["written"] else " "
        print(f"    {name}{star}  {', '.join(mods)}")
    print(f"\n(c) functions over {LONG} lines:")
    for f in [*figures["long_functions"], *figures["long_functions_emulator"]]:
        print(f"    {f['lines']:>4}  {f['file']}  {f['function']}")


if __name__ == "__main__":
    main()
