"""The drill's kill points (``Drill._drive``): each of ``--kills`` falls at a share of the batch
handled, and every one is carried out, even when the drain passes the last ones between two
looks (an inbox takes in a pull's events in one transaction: the effect rows jump from below a
point to all of them, and the Pub/Sub drill of CI once reported 3 of 4 kills)."""

from __future__ import annotations

from pathlib import Path

from spanner_queues.contrib.drill.runner import Drill, DrillOptions


class Scripted(Drill):
    """A drill whose looks at the database are a script: ``handled`` at each look, and the
    drained check that follows it, read a moment later, sees the whole batch done."""

    def __init__(self, options: DrillOptions, handled: list[int], tmp: Path) -> None:
        super().__init__(options, tmp)
        self.script = handled
        self.kills_at: list[int] = []

    def _sample(self) -> None:
        return None

    def _handled_rows(self) -> int:
        self.now = self.script.pop(0) if self.script else self.options.messages
        return self.now

    def _reap(self, handled: int) -> bool:
        return True

    def _kill(self) -> None:
        self.kills_at.append(self.now)
        self.result.kills += 1

    def _drained(self, stats: object) -> bool:
        return True  # the batch was taken in at once, after ``handled`` was read


def test_kill_points_passed_by_a_batch_taken_in_at_once_are_each_carried_out(
    tmp_path: Path,
) -> None:
    options = DrillOptions(messages=40, kills=4, seed=11, sample_interval=0.0)
    drill = Scripted(options, handled=[0], tmp=tmp_path)
    drill._drive()
    assert drill.result.kills == 4
    assert drill.result.drained
