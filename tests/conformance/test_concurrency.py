"""Conformance: concurrent receivers (threads and processes) never hold one message at once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
from django.db import connections

from spanner_queues import api
from tests.testapp.models import Jobs

pytestmark = pytest.mark.django_db(transaction=True)
LEASE = timedelta(seconds=60)  # nothing may expire during the test: every claim is exclusive


def _drain(claims: list[tuple], errors: list[BaseException]) -> None:
    try:
        empty = 0
        while empty < 3:
            got = api.receive(Jobs, max_messages=2, lease=LEASE)
            empty = 0 if got else empty + 1
            claims.extend(m.key for m in got)
    except BaseException as exc:
        errors.append(exc)
    finally:
        connections.close_all()


def test_threads_never_share_a_message() -> None:
    sent = Jobs.send_many([{"payload": str(i)} for i in range(24)])
    claims: list[tuple] = []
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_drain, args=(claims, errors)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert sorted(claims) == sorted(m.key for m in sent)


def test_processes_never_share_a_message(child_env: dict[str, str]) -> None:
    sent = Jobs.send_many([{"payload": str(i)} for i in range(24)])
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.claimer", "testapp.Jobs", "60"],
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    local: list[tuple] = []
    _drain(local, [])
    claims = list(local)
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        claims.extend(tuple(json.loads(line)["key"]) for line in out.splitlines())
    assert sorted(claims) == sorted(m.key for m in sent)
