"""Conformance: concurrent receivers (threads and processes) never hold one message at once."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connections, transaction

from spanner_queues import api
from spanner_queues.drivers import driver_for
from spanner_queues.engines import engine_for
from spanner_queues.semantics import LEASE as NATIVE_LEASE
from spanner_queues.testing.conformance.models import Jobs
from spanner_queues.testing.conformance.support import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
LEASE = timedelta(seconds=60)  # nothing may expire during the test: every claim is exclusive


#: the overall bound of a race, a failure only: each race ends once every message is claimed
RACE_BOUND = 300.0


def _drain(claims: list[tuple], keys: set[tuple], done: threading.Event, lock: Any) -> None:
    """Claim until every one of ``keys`` has been claimed by someone (``done``)."""
    try:
        while not done.is_set():
            got = api.receive(Jobs, max_messages=2, lease=LEASE)
            with lock:
                claims.extend(m.key for m in got)
                if keys <= set(claims):
                    done.set()
            if not got:
                done.wait(0.02)  # nothing due now: the others hold the rest, or it is claimed
    finally:
        connections.close_all()


def test_threads_never_share_a_message() -> None:
    """Three threads claim until every sent message has been claimed (not until a few empty
    receives: a row another's stream still held would never be claimed)."""
    sent = Jobs.send_many([{"payload": str(i)} for i in range(24)])
    claims: list[tuple] = []
    done, lock = threading.Event(), threading.Lock()
    errors: list[BaseException] = []

    def drain() -> None:
        try:
            _drain(claims, {m.key for m in sent}, done, lock)
        except BaseException as exc:
            errors.append(exc)
            done.set()

    threads = [threading.Thread(target=drain) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        assert done.wait(RACE_BOUND), f"claimed {len(set(claims))} of {len(sent)}"
    finally:
        done.set()
        for t in threads:
            t.join(120)
    assert not errors
    assert sorted(claims) == sorted(m.key for m in sent)


def _leases(claims: list[tuple[tuple, datetime]], length: timedelta) -> dict[tuple, list]:
    """Each key's leases as (start at the latest, end), in order: a lease ends at its expiry
    and began at least ``length`` before it (earlier if it was renewed)."""
    leases: dict[tuple, list] = {}
    for key, expires in claims:
        leases.setdefault(key, []).append((expires - length, expires))
    return {key: sorted(spans) for key, spans in leases.items()}


def test_processes_never_share_a_message(child_env: dict[str, str]) -> None:
    """Two processes and this one race for the same messages: no two of them ever hold a
    message at once. A message may be handed out again once its lease has ended (a native
    lease is 10 s whatever ``lease`` asks; a claimer slowed by a loaded machine can leave a
    row its stream held unread until its lease ends), so the test checks the leases, not
    the count: each key's later lease starts after the earlier one ended. The claimers are
    ready (their streams open) before anything is sent, and every racer claims until each
    sent message has been claimed by one of them (the claims read as the children print
    them), then the children are told to stop: the race waits on the claims it counts, never
    on a number of empty receives (under load a claimer gave up while a row its stream held
    was still leased, and the message was never claimed)."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spanner_queues.testing.conformance.claimer",
                "spanner_queues_conformance.Jobs",
                "60",
                "go",
            ],
            env=child_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    claims: list[tuple[tuple, datetime]] = []
    lock = threading.Lock()

    def read(proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            claim = json.loads(line)
            with lock:
                claims.append((tuple(claim["key"]), datetime.fromisoformat(claim["expires"])))

    try:
        for proc in procs:
            assert proc.stdout is not None
            assert json.loads(proc.stdout.readline() or "{}").get("ready"), proc.stderr
        sent = Jobs.send_many([{"payload": str(i)} for i in range(24)])
        keys = {m.key for m in sent}
        readers = [threading.Thread(target=read, args=(proc,)) for proc in procs]
        for reader in readers:
            reader.start()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()

        def all_claimed() -> bool:
            got = api.receive(Jobs, max_messages=2, lease=LEASE)
            held = [(m.key, m.lease_expires_at) for m in got if m.lease_expires_at is not None]
            assert len(held) == len(got), "a received message without its lease's end"
            with lock:
                claims.extend(held)
                return keys <= {key for key, _ in claims}

        wait_until(all_claimed, timeout=RACE_BOUND)
    finally:
        for proc in procs:
            assert proc.stdin is not None
            if proc.poll() is None:
                proc.stdin.write("stop\n")
                proc.stdin.flush()
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    for reader in readers:
        reader.join(60)
    length = LEASE if engine_for(Jobs).features.supports_custom_lease else NATIVE_LEASE
    leases = _leases(claims, length)
    assert sorted(leases) == sorted(keys)  # each message claimed
    for key, spans in leases.items():
        for (_, ended), (started, _) in itertools.pairwise(spans):
            assert started >= ended, f"{key} was leased twice at once: {spans}"


@pytest.mark.django_db(transaction=True)
def test_a_claim_skips_rows_another_transaction_has_locked() -> None:
    """Where the database has SELECT ... FOR UPDATE SKIP LOCKED (PostgreSQL), a claim passes
    over rows another transaction holds instead of waiting for them."""

    if not driver_for("default").claims_skip_locked:
        pytest.skip("the database has no FOR UPDATE SKIP LOCKED")
    Jobs.send(id="a", payload="")
    Jobs.send(id="b", payload="")
    locked, release = threading.Event(), threading.Event()

    def hold_a() -> None:
        try:
            with transaction.atomic():
                list(Jobs.objects.select_for_update().filter(id="a"))
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_a)
    holder.start()
    try:
        assert locked.wait(30)
        claimed = api.receive(Jobs, max_messages=2)
    finally:
        release.set()
        holder.join(60)
    assert [m.key for m in claimed] == [("b",)]
