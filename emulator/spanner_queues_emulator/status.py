"""Ending a call of the front with a gRPC status, shared by the front's call handlers."""

from __future__ import annotations

import re
from typing import Any, NoReturn, cast

import grpc

#: headers not forwarded to the emulator, nor back from it (gRPC sets its own).
SKIP_HEADERS = ("user-agent", "grpc-", ":")


class Aborted(Exception):
    """The call was ended with a status (``context.abort``); nothing more to do."""


def code(name: str) -> grpc.StatusCode:
    """The ``grpc.StatusCode`` named ``name`` (``"NOT_FOUND"``)."""
    return getattr(grpc.StatusCode, name)


def abort(context: Any, status: grpc.StatusCode, details: str) -> NoReturn:
    """End the call with ``status``; always raises ``Aborted``."""
    try:
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
    if trailing:
        # each item is grpc's (key, value) namedtuple _Metadatum; its stub declares no tuple
        pairs = cast("tuple[tuple[str, str | bytes], ...]", trailing)
        context.set_trailing_metadata([(k, v) for k, v in pairs if not k.startswith(SKIP_HEADERS)])
    abort(context, exc.code(), in_spanner_words(exc.details() or ""))
