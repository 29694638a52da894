"""google-cloud-spanner calls that bypass the Django cursor: the ``Database`` of an alias,
``RENEWLEASE_<Q>`` on a strong single-use snapshot, the ``Send``/``Ack`` mutations, and the
mapping of gRPC status errors found anywhere in an exception's cause chain."""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import connections

from spanner_queues.drivers import causes
from spanner_queues.payload import BYTES, JSON, from_stored, json_value_text, stored_text


def database_for(alias: str) -> Any:
    """The ``google.cloud.spanner_v1.Database`` behind Django database ``alias``."""
    wrapper = connections[alias]
    wrapper.ensure_connection()
    return wrapper.connection.database


def grpc_status(exc: BaseException) -> str | None:
    """The gRPC status name (``"OUT_OF_RANGE"``...) of the first API error in the chain."""
    from google.api_core import exceptions as gexc

    for error in causes(exc):
        if isinstance(error, gexc.GoogleAPICallError) and error.grpc_status_code is not None:
            return error.grpc_status_code.name
    return None


def encode_bytes(value: bytes) -> bytes:
    """BYTES values go to the Python client base64-encoded."""
    return base64.b64encode(value)


def decode_bytes(value: Any) -> bytes:
    """BYTES values come back from the Python client as base64 text."""
    if value is None:
        return b""
    return base64.b64decode(value)


def wire_payload(payload_type: str, payload: bytes) -> bytes | str:
    """An encoded payload as the client sends it: BYTES base64-encoded, STRING and JSON as
    text (never base64)."""
    return encode_bytes(payload) if payload_type == BYTES else stored_text(payload)


def payload_from_wire(payload_type: str, value: Any) -> bytes:
    """``Message.payload`` for a ``Payload`` value read back: BYTES base64-decoded, STRING as
    UTF-8, JSON (a ``JsonObject``) as canonical JSON text."""
    if payload_type == BYTES:
        return decode_bytes(value)
    if payload_type == JSON:
        return json_value_text(value)
    return from_stored(value)


def renew(database: Any, sql: str, params: Mapping[str, str]) -> dict[str, tuple[str | None, Any]]:
    """Run ``RENEWLEASE_<Q>`` once, each lease token a STRING parameter of ``sql``'s array
    literal: old token -> (new token, new expiry)."""
    from google.cloud.spanner_v1 import param_types

    with database.snapshot() as snapshot:  # strong, single use
        rows = snapshot.execute_sql(
            sql,
            params=dict(params),
            param_types={name: param_types.STRING for name in params},
        )
        return {old: (new, expires) for old, new, expires in rows}


def receive_stream(database: Any, session: Any, sql: str, timeout: float) -> Any:
    """Start ``RECEIVE_<Q>`` one level below ``Snapshot.execute_sql``: the raw
    ``ExecuteStreamingSql`` call on a strong single-use read-only transaction. Its
    ``_restart_on_unavailable`` would hold rows back until a PartialResultSet carries a resume
    token, retry UNAVAILABLE without back-off and resume RECEIVE with a token; here restarts are
    the ``Receiver``'s. The call is the transport's own, wrapped only to map gRPC errors
    (``GoogleAPICallError``): the client's wrapper waits for the first response before it
    returns, so a call on an idle queue could not be ``cancel()``ed until a message came."""
    from google.api_core.grpc_helpers import _StreamingResponseIterator
    from google.cloud.spanner_v1 import ExecuteSqlRequest, RequestOptions, TransactionSelector
    from google.cloud.spanner_v1._helpers import _merge_query_options, _metadata_with_prefix
    from google.cloud.spanner_v1.types import TransactionOptions

    request = ExecuteSqlRequest(
        session=session.name,
        sql=sql,
        transaction=TransactionSelector(
            single_use=TransactionOptions(read_only=TransactionOptions.ReadOnly(strong=True))
        ),
        query_options=_merge_query_options(database._instance._client._query_options, None),
        request_options=RequestOptions(),
    )
    metadata = [
        *_metadata_with_prefix(database.name),
        ("x-goog-request-params", f"session={session.name}"),
    ]
    call = database.spanner_api.transport.execute_streaming_sql(
        request, metadata=metadata, timeout=timeout
    )
    return _StreamingResponseIterator(call, prefetch_first_result=False)


def rows_of(call: Any) -> Iterator[Any]:
    """Decoded rows of a streaming call, each as soon as its PartialResultSet arrives."""
    from google.cloud.spanner_v1.streamed import StreamedResultSet

    yield from StreamedResultSet(call)


def commit_mutations(
    database: Any,
    *,
    sends: Sequence[tuple[str, tuple[Any, ...], bytes | str, datetime | None]] = (),
    acks: Sequence[tuple[str, tuple[Any, ...], bool | None]] = (),
) -> Any:
    """Commit ``Ack`` then ``Send`` mutations in one batch (acks first, as Google requires
    when a batch replaces a message). Payloads are wire values (``wire_payload``). Returns the
    commit timestamp."""
    with database.batch() as batch:
        for queue, key, ignore_not_found in acks:
            batch.ack(queue=queue, key=list(key), ignore_not_found=ignore_not_found)
        for queue, key, payload, deliver_time in sends:
            batch.send(queue=queue, key=list(key), payload=payload, deliver_time=deliver_time)
    return batch.committed
