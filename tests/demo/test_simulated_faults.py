"""The demo's faults are simulated on purpose (a worker that stops beating, a carrier answering
429): the log, the alert email and the admin say so, so that they are not taken for real faults
(issue 23)."""

from __future__ import annotations

import json
import random

import pytest
from django.contrib.admin.sites import site
from django.core import mail

from demo_project.ops.models import WorkerAlert, WorkerHeartbeats
from demo_project.ops.receivers import worker_timed_out
from demo_project.shop.carrier import Carrier, RateLimited
from demo_project.traffic.generator import TrafficGenerator

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_carriers_429_says_it_is_simulated() -> None:
    carrier = Carrier(max_calls=0, retry_after=10)
    with pytest.raises(RateLimited) as caught:
        carrier.book(idempotency_key="x")
    assert str(caught.value).startswith("simulated 429 Too Many Requests")
    assert "Retry-After: 10" in str(caught.value)


def test_the_crashed_worker_and_its_alert_say_they_are_simulated() -> None:
    generator = TrafficGenerator(rate=1, write=lambda _line: None)
    generator.rng = random.Random(1)
    generator.waves = 1  # the next wave is an even one: it starts a worker that dies
    generator.start_wave()
    beat = WorkerHeartbeats.objects.get()
    assert beat.worker_id.startswith("simulated-crash-")
    assert "simulated" in json.loads(bytes(beat.payload))
    worker_timed_out(beat.as_message())  # what the worker runs once the beat is due
    [email] = mail.outbox
    assert email.subject.startswith("Worker simulated-crash-")
    assert "the demo's traffic generator" in email.body  # the last beat, quoted
    alert = WorkerAlert.objects.get()
    assert alert.simulated and str(alert).endswith("(simulated)")
    assert "simulated" in site._registry[WorkerAlert].list_display
