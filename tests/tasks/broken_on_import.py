"""A task module that raises on import (not an ``ImportError``): a release whose module's
import-time code fails, e.g. a setting it reads is missing."""

from __future__ import annotations

raise RuntimeError("the module of this task cannot be imported: MISSING_SETTING")
