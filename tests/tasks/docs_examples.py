"""The task definitions of the django-tasks documentation (Django's ``topics/tasks``), as
written there (``django_tasks`` is Django 6's ``django.tasks`` on Django 5.2)."""

from __future__ import annotations

from django.db import transaction

from spanner_queues.contrib.tasks.framework import task
from tests.tasksapp.models import Thing


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task()
def process_thing(num: int) -> int:
    return Thing.objects.filter(num=num).count()


@task()
def raise_value_error() -> None:
    raise ValueError("the docs' failing task")


def create_and_enqueue_on_commit() -> None:
    """Django's docs: enqueue after commit with ``on_commit`` (unneeded here, still works)."""
    from functools import partial

    with transaction.atomic():
        Thing.objects.create(num=1)
        transaction.on_commit(partial(process_thing.enqueue, num=1))
