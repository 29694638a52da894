"""``benchmarks/worker_shape.py`` (issue 30): its AST figures count what its docstring says on a
small fixture package, and the whole script runs on this checkout."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "worker_shape.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("worker_shape", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["worker_shape"] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def _body(lines: int) -> str:
    """A function of exactly ``lines`` lines (the def line included)."""
    return "\n".join(["def f():", *["    x = 1"] * (lines - 1)]) + "\n"


def test_worker_members_counts_attributes_of_worker_objects_in_modules_importing_worker(
    tmp_path: Path,
) -> None:
    package = tmp_path / "pkg"
    _write(
        package / "worker" / "__init__.py", "class Worker:\n    def go(self): self.worker.own = 1\n"
    )
    _write(
        package / "worker" / "part.py",
        """
        from pkg.worker import Worker
        class Part:
            def __init__(self, worker: Worker):
                self.worker = worker
                self._worker = worker
            def go(self):
                self.worker.cond.wait()
                self._worker.stuck += 1
                worker = self.worker
                worker.emit("x")
                worker.emit("y")
                self.other.ignored = 2
        """,
    )
    _write(
        package / "command.py",
        """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from pkg.worker import Worker
        def run(worker):
            worker.next_seed = 3
            return worker.plans
        """,
    )
    _write(package / "drill.py", "def f(worker):\n    return worker.pid\n")  # no Worker import
    members = _script().worker_members(package)
    assert members["members"] == {
        "cond": ["pkg/worker/part.py"],
        "emit": ["pkg/worker/part.py"],
        "next_seed": ["pkg/command.py"],
        "plans": ["pkg/command.py"],
        "stuck": ["pkg/worker/part.py"],
    }
    assert members["count"] == 5
    assert members["by_worker_package"] == 3
    assert members["written"] == ["next_seed", "stuck"]


def test_long_functions_counts_defs_over_60_lines_methods_and_nested_ones_included(
    tmp_path: Path,
) -> None:
    package = tmp_path / "pkg"
    _write(package / "exactly.py", _body(60))
    _write(package / "over.py", "@decorated\n" + _body(61))
    nested = "class C:\n" + textwrap.indent(
        "def outer():\n" + textwrap.indent(_body(62), "    ") + "    return f\n", "    "
    )
    _write(package / "nested.py", nested)
    _write(package / "migrations" / "0001.py", _body(100))  # migrations are not counted
    found = _script().long_functions(package, tmp_path)
    assert found == [
        {"file": "pkg/nested.py", "function": "C.outer", "lines": 64},
        {"file": "pkg/nested.py", "function": "C.outer.<locals>.f", "lines": 62},
        {"file": "pkg/over.py", "function": "f", "lines": 61},
    ]


def test_the_script_traces_one_message_through_a_burst_worker_on_this_checkout() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(ROOT), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    figures = json.loads(done.stdout)
    path = figures["message_path"]
    assert path["intake"].startswith("spanner_queues/worker/")
    assert path["run"].startswith("spanner_queues/worker/")
    assert "spanner_queues/engines/table.py" in path["calls_by_file"]  # the claim and the ack
    assert path["files"] == len(path["calls_by_file"])
    assert path["calls"] == sum(path["calls_by_file"].values())
    assert path["functions"] <= path["calls"]
    assert figures["worker_members"]["count"] >= figures["worker_members"]["by_worker_package"]
