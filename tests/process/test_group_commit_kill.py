"""A worker SIGKILLed in the middle of a group (several messages' receivers ran in its open
transaction, not yet committed): nothing of the group committed, nothing is lost, and each
message's effect (a ``WorkLog`` row written in its receiver's transaction) commits once when
another worker runs them again after their leases."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest

from tests.children import TIMEOUT, Start
from tests.conftest import wait_until
from tests.workerapp.models import WorkItems, WorkLog

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def _started(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["key"][0] for line in path.read_text().splitlines() if line]


def test_sigkill_in_the_middle_of_a_group_loses_nothing_and_commits_each_effect_once(
    children: Start, tmp_path: Path
) -> None:
    go, trace = tmp_path / "go", tmp_path / "trace"
    sent = WorkItems.send_many(
        [{"id": f"m{i:02}", "payload": {"trace": str(trace)}} for i in range(12)]
    )
    blocker = WorkItems.send(id="zz", payload={"trace": str(trace), "block": str(go)})
    group = ("--group-size", "50", "--group-ms", "600000", "--concurrency", "1")
    first = children("workerapp.WorkItems", *group, "--prefetch", "50", "--lease", "2")
    # the blocker runs after others of its group: their effects are written, not committed
    wait_until(lambda: "zz" in _started(trace), timeout=TIMEOUT)
    ran_before = _started(trace).index("zz")
    committed_then = WorkLog.objects.count()
    first.kill()
    first.wait()
    go.touch()
    assert WorkLog.objects.count() == committed_then  # the open group committed nothing
    second = children("workerapp.WorkItems", *group, name="second")
    # (the killed worker's leases end first: then the second runs them again)
    wait_until(lambda: not WorkItems.objects.exists(), timeout=TIMEOUT, interval=0.2)
    second.proc.send_signal(signal.SIGTERM)
    assert second.wait() == 0, second.output()
    committed = Counter(WorkLog.objects.values_list("key", flat=True))
    assert sorted(committed) == sorted(m.key[0] for m in [*sent, blocker])  # nothing lost
    assert set(committed.values()) == {1}  # no effect committed twice
    assert not WorkItems.objects.exists()
    if ran_before == 0:
        pytest.skip("the blocker ran first: no receiver ran before it in its group")
    assert committed_then < ran_before  # they ran in its open group, uncommitted when killed
