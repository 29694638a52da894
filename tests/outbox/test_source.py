"""The package never defers a write past commit: no ``on_commit`` anywhere in its source, but
in ``signals.py``, whose commit hook sends the verbs' signals, and the package's only receivers
of those (the metrics app's counters) increment an in-memory counter and write nothing; and in
``receivers.py``, whose hook marks a receiver's own ack committed in its run's memory (so a time
limit that lands after it does not count the run failed) and writes nothing; in
``transactions.py``, whose savepoint keeps Django's bookkeeping of the callbacks others
registered (it registers none); and in the conformance suite's ordered-delivery test, which
records committed runs in memory."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import spanner_queues

PACKAGE = Path(spanner_queues.__file__).resolve().parent
#: signals sends and acks when their transaction commits (counted, never written); receivers
#: marks a receiver's own ack committed (a set in memory, never written)
COUNTERS_ONLY = {
    "signals.py",
    "receivers.py",
    # the grouped receivers' savepoint: a released one's name is taken off the callbacks
    # registered inside it (``run_on_commit``, Django's list); it registers none
    "transactions.py",
    # the conformance suite's ordered delivery through a worker: a receiver's run is recorded
    # once it committed, in a list in memory the test reads (Spanner replays an aborted
    # transaction's receivers: a record made in the run would count a run that rolled back)
    "testing/conformance/test_ordered_delivery_through_the_worker.py",
}


def test_package_source_never_calls_on_commit() -> None:
    offenders = []
    sources = sorted(PACKAGE.rglob("*.py"))
    assert (PACKAGE / "outbox" / "registration.py") in sources
    for path in sources:
        if str(path.relative_to(PACKAGE)) in COUNTERS_ONLY:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            name = None
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.Name):
                name = node.id
            elif isinstance(node, ast.alias):
                name = node.name.rsplit(".", 1)[-1]
            if name in {"on_commit", "run_on_commit"}:
                offenders.append(f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', '?')}")
    assert offenders == []


@pytest.mark.parametrize("path", sorted((PACKAGE / "outbox").glob("*.py")), ids=lambda p: p.name)
def test_outbox_uses_no_thread_or_second_connection(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"threading", "concurrent.futures", "asyncio", "multiprocessing"}
    calls = {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    assert not calls & {"create_connection", "connect_db", "get_new_connection"}


def test_the_commit_hook_sends_the_signals_and_the_package_only_counts_them() -> None:
    tree = ast.parse((PACKAGE / "signals.py").read_text())
    hooks = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "on_commit"
    ]
    assert len(hooks) == 1
    [callback] = hooks[0].args
    assert ast.unparse(callback) == (
        "lambda: signal.send_robust(sender=model, messages=messages, using=using)"
    )
    receivers = {}  # (module, function) connected to messages_sent / messages_acked
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "connect"
                and ast.unparse(node.func.value) in {"messages_sent", "messages_acked"}
            ):
                name = ast.unparse(node.args[0])
                receivers[(str(path.relative_to(PACKAGE)), name)] = functions[name]
    assert set(receivers) == {
        ("contrib/metrics/exporter.py", "_count_sent"),
        ("contrib/metrics/exporter.py", "_count_acked"),
    }
    counting = {"_get", "labels", "inc", "len", "sum", "isinstance"}
    for function in receivers.values():
        called = {
            node.func.attr if isinstance(node.func, ast.Attribute) else ast.unparse(node.func)
            for node in ast.walk(function)
            if isinstance(node, ast.Call)
        }
        assert called <= counting, (function.name, called - counting)
