"""``manage.py spannerprobe``: ask a Spanner instance the questions Google's documentation
leaves open and on which the native engine has a rule, on scratch queues the probe creates and
drops.

Each check (``CHECKS``) is a ``Finding``: the answer the instance gave, the engine's rule for
that question, and whether the rule holds under that answer (None: nothing to judge, the
figures are for the reader). The probe talks to Spanner with google-cloud-spanner itself (the
``Database`` behind the engine's alias), never through the engine, except ``calls_per_message``,
which runs the engine's verbs on the scratch queue and counts its ``RECEIVE`` calls.

Guarantees:

- It runs only on queues it creates: when a queue of the scratch name exists (with messages or
  without), it refuses before it writes anything (``ProbeRefused``).
- Whatever happens, it acks what it sent, drops the queues it created and deletes the sessions
  it opened (``Probe.run``'s ``finally``).
- Nothing is compared across the client's and the server's clocks: durations on the server
  are differences of its own timestamps (a lease's start is its expiry less the 10 s lease).
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, models
from django.test.utils import isolate_apps
from google.api_core import exceptions as gexc
from google.cloud.spanner_v1 import (
    ExecuteSqlRequest,
    TransactionOptions,
    TransactionSelector,
    param_types,
)
from google.cloud.spanner_v1.streamed import StreamedResultSet
from google.rpc.error_details_pb2 import RetryInfo  # type: ignore[import-untyped]

from spanner_queues import __version__, api, clock
from spanner_queues.drivers import driver_for, grpc_status
from spanner_queues.engines import BaseQueueEngine, spanner_sql
from spanner_queues.exceptions import QueueError
from spanner_queues.models import Queue

#: Spanner's lease (documented: 10 s from delivery or renewal)
LEASE = timedelta(seconds=10)
#: the float PARSE_JSON's exact mode refused (issue 37)
WIDE_FLOAT = 1796283044.567047
#: the trailer in which Spanner says how long to wait before retrying an aborted transaction
RETRY_INFO = "google.rpc.retryinfo-bin"
#: the checks, in the order they run
CHECKS = (
    "parse_json",
    "short_receive",
    "deliver_time",
    "backoff",
    "cancelled_stream",
    "retry_info",
    "sessions",
    "postgresql_names",
    "calls_per_message",
)
#: how close two server timestamps must be to be "the same moment"
SAME = timedelta(milliseconds=50)
#: how soon after a message falls due a waiting RECEIVE leases it, at most ("next_due")
NEAR = timedelta(seconds=1)


class ProbeRefused(QueueError):
    """The probe will not run here (a queue of the scratch name exists, not a native queue)."""


@dataclass
class Finding:
    """What the instance answered to one question, and whether the engine's rule holds."""

    check: str
    answer: str
    rule: str
    #: True: the engine's rule is right for this answer; False: it is not; None: no rule
    #: depends on it, or the probe could not tell
    holds: bool | None
    detail: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    engine: str
    database: str
    dialect: str
    server: str
    driver: str
    version: str
    started_at: str
    queue: str
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    def as_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)

    def lines(self) -> list[str]:
        out = [
            f"spannerprobe {self.version} on {self.server} ({self.dialect}), database "
            f"{self.database}, scratch queue {self.queue}, {self.seconds:.0f} s"
        ]
        for f in self.findings:
            verdict = {True: "holds", False: "DOES NOT HOLD", None: "n/a"}[f.holds]
            out.append(f"{f.check}: {f.answer} | engine rule {verdict}: {f.rule}")
            if f.detail:
                out.append(f"    {f.detail}")
        return out


@dataclass
class Row:
    """One RECEIVE row of the scratch queue."""

    key: int
    payload: Any
    deliver_time: datetime
    token: str
    expires: datetime

    @property
    def leased_at(self) -> datetime:
        """When Spanner leased it, on its own clock."""
        return self.expires - LEASE


class Probe:
    """One run of the probe on ``engine`` (a native engine), on scratch queues named
    ``queue`` (STRING payload) and ``queue + "_json"`` (JSON payload)."""

    def __init__(
        self,
        engine: BaseQueueEngine,
        queue: str | None = None,
        *,
        checks: tuple[str, ...] = CHECKS,
        log: Callable[[str], None] = lambda _: None,
    ) -> None:
        if not engine.features.supports_native_queues:
            raise ProbeRefused(
                f"engine {engine.alias!r} is not the native engine: the probe asks Spanner's "
                "queues (ENGINE: native)"
            )
        unknown = sorted(set(checks) - set(CHECKS))
        if unknown:
            raise ProbeRefused(f"unknown checks {unknown}; choose among {', '.join(CHECKS)}")
        self.engine = engine
        self.database = engine.spanner()  # type: ignore[attr-defined]
        self.dialect: str = engine.dialect.name  # type: ignore[attr-defined]
        self.pg = self.dialect == "postgresql"
        self.sql = spanner_sql(self.dialect)
        self.queue = queue or f"spannerprobe_{secrets.token_hex(3)}"
        self.json_queue = f"{self.queue}_json"
        self.checks = checks
        self.log = log
        self._created: list[str] = []
        self._sessions: list[Any] = []
        self._sent: dict[str, set[int]] = {self.queue: set(), self.json_queue: set()}
        self._next_key = 1
        #: the lifecycle of one message (``deliver_time`` and ``backoff`` share it)
        self._life: dict[str, Any] | None = None

    # --- names -----------------------------------------------------------------------------
    def _cols(self) -> tuple[str, str, str, str, str]:
        if self.pg:
            return (
                "id",
                "payload",
                "deliver_time",
                "spanner_lease_token",
                "spanner_lease_expiration_timestamp",
            )
        return (
            "Id",
            "Payload",
            "DeliverTime",
            "SpannerLeaseToken",
            "SpannerLeaseExpirationTimestamp",
        )

    def _create_ddl(self, name: str, payload: str) -> str:
        q = self.sql.quote(name)
        if self.pg:
            kind = {"string": "text", "json": "jsonb"}[payload]
            return (
                f"CREATE QUEUE {q} (id bigint NOT NULL, payload {kind} NOT NULL, PRIMARY KEY (id))"
            )
        kind = {"string": "STRING(MAX)", "json": "JSON"}[payload]
        return f"CREATE QUEUE {q} (Id INT64 NOT NULL, Payload {kind} NOT NULL) PRIMARY KEY (Id)"

    def receive_sql(self, batch: int, duration: str, queue: str | None = None) -> str:
        fn = self.sql.receive_function(queue or self.queue)
        cols = ", ".join(self._cols())
        if self.pg:
            args = f"max_batch_size => {batch}, priority => NULL, max_duration => '{duration}'"
        else:
            args = f"max_batch_size => {batch}, max_duration => '{duration}'"
        return f"SELECT {cols} FROM {fn}({args})"

    # --- the run ---------------------------------------------------------------------------
    def run(self) -> Report:
        started = time.monotonic()
        driver, server = driver_for(self.engine.database).versions()
        report = Report(
            engine=self.engine.alias,
            database=self.database.name,
            dialect=self.dialect,
            server=server,
            driver=driver,
            version=__version__,
            started_at=clock.now().isoformat(),
            queue=self.queue,
        )
        self._refuse_existing()
        try:
            self._create()
            for check in self.checks:
                self.log(f"{check}...")
                try:
                    report.findings.append(getattr(self, f"check_{check}")())
                except Exception as exc:  # one check failing says so and the rest go on
                    report.findings.append(
                        Finding(check, "error", "", None, f"{type(exc).__name__}: {exc}")
                    )
        finally:
            self._clean_up()
        report.seconds = time.monotonic() - started
        return report

    def _count(self, name: str) -> int | None:
        """Messages in queue ``name``, None when there is no such queue."""
        try:
            with self.database.snapshot() as snap:
                rows = list(snap.execute_sql(f"SELECT COUNT(*) FROM {self.sql.quote(name)}"))
        except (gexc.NotFound, gexc.InvalidArgument):
            return None
        return int(rows[0][0])

    def _refuse_existing(self) -> None:
        for name in (self.queue, self.json_queue):
            count = self._count(name)
            if count:
                raise ProbeRefused(
                    f"queue {name} holds data ({count} messages): the probe runs only on a "
                    "scratch queue it creates and drops; choose another --queue"
                )
            if count is not None:
                raise ProbeRefused(
                    f"queue {name} exists: the probe runs only on a scratch queue it creates "
                    "and drops; choose another --queue"
                )

    def _create(self) -> None:
        ddl = [self._create_ddl(self.queue, "string"), self._create_ddl(self.json_queue, "json")]
        self.database.update_ddl(ddl).result(300)
        self._created = [self.queue, self.json_queue]

    def _clean_up(self) -> None:
        for queue, keys in self._sent.items():
            if keys and queue in self._created:
                try:
                    with self.database.batch() as batch:
                        for key in keys:
                            batch.ack(queue=queue, key=(key,), ignore_not_found=True)
                except Exception as exc:  # the drop removes them anyway
                    self.log(f"acking what the probe sent to {queue} failed: {exc}")
        if self._created:
            drops = [f"DROP QUEUE {self.sql.quote(name)}" for name in self._created]
            self.database.update_ddl(drops).result(300)
            self._created = []
        for session in self._sessions:
            try:
                session.delete()
            except Exception:  # already gone
                pass

    # --- wire helpers ----------------------------------------------------------------------
    def _session(self) -> Any:
        session = self.database.session()
        session.create()
        self._sessions.append(session)
        return session

    def _keys(self, count: int) -> list[int]:
        keys = list(range(self._next_key, self._next_key + count))
        self._next_key += count
        return keys

    def send(self, count: int, *, queue: str | None = None, payload: Any = "p") -> list[int]:
        """Send ``count`` messages in one commit (``Send`` mutations); their keys."""
        name = queue or self.queue
        keys = self._keys(count)
        with self.database.batch() as batch:
            for key in keys:
                batch.send(queue=name, key=(key,), payload=payload)
        self._sent[name].update(keys)
        return keys

    def ack(self, keys: list[int], *, queue: str | None = None) -> None:
        if not keys:
            return
        name = queue or self.queue
        with self.database.batch() as batch:
            for key in keys:
                batch.ack(queue=name, key=(key,), ignore_not_found=True)
        self._sent[name].difference_update(keys)

    def open_receive(self, batch: int, duration: str, timeout: float) -> tuple[Iterator[Row], Any]:
        """A RECEIVE call on a strong single-use snapshot: its rows, and the call (``cancel``)."""
        request = ExecuteSqlRequest(
            session=self._session().name,
            sql=self.receive_sql(batch, duration),
            transaction=TransactionSelector(
                single_use=TransactionOptions(read_only=TransactionOptions.ReadOnly(strong=True))
            ),
        )
        call = self.database.spanner_api.execute_streaming_sql(
            request=request,
            metadata=[("google-cloud-resource-prefix", self.database.name)],
            timeout=timeout,
        )

        def rows() -> Iterator[Row]:
            for values in StreamedResultSet(call):
                yield Row(int(values[0]), values[1], values[2], values[3], values[4])

        return rows(), call

    def receive(self, batch: int, duration: str, *, until: int | None = None) -> list[Row]:
        """The rows of one RECEIVE call, read to its end (or cancelled once ``until`` rows
        came)."""
        seconds = _seconds(duration)
        rows, call = self.open_receive(batch, duration, seconds + 30)
        out: list[Row] = []
        try:
            for row in rows:
                out.append(row)
                if until is not None and len(out) >= until:
                    call.cancel()
                    break
        except gexc.Cancelled:
            pass
        return out

    def drain(self, keys: set[int], seconds: float) -> set[int]:
        """Receive and ack ``keys`` until all came or ``seconds`` passed; the ones that came."""
        deadline = time.monotonic() + seconds
        seen: set[int] = set()
        while seen != keys and time.monotonic() < deadline:
            left = max(1, int(deadline - time.monotonic()))
            rows = self.receive(100, f"{min(left, 20)}s", until=len(keys - seen))
            came = [r.key for r in rows if r.key in keys]
            self.ack(came)
            seen.update(came)
        return seen

    # --- the checks ------------------------------------------------------------------------
    def check_parse_json(self) -> Finding:
        text = json.dumps({"sent_at": WIDE_FLOAT})
        answers: dict[str, str] = {}
        p = "$1" if self.pg else "@t"
        name = "p1" if self.pg else "t"
        queries = (
            {"exact": f"SELECT CAST({p} AS jsonb)"}
            if self.pg
            else {
                "exact": f"SELECT PARSE_JSON({p})",
                "round": f"SELECT PARSE_JSON({p}, wide_number_mode=>'round')",
            }
        )
        for mode, sql in queries.items():
            try:
                with self.database.snapshot() as snap:
                    list(
                        snap.execute_sql(
                            sql, params={name: text}, param_types={name: param_types.STRING}
                        )
                    )
                answers[mode] = "accepted"
            except gexc.GoogleAPIError as exc:
                answers[mode] = f"refused ({grpc_status(exc) or type(exc).__name__})"
        try:
            [key] = self.send(1, queue=self.json_queue, payload=text)
            self.ack([key], queue=self.json_queue)
            answers["send"] = "accepted"
        except gexc.GoogleAPIError as exc:
            answers["send"] = f"refused ({grpc_status(exc) or type(exc).__name__})"
        inserted = "exact" if self.pg else "round"
        holds = answers[inserted] == "accepted" and answers["send"] == "accepted"
        return Finding(
            "parse_json",
            ", ".join(f"{k}: {v}" for k, v in answers.items()),
            "a JSON payload is inserted with "
            + ("CAST($n AS jsonb)" if self.pg else "PARSE_JSON(@p, wide_number_mode=>'round')")
            + " or sent in a Send mutation",
            holds,
            f"payload {text}",
            answers,
        )

    def check_short_receive(self) -> Finding:
        keys = set(self.send(3))
        try:
            rows = self.receive(3, "1ms")
            answer = "generous" if rows else "empty"
        except gexc.GoogleAPIError as exc:
            if grpc_status(exc) != "INVALID_ARGUMENT":
                raise
            rows, answer = [], "refuse"
        got = {r.key for r in rows}
        self.ack(sorted(got))
        rest = self.drain(keys - got, 60)
        return Finding(
            "short_receive",
            answer,
            "a 1 ms probe's refusal, or probes empty while rows are due, are learnt per "
            "database and stop its probes; probes that bring rows go on",
            True,
            f"a 1 ms RECEIVE under a backlog of 3 brought {len(got)}",
            {"brought": len(got), "drained_after": len(rest)},
        )

    def _lifecycle(self) -> dict[str, Any]:
        """One message leased three times, never acked until the end: its DeliverTime at each
        lease and the waits between a lease's end and the next lease (server clock)."""
        if self._life is not None:
            return self._life
        with self.database.batch() as batch:
            [key] = self._keys(1)
            batch.send(queue=self.queue, key=(key,), payload="life")
        self._sent[self.queue].add(key)
        sent_at = batch.committed
        leases: list[Row] = []
        deadline = time.monotonic() + 120
        while len(leases) < 3 and time.monotonic() < deadline:
            rows = [r for r in self.receive(1, "30s", until=1) if r.key == key]
            leases.extend(rows)
        self.ack([key])
        self._life = {"sent_at": sent_at, "leases": leases}
        return self._life

    def check_deliver_time(self) -> Finding:
        life = self._lifecycle()
        sent_at, leases = life["sent_at"], life["leases"]
        if not leases:
            return Finding("deliver_time", "no delivery", "", None, "the message never came")
        on_lease, answers = deliver_time_answers(sent_at, leases)
        redelivery = answers[0] if answers and len(set(answers)) == 1 else ", ".join(answers)
        return Finding(
            "deliver_time",
            f"on lease: {on_lease}; on redelivery: {redelivery or 'not seen'}",
            "a failure record belongs to the delivery that shows the sender's DeliverTime or the "
            "failed lease's expiry; a DeliverTime later than its lease's start trips the queue "
            "to the fail-closed rule (every record belongs to its key)",
            deliver_time_rule_holds(leases, answers) if answers else None,
            f"{len(leases)} deliveries of one message",
            {
                "sent_at": sent_at.isoformat(),
                "deliver_times": [r.deliver_time.isoformat() for r in leases],
                "lease_expiries": [r.expires.isoformat() for r in leases],
            },
        )

    def check_backoff(self) -> Finding:
        leases = self._lifecycle()["leases"]
        waits = [
            (after.leased_at - before.expires).total_seconds()
            for before, after in itertools.pairwise(leases)
        ]
        if not waits:
            return Finding("backoff", "not seen", "", None, "the message was not redelivered")
        return Finding(
            "backoff",
            ", ".join(f"{w:.2f} s" for w in waits) + " after the lease's end",
            "a stream settles only once the rows it dropped unread are gone from the queue "
            "(read by key), whatever the curve",
            True,
            "waits from a lease's end to the next delivery (the first, the second)",
            {"waits_seconds": waits},
        )

    def check_cancelled_stream(self) -> Finding:
        keys = set(self.send(20))
        first = self.receive(1, "20s", until=1)  # cancelled after its first row
        self.ack([r.key for r in first])
        after = self.receive(100, "2s")
        self.ack([r.key for r in after])
        left = keys - {r.key for r in first} - {r.key for r in after}
        back = self.drain(left, 60)
        return Finding(
            "cancelled_stream",
            f"{len(left)} of 20 stranded by a cancel after one row",
            "the engine cancels a call only at a batch's end with the demand met, asks a "
            "backlog in probes and settles without cancelling; stranded rows come back after "
            "their lease",
            back == left,
            f"{len(back)} of them came back within 60 s",
            {"stranded": len(left), "came_back": len(back)},
        )

    def check_retry_info(self) -> Finding:
        [key] = self.send(1)
        table = self.sql.quote(self.queue)
        where = f"{'id' if self.pg else 'Id'} = {key}"
        found: list[str] = []
        for _ in range(3):
            one, two = self._session(), self._session()
            a, b = one.transaction(), two.transaction()
            try:
                a.begin()
                b.begin()
                list(a.execute_sql(f"SELECT * FROM {table} WHERE {where}"))
                list(b.execute_sql(f"SELECT * FROM {table} WHERE {where}"))
                a.execute_update(f"DELETE FROM {table} WHERE {where}")
                b.execute_update(f"DELETE FROM {table} WHERE {where}")
                a.commit()
                b.commit()
            except gexc.Aborted as exc:
                found.append(_retry_delay(exc))
            finally:
                for txn in (a, b):
                    try:
                        txn.rollback()
                    except Exception:  # committed, or already rolled back
                        pass
            if found:
                break
        self.ack([key])
        if not found:
            return Finding(
                "retry_info", "no abort", "", None, "two transactions on one row did not collide"
            )
        answer = found[0]
        return Finding(
            "retry_info",
            answer,
            "an aborted transaction is replayed after the RetryInfo's delay, or after 0.1 s "
            "without one (not the DB-API's 2**attempt s)",
            True,
            "ABORTED of two read-write transactions deleting one message",
            {"aborted": found},
        )

    def _list_sessions(self) -> int | None:
        try:
            return len(list(self.database.spanner_api.list_sessions(database=self.database.name)))
        except gexc.GoogleAPIError:
            return None

    def check_sessions(self) -> Finding:
        before = self._list_sessions()
        outages = 0
        for _ in range(3):  # client-side outages: calls given up by the client at once
            try:
                with self.database.snapshot() as snap:
                    list(snap.execute_sql("SELECT 1", timeout=0.000001))
            except Exception:
                outages += 1
        after = self._list_sessions()
        if before is None or after is None:
            return Finding("sessions", "not listed", "", None, "ListSessions is not allowed")
        return Finding(
            "sessions",
            f"{before} before, {after} after {outages} client-side deadlines",
            "sessions are the client library's (multiplexed by default); the engine opens no "
            "session of its own per outage",
            None,
            "sessions the database lists (every client's)",
            {"before": before, "after": after, "outages": outages},
        )

    def check_postgresql_names(self) -> Finding:
        if not self.pg:
            return Finding(
                "postgresql_names",
                "not checked (a GoogleSQL database)",
                "",
                None,
                "run the probe on an alias whose database uses the PostgreSQL dialect",
            )
        keys = set(self.send(1))
        got = self.drain(keys, 30)
        return Finding(
            "postgresql_names",
            "accepted" if got == keys else "no row",
            "spanner.receive_<q>(max_batch_size =>, priority =>, max_duration =>) selecting "
            "payload, deliver_time, spanner_lease_token, spanner_lease_expiration_timestamp",
            got == keys,
        )

    def check_calls_per_message(self) -> Finding:
        if self.pg:
            return Finding(
                "calls_per_message", "not measured", "", None, "the engine's verbs need GoogleSQL"
            )
        count = 20
        with isolate_apps("spanner_queues.contrib.drill"):

            class Scratch(Queue):
                id = models.BigIntegerField(primary_key=True, db_column="Id")

                class Meta:
                    app_label = "spanner_queues_drill"
                    managed = False
                    db_table = self.queue

                class QueueMeta:
                    payload_type = "string"

            counter = _ReceiveCounter(self.database)
            if not counter.install():
                return Finding(
                    "calls_per_message", "not measured", "", None, "the client's stubs changed"
                )
            try:
                keys = self._keys(count)
                api.send_many(Scratch, [{"id": k, "payload": "m"} for k in keys])
                self._sent[self.queue].update(keys)
                got = 0
                deadline = time.monotonic() + 60
                while got < count and time.monotonic() < deadline:
                    for message in api.receive(Scratch, max_messages=1, wait=1):
                        api.ack_many(Scratch, [message])  # (isolated: not found by its label)
                        got += 1
                self._sent[self.queue].difference_update(keys)
            finally:
                self.engine.stop_receiving(Scratch, wait=5)
                counter.remove()
                connections[self.engine.database].close()
        return Finding(
            "calls_per_message",
            f"{counter.receive} RECEIVE calls ({counter.probes} probes) for {got} messages",
            "a worker taking one message at a time asks a backlog in probes of a whole batch",
            None,
            "api.receive(max_messages=1) and ack, 20 messages sent together",
            {"receive_calls": counter.receive, "probes": counter.probes, "messages": got},
        )


def deliver_time_rule_holds(leases: list[Row], answers: list[str]) -> bool:
    """Whether the failure ledger counts a message's failures under what ``leases`` showed:
    a ``DeliverTime`` later than its lease's start trips the fail-closed rule; otherwise each
    redelivery must show the sender's time or the failed lease's expiry (``failures.belongs``).
    A time moved to when the message was due again, shown before the lease, cannot be told
    from a send under the same key: the rule does not hold."""
    if any(r.deliver_time > r.leased_at for r in leases):
        return True
    return all(a in ("kept", "lease_expiry") for a in answers)


def deliver_time_answers(sent_at: datetime, leases: list[Row]) -> tuple[str, list[str]]:
    """What the ``DeliverTime`` of one message, sent (committed) at ``sent_at`` and leased as
    ``leases`` says: on its first lease (``kept``: the commit time; ``lease_expiry``; or moved),
    and at each redelivery (``kept``: as the lease before; ``lease_expiry``: that lease's or
    the new lease's expiry; ``next_due``: when it was due again, the new lease's start within
    ``NEAR``; or moved)."""
    first = leases[0].deliver_time
    if abs(first - sent_at) <= SAME:
        on_lease = "kept"
    elif abs(first - leases[0].expires) <= SAME:
        on_lease = "lease_expiry"
    else:
        on_lease = f"moved by {first - sent_at}"
    answers = []
    for before, after in itertools.pairwise(leases):
        moved = after.deliver_time
        if moved == before.deliver_time:
            answers.append("kept")
        elif min(abs(moved - before.expires), abs(moved - after.expires)) <= SAME:
            answers.append("lease_expiry")
        elif abs(moved - after.leased_at) <= NEAR:
            answers.append("next_due")
        else:
            answers.append(f"moved to {moved.isoformat()}")
    return on_lease, answers


class _ReceiveCounter:
    """Counts the ``RECEIVE`` calls made through one ``Database``'s transport while installed
    (wraps its streaming-query stub; False when the client library's stubs are not where this
    version keeps them)."""

    def __init__(self, database: Any) -> None:
        self.transport = database.spanner_api.transport
        self.receive = 0
        self.probes = 0
        self._stub: Any = None

    def install(self) -> bool:
        stubs = getattr(self.transport, "_stubs", None)
        if not isinstance(stubs, dict):
            return False
        self.transport.execute_streaming_sql  # noqa: B018 (creates the stub)
        stub = stubs.get("execute_streaming_sql")
        if stub is None:
            return False
        self._stub = stub

        def counted(request: Any, *args: Any, **kwargs: Any) -> Any:
            sql = getattr(request, "sql", "") or ""
            if "RECEIVE_" in sql.upper():
                self.receive += 1
                self.probes += "'1ms'" in sql
            return stub(request, *args, **kwargs)

        stubs["execute_streaming_sql"] = counted
        wrapped = getattr(self.transport, "_wrapped_methods", None)
        if isinstance(wrapped, dict) and stub in wrapped:  # the client's own calls find theirs
            wrapped[counted] = wrapped[stub]
        return True

    def remove(self) -> None:
        if self._stub is not None:
            counted = self.transport._stubs.get("execute_streaming_sql")
            self.transport._stubs["execute_streaming_sql"] = self._stub
            getattr(self.transport, "_wrapped_methods", {}).pop(counted, None)


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0}
    for unit in ("ms", "s", "m"):
        if duration.endswith(unit):
            return float(duration[: -len(unit)]) * units[unit]
    raise ValueError(duration)


def _retry_delay(exc: gexc.GoogleAPIError) -> str:
    """``"RetryInfo <delay> s"`` of an ABORTED, or ``"no RetryInfo"``."""
    calls = [getattr(exc, "response", None), *(getattr(exc, "errors", None) or ())]
    for call in calls:
        trailing = getattr(call, "trailing_metadata", None)
        if not callable(trailing):
            continue
        for key, value in trailing() or ():
            if key == RETRY_INFO:
                info = RetryInfo.FromString(value)
                return f"RetryInfo {info.retry_delay.ToTimedelta().total_seconds():.3f} s"
    return "no RetryInfo"
