"""Conformance: dead-lettering and replay move a message atomically, key and payload intact."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.test import override_settings

from spanner_queues.checks import _check_dead_letter
from spanner_queues.deadletter import dead_letter, replay
from spanner_queues.exceptions import QueueConfigurationError
from spanner_queues.options import QueueOptions
from spanner_queues.testing.conformance.models import Emails, EmailsDead, Jobs
from spanner_queues.testing.conformance.support import receive_due

pytestmark = pytest.mark.django_db(transaction=True)


def test_dead_letter_and_replay_round_trip() -> None:
    sent = Emails.send(payload={"to": "ada@example.com"})
    message = receive_due(Emails)[0]
    dead = dead_letter(message)
    assert dead.queue == "spanner_queues_conformance.EmailsDead" and dead.key == sent.key
    assert not Emails.objects.exists()
    assert EmailsDead.objects.get(pk=sent.key[0]).as_message().json() == {"to": "ada@example.com"}
    back = replay(dead)
    assert back.queue == "spanner_queues_conformance.Emails" and back.key == sent.key
    assert not EmailsDead.objects.exists()
    assert receive_due(Emails)[0].attempt == 1  # a fresh message


def test_dead_letter_needs_a_declared_queue() -> None:
    Jobs.send(payload="x")
    with pytest.raises(QueueConfigurationError, match="no dead_letter_queue"):
        dead_letter(receive_due(Jobs)[0])
    assert Jobs.objects.count() == 1


def test_checks_report_bad_dead_letter_settings() -> None:
    errors = _check_dead_letter(Jobs, QueueOptions(max_attempts=3))
    assert [e.id for e in errors] == ["spanner_queues.E008"]
    errors = _check_dead_letter(
        Jobs, QueueOptions(max_attempts=3, dead_letter_queue="spanner_queues_conformance.UserTasks")
    )
    assert "same key fields" in errors[0].msg
    assert (
        _check_dead_letter(Jobs, QueueOptions(max_attempts=3, discard_after_max_attempts=True))
        == []
    )
    with override_settings():
        call_command("check")  # the test app itself is valid
