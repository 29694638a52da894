"""A child process of the concurrency tests: claim messages until the queue is empty, print
each one's key, lease token and lease expiry. Uses the parent test's database and engine
(``child_env``).

    python -m spanner_queues.testing.conformance.claimer spanner_queues_conformance.Jobs 30 [go]

(the queue, then the lease in seconds; with ``go``: receive once, print ``{"ready": true}``,
and start claiming once a line arrives on stdin, so that claimers started at different speeds
race for the same messages)
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import django
from django.conf import settings

from spanner_queues.testing.conformance.plugin import DATABASE_ENV, ENGINE_ENV, make_default


def main() -> None:
    django.setup()
    from spanner_queues.api import receive  # the verbs import models: after django.setup()

    if os.environ.get(ENGINE_ENV):  # the engine under test, as in the parent
        make_default(os.environ[ENGINE_ENV])
    if os.environ.get(DATABASE_ENV):  # the parent test's database
        settings.DATABASES["default"]["NAME"] = os.environ[DATABASE_ENV]

    queue, lease = sys.argv[1], float(sys.argv[2])
    if sys.argv[3:] == ["go"]:
        receive(queue, max_messages=1, lease=timedelta(seconds=lease))  # (nothing is sent yet)
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()
    empty = 0
    while empty < 3:
        got = receive(queue, max_messages=3, lease=timedelta(seconds=lease))
        if not got:
            empty += 1
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
