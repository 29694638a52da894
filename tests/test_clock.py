"""``spanner_queues.clock``: the one place the package reads the current time.

The runtime code reads ``clock.now()``; a clock installed by a test (``moved_clock``) is read by
every thread of the process, by modules however they imported it and whenever they loaded."""

from __future__ import annotations

import ast
import threading
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from pathlib import Path

import pytest
from django.utils import timezone

import spanner_queues
from spanner_queues import clock

pytestmark = pytest.mark.engine_independent

UTC = dt_timezone.utc
ROOT = Path(spanner_queues.__file__).resolve().parent

# Modules that may read Django's clock directly, and why.
DIRECT_READERS = {
    "clock.py": "the seam itself",
    "testing/kit.py": "MovableClock adds its offset to the real time",
    "models.py": "field defaults: migrations serialise django.utils.timezone.now",
}


def test_now_is_djangos_aware_utc_time_when_no_clock_is_installed() -> None:
    assert clock.installed() is None
    before = timezone.now()
    now = clock.now()
    assert before <= now <= timezone.now()
    assert now.utcoffset() == timedelta(0)


def test_a_patch_of_djangos_now_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    fixed = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    monkeypatch.setattr(timezone, "now", lambda: fixed)
    assert clock.now() == fixed


def test_an_installed_clock_is_read_by_threads_started_before_it() -> None:
    fixed = datetime(2031, 5, 6, tzinfo=UTC)
    installed, read = threading.Event(), []

    def reader() -> None:
        installed.wait(30)
        read.append(clock.now())

    thread = threading.Thread(target=reader)
    thread.start()  # before the install
    source = lambda: fixed  # noqa: E731
    clock.install(source)
    try:
        installed.set()
        thread.join(30)
    finally:
        clock.uninstall(source)
    assert read == [fixed]
    assert clock.installed() is None and clock.now() != fixed


def test_installs_nest_and_uninstall_in_any_order() -> None:
    first, second = datetime(2032, 1, 1, tzinfo=UTC), datetime(2033, 1, 1, tzinfo=UTC)
    one, two = (lambda: first), (lambda: second)
    clock.install(one)
    clock.install(two)
    try:
        assert clock.now() == second
        clock.uninstall(one)  # not the latest: the latest stays
        assert clock.now() == second
    finally:
        clock.uninstall(two)
    assert clock.installed() is None
    with pytest.raises(ValueError, match="not an installed clock"):
        clock.uninstall(two)
    with pytest.raises(TypeError):
        clock.install(first)  # type: ignore[arg-type]


def _reads_of_djangos_clock(path: Path) -> list[str]:
    """``timezone.now`` (of ``django.utils``), ``now`` imported from ``django.utils.timezone``,
    ``timezone.localtime()`` without a value, ``datetime.now``/``utcnow`` in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "django.utils.timezone":
            found += [f"import of {a.name}" for a in node.names if a.name in ("now", "localtime")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in {
                ("timezone", "now"),
                ("datetime", "now"),
                ("datetime", "utcnow"),
            }:
                found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "localtime"
            and not node.args
        ):
            found.append(f"line {node.lineno}: localtime() of now")
    return found


def test_the_runtime_reads_the_time_only_through_the_clock() -> None:
    """A module reading Django's clock itself would not follow ``moved_clock``. ``emulator/``
    is left out: it plays Spanner's server, whose clock no test moves; so are the conformance
    suite's test modules (``testing/conformance/test_*.py``): tests, reading the wall clock as
    those in ``tests/`` do."""
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative in DIRECT_READERS or relative.startswith(
            ("emulator/", "migrations/", "testing/conformance/test_")
        ):
            continue
        offenders += [f"{relative} {read}" for read in _reads_of_djangos_clock(path)]
    assert not offenders, "read spanner_queues.clock.now() instead:\n" + "\n".join(offenders)


def test_the_guard_finds_a_direct_read(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from django.utils import timezone\nfrom django.utils.timezone import now\n"
        "def f():\n    return timezone.now(), timezone.localtime()\n"
    )
    assert len(_reads_of_djangos_clock(module)) == 3
