"""The worker's shape, read from its source (AST, no Django): the members of the ``Worker`` that
the other modules of ``spanner_queues/worker/`` touch (attributes of ``worker``,
``self.worker``, ``self._worker``), and the functions of ``spanner_queues/worker/`` over 60
lines. ``benchmarks/worker_shape.py`` measures more (the files and calls one message crosses);
this is the part issue 30's worker step is judged by.

    .venv/bin/python benchmarks/worker_members.py [REPOSITORY_ROOT]
"""

from __future__ import annotations

import ast
import pathlib
import sys

LONG = 60


def measure(root: pathlib.Path) -> tuple[list[str], list[str]]:
    members: set[str] = set()
    long: list[str] = []
    for path in sorted((root / "spanner_queues" / "worker").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > LONG:
                    long.append(f"{path.name}:{node.name} ({lines})")
            if path.name != "__init__.py" and isinstance(node, ast.Attribute):
                value = node.value
                if (isinstance(value, ast.Name) and value.id == "worker") or (
                    isinstance(value, ast.Attribute)
                    and value.attr in ("worker", "_worker")
                    and isinstance(value.value, ast.Name)
                    and value.value.id == "self"
                ):
                    members.add(node.attr)
    return sorted(members), long


if __name__ == "__main__":
    members, long = measure(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "."))
    print(f"Worker members other worker modules touch: {len(members)} {members}")
    print(f"functions over {LONG} lines in spanner_queues/worker/: {len(long)} {long}")
