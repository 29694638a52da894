"""A child process of the concurrency tests: claim messages until the queue is empty, print
each one's key, lease token and lease expiry. Uses the parent test's database and engine
(``child_env``).

    python -m spanner_queues.testing.conformance.claimer spanner_queues_conformance.Jobs 30 [go]

(the queue, then the lease in seconds; without ``go``: claim until three receives in a row
come back empty. With ``go``: receive once, print ``{"ready": true}``, start claiming once a
line arrives on stdin, so that claimers started at different speeds race for the same
messages, and claim until the next line (or the end of stdin): the parent says when every
message has been claimed, so that a row held by a slow claimer's stream, handed out again
after its lease, still finds a claimer)
"""

from __future__ import annotations

import json
import os
import sys
import threading
from datetime import timedelta

import django
from django.conf import settings

from spanner_queues.testing.conformance.plugin import DATABASE_ENV, ENGINE_ENV, make_default


def _stop_on_a_line(stop: threading.Event) -> None:
    """The parent's next line (or the end of its pipe) stops the claims."""
    sys.stdin.readline()
    stop.set()


def main() -> None:
    django.setup()
    from spanner_queues.api import receive  # the verbs import models: after django.setup()

    if os.environ.get(ENGINE_ENV):  # the engine under test, as in the parent
        make_default(os.environ[ENGINE_ENV])
    if os.environ.get(DATABASE_ENV):  # the parent test's database
        settings.DATABASES["default"]["NAME"] = os.environ[DATABASE_ENV]

    queue, lease = sys.argv[1], float(sys.argv[2])
    stop, racing = threading.Event(), sys.argv[3:] == ["go"]
    if racing:
        receive(queue, max_messages=1, lease=timedelta(seconds=lease))  # (nothing is sent yet)
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()
        threading.Thread(target=_stop_on_a_line, args=(stop,), daemon=True).start()
    empty = 0
    while (not stop.is_set()) if racing else empty < 3:
        got = receive(queue, max_messages=3, lease=timedelta(seconds=lease))
        if not got:
            empty += 1
            stop.wait(0.02)  # nothing due now; (with go) until the parent says all are claimed
            continue
        empty = 0
        for message in got:
            expires = message.lease_expires_at
            print(
                json.dumps(
                    {
                        "key": list(message.key),
                        "token": message.lease_token,
                        "expires": expires.isoformat() if expires else None,
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
