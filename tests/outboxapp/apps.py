"""The outbox test app registers its own models in ``ready()``: the primary registration form."""

from __future__ import annotations

from django.apps import AppConfig


class OutboxAppConfig(AppConfig):
    name = "tests.outboxapp"
    label = "outboxapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from spanner_queues import outbox
        from tests.outboxapp.models import Author, Book

        outbox.register(Author, queue="outboxapp.ModelEvents", fields=("name", "email"))
        # A queue interleaved in Author: created/updated only (the default key puts the
        # author's id first; a 'deleted' message would be deleted with its row).
        outbox.register(Author, queue="outboxapp.AuthorTasks", on=("created", "updated"))
        outbox.register(
            Book,
            queue="outboxapp.ModelEvents",
            on=("created", "deleted"),
            fields=("title", "author"),
        )
