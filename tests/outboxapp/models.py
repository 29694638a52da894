"""Models for the outbox tests and benchmark.

``Author`` and ``Book`` are registered in ``apps.py``; ``Comment`` with the decorator form;
``Note`` is never registered (``Review`` cascades from ``Book`` unregistered). ``Plain`` and
``Tracked`` are identical, for the save-cost benchmark (it registers ``Tracked`` itself).
"""

from __future__ import annotations

import uuid

from django.db import models

from spanner_queues import outbox
from spanner_queues.models import Queue


def new_id() -> str:
    return uuid.uuid4().hex


class Author(models.Model):
    name = models.CharField(max_length=100)
    email = models.CharField(max_length=200, blank=True, default="")
    bio = models.TextField(blank=True, default="")


class Book(models.Model):
    author = models.ForeignKey(Author, on_delete=models.CASCADE, related_name="books")
    title = models.CharField(max_length=200)
    pages = models.IntegerField(default=0)


class Review(models.Model):
    book = models.ForeignKey(Book, on_delete=models.CASCADE, related_name="reviews")
    text = models.CharField(max_length=200)


class Note(models.Model):
    text = models.CharField(max_length=200)


class Plain(models.Model):
    name = models.CharField(max_length=100)
    counter = models.IntegerField(default=0)


class Tracked(models.Model):
    name = models.CharField(max_length=100)
    counter = models.IntegerField(default=0)


class ModelEvents(Queue):
    """Events of any model: the object's id, then a message id."""

    object_id = models.BigIntegerField()
    message_id = models.CharField(max_length=64)
    pk = models.CompositePrimaryKey("object_id", "message_id")


class AuthorTasks(Queue):
    """Interleaved in ``Author`` on Spanner; a cascading ForeignKey elsewhere."""

    author = models.ForeignKey(
        Author, on_delete=models.CASCADE, db_column="id", db_constraint=False
    )
    message_id = models.CharField(max_length=64)
    pk = models.CompositePrimaryKey("author", "message_id")

    class QueueMeta:
        interleave_in_parent = "author"


class UserEvents(Queue):
    """Events of ``auth.User`` (registered by the tests that need it)."""

    user_id = models.BigIntegerField()
    message_id = models.CharField(max_length=64)
    pk = models.CompositePrimaryKey("user_id", "message_id")


class CommentJobs(Queue):
    """A single-column key with a default: the default key builder leaves it to the default."""

    id = models.CharField(max_length=64, primary_key=True, default=new_id)


@outbox.register(queue="outboxapp.CommentJobs", on="created")
class Comment(models.Model):
    text = models.CharField(max_length=200)


class ProxyAuthor(Author):
    class Meta:
        proxy = True
