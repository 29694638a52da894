"""Spanner's native queues (``CREATE QUEUE``, ``RECEIVE_<Q>``, ``RENEWLEASE_<Q>``, Send/Ack).

- ``ddl``: DDL and SQL text, GoogleSQL and PostgreSQL dialect, from one queue declaration.
- ``receive``: the background ``RECEIVE_<Q>`` stream per queue, feeding a buffer.
- ``streams``: this process's streams (one per alias and queue) and ``RENEWLEASE_<Q>`` renewals.
- ``messages``: key values on the wire; the INSERT/DELETE DML and Send/Ack mutations.
- ``client``: the google-cloud-spanner ``Database`` behind a Django alias; error mapping;
  the ``Send``/``Ack`` mutations and ``RENEWLEASE_<Q>``.
- ``introspection``: keeps queues out of Django's table listings.
"""

from __future__ import annotations
