"""A child process for concurrency tests: claim messages until the queue is empty, print keys.

python -m tests.claimer testapp.Jobs 30     # lease seconds
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta


def main() -> None:
    import django

    django.setup()
    from spanner_queues.api import receive

    queue, lease = sys.argv[1], float(sys.argv[2])
    empty = 0
    while empty < 3:
        got = receive(queue, max_messages=3, lease=timedelta(seconds=lease))
        if not got:
            empty += 1
            continue
        empty = 0
        for message in got:
            print(json.dumps({"key": list(message.key), "token": message.lease_token}), flush=True)


if __name__ == "__main__":
    main()
