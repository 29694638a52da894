"""Settings of ``benchmarks/soak.py``: the test settings of the engine in ``$SQ_SOAK_ENGINE``
(``native``: native queues on the emulator behind the queue-aware front; ``sqlite``;
``postgres``) plus the soak app. Worker children get the database in ``$SQ_DATABASE_NAME``."""

from __future__ import annotations

import os

_ENGINE = os.environ.get("SQ_SOAK_ENGINE", "native")
if _ENGINE == "native":
    from tests.settings_spanner_native import *  # noqa: F403
    from tests.settings_spanner_native import INSTALLED_APPS
elif _ENGINE == "postgres":
    from tests.settings_postgres import *  # noqa: F403
    from tests.settings_postgres import INSTALLED_APPS
elif _ENGINE == "sqlite":
    from tests.settings import *  # noqa: F403
    from tests.settings import INSTALLED_APPS
else:
    raise RuntimeError(f"SQ_SOAK_ENGINE: native, sqlite or postgres, not {_ENGINE!r}")

INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks.soakapp"]
if _ENGINE == "native":  # the engine's defaults, not the tests' short RECEIVE calls
    SPANNER_QUEUES = {"default": {"ENGINE": "native", "DATABASE": "default"}}
