"""Ending a call of the front with a gRPC status, shared by the front's call handlers."""

from __future__ import annotations

from typing import Any, NoReturn

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


def abort_with(context: Any, exc: grpc.RpcError) -> NoReturn:
    """End the call with the emulator's error ``exc``, its trailing metadata passed on."""
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    if trailing:
        context.set_trailing_metadata(
            [(k, v) for k, v in trailing if not k.startswith(SKIP_HEADERS)]
        )
    abort(context, exc.code(), exc.details() or "")
