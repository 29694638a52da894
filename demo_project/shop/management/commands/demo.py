"""``manage.py demo``: migrate, sign up a few users (each with a welcome message in the same
transaction), then receive and acknowledge the messages, printing what happens."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import transaction

from demo_project.shop.models import UserTasks
from spanner_queues import api


class Command(BaseCommand):
    help = "Run the spanner_queues demo: send, receive and ack messages."

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write("Migrated. Signing up three users, each with a welcome message...")
        for _ in range(3):
            name = f"user-{uuid.uuid4().hex[:6]}"
            with transaction.atomic():
                user = User.objects.create(username=name, email=f"{name}@example.com")
                UserTasks.send(user_id=user.pk, message_id="welcome", payload={"type": "welcome"})
            self.stdout.write(f"  sent   {UserTasks._meta.label}(user_id={user.pk}, welcome)")
        self.stdout.write("A sign-up that fails rolls back its message too...")
        try:
            with transaction.atomic():
                user = User.objects.create(username=f"ghost-{uuid.uuid4().hex[:6]}")
                UserTasks.send(user_id=user.pk, message_id="welcome", payload={"type": "welcome"})
                raise RuntimeError("payment declined")
        except RuntimeError:
            self.stdout.write("  rolled back: no user, no message")
        self.stdout.write(f"Queue depth: {UserTasks.objects.count()}. Receiving...")
        while batch := api.receive(UserTasks, max_messages=10):
            for message in batch:
                with transaction.atomic():
                    user = User.objects.get(pk=message.key_dict["user_id"])
                    send_mail("Welcome!", f"Hello {user.username}", None, [user.email])
                    api.ack(message)  # in the same transaction as the receiver's writes
                self.stdout.write(
                    f"  acked  {message} attempt={message.attempt} payload={message.json()}"
                )
        self.stdout.write(self.style.SUCCESS(f"Done. Queue depth: {UserTasks.objects.count()}."))
