"""Ending a call of the front with a gRPC status, shared by the front's call handlers."""

from __future__ import annotations

import contextvars
import random
import re
from collections.abc import Sequence
from typing import Any, NoReturn, cast

import grpc
from google.rpc.error_details_pb2 import RetryInfo  # type: ignore[import-untyped]

#: headers not forwarded to the emulator, nor back from it (gRPC sets its own).
SKIP_HEADERS = ("user-agent", "grpc-", ":")

#: the trailer in which Cloud Spanner tells a client how long to wait before it retries an
#: aborted transaction; it sends one with every ABORTED, Google's emulator never does
RETRY_INFO = "google.rpc.retryinfo-bin"
#: the delay (seconds, chosen at random in this range) the front puts in the ``RETRY_INFO``
#: of an ABORTED that has none. Without one the DB-API waits ``2**attempt`` seconds before
#: each replay of an aborted transaction (2, 4, 8, ...: a transaction aborted seven times in
#: a row waited over four minutes), where Spanner's delay keeps retries prompt.
ABORTED_RETRY_DELAY = (0.01, 0.05)
#: whether an ABORTED of the call being answered carries a ``RETRY_INFO`` (the front's
#: ``retry_info`` mode, ``answers``, set at the start of each call)
WITH_RETRY_INFO: contextvars.ContextVar[bool] = contextvars.ContextVar("retry_info", default=True)


class Aborted(Exception):
    """The call was ended with a status (``context.abort``); nothing more to do."""


def code(name: str) -> grpc.StatusCode:
    """The ``grpc.StatusCode`` named ``name`` (``"NOT_FOUND"``)."""
    return getattr(grpc.StatusCode, name)


def retry_info(seconds: float) -> bytes:
    """A serialized ``google.rpc.RetryInfo`` asking to wait ``seconds``."""
    info = RetryInfo()
    info.retry_delay.FromNanoseconds(int(seconds * 1e9))
    return info.SerializeToString()


def abort(
    context: Any,
    status: grpc.StatusCode,
    details: str,
    trailing: Sequence[tuple[str, str | bytes]] = (),
) -> NoReturn:
    """End the call with ``status`` and ``trailing`` metadata; always raises ``Aborted``. An
    ABORTED carries a ``RETRY_INFO``, as Spanner's do (``ABORTED_RETRY_DELAY``), unless the
    front's ``retry_info`` mode is ``never`` (``WITH_RETRY_INFO``): then none does."""
    pairs = [(k, v) for k, v in trailing if not k.startswith(SKIP_HEADERS)]
    if status == grpc.StatusCode.ABORTED and not WITH_RETRY_INFO.get():
        pairs = [(k, v) for k, v in pairs if k != RETRY_INFO]
    elif status == grpc.StatusCode.ABORTED and not any(k == RETRY_INFO for k, _ in pairs):
        pairs.append((RETRY_INFO, retry_info(random.uniform(*ABORTED_RETRY_DELAY))))
    try:
        if pairs:
            context.set_trailing_metadata(pairs)
        context.abort(status, details)
    except Exception:
        pass
    raise Aborted(details)


_MISSING_PARENT = re.compile(
    r"Insert failed because key was not found in parent table:\s*Parent Table:\s*(?P<parent>\S+)"
    r"\s+Child Table:\s*(?P<child>\S+)\s+Key:\s*\{(?P<key>.*)\}",
    re.S,
)
_KEY_PART = re.compile(r"""\w+\((?:"((?:[^"\\]|\\.)*)"|([^()]*))\)""")


def in_spanner_words(details: str) -> str:
    """The emulator's error text as Spanner words it, where they differ: a missing parent row
    is "Parent row for row [k1,k2] in table Child is missing. Row cannot be written." (the
    emulator names only the parent key; the front lists those values)."""
    m = _MISSING_PARENT.search(details)
    if m is None:
        return details
    values = [
        part.group(1) if part.group(1) is not None else part.group(2)
        for part in _KEY_PART.finditer(m.group("key"))
    ]
    return (
        f"Parent row for row [{','.join(values)}] in table {m.group('child')} is missing. "
        "Row cannot be written."
    )


def abort_with(context: Any, exc: grpc.RpcError) -> NoReturn:
    """End the call with the emulator's error ``exc`` (in Spanner's words,
    ``in_spanner_words``), its trailing metadata passed on."""
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    # each item is grpc's (key, value) namedtuple _Metadatum; its stub declares no tuple
    pairs = cast("tuple[tuple[str, str | bytes], ...]", trailing or ())
    abort(context, exc.code(), in_spanner_words(exc.details() or ""), pairs)
