"""The outbox: model changes write queue messages in the same transaction as the change.

Register a model once, for example in ``AppConfig.ready()`` (this works for models you do not
own, such as ``django.contrib.auth``'s User)::

    from django.apps import AppConfig


    class AccountsConfig(AppConfig):
        name = "accounts"

        def ready(self) -> None:
            from django.contrib.auth import get_user_model

            from spanner_queues import outbox

            outbox.register(
                get_user_model(),
                queue="accounts.UserEvents",
                on=("created", "updated", "deleted"),
                fields=("email", "is_active"),  # only these changes count as "updated"
            )

``register`` also works as a class decorator on your own models:
``@outbox.register(queue="shop.OrderEvents")``.

Guarantees:

- The message row is written with ``spanner_queues.api.send_many`` through the connection that
  saves or deletes the instance, inside the same transaction. If that transaction rolls back,
  neither exists. There is no ``on_commit``, no second connection, no thread and no buffer that
  outlives the save.
- A save that could produce a message outside ``transaction.atomic()`` raises
  ``TransactionRequired`` from ``pre_save``, before anything is written: Django commits an
  autocommit save before ``post_save`` runs, so the message could not share its transaction.
  Deletes need nothing: Django runs deletion signals inside its own ``atomic()`` block.
- Keys and payloads are built and validated before any write whenever the primary key is known
  before the INSERT (always for updates and deletes; for creates when the key has a default, as
  on Spanner). A database-assigned key (SQLite ``AutoField``) is only known after the INSERT:
  then a failure marks the transaction for rollback (``transaction.set_rollback``), so the row
  cannot commit without its message. Nothing relies on savepoints.
- Saves with ``raw=True`` (``loaddata``) produce no messages. ``bulk_create``,
  ``QuerySet.update``, ``bulk_update`` and raw deletes send no signals: call ``send_for`` in the
  same ``atomic()`` block. ``QuerySet.delete()`` does send signals and is covered.

The package: ``registration`` (``register``/``unregister``, the ``Registration`` and its store,
the model-signal receivers, the transaction guard, the send), ``changes`` (what a save changed,
read in its transaction) and ``manual`` (``send_for``, ``manual_send``, ``OutboxQuerySet``). The
public names are these; the modules are private.
"""

from __future__ import annotations

from spanner_queues.outbox.manual import OutboxQuerySet, manual_send, send_for
from spanner_queues.outbox.registration import (
    EVENTS,
    KeyBuilder,
    PayloadBuilder,
    Registration,
    register,
    registrations,
    unregister,
)

__all__ = [
    "EVENTS",
    "KeyBuilder",
    "OutboxQuerySet",
    "PayloadBuilder",
    "Registration",
    "manual_send",
    "register",
    "registrations",
    "send_for",
    "unregister",
]
