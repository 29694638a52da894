"""A view that sends in its request (``tests/tracing/test_django_request.py``)."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.urls import path

from tests.tracingapp.models import Events, Order


def pay(request: HttpRequest, order: int) -> HttpResponse:
    with transaction.atomic():
        Order.objects.create(total=order)  # the outbox's send
        Events.send(id=f"pay-{order}", payload={"order": order})
    return HttpResponse("paid")


urlpatterns = [path("orders/<int:order>/pay", pay)]
