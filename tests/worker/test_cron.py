"""Cron schedules with time zones: ``@periodic(queue, cron=..., timezone=...)``.

Daylight-saving changes in Europe/Paris: clocks jump 02:00 CET -> 03:00 CEST on the last Sunday
of March and fall back 03:00 CEST -> 02:00 CET on the last Sunday of October.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from spanner_queues import clock
from spanner_queues.exceptions import InvalidArgument
from spanner_queues.patterns import Cron, periodic, schedules, seed_schedules
from spanner_queues.receivers import ReceiverRegistry
from spanner_queues.testing import clock_is_movable, drain, moved_clock, sent
from tests.workerapp.models import Ticks

PARIS = ZoneInfo("Europe/Paris")
UTC = timezone.utc


def paris(*args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=PARIS, fold=fold)


def runs(cron: Cron, after: datetime, count: int) -> list[datetime]:
    out = []
    for _ in range(count):
        after = cron.next_after(after)
        out.append(after)
    return out


@pytest.mark.engine_independent
def test_a_daily_time_is_read_in_its_zone_winter_and_summer() -> None:
    cron = Cron("0 3 * * *", "Europe/Paris")
    assert cron.next_after(datetime(2027, 1, 10, tzinfo=UTC)) == datetime(
        2027, 1, 10, 2, 0, tzinfo=UTC
    )
    assert cron.next_after(datetime(2027, 7, 10, tzinfo=UTC)) == datetime(
        2027, 7, 10, 1, 0, tzinfo=UTC
    )


@pytest.mark.engine_independent
def test_a_skipped_wall_time_runs_once_when_the_clock_jumps() -> None:
    cron = Cron("30 2 * * *", "Europe/Paris")
    got = runs(cron, paris(2027, 3, 27, 12, 0), 2)
    # 2027-03-28 02:30 does not exist: it runs at the jump (03:00 CEST = 01:00 UTC), once
    assert got == [paris(2027, 3, 28, 3, 0), paris(2027, 3, 29, 2, 30)]
    assert got[0].astimezone(UTC) == datetime(2027, 3, 28, 1, 0, tzinfo=UTC)


@pytest.mark.engine_independent
def test_every_skipped_time_of_one_gap_folds_into_one_run() -> None:
    cron = Cron("*/30 * * * *", "Europe/Paris")
    got = [t.astimezone(UTC) for t in runs(cron, paris(2027, 3, 28, 1, 0), 4)]
    assert got == [
        datetime(2027, 3, 28, 0, 30, tzinfo=UTC),  # 01:30 CET
        datetime(2027, 3, 28, 1, 0, tzinfo=UTC),  # 02:00 and 02:30 skipped; 03:00 CEST
        datetime(2027, 3, 28, 1, 30, tzinfo=UTC),  # 03:30 CEST
        datetime(2027, 3, 28, 2, 0, tzinfo=UTC),
    ]


@pytest.mark.engine_independent
def test_a_repeated_wall_time_runs_once_at_its_first_occurrence() -> None:
    cron = Cron("30 2 * * *", "Europe/Paris")
    got = runs(cron, paris(2027, 10, 30, 12, 0), 2)
    assert [t.astimezone(UTC) for t in got] == [
        datetime(2027, 10, 31, 0, 30, tzinfo=UTC),  # 02:30 CEST, the first 02:30
        datetime(2027, 11, 1, 1, 30, tzinfo=UTC),  # the next day; not 02:30 CET on the 31st
    ]
    # asked from inside the repeated hour (after the first 02:30), it waits for the next day
    second_pass = paris(2027, 10, 31, 2, 10, fold=1)
    assert cron.next_after(second_pass) == got[1]


@pytest.mark.engine_independent
def test_cron_and_zone_are_checked_when_declared() -> None:
    registry = ReceiverRegistry()
    with pytest.raises(InvalidArgument, match="not a valid cron expression"):
        periodic(Ticks, cron="61 * * * *", key={"name": "x"}, registry=registry)
    with pytest.raises(InvalidArgument, match="five fields"):
        periodic(Ticks, cron="0 0 3 * * *", key={"name": "x"}, registry=registry)
    with pytest.raises(InvalidArgument, match="not a known time zone"):
        periodic(Ticks, cron="0 3 * * *", timezone="Mars/Olympus", key={"name": "x"})
    with pytest.raises(InvalidArgument, match="exactly one of every= or cron="):
        periodic(Ticks, cron="0 3 * * *", every=timedelta(hours=1), key={"name": "x"})
    with pytest.raises(InvalidArgument, match="exactly one of every= or cron="):
        periodic(Ticks, key={"name": "x"})
    with pytest.raises(InvalidArgument, match="timezone= goes with cron="):
        periodic(Ticks, every=timedelta(hours=1), timezone="Europe/Paris", key={"name": "x"})
    assert schedules(registry) == []


@pytest.mark.engine_independent
def test_a_cron_expression_that_never_matches_is_refused_when_declared() -> None:
    # Valid to croniter but with no date (30 February): accepted before, then every seed of
    # the worker raised CroniterBadDateError (no QueueError) and the schedule never ran.
    registry = ReceiverRegistry()
    with pytest.raises(InvalidArgument, match="never runs"):
        periodic(Ticks, cron="0 0 30 2 *", key={"name": "x"}, registry=registry)
    assert schedules(registry) == []
    assert Cron("0 0 29 2 *", "UTC").next_after(datetime(2027, 1, 1, tzinfo=UTC)) == datetime(
        2028, 2, 29, tzinfo=UTC
    )


@pytest.mark.django_db
def test_a_cron_schedule_runs_across_both_daylight_saving_changes() -> None:
    """Seeded at its next cron time, each run sends the next one, in the zone's wall time."""
    if not clock_is_movable(Ticks):
        pytest.skip("native queues take time from Spanner: the clock cannot be moved")
    registry = ReceiverRegistry()
    ran: list[datetime] = []

    @periodic(
        Ticks, cron="30 2 * * *", timezone="Europe/Paris", key={"name": "paris"}, registry=registry
    )
    def nightly(message: object) -> None:
        ran.append(clock.now())

    def queued() -> datetime:
        [message] = [m for m in sent(Ticks) if m.key == ("paris",)]
        assert message.deliver_time is not None
        return message.deliver_time

    with moved_clock(Ticks) as moved:
        moved.advance(paris(2027, 3, 27, 12, 0) - clock.now())
        [seeded] = seed_schedules(["workerapp.Ticks"], registry=registry)
        assert seeded.deliver_time == paris(2027, 3, 28, 3, 0)  # 02:30 skipped: at the jump
        assert seed_schedules(["workerapp.Ticks"], registry=registry) == []  # seeded once
        assert drain(Ticks, registry=registry) == []  # not due yet

        moved.advance(queued() - clock.now())
        assert len(drain(Ticks, registry=registry).acked) == 1
        assert queued() == paris(2027, 3, 29, 2, 30)  # summer time from now on

        moved.advance(paris(2027, 10, 31, 2, 30) - clock.now())  # the first 02:30
        assert queued() < clock.now()  # months of missed runs: one run, no catch-up burst
        assert len(drain(Ticks, registry=registry).acked) == 1
        assert queued() == paris(2027, 11, 1, 2, 30)  # not the repeated 02:30 an hour later
    assert len(ran) == 2


@pytest.mark.engine_independent
def test_a_schedule_that_fires_several_times_in_the_repeated_hour_runs_both_passes() -> None:
    # (the fall-back rule once dropped the second pass: 02:00 to 03:00 CET had no run at all)
    cron = Cron("*/15 * * * *", "Europe/Paris")
    got = runs(cron, paris(2027, 10, 31, 1, 50), 11)
    assert [t.astimezone(UTC).strftime("%H:%M") for t in got] == [
        "00:00", "00:15", "00:30", "00:45",  # 02:00-02:45 CEST
        "01:00", "01:15", "01:30", "01:45",  # 02:00-02:45 CET, the second pass
        "02:00", "02:15", "02:30",  # 03:00 CET on
    ]  # fmt: skip
    utc = [t.astimezone(UTC) for t in got]
    assert all(b - a == timedelta(minutes=15) for a, b in itertools.pairwise(utc))


@pytest.mark.engine_independent
def test_a_random_field_is_drawn_once_per_schedule() -> None:
    # (croniter drew R again on every run: a "daily" job ran three times in a day)
    daily = Cron("R R * * *", "Europe/Paris", seed="nightly")
    day = runs(daily, paris(2027, 6, 1, 0, 0), 5)
    assert all(b - a == timedelta(days=1) for a, b in itertools.pairwise(day))
    again = Cron("R R * * *", "Europe/Paris", seed="nightly")
    assert again.next_after(paris(2027, 6, 1, 0, 0)) == day[0]  # every worker, every restart
    ranged = Cron("R(0-4) 3 * * *", "Europe/Paris", seed="x")
    first = ranged.next_after(paris(2027, 6, 1, 0, 0))
    assert first.hour == 3 and first.minute <= 4
    assert ranged.next_after(first) == first + timedelta(days=1)
